"""DistilBERT (DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification).

A post-norm BERT without segment embeddings, with its own names: `transformer.layer.N.attention.q_lin`,
`sa_layer_norm`, `ffn.lin1/lin2`, `output_layer_norm`; the MLM head is `vocab_transform` + activation +
`vocab_layer_norm` + `vocab_projector`; the classifier is `pre_classifier` + ReLU + `classifier`.
Sinusoidal position tables (`sinusoidal_pos_embds`) are stored in the checkpoint like learned ones.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.common import architecture_head, common
from tfcli.config import ModelConfig

MODEL_TYPES = ("distilbert",)
HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}
PREFIXES = ("distilbert.",)


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    renamed = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "hidden_dim": "intermediate_size", "activation": "hidden_act", "dropout": "hidden_dropout_prob",
               "attention_dropout": "attention_probs_dropout_prob", "seq_classif_dropout": "classifier_dropout"}
    values = {**hf, **{ours: hf[theirs] for theirs, ours in renamed.items() if theirs in hf}}
    return common(values, model_type="distilbert", architecture="encoder", type_vocab_size=0,
                  norm_position="post", position="learned", embedding_norm=True, layer_norm_eps=1e-12,
                  head=architecture_head(hf, HEADS), lm_head_bias=True, classifier_pooler="relu")


def rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    layer, block = r"transformer\.layer\.(\d+)", r"encoder.blocks.\1"
    return [
        (r"embeddings\.word_embeddings\.weight", "embed_tokens.weight"),
        (r"embeddings\.position_embeddings\.weight", "encoder.embeddings.positions.weight"),
        (r"embeddings\.LayerNorm\.(weight|bias)", r"encoder.embeddings.norm.\1"),
        (r"embeddings\.position_ids", None),
        (rf"{layer}\.attention\.q_lin\.(weight|bias)", rf"{block}.attention.q.\2"),
        (rf"{layer}\.attention\.k_lin\.(weight|bias)", rf"{block}.attention.k.\2"),
        (rf"{layer}\.attention\.v_lin\.(weight|bias)", rf"{block}.attention.v.\2"),
        (rf"{layer}\.attention\.out_lin\.(weight|bias)", rf"{block}.attention.out.\2"),
        (rf"{layer}\.sa_layer_norm\.(weight|bias)", rf"{block}.attention_norm.\2"),
        (rf"{layer}\.ffn\.lin1\.(weight|bias)", rf"{block}.feed_forward.fc1.\2"),
        (rf"{layer}\.ffn\.lin2\.(weight|bias)", rf"{block}.feed_forward.fc2.\2"),
        (rf"{layer}\.output_layer_norm\.(weight|bias)", rf"{block}.feed_forward_norm.\2"),
        (r"vocab_transform\.(weight|bias)", r"head.dense.\1"),
        (r"vocab_layer_norm\.(weight|bias)", r"head.norm.\1"),
        (r"vocab_projector\.weight", "head.unembed.weight"),
        (r"vocab_projector\.bias", "head.bias"),
        (r"pre_classifier\.(weight|bias)", r"head.dense.\1"),
        (r"classifier\.(weight|bias)", r"head.out.\1"),
    ]


def transposed(config: ModelConfig) -> list[str]:
    return []
