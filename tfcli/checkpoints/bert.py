"""BERT (BertModel, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification)."""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.common import architecture_head, common
from tfcli.config import ModelConfig

MODEL_TYPES = ("bert",)
HEADS = {"ForMaskedLM": "mlm", "ForPreTraining": "mlm", "ForSequenceClassification": "classifier"}
PREFIXES = ("bert.",)


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    return common(hf, model_type="bert", architecture="encoder", type_vocab_size=hf.get("type_vocab_size", 2),
                  norm_position="post", position="learned", embedding_norm=True,
                  head=architecture_head(hf, HEADS), lm_head_bias=True, classifier_pooler="tanh")


def encoder_rules(source: str, target: str) -> list[tuple[str, str | None]]:
    """The BERT layer layout, shared by RoBERTa: `source`.layer.N... -> `target`.blocks.N..."""
    layer, block = rf"{source}\.layer\.(\d+)", rf"{target}.blocks.\1"
    return [
        (rf"{layer}\.attention\.self\.query\.(weight|bias)", rf"{block}.attention.q.\2"),
        (rf"{layer}\.attention\.self\.key\.(weight|bias)", rf"{block}.attention.k.\2"),
        (rf"{layer}\.attention\.self\.value\.(weight|bias)", rf"{block}.attention.v.\2"),
        (rf"{layer}\.attention\.output\.dense\.(weight|bias)", rf"{block}.attention.out.\2"),
        (rf"{layer}\.attention\.output\.LayerNorm\.(weight|bias)", rf"{block}.attention_norm.\2"),
        (rf"{layer}\.intermediate\.dense\.(weight|bias)", rf"{block}.feed_forward.fc1.\2"),
        (rf"{layer}\.output\.dense\.(weight|bias)", rf"{block}.feed_forward.fc2.\2"),
        (rf"{layer}\.output\.LayerNorm\.(weight|bias)", rf"{block}.feed_forward_norm.\2"),
    ]


def embedding_rules() -> list[tuple[str, str | None]]:
    return [
        (r"embeddings\.word_embeddings\.weight", "embed_tokens.weight"),
        (r"embeddings\.position_embeddings\.weight", "encoder.embeddings.positions.weight"),
        (r"embeddings\.token_type_embeddings\.weight", "encoder.embeddings.segments.weight"),
        (r"embeddings\.LayerNorm\.(weight|bias)", r"encoder.embeddings.norm.\1"),
        (r"embeddings\.position_ids", None),
        (r"embeddings\.token_type_ids", None),
    ]


def mlm_rules(prefix: str) -> list[tuple[str, str | None]]:
    """BERT's MLM head, `prefix` = cls.predictions (BERT) or lm_head (RoBERTa)."""
    p = prefix.replace(".", r"\.")
    return [
        (rf"{p}\.(?:transform\.)?dense\.(weight|bias)", r"head.dense.\1"),
        (rf"{p}\.(?:transform\.)?(?:LayerNorm|layer_norm)\.(weight|bias)", r"head.norm.\1"),
        (rf"{p}\.decoder\.weight", "head.unembed.weight"),
        (rf"{p}\.(?:decoder\.)?bias", "head.bias"),
    ]


def rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    classifier = config.head == "classifier"
    return [
        *embedding_rules(),
        *encoder_rules("encoder", "encoder"),
        *mlm_rules("cls.predictions"),
        (r"cls\.seq_relationship\.(weight|bias)", None),
        (r"pooler\.dense\.(weight|bias)", r"head.dense.\1" if classifier else None),
        (r"classifier\.(weight|bias)", r"head.out.\1"),
    ]


def transposed(config: ModelConfig) -> list[str]:
    return []
