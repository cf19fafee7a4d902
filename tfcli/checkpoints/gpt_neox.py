"""GPT-NeoX and Pythia (GPTNeoXForCausalLM, GPTNeoXModel).

Pre-norm LayerNorm blocks, parallel by default (`use_parallel_residual`: x + attention(ln1(x)) + mlp(ln2(x)),
two norms), rotary positions on the first quarter of each head (`rotary_pct`, base `rotary_emb_base`; any
RoPE scaling of tfcli/model/rotary.py), biases everywhere but the untied LM head (`embed_out`, named
`lm_head` by transformers 5). The fused `query_key_value` keeps Q, K and V together per head; the loader
regroups its rows into tfcli's q, k, v order.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    bias = bool(hf["attention_bias"])
    rope = rope_settings(hf, "gpt_neox", theta=hf.get("rotary_emb_base", 10000.0), partial=hf.get("rotary_pct", 0.25))
    return common(hf, model_type="gpt_neox", architecture="decoder",
                  hidden_dropout_prob=hf.get("hidden_dropout", 0.0),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
                  norm="layernorm", norm_position="pre", parallel_residual=hf["use_parallel_residual"],
                  position="rotary", **rope, type_vocab_size=0, embedding_norm=False, final_norm=True,
                  feed_forward="mlp", attention_bias=bias, attention_out_bias=bias, mlp_bias=True,
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"])


FAMILY = Family(
    model_types=("gpt_neox",),
    older_numbers=(*OLDER_NUMBERS, "rotary_emb_base", "rotary_pct"),
    translate=translate,
    prefixes=("gpt_neox.",),
    rules=(
        ("embed_in.weight", "embed_tokens.weight"),
        *weight_bias("layers.{}.input_layernorm", "decoder.blocks.{}.attn_norm"),
        *weight_bias("layers.{}.post_attention_layernorm", "decoder.blocks.{}.mlp_norm"),
        *weight_bias("layers.{}.attention.query_key_value", "decoder.blocks.{}.attn.qkv"),
        *weight_bias("layers.{}.attention.dense", "decoder.blocks.{}.attn.out"),
        ("layers.{}.attention.bias", None),  # causal-mask and rotary buffers of older checkpoints
        ("layers.{}.attention.masked_bias", None),
        ("layers.{}.attention.rotary_emb.inv_freq", None),
        *weight_bias("layers.{}.mlp.dense_h_to_4h", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("layers.{}.mlp.dense_4h_to_h", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("final_layer_norm", "decoder.final_norm"),
        ("embed_out.weight", "head.unembed.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    grouped_qkv=True,
    defaults={"gpt_neox": {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44,
                           "num_attention_heads": 64, "intermediate_size": 24576, "hidden_act": "gelu",
                           "max_position_embeddings": 2048, "layer_norm_eps": 1e-5, "use_parallel_residual": True,
                           "attention_bias": True, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": None,
                           "tie_word_embeddings": False}},
)
