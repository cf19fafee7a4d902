"""Phi-3 and Phi-4-mini (Phi3ForCausalLM, Phi3Model).

Llama's block with Q, K and V in one projection (`qkv_proj`, in tfcli's q, k, v row order, read as it is) and
the gate and up projections in one (`gate_up_proj`, gate rows first: tfcli's `gate_up`); no biases; a sliding
window on every layer when `sliding_window` is set (Phi-3-mini-4k: 2047); rotary positions on the first
`partial_rotary_factor` of each head; LongRoPE for the 128k models (`rope_scaling` of type longrope, or su and
yarn, which transformers reads as longrope): short factors up to `original_max_position_embeddings`, long ones
past it, when tfcli, like transformers' Phi-3, computes the cached keys again.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, kv_heads_of
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    for key in ("rope_scaling", "rope_parameters"):  # transformers' Phi-3 reads su and yarn as longrope
        params = hf.get(key)
        if isinstance(params, dict) and (params.get("rope_type") or params.get("type")) in ("su", "yarn"):
            hf = {**hf, key: {**params, "rope_type": "longrope"}}
    return common(hf, model_type="phi3", architecture="decoder", head_dim=hf.get("head_dim"),
                  num_key_value_heads=hf["num_key_value_heads"], layer_norm_eps=hf["rms_norm_eps"],
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.0),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
                  norm="rmsnorm", norm_position="pre", position="rotary",
                  **rope_settings(hf, "phi3", partial=1.0, longrope=True),
                  sliding_window=hf["sliding_window"], type_vocab_size=0, embedding_norm=False,
                  final_norm=True, feed_forward="gated", attention_bias=False, attention_out_bias=False,
                  mlp_bias=False, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf["tie_word_embeddings"])


FAMILY = Family(
    model_types=("phi3",),
    older_numbers=OLDER_NUMBERS,
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("layers.{}.input_layernorm.weight", "decoder.blocks.{}.attn_norm.weight"),
        ("layers.{}.self_attn.qkv_proj.weight", "decoder.blocks.{}.attn.qkv.weight"),
        ("layers.{}.self_attn.o_proj.weight", "decoder.blocks.{}.attn.out.weight"),
        ("layers.{}.post_attention_layernorm.weight", "decoder.blocks.{}.mlp_norm.weight"),
        ("layers.{}.mlp.gate_up_proj.weight", "decoder.blocks.{}.mlp.gate_up.weight"),
        ("layers.{}.mlp.down_proj.weight", "decoder.blocks.{}.mlp.down.weight"),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    defaults={"phi3": {"vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": kv_heads_of, "hidden_act": "silu",
                       "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "sliding_window": None,
                       "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000,
                       "tie_word_embeddings": False}},
)
