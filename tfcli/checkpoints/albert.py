"""ALBERT (AlbertModel, AlbertForMaskedLM, AlbertForPreTraining, AlbertForSequenceClassification).

Factorised embeddings: token, position and segment embeddings `embedding_size` wide (128), normalised, then
projected to the hidden size (`encoder.embedding_hidden_mapping_in`). Post-norm BERT-like blocks whose
weights are shared across depth: `num_hidden_groups` groups (1 in every released ALBERT), layer i running
group int(i / (layers / groups)); tfcli's stack holds each group once and runs it at each of its depths, so
every depth still has its own hidden state, attention map and logit lens. The MLM head maps the hidden state
down to the embedding width; the classifier reads the pooler (dense + tanh) on the first token.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bert import BERT_DEFAULTS, EMBEDDING_RULES
from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse, weight_bias
from tfcli.config import ModelConfig

HEADS = {"ForMaskedLM": "mlm", "ForPreTraining": "mlm", "ForSequenceClassification": "classifier"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "ALBERT", {"inner_group_num": 1})
    return common(hf, model_type="albert", architecture="encoder", embedding_size=hf["embedding_size"],
                  num_hidden_groups=hf["num_hidden_groups"], type_vocab_size=hf["type_vocab_size"],
                  norm_position="post", position="learned", embedding_norm=True, head=architecture_head(hf, HEADS),
                  lm_head_bias=True, classifier_pooler="tanh")


def layer_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """Group g's block is the model's block at the first depth that runs it; the MLM head's bias as BERT's
    (see bert.mlm_rules); the pooler feeds the classifier and nothing else."""
    layers, groups = config.num_hidden_layers, config.num_hidden_groups or config.num_hidden_layers
    first = {}
    for i in range(layers):
        first.setdefault(int(i / (layers / groups)), i)
    rules = []
    for group, block in first.items():
        source, target = f"encoder.albert_layer_groups.{group}.albert_layers.0", f"encoder.blocks.{block}"
        rules += [*weight_bias(f"{source}.attention.query", f"{target}.attn.q"),
                  *weight_bias(f"{source}.attention.key", f"{target}.attn.k"),
                  *weight_bias(f"{source}.attention.value", f"{target}.attn.v"),
                  *weight_bias(f"{source}.attention.dense", f"{target}.attn.out"),
                  *weight_bias(f"{source}.attention.LayerNorm", f"{target}.attn_norm"),
                  *weight_bias(f"{source}.ffn", f"{target}.mlp.fc1"),
                  *weight_bias(f"{source}.ffn_output", f"{target}.mlp.fc2"),
                  *weight_bias(f"{source}.full_layer_layer_norm", f"{target}.mlp_norm")]
    return (*rules,
            ("predictions.bias", "head.bias" if config.tie_word_embeddings else None),
            *weight_bias("pooler", "head.dense" if config.head == "classifier" else None))


FAMILY = Family(
    model_types=("albert",),
    translate=translate,
    prefixes=("albert.",),
    rules=(
        *EMBEDDING_RULES,
        *weight_bias("encoder.embedding_hidden_mapping_in", "encoder.embeddings.project"),
        *weight_bias("predictions.dense", "head.dense"),
        *weight_bias("predictions.LayerNorm", "head.norm"),
        ("predictions.decoder.weight", "head.unembed.weight"),
        ("predictions.decoder.bias", "head.bias"),
        *weight_bias("sop_classifier.classifier", None),  # AlbertForPreTraining's sentence-order head
        *weight_bias("classifier", "head.out"),
    ),
    config_rules=layer_rules,
    defaults={"albert": {**BERT_DEFAULTS, "vocab_size": 30000, "embedding_size": 128, "hidden_size": 4096,
                         "num_hidden_groups": 1, "inner_group_num": 1, "num_attention_heads": 64,
                         "intermediate_size": 16384, "hidden_act": "gelu_new", "bos_token_id": 2,
                         "eos_token_id": 3}},
)
