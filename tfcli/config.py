"""One ModelConfig for every stack tfcli builds, with Hugging Face field names.

A config comes from a bundled YAML name, a YAML file or a Hugging Face ``config.json`` (see
``sources.py`` for how --model is resolved). ``from_dict`` validates and fails with a TfcliError
that names the bad key or value.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfcli.errors import TfcliError

ARCHITECTURES = ("encoder", "decoder", "encoder-decoder")
ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu")
POSITIONS = ("learned", "sinusoidal", "rotary")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
FEED_FORWARDS = ("mlp", "gated")
HEADS = ("none", "mlm", "lm", "classifier")
CLASSIFIER_POOLERS = ("none", "tanh", "relu")


@dataclass
class ModelConfig:
    """Every choice a stack needs. Field names follow Hugging Face's where they exist."""

    name: str = "custom"
    model_type: str = "tfcli"  # the checkpoint family (bert, gpt2, llama, bart, ...) or tfcli
    architecture: str = "encoder"  # encoder | decoder | encoder-decoder
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_decoder_layers: int | None = None  # encoder-decoder only; None = num_hidden_layers
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None  # grouped-query attention; None = num_attention_heads
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segment embeddings; 0 = none
    hidden_act: str = "gelu"
    norm: str = "layernorm"
    norm_position: str = "post"
    layer_norm_eps: float = 1e-12
    position: str = "learned"
    position_offset: int = 0  # learned positions start here (RoBERTa: pad + 1, BART: 2)
    rope_theta: float = 10000.0
    embedding_norm: bool = True  # LayerNorm on the embeddings (BERT, BART)
    scale_embedding: bool = False  # multiply token embeddings by sqrt(hidden_size) (BART option)
    final_norm: bool = False  # a norm after the last block (pre-norm stacks: GPT-2, Llama)
    feed_forward: str = "mlp"  # mlp | gated (SiLU-gated, Llama)
    attention_scale: float | None = None  # scores = q k^T * attention_scale; None = 1/sqrt(head size)
    attention_bias: bool = True  # biases on the Q/K/V projections
    attention_out_bias: bool = True  # bias on the attention output projection
    mlp_bias: bool = True
    head: str = "none"  # none | mlm | lm | classifier
    head_act: str | None = None  # the activation in the MLM head's transform; None = hidden_act (RoBERTa: gelu)
    tie_word_embeddings: bool = True  # the LM head is the (decoder's) token embedding
    share_encoder_decoder_embeddings: bool = True  # encoder-decoder: one token embedding for both stacks
    lm_head_bias: bool = False  # a bias on the unembedding (MLM decoders, BART's final_logits_bias)
    num_labels: int = 2
    labels: list[str] = field(default_factory=list)
    classifier_pooler: str = "tanh"  # dense + activation on the first token before the classifier
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_hidden_layers

    @property
    def label_names(self) -> list[str]:
        return self.labels or [f"LABEL_{i}" for i in range(self.num_labels)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
CHOICES = {
    "architecture": ARCHITECTURES,
    "hidden_act": ACTIVATIONS,
    "head_act": ACTIVATIONS,
    "position": POSITIONS,
    "norm": NORMS,
    "norm_position": NORM_POSITIONS,
    "feed_forward": FEED_FORWARDS,
    "head": HEADS,
    "classifier_pooler": CLASSIFIER_POOLERS,
}
POSITIVE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "num_labels", "num_decoder_layers", "num_key_value_heads")


# Other libraries' names for our fields: spelling similarity alone would suggest e.g. num_labels for num_layers.
ALIASES = {
    "num_layers": "num_hidden_layers", "n_layer": "num_hidden_layers", "n_layers": "num_hidden_layers",
    "layers": "num_hidden_layers", "num_heads": "num_attention_heads", "n_head": "num_attention_heads",
    "n_heads": "num_attention_heads", "heads": "num_attention_heads", "d_model": "hidden_size",
    "n_embd": "hidden_size", "dim": "hidden_size", "d_ff": "intermediate_size", "n_inner": "intermediate_size",
    "dim_feedforward": "intermediate_size", "ffn_dim": "intermediate_size", "n_positions": "max_position_embeddings",
    "n_ctx": "max_position_embeddings", "num_kv_heads": "num_key_value_heads", "activation": "hidden_act",
    "activation_function": "hidden_act", "layer_norm_epsilon": "layer_norm_eps", "rms_norm_eps": "layer_norm_eps",
}


def from_dict(values: dict[str, Any], origin: str = "config") -> ModelConfig:
    """Validate plain values (from YAML or a translated HF config) into a ModelConfig."""
    if not isinstance(values, dict):
        raise TfcliError(f"{origin}: expected a mapping of config keys, got {type(values).__name__}",
                         "a config is a YAML mapping such as `hidden_size: 256`")
    for key in values:
        if key not in FIELDS:
            close = [ALIASES[key]] if key in ALIASES else difflib.get_close_matches(str(key), FIELDS, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "run `tfcli config` to see every valid key"
            raise TfcliError(f"{origin}: unknown key `{key}`", hint)
    checked = {key: _check_type(key, value, origin) for key, value in values.items()}
    config = ModelConfig(**checked)
    _check_values(config, origin)
    return config


def _check_type(key: str, value: Any, origin: str) -> Any:
    default = FIELDS[key].default
    kind = FIELDS[key].type
    wrong = TfcliError(f"{origin}: `{key}` must be {_describe(kind)}, got {value!r}",
                       f"for example `{key}: {default if default is not dataclasses.MISSING else '...'}`")
    if value is None:
        if "None" in kind:
            return None
        raise wrong
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
    elif kind.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise wrong  # NaN and infinity pass every `<=` check below, so refuse them here
        value = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise wrong
    elif kind == "str":
        if not isinstance(value, str):
            raise wrong
    elif kind.startswith("list"):
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
            raise wrong
        value = [str(v) for v in value]
    return value


def _describe(kind: str) -> str:
    base = kind.replace(" | None", "")
    words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
             "list[str]": "a list of names"}
    return words.get(base, base) + (" (or null)" if "None" in kind else "")


def _check_values(c: ModelConfig, origin: str) -> None:
    for key, allowed in CHOICES.items():
        value = getattr(c, key)
        if value is None and "None" in FIELDS[key].type:
            continue
        if value not in allowed:
            close = difflib.get_close_matches(value, allowed, n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"choose one of: {', '.join(allowed)}"
            raise TfcliError(f"{origin}: unsupported {key} `{value}` (supported: {', '.join(allowed)})", hint)
    for key in POSITIVE:
        value = getattr(c, key)
        if value is not None and value <= 0:
            raise TfcliError(f"{origin}: `{key}` must be positive, got {value}", f"set `{key}` to 1 or more")
    for key in ("type_vocab_size", "position_offset"):
        if getattr(c, key) < 0:
            raise TfcliError(f"{origin}: `{key}` must be 0 or more, got {getattr(c, key)}")
    if c.hidden_size % c.num_attention_heads:
        raise TfcliError(
            f"{origin}: hidden_size {c.hidden_size} is not divisible by num_attention_heads {c.num_attention_heads}",
            "each head gets hidden_size / num_attention_heads dimensions: pick sizes that divide evenly")
    if c.num_attention_heads % c.kv_heads:
        raise TfcliError(
            f"{origin}: num_attention_heads {c.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {c.kv_heads}", "each key/value head serves a whole group of query heads")
    if c.position == "rotary" and c.head_dim % 2:
        raise TfcliError(f"{origin}: rotary positions need an even head size, got {c.head_dim}")
    if c.position == "sinusoidal" and c.hidden_size % 2:
        raise TfcliError(f"{origin}: sinusoidal positions need an even hidden_size, got {c.hidden_size}")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        value = getattr(c, key)
        if value is not None and not 0 <= value < 1:
            raise TfcliError(f"{origin}: `{key}` must be in [0, 1), got {value}")
    for key in ("layer_norm_eps", "rope_theta", "attention_scale"):
        if getattr(c, key) is not None and getattr(c, key) <= 0:
            raise TfcliError(f"{origin}: `{key}` must be positive, got {getattr(c, key)}")
    if c.labels and len(c.labels) != c.num_labels:
        raise TfcliError(f"{origin}: {len(c.labels)} labels given but num_labels is {c.num_labels}",
                         "give one name per label, or leave `num_labels` out to count them")
    if c.head == "lm" and c.architecture == "encoder":
        raise TfcliError(f"{origin}: head `lm` needs a decoder (architecture decoder or encoder-decoder)",
                         "an encoder predicts masked tokens with head `mlm`")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = getattr(c, key)
        if value is not None and not 0 <= value < c.vocab_size:
            raise TfcliError(f"{origin}: `{key}` {value} is outside the vocabulary (size {c.vocab_size})")


def load_yaml(path: Path) -> ModelConfig:
    """Read a YAML config file (safe_load only). A `labels` list sets num_labels when it is left out."""
    import yaml

    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TfcliError(f"{path}: not valid YAML{where}: {problem}",
                         "tfcli reads plain YAML only: no Python tags such as !!python/object") from None
    except UnicodeDecodeError:
        raise TfcliError(f"{path}: not a UTF-8 text file", "a config is a YAML text file") from None
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    if values is None:
        raise TfcliError(f"{path}: the file is empty", "a config is a YAML mapping such as `hidden_size: 256`")
    if isinstance(values, dict) and "labels" in values and "num_labels" not in values \
            and isinstance(values["labels"], list) and values["labels"]:
        values = {**values, "num_labels": len(values["labels"])}
    values = {"name": path.stem, **values} if isinstance(values, dict) else values
    return from_dict(values, origin=str(path))


def parameter_count(c: ModelConfig) -> int:
    """Parameters of the model a config builds (tied weights counted once), by arithmetic: no torch, no
    model, so `tfcli config` and the memory check are instant for any size. Mirrors the module tree of
    tfcli/model; tests/test_model_size.py checks it against the built model's count."""
    hidden, inner, vocab = c.hidden_size, c.intermediate_size, c.vocab_size
    q_size, kv_size = c.num_attention_heads * c.head_dim, c.kv_heads * c.head_dim
    norm = hidden if c.norm == "rmsnorm" else 2 * hidden  # RMSNorm has no bias

    def linear(inputs: int, outputs: int, bias: bool = True) -> int:
        return inputs * outputs + (outputs if bias else 0)

    self_attention = (linear(hidden, q_size + 2 * kv_size, c.attention_bias)
                      + linear(q_size, hidden, c.attention_out_bias))
    cross_attention = (linear(hidden, q_size, c.attention_bias) + linear(hidden, 2 * kv_size, c.attention_bias)
                       + linear(q_size, hidden, c.attention_out_bias))
    if c.feed_forward == "gated":
        feed_forward = 2 * linear(hidden, inner, c.mlp_bias) + linear(inner, hidden, c.mlp_bias)
    else:
        feed_forward = linear(hidden, inner, c.mlp_bias) + linear(inner, hidden, c.mlp_bias)

    def stack(layers: int, causal: bool, cross: bool) -> int:
        embeddings = (c.max_position_embeddings + c.position_offset) * hidden if c.position == "learned" else 0
        embeddings += c.type_vocab_size * hidden if c.type_vocab_size > 0 and not causal else 0
        embeddings += norm if c.embedding_norm else 0
        block = self_attention + feed_forward + 2 * norm + (cross_attention + norm if cross else 0)
        return embeddings + layers * block + (norm if c.final_norm else 0)

    total = vocab * hidden  # token embeddings
    if c.architecture == "encoder-decoder" and not c.share_encoder_decoder_embeddings:
        total += vocab * hidden  # the decoder's own
    if c.architecture != "decoder":
        total += stack(c.num_hidden_layers, causal=False, cross=False)
    if c.architecture != "encoder":
        layers = c.decoder_layers if c.architecture == "encoder-decoder" else c.num_hidden_layers
        total += stack(layers, causal=True, cross=c.architecture == "encoder-decoder")
    if c.head in ("mlm", "lm"):
        total += linear(hidden, hidden) + 2 * hidden if c.head == "mlm" else 0  # dense + LayerNorm
        total += 0 if c.tie_word_embeddings else vocab * hidden
        total += vocab if c.lm_head_bias else 0
    elif c.head == "classifier":
        total += (linear(hidden, hidden) if c.classifier_pooler != "none" else 0) + linear(hidden, c.num_labels)
    return total
