"""OLMo 2 (Olmo2ForCausalLM, Olmo2Model).

Llama's parts in another order: no norm before a sublayer, an RMSNorm on each sublayer's output inside the
residual (`x + norm(f(x))`: `post_attention_layernorm`, `post_feedforward_layernorm`), and an RMSNorm over the
whole query projection and the whole key projection (`q_norm`, `k_norm`, before the heads are split and
rotated). Any RoPE scaling of tfcli/model/rotary.py; `partial_rotary_factor`, which its rotary ignores, is
refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, weight_bias
from tfcli.checkpoints.rope import rope_settings

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    rope = rope_settings(hf, "olmo2")
    bias = bool(hf.get("attention_bias", False))
    return common(hf, model_type="olmo2", architecture="decoder", hidden_size=hf.get("hidden_size", 4096),
                  num_attention_heads=hf.get("num_attention_heads", 32), head_dim=hf.get("head_dim"),
                  num_key_value_heads=hf.get("num_key_value_heads"),
                  max_position_embeddings=hf.get("max_position_embeddings", 2048),
                  layer_norm_eps=hf.get("rms_norm_eps", 1e-5), hidden_act=hf.get("hidden_act", "silu"),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), hidden_dropout_prob=0.0,
                  norm="rmsnorm", norm_position="sublayer_output", qk_norm="projection", position="rotary", **rope,
                  type_vocab_size=0, embedding_norm=False, final_norm=True, feed_forward="gated",
                  attention_bias=bias, attention_out_bias=bias, mlp_bias=False, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf.get("tie_word_embeddings", False))


FAMILY = Family(
    model_types=("olmo2",),
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attention.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attention.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attention.v"),
        *weight_bias("layers.{}.self_attn.o_proj", "decoder.blocks.{}.attention.out"),
        ("layers.{}.self_attn.q_norm.weight", "decoder.blocks.{}.attention.q_norm.weight"),
        ("layers.{}.self_attn.k_norm.weight", "decoder.blocks.{}.attention.k_norm.weight"),
        ("layers.{}.post_attention_layernorm.weight", "decoder.blocks.{}.attention_output_norm.weight"),
        ("layers.{}.mlp.gate_proj.weight", "decoder.blocks.{}.feed_forward.gate.weight"),
        ("layers.{}.mlp.up_proj.weight", "decoder.blocks.{}.feed_forward.up.weight"),
        ("layers.{}.mlp.down_proj.weight", "decoder.blocks.{}.feed_forward.down.weight"),
        ("layers.{}.post_feedforward_layernorm.weight", "decoder.blocks.{}.feed_forward_output_norm.weight"),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
)
