"""ModernBERT (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification).

A pre-norm encoder with rotary positions and no biases (`attention_bias`, `mlp_bias`, LayerNorms without bias:
`norm_bias`): the embeddings are normed, the first block's attention reads them as they are; every
`global_attn_every_n_layers`-th layer (from the first) attends globally with rotary base `global_rope_theta`,
the others within `local_attention` / 2 positions on either side with base `local_rope_theta` (transformers 5
writes both as `layer_types` and `rope_parameters`); a GeGLU feed-forward whose `Wi` holds the activated half
first; a final norm. The MLM head is dense (`classifier_bias`), `classifier_activation` and a norm, then the
tied decoder with its bias; the classifier pools the first token or the mean of the real ones
(`classifier_pooling`) through the same dense, activation and norm.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, unsupported, weight_bias

HEADS = {"ForMaskedLM": "mlm", "ForSequenceClassification": "classifier"}


def _rope_thetas(hf: dict[str, Any]) -> tuple[float, float]:
    """(global, local) rotary bases from transformers 5's rope_parameters or the older top-level keys."""
    params = hf.get("rope_parameters") or {}
    bases = []
    for kind, old_key, default in (("full_attention", "global_rope_theta", 160000.0),
                                   ("sliding_attention", "local_rope_theta", 10000.0)):
        settings = params.get(kind) or {}
        if settings.get("rope_type", "default") != "default" or hf.get("rope_scaling"):
            raise unsupported("ModernBERT", "RoPE scaling", "tfcli implements ModernBERT's plain rotary positions")
        bases.append(float(settings.get("rope_theta", hf.get(old_key, default))))
    return bases[0], bases[1]


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    layers = hf["num_hidden_layers"]
    every = hf.get("global_attn_every_n_layers", 3)  # an old key transformers still reads
    layer_types = hf["layer_types"] or ["sliding_attention" if i % every else "full_attention"
                                             for i in range(layers)]
    global_theta, local_theta = _rope_thetas(hf)
    activation = hf["classifier_activation"]
    return common(hf, model_type="modernbert", architecture="encoder", hidden_act=hf["hidden_activation"],
                  layer_norm_eps=hf["norm_eps"], norm="layernorm", norm_bias=bool(hf["norm_bias"]),
                  norm_position="pre", position="rotary",
                  rope_theta=global_theta, local_rope_theta=local_theta, layer_types=layer_types,
                  sliding_window=hf["local_attention"] // 2 + 1,  # tfcli counts the query itself
                  type_vocab_size=0, embedding_norm=True, first_block_attention_norm=False, final_norm=True,
                  feed_forward="gated", attention_bias=bool(hf["attention_bias"]),
                  attention_out_bias=bool(hf["attention_bias"]), mlp_bias=bool(hf["mlp_bias"]),
                  head=architecture_head(hf, HEADS), head_act=activation, classifier_pooler=activation,
                  classifier_pooling=hf["classifier_pooling"], classifier_norm=True,
                  classifier_bias=bool(hf["classifier_bias"]), lm_head_bias=bool(hf["decoder_bias"]))


FAMILY = Family(
    model_types=("modernbert",),
    older_numbers=("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"),
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embeddings.tok_embeddings.weight", "embed_tokens.weight"),
        *weight_bias("embeddings.norm", "encoder.embeddings.norm"),
        *weight_bias("layers.{}.attn_norm", "encoder.blocks.{}.attn_norm"),
        *weight_bias("layers.{}.attn.Wqkv", "encoder.blocks.{}.attn.qkv"),
        *weight_bias("layers.{}.attn.Wo", "encoder.blocks.{}.attn.out"),
        *weight_bias("layers.{}.mlp_norm", "encoder.blocks.{}.mlp_norm"),
        *weight_bias("layers.{}.mlp.Wi", "encoder.blocks.{}.mlp.gate_up"),
        *weight_bias("layers.{}.mlp.Wo", "encoder.blocks.{}.mlp.down"),
        *weight_bias("final_norm", "encoder.final_norm"),
        *weight_bias("head.dense", "head.dense"),
        *weight_bias("head.norm", "head.norm"),
        ("decoder.weight", "head.unembed.weight"),
        ("decoder.bias", "head.bias"),
        *weight_bias("classifier", "head.out"),
    ),
    defaults={"modernbert": {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
                             "num_hidden_layers": 22, "num_attention_heads": 12, "hidden_activation": "gelu",
                             "max_position_embeddings": 8192, "norm_eps": 1e-5, "norm_bias": False,
                             "pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281,
                             "attention_bias": False, "layer_types": None, "local_attention": 128, "mlp_bias": False,
                             "decoder_bias": True, "classifier_pooling": "cls", "classifier_bias": False,
                             "classifier_activation": "gelu", "tie_word_embeddings": True}},
)
