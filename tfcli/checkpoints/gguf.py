"""GGUF files (llama.cpp, Ollama, LM Studio): one file holds the config, the tokenizer and the weights.

Here, the file itself: `read_header` parses a file's metadata and tensor table (without reading any tensor), and a
tensor is read dequantized a slice of rows at a time (`dequantize_rows`), straight into a parameter of any dtype
(`dequantize`, what a `GgufTensor`'s `read` runs): never a float32 copy of the whole model. What the metadata and the
tensors are to a Hugging Face model, its config values and its tensors' names, is tfcli.checkpoints.gguf_hf's; the
tokenizer the metadata describes is built in tfcli.tokenizer.gguf.

The `gguf` package (an optional dependency, imported only here: `gguf_module`) dequantizes; the header is parsed
here rather than by its GGUFReader, which took 3.6 s and 158 MB for SmolLM2-135M's header (this
parser: 0.08 s, and long arrays such as the vocabulary are read only when asked for) and answers a truncated file
with numpy's errors: docs/loading.md has the figures. Every number of the header is checked before it is used
(lengths and counts against the file, the tensors' dimensions, types, alignment and extents, no name twice), so a
truncated, corrupted or hostile file is one clear error before anything is built (tests/test_fuzz_readers.py).
"""

from __future__ import annotations

import functools
import math
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.errors import TfcliError

if TYPE_CHECKING:
    import numpy as np
    import torch

INSTALL_HINT = 'pip install "tfcli[gguf]"'
CHUNK_ELEMENTS = 1 << 20  # values dequantized at a time: 4 MB of float32 in flight

# ggml's value types in GGUF metadata: struct formats of the fixed-size ones; 8 is a string, 9 an array
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
FLOAT_TYPES = ("F32", "F16", "BF16")


# --- reading the header -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its shape in torch's order (rows first), ggml type and where its bytes are."""

    name: str
    shape: tuple[int, ...]
    type_name: str  # Q4_K, F16, ...
    type_id: int
    start: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's metadata (key -> value, arrays as lists but long ones: see `array`) and its tensors, none of
    them read."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def array(self, key: str) -> list | None:
        """The items of an array value (a vocabulary, its merges, scores and types: read from the file only when
        asked for, so that a parsed header holds no copy of them); None when the key is absent."""
        value = self.metadata.get(key)
        if isinstance(value, LongArray):
            with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
                reader = _Reader(blob, value.start)
                return [reader.value(value.item) for _ in range(value.count)] if value.item not in _FORMATS \
                    else list(reader.unpack(f"{value.count}{_FORMATS[value.item]}", several=True))
        return value if isinstance(value, list) else None

    def count(self, key: str) -> int | None:
        """The number of items of an array value; None when the key is absent or not an array."""
        value = self.metadata.get(key)
        return value.count if isinstance(value, LongArray) else len(value) if isinstance(value, list) else None

    def get(self, key: str, default: Any = None) -> Any:
        """The architecture's own key (`llama.context_length` for "context_length")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def type_summary(self) -> str:
        """The ggml types of its tensors, the most used first: `Q4_1, Q8_0 and F32`."""
        counts: dict[str, int] = {}
        for info in self.tensors.values():
            counts[info.type_name] = counts.get(info.type_name, 0) + math.prod(info.shape)
        names = sorted(counts, key=lambda name: -counts[name])
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    def weights_note(self) -> str:
        """What the output says about the weights: `dequantized from Q4_1, Q8_0 and F32` (`stored as F16 and F32`
        when nothing is quantized), so that no one takes a quantized model's activations for the original's."""
        quantized = any(info.type_name not in FLOAT_TYPES for info in self.tensors.values())
        return f"{'dequantized from' if quantized else 'stored as'} {self.type_summary()}"


def gguf_module():
    """The `gguf` package, or the one-line error that says how to install it."""
    try:
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError:
        raise TfcliError("reading a GGUF file needs the gguf package, which is not installed",
                         INSTALL_HINT) from None
    return gguf


def read_header(path: Path) -> GgufHeader:
    """The metadata and tensor table of a GGUF file, parsed once per file (and per change to it)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    return _read_header(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_header(path: Path, size: int, mtime: int) -> GgufHeader:
    gguf = gguf_module()

    def broken(detail: str) -> TfcliError:
        return TfcliError(f"{path}: cannot read the GGUF file ({detail})",
                          "the file is truncated or corrupted: download or convert it again")

    try:
        with open(path, "rb") as f:
            if size < 24 or f.read(4) != b"GGUF":
                raise TfcliError(f"{path}: not a GGUF file (it does not start with the bytes `GGUF`)",
                                 "pass a .gguf file written by llama.cpp (or a model directory, a YAML config)")
            blob = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise TfcliError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None
    try:
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", blob, 4)
        if version not in (2, 3):
            swapped = struct.unpack_from(">I", blob, 4)[0]
            raise TfcliError(f"{path}: GGUF version {swapped if swapped in (2, 3) else version} "
                             f"{'(big-endian) ' if swapped in (2, 3) else ''}is not supported",
                             "tfcli reads little-endian GGUF files of version 2 or 3, as llama.cpp writes them")
        reader = _Reader(blob)
        metadata = {}
        for _ in range(kv_count):
            key = reader.string()
            if key in metadata:
                raise ValueError(f"the key {key} comes twice")
            metadata[key] = reader.value(reader.unpack("I"))
        entries = {}
        for _ in range(tensor_count):
            name, dimensions = reader.string(), reader.unpack("I")
            if name in entries:
                raise ValueError(f"tensor {name} comes twice")
            if not 1 <= dimensions <= MAX_DIMS:
                raise ValueError(f"tensor {name} has {dimensions} dimensions")
            dims = reader.unpack(f"{dimensions}Q", several=True)
            entries[name] = (tuple(reversed(dims)), reader.unpack("I"), reader.unpack("Q"))
        alignment = metadata.get("general.alignment", 32)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment is {alignment!r}, not a power of two")
        data_start = -(-reader.pos // alignment) * alignment
    except (struct.error, IndexError, ValueError, OverflowError, MemoryError, TypeError, ZeroDivisionError) as exc:
        raise broken(f"its header ends early or is malformed: {exc}") from None
    finally:
        blob.close()
    if not isinstance(metadata.get("general.architecture"), str):
        raise broken("its metadata names no general.architecture")
    tensors = {}
    for name, (shape, type_id, offset) in entries.items():
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise TfcliError(f"{path}: tensor {name} has ggml type {type_id}, which the gguf package does not know",
                             f"upgrade gguf ({INSTALL_HINT} --upgrade), or use a file quantized to another type") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if not shape or shape[-1] % block:
            raise broken(f"tensor {name} of shape {list(shape)} does not fill whole {qtype.name} blocks")
        nbytes = math.prod(shape[:-1]) * shape[-1] // block * type_size
        start = data_start + offset
        if start + nbytes > size:
            raise broken(f"tensor {name} ends at byte {start + nbytes}, after the end of the file ({size} bytes)")
        tensors[name] = TensorInfo(name, shape, qtype.name, type_id, start, nbytes)
    placed = sorted(tensors.values(), key=lambda info: info.start)
    for before, after in zip(placed, placed[1:]):
        if after.start < before.start + before.nbytes:
            raise broken(f"tensors {before.name} and {after.name} overlap")
    return GgufHeader(path, metadata, tensors)


@dataclass(frozen=True)
class LongArray:
    """An array of more than LONG items in a GGUF header, not read yet: where its items start, their number and
    their value type (see GgufHeader.array)."""

    start: int
    count: int
    item: int


LONG = 1024
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays, deeper than any writer goes (a deeper one is refused, not parsed recursively)


class _Reader:
    """Values read in order from a GGUF header (little-endian)."""

    def __init__(self, blob: mmap.mmap, pos: int = 24):
        self.blob = blob
        self.pos = pos

    def unpack(self, fmt: str, several: bool = False):
        values = struct.unpack_from("<" + fmt, self.blob, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values if several else values[0]

    def string(self) -> str:
        length = self.unpack("Q")
        end = self.pos + length
        if end > len(self.blob):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        text = self.blob[self.pos:end].decode("utf-8")
        self.pos = end
        return text

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _FORMATS:
            return self.unpack(_FORMATS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.unpack("I"), self.unpack("Q")
            if count > len(self.blob):
                raise ValueError(f"an array claims {count} items")
            if depth >= MAX_NESTING:
                raise ValueError(f"arrays nested more than {MAX_NESTING} deep")
            if count > LONG:  # skipped: read when asked for (GgufHeader.array)
                start = self.pos
                if item in _FORMATS:
                    self.pos += count * struct.calcsize("<" + _FORMATS[item])
                elif item == 8:
                    for _ in range(count):
                        self.pos += 8 + self.unpack("Q")
                else:
                    raise ValueError(f"a long array of value type {item}")
                if self.pos > len(self.blob):
                    raise ValueError(f"an array of {count} items runs past the end of the file")
                return LongArray(start, count, item)
            if item in _FORMATS:
                return list(self.unpack(f"{count}{_FORMATS[item]}", several=True))
            return [self.value(item, depth + 1) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


# --- tensors, dequantized --------------------------------------------------------------------------------

@dataclass(frozen=True)
class GgufTensor:
    """A tensor of a GGUF file as the loader's StoredTensor: `read(out=None)` dequantizes it, into `out` of any
    dtype (`casts`) or whole into float32 (`dtype`)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    read: Callable[..., torch.Tensor]
    casts: bool = True


def dequantize_rows(path: Path, info: TensorInfo, first: int, rows: int) -> np.ndarray:
    """Rows [first, first + rows) of a tensor, dequantized to float32 by the gguf package, (rows, columns)."""
    import numpy as np

    gguf = gguf_module()
    qtype = gguf.GGMLQuantizationType(info.type_id)
    columns = info.shape[-1]
    row_bytes = info.nbytes // max(1, math.prod(info.shape[:-1]))
    raw = np.empty(rows * row_bytes, np.uint8)
    with open(path, "rb") as f:
        f.seek(info.start + first * row_bytes)
        if f.readinto(memoryview(raw)) != raw.size:
            raise TfcliError(f"{path}: cannot read the GGUF file (it ends early)",
                             "the file is truncated or corrupted: download or convert it again")
    if qtype.name == "F32":
        return raw.view(np.float32).reshape(rows, columns)
    return gguf.quants.dequantize(raw.reshape(rows, row_bytes), qtype).reshape(rows, columns)


def dequantize(path: Path, info: TensorInfo, heads: int, fix: Callable | None, transposed: bool,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor as Hugging Face holds it (see gguf_hf.read_tensors), into `out` (a CPU tensor of its shape, any
    dtype) or a new float32 tensor, dequantized CHUNK_ELEMENTS values (whole heads of un-permuted rows) at a time."""
    import torch

    if out is None or transposed:
        whole = torch.empty(info.shape, dtype=torch.float32)
        _fill(path, info, heads, fix, whole)
        whole = whole.t() if transposed else whole
        return whole if out is None else out.copy_(whole)
    _fill(path, info, heads, fix, out)
    return out


def _fill(path: Path, info: TensorInfo, heads: int, fix: Callable | None, out: torch.Tensor) -> None:
    import torch

    if len(info.shape) == 1:  # a bias or a norm: small, read whole
        values = dequantize_rows(path, info, 0, 1).reshape(-1, 1)
        values = _unpermuted(values, heads) if heads else values
        out.view(-1).copy_(torch.from_numpy(fix(values) if fix else values).view(-1))
        return
    rows, columns = math.prod(info.shape[:-1]), info.shape[-1]
    out = out.view(rows, columns)
    unit = rows // heads if heads else 1  # a head's rows are un-permuted together
    step = max(unit, CHUNK_ELEMENTS // columns // unit * unit)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        values = dequantize_rows(path, info, first, count)
        values = _unpermuted(values, count // unit) if heads else values
        out[first:first + count].copy_(torch.from_numpy(fix(values) if fix else values))


def _unpermuted(values: np.ndarray, heads: int) -> np.ndarray:
    """Rows of whole heads as transformers' reverse_permute turns them: llama.cpp's (pair, 2) order of each
    head's rows back to the (2, pair) order of the rotate-half layout."""
    rows, columns = values.shape
    return values.reshape(heads, rows // heads // 2, 2, columns).swapaxes(2, 1).reshape(rows, columns)
