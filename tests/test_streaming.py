"""Scripting under load and memory bounds: `tokenize`/`encode --json -` over a 10,000-line stdin stream,
in batches, every record present and in order; a progress bar on stderr only when it is a terminal;
the attention capture estimated up front and kept under --max-capture-mb."""

from __future__ import annotations

import io
import json
import random

import pytest

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "home"]
LINES = 10_000


def stream(count: int = LINES, seed: int = 0) -> list[str]:
    """Numbered lines (so a lost or swapped record shows), some with odd spacing and unicode."""
    rng = random.Random(seed)
    extras = ["", "  ", " é", " 東京", "\t"]
    return [f"{i} " + " ".join(rng.choices(WORDS, k=rng.randint(1, 4))) + rng.choice(extras) for i in range(count)]


def make_small_model(path, max_positions: int = 32, layers: int = 1):
    """A tiny BERT-shaped model directory with its own 30-token vocabulary (config.json + vocab.txt, no
    weights: random from the seed). The bundled 30,522-token vocabulary would make the logit lens, not the
    streaming, the cost of these tests: the lens is tokens x layers x vocabulary."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"0123456789", *[f"##{d}" for d in "0123456789"]]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (path / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": len(vocab), "hidden_size": 16,
        "num_hidden_layers": layers, "num_attention_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": max_positions, "type_vocab_size": 2, "pad_token_id": 0}))
    return path


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return make_small_model(tmp_path_factory.mktemp("small"))


def check_records(stdout: bytes, lines: list[str]) -> list[dict]:
    records = [json.loads(line) for line in stdout.decode("utf-8").splitlines()]
    assert len(records) == len(lines)
    for number, (record, line) in enumerate(zip(records, lines)):
        assert record["text"] == line, number
        assert record["ids"]
    return records


@pytest.mark.slow
def test_tokenize_stream(tfcli_process):
    lines = stream()
    result = tfcli_process("tokenize", "--json", "-", input=("\n".join(lines) + "\n").encode("utf-8"))
    assert result.returncode == 0, result.stderr
    records = check_records(result.stdout, lines)
    assert records[0]["tokens"][:2] == ["[CLS]", "0"]
    assert result.stderr == b""  # no progress bar (stderr is a pipe), no warnings


@pytest.mark.slow
def test_encode_stream(tfcli_process, small_model):
    lines = stream()
    result = tfcli_process("encode", "--model", str(small_model), "--json", "--top-k", "1", "-",
                           input=("\n".join(lines) + "\n").encode("utf-8"))
    assert result.returncode == 0, result.stderr[-2000:]
    records = check_records(result.stdout, lines)
    assert all(r["weights"] == "random" and len(r["lens"]) == 1 for r in records)
    stderr = result.stderr.decode("utf-8")
    assert stderr.startswith("model: ") and stderr.count("\n") == 1  # the model line only: no progress on a pipe


def test_stream_with_crlf_and_no_final_newline(cli):
    result = cli("tokenize", "--json", "-", input="one\r\ntwo\r\nthree")
    assert [json.loads(line)["text"] for line in result.stdout.splitlines()] == ["one", "two", "three"]


def test_batched_encode_matches_one_at_a_time(cli, small_model):
    """Padding to a batch changes no record: a batch of 40 and 40 single runs print the same lines."""
    lines = stream(40, seed=1)
    together = cli("encode", "--model", str(small_model), "--json", "-", input="\n".join(lines))
    assert together.exit_code == 0, together.stderr
    alone = [cli("encode", "--model", str(small_model), "--json", "--", line).stdout for line in lines]
    for a, b in zip(together.stdout.splitlines(), alone):
        ra, rb = json.loads(a), json.loads(b)
        assert ra["ids"] == rb["ids"] and ra["lens"] == rb["lens"]
        for sa, sb in zip(ra["shapes"], rb["shapes"]):
            assert sa["shape"] == sb["shape"] and abs(sa["mean"] - sb["mean"]) < 1e-5


def test_progress_bar_when_stderr_is_a_terminal(cli, monkeypatch):
    from rich.console import Console

    import tfcli.cli.console

    terminal = io.StringIO()
    monkeypatch.setattr(tfcli.cli.console.STDERR, "console", Console(file=terminal, force_terminal=True, width=100))
    lines = stream(2500)
    result = cli("tokenize", "--json", "-", input="\n".join(lines))
    assert result.exit_code == 0
    check_records(result.stdout.encode("utf-8"), lines)
    shown = terminal.getvalue()
    assert "tokenize" in shown and "2500 texts" in shown
    assert "2500 texts" not in result.stdout


# ---------------------------------------------------------------- memory bounds


def test_capture_limit_refuses_with_the_cost_and_a_hint(cli, small_model):
    result = cli("encode", "--model", str(small_model), "--max-capture-mb", "0.0001", "the cat sat on the mat")
    assert result.exit_code == 1
    assert "error: one text of 8 tokens would capture 512 bytes of attention (2 heads x 8^2 positions x 1 layer)" \
        in result.stderr
    assert "--layers" in result.stderr and "Traceback" not in result.stderr


def test_capture_limit_splits_batches_and_keeps_every_record(cli, small_model):
    lines = stream(50, seed=2)
    unlimited = cli("encode", "--model", str(small_model), "--json", "-", input="\n".join(lines))
    limited = cli("encode", "--model", str(small_model), "--json", "--max-capture-mb", "0.02", "-",
                  input="\n".join(lines))
    assert limited.exit_code == 0, limited.stderr
    assert "at a time to stay under --max-capture-mb 0.02" in limited.stderr
    assert "capturing 32 texts at once would hold" in limited.stderr  # a batch of the stream
    assert [json.loads(r)["text"] for r in limited.stdout.splitlines()] == lines
    for a, b in zip(unlimited.stdout.splitlines(), limited.stdout.splitlines()):
        assert json.loads(a)["lens"] == json.loads(b)["lens"]


def test_save_refuses_what_would_not_fit(cli, small_model, tmp_path):
    path = tmp_path / "out.safetensors"
    result = cli("encode", "--model", str(small_model), "--save", str(path), "--max-capture-mb", "0.001", "-",
                 input="\n".join(stream(20)))
    assert result.exit_code == 1
    assert "--save keeps all 20 texts in one batch" in result.stderr
    assert not path.exists()


def test_selected_heads_and_layers_are_all_that_is_kept(cli, tmp_path):
    import torch
    from safetensors.torch import load_file

    config = tmp_path / "tiny.yaml"
    config.write_text("hidden_size: 32\nnum_hidden_layers: 3\nnum_attention_heads: 4\nintermediate_size: 64\n"
                      "max_position_embeddings: 16\nhead: mlm\n")
    path = tmp_path / "out.safetensors"
    result = cli("encode", "--model", str(config), "--layers", "-1", "--heads", "1,3", "--save", str(path), "hi there")
    assert result.exit_code == 0, result.stderr
    tensors = load_file(str(path))
    assert [name for name in tensors if name.startswith("attention.")] == ["attention.2"]
    assert tensors["attention.2"].shape == (1, 2, 4, 4)  # heads 1 and 3 only
    full = tmp_path / "full.safetensors"
    assert cli("encode", "--model", str(config), "--save", str(full), "hi there").exit_code == 0
    # close, not equal: unselected layers take the fused attention kernel, which rounds differently
    assert torch.allclose(tensors["attention.2"], load_file(str(full))["attention.2"][:, [1, 3]], atol=1e-6)


def test_long_texts_with_every_layer_stay_under_the_limit(cli, tmp_path):
    """1024 positions, every layer and head: batches are sized to the limit instead of exhausting memory."""
    model = make_small_model(tmp_path, max_positions=1024, layers=2)
    long_text = "the " * 1100
    result = cli("encode", "--model", str(model), "--json", "--max-capture-mb", "20", long_text, long_text, long_text)
    assert result.exit_code == 0, result.stderr
    assert "truncated from 1102 to 1024 tokens" in result.stderr
    assert "16.0 MB of attention (2 heads x 1024^2 positions x 2 layers)" in result.stderr
    assert "running 1 at a time" in result.stderr
    assert len(result.stdout.splitlines()) == 3
