"""Phi-1, Phi-1.5 and Phi-2 (PhiForCausalLM, PhiModel).

A parallel block: attention and the MLP both read one LayerNorm of x and are added to it together; rotary
positions on the first half of each head (`partial_rotary_factor` 0.5, any RoPE scaling of
tfcli/model/rotary.py); biases everywhere, the LM head's included; an optional LayerNorm over each head of Q
and K (`qk_layernorm`); a final LayerNorm.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, kv_heads_of, unsupported, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings
from tfcli.config import ModelConfig

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hidden // heads
    if hf["qk_layernorm"] and head_dim != hidden // heads:  # transformers sizes those norms hidden / heads
        raise unsupported("phi", f"qk_layernorm and head_dim {head_dim} != hidden_size / num_attention_heads",
                          "transformers cannot run it either")
    return common(hf, model_type="phi", architecture="decoder", hidden_size=hidden, num_attention_heads=heads,
                  head_dim=head_dim, num_key_value_heads=hf["num_key_value_heads"],
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.0),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
                  norm="layernorm", norm_position="pre", parallel_residual=True, shared_block_norm=True,
                  position="rotary", **rope_settings(hf, "phi", partial=0.5),
                  qk_norm="head" if hf["qk_layernorm"] else "none", type_vocab_size=0, embedding_norm=False,
                  final_norm=True, feed_forward="mlp", attention_bias=True, attention_out_bias=True, mlp_bias=True,
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"],
                  lm_head_bias=True)


def config_rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    if config.qk_norm == "none":
        return []
    return [*weight_bias("layers.{}.self_attn.q_layernorm", "decoder.blocks.{}.attn.q_norm"),
            *weight_bias("layers.{}.self_attn.k_layernorm", "decoder.blocks.{}.attn.k_norm")]


FAMILY = Family(
    model_types=("phi",),
    older_numbers=OLDER_NUMBERS,
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        *weight_bias("layers.{}.input_layernorm", "decoder.blocks.{}.attn_norm"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attn.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attn.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attn.v"),
        *weight_bias("layers.{}.self_attn.dense", "decoder.blocks.{}.attn.out"),
        *weight_bias("layers.{}.mlp.fc1", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("layers.{}.mlp.fc2", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("final_layernorm", "decoder.final_norm"),
        ("lm_head.weight", "head.unembed.weight"),
        ("lm_head.bias", "head.bias"),
    ),
    config_rules=config_rules,
    defaults={"phi": {"vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                      "num_attention_heads": 32, "num_key_value_heads": kv_heads_of, "hidden_act": "gelu_new",
                      "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "qk_layernorm": False,
                      "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "tie_word_embeddings": False}},
)
