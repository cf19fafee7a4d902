"""Every kind of bad input, through the real CLI: one `error:` line naming the problem (and a hint), a
non-zero exit (2 for usage errors, 1 otherwise), never a traceback, and never code run from a file.

Classes: paths, YAML, checkpoints, devices and dtypes, options, text. Models are tiny YAML configs
written to tmp_path (hidden_size 32, 1 layer), or tiny checkpoints saved by transformers itself.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest

def assert_error(result, exit_code: int, *needles: str) -> str:
    """A clean user error: exit code, an `error:` line holding every needle, no traceback, no bug report."""
    stderr = result.stderr
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, stderr)
    assert "error: " in stderr, stderr
    message = stderr[stderr.index("error: "):]
    for needle in needles:
        assert needle in message, (needle, message)
    for text in (stderr, result.stdout):
        assert "Traceback" not in text
        assert "unexpected " not in text, text  # the catch-all for bugs
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return message


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, save_hf_model) -> Path:
    """A tiny BERT checkpoint (config.json + model.safetensors) written by transformers."""
    import transformers

    path = tmp_path_factory.mktemp("bert")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16,
                                     architectures=["BertForMaskedLM"])
    save_hf_model(transformers.BertForMaskedLM, config, path)
    return path


def config_folder(path: Path, config: str) -> Path:
    """A model folder at `path` that holds only a config.json of text `config`."""
    path.mkdir()
    write(path / "config.json", config)
    return path


def copy_checkpoint(source: Path, target: Path) -> Path:
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


# ---------------------------------------------------------------- paths


def test_missing_model_path(cli, tmp_path):
    assert_error(cli("encode", "--model", str(tmp_path / "absent.yaml"), "hi"), 1, "no such file", "absent.yaml")


def test_missing_text_file(cli, tiny_config, tmp_path):
    assert_error(cli("encode", "--model", str(tiny_config), "--file", str(tmp_path / "absent.txt")), 1, "absent.txt")


def test_unreadable_config(cli, tiny_config, monkeypatch):
    if os.geteuid() != 0:
        tiny_config.chmod(0)
    else:  # root reads anything: make reading raise the PermissionError an unreadable file gives
        real = Path.read_text

        def denied(self, *args, **kwargs):
            if self == tiny_config:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", denied)
    try:
        assert_error(cli("encode", "--model", str(tiny_config), "hi"), 1, "cannot read", "Permission denied")
    finally:
        tiny_config.chmod(0o644)


def test_unreadable_text_file(cli, tiny_config, tmp_path, monkeypatch):
    texts = write(tmp_path / "texts.txt", "hello\n")
    if os.geteuid() != 0:
        texts.chmod(0)
    else:
        real = Path.open

        def denied(self, *args, **kwargs):
            if self == texts:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "open", denied)
    assert_error(cli("encode", "--model", str(tiny_config), "--file", str(texts)), 1, "cannot read",
                 "Permission denied")


def test_directory_without_config(cli, tmp_path):
    (tmp_path / "model").mkdir()
    assert_error(cli("encode", "--model", str(tmp_path / "model"), "hi"), 1, "holds no config.json")


def test_directory_without_config_points_at_yaml(cli, tiny_config):
    message = assert_error(cli("encode", "--model", str(tiny_config.parent), "hi"), 1, "holds no config.json")
    assert str(tiny_config) in message  # the hint names the YAML file that is there


def test_compare_needs_weights(cli, checkpoint, tmp_path):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
    assert_error(cli("compare", str(config_only), "hi"), 1, "compare needs a checkpoint with weights",
                 "hint: pass a directory written by save_pretrained")


# ---------------------------------------------------------------- YAML


@pytest.mark.parametrize("text, needles", [
    ("hidden_size: [32\n", ["not valid YAML", "line 2"]),
    ("hidden_size: 32\n  bad indent: 1\n", ["not valid YAML"]),
    ("- hidden_size\n- 32\n", ["expected a mapping"]),
    ("", ["empty"]),
])
def test_malformed_yaml(cli, tmp_path, text, needles):
    assert_error(cli("encode", "--model", str(write(tmp_path / "bad.yaml", text)), "hi"), 1, *needles)


@pytest.mark.parametrize("line, needles", [
    ("hidden_size: big", ["`hidden_size` must be an integer", "'big'"]),
    ("hidden_size: 32.5", ["`hidden_size` must be an integer"]),
    ("hidden_size: true", ["`hidden_size` must be an integer"]),
    ("embedding_norm: 3", ["`embedding_norm` must be true or false"]),
    ("layer_norm_eps: .nan", ["`layer_norm_eps` must be a number", "nan"]),
    ("rope_theta: .inf", ["`rope_theta` must be a number"]),
    ("hidden_act: [gelu]", ["`hidden_act` must be a string"]),
    ("labels: {a: 1}", ["`labels` must be a list"]),
    ("labels: [no, maybe, yes]", ["`labels` must be a list of names, got [False, 'maybe', True]",
                                  "hint: YAML reads yes, no, on, off, true and false as booleans: quote them"]),
    ("norm: batchnorm", ["unsupported norm `batchnorm`", "layernorm, rmsnorm"]),
    ("position: rotry", ["unsupported position", "did you mean `rotary`"]),
])
def test_wrong_types_and_values(cli, tiny_config, tmp_path, line, needles):
    path = write(tmp_path / "bad.yaml", tiny_config.read_text() + line + "\n")
    assert_error(cli("encode", "--model", str(path), "hi"), 1, *needles)


@pytest.mark.parametrize("key, right", [("hiden_size", "hidden_size"), ("num_layers", "num_hidden_layers"),
                                        ("num_attention_head", "num_attention_heads")])
def test_misspelled_key_suggests_the_right_one(cli, tmp_path, key, right):
    path = write(tmp_path / "bad.yaml", f"{key}: 32\n")
    message = assert_error(cli("encode", "--model", str(path), "hi"), 1, f"unknown key `{key}`")
    assert f"did you mean `{right}`?" in message


@pytest.mark.parametrize("line, needles", [
    ("hidden_size: 0", ["`hidden_size` must be positive, got 0"]),
    ("num_hidden_layers: -1", ["`num_hidden_layers` must be positive, got -1"]),
    ("num_attention_heads: 0", ["`num_attention_heads` must be positive"]),
    ("vocab_size: -5", ["`vocab_size` must be positive"]),
    ("max_position_embeddings: 0", ["`max_position_embeddings` must be positive"]),
    ("num_attention_heads: 5", ["hidden_size 32 is not divisible by num_attention_heads 5"]),
    ("num_key_value_heads: 3", ["not a multiple of num_key_value_heads 3"]),
    ("hidden_dropout_prob: 1.5", ["`hidden_dropout_prob` must be in [0, 1)"]),
    ("type_vocab_size: -1", ["`type_vocab_size` must be 0 or more"]),
    ("pad_token_id: 999999", ["outside the vocabulary"]),
    ("vocab_size: 100", ["the tokenizer", "30522", "vocabulary has 100"]),
    ("vocab_size: 100000000000", ["GiB for its weights", "memory"]),
    ("num_hidden_layers: 1000000000", ["GiB for its weights"]),
])
def test_impossible_sizes(cli, tiny_config, tmp_path, line, needles, no_model_built):
    """Refused before anything is allocated: no model is even built on the meta device."""
    path = write(tmp_path / "bad.yaml", tiny_config.read_text() + line + "\n")
    assert_error(cli("encode", "--model", str(path), "hi"), 1, *needles)


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/object/new:os.system",
                                 "!!python/name:os.system"])
def test_python_tags_are_not_executed(cli, tmp_path, tag):
    marker = tmp_path / "pwned"
    path = write(tmp_path / "evil.yaml", f"hidden_size: {tag} [\"touch {marker}\"]\n")
    assert_error(cli("encode", "--model", str(path), "hi"), 1, "not valid YAML", "python/")
    assert not marker.exists()


# ---------------------------------------------------------------- checkpoints


def test_truncated_safetensors(cli, checkpoint, tmp_path):
    broken = copy_checkpoint(checkpoint, tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_error(cli("encode", "--model", str(broken), "hi"), 1, "model.safetensors", "cannot read", "truncated")


def safetensors_file(header: dict, data: bytes) -> bytes:
    """A safetensors file: the header's size (8 bytes, little-endian), the header (JSON), the data."""
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


F32_X = {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}  # its header is 62 bytes: data from byte 70


@pytest.mark.parametrize("content, detail", [
    (b"", "header too small"),  # the details are safetensors' own (safe_open reads the file)
    (b"\x00" * 7, "header too small"),
    (b"\x00" * 8, "invalid JSON in header"),
    (os.urandom(4096), "cannot read the safetensors file"),
    ((10**15).to_bytes(8, "little") + b"{}", "header too large"),
    ((13).to_bytes(8, "little") + b"{}" + b" " * 10, "invalid header length"),
    (safetensors_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, bytes(16)),
     "invalid shape, data type, or offset for tensor"),
    (safetensors_file(F32_X, bytes(8)), "incomplete metadata, file not fully covered"),
])
def test_corrupted_safetensors(cli, checkpoint, tmp_path, content, detail):
    broken = copy_checkpoint(checkpoint, tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(content)
    assert_error(cli("encode", "--model", str(broken), "hi"), 1, "model.safetensors: cannot read the safetensors file",
                 detail, "hint: the file is truncated or corrupted: download or save it again")


def test_a_header_that_fills_the_file_is_read(cli, checkpoint, tmp_path):
    """The header may end where the file ends: no tensors (the weights are then missing, not unreadable)."""
    empty = copy_checkpoint(checkpoint, tmp_path / "empty")
    (empty / "model.safetensors").write_bytes(safetensors_file({}, b""))
    assert_error(cli("encode", "--model", str(empty), "hi"), 1, "weights do not fit the config", "missing")


def test_weights_that_do_not_fit_the_config(cli, checkpoint, tmp_path):
    misfit = copy_checkpoint(checkpoint, tmp_path / "misfit")
    config = json.loads((misfit / "config.json").read_text())
    config["hidden_size"] = 64
    (misfit / "config.json").write_text(json.dumps(config))
    assert_error(cli("encode", "--model", str(misfit), "hi"), 1, "weights do not fit the config", "wrong shape",
                 "model wants")


def test_a_key_weight_of_the_wrong_width_is_named(cli, checkpoint, tmp_path):
    """Q, K and V are read into one fused projection: each piece's shape is checked, not only their rows' sum."""
    import torch
    from safetensors.torch import load_file, save_file

    misfit = copy_checkpoint(checkpoint, tmp_path / "misfit")
    tensors = load_file(str(misfit / "model.safetensors"))
    name = next(name for name in tensors if name.endswith("attention.self.key.weight"))
    tensors[name] = torch.zeros(32, 33)
    save_file(tensors, str(misfit / "model.safetensors"))
    assert_error(cli("encode", "--model", str(misfit), "hi"), 1, "1 of the wrong shape",
                 "encoder.blocks.0.attn.qkv.weight (32, 32) + (32, 33) + (32, 32) (model wants (96, 32))\n")


@pytest.mark.parametrize("count, more", [(4, ""), (5, " and 1 more")])
def test_weights_with_missing_tensors(cli, checkpoint, tmp_path, count, more):
    """The error names the first four missing weights and counts the others."""
    from safetensors.torch import load_file, save_file

    partial = copy_checkpoint(checkpoint, tmp_path / "partial")
    tensors = load_file(str(partial / "model.safetensors"))
    for name in ("embeddings.LayerNorm.weight", "attention.self.query.weight", "attention.output.dense.weight",
                 "intermediate.dense.weight", "layer.0.output.dense.weight")[:count]:
        del tensors[next(full for full in tensors if full.endswith(name))]
    save_file(tensors, str(partial / "model.safetensors"))
    assert_error(cli("encode", "--model", str(partial), "hi"), 1, f"weights do not fit the config: {count} missing: "
                 "encoder.embeddings.norm.weight, encoder.blocks.0.attn.qkv.weight, "
                 f"encoder.blocks.0.attn.out.weight, encoder.blocks.0.mlp.fc1.weight{more}\n"
                 "hint: the weights and config.json must come from the same model")


class Payload:
    """Unpickling this runs `touch MARKER`, if anything ever unpickles it without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_pickle_with_code_is_refused_and_not_run(cli, checkpoint, tmp_path, writer):
    import torch

    evil = config_folder(tmp_path / "evil", (checkpoint / "config.json").read_text())
    marker = tmp_path / "pwned"
    state = {"bert.embeddings.word_embeddings.weight": Payload(marker)}
    with open(evil / "pytorch_model.bin", "wb") as f:
        torch.save(state, f) if writer == "torch.save" else pickle.dump(state, f)
    message = assert_error(cli("encode", "--model", str(evil), "hi"), 1, "pytorch_model.bin", "refused",
                           "nothing in it was run")
    assert "weights_only" in message
    # the refusal says what it found: the global the payload calls, or the opcode torch's pickler refused
    assert ("unsupported GLOBAL posix.system" if writer == "torch.save" else "Unsupported operand") in message
    assert not marker.exists()


def test_truncated_bin(cli, checkpoint, tmp_path):
    import torch

    broken = config_folder(tmp_path / "broken", (checkpoint / "config.json").read_text())
    torch.save({"x": torch.zeros(1000)}, broken / "pytorch_model.bin")
    data = (broken / "pytorch_model.bin").read_bytes()
    (broken / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    message = assert_error(cli("encode", "--model", str(broken), "hi"), 1, "pytorch_model.bin", "cannot read",
                           "download or save it again")
    reason = re.search(r"cannot read the checkpoint \((\w+Error): (.+)\)", message)  # torch's own words, cut short
    assert reason and "zip archive" in reason.group(2), message


def test_a_training_checkpoint_is_not_a_state_dict(cli, checkpoint, tmp_path):
    """{"model": state_dict, "epoch": 3}, as training loops save it: weights_only reads it, tfcli refuses it."""
    import torch

    saved = config_folder(tmp_path / "saved", (checkpoint / "config.json").read_text())
    torch.save({"model": {"embeddings.weight": torch.zeros(4, 2)}, "epoch": 3}, saved / "pytorch_model.bin")
    assert_error(cli("encode", "--model", str(saved), "hi"), 1, "pytorch_model.bin: does not hold a dictionary of "
                 "tensors", "state_dict()")


def test_a_setting_tfcli_does_not_implement_is_named_with_what_it_implements(cli, tmp_path):
    falcon = config_folder(tmp_path / "falcon", json.dumps({"model_type": "falcon", "alibi": True}))
    assert_error(cli("encode", "--model", str(falcon), "hi"), 1,
                 "config.json: falcon with `alibi: true` is not supported by tfcli",
                 "tfcli implements alibi = null or false")


@pytest.mark.parametrize("values, needles", [
    ({"hidden_size": "wide"}, ['`hidden_size` must be a number, got "wide"', "transformers' default for it is 4096"]),
    ({"hidden_act": {}}, ["`hidden_act` must be a string, got {}"]),
    ({"rope_theta": "ten thousand"}, ['`rope_theta` must be a number, got "ten thousand"',  # before transformers 5
                                      "give it a number or leave it out"]),
    ({"hidden_size": 32.5, "head_dim": 8}, ["`hidden_size` must be an integer, got 32.5"]),
    ({"num_attention_heads": 0}, ["cannot read it as a llama config (integer division or modulo by zero)",
                                  "a value has the wrong type or is out of range"]),
])
def test_a_config_json_value_tfcli_cannot_compute_with_names_the_file(cli, tmp_path, values, needles):
    """Each says which file, and which key where one is to blame: never a crash while translating."""
    folder = config_folder(tmp_path / "m", json.dumps({"model_type": "llama", **values}))
    assert_error(cli("encode", "--model", str(folder), "hi"), 1, f"error: {folder / 'config.json'}: {needles[0]}",
                 *needles[1:])


def test_unsupported_model_type_lists_supported(cli, tmp_path):
    xlnet = config_folder(tmp_path / "xlnet", json.dumps({"model_type": "xlnet", "d_model": 32}))
    message = assert_error(cli("encode", "--model", str(xlnet), "hi"), 1,
                           f"{xlnet / 'config.json'}: unsupported model_type `xlnet`")
    assert "supported model types:" in message and "bert" in message


@pytest.mark.parametrize("content, needle", [
    ('{"hidden_size": 32}', "no `model_type`\nhint: a Hugging Face config.json names its model_type"),
    ("[1", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"model_type": "llama", "rope_scaling": "linear"}', "must be mappings"),
])
def test_bad_config_json(cli, tmp_path, content, needle):
    assert_error(cli("encode", "--model", str(config_folder(tmp_path / "m", content)), "hi"), 1, needle)


# ---------------------------------------------------------------- devices and dtypes


@pytest.mark.parametrize("device, code, needle", [
    ("gpu", 2, "unknown device `gpu`"),
    ("cuda:-1", 2, "unknown device"),
    ("xla", 2, "unsupported device `xla`"),
    ("meta", 2, "unsupported device `meta`"),
])
def test_unknown_device(cli, tiny_config, device, code, needle):
    assert_error(cli("encode", "--model", str(tiny_config), "--device", device, "hi"), code, needle)


def test_running_out_of_memory_anywhere_is_one_line(cli, tiny_config, monkeypatch):
    """A MemoryError outside the load (importing a CUDA build of torch under `ulimit -v` raises one) is not
    reported as a bug."""
    import tfcli.api

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(tfcli.api, "build_model", out_of_memory)
    message = assert_error(cli("encode", "--model", str(tiny_config), "hi"), 1, "error: out of memory")
    assert "ulimit -v" in message


@pytest.mark.parametrize("device", ["cuda", "cuda:3", "mps"])
def test_absent_device(cli, tiny_config, device):
    import torch

    if device.startswith("cuda") and torch.cuda.is_available() and device != "cuda:3":
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    message = assert_error(cli("encode", "--model", str(tiny_config), "--device", device, "hi"), 1, "not available")
    assert "--device cpu" in message


@pytest.mark.parametrize("dtype", ["float64", "int8", "bogus", ""])
def test_bogus_dtype(cli, tiny_config, dtype):
    message = assert_error(cli("encode", "--model", str(tiny_config), "--dtype", dtype, "hi"), 2,
                           f"unknown dtype `{dtype}`")
    assert "float32" in message


# ---------------------------------------------------------------- options


EXAMPLES = "for example 0,-1 or 8-11 or -3- (the last three) or all"


@pytest.mark.parametrize("args, needles", [
    (["--layers", "1"], ["--layers: 1 is out of range: the model has 1 layer\n", "hint: for example 0,-1", "has 1 layer (0 to 0)"]),
    (["--layers", "-2"], ["--layers: -2 is out of range"]),
    (["--layers", "x"], ["--layers: `x` is not an index or a range\n", f"hint: {EXAMPLES}; the model has 1 layer (0 to 0)"]),
    (["--layers", "0,,1"], ["is not an index or a range"]),
    (["--layers", "0-1"], ["--layers: 1 is out of range", f"hint: {EXAMPLES}; the model has 1 layer (0 to 0)"]),
    (["--heads", "2"], ["--heads: 2 is out of range", "2 heads", "(0 to 1)"]),
    (["--heads", "-3"], ["--heads: -3 is out of range: the model has 2 heads\n", f"hint: {EXAMPLES}; the model has 2 heads (0 to 1)"]),
    (["--heads", "1-0"], ["--heads: the range `1-0` is empty (1 comes after 0)\n", f"hint: {EXAMPLES}"]),
    (["--top-k", "-4"], ["--top-k must be at least 0"]),
    (["--width", "20"], ["--width must be at least 40"]),
    (["--max-length", "17"], ["--max-length 17 is more than the model's 16 positions"]),
    (["--top-k", "40000"], ["--top-k 40000 is larger than the vocabulary (30522)"]),
    (["--target", "x"], ["--target is for encoder-decoder models\n", "hint: tiny is an encoder"]),
    (["--seed", "-1"], ["--seed must be between 0"]),
    (["--seed", str(2**70)], ["--seed must be between 0"]),
    (["--max-capture-mb", "0"], ["--max-capture-mb must be positive"]),
])
def test_option_out_of_range(cli, tiny_config, args, needles):
    assert_error(cli("encode", "--model", str(tiny_config), *args, "hi"), 2, *needles)


def test_texts_and_file_together(cli, tiny_config, tmp_path):
    texts = write(tmp_path / "t.txt", "hello\n")
    assert_error(cli("encode", "--model", str(tiny_config), "--file", str(texts), "hi"), 2, "not both")


def test_not_a_number_option(cli, tiny_config):
    """Typer's own parser catches these (its boxed `Error` message), still exit 2 and no traceback."""
    result = cli("encode", "--model", str(tiny_config), "--top-k", "many", "hi")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Invalid value for '--top-k'" in result.stderr


def test_tokenize_max_length_too_small(cli):
    assert_error(cli("tokenize", "--max-length", "1", "hi"), 2, "--max-length 1 is too small")


# ---------------------------------------------------------------- text


@pytest.mark.parametrize("text, needle", [("", "text 1 is empty"), ("   \t ", "text 1 is only whitespace")])
def test_empty_or_blank_text(cli, tiny_config, text, needle):
    assert_error(cli("encode", "--model", str(tiny_config), text), 2, needle)


def test_blank_line_in_a_stream_is_skipped_with_a_warning_naming_it(cli, tiny_config):
    result = cli("encode", "--model", str(tiny_config), "--json", "-", input="one\n\nthree\n  \n")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["text"] for line in result.stdout.splitlines()] == ["one", "three"]
    assert "warning: line 2 of stdin is empty: skipped" in result.stderr
    assert "warning: line 4 of stdin is only whitespace: skipped" in result.stderr


def test_a_stream_of_blank_lines_is_no_text(cli, tiny_config):
    assert_error(cli("encode", "--model", str(tiny_config), "-", input="\n \n"), 2, "stdin holds only blank lines")


def test_no_text(cli, tiny_config):
    assert_error(cli("encode", "--model", str(tiny_config)), 2, "no text given")


def test_empty_stdin(cli, tiny_config):
    assert_error(cli("encode", "--model", str(tiny_config), "-", input=""), 2, "no text given: stdin is empty")


def test_non_utf8_stdin(tfcli_process, tiny_config):
    result = tfcli_process("encode", "--model", str(tiny_config), "-", input=b"fine\n\xff\xfe bad\n")
    assert result.returncode == 1
    assert b"Traceback" not in result.stderr and result.stdout == b""
    assert b"error: stdin is not valid UTF-8: line 2" in result.stderr
    assert b"hint: convert it" in result.stderr


def test_non_utf8_file(cli, tiny_config, tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    assert_error(cli("encode", "--model", str(tiny_config), "--file", str(path)), 1, "not valid UTF-8", "line 2")


def test_text_longer_than_positions_is_truncated_with_a_warning(cli, tiny_config):
    result = cli("encode", "--model", str(tiny_config), "--json", "word " * 100)
    assert result.exit_code == 0, result.stderr
    assert "warning: text 1 truncated from 102 to 16 tokens" in result.stderr
    assert len(json.loads(result.stdout)["ids"]) == 16


def test_no_truncate_refuses_long_text(cli, tiny_config):
    message = assert_error(cli("encode", "--model", str(tiny_config), "--no-truncate", "word " * 100), 2,
                           "text 1 has 102 tokens, more than the model's 16 positions")
    assert "--no-truncate" in message


def test_many_truncations_are_summarised(cli, tiny_config):
    result = cli("encode", "--model", str(tiny_config), "--json", "-",
                 input="word " * 40 + "\n" * 1 + ("word " * 40 + "\n") * 19)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("truncated from") == 5
    assert "15 more texts truncated (20 of 20 in all)" in result.stderr


@pytest.mark.slow
def test_a_million_characters(cli, tiny_config, tmp_path):
    path = tmp_path / "million.txt"
    path.write_text("abc " * 250_000 + "\n")
    tokenized = cli("tokenize", "--json", "--max-length", "8", "--file", str(path))
    encoded = cli("encode", "--model", str(tiny_config), "--json", "--file", str(path))
    for result in (tokenized, encoded):
        assert result.exit_code == 0, result.stderr
        assert "truncated from 250002" in result.stderr and "Traceback" not in result.stderr
    assert json.loads(tokenized.stdout)["tokens"] == ["[CLS]", "abc", "abc", "abc", "abc", "abc", "abc", "[SEP]"]
    assert len(json.loads(encoded.stdout)["ids"]) == 16


def test_config_of_a_huge_model_is_counted_not_built(cli, tiny_config, tmp_path, no_model_built):
    """`tfcli config` may show a model too big for this machine, but must not try to build it."""
    path = write(tmp_path / "huge.yaml", tiny_config.read_text() + "num_hidden_layers: 100000000\n")
    result = cli("config", "--json", str(path))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["parameters"] > 100_000_000 * 8000


def test_a_file_named_by_an_option_exits_1_when_missing_or_malformed(cli, tmp_path):
    """The one exit-code rule (docs/errors.md): a file an option names that is missing, unreadable, malformed or
    does not fit the model exits 1, whichever option names it (--model, --file, --dataset, --sae, --steer,
    --edges); a bad value of an option itself exits 2."""
    absent = tmp_path / "absent"
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    write(garbage / "cfg.json", "{not json")
    for args, needle in ((["encode", "--model", str(absent), "hi"], "no such file"),
                         (["encode", "--file", str(absent)], str(absent)),
                         (["attribute", "--dataset", str(absent)], "no such file"),
                         (["features", "--sae", str(absent), "hi"], "no such file"),
                         (["features", "--sae", str(garbage), "hi"], "not readable JSON"),
                         (["generate", "--model", "gpt2-small", "hi", "--steer", f"{absent}.gguf"], "no such file"),
                         (["circuit", "a b", "a c", "--target", "b", "--edges", str(absent)], str(absent))):
        assert_error(cli(*args), 1, needle)
    assert_error(cli("encode", "hi", "--layers", "99"), 2, "--layers")
    assert_error(cli("features", "--sae", str(garbage), "hi", "--top", "0"), 2, "--top")
