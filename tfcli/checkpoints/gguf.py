"""GGUF files (llama.cpp, Ollama, LM Studio): one file holds the config, the tokenizer and the weights.

`read_header` parses a file's metadata and tensor table (without reading any tensor). `hf_config` gives the
Hugging Face config values transformers' GGUF loader reads from the metadata (`from_pretrained(dir,
gguf_file=...)`), which the family's own translation then reads as it reads a config.json (tfcli.sources).
`read_tensors` gives the loader (`load_checkpoint`) every tensor under its Hugging Face name, dequantized from
the file a slice of rows at a time straight into the parameter, in its dtype: never a float32 copy of the whole
model. The tokenizer the metadata describes is built in tfcli.tokenizer.

What is computed follows transformers' GGUF loader, which un-permutes llama.cpp's Llama Q and K rows, takes 1
back off Gemma's norms and transposes GPT-2's projections. Where that loader leaves out metadata that llama.cpp
computes with, tfcli reads it as the original checkpoint's config said (ORIGINAL_KEYS, `_rope_scaling`), and
refuses, naming it, what it cannot read (mixtures of experts, RoPE scalings other than linear and Llama 3's,
Phi-3's LongRoPE factors). The `gguf` package (an optional dependency, imported only here) dequantizes; the
header is parsed here rather than by its GGUFReader, which took 3.6 s and 158 MB for SmolLM2-135M's header (this
parser: 0.08 s, and long arrays such as the vocabulary are read only when asked for) and answers a truncated file
with numpy's errors: docs/loading.md has the figures. Every number of the header is checked before it is used
(lengths and counts against the file, the tensors' dimensions, types, alignment and extents, no name twice), so a
truncated, corrupted or hostile file is one clear error before anything is built (tests/test_fuzz_readers.py).
"""

from __future__ import annotations

import functools
import math
import mmap
import re
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
_FLOAT_TYPES = ("F32", "F16", "BF16")


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
        quantized = any(info.type_name not in _FLOAT_TYPES for info in self.tensors.values())
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


# --- architectures: config and tensor names -------------------------------------------------------------------

# transformers' GGUF_CONFIG_MAPPING (integrations/ggml.py) for the architectures tfcli has: "{arch}.KEY" -> HF key
_COMMON = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
           "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
           "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
           "vocab_size": "vocab_size"}
CONFIG_KEYS: dict[str, dict[str, str]] = {
    "llama": {**_COMMON, "rope.dimension_count": "head_dim"},
    "qwen2": _COMMON, "qwen3": _COMMON, "falcon": _COMMON, "phi3": _COMMON,
    "gemma2": {**_COMMON, "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gemma3": {**_COMMON, "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gpt2": {"block_count": "n_layer", "context_length": "n_ctx", "embedding_length": "n_embd",
             "feed_forward_length": "feed_forward_length", "attention.head_count": "n_head",
             "attention.layer_norm_epsilon": "layer_norm_epsilon"},
}
TOKEN_ID_KEYS = {"tokenizer.ggml.bos_token_id": "bos_token_id", "tokenizer.ggml.eos_token_id": "eos_token_id",
                 "tokenizer.ggml.padding_token_id": "pad_token_id"}
MODEL_TYPES = {"gemma3": "gemma3_text"}
CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
             "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel", "falcon": "FalconForCausalLM"}
# metadata that transformers' GGUF loader leaves out but llama.cpp computes with: "{arch}.KEY" -> (HF key, the
# value transformers assumes instead). tfcli reads the file's value, as the original config.json said it, where
# it differs (beyond float32 rounding) from what transformers assumes.
ORIGINAL_KEYS: dict[str, dict[str, tuple[str, Any]]] = {
    "qwen3": {"attention.key_length": ("head_dim", 128)},
    "phi3": {"attention.sliding_window": ("sliding_window", None)},
    "gemma2": {"attn_logit_softcapping": ("attn_logit_softcapping", 50.0),
               "final_logit_softcapping": ("final_logit_softcapping", 30.0)},
    "gemma3": {"final_logit_softcapping": ("final_logit_softcapping", None)},
    "falcon": {"attention.layer_norm_epsilon": ("layer_norm_epsilon", 1e-5)},
    "gpt2": {"context_length": ("n_positions", 1024), "feed_forward_length": ("n_inner", None)},
}

_LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_output.bias": "model.layers.{}.self_attn.o_proj.bias",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    **{f"blk.{{}}.ffn_{part}.{param}": f"model.layers.{{}}.mlp.{part}_proj.{param}"
       for part in ("gate", "up", "down") for param in ("weight", "bias")},
}
_QK_NORMS = {"blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
             "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight"}
_GEMMA_NAMES = {**{k: v for k, v in _LLAMA_NAMES.items() if "ffn_norm" not in k and "output.weight" != k},
                "output.weight": "lm_head.weight",
                "blk.{}.post_attention_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
                "blk.{}.ffn_norm.weight": "model.layers.{}.pre_feedforward_layernorm.weight",
                "blk.{}.post_ffw_norm.weight": "model.layers.{}.post_feedforward_layernorm.weight"}
TENSOR_NAMES: dict[str, dict[str, str]] = {
    "llama": _LLAMA_NAMES, "qwen2": _LLAMA_NAMES, "qwen3": {**_LLAMA_NAMES, **_QK_NORMS},
    "gemma2": _GEMMA_NAMES, "gemma3": {**_GEMMA_NAMES, **_QK_NORMS},
    "phi3": {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight",
             "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
             "blk.{}.attn_qkv.weight": "model.layers.{}.self_attn.qkv_proj.weight",
             "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
             "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
             "blk.{}.ffn_up.weight": "model.layers.{}.mlp.gate_up_proj.weight",
             "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight"},
    "gpt2": {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
             "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
             "output.weight": "lm_head.weight",
             **{f"blk.{{}}.{gguf_name}.{param}": f"transformer.h.{{}}.{hf_name}.{param}"
                for gguf_name, hf_name in (("attn_norm", "ln_1"), ("attn_qkv", "attn.c_attn"),
                                           ("attn_output", "attn.c_proj"), ("ffn_norm", "ln_2"),
                                           ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj"))
                for param in ("weight", "bias")}},
    "falcon": {"token_embd.weight": "transformer.word_embeddings.weight",
               "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
               "output.weight": "lm_head.weight",
               **{f"blk.{{}}.{gguf_name}.{param}": f"transformer.h.{{}}.{hf_name}.{param}"
                  for gguf_name, hf_name in (("attn_norm", "input_layernorm"),
                                             ("attn_qkv", "self_attention.query_key_value"),
                                             ("attn_output", "self_attention.dense"),
                                             ("ffn_up", "mlp.dense_h_to_4h"), ("ffn_down", "mlp.dense_4h_to_h"))
                  for param in ("weight", "bias")}},
}
SUPPORTED = tuple(TENSOR_NAMES)
# GGUF architectures transformers' GGUF loader reads and tfcli's families do not (yet): named in the refusal
NOT_IN_TFCLI = {"t5": "T5 (an encoder-decoder)", "t5encoder": "T5's encoder", "umt5": "UMT5", "bloom": "BLOOM",
                "stablelm": "StableLM", "starcoder2": "StarCoder2", "mamba": "Mamba", "nemotron": "Nemotron",
                "qwen2moe": "Qwen2-MoE", "qwen3moe": "Qwen3-MoE", "lfm2": "LFM2", "deci": "DeciLM",
                "gpt-oss": "gpt-oss", "minimax-m2": "MiniMax-M2", "gemma4": "Gemma 4", "qwen35": "Qwen3.5",
                "qwen35moe": "Qwen3.5-MoE", "gemma": "Gemma 1 (transformers' GGUF loader does not read it)",
                "mistral": "llama.cpp writes Mistral's models as `llama`; transformers cannot load this name either"}


def _template(template: str) -> re.Pattern[str]:
    return re.compile(r"(\d+)".join(re.escape(part) for part in template.split("{}")))


def _check_architecture(header: GgufHeader) -> None:
    arch = header.architecture
    if arch in SUPPORTED:
        return
    what = f"`{arch}` ({NOT_IN_TFCLI[arch]})" if arch in NOT_IN_TFCLI else f"`{arch}`"
    raise TfcliError(f"{header.path}: GGUF architecture {what} is not supported by tfcli",
                     f"tfcli reads GGUF files of the architectures {', '.join(SUPPORTED)} (llama: Mistral's too)")


def hf_config(header: GgufHeader) -> dict[str, Any]:
    """The Hugging Face config values of a GGUF file: what transformers' GGUF loader reads from its metadata
    (`load_gguf_checkpoint(..., return_tensors=False)["config"]`), plus the keys it leaves out that change the
    computation (ORIGINAL_KEYS, RoPE scaling), an `architectures` entry (the file holds a causal LM) and no more."""
    _check_architecture(header)
    arch, path = header.architecture, header.path
    name = header.metadata.get("general.name")
    # llama.cpp writes Mistral's models as `llama` (and computes them so: no sliding window). transformers reads a
    # file named exactly "mistral" as a Mistral model, then fails to load its weights; tfcli reads it as llama.cpp
    model_type = MODEL_TYPES.get(arch, arch)
    values: dict[str, Any] = {"model_type": model_type, "architectures": [CAUSAL_LM[model_type]]}
    if name is not None:
        values["_name_or_path"] = name
    for key, hf_key in {**{f"{arch}.{k}": v for k, v in CONFIG_KEYS[arch].items()}, **TOKEN_ID_KEYS}.items():
        if key in header.metadata:
            value = header.metadata[key]
            if isinstance(value, list):
                raise TfcliError(f"{path}: `{key}` holds one value per layer ({value[:4]}...), which tfcli does not "
                                 "support", "tfcli reads GGUF files whose layers all have the same shape")
            values[hf_key] = value
    if arch != "gpt2" and "vocab_size" not in values and header.count("tokenizer.ggml.tokens"):
        values["vocab_size"] = header.count("tokenizer.ggml.tokens")
    values["tie_word_embeddings"] = "output.weight" not in header.tensors or arch == "falcon"
    if arch in ("llama", "qwen3"):  # no key says so: the tensors do (transformers would drop them)
        if any(re.fullmatch(r"blk\.\d+\.attn_(q|output)\.bias", tensor) for tensor in header.tensors):
            values["attention_bias"] = True
        if arch != "qwen3" and any(re.fullmatch(r"blk\.\d+\.ffn_\w+\.bias", tensor) for tensor in header.tensors):
            values["mlp_bias"] = True
    for key, (hf_key, assumed) in ORIGINAL_KEYS.get(arch, {}).items():
        found = header.get(key)
        if found is not None and not _same(found, assumed):
            values[hf_key] = found
    _refuse_unread(header)
    if arch == "gpt2":  # no vocab_size key: the embeddings' rows (transformers takes the vocabulary's length)
        embeddings = header.tensors.get("token_embd.weight")
        values["vocab_size"] = embeddings.shape[0] if embeddings else header.count("tokenizer.ggml.tokens") or 0
    if arch == "falcon" and header.get("attention.head_count_kv", 1) != 1:
        raise TfcliError(f"{path}: Falcon with {header.get('attention.head_count_kv')} key/value heads "
                         "(new_decoder_architecture, Falcon-40B's shape) from a GGUF file is not supported by tfcli",
                         "transformers' GGUF loader reads multi-query Falcon (Falcon-7B's shape) only")
    if arch in ("gemma2", "gemma3") and header.get("attention.key_length", 256) != 256:
        raise TfcliError(f"{path}: {arch} with heads of {header.get('attention.key_length')} dimensions from a GGUF "
                         "file is not supported by tfcli: the file does not say by what its attention scores are "
                         "scaled (query_pre_attn_scalar)", "transformers assumes 256, right for heads of 256 only")
    if arch == "phi3" and header.get("rope.dimension_count") is not None:
        rotated, head = header.get("rope.dimension_count"), _head_dim(header, values)
        if rotated != head:
            values["partial_rotary_factor"] = rotated / head
    values.update(_rope_scaling(header, values))
    return values


def _head_dim(header: GgufHeader, values: dict[str, Any]) -> int:
    """The size of each attention head: head_dim where the config gives it, else hidden_size / heads."""
    try:
        return values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    except (KeyError, TypeError, ZeroDivisionError):
        raise TfcliError(f"{header.path}: its metadata gives no valid embedding_length and attention.head_count",
                         "the file is not a complete GGUF model: convert it again") from None


def _same(found: Any, assumed: Any) -> bool:
    if isinstance(found, float) and isinstance(assumed, float):
        return struct.unpack("<f", struct.pack("<f", assumed))[0] == found
    return found == assumed


def _refuse_unread(header: GgufHeader) -> None:
    """Refuse, naming it, metadata that changes the computation and that neither tfcli nor transformers reads."""
    path, arch = header.path, header.architecture
    if header.get("expert_count"):
        raise TfcliError(f"{path}: a mixture of experts ({header.get('expert_count')} experts per layer) is not "
                         "supported by tfcli", "tfcli reads dense models")
    for key in ("attention.clamp_kqv", "attention.max_alibi_bias", "logit_scale", "embedding_scale",
                "residual_scale", "attention.scale"):
        value = header.get(key)
        if value not in (None, 0, 0.0, 1.0) or key == "attention.clamp_kqv" and value is not None:
            raise TfcliError(f"{path}: {arch} with `{arch}.{key}: {value}` is not supported by tfcli",
                             "transformers' GGUF loader does not read it either")


def _rope_scaling(header: GgufHeader, values: dict[str, Any]) -> dict[str, Any]:
    """RoPE scaling, which transformers' GGUF loader leaves out: `{arch}.rope.scaling.type` linear (Gemma 3 4B
    and up), and Llama 3's, which llama.cpp stores as a `rope_freqs` tensor of per-frequency factors, read back
    into its four numbers (and checked to give that tensor again). Any other is refused, naming it."""
    path, arch = header.path, header.architecture
    kind = header.get("rope.scaling.type")
    if kind in (None, "none") or kind == "linear" and header.get("rope.scaling.factor", 1.0) == 1.0:
        scaling = None
    elif kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(header.get("rope.scaling.factor"))}
    else:
        raise TfcliError(f"{path}: RoPE scaling `{kind}` in a GGUF file is not supported by tfcli",
                         "tfcli reads linear scaling and Llama 3's (the rope_freqs tensor) from GGUF files")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in header.tensors:
            raise TfcliError(f"{path}: LongRoPE (the {name} tensor) in a GGUF file is not supported by tfcli",
                             "use the original checkpoint (config.json + safetensors), whose longrope tfcli reads")
    if "rope_freqs.weight" in header.tensors:
        if scaling is not None or arch != "llama":
            raise TfcliError(f"{path}: a rope_freqs tensor in a {arch} GGUF file is not supported by tfcli",
                             "tfcli reads rope_freqs as Llama 3's RoPE scaling only")
        scaling = _llama3_scaling(header, values)
    if scaling is None:
        return {}
    if arch == "gemma3":
        return {"rope_parameters": {"full_attention": {"rope_theta": values.get("rope_theta", 1e6), **scaling},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    return {"rope_scaling": scaling}


def _llama3_scaling(header: GgufHeader, values: dict[str, Any]) -> dict[str, Any]:
    """Llama 3's rope_scaling from the factors llama.cpp computed from it (convert_hf_to_gguf.py) and stored as
    rope_freqs: the largest is `factor`; the other three numbers are those of every Llama 3.x release."""
    import numpy as np

    info = header.tensors["rope_freqs.weight"]
    stored = _dequantize_rows(header.path, info, 0, 1).reshape(-1)
    head_dim = _head_dim(header, values)
    theta = values.get("rope_theta", 10000.0)
    scaling = {"rope_type": "llama3", "factor": float(stored.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low, high = 8192 / scaling["low_freq_factor"], 8192 / scaling["high_freq_factor"]
    expected = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < high:
            expected.append(1.0)
        elif wavelength > low:
            expected.append(scaling["factor"])
        else:
            smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
            expected.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    if stored.shape != (head_dim // 2,) or not np.allclose(stored, np.array(expected, np.float32), rtol=1e-5):
        raise TfcliError(f"{header.path}: its rope_freqs tensor is not Llama 3's RoPE scaling with "
                         "low_freq_factor 1, high_freq_factor 4 and original_max_position_embeddings 8192",
                         "tfcli reads rope_freqs as Llama 3.x releases write it")
    return scaling


# --- what a load needs ---------------------------------------------------------------------------------------

def check_loadable(header: GgufHeader) -> None:
    """Refuse, before anything is built, a file holding a tensor type the gguf package cannot dequantize or a
    tensor tfcli's family has no place for."""
    import numpy as np

    gguf = gguf_module()
    for type_name in sorted({info.type_name for info in header.tensors.values()}):
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name in _FLOAT_TYPES:
            continue
        try:
            gguf.quants.dequantize(np.zeros(gguf.GGML_QUANT_SIZES[qtype][1], np.uint8), qtype)
        except NotImplementedError:
            used = next(info.name for info in header.tensors.values() if info.type_name == type_name)
            raise TfcliError(f"{header.path}: tensor {used} is quantized as {type_name}, which the gguf package "
                             "cannot dequantize", "use a file quantized to another type (Q4_K_M, Q8_0, F16, ...)") from None
    hf_names(header)


def hf_names(header: GgufHeader) -> dict[str, str]:
    """GGUF tensor name -> its Hugging Face name; a tensor no rule knows is an error naming it (rope_freqs, read
    into the config, maps to nothing)."""
    rules = [(_template(gguf_name), hf_name) for gguf_name, hf_name in TENSOR_NAMES[header.architecture].items()]
    names, unknown = {}, []
    for name in header.tensors:
        if name == "rope_freqs.weight":
            continue
        for pattern, hf_name in rules:
            match = pattern.fullmatch(name)
            if match:
                names[name] = hf_name.format(*match.groups())
                break
        else:
            unknown.append(name)
    if unknown:
        shown = ", ".join(unknown[:4]) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
        raise TfcliError(f"{header.path}: {len(unknown)} tensor(s) that tfcli does not know for a "
                         f"{header.architecture} model: {shown}", "nothing of a model is dropped silently; this file "
                         "holds more than the architecture tfcli reads")
    return names


# --- tensors --------------------------------------------------------------------------------------------------

def read_tensors(path: Path) -> dict[str, GgufTensor]:
    """Every tensor of a GGUF file under its Hugging Face name, none read yet: `read(out=None)` dequantizes it
    (with transformers' GGUF fixes: Llama's Q/K rows un-permuted, Gemma's norms less 1, GPT-2's projections
    transposed) a slice of rows at a time into `out` (any dtype, on the CPU), or whole into a float32 tensor."""
    import torch

    header = read_header(path)
    check_loadable(header)
    values = hf_config(header)
    arch = header.architecture
    tensors = {}
    for gguf_name, hf_name in hf_names(header).items():
        info = header.tensors[gguf_name]
        heads, fix = 0, None
        if arch == "llama" and re.search(r"\.attn_[qk]\.", gguf_name):  # transformers' LlamaTensorProcessor
            heads = values["num_attention_heads"]
            if ".attn_k." in gguf_name and values.get("num_key_value_heads", heads) != heads:
                heads = values["num_key_value_heads"]
        if arch in ("gemma2", "gemma3") and gguf_name.endswith("norm.weight"):
            fix = _less_one  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
        transposed = arch == "gpt2" and re.search(r"\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight$", gguf_name)
        shape = info.shape[::-1] if transposed else info.shape
        tensors[hf_name] = GgufTensor(tuple(shape), torch.float32,
                                      functools.partial(_read, header.path, info, heads, fix, bool(transposed)))
    return tensors


@dataclass(frozen=True)
class GgufTensor:
    """A tensor of a GGUF file as the loader's StoredTensor: `read(out=None)` dequantizes it, into `out` of any
    dtype (`casts`) or whole into float32 (`dtype`)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    read: Callable[..., torch.Tensor]
    casts: bool = True


def _less_one(values: np.ndarray) -> np.ndarray:
    return values - 1


def _dequantize_rows(path: Path, info: TensorInfo, first: int, rows: int) -> np.ndarray:
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


def _read(path: Path, info: TensorInfo, heads: int, fix: Callable | None, transposed: bool,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor as Hugging Face holds it (see read_tensors), into `out` (a CPU tensor of its shape, any dtype)
    or a new float32 tensor, dequantized CHUNK_ELEMENTS values (whole heads of un-permuted rows) at a time."""
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
        values = _dequantize_rows(path, info, 0, 1).reshape(-1, 1)
        values = _unpermuted(values, heads) if heads else values
        out.view(-1).copy_(torch.from_numpy(fix(values) if fix else values).view(-1))
        return
    rows, columns = math.prod(info.shape[:-1]), info.shape[-1]
    out = out.view(rows, columns)
    unit = rows // heads if heads else 1  # a head's rows are un-permuted together
    step = max(unit, CHUNK_ELEMENTS // columns // unit * unit)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        values = _dequantize_rows(path, info, first, count)
        values = _unpermuted(values, count // unit) if heads else values
        out[first:first + count].copy_(torch.from_numpy(fix(values) if fix else values))


def _unpermuted(values: np.ndarray, heads: int) -> np.ndarray:
    """Rows of whole heads as transformers' reverse_permute turns them: llama.cpp's (pair, 2) order of each
    head's rows back to the (2, pair) order of the rotate-half layout."""
    rows, columns = values.shape
    return values.reshape(heads, rows // heads // 2, 2, columns).swapaxes(2, 1).reshape(rows, columns)
