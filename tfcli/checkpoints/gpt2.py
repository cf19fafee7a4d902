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
    hidden = hf["n_embd"]
    return common(hf, model_type="gpt2", architecture="decoder", hidden_size=hidden,
                  num_hidden_layers=hf["n_layer"], num_attention_heads=hf["n_head"],
                  intermediate_size=hf["n_inner"] or 4 * hidden, max_position_embeddings=hf["n_positions"],
                  layer_norm_eps=hf["layer_norm_epsilon"], hidden_act=hf["activation_function"],
                  query_pre_attn_scalar=None if hf["scale_attn_weights"] else 1.0,  # unscaled: * 1
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.1),
                  attention_probs_dropout_prob=hf.get("attn_pdrop", 0.1),
                  norm="layernorm", norm_position="pre", position="learned", type_vocab_size=0,
                  embedding_norm=False, final_norm=True, feed_forward="mlp",
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"])


FAMILY = Family(
    model_types=("gpt2",),
    translate=translate,
    prefixes=("transformer.",),
    rules=(
        ("wte.weight", "embed_tokens.weight"),
        ("wpe.weight", "decoder.embeddings.positions.weight"),
        *weight_bias("h.{}.ln_1", "decoder.blocks.{}.attn_norm"),
        *weight_bias("h.{}.attn.c_attn", "decoder.blocks.{}.attn.qkv"),
        *weight_bias("h.{}.attn.c_proj", "decoder.blocks.{}.attn.out"),
        ("h.{}.attn.bias", None),  # causal-mask buffers of old checkpoints
        ("h.{}.attn.masked_bias", None),
        *weight_bias("h.{}.ln_2", "decoder.blocks.{}.mlp_norm"),
        *weight_bias("h.{}.mlp.c_fc", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("h.{}.mlp.c_proj", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("ln_f", "decoder.final_norm"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    transposed=("decoder.blocks.{}.attn.qkv.weight", "decoder.blocks.{}.attn.out.weight",
                "decoder.blocks.{}.mlp.fc1.weight", "decoder.blocks.{}.mlp.fc2.weight"),
    defaults={"gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
                       "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                       "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                       "add_cross_attention": False, "bos_token_id": 50256, "eos_token_id": 50256,
                       "pad_token_id": None, "tie_word_embeddings": True}},
)
