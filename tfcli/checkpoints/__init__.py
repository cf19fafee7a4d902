"""Hugging Face checkpoints: one declarative `Family` per model family, one shared loader.

Each family module fills in `FAMILY = Family(...)` (see family.py): the model_types it reads,
`translate(hf)` for config.json, weight-name `rules` as templates ("h.{}.ln_1.weight" ->
"decoder.blocks.{}.attention_norm.weight", `{}` the layer number, None for "known, not used"), and
optionally `config_rules(config)`, name `prefixes`, `transposed` names and an `adjust` fix-up. Here
Q, K and V weights mapped to `.q/.k/.v` are fused into the model's `qkv` (or cross-attention `q` + `kv`)
projections. To add a family: write its module and add its FAMILY to FAMILIES below.
"""

from __future__ import annotations

import functools
import json
import pickle
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.checkpoints import bart, bert, distilbert, gpt2, llama, roberta
from tfcli.checkpoints.family import Family
from tfcli.config import ModelConfig, from_dict
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from torch import Tensor, nn

FAMILIES: dict[str, Family] = {
    model_type: fam
    for fam in (bert.FAMILY, distilbert.FAMILY, roberta.FAMILY, gpt2.FAMILY, llama.FAMILY, bart.FAMILY)
    for model_type in fam.model_types
}


def family(model_type: str, origin: str = "config") -> Family:
    if model_type not in FAMILIES:
        raise TfcliError(f"{origin}: unsupported model_type `{model_type}`",
                         f"supported model types: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def translate_hf_config(values: dict[str, Any], origin: str) -> dict[str, Any]:
    """HF config.json values -> ModelConfig values, by the family named in `model_type`."""
    model_type = values.get("model_type")
    if not isinstance(model_type, str):
        raise TfcliError(f"{origin}: no `model_type`", "a Hugging Face config.json names its model_type")
    return family(model_type, origin).translate(values)


def read_hf_config(path: Path) -> ModelConfig:
    """Read a Hugging Face config.json and translate it for its model_type."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TfcliError(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except UnicodeDecodeError:
        raise TfcliError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    if not isinstance(values, dict):
        raise TfcliError(f"{path}: expected a JSON object")
    return from_dict(translate_hf_config(values, str(path)), origin=str(path))


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """All tensors of a checkpoint: safetensors (one file or an index of shards) or, only through
    torch.load(weights_only=True), which refuses pickled code, a .bin file or index."""
    files = [path]
    if path.name.endswith(".index.json"):
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
            files = [path.parent / name for name in dict.fromkeys(index["weight_map"].values())]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TfcliError(f"{path}: not a valid checkpoint index ({exc})") from None
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors.update(_read_file(file))
    return tensors


def _read_file(file: Path) -> dict[str, Tensor]:
    import torch

    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(file))
        except Exception as exc:
            raise TfcliError(f"{file}: cannot read the safetensors file ({str(exc).splitlines()[0][:120]})",
                             "the file is truncated or corrupted: download or save it again") from None
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols; the error below says enough
            warnings.simplefilter("ignore")
            state = torch.load(str(file), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # weights_only refused a global or opcode: the file carries code
        found = re.search(r"[^\n]*[Uu]nsupported[^\n]*", str(exc))  # e.g. "... unsupported GLOBAL posix.system ..."
        detail = found.group(0).strip()[:160] if found else "not a plain tensor file"
        raise TfcliError(f"{file}: refused to load: it holds Python objects other than tensors ({detail}); "
                         "nothing in it was run",
                         "tfcli loads .bin files only when they hold plain tensors (torch.load weights_only=True); "
                         "prefer safetensors") from None
    except Exception as exc:
        raise TfcliError(f"{file}: cannot read the checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})",
                         "the file is truncated or corrupted: download or save it again") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TfcliError(f"{file}: does not hold a dictionary of tensors")
    return state


def map_names(state: dict[str, Tensor], config: ModelConfig) -> tuple[dict[str, Tensor], list[str]]:
    """Rename a HF state dict to tfcli's names; returns the renamed tensors and the unknown HF names."""
    fam = family(config.model_type)
    rules = [*fam.rules, *(fam.config_rules(config) if fam.config_rules else ())]
    renamed: dict[str, Tensor] = {}
    unknown: list[str] = []
    for name, tensor in state.items():
        bare = next((name[len(p):] for p in fam.prefixes if name.startswith(p)), name)
        for source, target in rules:
            match = _template(source).fullmatch(bare)
            if match:
                if target is not None:
                    renamed[target.format(*match.groups())] = tensor
                break
        else:
            unknown.append(name)
    for name in renamed:
        if any(_template(t).fullmatch(name) for t in fam.transposed):
            renamed[name] = renamed[name].t()
    if fam.adjust:
        renamed = fam.adjust(renamed, config)
    return _fuse_projections(renamed), unknown


@functools.cache
def _template(template: str) -> re.Pattern[str]:
    """A name template as a regex: "h.{}.ln_1.weight" matches h.0.ln_1.weight, with the layer number as a group."""
    return re.compile(r"(\d+)".join(re.escape(part) for part in template.split("{}")))


def _fuse_projections(renamed: dict[str, Tensor]) -> dict[str, Tensor]:
    """`X.q.P`, `X.k.P`, `X.v.P` -> `X.qkv.P` (self-attention) or `X.q.P` + `X.kv.P` (cross-attention)."""
    import torch

    fused = dict(renamed)
    for name in renamed:
        if not name.endswith((".q.weight", ".q.bias")):
            continue
        stem, param = name.rsplit(".q.", 1)
        parts = [fused.get(f"{stem}.{p}.{param}") for p in "kv"]
        if any(part is None for part in parts):
            continue
        del fused[f"{stem}.k.{param}"], fused[f"{stem}.v.{param}"]
        if ".cross_attention" in stem:
            fused[f"{stem}.kv.{param}"] = torch.cat(parts)
        else:
            fused[f"{stem}.qkv.{param}"] = torch.cat([fused.pop(name), *parts])
    return fused


def load_checkpoint(model: nn.Module, path: Path) -> None:
    """Load a HF checkpoint into a tfcli model built from its config; a clear error names any weight
    that is missing, unexpected or of the wrong shape."""
    import torch

    renamed, unknown = map_names(read_state_dict(path), model.config)
    expected = model.state_dict()
    tied = {"head.unembed.weight"} if model.config.tie_word_embeddings else set()
    missing = [k for k in expected if k not in renamed and k not in tied]
    unexpected = unknown + [k for k in renamed if k not in expected]
    wrong = [f"{k} {tuple(renamed[k].shape)} (model wants {tuple(expected[k].shape)})"
             for k in renamed if k in expected and renamed[k].shape != expected[k].shape]
    problems = [(missing, "missing"), (unexpected, "unexpected"), (wrong, "of the wrong shape")]
    for names, what in problems:
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise TfcliError(f"{path}: weights do not fit the config: {len(names)} {what}: {shown}",
                             "the weights and config.json must come from the same model")
    with torch.no_grad():
        model.load_state_dict(renamed, strict=False)
