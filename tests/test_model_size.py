"""The parameter count that `tfcli config` and the memory check use is arithmetic; it must equal the count of
the model that the same config builds, for every kind of stack, head and option."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcli.config import ModelConfig, parameter_count
from tfcli.sources import bundled_names, resolve_source

SMALL = dict(vocab_size=101, hidden_size=16, num_attention_heads=4, intermediate_size=24, max_position_embeddings=20,
             num_hidden_layers=2)
CASES = {
    "encoder, post-norm, MLM head": dict(head="mlm"),
    "encoder, untied MLM head with bias": dict(head="mlm", tie_word_embeddings=False, lm_head_bias=True),
    "classifier with pooler": dict(head="classifier", num_labels=3),
    "classifier without pooler": dict(head="classifier", classifier_pooler="none", num_labels=5),
    "decoder, tied LM head": dict(architecture="decoder", head="lm", norm_position="pre", final_norm=True),
    "decoder, gated, GQA, RMSNorm, rotary, untied": dict(
        architecture="decoder", head="lm", feed_forward="gated", num_key_value_heads=2, norm="rmsnorm",
        position="rotary", type_vocab_size=0, embedding_norm=False, final_norm=True, tie_word_embeddings=False,
        attention_bias=False, attention_out_bias=False, mlp_bias=False),
    "decoder, QKV bias only (Qwen2)": dict(architecture="decoder", attention_bias=True, attention_out_bias=False,
                                           feed_forward="gated", num_key_value_heads=1),
    "encoder-decoder, more decoder layers, offset positions": dict(
        architecture="encoder-decoder", num_decoder_layers=3, head="lm", lm_head_bias=True, position_offset=2),
    "encoder-decoder, sinusoidal, no segments": dict(architecture="encoder-decoder", position="sinusoidal",
                                                     type_vocab_size=0),
    "encoder without head": dict(head="none", type_vocab_size=3),
    "encoder-decoder, T5: no positions, relative position bias, own head size, gated, no biases": dict(
        architecture="encoder-decoder", head="lm", position="none", relative_attention_num_buckets=8, head_dim=6,
        norm="rmsnorm", norm_position="pre", final_norm=True, feed_forward="gated", attention_bias=False,
        attention_out_bias=False, mlp_bias=False, embedding_norm=False, scale_decoder_outputs=True),
    "encoder, ALBERT: narrower embeddings projected up, one shared block, MLM head": dict(
        embedding_size=8, num_hidden_groups=1, head="mlm", lm_head_bias=True, num_hidden_layers=3),
    "encoder, two groups over three layers, untied MLM head": dict(
        embedding_size=8, num_hidden_groups=2, head="mlm", tie_word_embeddings=False, num_hidden_layers=3),
    "encoder, ELECTRA discriminator": dict(embedding_size=8, head="discriminator"),
    "encoder, DeBERTa-v3: disentangled attention, shared keys, buckets, normed table": dict(
        relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8, max_relative_positions=16,
        share_att_key=True, norm_rel_ebd=True, position="none", type_vocab_size=0, head="mlm"),
    "encoder, DeBERTa-v2: own position projections for c2p only, exact distances": dict(
        relative_attention=True, pos_att_type=["c2p"], max_relative_positions=16, head="classifier"),
    "encoder, disentangled attention without biases": dict(
        relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16, attention_bias=False,
        attention_out_bias=False, head="none"),
    "encoder, ModernBERT: no biases, first block without attention norm, GeGLU, mean-pooled normed classifier": dict(
        norm_bias=False, first_block_attention_norm=False, norm_position="pre", final_norm=True, feed_forward="gated",
        attention_bias=False, attention_out_bias=False, mlp_bias=False, position="rotary", type_vocab_size=0,
        head="classifier", classifier_pooling="mean", classifier_norm=True, classifier_bias=False,
        classifier_pooler="gelu"),
    "encoder, ModernBERT MLM head without biases in its dense and norm": dict(
        norm_bias=False, classifier_bias=False, head="mlm", lm_head_bias=True, norm_position="pre"),
    "encoder, MPNet: relative position bias with learned positions": dict(
        relative_attention_num_buckets=32, position_offset=2, type_vocab_size=0, head="mlm"),
    "classifier with a GELU pooler": dict(head="classifier", classifier_pooler="gelu", num_labels=3),
    "encoder-decoder, Marian: sinusoidal halves": dict(architecture="encoder-decoder", position="sinusoidal_halves",
                                                        head="lm", lm_head_bias=True),
    "encoder-decoder, each stack its own token embeddings, untied head": dict(
        architecture="encoder-decoder", head="lm", share_encoder_decoder_embeddings=False, tie_word_embeddings=False),
    "decoder, sandwich norms, per-head q/k norms, own head size (Gemma 3)": dict(
        architecture="decoder", head="lm", norm="rmsnorm_plus_one", norm_position="sandwich", qk_norm="head",
        head_dim=12, feed_forward="gated", position="rotary", sliding_window=4, layer_types=["sliding_attention",
                                                                                             "full_attention"]),
    "decoder, norms after each sublayer, q/k norms over the projections (OLMo 2)": dict(
        architecture="decoder", head="lm", norm="rmsnorm", norm_position="sublayer_output", qk_norm="projection",
        num_key_value_heads=2, final_norm=True),
    "encoder-decoder, q/k norms (self-attention only, not the cross-attention)": dict(
        architecture="encoder-decoder", head="lm", norm="rmsnorm", norm_position="pre", qk_norm="head",
        final_norm=True),
    "decoder, parallel block with one shared norm (GPT-J)": dict(
        architecture="decoder", head="lm", norm_position="pre", parallel_residual=True, shared_block_norm=True,
        lm_head_bias=True, tie_word_embeddings=False),
    "decoder, parallel block with two norms, LayerNorm q/k norms (Pythia, Phi)": dict(
        architecture="decoder", head="lm", norm_position="pre", parallel_residual=True, qk_norm="head"),
    "encoder-decoder, sandwich norms": dict(architecture="encoder-decoder", head="lm", norm_position="sandwich"),
    "decoder with narrower token embeddings, untied (OPT-350m)": dict(
        architecture="decoder", head="lm", norm_position="post", word_embed_proj_dim=8, tie_word_embeddings=False,
        position_offset=2),
}


def built_count(config: ModelConfig) -> int:
    """Parameters of the model itself, built on the meta device (tied weights once)."""
    import torch

    from tfcli.model import TransformerModel

    with torch.device("meta"):
        model = TransformerModel(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", CASES)
def test_arithmetic_count_equals_the_built_model(case):
    config = ModelConfig(**{**SMALL, **CASES[case]})
    assert parameter_count(config) == built_count(config)


@pytest.mark.parametrize("name", bundled_names())
def test_bundled_configs(name):
    config = resolve_source(name).config
    assert parameter_count(config) == built_count(config)


@settings(max_examples=40, deadline=None)
@given(architecture=st.sampled_from(["encoder", "decoder", "encoder-decoder"]), layers=st.integers(1, 3),
       decoder_layers=st.integers(1, 3), kv_heads=st.sampled_from([1, 2, 4]), flags=st.lists(st.booleans(), min_size=8,
                                                                                           max_size=8),
       head=st.sampled_from(["none", "mlm", "lm", "classifier"]), position=st.sampled_from(["learned", "sinusoidal",
                                                                                            "rotary"]))
def test_any_config(architecture, layers, decoder_layers, kv_heads, flags, head, position):
    if head == "lm" and architecture == "encoder":
        head = "mlm"
    gated, rms, tied, qkv_bias, out_bias, mlp_bias, final_norm, embedding_norm = flags
    config = ModelConfig(**{**SMALL, "architecture": architecture, "num_hidden_layers": layers,
                            "num_decoder_layers": decoder_layers, "num_key_value_heads": kv_heads, "head": head,
                            "position": position, "feed_forward": "gated" if gated else "mlp",
                            "norm": "rmsnorm" if rms else "layernorm", "tie_word_embeddings": tied,
                            "attention_bias": qkv_bias, "attention_out_bias": out_bias, "mlp_bias": mlp_bias,
                            "final_norm": final_norm, "embedding_norm": embedding_norm, "lm_head_bias": not tied})
    assert parameter_count(config) == built_count(config)


def test_a_huge_config_is_counted_at_once():
    config = dataclasses.replace(ModelConfig(), num_hidden_layers=10**9)
    per_layer = parameter_count(dataclasses.replace(config, num_hidden_layers=2)) - parameter_count(
        dataclasses.replace(config, num_hidden_layers=1))
    assert parameter_count(config) == parameter_count(dataclasses.replace(config, num_hidden_layers=1)) + (
        10**9 - 1) * per_layer


def test_config_imports_no_torch():
    """`tfcli config` needs no weights, so it imports neither torch nor anything heavy."""
    code = ("import sys; from typer.testing import CliRunner; from tfcli.cli import app; "
            "result = CliRunner().invoke(app, ['config', 'bert-base', '--json']); "
            "print(result.stdout.strip()); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    record, imported = result.stdout.strip().splitlines()
    assert json.loads(record)["parameters"] == 109_514_298  # BERT-base with its MLM head, as transformers counts
    assert imported == "[]"
