"""What a checkpoint family provides, and the helpers that fill it in.

A family module defines `FAMILY = Family(...)`: the HF `model_types` it reads, `translate(hf)` (HF
config.json values -> ModelConfig values; it refuses, naming it, every setting that changes what the model
computes and that tfcli does not implement: see `refuse`), `rules`: (HF name, tfcli name) templates where
`{}` stands for a layer number and a tfcli name of None means "known, and used by no computation tfcli or
transformers runs" (a buffer either computes itself, a pretraining head tfcli does not run). Several HF
names may map to one tfcli name (stored copies): the loader reads one and checks the others are equal to
it. Then, only where needed,
`config_rules(config)` (rules that depend on the config, e.g. on its head), `prefixes` stripped from HF
names first (`bert.`), `transposed` tfcli names whose weights HF stores as (in, out), `flattened`
tfcli names that HF stores with extra dimensions of size 1 (BART's final_logits_bias, (1, V)), and
`grouped_qkv` for a fused Q/K/V projection stored per key/value head (see `grouped_qkv_rows`). The shared
loader is in `tfcli/checkpoints/__init__.py`.

`defaults`, per model_type, holds transformers' default for every config.json key `translate` reads (from that
model_type's config class in transformers 5.23; tests/test_config_defaults.py keeps them true): a key the file
leaves out takes it before `translate` runs, so an old or hand-written config.json computes what transformers
computes on it. A default that transformers derives from other keys (num_key_value_heads = num_attention_heads)
is a function of the values (see `with_defaults`). `older_numbers` names the keys, each a number, that files
written before transformers 5 hold and that `translate` reads where they are (GPT-NeoX's `rotary_emb_base`): the
loader checks their kind as it checks the kinds of the keys in `defaults`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfcli.config import ModelConfig
from tfcli.errors import TfcliError

Rule = tuple[str, str | None]  # ("h.{}.ln_1.weight", "decoder.blocks.{}.attn_norm.weight")
# transformers' names for activations tfcli computes under another name (the same function)
ACTIVATION_NAMES = {"gelu_pytorch_tanh": "gelu_new", "gelu_fast": "gelu_new", "gelu_python": "gelu", "swish": "silu"}


@dataclass(frozen=True)
class Family:
    """One checkpoint family (see the module docstring)."""

    model_types: tuple[str, ...]
    translate: Callable[[dict[str, Any]], dict[str, Any]]
    rules: tuple[Rule, ...]
    config_rules: Callable[[ModelConfig], Sequence[Rule]] | None = None
    prefixes: tuple[str, ...] = ()
    transposed: tuple[str, ...] = ()
    flattened: tuple[str, ...] = ()
    grouped_qkv: bool = False  # the fused `attn.qkv` rows are stored per key/value head: see grouped_qkv_rows
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # model_type -> {HF key: default}
    older_numbers: tuple[str, ...] = ()  # keys of files written before transformers 5 that translate reads


def with_defaults(values: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """config.json `values` over transformers' `defaults`: a constant fills a key the file leaves out; a rule
    (a function of the values, in order) fills a key left out or null, as transformers derives it then."""
    merged = {**{key: value for key, value in defaults.items() if not callable(value)}, **values}
    for key, rule in defaults.items():
        if callable(rule) and merged.get(key) is None:
            merged[key] = rule(merged)
    return merged


def kv_heads_of(hf: dict[str, Any]) -> int:
    """transformers' default num_key_value_heads where it derives it: one per attention head."""
    return hf["num_attention_heads"]


def head_dim_of(hf: dict[str, Any]) -> int:
    """transformers' default head_dim where it derives it: hidden_size / num_attention_heads."""
    return hf["hidden_size"] // hf["num_attention_heads"]


def grouped_qkv_rows(config: ModelConfig) -> list[int]:
    """The stored row of each row of tfcli's fused Q/K/V projection (all queries, then keys, then values), for a
    checkpoint that keeps them per key/value head: for each of the G groups, its n = H / G query heads, its key
    head, its value head (GPT-NeoX and Falcon without multi-query: G = H, n = 1; Falcon-40B: G = num_kv_heads;
    Falcon-7B's multi-query G = 1 is tfcli's order already)."""
    heads, groups, size = config.num_attention_heads, config.kv_heads, config.head_size
    per_group = heads // groups

    def block(group: int, slot: int) -> list[int]:  # the stored rows of one head
        start = (group * (per_group + 2) + slot) * size
        return list(range(start, start + size))

    queries = [row for h in range(heads) for row in block(h // per_group, h % per_group)]
    keys = [row for g in range(groups) for row in block(g, per_group)]
    values = [row for g in range(groups) for row in block(g, per_group + 1)]
    return queries + keys + values


def weight_bias(source: str, target: str | None) -> tuple[Rule, ...]:
    """The rules for a module's `.weight` and `.bias`: ("ln_f", "decoder.final_norm") -> two rules."""
    return tuple((f"{source}.{param}", None if target is None else f"{target}.{param}") for param in ("weight", "bias"))


def architecture_head(values: dict[str, Any], heads: dict[str, str]) -> str:
    """The head named by the config's `architectures` suffix (e.g. ForMaskedLM -> mlm); none for a bare
    ...Model; an error for a head tfcli does not run (ForQuestionAnswering, ForTokenClassification, ...)."""
    for arch in values.get("architectures") or []:
        for suffix, head in heads.items():
            if str(arch).endswith(suffix):
                return head
        if not str(arch).endswith("Model"):
            raise TfcliError(f"config.json: {arch} is not supported by tfcli: it runs no such head",
                             f"tfcli runs the bare model and the heads {', '.join(heads)}")
    return "none"


def unsupported(family: str, what: str, hint: str = "tfcli computes what transformers' own class computes for this "
                                                   "family, and refuses what it does not implement") -> TfcliError:
    """The one-line error for a setting tfcli does not implement: `config.json: FAMILY with WHAT is not supported`."""
    return TfcliError(f"config.json: {family} with {what} is not supported by tfcli", hint)


def refuse(values: dict[str, Any], family: str, supported: dict[str, Any]) -> None:
    """Refuse, naming it, a setting that changes the computation and that tfcli does not implement:
    `supported` maps HF config keys to the value (or tuple of values) tfcli implements; an absent key
    takes transformers' default, which tfcli implements."""
    for key, allowed in supported.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if key in values and values[key] not in allowed:
            raise unsupported(family, f"`{key}: {json.dumps(values[key])}`",
                              f"tfcli implements {key} = {' or '.join(json.dumps(a) for a in allowed)}")


def common(values: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The fields most HF configs share, named as ModelConfig names them; families override the rest."""
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "layer_norm_eps", "pad_token_id", "bos_token_id", "eos_token_id",
            "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
            "tie_word_embeddings", "forced_bos_token_id", "forced_eos_token_id")
    out = {key: values[key] for key in keep if key in values}
    id2label = values.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            out["labels"] = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except (TypeError, ValueError):
            raise TfcliError("config.json: `id2label` keys must be label numbers") from None
        out["num_labels"] = len(out["labels"])
    out["name"] = str(values.get("_name_or_path") or values.get("model_type"))
    out.update(overrides)
    if out.get("hidden_act") in ACTIVATION_NAMES:
        out["hidden_act"] = ACTIVATION_NAMES[out["hidden_act"]]
    if isinstance(out.get("forced_eos_token_id"), list):  # transformers forces the first of several: the lowest id
        out["forced_eos_token_id"] = min(out["forced_eos_token_id"], default=None)
    vocab = out.get("vocab_size")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id",
                "forced_eos_token_id"):
        value = out.get(key)
        if isinstance(vocab, int) and isinstance(value, list):  # several end-of-sequence ids (Llama 3)
            value = [v for v in value if not isinstance(v, int) or 0 <= v < vocab]
            out[key] = value or None
        elif isinstance(vocab, int) and isinstance(value, int) and not 0 <= value < vocab:
            out[key] = None  # transformers only warns: such a token can never be read or produced
    return {key: value for key, value in out.items() if value is not None or key.endswith("token_id")}
