"""Falcon (FalconForCausalLM, FalconModel): Falcon-7B, Falcon-40B and their kin.

Rotary positions, a tied LM head, LayerNorms, biases where `bias` says. The block comes in three shapes, as
transformers' FalconDecoderLayer builds it:
- Falcon-7B (`multi_query`, `parallel_attn`): one key/value head, attention and MLP in parallel on one norm;
- `new_decoder_architecture` (Falcon-40B, 180B): `num_kv_heads` key/value heads, always parallel, with two
  norms (`ln_attn`, `ln_mlp`) unless `num_ln_in_parallel_attn` is 1;
- `parallel_attn: false`: a sequential pre-norm block.
The fused `query_key_value` keeps each key/value head's queries, key and value together; the loader regroups
the rows into tfcli's q, k, v order. ALiBi positions (`alibi`, Falcon-RW) are refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, refuse, unsupported, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings
from tfcli.config import ModelConfig

HEADS = {"ForCausalLM": "lm"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "falcon", {"alibi": (None, False)})
    hidden = hf.get("n_embed") or hf["hidden_size"]  # n_embed: the old name, which transformers still reads
    heads = hf["num_attention_heads"]
    new = bool(hf["new_decoder_architecture"])
    parallel = new or bool(hf["parallel_attn"])
    if new and not hf["parallel_attn"]:
        raise unsupported("falcon", "new_decoder_architecture and parallel_attn: false",
                          "transformers cannot run it either")
    norms = hf["num_ln_in_parallel_attn"] or (2 if new else 1)
    if new:
        kv_heads = hf["num_kv_heads"] or heads
    else:
        kv_heads = 1 if hf["multi_query"] else heads
    rope = rope_settings(hf, "falcon")
    bias = bool(hf["bias"])
    return common(hf, model_type="falcon", architecture="decoder", hidden_size=hidden, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=hf["ffn_hidden_size"] or 4 * hidden,
                  layer_norm_eps=hf["layer_norm_epsilon"], hidden_act=hf["activation"],
                  hidden_dropout_prob=hf.get("hidden_dropout", 0.0),
                  attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), norm="layernorm",
                  norm_position="pre", parallel_residual=parallel, shared_block_norm=parallel and norms == 1,
                  position="rotary", **rope, type_vocab_size=0, embedding_norm=False, final_norm=True,
                  feed_forward="mlp", attention_bias=bias, attention_out_bias=bias, mlp_bias=bias,
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"])


def config_rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    """The block's norms, by its shape."""
    block = "decoder.blocks.{}."
    if config.parallel_residual and not config.shared_block_norm:
        return [*weight_bias("h.{}.ln_attn", block + "attn_norm"),
                *weight_bias("h.{}.ln_mlp", block + "mlp_norm")]
    rules = list(weight_bias("h.{}.input_layernorm", block + "attn_norm"))
    if not config.parallel_residual:
        rules += weight_bias("h.{}.post_attention_layernorm", block + "mlp_norm")
    return rules


FAMILY = Family(
    model_types=("falcon",),
    older_numbers=(*OLDER_NUMBERS, "n_embed"),
    translate=translate,
    prefixes=("transformer.",),
    rules=(
        ("word_embeddings.weight", "embed_tokens.weight"),
        *weight_bias("h.{}.self_attention.query_key_value", "decoder.blocks.{}.attn.qkv"),
        *weight_bias("h.{}.self_attention.dense", "decoder.blocks.{}.attn.out"),
        *weight_bias("h.{}.mlp.dense_h_to_4h", "decoder.blocks.{}.mlp.fc1"),
        *weight_bias("h.{}.mlp.dense_4h_to_h", "decoder.blocks.{}.mlp.fc2"),
        *weight_bias("ln_f", "decoder.final_norm"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    config_rules=config_rules,
    grouped_qkv=True,
    defaults={"falcon": {"vocab_size": 65024, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                         "num_kv_heads": None, "num_ln_in_parallel_attn": None, "layer_norm_epsilon": 1e-5,
                         "multi_query": True, "alibi": False, "new_decoder_architecture": False,
                         "parallel_attn": True, "bias": False, "max_position_embeddings": 2048, "activation": "gelu",
                         "ffn_hidden_size": None, "bos_token_id": 11, "eos_token_id": 11, "pad_token_id": None,
                         "tie_word_embeddings": True}},
)
