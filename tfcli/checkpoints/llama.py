"""The Llama family (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM and their bare models).

Pre-norm decoder: RMSNorm, rotary positions (rotate-half layout), gated SiLU feed-forward,
grouped-query attention, a final RMSNorm and an (often untied) LM head. Qwen2 adds biases to the
Q/K/V projections but not to the output projection. Features tfcli does not implement (RoPE scaling,
sliding-window attention, a head size other than hidden_size / heads) are refused, not ignored.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, weight_bias
from tfcli.errors import TfcliError

HEADS = {"ForCausalLM": "lm"}


def _refuse(model_type: str, what: str) -> TfcliError:
    return TfcliError(f"config.json: {model_type} with {what} is not supported by tfcli",
                      "tfcli implements full causal attention with plain rotary positions")


def _rope_theta(hf: dict[str, Any], model_type: str) -> float:
    """rope_theta from transformers 5's `rope_parameters` or the older top-level keys; refuses scaling."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for source in (params, scaling):
        kind = source.get("rope_type", source.get("type", "default")) if isinstance(source, dict) else source
        if kind not in (None, "default"):
            raise _refuse(model_type, f"RoPE scaling `{kind}`")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else hf.get("rope_theta", 10000.0))


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    model_type = hf["model_type"]
    hidden, heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise _refuse(model_type, f"head_dim {head_dim} != hidden_size / num_attention_heads ({hidden // heads})")
    positions = hf.get("max_position_embeddings", 2048)
    window = hf.get("sliding_window")
    uses_window = hf.get("use_sliding_window", model_type == "mistral")
    layer_types = hf.get("layer_types") or []
    if (uses_window and window is not None and window < positions) or "sliding_attention" in layer_types:
        raise _refuse(model_type, f"sliding-window attention (window {window} < {positions} positions)")
    if model_type == "qwen2":
        qkv_bias, out_bias = True, False
    else:
        qkv_bias = out_bias = bool(hf.get("attention_bias", False))
    values = common(hf, model_type=model_type, architecture="decoder", hidden_size=hidden,
                    num_attention_heads=heads, max_position_embeddings=positions,
                    layer_norm_eps=hf.get("rms_norm_eps", 1e-6), hidden_act=hf.get("hidden_act", "silu"),
                    num_key_value_heads=hf.get("num_key_value_heads"),
                    attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), hidden_dropout_prob=0.0,
                    norm="rmsnorm", norm_position="pre", position="rotary", rope_theta=_rope_theta(hf, model_type),
                    type_vocab_size=0, embedding_norm=False, final_norm=True, feed_forward="gated",
                    attention_bias=qkv_bias, attention_out_bias=out_bias, mlp_bias=bool(hf.get("mlp_bias", False)),
                    head=architecture_head(hf, HEADS), tie_word_embeddings=hf.get("tie_word_embeddings", False))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(values.get(key), list):  # e.g. Llama 3's several end tokens: tfcli keeps the first
            values[key] = values[key][0] if values[key] else None
    return values


FAMILY = Family(
    model_types=("llama", "qwen2", "mistral"),
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("layers.{}.input_layernorm.weight", "decoder.blocks.{}.attention_norm.weight"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attention.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attention.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attention.v"),
        *weight_bias("layers.{}.self_attn.o_proj", "decoder.blocks.{}.attention.out"),
        ("layers.{}.self_attn.rotary_emb.inv_freq", None),
        ("layers.{}.post_attention_layernorm.weight", "decoder.blocks.{}.feed_forward_norm.weight"),
        *weight_bias("layers.{}.mlp.gate_proj", "decoder.blocks.{}.feed_forward.gate"),
        *weight_bias("layers.{}.mlp.up_proj", "decoder.blocks.{}.feed_forward.up"),
        *weight_bias("layers.{}.mlp.down_proj", "decoder.blocks.{}.feed_forward.down"),
        ("rotary_emb.inv_freq", None),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
)
