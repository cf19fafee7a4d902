"""GPT-2 (GPT2Model, GPT2LMHeadModel).

A pre-norm decoder with learned positions and a final LayerNorm; the LM head is tied to the token
embeddings. Its linear layers are Conv1D modules that store weights as (in, out), so they are
transposed; `c_attn` already holds Q, K and V side by side, the layout of our fused `qkv`.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, refuse, weight_bias

HEADS = {"LMHeadModel": "lm", "ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "GPT-2", {"scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False})
    hidden = hf.get("n_embd", 768)
    return common(hf, model_type="gpt2", architecture="decoder", hidden_size=hidden,
                  num_hidden_layers=hf.get("n_layer", 12), num_attention_heads=hf.get("n_head", 12),
                  intermediate_size=hf.get("n_inner") or 4 * hidden,
                  max_position_embeddings=hf.get("n_positions", 1024),
                  layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                  hidden_act=hf.get("activation_function", "gelu_new"),
                  query_pre_attn_scalar=None if hf.get("scale_attn_weights", True) else 1.0,  # unscaled: * 1
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.1),
                  attention_probs_dropout_prob=hf.get("attn_pdrop", 0.1),
                  norm="layernorm", norm_position="pre", position="learned", type_vocab_size=0,
                  embedding_norm=False, final_norm=True, feed_forward="mlp",
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf.get("tie_word_embeddings", True))


FAMILY = Family(
    model_types=("gpt2",),
    translate=translate,
    prefixes=("transformer.",),
    rules=(
        ("wte.weight", "embed_tokens.weight"),
        ("wpe.weight", "decoder.embeddings.positions.weight"),
        *weight_bias("h.{}.ln_1", "decoder.blocks.{}.attention_norm"),
        *weight_bias("h.{}.attn.c_attn", "decoder.blocks.{}.attention.qkv"),
        *weight_bias("h.{}.attn.c_proj", "decoder.blocks.{}.attention.out"),
        ("h.{}.attn.bias", None),  # causal-mask buffers of old checkpoints
        ("h.{}.attn.masked_bias", None),
        *weight_bias("h.{}.ln_2", "decoder.blocks.{}.feed_forward_norm"),
        *weight_bias("h.{}.mlp.c_fc", "decoder.blocks.{}.feed_forward.fc1"),
        *weight_bias("h.{}.mlp.c_proj", "decoder.blocks.{}.feed_forward.fc2"),
        *weight_bias("ln_f", "decoder.final_norm"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    transposed=("decoder.blocks.{}.attention.qkv.weight", "decoder.blocks.{}.attention.out.weight",
                "decoder.blocks.{}.feed_forward.fc1.weight", "decoder.blocks.{}.feed_forward.fc2.weight"),
)
