"""OPT (OPTForCausalLM, OPTModel): facebook/opt-125m and the larger ones.

Learned positions with an offset of 2 (the table has max_position_embeddings + 2 rows), LayerNorm blocks,
pre-norm with a final LayerNorm (`do_layer_norm_before`, all sizes but 350m) or post-norm without one, ReLU
MLP, biases where `enable_bias` says, a tied LM head. opt-350m's token embeddings are narrower than the
model (`word_embed_proj_dim`): projected in before the positions (`project_in`) and back after the last block
(`project_out`). Norms without weights (`layer_norm_elementwise_affine: false`) are refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, refuse, weight_bias

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    hidden = hf.get("hidden_size", 768)
    refuse(hf, "opt", {"layer_norm_elementwise_affine": True})
    width = hf.get("word_embed_proj_dim")
    pre_norm = hf.get("do_layer_norm_before", True)
    bias = bool(hf.get("enable_bias", True))
    return common(hf, model_type="opt", architecture="decoder", hidden_size=hidden,
                  intermediate_size=hf.get("ffn_dim", 3072),
                  max_position_embeddings=hf.get("max_position_embeddings", 2048), layer_norm_eps=1e-5,
                  hidden_act=hf.get("activation_function", "relu"), hidden_dropout_prob=hf.get("dropout", 0.1),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), norm="layernorm",
                  norm_position="pre" if pre_norm else "post", position="learned", position_offset=2,
                  type_vocab_size=0, embedding_norm=False, word_embed_proj_dim=width if width != hidden else None,
                  final_norm=pre_norm and not hf.get("_remove_final_layer_norm", False), feed_forward="mlp",
                  attention_bias=bias, attention_out_bias=bias, mlp_bias=bias, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf.get("tie_word_embeddings", True))


FAMILY = Family(
    model_types=("opt",),
    translate=translate,
    prefixes=("model.decoder.", "decoder."),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("embed_positions.weight", "decoder.embeddings.positions.weight"),
        *weight_bias("layers.{}.self_attn_layer_norm", "decoder.blocks.{}.attention_norm"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attention.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attention.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attention.v"),
        *weight_bias("layers.{}.self_attn.out_proj", "decoder.blocks.{}.attention.out"),
        *weight_bias("layers.{}.final_layer_norm", "decoder.blocks.{}.feed_forward_norm"),
        *weight_bias("layers.{}.fc1", "decoder.blocks.{}.feed_forward.fc1"),
        *weight_bias("layers.{}.fc2", "decoder.blocks.{}.feed_forward.fc2"),
        *weight_bias("final_layer_norm", "decoder.final_norm"),
        ("project_in.weight", "decoder.project_in.weight"),
        ("project_out.weight", "decoder.project_out.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
)
