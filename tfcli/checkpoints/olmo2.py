"""OLMo 2 (Olmo2ForCausalLM, Olmo2Model).

Llama's parts in another order: no norm before a sublayer, an RMSNorm on each sublayer's output inside the
residual (`x + norm(f(x))`: `post_attention_layernorm`, `post_feedforward_layernorm`), and an RMSNorm over the
whole query projection and the whole key projection (`q_norm`, `k_norm`, before the heads are split and
rotated). Any RoPE scaling of tfcli/model/rotary.py; `partial_rotary_factor`, which its rotary ignores, is
refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, kv_heads_of, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    rope = rope_settings(hf, "olmo2")
    bias = bool(hf["attention_bias"])
    return common(hf, model_type="olmo2", architecture="decoder", head_dim=hf.get("head_dim"),
                  num_key_value_heads=hf["num_key_value_heads"], layer_norm_eps=hf["rms_norm_eps"],
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), hidden_dropout_prob=0.0,
                  norm="rmsnorm", norm_position="sublayer_output", qk_norm="projection", position="rotary", **rope,
                  type_vocab_size=0, embedding_norm=False, final_norm=True, feed_forward="gated",
                  attention_bias=bias, attention_out_bias=bias, mlp_bias=False, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf["tie_word_embeddings"])


FAMILY = Family(
    model_types=("olmo2",),
    older_numbers=OLDER_NUMBERS,
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attn.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attn.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attn.v"),
        *weight_bias("layers.{}.self_attn.o_proj", "decoder.blocks.{}.attn.out"),
        ("layers.{}.self_attn.q_norm.weight", "decoder.blocks.{}.attn.q_norm.weight"),
        ("layers.{}.self_attn.k_norm.weight", "decoder.blocks.{}.attn.k_norm.weight"),
        ("layers.{}.post_attention_layernorm.weight", "decoder.blocks.{}.attn_output_norm.weight"),
        ("layers.{}.mlp.gate_proj.weight", "decoder.blocks.{}.mlp.gate.weight"),
        ("layers.{}.mlp.up_proj.weight", "decoder.blocks.{}.mlp.up.weight"),
        ("layers.{}.mlp.down_proj.weight", "decoder.blocks.{}.mlp.down.weight"),
        ("layers.{}.post_feedforward_layernorm.weight", "decoder.blocks.{}.mlp_output_norm.weight"),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    defaults={"olmo2": {"vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                        "num_attention_heads": 32, "num_key_value_heads": kv_heads_of, "hidden_act": "silu",
                        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "attention_bias": False,
                        "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1,
                        "tie_word_embeddings": False}},
)
