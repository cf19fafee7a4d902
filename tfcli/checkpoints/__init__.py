"""Hugging Face checkpoints: one declarative `Family` per model family, one shared loader.

Each family module fills in `FAMILY = Family(...)` (see family.py): the model_types it reads,
`translate(hf)` for config.json, weight-name `rules` as templates ("h.{}.ln_1.weight" ->
"decoder.blocks.{}.attn_norm.weight", `{}` the layer number, None for "known, used by no forward
pass"), and
optionally `config_rules(config)`, name `prefixes`, `transposed` names and `flattened` names. Here
Q, K and V weights mapped to `.q/.k/.v` are read into the rows of the model's fused `qkv` (or
cross-attention `kv`) projections, and gated feed-forwards' `.gate/.up` into `gate_up`. To add a family:
write its module, add its FAMILY to FAMILIES below, and its parity cases (tests/test_sites.py's CASES among them):
docs/adding-a-family.md walks through it.

Loading is lean: the model is built on the meta device, `read_checkpoint` reads only the files' headers (with
safetensors' own reader, `safe_open`; GGUF's: checkpoints/gguf.py), and `load_checkpoint` copies each weight from
its file into a new tensor of the requested dtype on the requested device, so a load never holds more than the
weights plus one tensor in flight.

Nothing is dropped silently: a name no rule knows is an error, and where several checkpoint tensors map onto
one parameter (stored copies, a tied head) one is read and the others must equal it (see load_checkpoint).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.checkpoints import (albert, bart, bert, deberta_v2, distilbert, electra, falcon, gemma, gpt2, gpt_neox,
                               gptj, llama, marian, mbart, modernbert, mpnet, olmo2, opt, phi, phi3, roberta, t5)
from tfcli.checkpoints.family import Family, grouped_qkv_rows, with_defaults
from tfcli.config import ModelConfig, from_dict
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

FAMILIES: dict[str, Family] = {
    model_type: fam
    for fam in (bert.FAMILY, distilbert.FAMILY, roberta.FAMILY, gpt2.FAMILY, llama.FAMILY, gemma.FAMILY, phi.FAMILY,
                phi3.FAMILY, olmo2.FAMILY, gpt_neox.FAMILY, gptj.FAMILY, falcon.FAMILY, opt.FAMILY, bart.FAMILY,
                mbart.FAMILY, marian.FAMILY, t5.FAMILY, electra.FAMILY, albert.FAMILY, mpnet.FAMILY,
                deberta_v2.FAMILY, modernbert.FAMILY)
    for model_type in fam.model_types
}


def family(model_type: str, origin: str = "config") -> Family:
    if model_type not in FAMILIES:
        raise TfcliError(f"{origin}: unsupported model_type `{model_type}`",
                         f"supported model types: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def translate_hf_config(values: dict[str, Any], origin: str) -> dict[str, Any]:
    """HF config.json values -> ModelConfig values, by the family named in `model_type`; a key the file leaves
    out takes transformers' default for that model_type (the family's `defaults`)."""
    model_type = values.get("model_type")
    if not isinstance(model_type, str):
        raise TfcliError(f"{origin}: no `model_type`", "a Hugging Face config.json names its model_type")
    fam = family(model_type, origin)
    defaults = fam.defaults.get(model_type, {})
    _check_kinds(values, defaults, fam.older_numbers, origin)
    try:
        return fam.translate(with_defaults(values, defaults))
    except (TypeError, ValueError, ArithmeticError) as exc:  # e.g. zero heads, or a list where a layer count goes
        raise TfcliError(f"{origin}: cannot read it as a {model_type} config ({exc})",
                         "a value has the wrong type or is out of range: compare it with the model's published "
                         "config.json") from None


def _check_kinds(values: dict[str, Any], defaults: dict[str, Any], older_numbers: tuple[str, ...],
                 origin: str) -> None:
    """Each key whose transformers default is a number or a string holds one (or null), and so does each of the
    family's older keys that hold a number: `translate` computes with them. (A list of ids is a token id too:
    Llama 3 ends on several.)"""
    older = {key: 0.0 for key in older_numbers if key not in defaults}  # 0.0: any number, for its kind
    for key, default in {**older, **defaults}.items():
        value = values.get(key)
        if value is None or callable(default) or isinstance(default, bool):
            continue
        if isinstance(default, (int, float)):
            kind = "a number"
            fits = isinstance(value, (int, float)) and not isinstance(value, bool) or (
                key.endswith("token_id") and isinstance(value, list))
        elif isinstance(default, str):
            kind, fits = "a string", isinstance(value, str)
        else:
            continue
        if not fits:
            hint = ("an older key (config.json before transformers 5): give it a number or leave it out" if key in older
                    else f"transformers' default for it is {json.dumps(default)}")
            raise TfcliError(f"{origin}: `{key}` must be {kind}, got {json.dumps(value)}", hint)


# what transformers' generate takes from generation_config.json, beside config.json, rather than from config.json
GENERATION_KEYS = ("decoder_start_token_id", "eos_token_id", "forced_bos_token_id", "forced_eos_token_id")


def read_hf_config(path: Path) -> ModelConfig:
    """Read a Hugging Face config.json and translate it for its model_type. The token ids that steer generation
    come from generation_config.json beside it, where there is one, as transformers' generate takes them from
    it (Phi-3's instruct models end at <|end|>, listed there only; mBART-50's target language is forced there)."""
    values = _read_json(path)
    generation = path.with_name("generation_config.json")
    if path.name == "config.json" and generation.is_file():
        settings = _read_json(generation)
        values = {**values, **{key: settings[key] for key in GENERATION_KEYS if key in settings}}
    return from_dict(translate_hf_config(values, str(path)), origin=str(path))


def _read_json(path: Path) -> dict[str, Any]:
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
    return values


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checkpoint, not read yet: its shape and dtype, and `read(out=None)`, which returns
    it (into `out`, a contiguous CPU tensor of the same dtype and size, when given; of any dtype when `casts`:
    a GGUF tensor, dequantized a slice at a time into it)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    read: Callable[..., Tensor]
    casts: bool = False


def read_checkpoint(path: Path) -> dict[str, StoredTensor]:
    """Every tensor of a checkpoint by name, none of them read yet: safetensors (one file or an index of
    shards) or, only through torch.load(weights_only=True), which refuses pickled code, a .bin file or index;
    or a GGUF file (tfcli.checkpoints.gguf_hf: its tensors under their Hugging Face names, dequantized as read)."""
    if is_gguf(path):
        from tfcli.checkpoints.gguf_hf import read_tensors

        return read_tensors(path)
    files = [path]
    if path.name.endswith(".index.json"):
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
            files = [path.parent / name for name in dict.fromkeys(index["weight_map"].values())]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TfcliError(f"{path}: not a valid checkpoint index ({exc})") from None
    tensors: dict[str, StoredTensor] = {}
    for file in files:
        tensors.update(_read_safetensors(file) if file.suffix == ".safetensors" else _read_bin(file))
    return tensors


def is_gguf(path: Path) -> bool:
    """Whether `path` is a GGUF file: named .gguf, or starting with its magic (Ollama's blobs have no suffix)."""
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


# the dtypes of a safetensors header that tfcli reads, as torch names them
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                      "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def _read_safetensors(file: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file holds, none read yet, as safetensors' own reader (`safe_open`) finds them: it
    checks the header (its size, the JSON, each tensor's dtype, shape and offsets, which must tile the data to the
    file's end). Each tensor is read later on its own (see `_read_tensor`), from where the header puts it."""
    import torch

    with _safe_open(file) as f:
        names = list(f.keys())
        slices = {name: f.get_slice(name) for name in names}
    with open(file, "rb") as raw:  # the header safe_open checked: where each tensor's bytes begin
        size = int.from_bytes(raw.read(8), "little")
        header = json.loads(raw.read(size))
    tensors = {}
    for name in names:
        stored = slices[name]
        dtype = SAFETENSORS_DTYPES.get(stored.get_dtype())
        if dtype is None:
            raise TfcliError(f"{file}: tensor {name} is stored as {stored.get_dtype()}, which tfcli does not read",
                             f"tfcli reads the dtypes {', '.join(SAFETENSORS_DTYPES)}")
        start = 8 + size + header[name]["data_offsets"][0]
        tensors[name] = StoredTensor(tuple(stored.get_shape()), getattr(torch, dtype),
                                     functools.partial(_read_tensor, file, name, start))
    return tensors


def _read_tensor(file: Path, name: str, start: int, out: Tensor | None = None) -> Tensor:
    """Tensor `name` of a safetensors file (its bytes from `start`), read into `out` (a contiguous CPU tensor of its
    dtype and size) straight from the file; without `out`, a new tensor (safe_open's get_tensor). The file is opened
    for this tensor alone and closed after, so that nothing of it stays in the process's memory. (Reading into `out`
    through get_tensor made each weight a tensor of its own first, then copied it: 28 MB more at the peak of a
    0.31 B bfloat16 load, benchmarks/sharded_load.py.)"""
    import torch

    if out is None:
        with _safe_open(file) as f:
            return f.get_tensor(name)
    buffer = out.view(-1).view(torch.uint8).numpy()
    try:
        with open(file, "rb") as raw:
            raw.seek(start)
            read = raw.readinto(buffer)
    except OSError as exc:
        raise cannot_read(file, exc) from None
    if read != buffer.nbytes:
        raise TfcliError(f"{file}: cannot read tensor {name}: the file ends early",
                         "the file is truncated or corrupted: download or save it again")
    return out


@contextlib.contextmanager
def one_thread():
    """Torch on one thread while weights are copied from their files: a copy of a few MB is quicker on one thread
    than waking the others (on a busy machine, many times so: a 0.62 GB bfloat16 load took 1.4-2.1 s of CPU on two
    threads, 0.8-1.0 s on one, at load 8 on 2 cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def cannot_read(file: Path, exc: OSError) -> TfcliError:
    """The error of a file the system would not read (missing, a folder, no permission)."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return TfcliError(f"cannot read {file}: {reason}", "check the path and its permissions")


@contextlib.contextmanager
def _safe_open(file: Path):
    """`safe_open(file)` (framework pt), its errors one line: a corrupted or truncated file, or an unreadable one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as f:
            yield f
    except SafetensorError as exc:
        detail = str(exc).removeprefix("Error while deserializing header: ").splitlines()[0]
        raise TfcliError(f"{file}: cannot read the safetensors file ({detail})",
                         "the file is truncated or corrupted: download or save it again") from None
    except OSError as exc:
        raise cannot_read(file, exc) from None


def _read_bin(file: Path) -> dict[str, StoredTensor]:
    """The tensors of a .bin checkpoint, memory-mapped by torch.load(weights_only=True, mmap=True) (files
    older than torch's zip format are read whole)."""
    import torch

    def load(mmap: bool):
        with warnings.catch_warnings():  # torch warns about pickle protocols; the error below says enough
            warnings.simplefilter("ignore")
            return torch.load(str(file), map_location="cpu", weights_only=True, mmap=mmap)

    try:
        try:
            state = load(mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = load(mmap=False)
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
        raise TfcliError(f"{file}: does not hold a dictionary of tensors",
                         "tfcli reads a model's weights as save_pretrained writes them; save a training checkpoint's "
                         "model.state_dict() on its own")
    return {name: StoredTensor(tuple(t.shape), t.dtype, functools.partial(_copy_into, t)) for name, t in state.items()}


def _copy_into(tensor: Tensor, out: Tensor | None = None) -> Tensor:
    return tensor if out is None else out.copy_(tensor.view(out.shape))


def map_names(names: Iterable[str], config: ModelConfig) -> tuple[dict[str, list[str]], list[str]]:
    """HF checkpoint names -> {tfcli name: the HF names that map onto it}, Q/K/V still apart as `.q/.k/.v`
    (see `pieces`), and the HF names no rule knows. A tfcli name with several HF names has copies in the
    checkpoint (BART's `shared` and its stacks' `embed_tokens`): the loader reads one and checks the others
    are equal to it."""
    fam = family(config.model_type)
    rules = [*fam.rules, *(fam.config_rules(config) if fam.config_rules else ())]
    renamed: dict[str, list[str]] = {}
    unknown: list[str] = []
    for name in names:
        bare = next((name[len(p):] for p in fam.prefixes if name.startswith(p)), name)
        for source, target in rules:
            match = _template(source).fullmatch(bare)
            if match:
                if target is not None:
                    renamed.setdefault(target.format(*match.groups()), []).append(name)
                break
        else:
            unknown.append(name)
    return renamed, unknown


@functools.cache
def _template(template: str) -> re.Pattern[str]:
    """A name template as a regex: "h.{}.ln_1.weight" matches h.0.ln_1.weight, with the layer number as a group."""
    return re.compile(r"(\d+)".join(re.escape(part) for part in template.split("{}")))


FUSED = ((".qkv.", ("q", "k", "v")), (".kv.", ("k", "v")), (".gate_up.", ("gate", "up")))


def pieces(name: str, renamed: dict[str, list[str]]) -> list[str] | None:
    """The tfcli-named checkpoint tensors that make the model parameter `name`, stacked along the rows:
    itself, or for fused projections `X.qkv.P` <- X.q.P, X.k.P, X.v.P, `X.kv.P` <- X.k.P, X.v.P and
    `X.gate_up.P` <- X.gate.P, X.up.P. None when the checkpoint lacks one."""
    if name in renamed:
        return [name]
    for fused, parts in FUSED:
        if fused in name:
            stem, param = name.rsplit(fused, 1)
            wanted = [f"{stem}.{part}.{param}" for part in parts]
            return wanted if all(w in renamed for w in wanted) else None
    return None


def load_checkpoint(model: nn.Module, path: Path, dtype: torch.dtype | None = None,
                    device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """The parameters of `model` (built from the checkpoint's config, e.g. on the meta device) read from a HF
    checkpoint, keyed by model.named_parameters() names: each read straight from its file into a new tensor
    of `dtype` (default float32) on `device`, so a load holds the weights once plus one tensor in flight. The
    model is not changed (see tfcli.model.assign_parameters). A clear error names any weight that is
    missing, unexpected or of the wrong shape, before anything is read.

    No checkpoint tensor is dropped unless it is verified equal to the one read in its place: a parameter
    several checkpoint tensors map onto (a tied LM head and the token embeddings, BART's `shared` and its
    stacks' `embed_tokens`) is read from the first, and every other is compared with it, bit for bit."""
    import torch

    config: ModelConfig = model.config
    fam = family(config.model_type)
    stored = read_checkpoint(path)
    renamed, unknown = map_names(stored, config)

    def transposed(piece: str) -> bool:
        return any(_template(t).fullmatch(piece) for t in fam.transposed)

    def shape(piece: str) -> tuple[int, ...]:
        """A piece's shape as the model holds it: HF's (in, out) weights transposed, BART's (1, V) bias flat."""
        found = stored[renamed[piece][0]].shape
        if transposed(piece):
            return found[::-1]
        return (math.prod(found),) if piece in fam.flattened else found

    aliases: dict[int, list[str]] = {}  # a tied parameter has several names
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    plan: dict[str, list[str]] = {}
    copies: list[tuple[tuple[str, str], tuple[str, str]]] = []  # ((piece, HF name) read, (piece, HF name) equal to it)
    missing, wrong, used = [], [], set()
    for name, param in model.named_parameters():
        found_per_alias = [found for found in (pieces(alias, renamed) for alias in aliases[id(param)]) if found]
        if not found_per_alias:
            missing.append(name)
            continue
        found = found_per_alias[0]
        for other in found_per_alias:
            used.update(other)
            if len(other) != len(found):
                wrong.append(f"{name}: stored both fused and apart")
        for j, piece in enumerate(found):  # a tied parameter or a name several rules give: read once, check the rest
            sources = list(dict.fromkeys((other[j], hf) for other in found_per_alias if j < len(other)
                                         for hf in renamed[other[j]]))
            copies += [(sources[0], source) for source in sources[1:]]
        shapes = [shape(piece) for piece in found]
        if _stacked(shapes) != tuple(param.shape):
            wrong.append(f"{name} {' + '.join(map(str, shapes))} (model wants {tuple(param.shape)})")
        plan[name] = found
    unexpected = unknown + [hf for k, names in renamed.items() if k not in used for hf in names]
    for names, what in [(missing, "missing"), (unexpected, "unexpected"), (wrong, "of the wrong shape")]:
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise TfcliError(f"{path}: weights do not fit the config: {len(names)} {what}: {shown}",
                             "the weights and config.json must come from the same model")

    def as_model_holds(piece: str, hf: str) -> Tensor:
        value = stored[hf].read()
        return value.t() if transposed(piece) else value.reshape(-1) if piece in fam.flattened else value

    for (piece, kept), (copy_piece, copy) in copies:
        a, b = as_model_holds(piece, kept), as_model_holds(copy_piece, copy)
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            raise TfcliError(f"{path}: `{copy}` differs from `{kept}`, but tfcli's model holds one tensor for "
                             "both (config.json ties them), so one of them would be dropped",
                             "config.json does not describe these weights: check tie_word_embeddings (and, for "
                             "encoder-decoders, share_encoder_decoder_embeddings)")

    dtype = dtype or torch.float32
    regrouped = torch.tensor(grouped_qkv_rows(config)) if fam.grouped_qkv else None
    tensors = {}
    with one_thread():
        for name, found in plan.items():
            tensor = torch.empty(model.get_parameter(name).shape, dtype=dtype, device=device)
            row = 0
            for piece in found:
                part, rows = stored[renamed[piece][0]], tensor.narrow(0, row, shape(piece)[0])
                row += rows.shape[0]
                order = regrouped if regrouped is not None and ".attn.qkv." in piece else None
                straight = rows.is_cpu and (rows.dtype == part.dtype or part.casts) and not transposed(piece)
                if straight and order is None:
                    part.read(out=rows)  # straight from the file into the parameter
                else:  # one tensor in flight, cast, regrouped and moved as it is copied
                    value = part.read()
                    value = value.t() if transposed(piece) else value.view(rows.shape)
                    rows.copy_(value[order] if order is not None else value)
            tensors[name] = tensor
    return tensors


def _stacked(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape of tensors stacked along their rows; None when they do not stack."""
    if len(shapes) == 1:
        return shapes[0]
    if not all(len(s) and s[1:] == shapes[0][1:] for s in shapes):
        return None
    return (sum(s[0] for s in shapes), *shapes[0][1:])
