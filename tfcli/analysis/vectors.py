"""Steering vectors: their files, and the hooks that add them to a model's blocks (`steering_hooks`, for
`generate --steer` and `steer sweep`). The files hold one direction per block, `direction.{L}` added to the output of block L (0-based), in
llama.cpp's control-vector GGUF or in safetensors; written whole or not at all, and read back checked against the
model they are for.

The GGUF layout is the one llama.cpp's `common_control_vector_load` (common/common.cpp) reads and repeng's
`ControlVector.export_gguf` writes through gguf-py: GGUF version 3, little-endian; metadata
`general.architecture = "controlvector"` (string), `controlvector.model_hint` (string: the model type, e.g.
`llama`) and `controlvector.layer_count` (uint32, as repeng writes it: the number of direction tensors; llama.cpp's
own cvector-generator writes it as int32, and llama.cpp's loader never reads it); then one 1-D float32 tensor
`direction.{L}` per block, data aligned to 32 bytes (GGUF_DEFAULT_ALIGNMENT; no `general.alignment` key). llama.cpp
adds `direction.L` to `l_out` of layer L, the block's output, and refuses a whole file with a `direction.0` ("invalid
(zero) direction tensor layer index"): block 0's output cannot be steered through llama.cpp, so `write_vector`
refuses it in a GGUF. A safetensors file holds the same tensors, with the same three keys in its `__metadata__` (as
strings: safetensors' metadata is text). This module parses GGUF itself (the checkpoint reader belongs to a lower
layer, and a control vector needs none of the `gguf` package's quantized types).

Shapes: d the model width.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.errors import TfcliError, check_output_file, file_error, replace_atomically, usage_error
from tfcli.model.sites import block_site

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.model.sites import Hook

ARCHITECTURE = "controlvector"
MAGIC = b"GGUF"
MAX_NESTING = 8  # arrays of arrays in the metadata, at most (as the checkpoints' GGUF reader allows)
VERSION = 3
ALIGNMENT = 32
FORMATS = (".gguf", ".safetensors")
F32 = 0  # ggml's type id of float32
# GGUF metadata value types: struct formats of the fixed-size ones; 8 is a string, 9 an array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DIRECTION = re.compile(r"direction\.(\d+)")


# ---------------------------------------------------------------- writing


def check_output(path: Path, force: bool, layers: list[int] | None = None) -> None:
    """Before any work: a known extension, an existing folder one may write in, no existing file unless `force`, and
    (a GGUF) no block 0 among `layers`, which llama.cpp refuses."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise usage_error(f"--output {path}: unknown format `{path.suffix or '(no extension)'}`",
                          "end the file name in .gguf (llama.cpp's control vector) or .safetensors")
    check_output_file(path, force, "give a file name ending in .gguf or .safetensors")
    if layers is not None and suffix == ".gguf" and 0 in layers:
        raise usage_error("--layers includes block 0, which a llama.cpp control vector cannot hold: llama.cpp refuses "
                          "a file with a direction.0 tensor (it never steers block 0's output)",
                          "leave block 0 out (--layers 1-), or write .safetensors", parameter="layers")


def write_vector(path: Path, directions: dict[int, Tensor], model_hint: str, force: bool = False) -> None:
    """Write `directions` {block: (d,) tensor} to `path` (.gguf or .safetensors, by its extension) as float32
    `direction.{block}` tensors in block order, all or nothing (a temporary file renamed into place)."""
    import numpy as np

    path = Path(path)
    check_output(path, force, sorted(directions))
    arrays = {layer: np.ascontiguousarray(directions[layer].detach().cpu().numpy(), dtype="<f4")
              for layer in sorted(directions)}
    widths = {array.shape for array in arrays.values()}
    if not arrays or len(widths) != 1 or len(next(iter(widths))) != 1:
        raise TfcliError(f"a steering vector needs one direction of one width per block, got shapes {sorted(widths)}")
    if path.suffix.lower() == ".gguf":
        data = gguf_bytes(arrays, model_hint)
        replace_atomically(path, lambda temporary: Path(temporary).write_bytes(data))
    else:
        from safetensors.numpy import save_file

        metadata = {"general.architecture": ARCHITECTURE, "controlvector.model_hint": model_hint,
                    "controlvector.layer_count": str(len(arrays))}
        tensors = {f"direction.{layer}": array for layer, array in arrays.items()}
        replace_atomically(path, lambda temporary: save_file(tensors, temporary, metadata))


def gguf_bytes(arrays: dict[int, Any], model_hint: str) -> bytes:
    """A control-vector GGUF file of `arrays` {block: (d,) little-endian float32 numpy array}, as gguf-py's
    GGUFWriter lays it out: the header, the metadata, the tensor infos, zero padding to ALIGNMENT, then each tensor's
    data, each padded to ALIGNMENT."""
    def string(text: str) -> bytes:
        raw = text.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw

    metadata = [("general.architecture", _STRING, string(ARCHITECTURE)),
                (f"{ARCHITECTURE}.model_hint", _STRING, string(model_hint)),
                (f"{ARCHITECTURE}.layer_count", _UINT32, struct.pack("<I", len(arrays)))]
    out = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(arrays), len(metadata)))
    for key, kind, value in metadata:
        out += string(key) + struct.pack("<I", kind) + value
    offset, data = 0, bytearray()
    for layer, array in arrays.items():
        out += string(f"direction.{layer}") + struct.pack("<I", 1) + struct.pack("<Q", array.shape[0])
        out += struct.pack("<IQ", F32, offset)
        raw = array.tobytes()
        data += raw + bytes(_padding(len(raw)))
        offset += len(raw) + _padding(len(raw))
    out += bytes(_padding(len(out)))
    return bytes(out + data)


def _padding(size: int) -> int:
    return -size % ALIGNMENT


# ---------------------------------------------------------------- reading


def load_vector(path: str | Path, config: ModelConfig | None = None) -> dict[int, Tensor]:
    """A steering vector file (.gguf or .safetensors, told apart by their first bytes) -> {block: (d,) float32
    tensor}. With `config`, each block and the width are checked against the model's: a GGUF that is a model, not a
    control vector, a direction of another width or for a block the model does not have is a one-line TfcliError
    naming why. `SAE#N`: feature N's decoder row of the SAE in folder SAE, which must read a block's output
    (`blocks.L.resid_post`): {L: W_dec[N]}."""
    if "#" in str(path) and not Path(path).exists():
        return feature_vector(str(path), config)
    path = Path(path)
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except FileNotFoundError:
        raise file_error(f"steering vector {path}: no such file") from None
    except IsADirectoryError:
        raise file_error(f"steering vector {path} is a folder, not a file") from None
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror or exc}") from None
    directions = _read_gguf(path) if start == MAGIC else _read_safetensors(path)
    if config is not None:
        check_vector(path, directions, config)
    return directions


def feature_vector(spec: str, config: ModelConfig | None) -> dict[int, Tensor]:
    """`SAE#N` -> {L: W_dec[N]} for an SAE on `blocks.L.resid_post` (tfcli/analysis/sae.py), or for a transcoder
    standing for what block L's MLP adds to the residual stream (its output `blocks.L.mlp.out` in a pre-norm block,
    `blocks.L.mlp_output_norm.out` in a sandwich): the feature made S more active adds S W_dec[N] to the MLP's
    output, its reconstruction and error otherwise kept, which is S W_dec[N] added to block L's output."""
    from tfcli.analysis.sae import check_fit, read_sae

    path, _, number = spec.rpartition("#")
    sae = read_sae(path)
    if config is not None:
        from tfcli.model.transformer import site_shapes

        check_fit(sae, site_shapes(config))
    match = re.fullmatch(r"blocks\.(\d+)\.resid_post", sae.site) if not sae.site_out else \
        re.fullmatch(r"blocks\.(\d+)\.(?:mlp_output_norm\.out|mlp\.out)", sae.site_out)
    added = config is not None and config.norm_position == "pre"  # the block adds mlp.out as it is
    if match is None or (sae.site_out.endswith(".mlp.out") and not added):
        raise usage_error(f"steering by {spec}: the SAE reads {sae.site}" + (f" and writes {sae.site_out}" if
                          sae.site_out else "") + ", and steering adds to a block's output (an SAE on "
                          "blocks.L.resid_post, or a transcoder of what block L's MLP adds to it)")
    if not number.isdigit() or int(number) >= sae.d_sae:
        raise usage_error(f"steering by {spec}: give SAE#N, N a feature from 0 to {sae.d_sae - 1}")
    return {int(match[1]): sae.weights["W_dec"][int(number)].clone()}


def check_vector(path: Path, directions: dict[int, Tensor], config: ModelConfig) -> None:
    """Refuse a vector whose width is not the model's or that names a block the model does not have."""
    width, layers = config.hidden_size, config.num_hidden_layers
    for layer, direction in directions.items():
        if direction.shape[0] != width:
            raise file_error(f"steering vector {path} is {direction.shape[0]} wide (direction.{layer}) and "
                             f"{config.name} is {width} wide", "fit a vector on this model (tfcli steer fit)")
        if layer >= layers:
            raise file_error(f"steering vector {path} has direction.{layer}, and {config.name} has {layers} blocks "
                             f"(0 to {layers - 1})", "fit a vector on this model (tfcli steer fit)")


def _read_safetensors(path: Path) -> dict[int, Tensor]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            names = list(f.keys())
            tensors = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError, ValueError) as exc:
        raise TfcliError(f"{path}: neither a GGUF control vector nor a safetensors file ({exc})",
                         "give a vector written by `tfcli steer fit` (.gguf or .safetensors)") from None
    architecture = metadata.get("general.architecture")
    if architecture is not None and architecture != ARCHITECTURE:
        raise file_error(f"{path} is not a control vector: its general.architecture is `{architecture}`")
    return _directions(path, tensors)


def _directions(path: Path, tensors: dict[str, Tensor]) -> dict[int, Tensor]:
    import torch

    directions: dict[int, Tensor] = {}
    for name, tensor in tensors.items():
        match = _DIRECTION.fullmatch(name)
        if match is None:
            raise file_error(f"{path}: tensor `{name}` is not a direction (a control vector holds direction.N "
                             "tensors only)")
        if tensor.dim() != 1:
            raise file_error(f"{path}: {name} has shape {list(tensor.shape)}: a direction is one vector")
        directions[int(match.group(1))] = tensor.to(torch.float32)
    if not directions:
        raise file_error(f"{path} holds no direction: a control vector holds direction.N tensors")
    return dict(sorted(directions.items()))


class _Reader:
    """Values read in order from a GGUF file's bytes (little-endian)."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def unpack(self, fmt: str) -> Any:
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("Q")
        if self.pos + length > len(self.data):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        text = self.data[self.pos:self.pos + length].decode("utf-8")
        self.pos += length
        return text

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("I"), self.unpack("Q")
            if count > len(self.data):
                raise ValueError(f"an array claims {count} items")
            if depth >= MAX_NESTING:  # a hostile file nests arrays until the interpreter's stack runs out
                raise ValueError(f"arrays nested more than {MAX_NESTING} deep")
            return [self.value(item, depth + 1) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


def _read_gguf(path: Path) -> dict[int, Tensor]:
    """A control-vector GGUF's directions. The metadata is read up to general.architecture first: a model's GGUF is
    refused before its vocabulary is parsed."""
    import numpy as np
    import torch

    data = path.read_bytes()

    def broken(detail: str) -> TfcliError:
        return TfcliError(f"{path}: cannot read the GGUF file ({detail})",
                          "the file is truncated or corrupted: write it again")

    try:
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
        if version not in (2, 3):
            raise TfcliError(f"{path}: GGUF version {version} is not supported",
                             "tfcli reads little-endian GGUF files of version 2 or 3, as llama.cpp writes them")
        reader = _Reader(data, 24)
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = reader.string()
            if key in metadata:
                raise ValueError(f"the key {key} is given twice")
            metadata[key] = reader.value(reader.unpack("I"))
            if key == "general.architecture" and metadata[key] != ARCHITECTURE:
                raise usage_error(f"{path} is a {metadata[key]} model, not a control vector (its "
                                  f"general.architecture is `{metadata[key]}`, not `{ARCHITECTURE}`)",
                                  "give a steering vector file (tfcli steer fit --output x.gguf writes one)")
        if metadata.get("general.architecture") is None:
            raise file_error(f"{path} is not a control vector: its metadata names no general.architecture")
        entries = []
        for _ in range(tensor_count):
            name = reader.string()
            dims = [reader.unpack("Q") for _ in range(reader.unpack("I"))]
            kind, offset = reader.unpack("I"), reader.unpack("Q")
            if name in (entry[0] for entry in entries):
                raise ValueError(f"the tensor {name} is given twice")
            entries.append((name, dims, kind, offset))
        alignment = metadata.get("general.alignment", ALIGNMENT)
        if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment is {alignment!r}, not a power of two")
        start = -(-reader.pos // alignment) * alignment
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise broken(f"its header ends early or is malformed: {exc}") from None
    tensors = {}
    for name, dims, kind, offset in entries:
        if kind != F32:
            raise usage_error(f"{path}: {name} has ggml type {kind}, not F32: llama.cpp reads float32 directions only")
        count = math.prod(dims)  # Python's integers: numpy's product wraps around on a hostile shape
        first = start + offset
        if first + 4 * count > len(data):
            raise broken(f"tensor {name} ends after the end of the file")
        values = np.frombuffer(data, dtype="<f4", count=count, offset=first)
        tensors[name] = torch.from_numpy(values.copy()).reshape(list(reversed(dims)))
    return _directions(path, tensors)


# ---------------------------------------------------------------- applying them: hooks on the blocks' outputs


def check_model(config: ModelConfig) -> None:
    """Refuse, before a model is built, a model whose blocks' outputs are not one residual stream to steer."""
    if config.architecture == "encoder-decoder":
        raise usage_error(f"{config.name} is an encoder-decoder: steer reads and steers one stack's residual stream",
                          "use a decoder-only model (llama.cpp's control vectors are for those)")


def steering_hooks(model: TransformerModel, vectors: list[dict[int, Tensor]], strengths: list[float],
                   normalize: bool = False, layers: list[int] | None = None) -> dict[str, Hook]:
    """Hooks {`blocks.{L}.resid_post`: hook} that add sum_i strengths[i] * vectors[i][L] to block L's output at every
    position (prompt and generated: the hook runs on every pass), as llama.cpp adds a control vector to `l_out` and
    repeng's ControlModel to the decoder layer's output. `layers`: only these blocks (default: every block a vector
    has). `normalize`: each position keeps the norm it had before (repeng's `normalize=True`). For
    `model.run_with_hooks` and the generation loop."""
    import torch

    if len(vectors) != len(strengths):
        raise ValueError("one strength per vector")
    total: dict[int, Tensor] = {}
    for vector, strength in zip(vectors, strengths):
        for layer, values in vector.items():
            if layers is not None and layer not in layers:
                continue
            added = values.to(torch.float32) * float(strength)
            total[layer] = total[layer] + added if layer in total else added
    config = model.config
    check_model(config)
    hooks: dict[str, Hook] = {}
    for layer, added in sorted(total.items()):
        if not 0 <= layer < config.num_hidden_layers or added.shape != (config.hidden_size,):
            raise usage_error(f"a steering vector for block {layer} of width {added.shape[-1]} does not fit "
                              f"{config.name} ({config.num_hidden_layers} blocks, {config.hidden_size} wide)")
        hooks[block_site(layer, "resid_post")] = _adding(added, normalize)
    return hooks


def _adding(added: Tensor, normalize: bool) -> Hook:
    def hook(value: Tensor) -> Tensor:
        steered = value + added.to(value)
        if normalize:
            steered = steered / steered.norm(dim=-1, keepdim=True) * value.norm(dim=-1, keepdim=True)
        return steered

    return hook
