"""The --report page in a real browser: Debian's chromium-headless-shell driven by Playwright (one launch for
the module). Proves the page draws the tokens, that another layer/head redraws the heatmap, that hovering a
cell reads out its weight, that clicking a token shows what it attends to, and that nothing is fetched: every
request goes through an interceptor that lets only the page's own file through (and a page that does ask for
something is seen asking, so the check can fail)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcli.cli import app

TEXT = "time flies like an arrow"
HEADS_TEXTS = ["a b a b c", "one two one two", "the cat saw the cat"]
TOKENS = ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
BROWSER = os.environ.get("TFCLI_BROWSER") or shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.fixture(scope="module")
def browser():
    if BROWSER is None:
        pytest.skip("no browser: install Debian's chromium-headless-shell (apt-get install -y chromium-headless-shell)"
                    " or set TFCLI_BROWSER to a Chromium binary")
    from playwright.sync_api import sync_playwright  # in the [test] extra: missing, the tests fail

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=BROWSER)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory, tiny_decoder, tiny_classifier):
    """Reports of the three commands (tiny random models) and the --save tensors of the encode run."""
    folder = tmp_path_factory.mktemp("pages")
    runs = {"encode": ["encode", "--model", "tiny", TEXT, "--save", str(folder / "t.safetensors")],
            "generate": ["generate", "--model", str(tiny_decoder), TEXT, "-n", "3", "--lens"],
            "classify": ["classify", "--model", str(tiny_classifier), TEXT, "--explain"],
            "attribute": ["attribute", "--model", str(tiny_decoder), TEXT, "--by", "head", "--top", "4"],
            "heads": ["heads", "--model", str(tiny_decoder), *HEADS_TEXTS]}
    for name, args in runs.items():
        result = CliRunner().invoke(app, [*args, "--report", str(folder / f"{name}.html")])
        assert result.exit_code == 0, result.stderr
    return folder


def open_page(browser, path: Path):
    """A page loaded from `path`, waited for until drawn; `page.requests` lists every URL it asked for (all but
    the page itself refused), `page.errors` its script errors."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.requests, page.errors = [], []

    def intercept(route):
        page.requests.append(route.request.url)
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            route.abort()

    page.route("**/*", intercept)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready]")
    assert page.get_attribute("body", "data-ready") == "1", page.text_content("body")
    return page


def test_the_interceptor_sees_what_a_page_asks_for(browser, tmp_path):
    """The no-request checks below could pass by not looking: a page that loads an image, a font and a
    script from elsewhere is seen asking for each."""
    page_path = tmp_path / "asks.html"
    page_path.write_text('<!DOCTYPE html><html><head><style>@font-face { font-family: F; src: url("https://fonts.example/f.woff2"); }'
                         ' body { font-family: F; }</style><script src="https://cdn.example/lib.js"></script></head>'
                         '<body data-ready="1">text <img src="http://192.0.2.1/x.png"></body></html>')
    page = open_page(browser, page_path)
    page.wait_for_timeout(200)
    assert {"https://cdn.example/lib.js", "http://192.0.2.1/x.png", "https://fonts.example/f.woff2"} <= set(page.requests)
    page.close()


def drawn(page, selector: str) -> str:
    """The canvas's pixels as a data URL (a change of picture changes it)."""
    return page.eval_on_selector(selector, "canvas => canvas.toDataURL()")


def inked(page, selector: str) -> int:
    """How many pixels of the canvas are not transparent."""
    return page.eval_on_selector(selector, "c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                                           " let n = 0; for (let i = 3; i < d.length; i += 4) n += d[i] > 0; return n; }")


def test_encode_page_draws_tokens_and_switches_maps_and_reads_out_weights(browser, pages):
    from safetensors.numpy import load_file

    page = open_page(browser, pages / "encode.html")
    assert page.locator(".tokens").first.inner_text().split() == TOKENS
    assert page.locator(".headview .col.left span").all_inner_texts() == TOKENS
    assert "random (seed 0)" in page.inner_text("header")
    assert page.inner_text("header code") == shlex.join(sys.argv)  # this process's: the CLI ran in-process

    # layer and head selectors: every layer, the mean and each head; another choice redraws the heatmap
    assert page.locator("select.layer option").all_inner_texts() == ["0", "1"]
    assert page.locator("select.head option").all_inner_texts()[:2] == ["mean of heads", "head 0"]
    assert inked(page, "canvas.heatmap") > 0 and inked(page, "canvas.lines") > 0
    shown = {drawn(page, "canvas.heatmap")}
    page.select_option("select.head", "0")
    shown.add(drawn(page, "canvas.heatmap"))
    page.select_option("select.layer", "0")  # the page opens on the last layer, the one the terminal shows in full
    shown.add(drawn(page, "canvas.heatmap"))
    assert len(shown) == 3
    page.select_option("select.layer", "1")

    # the colour scale: 0 to 1 by default (as the terminal and figures), or stretched to the map's largest weight
    assert page.inner_text(".attention .legend-max") == "1.000"
    page.select_option("select.scale", "map")
    largest = page.inner_text(".attention .legend-max")
    assert 0 < float(largest) < 1 and drawn(page, "canvas.heatmap") not in shown

    # hovering cell (query 2, key 4) of layer 1 head 0 reads out that weight, as --save wrote it
    saved = load_file(pages / "t.safetensors")["attention.1"][0, 0]  # (queries, keys) of layer 1, head 0
    geometry = page.eval_on_selector("canvas.heatmap", "c => [c.getBoundingClientRect().x, c.getBoundingClientRect().y,"
                                     " Number(c.dataset.x0), Number(c.dataset.y0), Number(c.dataset.cell)]")
    left, top, x0, y0, cell = geometry
    page.mouse.move(left + x0 + 4.5 * cell, top + y0 + 2.5 * cell)
    readout = f'query "flies" [2] \u2192 key "an" [4]: {round(float(saved[2, 4]) * 1000) / 1000:.3f}'
    assert page.inner_text(".readout") == readout
    assert page.is_visible("#tip") and page.inner_text("#tip") == readout

    # clicking a token in the head view says what it attends to and what attends to it (strongest first),
    # marks the other column, and keeps only its lines
    lines = drawn(page, "canvas.lines")
    page.click(".headview .col.left span >> nth=5")
    assert drawn(page, "canvas.lines") != lines
    attends, attended = page.locator(".focus span").all_inner_texts()
    stored = (saved * 1000).round()  # the page ranks what it holds: thousandths, ties in position order
    to, by = stored[5].argmax(), stored[:, 5].argmax()
    assert attends.startswith(f'"arrow" (query 5) attends most to: {TOKENS[to]} [{to}] ')
    assert attended.startswith(f'"arrow" (key 5) is attended most by: {TOKENS[by]} [{by}] ')
    assert page.locator(".headview .col.right span[data-tip]").count() == len(TOKENS)
    page.click(".headview .col.right span >> nth=0")
    assert page.inner_text(".focus span").startswith('"[CLS]" (key 0) is attended most by: ')

    # the lens grid: a row per layer, a cell per position, top tokens on hover
    assert page.locator(".lens tbody tr").count() == 2 and page.locator(".lens tbody tr >> nth=0 >> td").count() == 7
    page.hover(".lens tbody td >> nth=1")
    assert page.inner_text("#tip").startswith('layer 0, position 1 "time"\n1. ')
    assert page.locator(".stages tbody tr").first.inner_text().startswith("blocks.0.resid_pre")

    assert page.errors == [] and page.requests == [(pages / "encode.html").as_uri()]
    page.close()


def test_generate_and_classify_pages_draw_in_the_browser(browser, pages):
    page = open_page(browser, pages / "generate.html")
    assert page.locator("section.report h3").all_inner_texts() == ["STEPS", "LOGIT LENS"]
    steps = page.locator("section.report table").first.locator("tbody tr")
    assert steps.count() == 3 and steps.first.inner_text().startswith("0\t")
    new = page.inner_text(".text-block .new")  # the generated end of the text, marked
    assert new and page.inner_text(".text-block").startswith(TEXT) and page.inner_text(".text-block").endswith(new)
    assert page.locator("table.grid tbody tr").count() == 3  # emb + the 2 blocks of the tiny decoder
    assert page.locator("table.grid thead th").count() == 1 + 3  # a column per step
    page.hover("table.grid tbody tr >> nth=2 >> td >> nth=2")
    assert page.inner_text("#tip").startswith("layer 2, step 2 (chose ")
    assert page.errors == [] and page.requests == [(pages / "generate.html").as_uri()]
    page.close()

    page = open_page(browser, pages / "classify.html")
    assert page.locator("table.labels tbody tr").count() == 3
    assert page.locator(".explain .tok").all_inner_texts() == TOKENS
    page.hover(".explain .tok >> nth=2")
    assert page.inner_text("#tip").startswith('"flies" [2]: 0.')
    assert page.errors == [] and page.requests == [(pages / "classify.html").as_uri()]
    page.close()


def terminal(*args: str) -> list[str]:
    """The lines of a command's terminal view (no colour, 200 columns), run in-process."""
    result = CliRunner().invoke(app, [*args, "--no-color", "--width", "200"])
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()


def table_rows(lines: list[str], title: str, rows: int | None = None) -> list[list[str]]:
    """The rows of the terminal table under `title` (after its header and rule; `rows` of them, else up to a blank
    line), as words; its bars left out."""
    start = lines.index(title) + 3
    end = start + rows if rows is not None else next((k for k in range(start, len(lines)) if not lines[k].strip()),
                                                     len(lines))
    return [[word for word in line.split() if word.strip("█▒")] for line in lines[start:end]]


def page_rows(page, selector: str) -> list[list[str]]:
    """The rows of a page's table as the words of their cells (empty cells, such as bars, left out)."""
    return [[word for cell in row.split("\t") for word in cell.split()]
            for row in page.locator(selector).all_inner_texts()]


def test_attribute_page_draws_layers_components_and_the_head_grid(browser, pages, tiny_decoder):
    """The per-layer table with its running total, the run's --top largest components and the rest summed, each as
    the terminal shows them, and the layer x head grid, where hovering a head reads out its value: the one the
    page's data holds for it."""
    from test_report import page_data

    (section,) = page_data(pages / "attribute.html")["sections"]
    page = open_page(browser, pages / "attribute.html")
    assert page.locator("section.report h3").all_inner_texts() == ["PER LAYER", "THE 4 LARGEST COMPONENTS",
                                                                   "EACH HEAD"]  # --top 4, as the terminal
    lines = terminal("attribute", "--model", str(tiny_decoder), TEXT, "--by", "head", "--top", "4")
    title = next(line for line in lines if line.startswith("the 4 largest components"))
    assert page_rows(page, "table.components tbody tr") == table_rows(lines, title, 4)
    assert page.inner_text("p.other") in lines  # "the other N: ... in all"
    assert page.locator("table.per-layer thead th").all_inner_texts()[-1] == "running total"
    per_layer = table_rows(lines, "per layer")
    assert per_layer[0][0] == "embeddings" and per_layer[-1][0] == "biases"  # the tiny decoder has final biases
    assert page_rows(page, "table.per-layer tbody tr") == per_layer
    assert f"sum of the {len(section['components'])} components" in page.inner_text("section.report p")
    assert page.locator("[data-head]").count() == section["layers"] * section["heads"]
    value = next(c["value"] for c in section["components"] if c["name"] == "L1H1")
    page.hover('[data-head="L1H1"]')
    assert page.inner_text(".readout") == f"L1H1: {value:+.4f}"
    assert page.errors == [] and page.requests == [(pages / "attribute.html").as_uri()]
    page.close()


# the page's compressed attention maps held back: what a browser shows before it has inflated them (a screenshot
# taken at load, a print) is what is drawn without them. `window.release()` lets them through
HOLD_INFLATION = """
const gate = new Promise((resolve) => { window.release = resolve; });
const arrayBuffer = Response.prototype.arrayBuffer;
Response.prototype.arrayBuffer = function () { const read = arrayBuffer.call(this); return gate.then(() => read); };
document.addEventListener("DOMContentLoaded", () => {
  window.gridsAtFirst = document.querySelectorAll(".detector table.head-grid").length;
});
"""


def test_heads_page_draws_its_grids_before_the_maps_are_inflated(browser, pages):
    """The heads page drew nothing (a header and a summary) until its attention maps were inflated, so a screenshot
    taken at load (headless Chromium's --screenshot) was empty. Its grids, top heads and legends are drawn in the
    page's first script run; only a clicked head's map waits for the maps, and is drawn when they come."""
    from test_report import page_data

    (section,) = page_data(pages / "heads.html")["sections"]
    counted = [d for d in section["detectors"] if section["counts"][d]]
    assert section["examples"] and len(counted) >= 6
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.add_init_script(HOLD_INFLATION)
    page.goto((pages / "heads.html").as_uri())  # until "load"
    assert page.get_attribute("body", "data-ready") is None  # the maps are held back
    assert page.evaluate("window.gridsAtFirst") == len(counted)  # drawn by the time the page's script has run
    assert page.locator(".detector table.head-grid").count() == len(counted)
    assert page.locator(".detector ol.top-heads").count() == len(counted)
    assert page.locator(".detector .legend").count() == len(counted)
    cell = page.locator('[data-detector="induction"] td.head-cell').first
    cell.click()
    detail = page.locator('[data-detector="induction"] .head-detail')
    assert detail.inner_text() == "L0H0: reading its attention map\u2026" and detail.locator("canvas").count() == 0
    page.evaluate("window.release()")
    page.wait_for_selector("body[data-ready]")
    assert page.get_attribute("body", "data-ready") == "1"
    assert detail.locator("canvas").count() == 1 and detail.inner_text().startswith("L0H0 (mean ")
    page.close()


def test_heads_page_lists_the_top_heads_and_scales_each_grid_to_its_largest(browser, pages, tiny_decoder):
    """Per detector the page lists the top heads with their scores as the terminal's `top:` line does, and shades
    its grid from 0 to its largest score, which the legend gives as the terminal's grid title does; a listed head
    opens its map as its cell does."""
    from test_report import page_data

    (section,) = page_data(pages / "heads.html")["sections"]
    lines = terminal("heads", "--model", str(tiny_decoder), *HEADS_TEXTS)
    tops = iter([line.split()[1:] for line in lines if line.startswith("top:")])
    scales = iter([line for line in lines if line.startswith("heads: share of the largest, ")])
    page = open_page(browser, pages / "heads.html")
    for detector in section["detectors"]:
        if not section["counts"][detector]:
            continue
        box = page.locator(f'[data-detector="{detector}"]')
        listed = box.locator("ol.top-heads li").all_inner_texts()
        assert " ".join(listed).split() == next(tops), detector
        assert box.locator(".legend-max").inner_text() == next(scales).removeprefix("heads: share of the largest, ")
        grid = section["scores"][detector]
        best = max((v, f"{section['layers'][r]}H{h}") for r, row in enumerate(grid) for h, v in enumerate(row)
                   if v is not None)[1]
        darkest = box.locator(f'td.head-cell[data-head="{best}"]').evaluate("td => getComputedStyle(td).backgroundColor")
        assert darkest == "rgb(8, 48, 107)", detector  # the ramp's end: the grid's largest score
    box = page.locator('[data-detector="previous"]')
    box.locator("ol.top-heads li").nth(1).click()
    second = box.locator("ol.top-heads li").nth(1).inner_text().split()[0]
    assert box.locator(".head-detail canvas").count() == 1 and box.locator(".head-detail b").inner_text() == second
    # hovering its map reads out a weight between two of that text's tokens
    listed = next(t for t in section["top"]["previous"] if t["label"] == second)
    example = section["examples"][str(section["best"]["previous"][listed["row"]][listed["head"]])]
    tokens, n = example["tokens"][0], len(example["tokens"][0])
    canvas = box.locator(".head-detail canvas").bounding_box()
    page.mouse.move(canvas["x"] + 0.5 * canvas["width"] / n, canvas["y"] + 1.5 * canvas["height"] / n)
    readout = box.locator(".head-detail .readout").inner_text()
    assert readout.startswith(f'query 1 "{tokens[1]}" \u2192 key 0 "{tokens[0]}": 0.'), readout
    assert page.errors == [] and page.requests == [(pages / "heads.html").as_uri()]
    page.close()


def test_dataset_pages_draw_the_aggregate_with_its_spread_on_hover(browser, tmp_path, tiny_decoder):
    """patch and attribute --dataset --report: the page draws the aggregate as the view heads it (the dataset and
    its count), each grid cell's hover gives its bootstrap interval and share of pairs restored, each component
    its standard deviation and interval; no script error."""
    import json

    words = ["mary", "john", "tom", "anna", "paul", "kate", "mark", "lisa", "sarah", "david"]
    lines = [{"clean": f"when {a} and {b} went home {b} gave it to", "corrupt": f"when {b} and {a} went home {a} gave "
              "it to", "target": a, "foil": b} for a, b in zip(words, words[3:] + words[:3])]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for command, extra in (("patch", ["--sites", "resid,heads"]), ("attribute", ["--by", "head"])):
        path = tmp_path / f"{command}.html"
        result = CliRunner().invoke(app, [command, "--model", str(tiny_decoder), "--dataset", str(data), *extra,
                                          "--report", str(path)])
        assert result.exit_code == 0, result.stderr
        page = open_page(browser, path)
        assert page.errors == [] and "could not draw" not in page.inner_text("body")
        assert page.inner_text("h2") == f"dataset {data}: 10 {'pairs' if command == 'patch' else 'prompts'}"
        if command == "patch":
            tip = page.get_attribute(".patch-grid td", "data-tip")
            assert "95% interval: [" in tip and "% of pairs" in tip
            assert "95% interval" in page.locator("thead").last.inner_text()  # the top sites' table
        else:
            page.hover(".head-cell")
            assert "95% interval [" in page.inner_text(".readout") and "std " in page.inner_text(".readout")
        page.close()


def test_pages_show_a_byte_level_tokens_text(browser, tmp_path, byte_level_gpt2):
    """On a byte-level BPE checkpoint the pages draw each token's text, never its vocabulary entry (`ĠMary`): the
    token lists and the grids' columns with a space as ␣ (said beside them), the hovers and headings quoted
    (`" Mary"`) with the id; no script error."""
    path, clean, corrupt = byte_level_gpt2
    metric = ["--target", " Mary", "--foil", " John"]
    runs = {"encode": ["encode", clean], "attribute": ["attribute", clean, *metric],
            "patch": ["patch", clean, corrupt, *metric, "--sites", "resid"],
            "heads": ["heads", clean, corrupt]}
    for name, args in runs.items():
        report = tmp_path / f"{name}.html"
        result = CliRunner().invoke(app, [args[0], "--model", str(path), *args[1:], "--report", str(report)])
        assert result.exit_code == 0, result.stderr
        page = open_page(browser, report)
        body = page.inner_text("body")
        assert page.errors == [] and "could not draw" not in body, name
        assert "Ġ" not in body and "\u2423 = a space" in body or name == "heads", name
        if name == "encode":
            assert page.locator(".tokens").first.inner_text().split()[:3] == ["When", "\u2423Mary", "\u2423and"]
            assert page.get_attribute(".tokens .tok >> nth=1", "data-tip") == 'position 1: " Mary"'
            assert page.locator(".headview .col.left span").all_inner_texts()[1] == "\u2423Mary"
        elif name == "attribute":
            assert page.locator(".tokens .tok").all_inner_texts()[1] == "\u2423Mary"
            assert " \" to\" (#" in body and "logit difference ' Mary' - ' John'" in body
        elif name == "patch":
            headers = page.locator(".patch-grid thead th").all_inner_texts()
            assert "1*\n\u2423Mary" in headers, headers
            assert 'clean " Mary" (#' in page.get_attribute(".patch-grid thead th >> nth=2", "data-tip")
        else:  # a head's map reads out the tokens' texts on hover
            page.locator('[data-detector="previous"] td.head-cell').first.click()
            page.wait_for_selector('[data-detector="previous"] .head-detail canvas')
            page.hover('[data-detector="previous"] .head-detail canvas', position={"x": 3, "y": 3})
            readout = page.inner_text('[data-detector="previous"] .head-detail .readout')
            assert readout.startswith('query 0 "When" \u2192 key 0 "When"') and "Ġ" not in readout, readout
        page.close()


def test_a_long_text_is_echoed_in_a_few_lines_on_the_page(browser, tmp_path, tiny_decoder):
    """A page heads a long text as the terminal echoes it: its beginning and end around ' ... ', with its length,
    not the whole text (issue 39, item 12); a short one whole."""
    words = " ".join(f"word{k % 7} and more" for k in range(60))  # 60 x 3 words: under 512 tokens, over 360 characters
    path = tmp_path / "long.html"
    result = CliRunner().invoke(app, ["attribute", "--model", str(tiny_decoder), words, "--report", str(path)])
    assert result.exit_code == 0, result.stderr
    page = open_page(browser, path)
    heading = page.inner_text("h2")
    assert " ... " in heading and f"({len(words):,} characters)" in heading and len(heading) < 420
    assert heading.startswith('text 1: "word0 and more word1') and heading.split(" ... ")[1].startswith("word")
    page.close()


def test_a_long_token_is_never_cut_on_the_page(browser, tmp_path):
    """A token wider than a grid cell widens its column in the logit lens grid, whole (no ellipsis, nothing
    clipped): the page changes its layout, it does not cut a token. The bundled bert-base (random, seed 0)
    predicts "arrangements" at "an" in layer 1, which the page used to clip to "arrangemen…"."""
    path = tmp_path / "long-token.html"
    result = CliRunner().invoke(app, ["encode", TEXT, "--report", str(path)])
    assert result.exit_code == 0, result.stderr
    page = open_page(browser, path)
    cells = page.locator(".lens tbody td").all_inner_texts() + page.locator(".lens thead th").all_inner_texts()
    assert "arrangements" in cells and not any("\u2026" in c for c in cells)
    clipped = page.eval_on_selector_all(".lens td, .lens th", "cs => cs.filter(c => c.scrollWidth > c.clientWidth).length")
    assert clipped == 0
    page.close()


def test_the_patch_page_lists_as_many_top_sites_as_the_terminal(browser, tmp_path, tiny_decoder):
    """--top N: the page's top list has N sites of each kind, as the terminal's (it always had 5)."""
    path = tmp_path / "top.html"
    result = CliRunner().invoke(app, ["patch", "--model", str(tiny_decoder), "when mary and john went home john gave "
                                      "it to", "when john and mary went home mary gave it to", "--target", "mary",
                                      "--foil", "john", "--sites", "resid,heads", "--top", "2", "--report", str(path)])
    assert result.exit_code == 0, result.stderr
    page = open_page(browser, path)
    top = page.locator("table").last
    assert top.locator("tbody tr").count() == 4
    assert "the 2 largest scores of each site kind" in page.inner_text("body").lower()
    page.close()


def test_the_steer_sweep_page_draws_its_chart_and_every_continuation(browser, tmp_path, tiny_decoder):
    """steer sweep --report: the chart has a line for the effect and one for the cost, a point per strength, and
    the table each strength's continuation, whole, as --json gives it."""
    import json

    import torch

    from tfcli.analysis.vectors import write_vector

    torch.manual_seed(0)
    vector = tmp_path / "v.safetensors"
    write_vector(vector, {1: 8 * torch.randn(32)}, "gpt2")
    args = ["steer", "sweep", "--model", str(tiny_decoder), "--vector", str(vector), "--strengths", "-2,0,2",
            "--target", "time", "-n", "5", TEXT]
    path = tmp_path / "sweep.html"
    assert CliRunner().invoke(app, [*args, "--report", str(path)]).exit_code == 0
    records = [json.loads(line) for line in CliRunner().invoke(app, [*args, "--json"]).stdout.splitlines()]
    page = open_page(browser, path)
    assert page.eval_on_selector_all("svg.sweep-chart polyline", "lines => lines.length") == 2
    assert page.eval_on_selector_all("svg.sweep-chart circle", "points => points.length") == 6
    assert page.eval_on_selector_all("table.sweep td.continuation", "cells => cells.map(c => c.textContent)") == \
        [r["text"] for r in records]
    assert page.requests == [path.as_uri()] and not page.errors
    page.close()
