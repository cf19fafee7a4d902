"""BERT (BertModel, BertForMaskedLM, BertForPreTraining, BertForSequenceClassification)."""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, Rule, architecture_head, common, refuse, weight_bias
from tfcli.config import ModelConfig

HEADS = {"ForMaskedLM": "mlm", "ForPreTraining": "mlm", "ForSequenceClassification": "classifier"}
DECODER_SETTINGS = {"is_decoder": False, "add_cross_attention": False}  # a causal BERT/RoBERTa: not implemented
BERT_DEFAULTS = {  # transformers' BertConfig (with DECODER_SETTINGS); its relatives differ where they say
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None,
    "tie_word_embeddings": True,
}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    refuse(hf, "BERT", DECODER_SETTINGS)
    return common(hf, model_type="bert", architecture="encoder", type_vocab_size=hf["type_vocab_size"],
                  norm_position="post", position="learned", embedding_norm=True,
                  head=architecture_head(hf, HEADS), lm_head_bias=True, classifier_pooler="tanh")


EMBEDDING_RULES = (  # shared by RoBERTa
    ("embeddings.word_embeddings.weight", "embed_tokens.weight"),
    ("embeddings.position_embeddings.weight", "encoder.embeddings.positions.weight"),
    ("embeddings.token_type_embeddings.weight", "encoder.embeddings.segments.weight"),
    *weight_bias("embeddings.LayerNorm", "encoder.embeddings.norm"),
    ("embeddings.position_ids", None),
    ("embeddings.token_type_ids", None),
)

ENCODER_RULES = (  # the BERT layer layout, shared by RoBERTa
    *weight_bias("encoder.layer.{}.attention.self.query", "encoder.blocks.{}.attn.q"),
    *weight_bias("encoder.layer.{}.attention.self.key", "encoder.blocks.{}.attn.k"),
    *weight_bias("encoder.layer.{}.attention.self.value", "encoder.blocks.{}.attn.v"),
    *weight_bias("encoder.layer.{}.attention.output.dense", "encoder.blocks.{}.attn.out"),
    *weight_bias("encoder.layer.{}.attention.output.LayerNorm", "encoder.blocks.{}.attn_norm"),
    *weight_bias("encoder.layer.{}.intermediate.dense", "encoder.blocks.{}.mlp.fc1"),
    *weight_bias("encoder.layer.{}.output.dense", "encoder.blocks.{}.mlp.fc2"),
    *weight_bias("encoder.layer.{}.output.LayerNorm", "encoder.blocks.{}.mlp_norm"),
)


def mlm_rules(prefix: str, config: ModelConfig) -> tuple[Rule, ...]:
    """BERT's MLM head, `prefix` = cls.predictions (BERT) or lm_head (RoBERTa); the transform may sit
    under `transform.` or not, and its norm be spelled LayerNorm or layer_norm. The decoder's bias is the
    one the head adds; `{prefix}.bias` is the same tensor when the embeddings are tied, and used by
    nothing when they are not."""
    return (
        *(rule for transform in ("transform.", "") for rule in (
            *weight_bias(f"{prefix}.{transform}dense", "head.dense"),
            *weight_bias(f"{prefix}.{transform}LayerNorm", "head.norm"),
            *weight_bias(f"{prefix}.{transform}layer_norm", "head.norm"))),
        (f"{prefix}.decoder.weight", "head.unembed.weight"),
        (f"{prefix}.decoder.bias", "head.bias"),
        (f"{prefix}.bias", "head.bias" if config.tie_word_embeddings else None),
    )


def config_rules(config: ModelConfig) -> tuple[Rule, ...]:
    """The MLM head's bias (see mlm_rules); the pooler feeds the classifier head, and with any other head
    it is not used."""
    return (*mlm_rules("cls.predictions", config),
            *weight_bias("pooler.dense", "head.dense" if config.head == "classifier" else None))


FAMILY = Family(
    model_types=("bert",),
    translate=translate,
    prefixes=("bert.",),
    rules=(
        *EMBEDDING_RULES,
        *ENCODER_RULES,
        *weight_bias("cls.seq_relationship", None),  # BertForPreTraining's next-sentence head
        *weight_bias("classifier", "head.out"),
    ),
    config_rules=config_rules,
    defaults={"bert": {**BERT_DEFAULTS, **DECODER_SETTINGS}},
)
