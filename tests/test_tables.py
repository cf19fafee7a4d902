"""What the terminal tables say, read back from the rendered text and checked against the numbers behind them:
the key each query attends to most (against the saved attention weights of a trained model), the lens's top
token per position and the stage statistics (against the JSON record of the same run), each generated
token with its probability, each label's probability and the prediction."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file

SENTENCE = "The animal didn't cross the street because it was too tired"


WIDE = ("--width", "200")  # every table on one page, so that a row is one line


def cells(line: str) -> list[str]:
    """The cells of one line of a rendered table (two spaces or more apart)."""
    return [cell for cell in re.split(r"\s{2,}", line.strip()) if cell]


def table_rows(text: str, title: str) -> list[list[str]]:
    """The rows (header first) of the table printed after the line starting with `title`: the header, the
    rule under it (skipped), then one row per line up to the first blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if not line.lstrip().startswith("─"):
            rows.append(cells(line))
    return rows


def heatmap(text: str, title: str, keys: int) -> list[tuple[str, list[str], list[str]]]:
    """The rows of the attention map printed after `title` (on one page): (query label, the glyph of each key,
    the entries of `attends most to`). The cells sit under the key numbers, a space apart."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("query "))
    first = lines[header].index(" 0 ") + 1  # under the units digit of key 0
    rows = []
    for line in lines[header + 1:]:
        if line.startswith("rows: queries"):
            break
        glyphs = [line[first + 2 * k] for k in range(keys)]
        rows.append((line[:first].strip(), glyphs, cells(line[first + 2 * keys - 1:])))
    return rows


def run(cli, *args: str):
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    return result


def test_attends_most_to_names_the_most_attended_key(cli, minilm_dir, tmp_path):
    saved = tmp_path / "run.safetensors"
    shown = run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--layers", "2", "--heads", "1",
                "--save", str(saved), *WIDE).stdout
    weights = load_file(str(saved))["attention.2"][0, 0]  # the one head kept: (query, key)
    (record,) = [json.loads(line) for line in run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--layers",
                                                  "2", "--heads", "1", "--json").stdout.splitlines()]
    tokens = record["tokens"]
    rows = heatmap(shown, "attention: layer 2, head 1", len(tokens))
    assert [label for label, _, _ in rows] == [f"{i} {token}" for i, token in enumerate(tokens)]
    for query, (_, glyphs, most) in enumerate(rows):
        index, named, weight = re.fullmatch(r"(\d+) (.+) (\d\.\d\d)", most[0]).groups()
        best = int(weights[query].argmax())
        assert (int(index), named) == (best, tokens[best]), \
            f"query {query} ({tokens[query]}): table says {named}, weights say {tokens[best]}"
        assert float(weight) == pytest.approx(float(weights[query, best]), abs=0.005)
        # and every cell of the row shows its weight's level on the README's scale, key by key
        assert glyphs == [_level(w) for w in weights[query].tolist()]
    assert {tokens[int(weights[q].argmax())] for q in range(len(tokens))} != {tokens[0]}  # not one answer for all


def test_lens_and_stage_tables_say_what_the_record_says(cli, minilm_dir):
    args = ("encode", SENTENCE, "--model", str(minilm_dir), "--layers", "3", "--heads", "0", "--top-k", "1")
    shown = run(cli, *args, *WIDE).stdout
    (record,) = [json.loads(line) for line in run(cli, *args, "--json").stdout.splitlines()]
    lens_rows = table_rows(shown, "logit lens")
    (lens,) = record["lens"]
    assert lens_rows[0] == ["position", "layer 3"]  # positions down, layers across
    expected = [f"{top[0]['token']} {top[0]['prob']:.2g}" for top in lens["top"]]
    assert [row[1] for row in lens_rows[1:]] == expected
    every = ("encode", SENTENCE, "--model", str(minilm_dir), "--layers", "all", "--top-k", "0", *WIDE)
    stages = {row[0]: row for row in table_rows(run(cli, *every).stdout, "stages")[1:]}
    assert list(stages) == [stage["stage"] for stage in record["shapes"]]
    for stage in record["shapes"]:
        row = stages[stage["stage"]]
        mean, std, norm = (float(cell.replace(",", "")) for cell in row[-3:])
        assert mean == pytest.approx(stage["mean"], abs=6e-5) and std == pytest.approx(stage["std"], abs=6e-5), row
        assert norm == pytest.approx(stage["norm"], abs=6e-3), row
        assert row[1] == "(" + ", ".join(map(str, stage["shape"])) + ")"


def test_generate_step_table_says_what_the_record_says(cli, peaked_gpt2):
    path, _ = peaked_gpt2
    args = ("generate", "time flies like", "--model", str(path), "-n", "3")
    shown = run(cli, *args, *WIDE).stdout
    record = json.loads(run(cli, *args, "--json").stdout)
    steps = [row for row in table_rows(shown, "prompt 1") if row[0].isdigit()]
    assert len(steps) == len(record["steps"]) == 3
    for row, step in zip(steps, record["steps"]):
        assert row[1] == repr(step["token"]) and row[2] == str(step["id"])
        assert float(row[3]) == pytest.approx(step["prob"], rel=5e-3)
        best_other = next(t for t in step["top"] if t["id"] != step["id"])
        assert row[4].startswith(f"{best_other['token']!r} {best_other['prob']:.3g}")


def test_classify_table_says_what_the_record_says(cli, tmp_path, save_hf_model):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, initializer_range=0.5,
                        id2label={0: "negative", 1: "neutral", 2: "positive"})
    hf = save_hf_model(BertForSequenceClassification, config, tmp_path)
    shown = run(cli, "classify", "I loved this film", "--model", str(tmp_path)).stdout
    record = json.loads(run(cli, "classify", "I loved this film", "--model", str(tmp_path), "--json").stdout)
    with torch.no_grad():
        probs = hf(input_ids=torch.tensor([record["ids"]])).logits[0].softmax(-1).tolist()
    assert record["probs"] == pytest.approx(probs, abs=1e-5)
    order = sorted(range(3), key=lambda i: -probs[i])
    assert record["prediction"] == record["labels"][order[0]]
    label_rows = [row for row in (cells(line) for line in shown.splitlines()) if row and row[0] in record["labels"]]
    assert [row[0] for row in label_rows] == [record["labels"][i] for i in order]  # most probable first
    for row, i in zip(label_rows, order):
        assert any(cell.rstrip("%") and _as_probability(cell) == pytest.approx(probs[i], abs=0.0051) for cell in row[1:])
    assert record["prediction"] in [line for line in shown.splitlines() if "predict" in line.lower()][0]


def _as_probability(cell: str) -> float | None:
    try:
        return float(cell[:-1]) / 100 if cell.endswith("%") else float(cell)
    except ValueError:
        return None


def _level(weight: float) -> str:
    """A weight's glyph on the absolute scale the README gives (blank below 0.005)."""
    for lowest, glyph in ((0.5, "█"), (0.3, "▓"), (0.15, "▒"), (0.05, "░"), (0.005, "·")):
        if weight >= lowest:
            return glyph
    return " "


SEQ2SEQ = ("architecture: encoder-decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_decoder_layers: 2\n"
           "num_attention_heads: 2\nintermediate_size: 64\nmax_position_embeddings: 32\ntype_vocab_size: 0\n"
           "head: lm\ndecoder_start_token_id: 101\n")


def token_list(text: str, label: str) -> list[str]:
    """The items of the `label:` token list (`0 [CLS]  1 time ...`), over every line it wraps to."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(label + ": "))
    items = cells(lines[start][len(label) + 2:])
    for line in lines[start + 1:]:
        if not line or not line[0].isdigit():
            break
        items += cells(line)
    return items


@pytest.mark.parametrize("width", ["200", "40"])  # on one line; wrapped between tokens
def test_the_token_list_shows_every_token_in_order_with_its_index(cli, minilm_dir, width):
    (record,) = [json.loads(line) for line in run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--json",
                                                  "--top-k", "0").stdout.splitlines()]
    shown = run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--top-k", "0", "--width", width).stdout
    assert token_list(shown, "tokens") == [f"{i} {token}" for i, token in enumerate(record["tokens"])]


def test_an_encoder_decoder_labels_lens_and_summary_rows_with_its_decoder_input(cli, tmp_path):
    """The lens and the summary's `predicts` column are about the decoder's positions: their rows are labelled
    with the decoder input (start token, then --target), not the source text, which is longer here."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    args = ("encode", "the animal did not cross the street", "--model", str(path), "--target", "time flies", *WIDE)
    (record,) = [json.loads(line) for line in run(cli, *args, "--json").stdout.splitlines()]
    target = [f"{i} {token}" for i, token in enumerate(record["target_tokens"])]
    assert len(record["tokens"]) > len(target)
    shown = run(cli, *args, "--no-color").stdout
    assert token_list(shown, "decoder input") == target
    summaries = [table_rows("\n".join(shown.splitlines()[i:]), "every layer")
                 for i, line in enumerate(shown.splitlines()) if line.startswith("every layer")]
    (predicts,) = [rows for rows in summaries if "predicts" in rows[0]]
    assert [row[0] for row in predicts[1:]] == target
    last = record["lens"][-1]["top"]  # what the last layer predicts at each decoder position
    # `0-1: token`, or of several runs the last layer's
    assert [row[-1].split()[-1] for row in predicts[1:]] == [top[0]["token"] for top in last]
    lens = table_rows(run(cli, *args, "--layers", "1", "--no-color").stdout, "logit lens")
    assert lens[0] == ["position", "layer 1"]
    assert [row[0] for row in lens[1:]] == target
    assert [row[1].split()[0] for row in lens[1:]] == [top[0]["token"] for top in last]
