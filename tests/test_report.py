"""--report PATH on encode, generate and classify: the path checks, atomic writing, the page's inline data
(compared with the --save tensors), and the static figures checked as files. The page in a real browser is
tests/test_report_browser.py."""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tfcli.cli import app
from tfcli.errors import TfcliError
from tfcli.render.report_file import write_atomically

TEXT = "time flies like an arrow"
TOKENS = ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]


def tfcli(*args: str):
    return CliRunner().invoke(app, list(args))


def page_data(path: Path) -> dict:
    """The JSON the page draws, read back out of its <script id="tfcli-data">."""
    html = path.read_text(encoding="utf-8")
    payload = re.search(r'<script id="tfcli-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    return json.loads(payload)


def unpack_weights(section: dict) -> list[np.ndarray]:
    """The page's attention maps: base64 -> gzip -> little-endian uint16 thousandths -> (rows, cols) arrays."""
    values = np.frombuffer(gzip.decompress(base64.b64decode(section["attention"]["weights"])), dtype="<u2")
    maps, offset = [], 0
    for m in section["attention"]["maps"]:
        size = m["rows"] * m["cols"]
        maps.append(values[offset:offset + size].reshape(m["rows"], m["cols"]) / section["attention"]["scale"])
        offset += size
    assert offset == len(values)
    return maps


# ---------------------------------------------------------------- the path, checked before any work


@pytest.mark.parametrize("command", [["encode"], ["generate", "-n", "1"], ["classify"]])
def test_an_unknown_extension_is_a_usage_error_listing_the_formats(tmp_path, command):
    target = tmp_path / "report.txt"
    # --model names nothing that exists: the report path is refused first, before any model is looked for
    result = tfcli(*command, TEXT, "--model", str(tmp_path / "missing"), "--report", str(target))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: --report") and "`.txt`" in result.stderr
    assert all(ext in result.stderr for ext in (".html", ".svg", ".png", ".pdf"))
    assert result.stdout == "" and not target.exists()


@pytest.fixture
def tiny_runs(tiny_decoder, tiny_classifier) -> dict[str, list[str]]:
    """Each command with --model, on a tiny random model."""
    return {"encode": ["encode", "--model", "tiny"], "generate": ["generate", "--model", str(tiny_decoder)],
            "classify": ["classify", "--model", str(tiny_classifier)]}


@pytest.mark.parametrize("name", ["encode", "generate", "classify"])
def test_an_existing_report_needs_force(tmp_path, tiny_runs, name):
    command = tiny_runs[name]
    target = tmp_path / "report.html"
    target.write_text("keep me")
    refused = tfcli(*command, TEXT, "--report", str(target))
    assert refused.exit_code == 1 and "already exists" in refused.stderr and "--force" in refused.stderr
    assert refused.stdout == "" and target.read_text() == "keep me"
    forced = tfcli(*command, TEXT, "--report", str(target), "--force")
    assert forced.exit_code == 0, forced.stderr
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert f"wrote {target}" in forced.stderr


def test_a_long_output_path_is_said_on_one_line(tmp_path):
    """Scripts read the path back from stderr: it is never wrapped at the terminal's width."""
    folder = tmp_path / ("a-folder-with-a-long-name-" * 4)
    folder.mkdir()
    report, saved = folder / "report.html", folder / "run.safetensors"
    result = tfcli("encode", "--model", "tiny", TEXT, "--report", str(report), "--save", str(saved))
    assert result.exit_code == 0, result.stderr
    lines = result.stderr.splitlines()
    assert f"wrote {report}" in lines and f"saved {saved}" in lines


def test_a_one_picture_format_refuses_several_texts(tmp_path):
    result = tfcli("encode", "--model", "tiny", "one", "two", "--report", str(tmp_path / "a.png"))
    assert result.exit_code == 2 and "holds one text, and 2 were given" in result.stderr and ".pdf" in result.stderr


def test_a_missing_folder_is_refused_before_any_work(tmp_path):
    result = tfcli("encode", "--model", "tiny", TEXT, "--report", str(tmp_path / "no" / "a.html"))
    assert result.exit_code == 1 and "does not exist" in result.stderr and result.stdout == ""


def test_an_interrupted_write_leaves_no_file(tmp_path):
    target = tmp_path / "report.html"

    def half_then_fail(stream):
        stream.write(b"<!DOCTYPE html> half")
        raise OSError(28, "No space left on device")

    with pytest.raises(TfcliError, match="no space left on device writing .*: nothing was written"):
        write_atomically(target, half_then_fail, overwrite=False)
    assert list(tmp_path.iterdir()) == []  # neither the report nor a temporary file

    target.write_text("old")
    with pytest.raises(TfcliError):
        write_atomically(target, half_then_fail, overwrite=True)
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


@pytest.mark.slow
def test_matplotlib_is_imported_only_to_write_a_figure(tmp_path):
    """A page needs no matplotlib; a figure does (which shows that this check can see the import)."""
    code = ("import sys; from typer.testing import CliRunner; from tfcli.cli import app\n"
            "def run(path):\n"
            f"    result = CliRunner().invoke(app, ['encode', '--model', 'tiny', 'time flies', '--report', path])\n"
            "    assert result.exit_code == 0, result.stderr\n"
            "    return 'matplotlib' in sys.modules\n"
            f"print(run({str(tmp_path / 'a.html')!r}), run({str(tmp_path / 'a.svg')!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


@pytest.mark.slow
def test_the_page_names_the_command_as_typed(tmp_path, tfcli_process):
    """`python -m tfcli` shows as that (not as the path of tfcli/__main__.py), arguments quoted for a shell as
    people quote them: `"it's"`, not `'it'"'"'s'`."""
    page = tmp_path / "a page.html"
    result = tfcli_process("encode", "--model", "tiny", "it's", "--report", str(page))
    assert result.returncode == 0, result.stderr
    expected = f"python -m tfcli encode --model tiny \"it's\" --report '{page}'"
    assert page_data(page)["run"]["command_line"] == expected


# ---------------------------------------------------------------- the page


def test_encode_page_holds_every_head_with_the_weights_that_save_writes(tmp_path):
    """With --json and --save in the same run: the page's maps (the mean, and each head behind it) are the
    captured weights to 3 decimals, and the page references nothing outside itself."""
    page, tensors = tmp_path / "page.html", tmp_path / "t.safetensors"
    result = tfcli("encode", "--model", "tiny", TEXT, "--layers", "-1", "--json", "--save", str(tensors),
                   "--report", str(page))
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["tokens"] == TOKENS and tensors.exists()
    html = page.read_text(encoding="utf-8")
    assert re.findall(r"https?:|(?:src|href)\s*=\s*[\"']?(?!#)[^\s>\"']|url\(|@import|<link|<img|<iframe", html) == []

    data = page_data(page)
    assert data["run"]["command"] == "encode" and data["run"]["trained"] is False
    assert data["run"]["weights"].startswith("random (seed 0)") and data["run"]["version"]
    section, = data["sections"]
    assert section["tokens"]["tokens"] == TOKENS and [s[0] for s in section["stages"]][0] == "blocks.0.resid_pre"
    from safetensors.numpy import load_file

    saved = load_file(tensors)["attention.1"][0]  # (heads, queries, keys) of the last of tiny's 2 blocks
    heads = [m["head"] for m in section["attention"]["maps"]]
    assert heads == ["mean", *range(saved.shape[0])]
    maps = unpack_weights(section)
    np.testing.assert_allclose(maps[0], saved.mean(0), atol=5e-4 + 1e-6)
    for head, weights in enumerate(maps[1:]):
        np.testing.assert_allclose(weights, saved[head], atol=5e-4 + 1e-6)
    lens, = section["lens"]["rows"]
    assert lens["layer"] == 1 and len(lens["top"]) == len(TOKENS) and len(lens["top"][0]) == 3


def test_selected_heads_are_the_maps_and_several_texts_give_a_section_each(tmp_path):
    page = tmp_path / "page.html"
    assert tfcli("encode", "--model", "tiny", "one text", "another text", "--heads", "1,0",
                 "--report", str(page)).exit_code == 0
    data = page_data(page)
    assert [s["text"] for s in data["sections"]] == ["one text", "another text"]
    assert {m["head"] for s in data["sections"] for m in s["attention"]["maps"]} == {0, 1}


def test_generate_and_classify_pages_carry_their_records(tmp_path, tiny_runs):
    generated, classified = tmp_path / "g.html", tmp_path / "c.html"
    result = tfcli(*tiny_runs["generate"], TEXT, "-n", "3", "--lens", "--json", "--report", str(generated))
    assert result.exit_code == 0, result.stderr
    section, = page_data(generated)["sections"]
    record = json.loads(result.stdout)
    assert section["steps"] == record["steps"] and len(section["steps"][0]["lens"]) == 3  # emb + 2 blocks
    assert section["full_text"].startswith(TEXT) and section["full_text"].endswith(record["text"])

    assert tfcli(*tiny_runs["classify"], TEXT, "--explain", "--json", "--report", str(classified)).exit_code == 0
    section, = page_data(classified)["sections"]
    assert section["labels"] == ["negative", "neutral", "positive"] and section["explain"]["tokens"] == TOKENS


def test_a_token_cannot_end_the_data_script_early(tmp_path, tiny_runs):
    page = tmp_path / "page.html"
    assert tfcli(*tiny_runs["classify"], "</script><b>x", "--report", str(page)).exit_code == 0
    assert page_data(page)["sections"][0]["text"] == "</script><b>x"


# ---------------------------------------------------------------- the figures


def test_svg_figure_is_valid_with_tokens_as_text(tmp_path):
    figure = tmp_path / "a.svg"
    result = tfcli("encode", "--model", "tiny", TEXT, "--layers", "0", "--heads", "0,1", "--report", str(figure))
    assert result.exit_code == 0, result.stderr
    root = ElementTree.parse(figure).getroot()
    assert root.tag.endswith("svg")
    texts = {node.text for node in root.iter() if node.tag.endswith("text")}
    assert set(TOKENS) <= texts and {"layer 0, head 0", "layer 0, head 1"} <= texts
    assert {"attention weight", "probability"} <= texts  # the colour bars of the maps and of the lens grid
    assert any(text and text.startswith("logit lens") for text in texts)


@pytest.mark.slow
def test_a_long_text_keeps_every_token_label_apart(tmp_path):
    """132 tokens: the panel grows so that each token keeps its label, none drawn over its neighbour."""
    figure = tmp_path / "a.svg"
    text = " ".join(["the animal didn't cross the street because it was too tired"] * 10)
    assert tfcli("encode", "--model", "tiny", text, "--layers", "-1", "--report", str(figure)).exit_code == 0
    root = ElementTree.parse(figure).getroot()
    texts = [node.text for node in root.iter() if node.tag.endswith("text")]
    assert texts.count("street") >= 3 * 10  # down the left, along the bottom and under the lens grid
    assert texts.count("[CLS]") >= 3
    width = float(root.get("width").removesuffix("pt"))
    assert width >= 132 * 0.08 * 72  # about 0.09 inch a token

def test_png_figure_has_a_sensible_size_and_is_not_blank(tmp_path, tiny_runs):
    from matplotlib.image import imread

    figure = tmp_path / "a.png"
    assert tfcli(*tiny_runs["generate"], TEXT, "-n", "3", "--lens", "--report", str(figure)).exit_code == 0
    pixels = imread(figure)
    assert 300 <= pixels.shape[0] <= 6000 and 300 <= pixels.shape[1] <= 6000
    assert pixels[..., :3].std() > 0.05  # drawn, not one flat colour


def test_pdf_figure_opens_with_a_page_per_text_and_its_tokens_as_text(tmp_path, tiny_runs):
    from pypdf import PdfReader

    figure = tmp_path / "a.pdf"
    assert tfcli(*tiny_runs["classify"], "good film", "bad", "--explain", "--report", str(figure)).exit_code == 0
    pages = PdfReader(figure).pages
    assert len(pages) == 2
    first, second = (page.extract_text().split("\n") for page in pages)
    assert {"[CLS]", "good", "film", "[SEP]", "negative", "neutral", "positive"} <= set(first)
    assert "bad" in second and "film" not in second


# The patch page's renderer (tfcli/commands/patch/report.js) run in Node on a stand-in DOM: each element a plain object,
# the page's text the strings appended to it. What the renderer writes, without a browser.
PATCH_PAGE_IN_NODE = r"""
const fs = require("fs"), vm = require("vm");
const [script, data] = process.argv.slice(2);
function el(tag, attrs, ...children) {
  const node = {tag, attrs: attrs || {}, children: [], style: {}, addEventListener() {},
                append(...items) { for (const c of items) if (c !== null && c !== undefined) this.children.push(c); }};
  node.append(...children);
  return node;
}
const text = (node) => typeof node === "string" || typeof node === "number" ? String(node)
  : node.children.map(text).join("");
const all = (node, tag) => typeof node !== "object" ? [] :
  (node.tag === tag ? [node] : []).concat(...node.children.map((c) => all(c, tag)));
global.window = {};
vm.runInThisContext(fs.readFileSync(script, "utf8"));
const section = el("section", {}), s = JSON.parse(fs.readFileSync(data, "utf8")).sections[0];
const LIB = {el, echoed: (t) => t, quoted: (t) => JSON.stringify(t), label: (t) => t, spaceNote: () => []};
window.tfcliRenderers.patch(section, s, 1, LIB).then(() => {
  const tables = all(section, "table");
  const rows = all(tables[tables.length - 1], "tbody").flatMap((b) => all(b, "tr"));
  console.log(JSON.stringify({top: rows.map((r) => all(r, "td").map(text)),
                              paragraphs: all(section, "p").map(text)}));
});
"""


def test_the_patch_page_signs_its_numbers_as_the_terminal_does(tmp_path, tiny_decoder):
    """The page's top list, its clean and corrupt values and its correlation read as the terminal's: `+0.6213`,
    not `0.6213` (issue 51, item 9)."""
    import shutil

    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("no Node.js to run the page's script in (tests/test_report_browser.py runs it in Chromium)")
    args = ["patch", "--model", str(tiny_decoder), "when mary and john went home john gave it to",
            "when john and mary went home mary gave it to", "--target", "mary", "--foil", "john", "--sites",
            "resid,heads", "--method", "both", "--top", "3", "--width", "200", "--no-color"]
    page = tmp_path / "patch.html"
    assert tfcli(*args, "--report", str(page)).exit_code == 0
    terminal = tfcli(*args).stdout
    data = tmp_path / "data.json"
    data.write_text(json.dumps(page_data(page)), encoding="utf-8")
    harness = tmp_path / "harness.js"
    harness.write_text(PATCH_PAGE_IN_NODE, encoding="utf-8")
    script = Path(__file__).resolve().parent.parent / "tfcli" / "commands" / "patch" / "report.js"
    drawn = json.loads(subprocess.run([node, str(harness), str(script), str(data)], capture_output=True, text=True,
                                      check=True).stdout)
    section = page_data(page)["sections"][0]
    assert [row[:4] for row in drawn["top"]] == [
        [t["site"], t["where"], f"{t['score']:+.4f}", f"{t['attribution']:+.4f}"] for t in section["top"]]
    for row in drawn["top"]:  # the terminal's top list has the same row, numbers signed alike
        assert re.search(r"\s+".join(map(re.escape, row)), terminal), row
    said = " ".join(drawn["paragraphs"])
    assert f"clean {section['clean_value']:+.4f}, corrupt {section['corrupt_value']:+.4f}" in said
    assert re.search(r"r = [+-]\d\.\d{3} over", said)
