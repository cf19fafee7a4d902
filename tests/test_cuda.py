"""`--device cuda`, on a machine with a CUDA GPU (skipped, saying why, everywhere else; CI has none): every decoder
family against transformers on the same GPU (fp32, <= 1e-4, greedy tokens and step logits with the KV cache),
encoders and encoder-decoders through `tfcli compare --device cuda`, the commands' output on the GPU equal to the
CPU's, `--save` written from the GPU, bfloat16 on the GPU, a load that goes straight to the GPU (no CPU copy of
the weights, no second GPU copy), and the memory check counting the GPU's own memory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import tfcli
from test_families import FAMILIES, IDS, MASK, PROMPTS, assert_greedy_steps_match, build

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run where one is present)")
CUDA = torch.device("cuda")
TEXT = "the quick brown fox jumps over the lazy dog"


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_families_match_transformers_on_the_gpu(family, tmp_path, save_hf_model, compare_decoder,
                                                        assert_close):
    path, hf = build(tmp_path, save_hf_model, family)
    hf = hf.to(CUDA)
    ours = tfcli.load_model(str(path), device="cuda")
    assert {p.device.type for p in ours.parameters()} == {"cuda"}
    compare_decoder(ours, hf, IDS.to(CUDA), MASK.to(CUDA))
    assert_greedy_steps_match(ours, hf, PROMPTS.to(CUDA), 8, assert_close)


def encoder_checkpoints(tmp_path, save_hf_model) -> dict[str, object]:
    """Tiny BERT, RoBERTa, T5 and BART checkpoints (the bundled BERT vocabulary's size), saved by transformers."""
    from transformers import (BartConfig, BartForConditionalGeneration, BertConfig, BertForMaskedLM, RobertaConfig,
                              RobertaForMaskedLM, T5Config, T5ForConditionalGeneration)

    small = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    models = {
        "bert": (BertForMaskedLM, BertConfig(**small, max_position_embeddings=64)),
        "roberta": (RobertaForMaskedLM, RobertaConfig(**small, max_position_embeddings=66, pad_token_id=1)),
        "t5": (T5ForConditionalGeneration, T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=48, num_layers=2,
                                                    num_heads=4, relative_attention_num_buckets=8,
                                                    decoder_start_token_id=0, feed_forward_proj="gated-gelu",
                                                    tie_word_embeddings=False)),
        "bart": (BartForConditionalGeneration, BartConfig(vocab_size=30522, d_model=32, encoder_layers=2,
                                                          decoder_layers=2, encoder_attention_heads=4,
                                                          decoder_attention_heads=4, encoder_ffn_dim=48,
                                                          decoder_ffn_dim=48, max_position_embeddings=64)),
    }
    paths = {}
    for name, (model_class, config) in models.items():
        paths[name] = tmp_path / name
        save_hf_model(model_class, config, paths[name], perturb=True)
    return paths


def test_compare_runs_both_models_on_the_gpu(tmp_path, save_hf_model):
    from tfcli.commands.compare import core as compare

    models = compare.load(str(encoder_checkpoints(tmp_path, save_hf_model)["bert"]), device="cuda")
    assert {p.device.type for p in models.ours.parameters()} == {p.device.type for p in models.theirs.parameters()} \
           == {"cuda"}


def test_an_encoder_decoder_generates_on_the_gpu_as_transformers_does(tmp_path, save_hf_model):
    path = encoder_checkpoints(tmp_path, save_hf_model)["t5"]
    from transformers import T5ForConditionalGeneration

    theirs = T5ForConditionalGeneration.from_pretrained(path).to(CUDA).eval()
    ids = torch.tensor([[101, 2051, 10029, 2066, 2019, 8612, 102]], device=CUDA)
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=6, do_sample=False, num_beams=1)
    assert torch.equal(tfcli.load_model(str(path), device="cuda").generate(ids, max_new_tokens=6), expected)


def test_compare_passes_on_the_gpu_for_encoders_and_encoder_decoders(cli, tmp_path, save_hf_model):
    for name, path in encoder_checkpoints(tmp_path, save_hf_model).items():
        (comparison,) = records(cli("compare", str(path), TEXT, "--device", "cuda", "--json"))
        assert comparison["max_abs_diff"] <= 1e-4, (name, comparison)
        assert len(comparison["tensors"]) >= 5, name


def test_encode_and_save_on_the_gpu_equal_the_cpu(cli, tmp_path, save_hf_model):
    """The JSON record (attention weights, lens, stage statistics) and the saved tensors, GPU against CPU."""
    from safetensors import safe_open

    path = encoder_checkpoints(tmp_path, save_hf_model)["t5"]
    runs = {}
    for device in ("cpu", "cuda"):
        saved = tmp_path / f"{device}.safetensors"
        (runs[device],) = records(cli("encode", TEXT, "--model", str(path), "--target", "the fox", "--device", device,
                                      "--json", "--top-k", "3", "--save", str(saved)))
        with safe_open(saved, "pt") as file:  # tensors written from the GPU read back on the CPU
            runs[device]["saved"] = {name: file.get_tensor(name) for name in file.keys()}
            assert {t.device.type for t in runs[device]["saved"].values()} == {"cpu"}
    cpu, gpu = runs["cpu"], runs["cuda"]
    assert gpu["tokens"] == cpu["tokens"] and gpu["target_tokens"] == cpu["target_tokens"]
    assert [[[t["token"] for t in p] for p in row["top"]] for row in gpu["lens"]] == \
           [[[t["token"] for t in p] for p in row["top"]] for row in cpu["lens"]]
    for a, b in zip(gpu["attention"], cpu["attention"], strict=True):
        assert (a["kind"], a["layer"], a["head"]) == (b["kind"], b["layer"], b["head"])
        assert torch.tensor(a["weights"]).sub(torch.tensor(b["weights"])).abs().max() <= 2e-4  # 4-decimal rounding
    assert [(s["stage"], s["shape"]) for s in gpu["shapes"]] == [(s["stage"], s["shape"]) for s in cpu["shapes"]]
    assert gpu["saved"].keys() == cpu["saved"].keys()
    for name, tensor in gpu["saved"].items():
        assert tensor.dtype == cpu["saved"][name].dtype, name
        assert (tensor.double() - cpu["saved"][name].double()).abs().max() <= 1e-4, name


def test_generate_and_classify_on_the_gpu_equal_the_cpu(cli, tmp_path, save_hf_model, peaked_gpt2):
    from transformers import BertConfig, BertForSequenceClassification

    path, _ = peaked_gpt2
    runs = [records(cli("generate", "time flies like", "--model", str(path), "-n", "8", "--lens", "--json",
                        "--device", device))[0] for device in ("cpu", "cuda")]
    assert runs[1]["generated_ids"] == runs[0]["generated_ids"]
    for gpu, cpu in zip(runs[1]["steps"], runs[0]["steps"], strict=True):
        assert abs(gpu["prob"] - cpu["prob"]) <= 1e-4
        assert [layer["token"] for layer in gpu["lens"]] == [layer["token"] for layer in cpu["lens"]]

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, num_labels=3, id2label={0: "neg", 1: "mid", 2: "pos"})
    save_hf_model(BertForSequenceClassification, config, tmp_path / "classifier", perturb=True)
    runs = [records(cli("classify", TEXT, "--model", str(tmp_path / "classifier"), "--json", "--device", device))[0]
            for device in ("cpu", "cuda")]
    assert runs[1]["labels"] == runs[0]["labels"] == ["neg", "mid", "pos"]
    assert runs[1]["prediction"] == runs[0]["prediction"]
    assert max(abs(gpu - cpu) for gpu, cpu in zip(runs[1]["probs"], runs[0]["probs"], strict=True)) <= 1e-4


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bfloat16_on_the_gpu_matches_transformers_to_its_precision(family, tmp_path):
    """As tests/test_bfloat16.py on the CPU: from a bfloat16 checkpoint, the same greedy tokens as transformers in
    bfloat16 on the GPU; on that sequence, logits within two bfloat16 steps of transformers', and no further from
    the exact (float32) logits of the same weights than twice transformers' distance."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from test_bfloat16 import assert_bfloat16_close

    sizes = dict(vocab_size=96, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    model = (GPT2LMHeadModel(GPT2Config(**sizes, n_embd=64, n_layer=2, n_head=4, n_positions=64)) if family == "gpt2"
             else LlamaForCausalLM(LlamaConfig(**sizes, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=96,
                                               max_position_embeddings=64)))
    with torch.no_grad():  # non-zero biases and norms, so that each shows
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.to(torch.bfloat16).eval().save_pretrained(tmp_path)
    theirs = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16).to(CUDA).eval()
    exact = type(model).from_pretrained(tmp_path, dtype=torch.float32).to(CUDA).eval()  # the same rounded weights
    ours = tfcli.load_model(str(tmp_path), device="cuda", dtype="bfloat16")
    prompt = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(0)).to(CUDA)
    with torch.no_grad():
        sequence = ours.generate(prompt, max_new_tokens=20)
        assert sequence.tolist() == theirs.generate(prompt, max_new_tokens=20, do_sample=False).tolist()
        our_logits, their_logits, exact_logits = ours(sequence).logits, theirs(sequence).logits, exact(sequence).logits
    assert our_logits.dtype == torch.bfloat16 and our_logits.device.type == "cuda"
    assert_bfloat16_close(our_logits, their_logits, steps=2)
    our_error = float((our_logits.float() - exact_logits).abs().max())
    their_error = float((their_logits.float() - exact_logits).abs().max())
    assert our_error <= 2 * their_error, (our_error, their_error)


LOAD = """
import sys, threading, time, torch, tfcli

def anonymous_rss():
    return int(next(line for line in open("/proc/self/status") if line.startswith("RssAnon")).split()[1]) * 1024

tfcli.load_model(sys.argv[3], device="cuda", dtype=sys.argv[2])  # CUDA's context, libraries and kernels are not the load's
peak, done = [anonymous_rss()], []
def sample():
    while not done:
        peak.append(anonymous_rss()); time.sleep(0.001)
sampler = threading.Thread(target=sample); sampler.start()
before = peak[0]
torch.cuda.reset_peak_memory_stats()
gpu_before = torch.cuda.memory_allocated()
model = tfcli.load_model(sys.argv[1], device="cuda", dtype=sys.argv[2])
torch.cuda.synchronize(); done.append(1); sampler.join()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
largest = max(p.numel() * 4 for p in model.parameters())  # as stored: float32
print(weights, largest, max(peak) - before, torch.cuda.max_memory_allocated() - gpu_before)
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_load_goes_straight_to_the_gpu(tmp_path, dtype):
    """A 0.24 GB float32 checkpoint loaded onto the GPU: the CPU never holds a copy of the weights, only a tensor or
    two in flight (its anonymous memory grows by less than the weights, even in bfloat16), and the GPU holds
    the weights once plus at most one stored tensor in flight."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(hidden_size=512, num_attention_heads=8, intermediate_size=1536, max_position_embeddings=64,
                 tie_word_embeddings=False)
    LlamaForCausalLM(LlamaConfig(vocab_size=8000, num_hidden_layers=16, **shape)).save_pretrained(tmp_path / "big")
    LlamaForCausalLM(LlamaConfig(vocab_size=64, num_hidden_layers=1, **shape)).save_pretrained(tmp_path / "warm-up")
    result = subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "big"), dtype, str(tmp_path / "warm-up")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    weights, largest, cpu_growth, gpu_peak = map(int, result.stdout.split())
    in_flight = 2 * largest + 32 * 2**20
    assert in_flight < weights  # so that a copy of the weights could not pass for tensors in flight
    assert cpu_growth <= in_flight, f"the CPU grew by {cpu_growth / 2**20:.0f} MB for {weights / 2**20:.0f} MB"
    assert gpu_peak <= weights + largest + 16 * 2**20, f"GPU peak {gpu_peak / 2**20:.0f} MB, weights {weights / 2**20:.0f} MB"


def test_the_memory_check_counts_the_gpus_memory(cli, tmp_path):
    """A config that fits the GPU in bfloat16 but not in float32 is refused before anything is allocated,
    naming the GPU and the dtype that would fit."""
    from tfcli.config import load_yaml, parameter_count

    gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    path = tmp_path / "big.yaml"
    layers = 1
    while True:  # grow until float32 no longer fits the GPU (bfloat16 still does)
        path.write_text(f"architecture: decoder\nhidden_size: 8192\nnum_hidden_layers: {layers}\n"
                        "num_attention_heads: 64\nintermediate_size: 32768\nhead: lm\n", encoding="utf-8")
        if parameter_count(load_yaml(path)) * 4 > gpu_bytes:
            break
        layers += 1
    assert parameter_count(load_yaml(path)) * 2 <= gpu_bytes
    result = cli("encode", "hi", "--model", str(path), "--device", "cuda")
    assert result.exit_code == 1
    assert "cuda's" in result.stderr or "cuda:0's" in result.stderr, result.stderr
    assert "--dtype bfloat16 would fit" in result.stderr
