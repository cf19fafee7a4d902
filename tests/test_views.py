"""The terminal views as a person sees them: every view rendered into fixed-width consoles (60, 80, 120 and 200
columns) for texts of 5, 15, 45 and 120 tokens. Nothing may be cut (no `…`, every token and number whole, each
where its row says) and no line may be wider than the console. The expectations come from the report objects
(the numbers the run computed), never from the layout code."""

from __future__ import annotations

import json
import random
import re

import pytest
from rich.cells import cell_len

from tfcli.commands.classify import render as classify_render
from tfcli.commands.encode import render as encode_render
from tfcli.commands.generate import render as generate_render
from tfcli.commands.tokens import render as tokenize_render
from tfcli.render.layout import Column, screen_text, table

WIDTHS = (60, 80, 120, 200)
LENGTHS = (5, 15, 45, 120)
# words of every width: one letter, long ones, punctuation, double-width CJK characters, a number
WORDS = ["a", "the", "it", "cat", "animal", "street", "because", "tired", "internationalization",
         "characteristically", ",", ".", "東", "京", "1999", "x"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def write_model(path, layers: int = 2):
    """A BERT-shaped model directory, its own small vocabulary (config.json + vocab.txt, random weights)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (path / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": len(vocab), "hidden_size": 32,
        "num_hidden_layers": layers, "num_attention_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": 128, "type_vocab_size": 2}))
    return path


def text_of(tokens: int, seed: int = 0) -> str:
    """A text of exactly `tokens` tokens ([CLS] and [SEP] included): every word is one token."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens - 2))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One encode report per length, every layer and head kept, the top 3 lens tokens (a tiny random model)."""
    from tfcli.commands.encode import core
    from tfcli.api import build_model, load_tokenizer_for
    from tfcli.sources import resolve_source

    source = resolve_source(str(write_model(tmp_path_factory.mktemp("views"))))
    tokenizer = load_tokenizer_for(source)
    model = build_model(source)
    options = core.check_options(source.config, "all", "all", 3)
    encodings = tokenizer.encode_for_model([text_of(n, seed=n) for n in LENGTHS], 128)
    assert [len(e.ids) for e in encodings] == list(LENGTHS)
    return {len(r.ids): r for r in core.run(model, tokenizer, [encodings], options, None, max_capture_mb=1024)}


def mean_report(report):
    """The same report as without --heads: one mean map per layer."""
    from dataclasses import replace

    from tfcli.commands.encode.core import AttentionMap

    layers = sorted({a.layer for a in report.attention})
    maps = [AttentionMap("self", layer, "mean", sum(a.weights for a in report.attention if a.layer == layer) / 2,
                         report.tokens, report.tokens) for layer in layers]
    return replace(report, attention=maps)


def check_screen(text: str, width: int) -> list[str]:
    lines = text.split("\n")
    assert "…" not in text
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, too_wide[:3]
    return lines


def row_blocks(lines: list[str], label: str) -> list[str]:
    """Every line of every row whose key starts with `label` (a row's continuation lines start with a space)."""
    found, inside = [], False
    for line in lines:
        if line.startswith(label + " ") or line == label:
            found.append(line)
            inside = True
        elif inside and line.startswith(" ") and line.strip():
            found.append(line)
        else:
            inside = False
    return found


def position(i: int, token: str) -> str:
    return f"{i} {token}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("length", LENGTHS)
def test_default_encode_view(reports, length, width):
    """The first-run view: the last layer's map with the keys each query attends to most, the stages, and a
    line per position for every layer (the key attended most, the predicted token)."""
    report = mean_report(reports[length])
    lines = check_screen(screen_text(encode_render.report_lines(report, 1, width), width), width)
    text = "\n".join(lines)
    for i, token in enumerate(report.tokens):
        assert re.search(rf"(^|  ){i} {re.escape(token)}(  |$)", text, re.M), (i, token)  # the token list
    last = report.attention[-1]
    keys, weights = last.top(1)
    for stage in report.stages:
        if stage.block is not None and stage.block != last.layer:
            continue  # sublayers of the last block only, by default
        numbers = ["(" + ", ".join(map(str, stage.shape)) + ")", f"{stage.parameters:,}", f"{stage.mean:+.4f}",
                   f"{stage.std:.4f}", f"{stage.norm:.2f}"]
        row = " ".join(row_blocks(lines, stage.name))
        assert all(number in row for number in numbers), (stage.name, row)
    for q, token in enumerate(report.tokens):
        rows = row_blocks(lines, position(q, token))
        most = f"{keys[q][0]} {last.key_tokens[keys[q][0]]} {weights[q][0]:.2f}"
        assert any(most in line for line in rows), (q, most, rows)  # beside the map, or on its own page
        lens_layers = [row.top[q][0][0] for row in report.lens]
        assert any(f"{len(lens_layers) - 1}: {lens_layers[-1]}" in line or f"-{len(lens_layers) - 1}: "
                   f"{lens_layers[-1]}" in line for line in rows), (q, rows)  # the last layer's prediction


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("length", LENGTHS)
def test_every_layer_and_head_in_full(reports, length, width):
    """--layers all --heads all --top-k 3: every map (all its cells, on as many pages as it takes), every
    layer's lens with its probabilities."""
    report = reports[length]
    view = encode_render.View(detail=[0, 1], attention_top=3, lens_top=3)
    lines = check_screen(screen_text(encode_render.report_lines(report, 1, width, view), width), width)
    maps = [i for i, line in enumerate(lines) if line.startswith("attention: layer")
            and not re.search(r"\(page [2-9]", line + " " + lines[i + 1])]  # each map's first page
    assert [lines[i].split(" (page")[0] for i in maps] == \
        [f"attention: layer {a.layer}, head {a.head}" for a in report.attention]
    first = report.attention[0]
    assert min(min(row) for row in first.weights.tolist()) >= 0.005  # every cell shows a glyph
    section = lines[maps[0]:maps[1]]
    for q, token in enumerate(report.tokens):
        cells = "".join(line[len(position(q, token)):] for line in row_blocks(section, position(q, token)))
        assert sum(cells.count(glyph) for glyph in "·░▒▓█") == length, (q, cells)
    titles = [line for line in section if line.startswith("attention: layer")]
    if len(titles) > 1:  # a map on several pages: each page's title says which keys it holds, all in turn
        ranges = [(int(a), int(b)) for a, b in re.findall(r"keys (\d+)-(\d+)", " ".join(titles))]
        assert ranges and ranges[0][0] == 0 and ranges[-1][1] == length - 1, titles
        assert all(stop + 1 == start for (_, stop), (start, _) in zip(ranges, ranges[1:])), titles
    for row in report.lens:
        for p, token in enumerate(report.tokens):
            found = " ".join(row_blocks(lines, position(p, token)))
            for predicted, _, probability in row.top[p]:
                assert f"{predicted} {probability:.2g}" in found, (row.layer, p, predicted)


@pytest.mark.parametrize("width", WIDTHS)
def test_colour_changes_no_layout(reports, width):
    """With colour, the same characters in the same places, plus colour codes on the heat cells."""
    lines = encode_render.report_lines(mean_report(reports[15]), 1, width)
    coloured = screen_text(lines, width, color=True)
    assert "\x1b[38;5;" in coloured
    assert ANSI.sub("", coloured) == screen_text(lines, width)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("length", LENGTHS)
def test_tokenize_view(reports, length, width):
    from tfcli.tokenizer import Encoding

    report = reports[length]
    encoding = Encoding(text=text_of(length, seed=length), pair=None, tokens=report.tokens, ids=report.ids,
                        type_ids=[0] * length, attention_mask=[1] * length, offsets=[[0, 0]] * length,
                        sequence_ids=[None] * length, truncated=False, untruncated_length=length)
    lines = check_screen(screen_text(tokenize_render.token_lines(encoding, 1, "test vocabulary", width), width), width)
    for i, (token, token_id) in enumerate(zip(report.tokens, report.ids)):
        rows = row_blocks(lines, f"{i:>{len(str(length - 1))}}")
        assert any(token in line for line in rows) and any(str(token_id) in line for line in rows), (i, token)


@pytest.mark.parametrize("width", WIDTHS)
def test_classify_view_and_its_absolute_strip(width):
    from tfcli.commands.classify.core import Classification, Explanation

    tokens = [t for t in text_of(45, seed=3).split()]
    uniform = Explanation([1], tokens, [1 / len(tokens)] * len(tokens))
    result = Classification("a text", [1, 2], ["negative", "positive"], [0.25, 0.75], uniform)
    lines = check_screen(screen_text(classify_render.classification_lines(result, 1, width)
                                     + classify_render.explanation_lines(uniform, width), width), width)
    assert any(line.startswith("positive") and "0.7500" in line and "◀ prediction" in line for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("why:"))
    end = next(i for i, line in enumerate(lines) if line.startswith("most attended:"))
    strip = "\n".join(lines[start + 1:end])
    assert all(token in strip for token in tokens)
    # near-uniform attention (1/43 each) is faint on the absolute scale, not "all full" as it was relative to the peak
    assert "█" not in strip and "░" not in strip and "·" in strip


@pytest.mark.parametrize("width", WIDTHS)
def test_generate_view(width):
    from tfcli.commands.generate.core import Generation
    from tfcli.model.decoding import Step
    from tfcli.tokenizer.loading import load_tokenizer

    tokenizer = load_tokenizer()
    ids = tokenizer.encode(["internationalization characteristically the of and"], add_special_tokens=False)[0].ids
    steps = [Step(index=i, token_id=t, prob=0.000123, top=[(t, 0.000123)] + [(u, 0.0001) for u in ids if u != t],
                  eos=False, lens=[(u, 0.5) for u in ids * 3]) for i, t in enumerate(ids)]
    result = Generation("prompt", [101], ids, "text", "prompt text", steps)
    lines = check_screen(screen_text(generate_render.generation_lines(result, tokenizer, 1, None, width), width), width)
    for step in steps:
        assert any(line.lstrip().startswith(f"{step.index}  ") for line in lines)


def test_table_pages_repeat_the_keys_and_keep_every_cell():
    """The layout itself: columns that do not fit go on to pages that repeat the key column; an item wider than
    the page is folded, all its characters kept, never cut."""
    columns = [Column.of("key", ["row one", "row two"])]
    columns += [Column.of(f"column {i}", [f"value {i}.{r}" for r in range(2)], right=True) for i in range(8)]
    columns.append(Column.of("long", ["x" * 70, "short"]))
    lines = table(columns, 40, title="title", page_note=lambda page: f"{page[0].header}-{page[-1].header}")
    text = "\n".join(line.plain for line in lines)
    assert max(cell_len(line.plain) for line in lines) <= 40
    assert text.count("(page 1 of ") == 1 and "(page 1 of 4: column 0-" in text
    for i in range(8):
        for r in range(2):
            assert f"value {i}.{r}" in text
    assert text.count("row one") == text.count("(page ")  # the key column on every page
    assert text.count("x") == 70  # folded over three lines, none lost


def test_cli_width_and_colour_options(cli, tmp_path):
    model = write_model(tmp_path)
    text = text_of(45)
    plain = cli("encode", "--model", str(model), "--width", "60", "--no-color", text)
    assert plain.exit_code == 0, plain.stderr
    assert max(cell_len(line) for line in plain.stdout.splitlines()) <= 60 and "\x1b[" not in plain.stdout
    assert "see more with --layers all" in plain.stderr  # how to see more than the first-run view
    coloured = cli("encode", "--model", str(model), "--color", text, env={"COLUMNS": "70", "NO_COLOR": "1"})
    assert "\x1b[" in coloured.stdout  # --color wins over NO_COLOR, even into a pipe
    assert max(cell_len(line) for line in ANSI.sub("", coloured.stdout).splitlines()) <= 70
    piped = cli("encode", "--model", str(model), text, env={"COLUMNS": "", "NO_COLOR": ""})
    assert "\x1b[" not in piped.stdout and max(cell_len(line) for line in piped.stdout.splitlines()) <= 120


def test_a_long_text_is_echoed_in_three_lines_with_its_beginning_and_its_end():
    """A text of hundreds of words was echoed whole above its results (42 lines for 5,500 tokens): now its
    beginning and its end around ' ... ', at most three lines, what follows it kept whole; a short one as it is."""
    from tfcli.render.layout import echo

    text = " ".join(f"w{i}" for i in range(600))
    for width in (80, 120):
        lines = screen_text(echo("text 1: ", text, width, " (512 of its 1,728 tokens)"), width).splitlines()
        said = " ".join(lines)
        assert len(lines) <= 3 and all(len(line) <= width for line in lines), lines
        assert said.startswith("text 1: 'w0 w1 w2 ") and " ... " in said
        assert said.endswith(" w598 w599' (512 of its 1,728 tokens)"), said
    assert screen_text(echo("text 1: ", "time flies", 80), 80) == "text 1: 'time flies'\n"


@pytest.mark.parametrize("width", [80, 120])
def test_encode_and_attribute_echo_a_long_text_in_three_lines_saying_what_the_model_read(cli, tiny_decoder, tmp_path,
                                                                                         width):
    """encode (an encoder of bert-base's 512 positions and bundled vocabulary, 1 block 32 wide: the echo reads only
    those, and bert-base's lens over 512 positions took 8 s a run) and attribute (the tiny decoder, 64) on a 600-word
    text: the echo takes at most three lines and says how much of the text the model read."""
    encoder = tmp_path / "encoder-512.yaml"
    encoder.write_text("architecture: encoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
                       "intermediate_size: 64\nmax_position_embeddings: 512\nhead: mlm\n", encoding="utf-8")
    text = " ".join(f"w{i}" for i in range(600))
    for args, said in ((("encode", "--model", str(encoder)), "512 of its 1,728 tokens"),
                       (("attribute", "--model", str(tiny_decoder)), "63 of its 1,728 tokens")):
        result = cli(*args, text, "--width", str(width), "--no-color")
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        echoed = lines[:next(k for k, line in enumerate(lines) if line.startswith(("tokens:", "position ")))]
        assert 1 <= len(echoed) <= 3 and said in " ".join(echoed), echoed


# ---------------------------------------------------------------- a token as it reads (issue 39, item 10)

def page_data(path) -> dict:
    """The data a --report page draws."""
    found = re.search(r'<script id="tfcli-data" type="application/json">(.*?)</script>', path.read_text("utf-8"), re.S)
    return json.loads(found.group(1).replace("<\\/", "</"))


@pytest.mark.parametrize("width", [80, 120])
def test_byte_level_tokens_read_as_their_text_in_every_view(cli, byte_level_gpt2, width):
    """attribute, patch and encode show the text a token stands for, never its vocabulary entry (`ĠMary`): quoted
    where a sentence names one (`' Mary'`, with its id where it is the position read), a space as ␣ where tokens
    stand as labels (the grids' columns, the token list: the view says what ␣ is); a quoted token is never cut
    across lines. JSON keeps the vocabulary entries, and tokenize, whose subject they are, shows them."""
    import tfcli

    path, clean, corrupt = byte_level_gpt2
    model = str(path)
    tokenizer = tfcli.load_tokenizer(model)
    ids = tokenizer.encode([clean])[0].ids
    mary, john, to = (tokenizer.token_to_id(t) for t in ("ĠMary", "ĠJohn", "Ġto"))
    last = len(ids) - 1
    metric = ("--target", " Mary", "--foil", " John")
    shown = ["--width", str(width), "--no-color"]
    runs = {"attribute": ("attribute", "-m", model, clean, *metric),
            "patch": ("patch", "-m", model, clean, corrupt, *metric, "--sites", "resid", "--full"),
            "encode": ("encode", "-m", model, clean)}
    screens = {}
    for name, args in runs.items():
        result = cli(*args, *shown)
        assert result.exit_code == 0, result.stderr
        lines = check_screen(result.stdout.rstrip("\n"), width)
        assert not [line for line in lines if "Ġ" in line], name
        assert not [line for line in lines if re.search(r"(^|\s)'\s*$", line)], name  # no line ends inside a quote
        screens[name] = " ".join(" ".join(lines).split())  # the sentences as they read, whatever the width
    assert f"position {last} ' to' (#{to}): the logit difference ' Mary' - ' John' (#{mary}, #{john})" in \
        screens["attribute"]
    assert f"the logit difference ' Mary' - ' John' (#{mary}, #{john}) at position {last} ' to' (#{to}): clean " \
        in screens["patch"]
    assert "the texts differ at 1 ' Mary'/' John', 3 ' John'/' Mary', 9 ' John'/' Mary' (* in the grids)" in \
        screens["patch"]
    assert "␣ = a space" in screens["patch"] and "1* " in screens["patch"] and " ␣Mary " in screens["patch"]
    assert screens["encode"].startswith(f"text 1: {clean!r} tokens (␣ = a space): 0 When 1 ␣Mary 2 ␣and 3 ␣John")
    # --json: the vocabulary entries, as before
    records = {name: json.loads(cli(*args, "--json").stdout.splitlines()[0]) for name, args in runs.items()}
    assert records["attribute"]["tokens"][1] == "ĠMary" and records["attribute"]["target"]["token"] == "ĠMary"
    assert records["patch"]["tokens_clean"][1] == "ĠMary" and records["patch"]["foil"]["token"] == "ĠJohn"
    assert records["encode"]["tokens"][1] == "ĠMary"
    tokenized = cli("tokenize", "-m", model, clean, *shown)
    assert tokenized.exit_code == 0 and "ĠMary" in tokenized.stdout


def test_byte_level_tokens_read_as_their_text_on_the_pages_and_figures(cli, byte_level_gpt2, tmp_path):
    """The --report pages get each token's text beside the record's vocabulary entries (`tokens_shown`, ...), and a
    figure labels its axes with the texts, a space as ␣, as the terminal does."""
    path, clean, corrupt = byte_level_gpt2
    model = str(path)
    metric = ("--target", " Mary", "--foil", " John")
    runs = {"attribute": ("attribute", "-m", model, clean, *metric),
            "patch": ("patch", "-m", model, clean, corrupt, *metric, "--sites", "resid"),
            "encode": ("encode", "-m", model, clean)}
    for name, args in runs.items():
        for suffix in (".html", ".svg"):
            path = tmp_path / f"{name}{suffix}"
            result = cli(*args, "--report", str(path))
            assert result.exit_code == 0, result.stderr
    attribute, patch, encode = (page_data(tmp_path / f"{name}.html")["sections"][0] for name in runs)
    assert attribute["tokens"][1] == "ĠMary" and attribute["tokens_shown"][1] == " Mary"
    assert attribute["quantity"] == "logit difference ' Mary' - ' John'"
    assert patch["tokens_clean"][1] == "ĠMary" and patch["tokens_clean_shown"][1] == " Mary"
    assert patch["tokens_corrupt_shown"][1] == " John" and patch["decoder_tokens_shown"] is None
    assert encode["tokens"]["tokens"][1] == "ĠMary" and encode["tokens_shown"]["tokens"][1] == " Mary"
    assert len(encode["lens"]["vocabulary_shown"]) == len(encode["lens"]["vocabulary"])
    assert not any("Ġ" in text for text in encode["lens"]["vocabulary_shown"])
    for name in runs:
        svg = (tmp_path / f"{name}.svg").read_text("utf-8")
        assert "Ġ" not in svg, name
    assert "␣Mary" in (tmp_path / "patch.svg").read_text("utf-8")
    assert "␣Mary" in (tmp_path / "encode.svg").read_text("utf-8")
    assert "' to' (#" in (tmp_path / "attribute.svg").read_text("utf-8")
