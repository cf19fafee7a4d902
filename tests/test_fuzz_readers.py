"""Fuzzing the checkpoint readers through the CLI (`tfcli encode --model`): safetensors files (read by safetensors'
own `safe_open`) and GGUF files (tfcli's header parser, tfcli/checkpoints/gguf.py), cut short at many points and
corrupted number by number. Every file ends as one `error:` line and its hint, exit 1, no traceback and no
"unexpected" error, refused from its header before any tensor is read (a GGUF file before any model is built): so
a tensor said to lie past the end of a file, or over another, is refused, never read.

The files are written here by transformers (safetensors) and by the gguf package's writer (GGUF, as
tests/test_gguf.py writes llama.cpp's files); where each number of a GGUF header sits is found with the gguf
package's own reader, not with tfcli's."""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from test_gguf import bpe_vocab, tiny, write_gguf  # noqa: E402
from tfcli.tokenizer.loading import BUNDLED_VOCAB  # noqa: E402


@pytest.fixture(scope="module")
def cli():
    """cli(*args) -> the result of `tfcli *args` in this process, as conftest's `cli`, with the command tree built once
    (typer builds it anew on each call: a quarter of a second, which hundreds of calls here would spend)."""
    import typer.main
    from click.testing import CliRunner

    from tfcli.cli import app

    command, runner = typer.main.get_command(app), CliRunner()
    return lambda *args: runner.invoke(command, list(args))


def one_error(result, *needles: str) -> str:
    """The error line of a run that failed as a bad file should: exit 1, an `error:` line and a `hint:` line."""
    lines = result.stderr.splitlines()
    assert result.exit_code == 1, (result.exit_code, result.stderr)
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.stderr
    assert "Traceback" not in result.stderr and "this is a bug" not in lines[1], result.stderr  # nothing unexpected
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- safetensors ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny GPT-2 saved by transformers: config.json and model.safetensors; its sharded twin (index + 2 shards)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=30522, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    one, sharded = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("sharded")
    for folder in (one, sharded):
        shutil.copy(BUNDLED_VOCAB, folder / "vocab.txt")  # BERT's WordPiece: 30522 tokens
    model.save_pretrained(one)
    model.save_pretrained(sharded, max_shard_size="1MB")
    assert len(list(sharded.glob("*.safetensors"))) == 2
    return one, sharded


@pytest.fixture
def no_tensor_read(monkeypatch):
    """Reading a safetensors tensor fails the test (as an unexpected error): a bad file must be refused from its
    header, before any of its bytes are taken for a tensor."""
    from tfcli import checkpoints

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(checkpoints, "_read_tensor", refuse)


def with_weights(source: Path, folder: Path, name: str, content: bytes) -> Path:
    """A copy of the checkpoint folder `source` in `folder`, its file `name` replaced by `content`."""
    folder.mkdir()
    for file in source.iterdir():
        (folder / file.name).write_bytes(content if file.name == name else file.read_bytes())
    return folder


def split(data: bytes) -> tuple[dict, bytes]:
    """A safetensors file's header (JSON) and its data."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]), data[8 + size:]


def joined(header: dict, body: bytes, size: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return (len(text) if size is None else size).to_bytes(8, "little") + text + body


def test_a_good_checkpoint_loads(cli, checkpoint):
    for folder in checkpoint:
        assert cli("encode", "--model", str(folder), "--json", "hi").exit_code == 0


def cut_points(data: bytes) -> list[int]:
    """Where to cut a safetensors file: in and around its size field and its JSON, around the first and last byte
    of its first, middle and last tensors, and at 12 points spread over the whole."""
    header, _ = split(data)
    start = 8 + int.from_bytes(data[:8], "little")
    points = {0, 1, 7, 8, 9, start // 2, start - 1, start, start + 1, len(data) - 1}
    tensors = sorted(info["data_offsets"] for name, info in header.items() if name != "__metadata__")
    for offsets in (tensors[0], tensors[len(tensors) // 2], tensors[-1]):
        points.update(start + offset + step for offset in offsets for step in (-1, 0, 1))
    points.update(len(data) * k // 12 for k in range(12))
    return sorted(p for p in points if 0 <= p < len(data))


@pytest.mark.usefixtures("no_tensor_read")
@pytest.mark.parametrize("layout", ["one file", "sharded"])
def test_a_safetensors_file_cut_anywhere_is_one_error(cli, checkpoint, tmp_path, layout):
    source = checkpoint[layout == "sharded"]
    name = "model.safetensors" if layout == "one file" else "model-00002-of-00002.safetensors"
    data = (source / name).read_bytes()
    points = cut_points(data)
    assert len(points) > 25
    for cut in points:
        folder = with_weights(source, tmp_path / f"cut{cut}", name, data[:cut])
        one_error(cli("encode", "--model", str(folder), "hi"), f"{name}: cannot read the safetensors file (")


@pytest.mark.usefixtures("no_tensor_read")
def test_a_missing_shard_is_one_error(cli, checkpoint, tmp_path):
    source = checkpoint[1]
    folder = with_weights(source, tmp_path / "missing", "", b"")
    (folder / "model-00002-of-00002.safetensors").unlink()
    one_error(cli("encode", "--model", str(folder), "hi"), "model-00002-of-00002.safetensors: No such file")


def corrupted_safetensors(data: bytes) -> list[tuple[str, bytes, str]]:
    """(what, file, what the error says) for a safetensors file broken in one way each."""
    header, body = split(data)
    size = int.from_bytes(data[:8], "little")
    names = [name for name in header if name != "__metadata__"]
    by_offset = sorted(names, key=lambda name: header[name]["data_offsets"][0])
    last, bias = by_offset[-1], next(name for name in names if len(header[name]["shape"]) == 1)

    def changed(name: str, **values) -> dict:
        return {**header, name: {**header[name], **values}}

    first, second = (n for n in names if n.endswith(".weight") and n.startswith("transformer.h.0.ln_"))
    return [
        ("no header size", data[:0], "header too small"),
        ("header size 0", (0).to_bytes(8, "little") + data[8:], "invalid JSON"),
        ("header size cutting the JSON", (size // 2).to_bytes(8, "little") + data[8:], "invalid JSON"),
        ("header size past the end", (len(data) - 7).to_bytes(8, "little") + data[8:], "invalid header length"),
        ("header size huge", (2**64 - 1).to_bytes(8, "little") + data[8:], "header too large"),
        ("header not an object", joined([], body), "invalid type"),
        ("header not UTF-8", data[:8] + b"\xff" + data[9:], "invalid UTF-8"),
        ("metadata not strings", joined({**header, "__metadata__": {"format": 1}}, body), "invalid type"),
        ("unknown dtype", joined(changed(bias, dtype="Q4"), body), "unknown variant `Q4`"),
        ("dtype of another size", joined(changed(bias, dtype="F16"), body), "invalid shape, data type, or offset"),
        ("negative shape", joined(changed(bias, shape=[-1]), body), "invalid value: integer `-1`"),
        ("shape of another size", joined(changed(bias, shape=[header[bias]["shape"][0] + 1]), body),
         "invalid shape, data type, or offset"),
        ("shape that overflows", joined(changed(bias, shape=[2**62, 2**62]), body), "overflow"),
        ("offsets reversed", joined(changed(bias, data_offsets=header[bias]["data_offsets"][::-1]), body),
         "invalid offset"),
        ("offsets past the end", joined(changed(last, data_offsets=[o + 4 for o in header[last]["data_offsets"]]),
                                        body), "invalid offset"),
        ("two tensors on the same bytes", joined(changed(second, data_offsets=header[first]["data_offsets"]), body),
         "invalid offset"),
        ("data cut short", data[:-4], "incomplete metadata, file not fully covered"),
        ("bytes after the data", data + bytes(4), "incomplete metadata, file not fully covered"),
    ]


@pytest.mark.usefixtures("no_tensor_read")
@pytest.mark.parametrize("case", range(18))
def test_a_corrupted_safetensors_file_is_one_error(cli, checkpoint, tmp_path, case):
    source = checkpoint[0]
    what, content, says = corrupted_safetensors((source / "model.safetensors").read_bytes())[case]
    folder = with_weights(source, tmp_path / "broken", "model.safetensors", content)
    one_error(cli("encode", "--model", str(folder), "hi"), "model.safetensors: cannot read the safetensors file", says)


@pytest.mark.usefixtures("no_tensor_read")
def test_a_dtype_tfcli_does_not_read_is_named(cli, checkpoint, tmp_path):
    """A float8 tensor is valid safetensors, but not a dtype tfcli loads: refused, naming it and the dtype."""
    source = checkpoint[0]
    header, body = split((source / "model.safetensors").read_bytes())
    bias = next(name for name in header if name != "__metadata__" and len(header[name]["shape"]) == 1)
    header[bias] = {**header[bias], "dtype": "F8_E4M3", "shape": [header[bias]["shape"][0] * 4]}
    folder = with_weights(source, tmp_path / "f8", "model.safetensors", joined(header, body))
    one_error(cli("encode", "--model", str(folder), "hi"), f"tensor {bias} is stored as F8_E4M3, which tfcli does not")


# --- GGUF -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A tiny Llama in Q8_0 and F32, with its byte-level BPE tokenizer, as llama.cpp writes it; general.alignment
    written out (32, the default)."""
    import transformers as T

    vocab = bpe_vocab()
    model = tiny(T.LlamaForCausalLM, T.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=64,
                                                   max_position_embeddings=64, tie_word_embeddings=False))
    return write_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama", vocab, types=("Q8_0",),
                      metadata={"general.alignment": 32})


@functools.cache
def numbers(path: Path) -> list[tuple[str, int, int, int]]:
    """(what, where, bytes, value) of every number in a GGUF header that says how to read the rest: the version,
    the two counts, each key's and string's length, each value type, each array's item type and length, and each
    tensor's name length, dimension count, dimensions, ggml type and offset. Found with gguf's GGUFReader."""
    reader = gguf.GGUFReader(path)
    base = reader.data.__array_interface__["data"][0]

    def at(part) -> int:
        return part.__array_interface__["data"][0] - base

    found = [("version", 4, 4, 3), ("tensor count", 8, 8, len(reader.tensors)),
             ("key count", 16, 8, len(reader.fields) - 3)]
    for key, field in list(reader.fields.items())[3:]:
        values = set(field.data)
        for i, part in enumerate(field.parts):
            if i in values or part.dtype.itemsize not in (4, 8) or part.size != 1:
                continue  # the values themselves, and the bytes of strings
            what = ("key length" if i == 0 else "value type" if i == 2 else "array item type" if i == 3 and
                    field.types[0] == gguf.GGUFValueType.ARRAY else "array length" if i == 4 else "string length")
            found.append((f"{key}: {what}", at(part), part.dtype.itemsize, int(part[0])))
    for tensor in reader.tensors:
        name_length, _, dimensions, dims, kind, offset = tensor.field.parts
        found += [(f"{tensor.name}: name length", at(name_length), 8, int(name_length[0])),
                  (f"{tensor.name}: dimension count", at(dimensions), 4, int(dimensions[0])),
                  *((f"{tensor.name}: dimension {i}", at(dims) + 8 * i, 8, int(d)) for i, d in enumerate(dims)),
                  (f"{tensor.name}: type", at(kind), 4, int(kind[0])), (f"{tensor.name}: offset", at(offset), 8,
                                                                         int(offset[0]))]
    return found


def number(path: Path, what: str) -> tuple[int, int, int]:
    return next((where, size, value) for name, where, size, value in numbers(path) if name == what)


def patched(data: bytes, where: int, size: int, value: int) -> bytes:
    out = bytearray(data)
    out[where:where + size] = value.to_bytes(size, "little")
    return bytes(out)


def test_a_good_gguf_file_loads(cli, gguf_file):
    assert cli("encode", "--model", str(gguf_file), "--json", "hi").exit_code == 0


@pytest.mark.usefixtures("no_model_built")
def test_a_gguf_file_cut_anywhere_is_one_error(cli, gguf_file, tmp_path):
    """Cut at about 24 numbers of the header spread over it (the vocabulary's among them), a byte before each and a
    byte into it; at each tensor's first, second and last byte; and at 16 points spread over the whole: each is
    refused before anything is built."""
    data = gguf_file.read_bytes()
    found = numbers(gguf_file)
    points = {0, 3, 4, 23, 24, len(data) - 1} | {len(data) * k // 16 for k in range(16)}
    points |= {where + step for _, where, _, _ in found[::len(found) // 24] for step in (-1, 0, 1)}
    reader = gguf.GGUFReader(gguf_file)
    points |= {int(t.data_offset) + step for t in reader.tensors for step in (0, 1, int(t.n_bytes) - 1)}
    points = sorted(p for p in points if 0 <= p < len(data))
    assert len(points) > 60
    for cut in points:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        line = one_error(cli("encode", "--model", str(path), "hi"), str(path.resolve() if cut >= 24 else path))
        assert "cannot read the GGUF file" in line or "not a GGUF file" in line, line


def alignment_as(kind: int, value: bytes):
    """general.alignment's value type and value replaced (the key is written right before it)."""
    def change(data: bytes, path: Path) -> bytes:
        where, _, _ = number(path, "general.alignment: value type")
        return data[:where] + struct.pack("<I", kind) + value + data[where + 8:]
    return change


def nested(data: bytes, path: Path) -> bytes:
    """An array of arrays 10,000 deep in place of general.alignment (and its bytes)."""
    where, _, _ = number(path, "general.alignment: value type")
    deep = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 10_000 + struct.pack("<IQ", 4, 1) + bytes(4)
    return data[:where] + deep + data[where + 8:]


def renamed(key: str, to: str):
    """A key or tensor name's bytes replaced by another's of the same length."""
    def change(data: bytes, path: Path) -> bytes:
        assert len(key) == len(to)
        where = data.index(struct.pack("<Q", len(key)) + key.encode())
        return data[:where + 8] + to.encode() + data[where + 8 + len(key):]
    return change


def set_number(what: str, value):
    """The number `what` (see `numbers`) set to `value`, or to value(its value, the file) when callable."""
    def change(data: bytes, path: Path) -> bytes:
        where, size, old = number(path, what)
        return patched(data, where, size, value(old, path) if callable(value) else value)
    return change


EMBEDDINGS, KEY = "token_embd.weight", "blk.0.attn_k.weight"
GGUF_CASES = {  # what: (how the file is changed, what the error line says)
    "bad magic": (lambda data, path: b"GGUX" + data[4:], "not a GGUF file"),
    "version 1": (set_number("version", 1), "GGUF version 1 is not supported"),
    "version 4": (set_number("version", 4), "GGUF version 4 is not supported"),
    "big-endian version 3": (set_number("version", 3 << 24), "GGUF version 3 (big-endian) is not supported"),
    "tensor count huge": (set_number("tensor count", 2**64 - 1), "its header ends early or is malformed"),
    "tensor count one more": (set_number("tensor count", lambda n, _: n + 1), "its header ends early or is malformed"),
    "key count huge": (set_number("key count", 2**63), "its header ends early or is malformed"),
    "key count 0": (set_number("key count", 0), "tensor general.architecture has 8 dimensions"),
    "no architecture": (renamed("general.architecture", "general.architecturE"),
                        "its metadata names no general.architecture"),
    "key length past the end": (set_number("general.architecture: key length", 2**40), "runs past the end of the file"),
    "string length past the end": (set_number("general.architecture: string length", 2**64 - 1),
                                   "runs past the end of the file"),
    "string length one more": (set_number("general.architecture: string length", lambda n, _: n + 1),
                               "its header ends early or is malformed"),
    "key not UTF-8": (lambda data, path: data.replace(b"general.architecture", b"general.\xffrchitecture"),
                      "'utf-8' codec can't decode"),
    "unknown value type": (set_number("general.architecture: value type", 13), "unknown metadata value type 13"),
    "array length huge": (set_number("tokenizer.ggml.tokens: array length", 2**62), "an array claims"),
    "array item type unknown": (set_number("tokenizer.ggml.tokens: array item type", 99),
                                "unknown metadata value type 99"),
    "arrays nested 10,000 deep": (nested, "arrays nested more than 8 deep"),
    "alignment 0": (alignment_as(4, struct.pack("<I", 0)), "general.alignment is 0, not a power of two"),
    "alignment 48": (alignment_as(4, struct.pack("<I", 48)), "general.alignment is 48, not a power of two"),
    "alignment a float": (alignment_as(6, struct.pack("<f", 32.0)), "general.alignment is 32.0, not a power of two"),
    "a key twice": (renamed("general.file_type", "llama.block_count"), "the key llama.block_count comes twice"),
    "tensor name length past the end": (set_number(f"{EMBEDDINGS}: name length", 2**63),
                                        "runs past the end of the file"),
    "no dimensions": (set_number(f"{KEY}: dimension count", 0), f"tensor {KEY} has 0 dimensions"),
    "dimension count huge": (set_number(f"{KEY}: dimension count", 2**32 - 1),
                             f"tensor {KEY} has 4294967295 dimensions"),
    "dimension huge": (set_number(f"{EMBEDDINGS}: dimension 1", 2**62), "after the end of the file"),
    "dimension not whole blocks": (set_number(f"{KEY}: dimension 0", 33), "does not fill whole Q8_0 blocks"),
    "unknown tensor type": (set_number(f"{KEY}: type", 99), f"tensor {KEY} has ggml type 99, which the gguf package"),
    "tensor type of another size": (set_number(f"{EMBEDDINGS}: type", 0), f"tensor {EMBEDDINGS} ends at byte"),
    "offset huge": (set_number(f"{KEY}: offset", 2**63), f"tensor {KEY} ends at byte"),
    "offset past the end": (set_number("output.weight: offset", lambda n, path: n + path.stat().st_size),
                            "after the end of the file"),
    "two tensors on the same bytes": (set_number("blk.0.attn_v.weight: offset",
                                                 lambda n, path: number(path, f"{KEY}: offset")[2]), "overlap"),
    "a tensor twice": (renamed("blk.0.attn_v.weight", KEY), f"tensor {KEY} comes twice"),
}


@pytest.mark.usefixtures("no_model_built")
@pytest.mark.parametrize("case", GGUF_CASES)
def test_a_corrupted_gguf_file_is_one_error_before_anything_is_built(cli, gguf_file, tmp_path, case):
    change, says = GGUF_CASES[case]
    path = tmp_path / "broken.gguf"
    path.write_bytes(change(gguf_file.read_bytes(), gguf_file))
    one_error(cli("encode", "--model", str(path), "hi"), says)


RUNS = itertools.count()
HEADER_NUMBERS = st.integers(0, 10**6)  # index into `numbers`, taken modulo their count
VALUES = st.one_of(st.sampled_from([0, 1, 2, 3, 31, 33, 2**31, 2**32 - 1, 2**63, 2**64 - 1]),
                   st.integers(-3, 3))  # small numbers replace; -3..3 are added to the number there


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(pick=HEADER_NUMBERS, value=VALUES, second=st.one_of(st.none(), st.tuples(HEADER_NUMBERS, VALUES)))
def test_random_header_numbers_load_or_are_one_error(cli, gguf_file, tmp_path, pick, value, second):
    """One or two numbers of the header changed at random (set to an edge value, or nudged by -3..3): the file
    loads, or fails as one error line with its hint."""
    found = numbers(gguf_file)
    data = gguf_file.read_bytes()
    for index, change in [(pick, value), *([second] if second else [])]:
        _, where, size, old = found[index % len(found)]
        new = (old + change if -3 <= change <= 3 else change) % 2 ** (8 * size)
        data = patched(data, where, size, new)
    path = tmp_path / f"random{next(RUNS)}.gguf"
    path.write_bytes(data)
    result = cli("encode", "--model", str(path), "hi")
    event(f"exit {result.exit_code}")  # pytest --hypothesis-show-statistics counts them
    if result.exit_code != 0:
        one_error(result)
