"""Issue 31, the first-day defects: each item read from what a new user sees (the terminal's text, stderr, the
page's data, a figure's content, the help), never from tfcli's internals' own numbers. The page in a browser
(item 1's heading and command line, item 5's shading, item 12's header) is in tests/test_report_browser.py."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT = "time flies like an arrow"
LONG = " ".join(f"word{i}" for i in range(400))  # 1,000+ tokens: the bundled `tiny` reads 128


def page_data(path: Path) -> dict:
    html = path.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script id="tfcli-data" type="application/json">(.*?)</script>', html, re.S).group(1))


def svg_texts(path: Path) -> list[str]:
    """Every text a person reads in an SVG figure (tokens, titles, axis labels), in document order."""
    root = ElementTree.parse(path).getroot()
    return ["".join(node.itertext()) for node in root.iter("{http://www.w3.org/2000/svg}text")]


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return base | {"NO_COLOR": "1"} | extra


# ---------------------------------------------------------------- 1. a long text is echoed as the model read it


def test_a_long_text_is_echoed_as_the_model_read_it_in_the_terminal_and_the_page(tmp_path, tfcli_process):
    page = tmp_path / "long.html"
    result = tfcli_process("encode", "--model", "tiny", "--width", "80", "--top-k", "0", LONG, "--report", str(page),
                           env=env())
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert re.search(r"text 1, as the model read it \(128 of its 1,\d{3} tokens; [\d,]+ of [\d,]+ characters\)", out)
    assert "word399" not in out and "word3 " in out  # the end the model never read is not echoed
    heading = out[:out.index("tokens: ")]
    assert len(heading.splitlines()) < 12  # not the whole text: 1 + what 128 tokens cover
    data = page_data(page)
    section = data["sections"][0]
    assert section["text"].startswith("word0 word1") and "word399" not in section["text"]
    assert section["cut"]["tokens"] == 128 and section["cut"]["of_tokens"] > 1000
    assert section["cut"]["characters"] == len(section["text"]) < section["cut"]["of_characters"] == len(LONG)
    run = data["run"]
    assert LONG in run["command_line"]  # the full command line is kept (on hover, in a details element)
    assert LONG not in run["short_command_line"] and len(run["short_command_line"]) < 200
    assert f"({len(LONG):,} characters)" in run["short_command_line"]


# ---------------------------------------------------------------- 2. the lens says what it goes through


@pytest.mark.slow
def test_the_lens_warning_comes_once_and_the_page_and_figure_say_what_it_reads(cli, minilm_dir, tmp_path):
    page, figure = tmp_path / "m.html", tmp_path / "m.svg"
    result = cli("encode", "--model", str(minilm_dir), TEXT, "a second text", "a third", "--report", str(page))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("has no LM head") == 1
    assert "through the input token embeddings" in result.stderr and "not a prediction" in result.stderr
    lens = page_data(page)["sections"][0]["lens"]
    assert lens["through"] == "the input token embeddings" and lens["predicts"] is False
    assert cli("encode", "--model", str(minilm_dir), TEXT, "--report", str(figure)).exit_code == 0
    texts = " ".join(svg_texts(figure))
    assert "through the input token embeddings (no LM head: not a prediction)" in texts


def test_a_model_with_an_lm_head_gets_no_lens_warning_and_its_page_says_predicts(cli, tmp_path):
    page = tmp_path / "t.html"
    result = cli("encode", "--model", "tiny", TEXT, "--report", str(page))
    assert result.exit_code == 0 and "no LM head" not in result.stderr
    lens = page_data(page)["sections"][0]["lens"]
    assert lens["predicts"] is True and lens["through"].endswith("the MLM head")


# ---------------------------------------------------------------- 3. every option the docs promise exists


def documented_commands() -> dict:
    import typer.main

    from tfcli.cli import app

    group = typer.main.get_command(app)

    def options(command) -> set[str]:  # a group of commands (`steer fit`): the options of each, under its name
        params = [p for sub in getattr(command, "commands", {}).values() for p in sub.params] + command.params
        return {o for p in params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}

    return {name: options(command) for name, command in group.commands.items()}


OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def promises(commands: dict) -> list[tuple[str, str, str]]:
    """(command, option, where) for every option README.md and docs/commands.md write down for a command: in the
    command's own section (its prose, examples and code spans; a span or example naming another command, or
    `other's `--x``, counts for that one; llama.cpp's options are not tfcli's), and in the sentences that speak of
    every command."""
    documented = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8"),
                  "docs/commands.md": (ROOT / "docs/commands.md").read_text(encoding="utf-8")}
    found = []
    names = "|".join(commands)
    for where, text in documented.items():
        start = text.index("## Commands") if where == "README.md" else text.index("## Command reference")
        end = text.index("## Models") if where == "README.md" else len(text)
        section_of = re.split(rf"^### ({names})\n", text[start:end], flags=re.M)
        for name, body in zip(section_of[1::2], section_of[2::2]):
            for example in re.findall(r"^\$ (tfcli .*)$", body, re.M):
                command = example.split()[1]
                found += [(command, option, where) for option in OPTION.findall(example)]
            prose = re.sub(r"^\$ tfcli .*$", "", body, flags=re.M)
            for before, span in re.findall(r"(\S*\s?)`([^`\n]*)`", prose):
                if before.startswith("llama.cpp's"):  # another program's option (--control-vector-scaled)
                    continue
                other = re.match(rf"(?:tfcli )?({names})\b", span) or re.match(rf"({names})'s", before)
                found += [(other.group(1) if other else name, option, where) for option in OPTION.findall(span)]
        # what every command shares: the README's Commands introduction, the reference's Common behaviour
        common = text[start:text.index("### tokenize", start)] if where == "README.md" else \
            text[text.index("## Common behaviour"):text.index("### Terminal views")]
        for sentence in re.split(r"(?<=[.)])\s+(?=[A-Z`])", common.replace("\n", " ")):
            options = set(OPTION.findall(sentence))
            if "every command that takes `--model`" in sentence:
                found += [(c, o, where) for c in commands for o in options - {"--model"} if "--model" in commands[c]]
            elif sentence.startswith("Every command takes"):
                found += [(c, o, where) for c in documented_names(documented) for o in options]
            elif sentence.startswith("Texts come as arguments"):  # not config, nor a command it names apart
                apart = set(re.findall(r"`(\w+)` takes", " ".join(common.split())))
                found += [(c, o, where) for c in documented_names(documented) - {"config"} - apart for o in options]
            elif also := re.match(r"((?:`\w+`,? )+and `\w+`) also take", sentence):
                found += [(c, o, where) for c in re.findall(r"`(\w+)`", also.group(1)) for o in options]
    return found


def documented_names(documented: dict) -> set[str]:
    """The commands docs/commands.md has a reference section for."""
    reference = documented["docs/commands.md"]
    return set(re.findall(r"^### (\w+)\n", reference[reference.index("## Command reference"):], re.M))


def test_every_option_the_readme_and_the_reference_promise_exists_on_its_command():
    commands = documented_commands()
    found = promises(commands)
    assert len(found) > 100  # the parsing finds the options (it would pass on nothing)
    assert ("compare", "--revision", "docs/commands.md") in found and ("generate", "--file", "README.md") in found
    missing = sorted({f"{command} {option} ({where})" for command, option, where in found
                      if command in commands and option not in commands[command]})
    assert missing == []


def test_generate_reads_prompts_from_a_file(cli, tiny_decoder, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("time flies\nonce upon\n", encoding="utf-8")
    result = cli("generate", "--model", str(tiny_decoder), "--file", str(prompts), "-n", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert [json.loads(line)["prompt"] for line in result.stdout.splitlines()] == ["time flies", "once upon"]


# ---------------------------------------------------------------- 5. one absolute scale for classify --explain


def strip_pixels(svg: Path):
    """The pixels of the widest, flattest image in an SVG figure: classify --explain's strip of weights."""
    import base64
    import io

    from PIL import Image

    images = []
    for node in ElementTree.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}image"):
        href = node.get("{http://www.w3.org/1999/xlink}href") or node.get("href")
        images.append(Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))).convert("RGB"))
    strip = max(images, key=lambda image: image.width / image.height)
    return [strip.getpixel((x, y)) for y in range(strip.height) for x in range(strip.width)]


def test_classify_figure_shades_near_uniform_attention_faint(cli, tiny_classifier, tmp_path):
    """Random weights attend about evenly (1/n each): on the absolute 0-1 scale no cell is dark. On a scale
    stretched to the largest weight, the largest would be the darkest colour."""
    figure = tmp_path / "c.svg"
    result = cli("classify", "--model", str(tiny_classifier), TEXT, "--explain", "--report", str(figure))
    assert result.exit_code == 0, result.stderr
    luminance = [0.299 * r + 0.587 * g + 0.114 * b for r, g, b in strip_pixels(figure)]
    assert min(luminance) > 150, min(luminance)  # every cell light (the darkest colour of the ramp is below 60)


# ---------------------------------------------------------------- 6. the width when piped


def with_pty(columns: int):
    import fcntl
    import pty
    import struct
    import termios

    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return main, terminal


@pytest.mark.parametrize("where", ["stdin", "stderr", "/dev/tty"])
def test_piped_output_is_laid_out_for_the_terminal_the_person_sits_at(where):
    """stdout is a pipe (`| head`); the terminal is stdin, stderr, or only the controlling terminal."""
    main, terminal = with_pty(66)
    streams = {"stdin": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    streams[where if where != "/dev/tty" else "stdin"] = terminal if where != "/dev/tty" else subprocess.DEVNULL

    def controlling_terminal():
        if where == "/dev/tty":
            import fcntl
            import termios

            os.setsid()
            fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)

    try:
        result = subprocess.run([sys.executable, "-m", "tfcli", "tokenize", "a " * 60], stdout=subprocess.PIPE,
                                env=env(), preexec_fn=controlling_terminal, pass_fds=(terminal,), timeout=60, **streams)
    finally:
        os.close(main)
        os.close(terminal)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0
    assert max(map(len, lines)) <= 66 and max(map(len, lines)) > 56  # 66 columns, not the 120 of a pipe


# ---------------------------------------------------------------- 7. compare refuses the source given twice


def test_compare_refuses_the_model_given_both_ways(cli, tmp_path, no_model_built):
    (tmp_path / "config.json").write_text("{}")
    for first in (str(tmp_path), "x"):
        result = cli("compare", first, "--model", str(tmp_path) if first != "x" else "x", "hi")
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.startswith("error: give the model source once: as SRC or with --model, not both")


# ---------------------------------------------------------------- 8. help: nothing cut or split


def help_of(*args: str, columns: int, process: bool = False) -> str:
    """`tfcli ARGS --help` at $COLUMNS=columns with NO_COLOR=1: from `python -m tfcli` when `process`, else from the
    same app in this process through CliRunner, as prog `tfcli`, whose text is the process's byte for byte (both read
    $COLUMNS, neither writes to a terminal; checked for every command at 80 and 100 columns) without a Python start
    per command."""
    if process:
        result = subprocess.run([sys.executable, "-m", "tfcli", *args, "--help"], capture_output=True, text=True,
                                env=env(COLUMNS=str(columns)), timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout
    from typer.testing import CliRunner

    from tfcli.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns), "NO_COLOR": "1"},
                                prog_name="tfcli")
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("columns", [80, 100])
def test_help_cuts_no_summary_splits_no_option_and_fits_the_width(columns):
    from tfcli.cli import app

    top = help_of(columns=columns, process=True)  # the real process's; each command's alike in-process
    assert "..." not in top[top.index("Commands:"):]  # the usage line's `[ARGS]...` aside
    assert max(map(len, top.splitlines())) <= columns
    flat = " ".join(top.split())
    import typer.main

    for name, command in typer.main.get_command(app).commands.items():
        summary = " ".join(command.get_short_help_str(limit=10**6).split())
        assert f"{name} {summary}" in flat, name  # the whole first sentence
    for args in [(name,) for name in typer.main.get_command(app).commands]:  # every command's own help
        text = help_of(*args, columns=columns)
        lines = text.splitlines()
        assert max(map(len, lines)) <= columns, max(lines, key=len)
        assert not [line for line in lines if re.search(r"--[a-z-]*-$", line.rstrip())], args  # `--max-` / `length`
        options = {o for p in typer.main.get_command(app).commands[args[0]].params for o in p.opts}
        words = set(text.replace("/", " ").split())
        assert {o for o in options if o.startswith("--")} <= words | {o + "," for o in options}


# ---------------------------------------------------------------- 9. stderr wrapped on a terminal


def test_stderr_messages_are_wrapped_between_words_on_a_terminal(cli, monkeypatch, tmp_path):
    import io

    from rich.console import Console

    import tfcli.cli.console
    import tfcli.cli.session

    captured = io.StringIO()
    monkeypatch.setattr(tfcli.cli.session, "with_progress", lambda batches, what, count: batches)  # no progress bar
    monkeypatch.setattr(tfcli.cli.console.STDERR, "console", Console(
        file=captured, force_terminal=True, no_color=True, highlight=False, markup=False, emoji=False, width=200))
    folder = tmp_path / "a folder with a rather long name" / "and another one inside it"
    folder.mkdir(parents=True)
    report = folder / "the report of this run.html"
    result = cli("encode", "--model", "tiny", TEXT, "--width", "50", "--report", str(report))
    assert result.exit_code == 0
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in captured.getvalue().splitlines()]
    assert lines and all(len(line) <= 50 for line in lines if str(report) not in line), lines
    assert lines[lines.index("wrote") + 1] == str(report)  # a path is never broken: wider than 50, a line its own
    said = " ".join(lines)
    assert "showing the last layer in full and a line per position for every layer; see more with --layers all" \
           in said  # broken between words only: joined with spaces it reads as written


# ---------------------------------------------------------------- 10. --max-length: one minimum, one message


@pytest.mark.parametrize("command", ["encode", "classify", "tokenize"])
def test_max_length_too_small_says_one_minimum(cli, command, tiny_classifier):
    model = {"encode": ["--model", "tiny"], "classify": ["--model", str(tiny_classifier)], "tokenize": []}[command]
    said = set()
    for value in ("0", "1", "2"):
        result = cli(command, *model, "--max-length", value, TEXT)
        assert result.exit_code == 2 and result.stdout == ""
        said.add(result.stderr.replace(f" {value} ", " N "))
    assert len(said) == 1 and "--max-length N is too small: it must be at least 3" in said.pop()
    assert cli(command, *model, "--max-length", "3", TEXT).exit_code == 0


# ---------------------------------------------------------------- 11. the note last; the figure draws what the terminal shows


def test_the_see_more_note_comes_last_and_the_figure_draws_the_maps_the_terminal_shows(cli, tiny_decoder, tmp_path):
    figure = tmp_path / "e.svg"
    result = cli("encode", "--model", str(tiny_decoder), TEXT, "--report", str(figure))
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("showing the last layer in full")
    shown = re.findall(r"^attention: (layer \d+), mean of heads$", result.stdout, re.M)
    drawn = sorted({m for t in svg_texts(figure) for m in re.findall(r"(layer \d+), mean of heads", t)})
    assert len(shown) == 1 and drawn == shown
    both = tmp_path / "both.svg"
    assert cli("encode", "--model", str(tiny_decoder), TEXT, "--layers", "all", "--report", str(both)).exit_code == 0
    assert sorted({m for t in svg_texts(both) for m in re.findall(r"(layer \d+), mean of heads", t)}) == \
           ["layer 0", "layer 1"]


def test_top_k_help_says_what_the_tables_show():
    text = " ".join(help_of("encode", columns=200).split())
    assert "lens table of the layers shown in full and in --json" in text
    assert "the top token only in the line per position" in text


# ---------------------------------------------------------------- 12. generate's figure: improbable steps still show


def test_generate_figure_uses_a_log_axis_when_a_step_is_improbable(cli, tiny_decoder, tmp_path):
    figure = tmp_path / "g.svg"
    result = cli("generate", "--model", str(tiny_decoder), TEXT, "-n", "3", "--report", str(figure))
    assert result.exit_code == 0, result.stderr
    texts = svg_texts(figure)
    assert "probability (log scale)" in texts  # random weights: every step about 1/30522
    assert any(re.fullmatch(r"1e-\d+|0\.0+1", t) for t in texts), texts  # log ticks in plain numbers: 1e-05, 0.001
    assert not any("mathdefault" in t for t in texts), texts  # not matplotlib's math text, which the style turns off


def figure_texts(monkeypatch) -> list[list[str]]:
    """Every text of each figure tfcli saves from now on (tokens, titles, the caption), as matplotlib draws them:
    a PNG's text cannot be read back."""
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    seen: list[list[str]] = []
    savefig = Figure.savefig

    def spy(figure, *args, **kwargs):
        seen.append([text.get_text() for text in figure.findobj(Text)])
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def test_a_figure_says_which_tokens_its_fonts_cannot_draw(cli, monkeypatch, tmp_path):
    """Item 12: CJK tokens were empty boxes. On a machine whose fonts lack them (DejaVu Sans alone), the caption
    names those tokens and says what to install; an SVG (drawn by its viewer's fonts) says nothing."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    import tfcli.render.figure as figure

    dejavu = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"))
    monkeypatch.setattr(figure, "_fonts", lambda: (["DejaVu Sans"], frozenset(FT2Font(dejavu).get_charmap())))
    seen = figure_texts(monkeypatch)
    result = cli("encode", "--model", "tiny", "東京 is big", "--report", str(tmp_path / "a.png"))
    assert result.exit_code == 0, result.stderr
    caption = [text for text in seen[-1] if "drawn as boxes" in text]
    assert len(caption) == 1
    note = " ".join(caption[0].split())
    assert "'東'" in note and "'京'" in note and "fonts-noto-cjk" in note and "'big'" not in note
    result = cli("encode", "--model", "tiny", "東京 is big", "--report", str(tmp_path / "a.svg"))
    assert result.exit_code == 0 and not [text for text in seen[-1] if "drawn as boxes" in text]
    result = cli("encode", "--model", "tiny", "Tokyo is big", "--report", str(tmp_path / "b.png"))
    assert result.exit_code == 0 and not [text for text in seen[-1] if "drawn as boxes" in text]


def test_a_cjk_font_on_the_machine_draws_cjk_tokens():
    """Where a CJK font is installed (Debian: fonts-noto-cjk, fonts-wqy-zenhei), figures draw with it after DejaVu
    Sans: nothing is left as a box, and a token label's size draws ink (WenQuanYi's collection holds a bitmap face
    whose small sizes drew nothing; the regular face is the one taken)."""
    import matplotlib
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    import tfcli.render.figure as figure

    families, _ = figure._fonts()
    if len(families) == 1:
        pytest.skip("no CJK font on this machine (apt-get install fonts-noto-cjk)")
    assert figure.lacking_glyphs("東京 日本語 中文") == ""
    for size in (figure.MIN_FONT, figure.MAX_FONT, 9):
        with matplotlib.rc_context(figure.STYLE | {"font.family": families}):
            drawn = Figure(figsize=(0.5, 0.5), dpi=figure.DPI)
            drawn.text(0.5, 0.5, "東", fontsize=size, ha="center", va="center")
            canvas = FigureCanvasAgg(drawn)
            canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba())[..., :3]
        assert (pixels.min(axis=-1) < 128).sum() > 10, size  # dark pixels: the character, not a blank


def test_a_quoted_text_reads_as_typed_in_the_page(tfcli_process, tmp_path):
    page = tmp_path / "q.html"
    result = tfcli_process("encode", "--model", "tiny", "it didn't", "--report", str(page), env=env())
    assert result.returncode == 0
    run = page_data(page)["run"]
    assert "\"it didn't\"" in run["command_line"] and "'\"'\"'" not in run["command_line"]
    assert not run["weights"].startswith("loaded loaded")


# ---------------------------------------------------------------- 13. smaller things


def test_compare_table_has_a_match_column_and_a_summary(cli, bert_dir):
    result = cli("compare", str(bert_dir), TEXT, "second text", "--width", "100")
    assert result.exit_code == 0, result.stderr
    header = [line.split() for line in result.stdout.splitlines() if line.startswith("tensor")]
    assert header == [["tensor", "shape", "max", "abs", "diff", "match"]] * 2
    summaries = re.findall(r"^all (\d+) tensors match \(largest difference \S+, \S+; tolerance 0.0001\)$",
                           result.stdout, re.M)
    assert len(summaries) == 2 and int(summaries[0]) >= 5
    assert "\n\ntext 2:" in result.stdout


def test_consecutive_classify_results_are_apart(cli, tiny_classifier):
    result = cli("classify", "--model", str(tiny_classifier), "one", "two")
    assert result.exit_code == 0
    assert re.search(r"^prediction: \w+\n\ntext 2: 'two'", result.stdout, re.M)


def test_generate_with_random_weights_says_so(cli, tiny_decoder):
    result = cli("generate", "--model", str(tiny_decoder), TEXT, "-n", "1")
    assert result.exit_code == 0 and "warning: random weights" in result.stderr


# ---------------------------------------------------------------- 14. a full disk, a read-only folder


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   "SafetensorError"])  # what safetensors raises on a full disk
def test_save_on_a_full_disk_says_so_and_keeps_the_previous_file(cli, monkeypatch, tmp_path, error):
    import safetensors
    import safetensors.torch

    if error == "SafetensorError":
        error = safetensors.SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                            "message: \"No space left on device\" }) (os error 28)")

    def fail(tensors, path, metadata=None):
        Path(path).write_bytes(b"half")
        raise error

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")
    result = cli("encode", "--model", "tiny", TEXT, "--save", str(target), "--force")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [f"error: no space left on device writing {target}: the previous file "
                                               "is kept", "hint: free some space, or write to another disk"]
    assert target.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [target]  # no temporary file left


def test_report_on_a_full_disk_says_so(cli, monkeypatch, tmp_path):
    import tfcli.render.figure

    monkeypatch.setattr(tfcli.render.figure, "save_figure", full_disk)
    target = tmp_path / "out.svg"
    result = cli("encode", "--model", "tiny", TEXT, "--report", str(target))
    assert result.exit_code == 1
    assert f"error: no space left on device writing {target}: nothing was written" in result.stderr
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes in a read-only folder")
@pytest.mark.parametrize("option,name", [("--save", "a.safetensors"), ("--report", "a.html")])
def test_a_read_only_folder_is_refused_before_any_work(cli, tmp_path, no_model_built, option, name):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = cli("encode", "--model", "tiny", TEXT, option, str(folder / name))
    finally:
        folder.chmod(0o755)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith(f"error: {option} {folder / name}: cannot write in the folder {folder}")


def test_a_permission_error_while_writing_says_so(cli, monkeypatch, tmp_path):
    import os as os_module

    import tfcli.errors as errors  # where every file tfcli writes is renamed into place

    def refuse(source, target):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(errors.os, "replace", refuse)
    target = tmp_path / "a.html"
    result = cli("encode", "--model", "tiny", TEXT, "--report", str(target))
    monkeypatch.setattr(errors.os, "replace", os_module.replace)
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == [f"error: permission denied writing {target}: nothing was written",
                                               "hint: choose a folder you can write to"]


# ---------------------------------------------------------------- 15. --no-attention-weights; compare --dtype


def test_no_attention_weights_keeps_the_matrices_out_of_json(cli):
    args = ("encode", "--model", "tiny", " ".join([TEXT] * 10), "--json", "--top-k", "0")
    whole, lean = cli(*args), cli(*args, "--no-attention-weights")
    assert lean.exit_code == 0
    full, record = json.loads(whole.stdout), json.loads(lean.stdout)
    assert all("weights" not in entry for entry in record["attention"])
    assert [(a["max_key"], a["max_weight"]) for a in record["attention"]] == \
           [(a["max_key"], a["max_weight"]) for a in full["attention"]]
    assert record["weights"] == "random" and len(lean.stdout) < len(whole.stdout) / 10
    refused = cli("encode", "--model", "tiny", TEXT, "--no-attention-weights")
    assert refused.exit_code == 2 and "--no-attention-weights goes with --json" in refused.stderr


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, save_hf_model):
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("bert")
    save_hf_model(BertForMaskedLM, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64,
                                              max_position_embeddings=64), path)
    return path


def test_compare_in_bfloat16_passes_and_a_wrong_weight_fails(cli, bert_dir, monkeypatch):
    import torch

    import tfcli.api

    result = cli("compare", str(bert_dir), TEXT, "--dtype", "bfloat16")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "(bfloat16, tolerance 0.05 of each tensor's largest value)" in " ".join(result.stdout.split())
    assert re.search(r"^all \d+ tensors match", result.stdout, re.M)
    original = tfcli.api.build_model

    def wrong(*args, **kwargs):
        model = original(*args, **kwargs)
        with torch.no_grad():
            model.encoder.blocks[-1].mlp_norm.weight.mul_(2)  # a wrong weight: the last hidden state doubles
        return model

    monkeypatch.setattr(tfcli.api, "build_model", wrong)
    failed = cli("compare", str(bert_dir), TEXT, "--dtype", "bfloat16")
    assert failed.exit_code == 1
    assert re.search(r"^\d+ of \d+ tensors differ by more than 0.05 of each tensor's largest value", failed.stdout,
                     re.M)
    assert "DIFFERS" in failed.stdout and "exceeds" in failed.stderr


# ---------------------------------------------------------------- the page in a browser: items 1, 5 and 12


@pytest.fixture(scope="module")
def browser():
    import shutil

    found = os.environ.get("TFCLI_BROWSER") or shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if found is None:
        pytest.skip("no browser: install Debian's chromium-headless-shell (apt-get install -y chromium-headless-shell)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=found)
        yield launched
        launched.close()


def opened(browser, path: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri() else route.abort())
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready]")
    return page


def test_the_page_heads_a_long_text_with_what_the_model_read_and_a_short_command_line(browser, tmp_path,
                                                                                      tfcli_process):
    path = tmp_path / "long.html"
    assert tfcli_process("encode", "--model", "tiny", "--top-k", "0", LONG, "--report", str(path),
                         env=env()).returncode == 0
    page = opened(browser, path)
    heading = page.inner_text("section.report h2")
    assert heading.startswith("text 1, as the model read it (128 of its 1,") and "word399" not in heading
    assert len(heading) < len(LONG) / 2
    command = page.inner_text("header code.command")
    assert LONG not in command and f"({len(LONG):,} characters)" in command
    assert LONG in page.get_attribute("header code.command", "title")  # the full one on hover
    assert page.locator("header details.full-command").count() == 1
    assert re.search(r"random\s+\(seed 0\)", page.inner_text("header"))
    page.close()


def test_the_page_shades_near_uniform_explain_attention_faint(browser, cli, tiny_classifier, tmp_path):
    path = tmp_path / "c.html"
    assert cli("classify", "--model", str(tiny_classifier), TEXT, "--explain", "--report", str(path)).exit_code == 0
    page = opened(browser, path)
    colours = page.eval_on_selector_all(".explain .tok", "spans => spans.map(s => getComputedStyle(s).backgroundColor)")
    luminance = []
    for colour in colours:
        r, g, b = (float(v) for v in re.findall(r"[\d.]+", colour)[:3])
        luminance.append(0.299 * r + 0.587 * g + 0.114 * b)
    assert len(luminance) == 7 and min(luminance) > 150, colours  # about 1/7 each: faint on the 0-1 scale
    assert page.inner_text(".explain ~ .legend .legend-max") == "1"
    page.close()


@pytest.mark.slow
def test_the_page_of_a_model_without_lm_head_says_the_lens_is_not_a_prediction(browser, cli, minilm_dir, tmp_path):
    path = tmp_path / "m.html"
    assert cli("encode", "--model", str(minilm_dir), TEXT, "--report", str(path)).exit_code == 0
    page = opened(browser, path)
    note = page.inner_text(".lens .note")
    assert "through the input token embeddings" in note and "not a prediction" in note
    assert "final norm and the head" not in note
    header = page.inner_text("header")
    assert re.search(r"loaded\s+from\s+/", header) and not re.search(r"loaded\s+loaded", header), header
    page.close()
