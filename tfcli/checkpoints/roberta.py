"""RoBERTa and XLM-RoBERTa (...Model, ...ForMaskedLM, ...ForSequenceClassification).

BERT's layout (its rules are reused) with three differences: position ids start after the padding index
(`position_offset` = pad_token_id + 1, and HF's max_position_embeddings counts those extra rows), the MLM
head's activation is always GELU, and the classification head is `classifier.dense` + tanh +
`classifier.out_proj`, with no pooler. XLM-RoBERTa is the same model with a larger vocabulary.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bert import BERT_DEFAULTS, DECODER_SETTINGS, EMBEDDING_RULES, ENCODER_RULES, mlm_rules
from tfcli.checkpoints.family import Family, architecture_head, common, refuse, weight_bias

HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "RoBERTa", DECODER_SETTINGS)
    pad = hf["pad_token_id"]
    offset = (pad if pad is not None else 1) + 1
    positions = hf["max_position_embeddings"] - offset
    return common(hf, model_type=hf["model_type"], architecture="encoder", type_vocab_size=hf["type_vocab_size"],
                  norm_position="post", position="learned", position_offset=offset,
                  max_position_embeddings=positions, embedding_norm=True,
                  head=architecture_head(hf, HEADS), head_act="gelu", lm_head_bias=True, classifier_pooler="tanh")


FAMILY = Family(
    model_types=("roberta", "xlm-roberta"),
    translate=translate,
    prefixes=("roberta.",),
    rules=(
        *EMBEDDING_RULES,
        *ENCODER_RULES,
        *weight_bias("pooler.dense", None),  # RobertaModel's pooler: no RoBERTa head uses it
        *weight_bias("classifier.dense", "head.dense"),
        *weight_bias("classifier.out_proj", "head.out"),
    ),
    config_rules=lambda config: mlm_rules("lm_head", config),
    defaults={model_type: {**BERT_DEFAULTS, **DECODER_SETTINGS, "pad_token_id": 1, "bos_token_id": 0,
                           "eos_token_id": 2, "vocab_size": 50265 if model_type == "roberta" else 30522}
              for model_type in ("roberta", "xlm-roberta")},
)
