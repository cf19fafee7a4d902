"""The bfloat16 CPU path: linear layers multiply by oneDNN-packed bfloat16 weights where the CPU has bfloat16
instructions (in generation and streams), fall back to PyTorch's kernel cleanly where it has not, and give
transformers' results to bfloat16 precision: the same greedy tokens, the same logits within a few bfloat16 steps."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import tfcli
import tfcli.model.linear as linear
from tfcli.model.linear import Linear
from conftest import captured_pass

EPS = torch.finfo(torch.bfloat16).eps  # 2**-7


def assert_bfloat16_close(ours, theirs, steps: int = 1):
    """Within `steps` bfloat16 rounding steps of the largest value."""
    scale = float(theirs.float().abs().max())
    diff = float((ours.float() - theirs.float()).abs().max())
    assert diff <= steps * EPS * scale, f"max abs diff {diff:.3g} > {steps} x bfloat16 eps x {scale:.3g}"


@pytest.mark.parametrize("rows", [1, 7])
def test_packed_bfloat16_linear_matches_pytorch(rows):
    torch.manual_seed(0)
    layer = Linear(96, 40).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        results = [layer(x) for _ in range(2)]  # the second packed where the CPU can
        if torch.bfloat16 in linear.PACKABLE:
            assert layer._packed is not None  # the packed kernel really ran
        for result in results:
            assert result.dtype == torch.bfloat16
            assert_bfloat16_close(result, F.linear(x, layer.weight, layer.bias))
        layer.weight.mul_(2)  # a changed weight must not leave a stale packed copy behind
        for _ in range(2):
            assert_bfloat16_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_falls_back_to_pytorch_where_packing_fails(monkeypatch):
    """A CPU whose oneDNN refuses bfloat16 packing: the product still comes out, plain, from then on."""
    monkeypatch.setattr(linear, "PACKABLE", {torch.float32, torch.bfloat16})

    def refuse(weight, rows):
        raise RuntimeError("mkldnn bf16 path needs the cpu support avx512bw, avx512vl and avx512dq")

    monkeypatch.setattr(linear, "pack", refuse)
    torch.manual_seed(0)
    layer = Linear(32, 16).to(torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert linear.PACKABLE == {torch.float32}


@pytest.fixture(scope="module")
def bfloat16_pairs(tmp_path_factory):
    """[(transformers model in bfloat16, the same weights in float32, tfcli model in bfloat16)] for GPT-2 and
    Llama, loaded from a bfloat16 checkpoint transformers saved."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    models = [GPT2LMHeadModel(GPT2Config(**sizes, n_embd=64, n_layer=2, n_head=4, n_positions=64)),
              LlamaForCausalLM(LlamaConfig(**sizes, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64))]
    pairs = []
    for model in models:
        with torch.no_grad():  # non-zero biases and norms, so that each shows
            for name, param in model.named_parameters():
                if name.endswith("bias") or "norm" in name or "ln_" in name:
                    param.add_(torch.randn_like(param) * 0.1)
        theirs = model.to(torch.bfloat16).eval()
        theirs.generation_config.eos_token_id = None  # both make every token asked for
        theirs.generation_config.pad_token_id = 0
        path = tmp_path_factory.mktemp("bf16")
        theirs.save_pretrained(path)
        ours = tfcli.load_model(str(path), dtype="bfloat16")
        ours.config.eos_token_id = None
        pairs.append((theirs, copy.deepcopy(theirs).float(), ours))
    return pairs


@pytest.mark.slow
def test_bfloat16_greedy_generation_matches_transformers_to_bfloat16_precision(bfloat16_pairs):
    """Same greedy tokens as transformers in bfloat16; on that sequence, logits within two bfloat16 steps of
    transformers', and no further from the exact (float32) logits of the same weights than transformers' are."""
    prompt = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    for theirs, exact, ours in bfloat16_pairs:
        with torch.no_grad():
            sequence = ours.generate(prompt, max_new_tokens=20)
            assert sequence.tolist() == theirs.generate(prompt, max_new_tokens=20, do_sample=False).tolist()
            our_logits, their_logits = ours(sequence).logits, theirs(sequence).logits
            exact_logits = exact(sequence).logits
        assert our_logits.dtype == torch.bfloat16
        assert_bfloat16_close(our_logits, their_logits, steps=2)
        our_error = float((our_logits.float() - exact_logits).abs().max())
        their_error = float((their_logits.float() - exact_logits).abs().max())
        assert our_error <= 2 * their_error, (our_error, their_error)


POSITIONS = {  # YAML lines: each kind of position that tfcli computes in float32 and casts where it is used
    "sinusoidal": "position: sinusoidal\n",
    "sinusoidal halves": "position: sinusoidal_halves\n",
    "relative bias": "position: none\nrelative_attention_num_buckets: 8\n",
    "disentangled (DeBERTa)": "position: none\nrelative_attention: true\npos_att_type: [c2p, p2c]\n"
                              "position_buckets: 8\nmax_relative_positions: 16\n"
                              "share_att_key: true\nnorm_rel_ebd: true\n",
    "rotary with a local base for sliding layers": "position: rotary\nlocal_rope_theta: 100.0\nsliding_window: 4\n"
                                                   "layer_types: [sliding_attention, full_attention]\n",
}


@pytest.mark.parametrize("position", POSITIONS)
def test_positions_in_bfloat16_stay_bfloat16(yaml_model, position):
    """The float32 tables of positions are cast to the model's dtype where they are used: the bfloat16 model
    runs in bfloat16 throughout and stays within bfloat16 steps of the same weights in float32."""

    text = ("architecture: encoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 2\nhead: mlm\n"
            + POSITIONS[position])
    exact, ours = yaml_model(text), yaml_model(text, dtype="bfloat16")
    ids = torch.tensor([[5, 17, 42, 8, 77, 9, 60, 11]])
    with torch.no_grad():
        mine = captured_pass(ours, ids)
        theirs = captured_pass(exact, ids)
    assert {h.dtype for h in mine.hidden_states} == {torch.bfloat16}
    assert_bfloat16_close(mine.hidden_states[0], theirs.hidden_states[0])
    assert_bfloat16_close(mine.logits, theirs.logits, steps=4)
