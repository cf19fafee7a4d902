"""Decoder families against transformers' own classes, on tiny checkpoints that transformers saves inside the test
with each real model's distinctive settings (fp32, max abs diff <= 1e-4): every hidden state, every attention map
(inputs longer than the sliding window where there is one), the logits, greedy generation token for token, and
`encode`, `generate --lens` and `compare` through the CLI. Then every setting that changes what a family computes,
set away from its default: parity, or a one-line refusal that names it."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import tfcli
from tfcli.errors import TfcliError
from conftest import captured_pass

VOCAB = 128
IDS = torch.tensor([[5, 17, 42, 8, 77, 3, 60, 11, 23], [9, 31, 12, 50, 44, 21, 0, 0, 0]])  # longer than the windows
MASK = (IDS != 0).long()
PROMPTS = torch.tensor([[5, 17, 42, 8, 77, 3], [0, 0, 0, 9, 31, 12]])  # left-padded, as generation wants
SIZES = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2)
LLAMA = dict(SIZES, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64)
LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)

# family: (transformers model class, its config class, a real checkpoint's distinctive settings, shrunk)
FAMILIES = {
    "llama-3.2": ("LlamaForCausalLM", "LlamaConfig",
                  dict(LLAMA, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True, eos_token_id=[2, 3])),
    "mistral-7b-v0.1": ("MistralForCausalLM", "MistralConfig", dict(LLAMA, sliding_window=4)),
    "qwen2-windows": ("Qwen2ForCausalLM", "Qwen2Config",
                      dict(LLAMA, use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(LLAMA, head_dim=16, tie_word_embeddings=True)),
    "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(LLAMA, head_dim=16)),
    "gemma-2": ("Gemma2ForCausalLM", "Gemma2Config",
                dict(LLAMA, head_dim=16, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                     final_logit_softcapping=3.0)),
    "gemma-3-1b": ("Gemma3ForCausalLM", "Gemma3TextConfig",
                   dict(LLAMA, num_hidden_layers=3, num_key_value_heads=1, head_dim=16, sliding_window=4,
                        sliding_window_pattern=3, query_pre_attn_scalar=16,
                        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    "phi-2": ("PhiForCausalLM", "PhiConfig", dict(LLAMA, num_key_value_heads=None)),
    "phi-3-mini-4k": ("Phi3ForCausalLM", "Phi3Config", dict(LLAMA, sliding_window=4)),
    "phi-3-mini-128k": ("Phi3ForCausalLM", "Phi3Config",  # LongRoPE: the long factors take over past 8 positions
                        dict(LLAMA, original_max_position_embeddings=8,
                             rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                  short_factor=[1.0, 1.2, 1.5, 2.0], long_factor=[1.0, 2.0, 4.0, 8.0]))),
    "olmo-2": ("Olmo2ForCausalLM", "Olmo2Config", dict(LLAMA, rope_parameters=dict(rope_type="default",
                                                                                     rope_theta=500000.0))),
    "pythia": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(LLAMA, hidden_size=64, num_key_value_heads=None,
                                                           rotary_pct=0.25, rotary_emb_base=10000)),
    "gpt-j": ("GPTJForCausalLM", "GPTJConfig", dict(SIZES, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                    n_positions=64)),
    "falcon-7b": ("FalconForCausalLM", "FalconConfig", dict(LLAMA, num_key_value_heads=None, multi_query=True,
                                                            parallel_attn=True, bias=False)),
    "falcon-40b": ("FalconForCausalLM", "FalconConfig", dict(LLAMA, num_key_value_heads=None, num_kv_heads=2,
                                                             new_decoder_architecture=True)),
    "opt-125m": ("OPTForCausalLM", "OPTConfig", dict(LLAMA, num_key_value_heads=None, intermediate_size=None,
                                                     ffn_dim=48)),
}

# (family, settings away from its defaults, None for parity or the words of the refusal)
LONGROPE = dict(rope_type="longrope", rope_theta=100.0, short_factor=[1.0] * 2, long_factor=[2.0] * 2,
                original_max_position_embeddings=16)  # refused by the families whose transformers class lacks it
VARIANTS = [
    ("llama-3.2", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)), None),
    ("llama-3.2", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False), None),
    ("llama-3.2", dict(head_dim=16, num_key_value_heads=1, hidden_act="gelu", rms_norm_eps=1e-2), None),
    ("llama-3.2", dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)), None),
    ("llama-3.2", dict(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=4.0),
                       max_position_embeddings=6), None),  # 9 tokens: past the table, where dynamic turns on
    ("llama-3.2", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                            original_max_position_embeddings=16, beta_fast=16.0)), None),
    ("llama-3.2", dict(rope_parameters=LONGROPE), "RoPE scaling `longrope`"),
    ("llama-3.2", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("mistral-7b-v0.1", dict(sliding_window=None, head_dim=16), None),
    ("qwen2-windows", dict(use_sliding_window=False), None),
    ("qwen2-windows", dict(layer_types=["sliding_attention", "full_attention"]), None),
    ("qwen3", dict(attention_bias=True, use_sliding_window=True, sliding_window=3, max_window_layers=0), None),
    ("qwen3", dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                        original_max_position_embeddings=16)), None),
    ("gemma", dict(attention_bias=True, hidden_act="gelu_new", tie_word_embeddings=False), None),
    ("gemma", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("gemma", dict(hidden_act="relu"), None),  # only "gelu" is read as its tanh approximation
    ("gemma", dict(hidden_act="mish"), "activation `mish`"),
    ("gemma-2", dict(rope_parameters=dict(rope_type="default", rope_theta=100.0)), None),  # sliding layers too
    ("gemma-2", dict(hidden_activation="gelu", final_logit_softcapping=None, attn_logit_softcapping=None,
                     layer_types=["full_attention", "sliding_attention"], query_pre_attn_scalar=7), None),
    ("gemma-2", dict(sliding_window=None), "no sliding_window"),
    ("gemma-3-1b", dict(final_logit_softcapping=3.0, attn_logit_softcapping=2.0,  # transformers ignores the latter
                        layer_types=["full_attention", "sliding_attention", "sliding_attention"]), None),
    ("gemma-3-1b", dict(rope_parameters={"full_attention": dict(rope_type="default", rope_theta=100.0),
                                         "sliding_attention": dict(rope_type="linear", rope_theta=10.0, factor=2.0)}),
     "RoPE scaling `linear` on sliding-window layers"),
    ("gemma-3-1b", dict(rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1e6),
                                         "sliding_attention": dict(rope_type="default", rope_theta=100.0)}), None),
    ("gemma-3-1b", dict(rope_parameters={"full_attention": dict(rope_type="default", rope_theta=100.0),
                                         "sliding_attention": dict(rope_type="yarn", rope_theta=10.0, factor=2.0)}),
     "RoPE scaling `yarn` on sliding-window layers"),
    ("gemma-3-1b", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("phi-2", dict(qk_layernorm=True, num_key_value_heads=2, partial_rotary_factor=0.25, hidden_act="gelu"), None),
    ("phi-2", dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0, partial_rotary_factor=0.5)),
     None),
    ("phi-2", dict(rope_parameters=LONGROPE), "RoPE scaling `longrope`"),
    ("phi-3-mini-4k", dict(partial_rotary_factor=0.5, num_key_value_heads=1, tie_word_embeddings=True,
                           sliding_window=None), None),
    ("phi-3-mini-128k", dict(rope_parameters=dict(rope_type="longrope", rope_theta=100.0, short_factor=[1.0] * 4,
                                                  long_factor=[3.0] * 4, attention_factor=1.5, factor=2.0),
                             original_max_position_embeddings=16), None),
    ("olmo-2", dict(attention_bias=True, num_key_value_heads=4, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0)), None),
    ("olmo-2", dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    ("pythia", dict(use_parallel_residual=False, attention_bias=False, rotary_pct=1.0, rotary_emb_base=100), None),
    ("pythia", dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0, partial_rotary_factor=0.5),
                    tie_word_embeddings=True), None),
    ("pythia", dict(rope_parameters=LONGROPE), "RoPE scaling `longrope`"),
    ("gpt-j", dict(rotary_dim=16, activation_function="gelu", n_inner=40), None),  # whole heads
    ("gpt-j", dict(rotary_dim=32), "rotary_dim 32 .head size 16."),
    ("falcon-7b", dict(multi_query=False, bias=True, parallel_attn=False, tie_word_embeddings=False), None),
    ("falcon-7b", dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0)), None),
    ("falcon-7b", dict(alibi=True), "alibi: true"),
    ("falcon-7b", dict(rope_parameters=LONGROPE), "RoPE scaling `longrope`"),
    ("falcon-40b", dict(num_ln_in_parallel_attn=1, num_kv_heads=1, ffn_hidden_size=40), None),
    ("falcon-40b", dict(activation="relu"), None),
    ("falcon-40b", dict(parallel_attn=False), "parallel_attn: false"),
    ("opt-125m", dict(do_layer_norm_before=False, enable_bias=False, activation_function="gelu"), None),
    ("opt-125m", dict(_remove_final_layer_norm=True), None),
    ("opt-125m", dict(word_embed_proj_dim=16, tie_word_embeddings=False), None),  # opt-350m's project_in/out
    ("opt-125m", dict(layer_norm_elementwise_affine=False), "layer_norm_elementwise_affine"),
]


def read_config_json(path, values: dict):
    """tfcli's config for a config.json holding `values`, written into the directory `path`."""
    from tfcli.checkpoints import read_hf_config

    (path / "config.json").write_text(json.dumps(values))
    return read_hf_config(path / "config.json")


def hf_config(family: str, **overrides):
    """transformers' config of `family` with `overrides`. A deep copy of the settings: transformers writes into
    nested dicts it is given (rope_parameters gains partial_rotary_factor), which would leak into later tests."""
    import transformers

    return getattr(transformers, FAMILIES[family][1])(**copy.deepcopy({**FAMILIES[family][2], **overrides}))


def build(tmp_path, save_hf_model, family: str, **overrides):
    """Save a tiny checkpoint of `family` with transformers (norm weights and biases made non-zero, so one
    mapped to the wrong place shows) and a small BPE tokenizer; return (path, transformers model)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = save_hf_model(getattr(transformers, FAMILIES[family][0]), hf_config(family, **overrides), tmp_path)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln" in name:
                param.add_(torch.randn_like(param) * 0.1)
    hf.save_pretrained(tmp_path)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["time flies like an arrow", "fruit flies like a banana"] * 10,
                                  trainers.BpeTrainer(vocab_size=VOCAB // 2, show_progress=False))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return tmp_path, hf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, save_hf_model):
    """checkpoint(family) -> (path, transformers model, tfcli model), built once per module."""
    built = {}

    def get(family: str):
        if family not in built:
            path, hf = build(tmp_path_factory.mktemp(family), save_hf_model, family)
            built[family] = (path, hf, tfcli.load_model(str(path)))
        return built[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_parity_and_greedy_generation(family, checkpoint, compare_decoder, assert_close):
    """Every tensor of a forward pass; then greedy generation with the KV cache, past the sliding windows and
    LongRoPE's switch: the same tokens, and each step's logits within 1e-4 (the tokens alone could hide a
    cache that drifted)."""
    _, hf, ours = checkpoint(family)
    compare_decoder(ours, hf, IDS, MASK)
    assert_greedy_steps_match(ours, hf, PROMPTS, 12, assert_close)


def assert_greedy_steps_match(ours, hf, prompts, new: int, assert_close) -> None:
    """Greedy generation from left-padded `prompts` (B, T): tfcli's tokens equal transformers' generate, and each
    step's logits are within 1e-4 (the tokens alone could hide a cache that drifted)."""
    from tfcli.model.decoding import decode

    mask = (prompts != 0).long()
    with torch.no_grad():
        theirs = hf.generate(prompts, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=1,
                             output_logits=True, return_dict_in_generate=True)
    steps = list(decode(ours, prompts, mask, max_new_tokens=new))
    assert torch.cat([prompts, torch.stack([s.tokens for s in steps], 1)], 1).tolist() == theirs.sequences.tolist()
    assert_close("step logits", torch.stack([s.logits for s in steps], 1), torch.stack(theirs.logits, 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_generate_and_compare_through_the_cli(family, checkpoint, cli):
    path, hf, ours = checkpoint(family)
    layers = ours.config.num_hidden_layers
    encoded = cli("encode", "time flies like an arrow", "-m", str(path), "--top-k", "2", "--json")
    assert encoded.exit_code == 0, encoded.stderr
    record = json.loads(encoded.stdout)
    assert [a["layer"] for a in record["attention"]] == list(range(layers))
    assert [row["layer"] for row in record["lens"]] == list(range(layers))
    stages = {s["stage"] for s in record["shapes"]}
    # what the last block's attention adds to the residual stream: its output, or its output norm's (sandwich blocks)
    assert stages & {f"blocks.{layers - 1}.attn.out", f"blocks.{layers - 1}.attn_output_norm.out"}
    assert {f"blocks.{layers - 1}.resid_post", "final_norm.out", "logits"} <= stages

    generated = cli("generate", "time flies like", "-m", str(path), "-n", "4", "--lens", "--json")
    assert generated.exit_code == 0, generated.stderr
    record = json.loads(generated.stdout)
    assert all(len(step["lens"]) == layers + 1 for step in record["steps"])
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([record["prompt_ids"]]), max_new_tokens=4, do_sample=False)
    assert record["generated_ids"] == theirs[0, len(record["prompt_ids"]):].tolist()

    compared = cli("compare", str(path), "time flies like an arrow", "--json")
    assert compared.exit_code == 0, compared.stderr
    assert json.loads(compared.stdout)["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("family,overrides,refusal", VARIANTS,
                         ids=[f"{f}:{','.join(o)}" for f, o, _ in VARIANTS])
def test_settings_away_from_the_defaults(family, overrides, refusal, tmp_path, save_hf_model, compare_decoder):
    if refusal is not None:
        import transformers

        hf_config(family, **overrides).save_pretrained(tmp_path)
        with pytest.raises(TfcliError, match=refusal) as refused:
            tfcli.load_model(str(tmp_path))
        assert "\n" not in str(refused.value)
        # the one line names the family, and a hint says what tfcli implements instead
        assert f"config.json: {hf_config(family).model_type} with " in refused.value.message
        assert refused.value.hint
        return
    path, hf = build(tmp_path, save_hf_model, family, **overrides)
    compare_decoder(tfcli.load_model(str(path)), hf, IDS, MASK)


def test_every_id_of_a_list_valued_eos_ends_generation(checkpoint, tmp_path):
    """Llama 3 ends on any of several ids, Phi-3-instruct on ids that generation_config.json alone lists; tfcli
    reads them as transformers' generate does and stops on each."""
    import shutil

    import transformers

    path, _, ours = checkpoint("llama-3.2")
    assert ours.config.eos_token_id == [2, 3]
    prompt = PROMPTS[:1]
    free = ours.generate(prompt, max_new_tokens=8)
    ending = [int(free[0, prompt.shape[1] + 2]), 2]  # the third new token ends it, listed first
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": ending}))
    ours = tfcli.load_model(str(tmp_path))
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert ours.config.eos_token_id == ending
    with torch.no_grad():
        theirs = hf.generate(prompt, max_new_tokens=8, do_sample=False)
    mine = ours.generate(prompt, max_new_tokens=8)
    assert mine.tolist() == theirs.tolist()
    assert mine.shape[1] == prompt.shape[1] + 3


YAML_DECODER = """\
architecture: decoder
vocab_size: 30522
hidden_size: 32
num_hidden_layers: 3
num_attention_heads: 4
num_key_value_heads: 2
head_dim: 16
intermediate_size: 48
max_position_embeddings: 32
norm: rmsnorm_plus_one
norm_position: sandwich
position: rotary
partial_rotary_factor: 0.5
rope_scaling:
  rope_type: llama3
  factor: 8
  low_freq_factor: 1
  high_freq_factor: 4
  original_max_position_embeddings: 8
local_rope_theta: 100.0
sliding_window: 3
layer_types: [sliding_attention, sliding_attention, full_attention]
query_pre_attn_scalar: 24
attn_logit_softcapping: 20.0
final_logit_softcapping: 10.0
qk_norm: head
feed_forward: gated
hidden_act: gelu_new
scale_embedding: true
embedding_norm: false
type_vocab_size: 0
final_norm: true
head: lm
eos_token_id: [102, 103]
"""


def test_the_new_settings_work_from_a_yaml_config(tmp_path, cli):
    path = tmp_path / "gemma-like.yaml"
    path.write_text(YAML_DECODER)
    shown = cli("config", str(path), "--json")
    assert shown.exit_code == 0, shown.stderr
    config = json.loads(shown.stdout)["config"]
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["layer_types"][2] == "full_attention"
    encoded = cli("encode", "time flies like an arrow", "-m", str(path), "--json")
    assert encoded.exit_code == 0, encoded.stderr
    attention = json.loads(encoded.stdout)["attention"]
    assert [a["layer"] for a in attention] == [0, 1, 2]
    generated = cli("generate", "time flies like", "-m", str(path), "-n", "3", "--lens", "--json")
    assert generated.exit_code == 0, generated.stderr
    assert all(len(step["lens"]) == 4 for step in json.loads(generated.stdout)["steps"])


def test_sliding_window_weights_leave_out_far_keys(tmp_path):
    """A query of a sliding layer attends to the `sliding_window` most recent positions only, itself included;
    the full layer sees everything before it. In prefill and, with the KV cache, step by step."""
    from tfcli.model import KVCache

    path = tmp_path / "gemma-like.yaml"
    path.write_text(YAML_DECODER)
    model = tfcli.load_model(str(path))
    ids = torch.tensor([[101, 2051, 10029, 2066, 2019, 8612]])
    with torch.no_grad():
        full = captured_pass(model, ids).attentions
        cache, steps = KVCache(ids.shape[1]), []
        for t in range(ids.shape[1]):
            steps.append(captured_pass(model, ids[:, t:t + 1], cache=cache).attentions)
    reach = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    assert bool((full[0][0, :, reach >= 3] == 0).all()) and bool((full[0][0, :, (reach >= 0) & (reach < 3)] > 0).all())
    assert bool((full[2][0, :, reach >= 0] > 0).all())
    for t, step in enumerate(steps):  # the cached step's weights are the prefill's row t
        for layer in (0, 2):
            assert torch.allclose(step[layer][0, :, 0], full[layer][0, :, t, :t + 1], atol=1e-6)


@pytest.mark.parametrize("line,message", [
    ("rope_scaling: {rope_type: su, factor: 2}", "RoPE scaling `su` is not supported"),
    ("rope_scaling: {rope_type: longrope, factor: 2}", "needs `short_factor`"),
    ("rope_scaling: {rope_type: linear}", "needs `factor`"),
    ("rope_scaling: {rope_type: linear, factor: 2, beta_fast: 3}", "takes no `beta_fast`"),
    ("layer_types: [sliding_attention]", "names 1 layers"),
    ("sliding_window: null", "no `sliding_window`"),
    ("partial_rotary_factor: 0.2", "even number of rotated dimensions"),
    ("shared_block_norm: true", "parallel blocks only"),
    ("qk_norm: both", "unsupported qk_norm"),
])
def test_bad_new_settings_are_refused_in_one_line(line, message, tmp_path, cli):
    path = tmp_path / "bad.yaml"
    key = line.split(":")[0]
    kept, skipping = [], False
    for row in YAML_DECODER.splitlines():  # without the key's own lines
        skipping = row.startswith(key + ":") or (skipping and row.startswith("  "))
        kept += [] if skipping else [row]
    path.write_text("\n".join(kept) + f"\n{line}\n")
    result = cli("config", str(path))
    assert result.exit_code == 1
    assert message in result.stderr and result.stderr.count("error:") == 1


# config.json as published (trimmed to the keys that matter), in the older forms transformers still reads
PUBLISHED = {
    "meta-llama/Llama-3.2-1B": (
        dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64, num_hidden_layers=16, intermediate_size=8192, vocab_size=128256,
             max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
             rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                               original_max_position_embeddings=8192, rope_type="llama3"),
             bos_token_id=128000, eos_token_id=[128001, 128008, 128009]),
        dict(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                    high_freq_factor=4.0, original_max_position_embeddings=8192),
             eos_token_id=[128001, 128008, 128009], head_dim=64, tie_word_embeddings=True)),
    "lmsys/vicuna-7b-v1.5-16k": (  # Llama 2 with the oldest rope_scaling form ("type") and no head_dim
        dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, num_attention_heads=32,
             num_key_value_heads=32, num_hidden_layers=32, intermediate_size=11008, vocab_size=32000,
             max_position_embeddings=4096, rms_norm_eps=1e-5, rope_scaling=dict(factor=4.0, type="linear"),
             pad_token_id=0, tie_word_embeddings=False),
        dict(rope_theta=10000.0, rope_scaling=dict(rope_type="linear", factor=4.0), head_dim=128, pad_token_id=0)),
    "microsoft/Phi-3-mini-128k-instruct": (  # original_max_position_embeddings at the top level, not in the mapping
        dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=3072, num_attention_heads=32,
             num_key_value_heads=32, num_hidden_layers=32, intermediate_size=8192, vocab_size=32064,
             max_position_embeddings=131072, original_max_position_embeddings=4096, rope_theta=10000.0,
             rope_scaling=dict(type="longrope", short_factor=[1.0] * 48, long_factor=[2.0] * 48),
             sliding_window=262144, bos_token_id=1, eos_token_id=32000, pad_token_id=32000),
        dict(rope_scaling=dict(rope_type="longrope", short_factor=[1.0] * 48, long_factor=[2.0] * 48,
                               original_max_position_embeddings=4096), sliding_window=262144)),
    "Qwen/Qwen3-8B with YaRN": (  # as its model card says to turn YaRN on: a factor of its own, not 40960 / 32768
        dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=4096, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
             max_position_embeddings=40960, rope_theta=1000000, tie_word_embeddings=False,
             rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)),
        dict(rope_theta=1e6, rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=32768))),
    "microsoft/phi-2": (  # partial_rotary_factor at the top level
        dict(model_type="phi", architectures=["PhiForCausalLM"], hidden_size=2560, num_attention_heads=32,
             num_hidden_layers=32, intermediate_size=10240, vocab_size=51200, max_position_embeddings=2048,
             partial_rotary_factor=0.4, rope_theta=10000.0, rope_scaling=None, hidden_act="gelu_new",
             layer_norm_eps=1e-5, qk_layernorm=False, tie_word_embeddings=False, bos_token_id=50256,
             eos_token_id=50256),
        dict(partial_rotary_factor=0.4, rope_theta=10000.0, rope_scaling=None)),
    "google-t5/t5-small": (  # the first T5: ReLU, a tied head scaled by d_model ** -0.5
        dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=512, d_ff=2048, d_kv=64,
             num_heads=8, num_layers=6, layer_norm_epsilon=1e-6, n_positions=512, relative_attention_num_buckets=32,
             vocab_size=32128, feed_forward_proj="relu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
        dict(layer_norm_eps=1e-6, head_dim=64, hidden_act="relu", feed_forward="mlp", tie_word_embeddings=True,
             scale_decoder_outputs=True, max_position_embeddings=512, relative_attention_num_buckets=32)),
    "google/flan-t5-small": (  # T5 v1.1: gated GELU, 6 heads of 64 in 512, its own head, not scaled
        dict(model_type="t5", architectures=["T5ForConditionalGeneration"], d_model=512, d_ff=1024, d_kv=64,
             num_heads=6, num_layers=8, num_decoder_layers=8, layer_norm_epsilon=1e-6, n_positions=512,
             relative_attention_num_buckets=32, vocab_size=32128, feed_forward_proj="gated-gelu",
             tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
        dict(layer_norm_eps=1e-6, head_dim=64, num_attention_heads=6, hidden_act="gelu_new", feed_forward="gated",
             tie_word_embeddings=False, scale_decoder_outputs=False, num_decoder_layers=8)),
    "tiiuae/falcon-40b": (  # no num_ln_in_parallel_attn or ffn_hidden_size: two norms per block, 4x the width
        dict(model_type="falcon", architectures=["FalconForCausalLM"], hidden_size=8192, num_attention_heads=128,
             num_hidden_layers=60, num_kv_heads=8, new_decoder_architecture=True, multi_query=True,
             parallel_attn=True, bias=False, alibi=False, vocab_size=65024, layer_norm_epsilon=1e-5,
             bos_token_id=11, eos_token_id=11),
        dict(hidden_size=8192, shared_block_norm=False, intermediate_size=32768, num_key_value_heads=8)),
    "answerdotai/ModernBERT-base": (  # written before layer_types: every third layer global
        dict(model_type="modernbert", architectures=["ModernBertForMaskedLM"], hidden_size=768, num_hidden_layers=22,
             num_attention_heads=12, intermediate_size=1152, global_attn_every_n_layers=3, local_attention=128,
             global_rope_theta=160000.0, local_rope_theta=10000.0, vocab_size=50368, max_position_embeddings=8192,
             hidden_activation="gelu", norm_eps=1e-5, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282),
        dict(layer_types=["sliding_attention" if i % 3 else "full_attention" for i in range(22)],
             rope_theta=160000.0, local_rope_theta=10000.0)),
    "google/gemma-3-1b-pt": (
        dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=1152, head_dim=256,
             num_attention_heads=4, num_key_value_heads=1, num_hidden_layers=26, intermediate_size=6912,
             vocab_size=262144, max_position_embeddings=32768, hidden_activation="gelu_pytorch_tanh",
             query_pre_attn_scalar=256, rope_local_base_freq=10000, rope_theta=1000000, rope_scaling=None,
             sliding_window=512, sliding_window_pattern=6, attn_logit_softcapping=None,
             final_logit_softcapping=None, bos_token_id=2, eos_token_id=1, pad_token_id=0),
        dict(rope_theta=1e6, local_rope_theta=1e4, rope_scaling=None, sliding_window=512, qk_norm="head",
             layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2,
             norm="rmsnorm_plus_one", norm_position="sandwich", hidden_act="gelu_new", query_pre_attn_scalar=256)),
    "google/gemma-7b": (
        dict(model_type="gemma", architectures=["GemmaForCausalLM"], hidden_size=3072, head_dim=256,
             num_attention_heads=16, num_key_value_heads=16, num_hidden_layers=28, intermediate_size=24576,
             vocab_size=256000, hidden_act="gelu", hidden_activation=None, rope_theta=10000.0),
        dict(hidden_act="gelu_new", head_dim=256, scale_embedding=True, sliding_window=None)),
    "Qwen/Qwen2.5-7B-Instruct": (
        dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584, num_attention_heads=28,
             num_key_value_heads=4, num_hidden_layers=28, intermediate_size=18944, vocab_size=152064,
             max_position_embeddings=32768, rope_theta=1000000.0, sliding_window=131072, use_sliding_window=False,
             max_window_layers=28, rope_scaling=None, eos_token_id=151645),
        dict(sliding_window=None, layer_types=[], attention_bias=True, attention_out_bias=False)),
}


@pytest.mark.parametrize("name", [*PUBLISHED, "tiiuae/falcon-40b with n_embed"])
def test_published_configs_translate_as_transformers_reads_them(name, tmp_path):
    if name == "tiiuae/falcon-40b with n_embed":  # the older name of hidden_size, which transformers still reads
        hf, expected = copy.deepcopy(PUBLISHED["tiiuae/falcon-40b"])
        hf["n_embed"] = hf.pop("hidden_size")
    else:
        hf, expected = PUBLISHED[name]
    config = read_config_json(tmp_path, hf)
    assert {key: getattr(config, key) for key in expected} == expected


@pytest.mark.parametrize("id2label, labels", [
    ({str(i): f"l{i}" for i in (10, 2, 0, 11, 1, 3, 4, 5, 6, 7, 8, 9)}, [f"l{i}" for i in range(12)]),  # not 0, 1, 10
    ({}, []),  # no labels: the default head size stands
])
def test_labels_are_read_in_the_order_of_their_numbers(tmp_path, id2label, labels):
    config = read_config_json(tmp_path, dict(model_type="bert", id2label=id2label))
    assert (config.labels, config.num_labels) == (labels, len(labels) or 2)


@pytest.mark.parametrize("model_type, key, value, kept", [
    ("bert", "pad_token_id", 100, None), ("bart", "decoder_start_token_id", 100, None),
    ("bart", "forced_bos_token_id", 100, None), ("bart", "forced_eos_token_id", 100, None),
    ("llama", "eos_token_id", [-1, 0, 99, 100], [0, 99]), ("llama", "eos_token_id", [100, 101], None),
])
def test_a_special_id_outside_the_vocabulary_is_dropped_as_transformers_tolerates(tmp_path, model_type, key, value,
                                                                                  kept):
    """transformers only warns about a special token id outside 0 .. vocab_size - 1; such a token can never be read
    or produced. Of several end-of-sequence ids (Llama 3), those inside stay."""
    assert getattr(read_config_json(tmp_path, {"model_type": model_type, "vocab_size": 100, key: value}), key) == kept


@pytest.mark.parametrize("key", ["bos_token_id", "pad_token_id"])
@pytest.mark.parametrize("value, kept", [([5, 6], 5), ([], None)])
def test_a_list_of_start_or_padding_ids_reads_as_its_first(tmp_path, key, value, kept):
    """transformers 4 wrote a list where a config.json gave one (transformers 5 refuses it); only end-of-sequence
    ids mean something in a list, so tfcli takes the first (none of an empty list)."""
    assert getattr(read_config_json(tmp_path, {"model_type": "llama", "vocab_size": 100, key: value}), key) == kept


@pytest.mark.parametrize("kind", ["su", "yarn"])
@pytest.mark.parametrize("form", ["type", "rope_type"])
def test_phi3s_older_scaling_names_read_as_longrope(tmp_path, kind, form):
    """The first Phi-3 128k files said `su` (and some `yarn`) for what transformers' Phi-3 runs as LongRoPE."""
    hf, expected = copy.deepcopy(PUBLISHED["microsoft/Phi-3-mini-128k-instruct"])
    hf["rope_scaling"] = {form: kind, "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}
    assert read_config_json(tmp_path, hf).rope_scaling == expected["rope_scaling"]


@pytest.mark.parametrize("value, kept", [([7, 5, 9], 5), ([], None)])
def test_several_forced_end_ids_read_as_the_lowest(tmp_path, value, kept):
    """A list of forced_eos_token_id: transformers' generate gives each of them the same score, so greedy decoding
    ends on the lowest."""
    config = read_config_json(tmp_path, {"model_type": "bart", "vocab_size": 100, "forced_eos_token_id": value})
    assert config.forced_eos_token_id == kept


def test_a_deberta_span_of_one_distance_stays_one(tmp_path):
    """DeBERTa's max_relative_positions below 1 means the position table's length; 1 itself is kept, as
    transformers keeps it."""
    values = dict(model_type="deberta-v2", relative_attention=True, max_position_embeddings=64)
    assert read_config_json(tmp_path, {**values, "max_relative_positions": 1}).max_relative_positions == 1
    assert read_config_json(tmp_path, {**values, "max_relative_positions": 0}).max_relative_positions == 64


def test_an_older_modernbert_configs_rope_scaling_is_refused(tmp_path):
    """tfcli runs ModernBERT's plain rotary positions: a scaling in the older top-level key is refused too."""
    with pytest.raises(TfcliError, match="ModernBERT with RoPE scaling") as refused:
        read_config_json(tmp_path, dict(model_type="modernbert", rope_scaling=dict(rope_type="linear", factor=2.0)))
    assert refused.value.hint


def test_gemma3s_older_rope_keys_read_as_transformers_reads_them(tmp_path):
    """Gemma 3 configs written before rope_parameters: rope_theta for full attention, rope_local_base_freq for the
    sliding-window layers."""
    import transformers

    values = dict(rope_theta=1e6, rope_local_base_freq=100.0)
    ours = read_config_json(tmp_path, dict(model_type="gemma3_text", **values))
    theirs = transformers.Gemma3TextConfig(**values).rope_parameters
    assert (ours.rope_theta, ours.local_rope_theta) == (theirs["full_attention"]["rope_theta"],
                                                        theirs["sliding_attention"]["rope_theta"]) == (1e6, 100.0)


@pytest.mark.parametrize("projection", ["relu", "gated-gelu", "gated-silu", "silu"])
def test_t5s_feed_forward_reads_as_transformers_reads_it(tmp_path, projection):
    import transformers

    ours = read_config_json(tmp_path, dict(model_type="t5", feed_forward_proj=projection))
    theirs = transformers.T5Config(feed_forward_proj=projection)
    assert (ours.hidden_act, ours.feed_forward == "gated") == (theirs.dense_act_fn, theirs.is_gated_act)


def test_yarn_without_a_factor_takes_the_ratio_of_the_lengths(tmp_path):
    """As transformers' YaRN does: factor = max_position_embeddings / original_max_position_embeddings."""
    config = read_config_json(tmp_path, dict(
        model_type="llama", hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=8,
        vocab_size=10, max_position_embeddings=65536,
        rope_scaling=dict(rope_type="yarn", original_max_position_embeddings=16384)))
    assert config.rope_scaling == dict(
        rope_type="yarn", original_max_position_embeddings=16384, factor=4.0)
