"""BART (BartModel, BartForConditionalGeneration), and the layout mBART and Marian share with it.

A post-norm encoder-decoder; token embeddings optionally scaled by sqrt(d_model); learned positions
start at row 2 (`position_offset`); each stack normalises its embeddings (`layernorm_embedding`); the
LM head adds `final_logits_bias`. With `tie_word_embeddings` (the default) one token embedding serves
both stacks and the head: the checkpoint's `shared` and its stacks' `embed_tokens` are that one tensor,
stored up to three times, and the loader checks the copies are equal. Without it (transformers 5 keeps
them apart) each stack reads its own `embed_tokens`, the head its own `lm_head`, and `shared` is used
by no forward pass.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse, unsupported, weight_bias
from tfcli.config import ModelConfig

HEADS = {"ForConditionalGeneration": "lm", "MTModel": "lm"}
SEQ2SEQ_DEFAULTS = {  # transformers' BartConfig; mBART's and Marian's differ where they say
    "vocab_size": 50265, "max_position_embeddings": 1024, "encoder_layers": 12, "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16, "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "d_model": 1024, "scale_embedding": False, "is_decoder": False,
    "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2, "forced_eos_token_id": 2,
    "tie_word_embeddings": True,
}


def translate_seq2seq(hf: dict[str, Any], family: str, **overrides: Any) -> dict[str, Any]:
    """The config fields BART, mBART and Marian share; `overrides` set what differs (norms, positions)."""
    refuse(hf, family, {"is_decoder": False})
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf[a] != hf[b]:
            raise unsupported(family, f"{a} != {b}",
                              "tfcli's encoder and decoder share one head count and feed-forward size")
    head = architecture_head(hf, HEADS)
    base = dict(architecture="encoder-decoder", hidden_size=hf["d_model"], num_hidden_layers=hf["encoder_layers"],
                num_decoder_layers=hf["decoder_layers"], num_attention_heads=hf["encoder_attention_heads"],
                intermediate_size=hf["encoder_ffn_dim"], hidden_act=hf["activation_function"], layer_norm_eps=1e-5,
                hidden_dropout_prob=hf.get("dropout", 0.1),
                attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
                norm="layernorm", type_vocab_size=0, scale_embedding=bool(hf["scale_embedding"]),
                feed_forward="mlp", head=head, lm_head_bias=head == "lm",
                decoder_start_token_id=hf["decoder_start_token_id"])
    values = common(hf, **{**base, **overrides})
    values.pop("labels", None), values.pop("num_labels", None)  # the default id2label: no head uses it
    return values


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    # fairseq's pre-norm flags: transformers 5 ignores them, so such a checkpoint would compute another model
    refuse(hf, "BART", {"normalize_before": (False, None), "add_final_layer_norm": (False, None)})
    return translate_seq2seq(hf, "BART", model_type="bart", norm_position="post", position="learned",
                             position_offset=2, embedding_norm=True, final_norm=False,
                             share_encoder_decoder_embeddings=hf["tie_word_embeddings"])


def stack_rules(stack: str) -> tuple[Rule, ...]:
    """The rules of one stack's blocks, `encoder` or `decoder` (HF names both alike)."""
    layer, block = stack + ".layers.{}", stack + ".blocks.{}"
    return (
        *weight_bias(f"{layer}.self_attn.q_proj", f"{block}.attn.q"),
        *weight_bias(f"{layer}.self_attn.k_proj", f"{block}.attn.k"),
        *weight_bias(f"{layer}.self_attn.v_proj", f"{block}.attn.v"),
        *weight_bias(f"{layer}.self_attn.out_proj", f"{block}.attn.out"),
        *weight_bias(f"{layer}.self_attn_layer_norm", f"{block}.attn_norm"),
        *weight_bias(f"{layer}.encoder_attn.q_proj", f"{block}.cross_attn.q"),
        *weight_bias(f"{layer}.encoder_attn.k_proj", f"{block}.cross_attn.k"),
        *weight_bias(f"{layer}.encoder_attn.v_proj", f"{block}.cross_attn.v"),
        *weight_bias(f"{layer}.encoder_attn.out_proj", f"{block}.cross_attn.out"),
        *weight_bias(f"{layer}.encoder_attn_layer_norm", f"{block}.cross_attn_norm"),
        *weight_bias(f"{layer}.fc1", f"{block}.mlp.fc1"),
        *weight_bias(f"{layer}.fc2", f"{block}.mlp.fc2"),
        *weight_bias(f"{layer}.final_layer_norm", f"{block}.mlp_norm"),
    )


def embedding_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """Token embeddings and the LM head's bias, which depend on the config: shared or each stack's own;
    final_logits_bias is the LM head's bias, and without that head it is not used."""
    shared = config.share_encoder_decoder_embeddings
    return (
        ("shared.weight", "embed_tokens.weight" if shared else None),
        ("encoder.embed_tokens.weight", "embed_tokens.weight"),
        ("decoder.embed_tokens.weight", "embed_tokens.weight" if shared else "decoder_embed_tokens.weight"),
        ("final_logits_bias", "head.bias" if config.head == "lm" else None),
    )


RULES = (
    *(rule for stack in ("encoder", "decoder") for rule in (
        (f"{stack}.embed_positions.weight", f"{stack}.embeddings.positions.weight"),
        *weight_bias(f"{stack}.layernorm_embedding", f"{stack}.embeddings.norm"),
        *stack_rules(stack))),
    ("lm_head.weight", "head.unembed.weight"),
)

FAMILY = Family(
    model_types=("bart",),
    translate=translate,
    prefixes=("model.",),
    rules=RULES,
    config_rules=embedding_rules,
    flattened=("head.bias",),  # final_logits_bias is stored as (1, V)
    defaults={"bart": SEQ2SEQ_DEFAULTS},
)
