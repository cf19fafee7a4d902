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

from tfcli.commands.generate.render import probability

SENTENCE = "The animal didn't cross the street because it was too tired"


WIDE = ("--width", "200")
ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")  # every table on one page, so that a row is one line


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
        # and every cell of the row shows its weight's level on docs/commands.md's scale ("Terminal views"), key by key
        assert glyphs == [_level(w) for w in weights[query].tolist()]
        # beside it the three keys it attends to most, the first always, the others from 0.005 (0.01 as shown)
        values, keys = weights[query].topk(3)
        assert most == [f"{k} {tokens[k]} {w:.2f}" for rank, (w, k) in enumerate(zip(values.tolist(), keys.tolist()))
                        if rank == 0 or w >= 0.005]
    assert any(len(most) < 3 for _, _, most in rows)  # some query has a weight under 0.005 in its top 3
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
        assert float(row[3]) == pytest.approx(step["prob"], rel=5e-3, abs=5e-4)  # 3 decimals, or 1.2e-04 below
        assert re.fullmatch(r"[01]\.\d{3}|\d\.\de-\d\d", row[3]), row[3]  # 0.900 beside 0.702, never 0.9
        best_other = next(t for t in step["top"] if t["id"] != step["id"])
        assert row[4].startswith(f"{best_other['token']!r} {probability(best_other['prob'])}")


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
    """A weight's glyph on the absolute scale docs/commands.md gives ("Terminal views"; blank below 0.005)."""
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


def lens_section(text: str) -> list[str]:
    """The lines of the logit lens table(s): from the first `logit lens` title to the next section."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("logit lens"))
    end = next((i for i, line in enumerate(lines) if i > start and line.startswith("every layer")), len(lines))
    return lines[start:end]


def test_the_lens_table_says_what_it_holds_and_keeps_a_cell_on_one_line_when_it_fits(cli, minilm_dir):
    """Its title says how many tokens a cell holds; when its layers take several pages, each page says which
    layers it holds. A cell's tokens share one line exactly when the whole table fits the width."""
    args = ("encode", "time flies like an arrow", "--model", str(minilm_dir), "--layers", "all", "--no-color")
    wide = lens_section(run(cli, *args, "--top-k", "3", "--width", "1000").stdout)
    # MiniLM has no LM head: the lens reads through the input embeddings, and says it is not a prediction
    assert wide[0] == ("logit lens: each layer's top 3 tokens through the input token embeddings (no LM head: not a "
                       "prediction)")
    assert [cells(line)[0] for line in wide[3:10]] == ["0 [CLS]", "1 time", "2 flies", "3 like", "4 an", "5 arrow",
                                                       "6 [SEP]"]  # a position a line, 3 tokens x 6 layers
    assert all(len(cells(line)) == 1 + 3 * 6 for line in wide[3:10])
    fits = max(len(line) for line in wide)
    assert lens_section(run(cli, *args, "--top-k", "3", "--width", str(fits)).stdout) == wide
    narrower = lens_section(run(cli, *args, "--top-k", "3", "--width", str(fits - 1)).stdout)
    assert narrower[0] == wide[0]  # still one page, but a token per line: each position takes 3 lines
    assert [len(cells(line)) for line in narrower[3:6]] == [1 + 6, 6, 6]
    paged = run(cli, *args, "--top-k", "3", "--width", "40").stdout
    notes = re.findall(r"\(page (\d) of (\d): (layers? [\d-]+)\)", paged.replace("\n", " "))
    assert [note for _, _, note in notes] == ["layer 0", "layers 1-2", "layer 3", "layer 4", "layer 5"]
    assert [(int(page), int(pages)) for page, pages, _ in notes] == [(page, 5) for page in range(1, 6)]
    for top_k, title in (("1", "top token"), ("2", "top 2 tokens")):
        lens = lens_section(run(cli, *args, "--top-k", top_k, "--width", "120").stdout)
        assert lens[0] == f"logit lens: each layer's {title} through the input token embeddings (no LM head: not a " \
                          "prediction)"


def sliced_rows(lines: list[str]) -> list[list[str]]:
    """A table's rows (header first, from `lines[0]`), cut into cells at the columns of the rule under the
    header, so that a cell with several runs (two spaces apart) stays one cell."""
    starts = [m.start() for m in re.finditer("─+", lines[1])] + [None]
    rows = []
    for line in [lines[0], *lines[2:]]:
        if not line.strip():
            break
        rows.append([line[a:b].strip() for a, b in zip(starts, starts[1:])])
    return rows


def summary_runs(cell: str) -> dict[int, str]:
    """`0-1: 0 [CLS]  2: 1 le` -> {0: '0 [CLS]', 1: '0 [CLS]', 2: '1 le'}: what each layer's run says."""
    said = {}
    for run_text in re.split(r"\s{2,}", cell):
        layers, what = run_text.split(": ", 1)
        first, _, last = layers.partition("-")
        for layer in range(int(first), int(last or first) + 1):
            said[layer] = what
    return said


def test_the_summary_names_each_kind_and_head_and_says_each_layers_most_attended_key(cli, tmp_path, minilm_dir):
    """The summary of every layer: a table per token sequence (an encoder-decoder's source, then its decoder
    input), a column per kind of attention and head; each run of layers names the key they attend to most,
    as the JSON's max_key says for each layer."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    args = ("encode", "time flies like an arrow", "--model", str(path), "--target", "le temps", "--heads", "0,1",
            *WIDE)
    (record,) = [json.loads(line) for line in run(cli, *args, "--json").stdout.splitlines()]
    lines = run(cli, *args, "--no-color").stdout.splitlines()
    titles = [i for i, line in enumerate(lines) if line.startswith("every layer")]
    assert lines[titles[0]] == ("every layer, a line per position: runs of layers that agree merged (`1-5: 0 "
                                "[CLS]`: layers 1 to 5 attend most to key 0, [CLS])")
    tables = [sliced_rows(lines[i + 1:]) for i in titles]
    heads = ["(head 0)", "(head 1)"]
    assert [rows[0] for rows in tables] == [
        ["position"] + [f"encoder: attends most to {head}" for head in heads],
        ["position"] + [f"{kind}: attends most to {head}" for kind in ("decoder", "cross") for head in heads]
        + ["predicts"]]
    for rows, tokens in zip(tables, (record["tokens"], record["target_tokens"])):
        assert [row[0] for row in rows[1:]] == [f"{i} {token}" for i, token in enumerate(tokens)]
        for column, header in enumerate(rows[0]):
            if header == "predicts":  # the lens's top token of each layer, at each decoder position
                assert [summary_runs(row[column]) for row in rows[1:]] == [
                    {lens["layer"]: lens["top"][position][0]["token"] for lens in record["lens"]}
                    for position in range(len(tokens))]
            if ": attends most to" not in header:
                continue
            kind, head = header.split(":")[0], int(header[-2])
            maps = {a["layer"]: a["max_key"] for a in record["attention"] if a["kind"] == kind and a["head"] == head}
            keys = record["tokens"] if kind in ("encoder", "cross") else record["target_tokens"]
            assert len(maps) == 2
            for query, row in enumerate(rows[1:]):
                said = summary_runs(row[column])
                assert said == {layer: f"{most[query]} {keys[most[query]]}" for layer, most in maps.items()}, \
                    (header, row)
    plain = table_rows(run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--no-color", *WIDE).stdout,
                       "every layer")
    # the mean over heads: no head named; MiniLM has no LM head, so the lens column says it is not a prediction
    assert plain[0] == ["position", "attends most to", "lens top token"]


@pytest.mark.parametrize("width", ["60", "80"])
def test_a_summary_page_of_the_lens_alone_is_titled_by_the_lens(cli, width):
    """At 80 columns the summary goes on two pages, the attention column's and the lens's: the lens page's title
    explains a lens run, not the attention's (issue 51, item 9: it repeated `attend most to key 0`)."""
    lines = run(cli, "encode", "time flies like an arrow", "--no-color", "--width", width).stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("every layer, a line per position")]
    assert len(starts) == 2
    pages = {}
    for start in starts:
        header = next(i for i in range(start, len(lines)) if lines[i].startswith("position"))
        pages[lines[header].split()[-1]] = " ".join(lines[start:header])
    assert set(pages) == {"to", "predicts"}  # `attends most to`, then the MLM head's `predicts`
    assert "attend most to key 0" in pages["to"] and "(page 1 of 2)" in pages["to"]
    assert "attend" not in pages["predicts"] and "(page 2 of 2)" in pages["predicts"]
    assert "layers 1 to 5 predict Paris" in pages["predicts"]


@pytest.mark.parametrize("layers,note", [([], "; sublayers of the last block only"),
                                         (["--layers", "3,1"], "; sublayers of block 1, 3 only"),
                                         (["--layers", "all"], "")])
def test_the_stages_table_says_which_sublayers_it_shows_and_aligns_its_numbers(cli, minilm_dir, layers, note):
    lines = run(cli, "encode", SENTENCE, "--model", str(minilm_dir), "--no-color", *WIDE, *layers).stdout.splitlines()
    start = lines.index(f"stages (float32{note})")
    rows = sliced_rows(lines[start + 1:])
    assert rows[0] == ["stage", "shape", "params", "mean", "std", "norm"]
    shown = [row[0] for row in rows[1:]]
    blocks = {"": range(6), "; sublayers of the last block only": [5], "; sublayers of block 1, 3 only": [1, 3]}[note]
    assert [stage for stage in shown if not stage.endswith(("resid_pre", "resid_post")) and stage.startswith("blocks.")] \
        == [f"blocks.{block}.{sublayer}.out" for block in blocks for sublayer in ("attn", "mlp")]
    body = lines[start + 3:start + 1 + len(rows)]
    for column, name in enumerate(rows[0][1:], start=1):  # numbers right-aligned: under their header's end
        end = re.search(rf"\b{name}\b", lines[start + 1]).end()
        assert all(line[:end].endswith(row[column]) for line, row in zip(body, rows[1:])), name


ONE_LAYER = ("hidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\nintermediate_size: 64\n"
             "max_position_embeddings: 32\nhead: mlm\n")


@pytest.mark.parametrize("model,args,lens,summary", [
    ("minilm", [], False, True),  # the first-run view: the last layer in full, every layer in the summary
    ("minilm", ["--top-k", "2"], True, True),  # --top-k asks for the lens table
    ("minilm", ["--top-k", "0"], False, True),  # no lens at all: the summary of the attention alone
    ("minilm", ["--layers", "3"], True, False),  # only layer 3 is captured, and shown in full: no summary
    ("minilm", ["--layers", "all"], True, False),  # every layer in full: nothing left to summarize
    ("minilm", ["--layers", "all", "--heads", "0"], True, False),
    ("one layer", [], True, False),  # one layer, shown in full: its lens instead of a summary
])
def test_the_view_opens_with_the_text_and_shows_the_lens_or_the_summary(cli, minilm_dir, tmp_path, model, args, lens,
                                                                       summary):
    """A text's view: its title (bold), its pair, its tokens; then stages and maps; the summary when some
    captured layer is not shown in full; the lens table when asked for (--top-k) or when there is no summary
    (whose `predicts` column says the same)."""
    path = tmp_path / "one.yaml"
    path.write_text(ONE_LAYER, encoding="utf-8")
    source = str(minilm_dir) if model == "minilm" else str(path)
    result = run(cli, "encode", "time flies", "--pair", "fruit flies", "--model", source, "--no-color", *WIDE, *args)
    lines = result.stdout.splitlines()
    assert lines[:3] == ["text 1: 'time flies'", "pair: 'fruit flies'",
                         "tokens: 0 [CLS]  1 time  2 flies  3 [SEP]  4 fruit  5 flies  6 [SEP]"]
    assert any(line.startswith("logit lens") for line in lines) == lens
    assert any(line.startswith("every layer") for line in lines) == summary
    assert lines[-1].strip() and not lines[0].startswith(" ")  # no blank line at the end
    assert not any(line == after == "" for line, after in zip(lines, lines[1:]))  # nor two in a row
    coloured = run(cli, "encode", "time flies", "--model", source, "--color", *WIDE, *args).stdout
    assert coloured.startswith("\x1b[1mtext 1: 'time flies'\x1b[0m\n")
    plain = ANSI_CODE.sub("", coloured).splitlines()
    heat = plain.index(next(line for line in plain if line.startswith("query "))) + 1
    assert "\x1b[38;5;" in coloured.splitlines()[heat]  # the map's first row: its heat cells in colour


def test_an_encoder_decoder_view_lists_the_source_then_the_decoder_input(cli, tmp_path):
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    lines = run(cli, "encode", "time flies", "--model", str(path), "--target", "le temps", "--no-color",
                *WIDE).stdout.splitlines()
    assert lines[:3] == ["text 1: 'time flies'", "tokens: 0 [CLS]  1 time  2 flies  3 [SEP]",
                         "decoder input: 0 [CLS]  1 le  2 temps"]


def test_attn_top_sets_the_keys_named_beside_each_map(cli, minilm_dir):
    """--attn-top 1: one key per query beside the map, however many would fit."""
    lines = run(cli, "encode", "time flies", "--model", str(minilm_dir), "--no-color", "--attn-top", "1",
                *WIDE).stdout.splitlines()
    rows = [line for line in lines if re.match(r"\d \S+ .*\d\.\d\d", line)]
    assert rows and all(len(re.findall(r"\d \S+ \d\.\d\d", line)) == 1 for line in rows), rows


def test_an_encoder_decoder_stages_table_details_each_stacks_last_block(cli, tmp_path):
    """By default each stack's own last block shows its sublayers: the encoder's block 2, the decoder's 1."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ.replace("num_hidden_layers: 2", "num_hidden_layers: 3"), encoding="utf-8")
    lines = run(cli, "encode", "time flies", "--model", str(path), "--target", "le temps", "--no-color",
                *WIDE).stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("stages"))
    stages = [row[0] for row in sliced_rows(lines[start + 1:])[1:]]
    assert [stage for stage in stages if not stage.endswith(("resid_pre", "resid_post")) and "blocks." in stage] == [
        "encoder.blocks.2.attn.out", "encoder.blocks.2.mlp.out", "decoder.blocks.1.attn.out",
        "decoder.blocks.1.cross_attn.out", "decoder.blocks.1.mlp.out"]


LONG = ("the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat near the door and the bird "
        "sings in the tall green tree as the sun rises over the quiet hills")  # 39 tokens


def map_pages(lines: list[str], title: str) -> list[tuple[str, list[str]]]:
    """Each page of the map whose title starts with `title`: (its title, unwrapped; the header lines, down to
    the `query` line, which holds the keys' units digits)."""
    pages = []
    for start in [i for i, line in enumerate(lines) if line.startswith(title)]:
        end = next(i for i in range(start, len(lines)) if lines[i].startswith(("query", " ")))
        query = next(i for i in range(end, len(lines)) if lines[i].startswith("query"))
        pages.append((" ".join(lines[start:end]), lines[end:query + 1]))
    return pages


@pytest.mark.parametrize("width,top", [("40", []), ("50", []), ("120", []), ("40", ["--attn-top", "1"])])
def test_each_page_of_a_map_numbers_its_keys_above_their_cells(cli, minilm_dir, width, top):
    """A map too wide for the terminal goes on pages; each page's title says which keys it holds and whether
    it holds the keys attended to most, and reading down the header above a cell gives that cell's key."""
    lines = run(cli, "encode", LONG, "--model", str(minilm_dir), "--no-color", "--width", width,
                *top).stdout.splitlines()
    pages = map_pages(lines, "attention: layer 5")
    seen, most = [], []
    for title, header in pages:
        assert len(pages) == 1 or re.search(r": (keys \d+-\d+|keys \d+-\d+, attends most to|attends most to)\)$",
                                            title), title
        most.append(title.endswith("attends most to)") if len(pages) > 1 else header[-1].endswith("attends most to"))
        keys = re.search(r"keys (\d+)-(\d+)\b", title)
        if len(pages) > 1 and not keys:
            continue  # the page of the keys attended to most
        low, high = (int(keys[1]), int(keys[2])) if keys else (0, 38)
        first = header[-1].index(str(low % 10), len("query"))  # under the first key's units digit
        step = 2 if header[-1][first + 1] == " " else 1
        for j, key in enumerate(range(low, high + 1)):
            assert "".join(line.ljust(200)[first + step * j] for line in header) == str(key).rjust(2), (key, header)
        seen += range(low, high + 1)
    assert seen == list(range(39)) and most.count(True) == 1, (width, [title for title, _ in pages])


def test_a_cross_attention_map_names_three_keys_even_for_fewer_queries(cli, tmp_path):
    """Cross-attention maps are not square: 2 decoder queries over 7 source keys still get the 3 keys they
    attend to most (a random model spreads its weight, so all three are over 0.005)."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    shown = run(cli, "encode", "time flies like an arrow", "--model", str(path), "--target", "le", "--no-color",
                *WIDE).stdout
    rows = heatmap(shown, "cross-attention (decoder query -> encoder key): layer 1", 7)
    assert [label for label, _, _ in rows] == ["0 [CLS]", "1 le"]
    assert [len(most) for _, _, most in rows] == [3, 3]
