"""MPNet (MPNetModel, MPNetForMaskedLM, MPNetForSequenceClassification; sentence-transformers/all-mpnet-base-v2).

A post-norm BERT-like encoder with two kinds of positions: learned absolute ones that start after the padding
index (1, whatever `pad_token_id` says, so `position_offset` 2), and a relative position bias the encoder
holds once and adds to every layer's scores: 32 bidirectional buckets up to a distance of 128 (transformers
buckets into 32 whatever `relative_attention_num_buckets` says, so another number is refused). No segments.
The MLM head is RoBERTa's (always GELU); the classifier reads the first token through dense + tanh + out_proj.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bert import mlm_rules
from tfcli.checkpoints.family import Family, architecture_head, common, refuse, weight_bias

HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}
PADDING_INDEX = 1  # transformers' MPNet positions skip it, whatever pad_token_id is


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "MPNet", {"relative_attention_num_buckets": 32})
    offset = PADDING_INDEX + 1
    return common(hf, model_type="mpnet", architecture="encoder", type_vocab_size=0,
                  norm_position="post", position="learned", position_offset=offset,
                  max_position_embeddings=hf["max_position_embeddings"] - offset, embedding_norm=True,
                  relative_attention_num_buckets=32, relative_attention_max_distance=128,
                  head=architecture_head(hf, HEADS), head_act="gelu", lm_head_bias=True, classifier_pooler="tanh")


FAMILY = Family(
    model_types=("mpnet",),
    translate=translate,
    prefixes=("mpnet.",),
    rules=(
        ("embeddings.word_embeddings.weight", "embed_tokens.weight"),
        ("embeddings.position_embeddings.weight", "encoder.embeddings.positions.weight"),
        *weight_bias("embeddings.LayerNorm", "encoder.embeddings.norm"),
        ("embeddings.position_ids", None),
        ("encoder.relative_attention_bias.weight", "encoder.position_bias.table.weight"),
        *weight_bias("encoder.layer.{}.attention.attn.q", "encoder.blocks.{}.attn.q"),
        *weight_bias("encoder.layer.{}.attention.attn.k", "encoder.blocks.{}.attn.k"),
        *weight_bias("encoder.layer.{}.attention.attn.v", "encoder.blocks.{}.attn.v"),
        *weight_bias("encoder.layer.{}.attention.attn.o", "encoder.blocks.{}.attn.out"),
        *weight_bias("encoder.layer.{}.attention.LayerNorm", "encoder.blocks.{}.attn_norm"),
        *weight_bias("encoder.layer.{}.intermediate.dense", "encoder.blocks.{}.mlp.fc1"),
        *weight_bias("encoder.layer.{}.output.dense", "encoder.blocks.{}.mlp.fc2"),
        *weight_bias("encoder.layer.{}.output.LayerNorm", "encoder.blocks.{}.mlp_norm"),
        *weight_bias("pooler.dense", None),  # MPNetModel's pooler: no MPNet head uses it
        *weight_bias("classifier.dense", "head.dense"),
        *weight_bias("classifier.out_proj", "head.out"),
    ),
    config_rules=lambda config: mlm_rules("lm_head", config),
    defaults={"mpnet": {"vocab_size": 30527, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                        "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
                        "layer_norm_eps": 1e-12, "relative_attention_num_buckets": 32, "pad_token_id": 1,
                        "bos_token_id": 0, "eos_token_id": 2, "tie_word_embeddings": True}},
)
