"""DeBERTa-v2 and v3 (DebertaV2Model, DebertaV2ForMaskedLM, DebertaV2ForSequenceClassification;
microsoft/deberta-v3-base and its NLI fine-tunes).

A post-norm BERT-like encoder whose attention is disentangled (model/disentangled.py): relative position
embeddings (`encoder.rel_embeddings`, normalised by `encoder.LayerNorm` when `norm_rel_ebd` says
layer_norm) add content-to-position and position-to-content terms, relative distances bucketed
logarithmically (`position_buckets`), the position projections shared with the attention's (v3:
`share_att_key`) or their own (`pos_key_proj`, `pos_query_proj`); scores scaled by 1 / sqrt(head size x (1 +
number of terms)). v3 adds no absolute positions (`position_biased_input: false`) and no segments. The
classifier reads the first token through `pooler.dense` and `pooler_hidden_act` (GELU); the MLM head is
`cls.predictions` (`legacy`, transformers' default) or `lm_predictions.lm_head` (tied to the token embeddings):
tfcli reads whichever the checkpoint holds, where transformers 5 with `legacy: true` would draw a new
`cls.predictions` head at random beside a stored `lm_predictions` one (set `legacy: false` to compare). A
checkpoint without `architectures` (microsoft/deberta-v3-base) loads as the bare model; its pretraining heads
are then used by nothing, in tfcli or transformers.

Refused: the convolution of v2-xlarge (`conv_kernel_size`), embeddings of another width than the hidden size,
a pooler of another size.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bert import mlm_rules
from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse, unsupported, weight_bias
from tfcli.config import ModelConfig

HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    refuse(hf, "DeBERTa-v2", {"conv_kernel_size": (0, None), "embedding_size": (hidden, None),
                              "pooler_hidden_size": (hidden, None), "attention_head_size": (hidden // heads, None)})
    terms = hf["pos_att_type"] or []
    if isinstance(terms, str):
        terms = [term.strip() for term in terms.lower().split("|")]
    unknown = [term for term in terms if term not in ("c2p", "p2c")]
    if unknown:
        raise unsupported("DeBERTa-v2", f"`pos_att_type` {unknown}", "tfcli implements the c2p and p2c terms")
    positions = hf["max_position_embeddings"]
    max_relative = hf["max_relative_positions"]
    head = architecture_head(hf, HEADS)
    return common(hf, model_type="deberta-v2", architecture="encoder", type_vocab_size=hf["type_vocab_size"],
                  position="learned" if hf["position_biased_input"] else "none",
                  norm_position="post", embedding_norm=True, relative_attention=bool(hf["relative_attention"]),
                  pos_att_type=terms, position_buckets=max(hf.get("position_buckets", -1), 0),
                  max_relative_positions=max_relative if max_relative >= 1 else positions,
                  share_att_key=bool(hf.get("share_att_key", False)),
                  norm_rel_ebd="layer_norm" in str(hf.get("norm_rel_ebd", "none")).lower(),
                  query_pre_attn_scalar=float(hidden // heads * (1 + len(terms))),
                  head=head, lm_head_bias=True, tie_word_embeddings=hf["tie_word_embeddings"] or not hf["legacy"],
                  classifier_pooler=hf["pooler_hidden_act"])


def config_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """The MLM head of either layout, whichever the checkpoint holds (see bert.mlm_rules for the legacy one's
    two biases), used only by a model with that head; the pooler, which feeds the classifier and nothing else."""
    mlm = config.head == "mlm"
    return (*(rule if mlm else (rule[0], None) for rule in mlm_rules("cls.predictions", config)),
            *weight_bias("lm_predictions.lm_head.dense", "head.dense" if mlm else None),
            *weight_bias("lm_predictions.lm_head.LayerNorm", "head.norm" if mlm else None),
            ("lm_predictions.lm_head.bias", "head.bias" if mlm else None),
            *weight_bias("pooler.dense", "head.dense" if config.head == "classifier" else None))


LAYER, BLOCK = "encoder.layer.{}", "encoder.blocks.{}"
FAMILY = Family(
    model_types=("deberta-v2",),
    older_numbers=("position_buckets",),
    translate=translate,
    prefixes=("deberta.",),
    rules=(
        ("embeddings.word_embeddings.weight", "embed_tokens.weight"),
        ("embeddings.position_embeddings.weight", "encoder.embeddings.positions.weight"),
        ("embeddings.token_type_embeddings.weight", "encoder.embeddings.segments.weight"),
        *weight_bias("embeddings.LayerNorm", "encoder.embeddings.norm"),
        ("embeddings.position_ids", None),
        ("encoder.rel_embeddings.weight", "encoder.relative_embeddings.table.weight"),
        *weight_bias("encoder.LayerNorm", "encoder.relative_embeddings.norm"),
        *weight_bias(f"{LAYER}.attention.self.query_proj", f"{BLOCK}.attn.q"),
        *weight_bias(f"{LAYER}.attention.self.key_proj", f"{BLOCK}.attn.k"),
        *weight_bias(f"{LAYER}.attention.self.value_proj", f"{BLOCK}.attn.v"),
        *weight_bias(f"{LAYER}.attention.self.pos_query_proj", f"{BLOCK}.attn.pos_query"),
        *weight_bias(f"{LAYER}.attention.self.pos_key_proj", f"{BLOCK}.attn.pos_key"),
        *weight_bias(f"{LAYER}.attention.output.dense", f"{BLOCK}.attn.out"),
        *weight_bias(f"{LAYER}.attention.output.LayerNorm", f"{BLOCK}.attn_norm"),
        *weight_bias(f"{LAYER}.intermediate.dense", f"{BLOCK}.mlp.fc1"),
        *weight_bias(f"{LAYER}.output.dense", f"{BLOCK}.mlp.fc2"),
        *weight_bias(f"{LAYER}.output.LayerNorm", f"{BLOCK}.mlp_norm"),
        *weight_bias("mask_predictions.dense", None),  # the pretraining replaced-token head: no class runs it
        *weight_bias("mask_predictions.LayerNorm", None),
        *weight_bias("mask_predictions.classifier", None),
        *weight_bias("classifier", "head.out"),
    ),
    config_rules=config_rules,
    defaults={"deberta-v2": {"vocab_size": 128100, "hidden_size": 1536, "num_hidden_layers": 24,
                             "num_attention_heads": 24, "intermediate_size": 6144, "hidden_act": "gelu",
                             "max_position_embeddings": 512, "type_vocab_size": 0, "layer_norm_eps": 1e-7,
                             "relative_attention": False, "max_relative_positions": -1, "pad_token_id": 0,
                             "bos_token_id": None, "eos_token_id": None, "position_biased_input": True,
                             "pos_att_type": None, "pooler_hidden_act": "gelu", "legacy": True,
                             "tie_word_embeddings": True}},
)
