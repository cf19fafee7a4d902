"""ELECTRA (ElectraModel, ElectraForPreTraining: the discriminator, ElectraForMaskedLM: the generator,
ElectraForSequenceClassification).

BERT's encoder (its rules are reused) under embeddings of their own width (`embedding_size`), projected to
the hidden size by `embeddings_project` when the two differ. The discriminator's head scores each token
(dense, the config's activation, one output: `head: discriminator`); the generator's MLM head maps the hidden
state down to the embedding width with GELU whatever the config says; the classifier reads the first token
through dense + GELU + out_proj, without a pooler.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bert import BERT_DEFAULTS, DECODER_SETTINGS, EMBEDDING_RULES, ENCODER_RULES
from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse, weight_bias
from tfcli.config import ModelConfig

HEADS = {"ForPreTraining": "discriminator", "ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "ELECTRA", DECODER_SETTINGS)
    width, hidden = hf["embedding_size"], hf["hidden_size"]
    return common(hf, model_type="electra", architecture="encoder", hidden_size=hidden,
                  embedding_size=width if width != hidden else None, type_vocab_size=hf["type_vocab_size"],
                  norm_position="post", position="learned", embedding_norm=True, head=architecture_head(hf, HEADS),
                  head_act="gelu", lm_head_bias=True, classifier_pooler="gelu")


def head_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """Each head's modules by the head the config has (the generator's LM head, the discriminator's, or
    the classifier's, whose `dense` shares a tfcli name with the others')."""
    if config.head == "mlm":
        return (*weight_bias("generator_predictions.dense", "head.dense"),
                *weight_bias("generator_predictions.LayerNorm", "head.norm"),
                ("generator_lm_head.weight", "head.unembed.weight"), ("generator_lm_head.bias", "head.bias"))
    if config.head == "discriminator":
        return (*weight_bias("discriminator_predictions.dense", "head.dense"),
                *weight_bias("discriminator_predictions.dense_prediction", "head.out"))
    return (*weight_bias("classifier.dense", "head.dense"), *weight_bias("classifier.out_proj", "head.out"))


FAMILY = Family(
    model_types=("electra",),
    translate=translate,
    prefixes=("electra.",),
    rules=(
        *EMBEDDING_RULES,
        *weight_bias("embeddings_project", "encoder.embeddings.project"),
        *ENCODER_RULES,
    ),
    config_rules=head_rules,
    defaults={"electra": {**BERT_DEFAULTS, **DECODER_SETTINGS, "embedding_size": 128, "hidden_size": 256,
                          "num_attention_heads": 4, "intermediate_size": 1024}},
)
