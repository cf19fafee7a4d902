"""GPT-J (GPTJForCausalLM, GPTJModel).

A parallel block with one LayerNorm (x + attention(ln(x)) + mlp(ln(x))), rotary positions on the first
`rotary_dim` dimensions of each head turning adjacent pairs (rotate-every-two, base 10,000), Q, K, V and
output projections without biases, an MLP and an untied LM head with them.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, unsupported, weight_bias

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    hidden, heads = hf["n_embd"], hf["n_head"]
    head_dim = hidden // heads
    rotary_dim = hf["rotary_dim"] or head_dim  # null: whole heads
    partial = rotary_dim / head_dim
    if int(head_dim * partial) != rotary_dim or rotary_dim > head_dim:
        raise unsupported("gptj", f"rotary_dim {rotary_dim} (head size {head_dim})",
                          "rotary_dim must be at most the head size")
    return common(hf, model_type="gptj", architecture="decoder", hidden_size=hidden, num_attention_heads=heads,
                  num_hidden_layers=hf["n_layer"], intermediate_size=hf["n_inner"] or 4 * hidden,
                  max_position_embeddings=hf["n_positions"], layer_norm_eps=hf["layer_norm_epsilon"],
                  hidden_act=hf["activation_function"],
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.0),
                  attention_probs_dropout_prob=hf.get("attn_pdrop", 0.0),
                  norm="layernorm", norm_position="pre", parallel_residual=True, shared_block_norm=True,
                  position="rotary", partial_rotary_factor=partial, rotary_interleaved=True, rope_theta=10000.0,
                  type_vocab_size=0, embedding_norm=False, final_norm=True, feed_forward="mlp",
                  attention_bias=False, attention_out_bias=False, mlp_bias=True, head=architecture_head(hf, HEADS),
                  tie_word_embeddings=hf["tie_word_embeddings"], lm_head_bias=True)


FAMILY = Family(
    model_types=("gptj",),
    translate=translate,
    prefixes=("transformer.",),
    rules=(
        ("wte.weight", "embed_tokens.weight"),
        *weight_bias("h.{}.ln_1", "decoder.blocks.{}.attn_norm"),
        ("h.{}.attn.q_proj.weight", "decoder.blocks.{}.attn.q.weight"),
        ("h.{}.attn.k_proj.weight", "decoder.blocks.{}.attn.k.weight"),
        ("h.{}.attn.v_proj.weight", "decoder.blocks.{}.attn.v.weight"),
        ("h.{}.attn.out_proj.weight", "decoder.blocks.{}.attn.out.weight"),
        ("h.{}.attn.bias", None),  # causal-mask buffers of older checkpoints
        ("h.{}.attn.masked_bias", None),
        *weight_bias("h.{}.mlp.fc_in", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("h.{}.mlp.fc_out", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("ln_f", "decoder.final_norm"),
        ("lm_head.weight", "head.unembed.weight"),
        ("lm_head.bias", "head.bias"),
    ),
    defaults={"gptj": {"vocab_size": 50400, "n_positions": 2048, "n_embd": 4096, "n_layer": 28, "n_head": 16,
                       "rotary_dim": 64, "n_inner": None, "activation_function": "gelu_new",
                       "layer_norm_epsilon": 1e-5, "bos_token_id": 50256, "eos_token_id": 50256,
                       "pad_token_id": None, "tie_word_embeddings": False}},
)
