"""Component parity: each building block of the seeds against an independent implementation
(the seeds' formulas, PyTorch's own nn.Transformer layers, transformers' rotary and RMSNorm)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfcli

from tfcli.config import ModelConfig
from tfcli.model import Sites
from tfcli.model.attention import Attention, scaled_dot_product_attention
from tfcli.model.rotary import Rotary, apply_rotary
from tfcli.model.embeddings import sinusoidal_table
from tfcli.model.layers import Block
import tfcli.model.linear as linear
from tfcli.model.linear import Linear
from tfcli.model.transformer import attention_mask_bias
from conftest import captured_pass

WIDTH, HEADS = 32, 4


def config(**overrides) -> ModelConfig:
    values = dict(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=64, layer_norm_eps=1e-5,
                  hidden_act="relu", norm_position="post")
    return ModelConfig(**{**values, **overrides})


def seeds_attention(q, k, v, mask=None):
    """The seeds' scaled dot-product attention, written out."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def test_scaled_dot_product_attention_fast_and_explicit_paths_match_the_formula(assert_close):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, HEADS, 5, 8).unbind(0)
    causal = torch.tril(torch.ones(5, 5))
    bias = attention_mask_bias(None, 5, True, torch.float32, torch.device("cpu"))
    expected = seeds_attention(q, k, v, causal)
    fast = scaled_dot_product_attention(q, k, v, bias)
    seen = []
    explicit = scaled_dot_product_attention(q, k, v, bias, pattern=lambda w: seen.append(w) or w)
    (weights,) = seen
    assert_close("fast", fast, expected, 1e-5)
    assert_close("explicit", explicit, expected, 1e-5)
    assert_close("rows sum to 1", weights.sum(-1), torch.ones(2, HEADS, 5), 1e-6)


def test_grouped_query_attention_equals_repeated_key_value_heads(assert_close):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 6, 8)
    k, v = torch.randn(2, 1, 2, 6, 8).unbind(0)
    repeated = seeds_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    for pattern in (None, lambda weights: weights):  # the fused path and the explicit one
        assert_close("gqa", scaled_dot_product_attention(q, k, v, None, pattern=pattern), repeated, 1e-5)


@pytest.mark.parametrize("rows_share_the_prefix", [True, False])
def test_attention_over_given_keys_equals_attention_over_the_joined_keys(assert_close, rows_share_the_prefix):
    """The patch sweep's two-block attention (keys and values given before the new ones, one softmax): the same
    outputs, weights and gradients as the formula over the keys joined, for grouped heads, a mask over both blocks,
    a score cap and a pattern site."""
    torch.manual_seed(0)
    batch, heads, groups, new, given, dim = 3, 6, 2, 4, 7, 8
    q = torch.randn(batch, heads, new, dim, requires_grad=True)
    k, v = (torch.randn(batch, groups, new, dim, requires_grad=True) for _ in range(2))
    padded = tuple(torch.randn(groups, 1 if rows_share_the_prefix else batch, given + 3, dim) for _ in range(2))
    before = (*padded, given)  # three rows of padding after the given ones (random: they must not count)
    joined = [torch.cat([t[:, :, :given].transpose(0, 1).expand(batch, -1, -1, -1), new_t], dim=2)
              for t, new_t in zip(padded, (k, v))]
    mask = torch.randn(batch, 1, new, given + new)
    for cap, seen in ((None, []), (2.0, [])):
        weights_of = []
        ours = scaled_dot_product_attention(q, k, v, mask, 0.3, cap, lambda w: seen.append(w) or w, before)
        expected = scaled_dot_product_attention(q, *joined, mask, 0.3, cap, lambda w: weights_of.append(w) or w)
        assert_close("output", ours, expected, 1e-5)
        assert_close("weights", seen[0], weights_of[0], 1e-6)
        assert_close("without the site", scaled_dot_product_attention(q, k, v, mask, 0.3, cap, None, before),
                     expected, 1e-5)
    grads = [torch.autograd.grad((scaled_dot_product_attention(q, *kv, mask, None, None, None, *extra) ** 2).sum(),
                                 (q, k, v)) for kv, extra in (((k, v), (before,)), (joined, ()))]
    for name, ours, expected in zip("qkv", *grads):
        assert_close(f"gradient of {name}", ours, expected, 1e-5)
    # without a gradient, a cap or the site, the prefix unmasked (a patch sweep's runs): PyTorch's fused kernel over
    # the prefix, joined to the new keys by its log-sum-exp
    mask = torch.cat([torch.zeros(1, 1, new, given), torch.randn(1, 1, new, new)], dim=-1)
    with torch.no_grad():
        assert_close("fused prefix", scaled_dot_product_attention(q, k, v, mask, 0.3, None, None, before),
                     scaled_dot_product_attention(q, *joined, mask, 0.3), 1e-5)
        assert_close("fused prefix, no mask", scaled_dot_product_attention(q, k, v, None, None, None, None, before),
                     scaled_dot_product_attention(q, *joined, None), 1e-5)


def copy_torch_layer(ours: Block, theirs: nn.Module, cross: bool = False) -> None:
    """Load a torch.nn.Transformer{Encoder,Decoder}Layer's weights into a tfcli Block."""
    with torch.no_grad():
        ours.attn.qkv.weight.copy_(theirs.self_attn.in_proj_weight)
        ours.attn.qkv.bias.copy_(theirs.self_attn.in_proj_bias)
        ours.attn.out.load_state_dict(theirs.self_attn.out_proj.state_dict())
        ours.mlp.fc1.load_state_dict(theirs.linear1.state_dict())
        ours.mlp.fc2.load_state_dict(theirs.linear2.state_dict())
        ours.attn_norm.load_state_dict(theirs.norm1.state_dict())
        if cross:
            w, b = theirs.multihead_attn.in_proj_weight, theirs.multihead_attn.in_proj_bias
            ours.cross_attn.q.weight.copy_(w[:WIDTH]), ours.cross_attn.q.bias.copy_(b[:WIDTH])
            ours.cross_attn.kv.weight.copy_(w[WIDTH:]), ours.cross_attn.kv.bias.copy_(b[WIDTH:])
            ours.cross_attn.out.load_state_dict(theirs.multihead_attn.out_proj.state_dict())
            ours.cross_attn_norm.load_state_dict(theirs.norm2.state_dict())
            ours.mlp_norm.load_state_dict(theirs.norm3.state_dict())
        else:
            ours.mlp_norm.load_state_dict(theirs.norm2.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch_transformer_encoder_layer(norm_first, activation, assert_close):
    """The seeds' post-norm (add & norm) and pre-norm encoder layers, as PyTorch implements them."""
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(WIDTH, HEADS, 64, dropout=0.0, activation=activation, batch_first=True,
                                        norm_first=norm_first).eval()
    ours = Block(config(norm_position="pre" if norm_first else "post", hidden_act=activation)).eval()
    copy_torch_layer(ours, theirs)
    x = torch.randn(2, 7, WIDTH)
    padding = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=padding == 0)
        got = ours(x, attention_mask_bias(padding, 7, False, torch.float32, x.device))
    assert_close("block", got[0], expected[0], 1e-5)
    assert_close("block, real tokens of the padded text", got[1, :4], expected[1, :4], 1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_matches_torch_transformer_decoder_layer(norm_first, assert_close):
    """Masked self-attention, encoder-decoder attention and feed-forward, each with its residual."""
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(WIDTH, HEADS, 64, dropout=0.0, activation="relu", batch_first=True,
                                        norm_first=norm_first).eval()
    ours = Block(config(norm_position="pre" if norm_first else "post"), cross=True).eval()
    copy_torch_layer(ours, theirs, cross=True)
    x, memory = torch.randn(2, 5, WIDTH), torch.randn(2, 6, WIDTH)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        expected = theirs(x, memory, tgt_mask=causal, tgt_is_causal=True)
        mask = attention_mask_bias(None, 5, True, torch.float32, x.device)
        got = ours(x, mask, memory=memory)
    assert_close("decoder block", got, expected, 1e-5)


def test_sinusoidal_table_is_the_papers_formula():
    # far positions too: an angle computed in float32 there is already off by about 3e-5
    table = sinusoidal_table(512, 16)
    for pos in (0, 1, 17, 49, 300, 511):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_halves_table_matches_marians(assert_close):
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    theirs = MarianSinusoidalPositionalEmbedding(512, 16).create_weight()
    assert_close("sinusoidal halves", sinusoidal_table(512, 16, halves=True), theirs, 1e-6)


def test_a_sinusoidal_config_adds_the_table_to_the_token_embeddings(yaml_model, assert_close):
    model = yaml_model("architecture: encoder\nhidden_size: 16\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
                       "position: sinusoidal\nembedding_norm: false\ntype_vocab_size: 0\n")
    ids = torch.tensor([[5, 17, 42, 8, 77]])
    with torch.no_grad():
        embeddings = captured_pass(model, ids).hidden_states[0]
        tokens = model.embed(ids, model.encoder)
    assert_close("embeddings - tokens", embeddings - tokens, sinusoidal_table(5, 16)[None], 1e-6)


def test_rotary_matches_transformers(assert_close):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 3, 6, 8).unbind(0)
    positions = torch.arange(6)[None]
    cos, sin = Rotary(config(hidden_size=8, num_attention_heads=1, position="rotary"))(positions, torch.float32)
    theirs_q, theirs_k = apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0])
    assert_close("q", apply_rotary(q, cos, sin), theirs_q, 1e-6)
    assert_close("k", apply_rotary(k, cos, sin), theirs_k, 1e-6)


PHI3_FACTORS = dict(short_factor=[1.0 + i / 16 for i in range(48)], long_factor=[1.0 + i / 2 for i in range(48)])
# name: (head size, rope_theta, max_position_embeddings, rope_parameters): the real models' settings, and the
# optional keys each changed once
ROPE_SCALINGS = {
    "linear": (64, 10000.0, 4096, dict(rope_type="linear", factor=4.0)),
    "llama3 (Llama 3.1)": (128, 500000.0, 131072, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "llama3, other band": (64, 10000.0, 4096, dict(rope_type="llama3", factor=4.0, low_freq_factor=2.0,
                                                   high_freq_factor=8.0, original_max_position_embeddings=1024)),
    "yarn (Qwen3: its factor, not the lengths' ratio)": (128, 1e6, 40960, dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=32768)),
    "yarn, mscale and betas (DeepSeek)": (64, 10000.0, 163840, dict(
        rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=0.5,
        beta_fast=16.0, beta_slow=2.0)),
    "yarn, attention factor given, not truncated": (128, 1e6, 65536, dict(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=32768, attention_factor=1.3, truncate=False)),
    "yarn, factor 2 (no attention factor given)": (128, 1e6, 65536, dict(
        rope_type="yarn", factor=2.0, original_max_position_embeddings=32768)),
    "yarn, factor 1": (64, 10000.0, 4096, dict(rope_type="yarn", factor=1.0, original_max_position_embeddings=4096)),
    "yarn, factor below 1": (64, 10000.0, 4096, dict(rope_type="yarn", factor=0.5,
                                                     original_max_position_embeddings=4096)),
    "yarn, an mscale other than 1": (64, 10000.0, 163840, dict(
        rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=1.0)),
    "yarn, mscale alone (not used)": (64, 10000.0, 163840, dict(
        rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=0.707)),
    "yarn, factor from the lengths": (64, 10000.0, 8192, dict(
        rope_type="yarn", factor=None, original_max_position_embeddings=2048)),
    "yarn, a ramp ending past the head (a small theta)": (64, 10.0, 4096, dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=1024)),
    "longrope (Phi-3 128k)": (96, 10000.0, 131072, dict(
        rope_type="longrope", original_max_position_embeddings=4096, **PHI3_FACTORS)),
    "longrope, 1.5x the original length": (96, 10000.0, 6144, dict(
        rope_type="longrope", original_max_position_embeddings=4096, **PHI3_FACTORS)),
    "longrope, no longer than the original": (96, 10000.0, 4096, dict(
        rope_type="longrope", original_max_position_embeddings=4096, **PHI3_FACTORS)),
    "longrope, factor given": (96, 10000.0, 131072, dict(
        rope_type="longrope", original_max_position_embeddings=4096, factor=2.0, **PHI3_FACTORS)),
    "longrope, factor below 1": (96, 10000.0, 131072, dict(
        rope_type="longrope", original_max_position_embeddings=4096, factor=0.5, **PHI3_FACTORS)),
    "longrope, factor and attention factor given": (96, 10000.0, 131072, dict(
        rope_type="longrope", original_max_position_embeddings=4096, factor=2.0, attention_factor=1.2,
        **PHI3_FACTORS)),
}


@pytest.mark.parametrize("name", ROPE_SCALINGS)
def test_rope_scaling_frequencies_match_transformers(name, assert_close):
    """Each RoPE scaling's inverse frequencies and cos/sin factor against transformers' own functions, at the
    real models' head sizes and lengths (where the ramps and bands fall between frequencies)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tfcli.model.rotary import scaled_frequencies

    head, theta, max_positions, scaling = ROPE_SCALINGS[name]
    config = LlamaConfig(hidden_size=4 * head, num_attention_heads=4, head_dim=head,
                         max_position_embeddings=max_positions, rope_parameters={**scaling, "rope_theta": theta})
    theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, "cpu")
    ours, our_factor = scaled_frequencies(head, theta, scaling, max_positions)
    assert_close("inverse frequencies", ours, theirs, 1e-7)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


@pytest.mark.parametrize("buckets, max_position", [(256, 512), (8, 16)])  # deberta-v3's, and the tests' small ones
def test_deberta_log_buckets_match_transformers(buckets, max_position):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from tfcli.model.disentangled import log_bucket_position

    relative = torch.arange(-3 * max_position, 3 * max_position + 1)  # far beyond the exact and the log buckets
    theirs = make_log_bucket_position(relative, buckets, max_position)
    assert torch.equal(log_bucket_position(relative, buckets, max_position), theirs.long())


def test_attention_module_matches_torch_multihead_attention(assert_close):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True).eval()
    ours = Attention(config()).eval()
    with torch.no_grad():
        ours.qkv.weight.copy_(theirs.in_proj_weight), ours.qkv.bias.copy_(theirs.in_proj_bias)
        ours.out.load_state_dict(theirs.out_proj.state_dict())
        x = torch.randn(2, 5, WIDTH)
        expected, expected_weights = theirs(x, x, x, average_attn_weights=False)
        sites = Sites(keep=lambda name: name == "pattern")
        got = ours(x, None, sites=sites)
        weights = sites.cache["pattern"]
    assert_close("output", got, expected, 1e-5)
    assert_close("weights", weights, expected_weights, 1e-6)


def test_packed_linear_matches_plain_and_follows_weight_changes(assert_close):
    torch.manual_seed(0)
    layer = Linear(48, 24)
    x = torch.randn(3, 5, 48)
    with torch.no_grad():
        assert_close("plain", layer(x), F.linear(x, layer.weight, layer.bias), 1e-5)
        assert layer._packed is None  # a layer used once never packs
        assert_close("packed", layer(x), F.linear(x, layer.weight, layer.bias), 1e-5)  # used again: packs
        assert layer._packed is not None or torch.float32 not in linear.PACKABLE
        layer.weight.mul_(2)  # an in-place change must not leave a stale packed copy behind
        assert_close("after change", layer(x), F.linear(x, layer.weight, layer.bias), 1e-5)
        assert_close("one row", layer(x[:1, :1]), F.linear(x[:1, :1], layer.weight, layer.bias), 1e-5)
    assert layer(x).requires_grad  # training keeps autograd's plain path


def test_sliding_window_with_relative_position_bias_sees_only_the_window(yaml_model, assert_close):
    """A one-block causal decoder whose positions are only a relative bias: with a sliding window of 3, the
    last token's logits are those of the same weights without a window, fed only the last 3 tokens (the bias
    depends on distances alone, so both runs add the same bias to the keys the window keeps)."""
    common = ("architecture: decoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\nhead: lm\n"
              "norm_position: pre\nposition: none\ntype_vocab_size: 0\nrelative_attention_num_buckets: 8\n"
              "relative_attention_max_distance: 16\n")
    windowed, full = yaml_model(common + "sliding_window: 3\n"), yaml_model(common)
    ids = torch.tensor([[5, 17, 42, 8, 77, 9, 60, 11]])
    with torch.no_grad():
        got = windowed(ids).logits[:, -1]
        expected = full(ids[:, -3:]).logits[:, -1]
        unwindowed = full(ids).logits[:, -1]
    assert_close("last token's logits", got, expected, 1e-5)
    assert not torch.allclose(got, unwindowed, atol=1e-4)  # the window changes what the last token sees


def test_a_decoders_outputs_depend_only_on_their_prefix(tiny_decoder, assert_close):
    """Causality at every length, the shortest included: the logits at position i of a text of 1 to 5
    tokens are those of the text cut after position i."""
    model = tfcli.load_model(str(tiny_decoder))
    ids = torch.tensor([[5, 17, 42, 8, 77]])
    with torch.no_grad():
        last = [model(ids[:, :length]).logits[:, -1] for length in range(1, 6)]  # each prefix's last position
        for length in range(1, 6):
            logits = model(ids[:, :length]).logits
            for i in range(length):
                assert_close(f"position {i} of {length}", logits[:, i], last[i], 1e-5)
