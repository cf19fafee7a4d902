"""T5, T5 v1.1, Flan-T5 and mT5 (T5Model, T5ForConditionalGeneration, T5EncoderModel and the MT5 ones).

A pre-norm encoder-decoder without biases: T5's "layer norm" is an RMSNorm (no mean, no bias); there
are no absolute positions, only a bucketed relative position bias that each stack's first block holds
and every block of the stack adds to its scores (bidirectional in the encoder, causal in the decoder);
scores are not scaled by 1/sqrt(head size); the feed-forward is ReLU (`wi`, `wo`) or gated (`wi_0`,
`wi_1`, `wo`: gelu_new for "gated-gelu"); each stack ends with a norm. `d_kv` sets the head size (Flan-T5
small: 6 heads of 64 in a 512-wide model). The LM head is the shared embedding unless config.json says
`tie_word_embeddings: false` (T5 v1.1, Flan-T5, mT5 store their own `lm_head`); as in transformers, T5's
decoder output (not mT5's) is scaled by d_model**-0.5 before the head when config.json ties it (or when it
says `scale_decoder_outputs: true`, as transformers 5 writes it).

transformers 5 re-saves an untied checkpoint with `tie_word_embeddings: true` and both tensors; tfcli
then refuses (the stored `lm_head` differs from `shared`): set `tie_word_embeddings: false` in its config.json.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse
from tfcli.config import ModelConfig

HEADS = {"ForConditionalGeneration": "lm"}
T5_DEFAULTS = {  # transformers' T5Config; MT5Config's differ where they say
    "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
    "num_decoder_layers": lambda hf: hf["num_layers"], "num_heads": 8,
    "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu", "is_decoder": False, "pad_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": True,
}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    family = "mT5" if hf.get("model_type") == "mt5" else "T5"
    refuse(hf, family, {"is_decoder": False})
    projection = str(hf["feed_forward_proj"])
    gated = projection.startswith("gated-")
    act = "gelu_new" if projection == "gated-gelu" else projection.split("-")[-1]
    tied = hf["tie_word_embeddings"] is not False
    pad = hf["pad_token_id"]
    encoder_only = any(str(name).endswith("T5EncoderModel") for name in hf.get("architectures") or [])
    return common(hf, model_type=hf["model_type"], architecture="encoder" if encoder_only else "encoder-decoder",
                  hidden_size=hf["d_model"], num_hidden_layers=hf["num_layers"],
                  num_decoder_layers=hf["num_decoder_layers"], num_attention_heads=hf["num_heads"],
                  head_dim=hf["d_kv"], intermediate_size=hf["d_ff"], hidden_act=act,
                  max_position_embeddings=hf.get("n_positions", 512), layer_norm_eps=hf["layer_norm_epsilon"],
                  hidden_dropout_prob=hf.get("dropout_rate", 0.1),
                  attention_probs_dropout_prob=hf.get("dropout_rate", 0.1), norm="rmsnorm", norm_position="pre",
                  position="none", type_vocab_size=0, embedding_norm=False, final_norm=True,
                  relative_attention_num_buckets=hf["relative_attention_num_buckets"],
                  relative_attention_max_distance=hf["relative_attention_max_distance"],
                  query_pre_attn_scalar=1.0,  # scores are q k^T, unscaled
                  feed_forward="gated" if gated else "mlp", attention_bias=False, attention_out_bias=False,
                  mlp_bias=False, head=architecture_head(hf, HEADS), tie_word_embeddings=tied,
                  scale_decoder_outputs=family == "T5" and bool(hf.get("scale_decoder_outputs", tied)),
                  decoder_start_token_id=hf.get("decoder_start_token_id", pad))


def stack_rules(stack: str, cross: bool) -> tuple[Rule, ...]:
    """One stack's rules: T5 numbers a block's sublayers (self-attention, [cross-attention,] feed-forward)."""
    layer, block = f"{stack}.block.{{}}.layer", f"{stack}.blocks.{{}}"
    ff = 2 if cross else 1
    rules = [
        (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", f"{stack}.position_bias.table.weight"),
        *((f"{layer}.0.SelfAttention.{p}.weight", f"{block}.attn.{q}.weight")
          for p, q in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"))),
        (f"{layer}.0.layer_norm.weight", f"{block}.attn_norm.weight"),
        (f"{layer}.{ff}.DenseReluDense.wi.weight", f"{block}.mlp.fc1.weight"),
        (f"{layer}.{ff}.DenseReluDense.wi_0.weight", f"{block}.mlp.gate.weight"),
        (f"{layer}.{ff}.DenseReluDense.wi_1.weight", f"{block}.mlp.up.weight"),
        (f"{layer}.{ff}.layer_norm.weight", f"{block}.mlp_norm.weight"),
        (f"{stack}.final_layer_norm.weight", f"{stack}.final_norm.weight"),
        (f"{stack}.embed_tokens.weight", "embed_tokens.weight"),  # copies of `shared`
    ]
    if cross:
        rules += [*((f"{layer}.1.EncDecAttention.{p}.weight", f"{block}.cross_attn.{q}.weight")
                    for p, q in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "out"))),
                  (f"{layer}.1.layer_norm.weight", f"{block}.cross_attn_norm.weight")]
    return tuple(rules)


def output_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """`wo` is the gated feed-forward's `down` or the plain one's `fc2`."""
    out = "down" if config.feed_forward == "gated" else "fc2"
    return tuple((f"{stack}.block.{{}}.layer.{ff}.DenseReluDense.wo.weight", f"{stack}.blocks.{{}}.mlp.{out}.weight")
                 for stack, ff in (("encoder", 1), ("decoder", 2)))


FAMILY = Family(
    model_types=("t5", "mt5"),
    older_numbers=("n_positions",),
    translate=translate,
    rules=(
        ("shared.weight", "embed_tokens.weight"),
        *stack_rules("encoder", cross=False),
        *stack_rules("decoder", cross=True),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    config_rules=output_rules,
    defaults={
        "t5": T5_DEFAULTS,
        "mt5": {**T5_DEFAULTS, "vocab_size": 250112, "d_ff": 1024, "num_layers": 8, "num_heads": 6,
                "feed_forward_proj": "gated-gelu", "decoder_start_token_id": 0},
    },
)
