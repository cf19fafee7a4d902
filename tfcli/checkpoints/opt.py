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
    hidden = hf["hidden_size"]
    refuse(hf, "opt", {"layer_norm_elementwise_affine": True})
    width = hf["word_embed_proj_dim"]
    pre_norm = hf["do_layer_norm_before"]
    bias = bool(hf["enable_bias"])
    return common(hf, model_type="opt", architecture="decoder", hidden_size=hidden,
                  intermediate_size=hf["ffn_dim"], layer_norm_eps=1e-5,
                  hidden_act=hf["activation_function"], hidden_dropout_prob=hf.get("dropout", 0.1),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), norm="layernorm",
                  norm_position="pre" if pre_norm else "post", position="learned", position_offset=2,
                  type_vocab_size=0, embedding_norm=False, word_embed_proj_dim=width if width != hidden else None,
                  final_norm=pre_norm and not hf["_remove_final_layer_norm"], feed_forward="mlp",
                  attention_bias=bias, attention_out_bias=bias, mlp_bias=bias, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf["tie_word_embeddings"])


FAMILY = Family(
    model_types=("opt",),
    translate=translate,
    prefixes=("model.decoder.", "decoder."),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("embed_positions.weight", "decoder.embeddings.positions.weight"),
        *weight_bias("layers.{}.self_attn_layer_norm", "decoder.blocks.{}.attn_norm"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attn.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attn.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attn.v"),
        *weight_bias("layers.{}.self_attn.out_proj", "decoder.blocks.{}.attn.out"),
        *weight_bias("layers.{}.final_layer_norm", "decoder.blocks.{}.mlp_norm"),
        *weight_bias("layers.{}.fc1", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("layers.{}.fc2", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("final_layer_norm", "decoder.final_norm"),
        ("project_in.weight", "decoder.project_in.weight"),
        ("project_out.weight", "decoder.project_out.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    defaults={"opt": {"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
                      "max_position_embeddings": 2048, "do_layer_norm_before": True,
                      "_remove_final_layer_norm": False, "word_embed_proj_dim": None, "num_attention_heads": 12,
                      "activation_function": "relu", "layer_norm_elementwise_affine": True, "enable_bias": True,
                      "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "tie_word_embeddings": True}},
)
