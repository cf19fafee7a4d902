"""DistilBERT (DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification).

A post-norm BERT without segment embeddings, with its own names: `transformer.layer.N.attention.q_lin`,
`sa_layer_norm`, `ffn.lin1/lin2`, `output_layer_norm`; the MLM head is `vocab_transform` + activation +
`vocab_layer_norm` + `vocab_projector`; the classifier is `pre_classifier` + ReLU + `classifier`.
Sinusoidal position tables (`sinusoidal_pos_embds`) are stored in the checkpoint like learned ones.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, weight_bias

HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    renamed = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
               "hidden_dim": "intermediate_size", "activation": "hidden_act", "dropout": "hidden_dropout_prob",
               "attention_dropout": "attention_probs_dropout_prob", "seq_classif_dropout": "classifier_dropout"}
    values = {**hf, **{ours: hf[theirs] for theirs, ours in renamed.items() if theirs in hf}}
    return common(values, model_type="distilbert", architecture="encoder", type_vocab_size=0,
                  norm_position="post", position="learned", embedding_norm=True, layer_norm_eps=1e-12,
                  head=architecture_head(hf, HEADS), lm_head_bias=True, classifier_pooler="relu")


FAMILY = Family(
    model_types=("distilbert",),
    translate=translate,
    prefixes=("distilbert.",),
    rules=(
        ("embeddings.word_embeddings.weight", "embed_tokens.weight"),
        ("embeddings.position_embeddings.weight", "encoder.embeddings.positions.weight"),
        *weight_bias("embeddings.LayerNorm", "encoder.embeddings.norm"),
        ("embeddings.position_ids", None),
        *weight_bias("transformer.layer.{}.attention.q_lin", "encoder.blocks.{}.attn.q"),
        *weight_bias("transformer.layer.{}.attention.k_lin", "encoder.blocks.{}.attn.k"),
        *weight_bias("transformer.layer.{}.attention.v_lin", "encoder.blocks.{}.attn.v"),
        *weight_bias("transformer.layer.{}.attention.out_lin", "encoder.blocks.{}.attn.out"),
        *weight_bias("transformer.layer.{}.sa_layer_norm", "encoder.blocks.{}.attn_norm"),
        *weight_bias("transformer.layer.{}.ffn.lin1", "encoder.blocks.{}.mlp.fc1"),
        *weight_bias("transformer.layer.{}.ffn.lin2", "encoder.blocks.{}.mlp.fc2"),
        *weight_bias("transformer.layer.{}.output_layer_norm", "encoder.blocks.{}.mlp_norm"),
        *weight_bias("vocab_transform", "head.dense"),
        *weight_bias("vocab_layer_norm", "head.norm"),
        ("vocab_projector.weight", "head.unembed.weight"),
        ("vocab_projector.bias", "head.bias"),
        *weight_bias("pre_classifier", "head.dense"),
        *weight_bias("classifier", "head.out"),
    ),
    defaults={"distilbert": {"vocab_size": 30522, "max_position_embeddings": 512, "n_layers": 6, "n_heads": 12,
                             "dim": 768, "hidden_dim": 3072, "activation": "gelu", "pad_token_id": 0,
                             "bos_token_id": None, "eos_token_id": None, "tie_word_embeddings": True}},
)
