"""Determinism: the same --seed gives the same numbers on every run (JSON and --save), and across CPU
thread counts within 1e-5; different seeds give different numbers."""

from __future__ import annotations

import json

import pytest

CONFIG = """\
architecture: encoder
hidden_size: 64
num_hidden_layers: 2
num_attention_heads: 4
intermediate_size: 128
max_position_embeddings: 32
head: mlm
"""
TEXTS = ["the cat sat on the mat", "attention is all you need", "a"]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    return path


def encode_json(cli, config, *args):
    result = cli("encode", "--model", str(config), "--json", *args, *TEXTS)
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_same_seed_same_json_every_run(cli, tfcli_process, config):
    first = encode_json(cli, config, "--seed", "7")
    assert encode_json(cli, config, "--seed", "7") == first
    other_process = tfcli_process("encode", "--model", str(config), "--json", "--seed", "7", *TEXTS)
    assert other_process.returncode == 0, other_process.stderr
    assert other_process.stdout.decode("utf-8") == first


def test_different_seeds_differ(cli, config):
    a = [json.loads(line) for line in encode_json(cli, config, "--seed", "1").splitlines()]
    b = [json.loads(line) for line in encode_json(cli, config, "--seed", "2").splitlines()]
    assert [r["ids"] for r in a] == [r["ids"] for r in b]  # same tokens...
    assert [r["shapes"] for r in a] != [r["shapes"] for r in b]  # ...different numbers


def test_same_seed_same_saved_tensors(cli, config, tmp_path):
    from safetensors.torch import load_file

    saved = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        path = tmp_path / f"{name}.safetensors"
        result = cli("encode", "--model", str(config), "--seed", seed, "--save", str(path), *TEXTS)
        assert result.exit_code == 0, result.stderr
        saved.append(load_file(str(path)))
    a, b, c = saved
    assert a.keys() == b.keys() and "attention.1" in a and "hidden.2" in a
    for name in a:
        assert a[name].equal(b[name]), name
    assert not a["hidden.2"].equal(c["hidden.2"])


def test_same_numbers_across_thread_counts(config):
    import torch

    from tfcli.commands.encode import core as encode
    from tfcli.api import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(config), seed=5)
    encodings = tokenizer.encode(TEXTS, max_length=32)
    options = encode.EncodeOptions()
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out, _ = encode.encode_batch(model, tokenizer, encodings, None, options)
            outputs.append(out)
    finally:
        torch.set_num_threads(threads)
    one, two = outputs
    assert one.values.keys() == two.values.keys() and any("resid_post" in name for name in one.values)
    for name in one.values:  # every site the pass kept: hidden states and the stages'
        assert (one.values[name] - two.values[name]).abs().max().item() <= 1e-5, name
    assert one.patterns.keys() == two.patterns.keys() and one.patterns
    for name in one.patterns:
        assert (one.patterns[name] - two.patterns[name]).abs().max().item() <= 1e-5, name
    assert (one.logits - two.logits).abs().max().item() <= 1e-5


def test_weights_do_not_depend_on_global_rng(config):
    """Random weights come from their own generator: torch's global seed does not change them."""
    import torch

    from tfcli.api import load_model

    torch.manual_seed(123)
    a = load_model(str(config), seed=9).state_dict()
    torch.manual_seed(456)
    torch.rand(10)
    b = load_model(str(config), seed=9).state_dict()
    assert all(a[name].equal(b[name]) for name in a)
