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
POSITIONS = ("learned", "sinusoidal", "sinusoidal_halves", "rotary", "none")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_plus_one")
NORM_POSITIONS = ("pre", "post", "sandwich", "sublayer_output")
FEED_FORWARDS = ("mlp", "gated")
HEADS = ("none", "mlm", "lm", "classifier", "discriminator")
CLASSIFIER_POOLERS = ("none", "tanh", "relu", "gelu")
QK_NORMS = ("none", "head", "projection")
LAYER_TYPES = ("full_attention", "sliding_attention")
# rope_scaling: the keys each RoPE scaling type takes (the first ones required), as Hugging Face names them
ROPE_SCALING_KEYS = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor", "original_max_position_embeddings"), ("factor", "attention_factor")),
}


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
    num_hidden_groups: int | None = None  # blocks sharing weights: block i runs group int(i / (layers / groups))
    # (ALBERT: 1, one block's weights at every depth); None = every block its own
    embedding_size: int | None = None  # embeddings this wide, then projected to hidden_size by a linear layer
    # (ALBERT, ELECTRA); None = hidden_size, no projection
    num_attention_heads: int = 12
    num_key_value_heads: int | None = None  # grouped-query attention; None = num_attention_heads
    head_dim: int | None = None  # size of each head; None = hidden_size / num_attention_heads
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # segment embeddings; 0 = none
    hidden_act: str = "gelu"
    norm: str = "layernorm"
    norm_bias: bool = True  # LayerNorms with a bias (ModernBERT's have none)
    norm_position: str = "post"  # post: norm(x + f(x)); pre: x + f(norm(x)); sandwich: x + norm(f(norm(x)));
    # sublayer_output: x + norm(f(x))
    layer_norm_eps: float = 1e-12
    position: str = "learned"
    position_offset: int = 0  # learned positions start here (RoBERTa: pad + 1, BART: 2)
    relative_attention_num_buckets: int = 0  # > 0: a learned bias per head and relative-distance bucket (T5)
    relative_attention_max_distance: int = 128  # distances from here on share the last bucket
    relative_attention: bool = False  # DeBERTa's disentangled attention (model/disentangled.py), encoders only:
    pos_att_type: list[str] = field(default_factory=list)  # its position terms: c2p, p2c
    position_buckets: int = 0  # relative distances bucketed logarithmically beyond half of this; 0 = exact
    max_relative_positions: int = 0  # the furthest distance told apart (the table's span without buckets)
    share_att_key: bool = False  # the position terms use the attention's own query and key projections
    norm_rel_ebd: bool = False  # a LayerNorm on the relative position embeddings
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0  # rotary positions on this fraction of each head's dimensions (the first ones)
    rotary_interleaved: bool = False  # rotate adjacent pairs of dimensions (GPT-J), not the two halves (Llama)
    rope_scaling: dict[str, Any] | None = None  # {rope_type: linear|dynamic|llama3|yarn|longrope, factor: ..., ...}
    local_rope_theta: float | None = None  # rotary base of the sliding-window layers; None = rope_theta
    sliding_window: int | None = None  # a query sees this many most recent positions, itself included
    layer_types: list[str] = field(default_factory=list)  # full_attention | sliding_attention per layer; empty:
    # every layer slides when sliding_window is set
    query_pre_attn_scalar: float | None = None  # attention scores scaled by its -1/2 power; None = head_dim's
    attn_logit_softcapping: float | None = None  # scores -> cap * tanh(scores / cap) before the mask and softmax
    final_logit_softcapping: float | None = None  # the same on the LM head's logits
    qk_norm: str = "none"  # none | head (a norm over each head of q and k) | projection (over all of q, all of k)
    parallel_residual: bool = False  # x + attention(norm(x)) + feed_forward(norm2(x)) in one step
    shared_block_norm: bool = False  # parallel blocks: attention and feed-forward read the same norm(x)
    embedding_norm: bool = True  # LayerNorm on the embeddings (BERT, BART)
    first_block_attention_norm: bool = True  # false: the first block's attention reads the embeddings as they
    # are, already normed (ModernBERT)
    scale_embedding: bool = False  # multiply token embeddings by sqrt(hidden_size) (BART option)
    word_embed_proj_dim: int | None = None  # decoders: token embeddings this wide, projected to hidden_size before the
    # positions are added and back after the final norm (OPT-350m's project_in, project_out); None = hidden_size
    final_norm: bool = False  # a norm after the last block (pre-norm stacks: GPT-2, Llama)
    feed_forward: str = "mlp"  # mlp | gated (SiLU-gated, Llama)
    attention_bias: bool = True  # biases on the Q/K/V projections
    attention_out_bias: bool = True  # bias on the attention output projection
    mlp_bias: bool = True
    head: str = "none"  # none | mlm | lm | classifier | discriminator (a score per token: ELECTRA)
    head_act: str | None = None  # the activation in the MLM head's transform; None = hidden_act (RoBERTa: gelu)
    tie_word_embeddings: bool = True  # the LM head is the (decoder's) token embedding
    share_encoder_decoder_embeddings: bool = True  # encoder-decoder: one token embedding for both stacks
    scale_decoder_outputs: bool = False  # LM head input scaled by hidden_size ** -0.5 (T5 with a tied head)
    lm_head_bias: bool = False  # a bias on the unembedding (MLM decoders, BART's final_logits_bias)
    num_labels: int = 2
    labels: list[str] = field(default_factory=list)
    classifier_pooler: str = "tanh"  # dense + activation on the first token before the classifier
    classifier_pooling: str = "cls"  # cls: the first token; mean: the mean of the real tokens (ModernBERT)
    classifier_norm: bool = False  # a norm after the pooler's activation (ModernBERT)
    classifier_bias: bool = True  # a bias on the pooler's dense layer and the MLM head's (ModernBERT: none)
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    pad_token_id: int | None = 0
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None  # several ids: any of them ends a generation
    decoder_start_token_id: int | None = None
    forced_bos_token_id: int | None = None  # generate's first new token when the sequence so far is one token
    forced_eos_token_id: int | None = None  # generate's last new token when max_new_tokens is reached

    @property
    def head_size(self) -> int:
        """The size of each attention head: head_dim, else hidden_size / num_attention_heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """How many dimensions of each head rotary positions rotate (the first ones)."""
        return int(self.head_size * self.partial_rotary_factor)

    @property
    def eos_token_ids(self) -> list[int]:
        """Every end-of-sequence id (eos_token_id may be one id or a list)."""
        eos = self.eos_token_id
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def sliding_layers(self, num_layers: int) -> list[bool]:
        """For each of a stack's layers, whether it attends through the sliding window."""
        if self.sliding_window is None:
            return [False] * num_layers
        if not self.layer_types:
            return [True] * num_layers
        return [kind == "sliding_attention" for kind in self.layer_types]

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def decoder_layers(self) -> int:
        return self.num_decoder_layers or self.num_hidden_layers

    @property
    def output_layers(self) -> int:
        """Blocks of the output stack (the decoder when there is one): what --layers indexes."""
        return self.decoder_layers if self.architecture == "encoder-decoder" else self.num_hidden_layers

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
    "classifier_pooling": ("cls", "mean"),
    "qk_norm": QK_NORMS,
}
POSITIVE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "embedding_size", "num_hidden_groups",
            "max_position_embeddings", "num_labels", "num_decoder_layers", "num_key_value_heads", "head_dim",
            "sliding_window", "local_rope_theta", "query_pre_attn_scalar", "attn_logit_softcapping",
            "final_logit_softcapping", "word_embed_proj_dim")


# Other libraries' names for our fields: spelling similarity alone would suggest e.g. num_labels for num_layers.
ALIASES = {
    "num_layers": "num_hidden_layers", "n_layer": "num_hidden_layers", "n_layers": "num_hidden_layers",
    "layers": "num_hidden_layers", "num_heads": "num_attention_heads", "n_head": "num_attention_heads",
    "n_heads": "num_attention_heads", "heads": "num_attention_heads", "d_model": "hidden_size",
    "n_embd": "hidden_size", "dim": "hidden_size", "d_ff": "intermediate_size", "n_inner": "intermediate_size",
    "dim_feedforward": "intermediate_size", "ffn_dim": "intermediate_size", "n_positions": "max_position_embeddings",
    "n_ctx": "max_position_embeddings", "num_kv_heads": "num_key_value_heads", "activation": "hidden_act",
    "activation_function": "hidden_act", "layer_norm_epsilon": "layer_norm_eps", "rms_norm_eps": "layer_norm_eps",
    "rotary_pct": "partial_rotary_factor", "rope_parameters": "rope_scaling",
    "rope_local_base_freq": "local_rope_theta", "use_parallel_residual": "parallel_residual",
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
    if kind.startswith("int | list[int]"):
        is_id = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
        if not (is_id(value) or isinstance(value, list) and value and all(is_id(v) for v in value)):
            raise wrong
    elif kind.startswith("int"):
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
        if any(isinstance(v, bool) for v in value):  # YAML 1.1 reads yes/no/on/off as true/false
            wrong.hint = ("YAML reads yes, no, on, off, true and false as booleans: quote them, "
                          f"e.g. `{key}: ['no', 'yes']`")
            raise wrong
        value = [str(v) for v in value]
    elif kind.startswith("dict"):
        if not isinstance(value, dict):
            raise wrong
        value = dict(value)
    return value


def _describe(kind: str) -> str:
    base = kind.replace(" | None", "")
    words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
             "list[str]": "a list of names", "int | list[int]": "a token id or a list of them",
             "dict[str, Any]": "a mapping"}
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
    if c.head_dim is None and c.hidden_size % c.num_attention_heads:
        raise TfcliError(
            f"{origin}: hidden_size {c.hidden_size} is not divisible by num_attention_heads {c.num_attention_heads}",
            "each head gets hidden_size / num_attention_heads dimensions: pick sizes that divide evenly, "
            "or set `head_dim`")
    if c.num_attention_heads % c.kv_heads:
        raise TfcliError(
            f"{origin}: num_attention_heads {c.num_attention_heads} is not a multiple of "
            f"num_key_value_heads {c.kv_heads}", "each key/value head serves a whole group of query heads")
    _check_rotary(c, origin)
    _check_attention_variants(c, origin)
    buckets = c.relative_attention_num_buckets
    if buckets and (buckets < 4 or c.relative_attention_max_distance <= buckets // 2):
        raise TfcliError(f"{origin}: relative positions need relative_attention_num_buckets >= 4 (or 0 for none) and "
                         f"relative_attention_max_distance > half of them, got {buckets} and "
                         f"{c.relative_attention_max_distance}", "T5 uses 32 buckets and a max distance of 128")
    if not c.first_block_attention_norm and c.norm_position != "pre":
        raise TfcliError(f"{origin}: first_block_attention_norm: false needs norm_position: pre",
                         "only a pre-norm block reads its input through its attention norm")
    if c.relative_attention:
        if c.architecture != "encoder":
            raise TfcliError(f"{origin}: relative_attention (DeBERTa's) is implemented for encoders only")
        if not set(c.pos_att_type) <= {"c2p", "p2c"}:
            raise TfcliError(f"{origin}: pos_att_type takes c2p and p2c, got {c.pos_att_type}")
        if c.max_relative_positions < 1 or c.position_buckets < 0 or c.position_buckets == 1:
            raise TfcliError(f"{origin}: relative_attention needs max_relative_positions >= 1 and position_buckets "
                             f"0 (exact distances) or >= 2, got {c.max_relative_positions} and {c.position_buckets}")
    if c.position in ("sinusoidal", "sinusoidal_halves") and c.hidden_size % 2:
        raise TfcliError(f"{origin}: sinusoidal positions need an even hidden_size, got {c.hidden_size}")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
        value = getattr(c, key)
        if value is not None and not 0 <= value < 1:
            raise TfcliError(f"{origin}: `{key}` must be in [0, 1), got {value}")
    if c.layer_norm_eps <= 0 or c.rope_theta <= 0:
        raise TfcliError(f"{origin}: `layer_norm_eps` and `rope_theta` must be positive")
    if c.labels and len(c.labels) != c.num_labels:
        raise TfcliError(f"{origin}: {len(c.labels)} labels given but num_labels is {c.num_labels}",
                         "give one name per label, or leave `num_labels` out to count them")
    groups, layers = c.num_hidden_groups, min(c.num_hidden_layers, c.decoder_layers)
    if groups is not None and groups > layers:
        raise TfcliError(f"{origin}: num_hidden_groups {groups} is more than the {layers} layers that share them",
                         "a group is a block whose weights several consecutive layers use")
    if c.embedding_size is not None and c.word_embed_proj_dim is not None:
        raise TfcliError(f"{origin}: embedding_size (all embeddings narrower, then projected: ALBERT) and "
                         "word_embed_proj_dim (token embeddings projected in and out: OPT) exclude each other")
    if c.embedding_size not in (None, c.hidden_size) and c.head == "lm":
        raise TfcliError(f"{origin}: an `lm` head reads the hidden state through the token embeddings, so "
                         f"embedding_size ({c.embedding_size}) must equal hidden_size ({c.hidden_size})",
                         "an `mlm` head projects the hidden state down to embedding_size first")
    if c.head == "lm" and c.architecture == "encoder":
        raise TfcliError(f"{origin}: head `lm` needs a decoder (architecture decoder or encoder-decoder)",
                         "an encoder predicts masked tokens with head `mlm`")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
                "forced_eos_token_id"):
        value = getattr(c, key)
        for token in value if isinstance(value, list) else [value]:
            if token is not None and not 0 <= token < c.vocab_size:
                raise TfcliError(f"{origin}: `{key}` {token} is outside the vocabulary (size {c.vocab_size})")


def _check_rotary(c: ModelConfig, origin: str) -> None:
    """Rotary settings: an even number of rotated dimensions, and a rope_scaling of a known type with its keys."""
    if not 0 < c.partial_rotary_factor <= 1:
        raise TfcliError(f"{origin}: `partial_rotary_factor` must be in (0, 1], got {c.partial_rotary_factor}")
    rotary_only = ("partial_rotary_factor", "rotary_interleaved", "rope_scaling", "local_rope_theta")
    if c.position != "rotary":
        used = [key for key in rotary_only if getattr(c, key) != FIELDS[key].default]
        if used:
            raise TfcliError(f"{origin}: `{used[0]}` applies to rotary positions, and position is `{c.position}`",
                             "set `position: rotary` or leave it out")
        return
    if c.rotary_dim % 2 or c.rotary_dim == 0:
        raise TfcliError(f"{origin}: rotary positions need an even number of rotated dimensions, got {c.rotary_dim} "
                         f"(head size {c.head_size} x partial_rotary_factor {c.partial_rotary_factor})")
    if c.rope_scaling is None:
        return
    kind = c.rope_scaling.get("rope_type")
    if not isinstance(kind, str) or kind not in ROPE_SCALING_KEYS:
        raise TfcliError(f"{origin}: RoPE scaling `{kind}` is not supported by tfcli",
                         f"rope_scaling needs `rope_type`, one of: {', '.join(ROPE_SCALING_KEYS)}")
    required, optional = ROPE_SCALING_KEYS[kind]
    for key, value in c.rope_scaling.items():
        if key != "rope_type" and key not in required + optional:
            raise TfcliError(f"{origin}: RoPE scaling `{kind}` takes no `{key}`",
                             f"its keys: {', '.join(required + optional)}")
        if key in ("short_factor", "long_factor"):  # LongRoPE: one factor per rotated pair of dimensions
            if not isinstance(value, list) or len(value) != c.rotary_dim // 2 or not all(map(_positive, value)):
                raise TfcliError(f"{origin}: rope_scaling `{key}` must list {c.rotary_dim // 2} positive numbers, "
                                 "one per rotated pair of dimensions")
        elif key == "truncate" and not isinstance(value, bool):
            raise TfcliError(f"{origin}: rope_scaling `truncate` must be true or false, got {value!r}")
        elif key not in ("rope_type", "truncate") and value is not None and not _positive(value):
            raise TfcliError(f"{origin}: rope_scaling `{key}` must be a positive number, got {value!r}")
    missing = [key for key in required if c.rope_scaling.get(key) is None]
    if missing:
        raise TfcliError(f"{origin}: RoPE scaling `{kind}` needs `{missing[0]}`")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


def _check_attention_variants(c: ModelConfig, origin: str) -> None:
    """Sliding windows per layer, parallel blocks."""
    for kind in c.layer_types:
        if kind not in LAYER_TYPES:
            raise TfcliError(f"{origin}: unknown layer type `{kind}` in `layer_types`",
                             f"each layer is one of: {', '.join(LAYER_TYPES)}")
    if c.layer_types:
        counts = {c.num_hidden_layers, c.decoder_layers if c.architecture == "encoder-decoder" else c.num_hidden_layers}
        if len(counts) > 1 or len(c.layer_types) not in counts:
            raise TfcliError(f"{origin}: `layer_types` names {len(c.layer_types)} layers, the model has "
                             f"{c.num_hidden_layers}", "give one type per layer")
        if "sliding_attention" in c.layer_types and c.sliding_window is None:
            raise TfcliError(f"{origin}: `layer_types` has sliding_attention layers but no `sliding_window`",
                             "set `sliding_window` to the number of positions a query sees")
    if c.word_embed_proj_dim is not None and (c.architecture != "decoder" or c.head not in ("lm", "none")):
        raise TfcliError(f"{origin}: `word_embed_proj_dim` applies to decoders with an `lm` head or none",
                         "leave it out, or use `architecture: decoder`")
    if c.shared_block_norm and not c.parallel_residual:
        raise TfcliError(f"{origin}: `shared_block_norm` applies to parallel blocks only",
                         "set `parallel_residual: true` or leave shared_block_norm out")
    if c.parallel_residual and (c.norm_position != "pre" or c.architecture == "encoder-decoder"):
        raise TfcliError(f"{origin}: parallel blocks are pre-norm self-attention blocks",
                         "use `norm_position: pre` and an encoder or a decoder")


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
    q_size, kv_size = c.num_attention_heads * c.head_size, c.kv_heads * c.head_size

    def norm_of(size: int) -> int:
        return 2 * size if c.norm == "layernorm" and c.norm_bias else size  # RMSNorm has no bias

    def linear(inputs: int, outputs: int, bias: bool = True) -> int:
        return inputs * outputs + (outputs if bias else 0)

    norm = norm_of(hidden)
    qk_norms = {"none": 0, "head": 2 * norm_of(c.head_size), "projection": norm_of(q_size) + norm_of(kv_size)}
    self_attention = (linear(hidden, q_size + 2 * kv_size, c.attention_bias)
                      + linear(q_size, hidden, c.attention_out_bias) + qk_norms[c.qk_norm])
    if c.relative_attention and not c.share_att_key:  # DeBERTa's own position projections
        self_attention += sum(linear(hidden, q_size) for term in ("c2p", "p2c") if term in c.pos_att_type)
    cross_attention = (linear(hidden, q_size, c.attention_bias) + linear(hidden, 2 * kv_size, c.attention_bias)
                       + linear(q_size, hidden, c.attention_out_bias))
    if c.feed_forward == "gated":
        feed_forward = 2 * linear(hidden, inner, c.mlp_bias) + linear(inner, hidden, c.mlp_bias)
    else:
        feed_forward = linear(hidden, inner, c.mlp_bias) + linear(inner, hidden, c.mlp_bias)

    width = c.embedding_size or hidden  # of the embeddings

    def stack(layers: int, causal: bool, cross: bool) -> int:
        embeddings = (c.max_position_embeddings + c.position_offset) * width if c.position == "learned" else 0
        embeddings += c.type_vocab_size * width if c.type_vocab_size > 0 and not causal else 0
        embeddings += norm_of(width) if c.embedding_norm else 0
        embeddings += linear(width, hidden) if c.embedding_size is not None else 0
        embeddings += c.relative_attention_num_buckets * c.num_attention_heads
        if c.relative_attention:  # DeBERTa's relative position embeddings and their norm
            span = c.position_buckets if c.position_buckets > 0 else c.max_relative_positions
            embeddings += 2 * span * hidden + (2 * hidden if c.norm_rel_ebd else 0)
        sublayer_norms = {"pre": 1, "post": 1, "sandwich": 2, "sublayer_output": 1}[c.norm_position] * norm
        block_norms = 2 * sublayer_norms - (norm if c.shared_block_norm else 0)
        block = self_attention + feed_forward + block_norms + (cross_attention + sublayer_norms if cross else 0)
        missing = 0 if c.first_block_attention_norm else norm
        return embeddings + min(layers, c.num_hidden_groups or layers) * block - missing + (norm if c.final_norm else 0)

    token_width = c.embedding_size or c.word_embed_proj_dim or hidden  # of the token embeddings
    total = vocab * token_width
    total += 2 * token_width * hidden if c.word_embed_proj_dim else 0  # projected in and out
    if c.architecture == "encoder-decoder" and not c.share_encoder_decoder_embeddings:
        total += vocab * token_width  # the decoder's own
    if c.architecture != "decoder":
        total += stack(c.num_hidden_layers, causal=False, cross=False)
    if c.architecture != "encoder":
        layers = c.decoder_layers if c.architecture == "encoder-decoder" else c.num_hidden_layers
        total += stack(layers, causal=True, cross=c.architecture == "encoder-decoder")
    if c.head in ("mlm", "lm"):
        head_norm = 2 * width if c.norm_bias else width  # always a LayerNorm
        total += linear(hidden, width, c.classifier_bias) + head_norm if c.head == "mlm" else 0  # dense + norm
        total += 0 if c.tie_word_embeddings else vocab * token_width
        total += vocab if c.lm_head_bias else 0
    elif c.head == "classifier":
        pooler = linear(hidden, hidden, c.classifier_bias) + (norm if c.classifier_norm else 0)
        total += (pooler if c.classifier_pooler != "none" else 0) + linear(hidden, c.num_labels)
    elif c.head == "discriminator":
        total += linear(hidden, hidden) + linear(hidden, 1)
    return total
