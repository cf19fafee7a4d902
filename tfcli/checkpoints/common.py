"""Translation helpers every family shares."""

from __future__ import annotations

from typing import Any

from tfcli.errors import TfcliError


def architecture_head(values: dict[str, Any], heads: dict[str, str]) -> str:
    """The head named by the config's `architectures` suffix (e.g. ForMaskedLM -> mlm), else none."""
    for arch in values.get("architectures") or []:
        for suffix, head in heads.items():
            if str(arch).endswith(suffix):
                return head
    return "none"


def common(values: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The fields most HF configs share, named as ModelConfig names them; families override the rest."""
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "layer_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id",
            "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
    out = {key: values[key] for key in keep if key in values}
    if out.get("hidden_act") == "gelu_pytorch_tanh":
        out["hidden_act"] = "gelu_new"
    id2label = values.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            out["labels"] = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            raise TfcliError("config.json: `id2label` keys must be label numbers") from None
        out["num_labels"] = len(out["labels"])
    out["name"] = str(values.get("_name_or_path") or values.get("model_type"))
    out.update(overrides)
    vocab = out.get("vocab_size")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = out.get(key)
        if isinstance(vocab, int) and isinstance(value, int) and not 0 <= value < vocab:
            out[key] = None  # transformers only warns: such a token can never be read or produced
    return {key: value for key, value in out.items() if value is not None or key.endswith("token_id")}
