"""`--report FIGURE.svg|.png|.pdf`: static figures for papers and slides, drawn with matplotlib (imported here
only, so that start-up stays fast). One figure per text; a PDF holds one page per text.

- encode: the selected layers/heads as query x key heatmaps with token labels and one colour bar, then the
  logit lens (layers x positions, shaded by the top token's probability, the token written in each cell);
- generate: each step's probability with its token and, with --lens, the layers x steps lens grid;
- classify: the label probabilities and, with --explain, the first token's attention strip.

Sizes follow the text: a heatmap panel grows with the tokens so that every token keeps a readable label
(up to 12 inches; beyond, every k-th token is labelled), and lens cells write their token across, or
turned a quarter, or not at all, as their width allows; nothing is drawn over anything else.

Tokens are real text in SVG (`svg.fonttype: none`) and PDF (TrueType, `pdf.fonttype: 42`), so they can be
searched and edited; math parsing is off, so a `$` in a token stays a `$`. Text is drawn with matplotlib's DejaVu
Sans and, for what it lacks, any CJK font installed on the machine (Noto Sans CJK, WenQuanYi, Droid Sans Fallback,
...); a PNG or PDF says under the figure which tokens have characters none of them has (they show as boxes).

Weights are shaded on one absolute scale, 0 to 1, as in the terminal and the page: near-uniform attention looks
faint everywhere. encode draws the maps the terminal shows in full (`RunInfo.detail`: by default the last layer's).
"""

from __future__ import annotations

import functools
import logging
import math
import re
import textwrap
import warnings
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.classify import Classification
    from tfcli.encode import TextReport
    from tfcli.generate import Generation
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

STYLE = {"svg.fonttype": "none", "pdf.fonttype": 42, "text.parse_math": False, "font.size": 8,
         "axes.titlesize": 8}
DPI = 150
MAX_PIXELS = 6000  # longest side of a PNG; a larger figure gets fewer dots per inch
ATTENTION_COLOURS = "Blues"
PROBABILITY_COLOURS = "viridis"
KIND_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross "}
POINTS = 72  # per inch
CHAR_WIDTH = 0.62  # a character's average width, as a fraction of the font size (DejaVu Sans)
MIN_FONT, MAX_FONT = 4.5, 7.0  # token labels: smaller is unreadable in print, larger crowds a short text
CELL_TOKEN = 10  # characters of a token written inside a lens cell (the tick labels carry whole tokens)
ROW = 0.28  # inches per lens row with horizontal text
LINEAR_FROM = 0.1  # generate: a probability axis from 0 to 1 when every step is at least this probable, else log
# font files on the machine with CJK characters, used after DejaVu Sans for the characters it lacks
CJK_FONT_FILES = re.compile(r"NotoSans(Mono)?CJK|NotoSerifCJK|SourceHan|wqy|DroidSansFallback|ipag|ipaex|Takao|"
                            r"Nanum|UnDotum|HanaMin|unifont", re.IGNORECASE)


def save_figure(stream: IO[bytes], fmt: str, run: RunInfo, items: list[Any], tokenizer: Tokenizer | None = None) -> None:
    """Write the figure(s) of `items` to `stream` in format `fmt` (svg, png, pdf; several pages only in pdf)."""
    import matplotlib

    from tfcli.render.page import analysis_module

    draws = {"encode": encode_figure, "generate": lambda item, run: generate_figure(item, run, tokenizer),
             "classify": classify_figure}
    draw = draws.get(run.command) or analysis_module(run.command).figure  # attribute, patch, heads
    families, _ = _fonts()
    # a CJK font of one weight (WenQuanYi's 500) is drawn as it is: not a line per text on stderr
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    with matplotlib.rc_context(STYLE | {"font.family": families}), warnings.catch_warnings():
        # a token in a script the fonts lack shows as a box (said under the figure); matplotlib's warning per
        # glyph would flood stderr
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        figures = [draw(item, run) for item in items]
        if fmt != "svg":  # an SVG's text is drawn by its viewer's fonts, which may have them
            for figure in figures:
                _say_missing_glyphs(figure)
        if fmt == "pdf":
            from matplotlib.backends.backend_pdf import PdfPages

            with PdfPages(stream, metadata={"Creator": f"tfcli {run.version}", "Title": f"tfcli {run.command}"}) as pdf:
                for figure in figures:
                    pdf.savefig(figure)
        else:
            figure = figures[0]
            figure.savefig(stream, format=fmt, dpi=min(DPI, MAX_PIXELS / max(figure.get_size_inches())))


@functools.cache
def _fonts() -> tuple[list[str], frozenset[int]]:
    """The font families a figure's text is drawn with, in fallback order (DejaVu Sans, then the CJK fonts found on
    the machine), and the characters (code points) they have between them."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    manager = font_manager.fontManager
    known: dict[str, str] = {}
    for entry in manager.ttflist:  # a collection's first face: its regular one (WenQuanYi's next is a bitmap face
        known.setdefault(entry.fname, entry.name)  # whose small sizes Agg draws blank)
    families = ["DejaVu Sans"]
    paths = [font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"), fallback_to_default=True)]
    for path in sorted(font_manager.findSystemFonts()):
        if not CJK_FONT_FILES.search(Path(path).name):
            continue
        try:
            if path not in known:  # installed after matplotlib built its font list
                before = len(manager.ttflist)
                manager.addfont(path)
                known[path] = manager.ttflist[before].name
            if known[path] not in families:
                families.append(known[path])
                paths.append(path)
        except (OSError, RuntimeError, ValueError):  # a font file matplotlib cannot read
            continue
    characters: set[int] = set()
    for path in paths:
        try:
            characters.update(FT2Font(path).get_charmap())
        except (OSError, RuntimeError, ValueError):
            continue
    return families, frozenset(characters)


def lacking_glyphs(text: str) -> str:
    """The characters of `text` that none of the figure's fonts has (spaces and controls aside)."""
    _, characters = _fonts()
    return "".join(dict.fromkeys(c for c in text if c.isprintable() and not c.isspace() and ord(c) not in characters))


def _say_missing_glyphs(figure: Figure) -> None:
    """Add to the caption under the figure which of its texts hold characters its fonts lack (drawn as boxes): the
    tokens by name, the title's by character."""
    from matplotlib.text import Text

    titles = {id(t) for t in (figure._suptitle, figure._supxlabel) if t is not None}
    tokens, characters = [], ""
    for text in figure.findobj(Text):
        lacking = lacking_glyphs(text.get_text())
        if not lacking:
            continue
        if id(text) in titles:
            characters += lacking
        elif text.get_text() not in tokens:
            tokens.append(text.get_text())
    characters = "".join(dict.fromkeys(c for c in characters if not any(c in t for t in tokens)))
    if not tokens and not characters:
        return
    said = ", ".join(repr(t) for t in tokens[:12]) + (f" and {len(tokens) - 12} more" if len(tokens) > 12 else "")
    if characters:
        said += ("; " if said else "") + "in the title " + " ".join(f"{c} U+{ord(c):04X}" for c in characters[:12])
    caption = figure._supxlabel
    note = (f"drawn as boxes, this machine's fonts lacking their characters: {said} (install a font that has them, "
            "e.g. Debian's fonts-noto-cjk; or write an .svg, drawn by its viewer's fonts)")
    width = figure.get_size_inches()[0] * POINTS
    wrapped = "\n".join(textwrap.wrap(note, int(width / (CHAR_WIDTH * 6)) - 2))
    figure.supxlabel(caption.get_text() + "\n" + wrapped if caption is not None else wrapped, fontsize=6,
                     color="0.4", x=0.01, ha="left")


def blank_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def caption(figure: Figure, title: str, run: RunInfo) -> None:
    """The title (what ran on which text) above, wrapped to the figure's width (three lines at most), and
    where the numbers come from below."""
    width = figure.get_size_inches()[0] * POINTS

    def wrap(text: str, size: float, lines: int) -> str:
        return "\n".join(textwrap.wrap(text, int(width / (CHAR_WIDTH * size)) - 2, max_lines=lines, placeholder=" …"))

    figure.suptitle(wrap(title, 9, 3), fontsize=9, ha="left", x=0.01)
    # supxlabel, not text: constrained layout makes room for it under the tick labels
    figure.supxlabel(wrap(f"{run.model}; weights {run.weights}; tfcli {run.version}", 6, 3), fontsize=6,
                     color="0.4", x=0.01, ha="left")


def _tick_font(count: int, length: float) -> tuple[float, int]:
    """(font size in points, label every k-th) for `count` labels along `length` inches."""
    font = min(MAX_FONT, 0.8 * length * POINTS / max(count, 1))
    step = 1 if font >= MIN_FONT else math.ceil(MIN_FONT / font)
    return max(font, MIN_FONT) if step > 1 else font, step


def label_axis(ax: Any, axis: str, tokens: list[str], length: float) -> None:
    """Token labels along `axis` ("x": rotated, along the bottom; "y": down the left) of `length` inches;
    past what fits, every k-th token, written with its position."""
    font, step = _tick_font(len(tokens), length)
    positions = range(0, len(tokens), step)
    labels = [tokens[i] if step == 1 else f"{tokens[i]} {i}" for i in positions]
    if axis == "x":
        ax.set_xticks(positions, labels, fontsize=font, rotation=90)
    else:
        ax.set_yticks(positions, labels, fontsize=font)
    ax.tick_params(length=0 if step == 1 else 2)


def _panel(tokens: int) -> float:
    """A heatmap's side in inches: 2.2-4 for a short text, then about 0.09 inch a token, up to 12."""
    return max(2.2, min(4.0, 0.16 * tokens), min(12.0, 0.09 * tokens))


def _labels_size(tokens: list[str], length: float) -> float:
    """Inches taken across an axis by its token labels (written along `length` inches)."""
    font, step = _tick_font(len(tokens), length)
    widest = max((len(t) + (0 if step == 1 else 4) for t in tokens), default=1)
    return widest * CHAR_WIDTH * font / POINTS


def text_colour(cmap: Any, value: float) -> str:
    """Black or white, whichever reads on `cmap`'s colour for `value`."""
    red, green, blue, _ = cmap(value)
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"


def encode_figure(report: TextReport, run: RunInfo) -> Figure:
    """The maps the terminal shows in full (`run.detail`; one row per layer when several heads are selected, else
    wrapped four to a row), one colour bar (0 to 1), and the lens grid of every layer below."""
    from tfcli.render.encode import cut_note, in_detail

    layers = {kind: [m.layer for m in report.attention if m.kind == kind] for kind in {m.kind for m in report.attention}}
    maps = [m for m in report.attention if in_detail(m.layer, layers[m.kind], run.detail)]
    per_layer = max(1, sum(1 for m in maps if (m.kind, m.layer) == (maps[0].kind, maps[0].layer))) if maps else 1
    columns = per_layer if per_layer > 1 else min(4, max(1, len(maps)))
    rows = math.ceil(len(maps) / columns) if maps else 0
    positions = report.target_tokens if report.target_tokens is not None else report.tokens
    panel = _panel(max(len(report.tokens), len(report.target_tokens or [])))
    slot_width = panel + max((_labels_size(m.query_tokens, panel) for m in maps), default=0) + 0.5
    slot_height = panel + max((_labels_size(m.key_tokens, panel) for m in maps), default=0) + 0.8
    width = max(columns * slot_width + 1.2, 6.0)
    lens = _lens_layout(positions, [[top[0][0] for top in row.top] for row in report.lens], width - 2.0) \
        if report.lens else None
    lens_height = 0.3 + lens["row"] * len(report.lens) + lens["ticks"] if lens else 0
    figure = blank_figure(width, rows * slot_height + lens_height + 1.0)
    cut = f", {cut_note(report, report.read_text, report.text)}" if report.read_text is not None else ""
    caption(figure, f"tfcli encode{cut}: {report.shown_text!r}", run)
    grid = figure.add_gridspec(rows + (1 if lens else 0), columns,
                               height_ratios=[slot_height] * rows + ([lens_height] if lens else []))
    axes, image = [], None
    for index, amap in enumerate(maps):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        image = ax.imshow(amap.weights.float().cpu().numpy(), cmap=ATTENTION_COLOURS, vmin=0, vmax=1,
                          interpolation="nearest", aspect="equal")
        head = "mean of heads" if amap.head == "mean" else f"head {amap.head}"
        ax.set_title(f"{KIND_TITLES[amap.kind]}layer {amap.layer}, {head}")
        label_axis(ax, "y", amap.query_tokens, panel)
        label_axis(ax, "x", amap.key_tokens, panel)
        if index % columns == 0:
            ax.set_ylabel("query")
        if index + columns >= len(maps):  # the lowest map of its column
            ax.set_xlabel("key")
        axes.append(ax)
    if image is not None:
        figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if lens:
        what = f"position, through {report.lens_through}" + ("" if report.lens_predicts else
                                                               " (no LM head: not a prediction)")
        _lens_grid(figure.add_subplot(grid[rows, :]), positions, [f"layer {row.layer}" for row in report.lens],
                   [[top[0][2] for top in row.top] for row in report.lens], lens, figure, what)
    return figure


def _lens_layout(columns: list[str], tokens: list[list[str]], width: float) -> dict[str, Any]:
    """How a lens grid `width` inches wide writes its cells' tokens: across when they fit, turned a quarter
    when the cells are narrow, else not at all; each row's height and the column labels' (inches)."""
    shown = [[t if len(t) <= CELL_TOKEN else t[:CELL_TOKEN - 1] + "…" for t in row] for row in tokens]
    longest = max((len(t) for row in shown for t in row), default=1)
    cell = width * POINTS / max(len(columns), 1)  # points
    across = min(6.0, 0.9 * cell / (CHAR_WIDTH * longest))
    turned = min(6.0, 0.7 * cell)
    if across >= MIN_FONT:
        layout = {"font": across, "rotation": 0, "row": ROW}
    elif turned >= MIN_FONT:
        layout = {"font": turned, "rotation": 90, "row": max(ROW, 1.1 * longest * CHAR_WIDTH * turned / POINTS + 0.06)}
    else:
        layout = {"font": 0.0, "rotation": 0, "row": ROW}
    return layout | {"tokens": shown, "width": width, "ticks": _labels_size(columns, width) + 0.1}


def _lens_grid(ax: Any, columns: list[str], rows: list[str], probs: list[list[float]], layout: dict[str, Any],
               figure: Figure, what: str) -> None:
    """rows x columns cells shaded by probability, each cell's top token written in it as `layout` says."""
    import matplotlib

    cmap = matplotlib.colormaps[PROBABILITY_COLOURS]
    image = ax.imshow(probs, cmap=cmap, vmin=0, vmax=1, interpolation="nearest", aspect="auto")
    ax.set_title(f"logit lens: each layer's top token per {what}, shaded by its probability")
    ax.set_yticks(range(len(rows)), rows)
    label_axis(ax, "x", columns, layout["width"])
    if layout["font"]:
        for r, row in enumerate(layout["tokens"]):
            for c, token in enumerate(row):
                ax.text(c, r, token, ha="center", va="center", fontsize=layout["font"], rotation=layout["rotation"],
                        color=text_colour(cmap, probs[r][c]))
    figure.colorbar(image, ax=ax, label="probability", shrink=0.9)


def generate_figure(result: Generation, run: RunInfo, tokenizer: Tokenizer) -> Figure:
    """Each new token's probability (bars, tokens along the bottom) and, with --lens, the layers x steps grid."""
    from tfcli.generate import token_text

    tokens = [repr(token_text(tokenizer, step.token_id)) for step in result.steps]
    guesses = [[token_text(tokenizer, step.lens[layer][0]) for step in result.steps]
               for layer in range(len(result.steps[0].lens))] if result.steps and result.steps[0].lens else []
    # a step is as wide as its lens cells' tokens written across (so far as 16 inches allow)
    longest = min(CELL_TOKEN, max((len(t) for row in guesses for t in row), default=0))
    width = min(16.0, max(6.0, len(tokens) * max(0.35, 1.15 * longest * CHAR_WIDTH * 5.5 / POINTS) + 2))
    plot_width = width - 2.0  # less the row labels and the colour bar
    layers = len(guesses)
    lens = _lens_layout(tokens, guesses, plot_width) if guesses else None
    bars_height = 2.2 + _labels_size(tokens, plot_width)
    lens_height = 0.3 + lens["row"] * layers + lens["ticks"] if lens else 0
    figure = blank_figure(width, bars_height + lens_height + 1.0)
    caption(figure, f"tfcli generate: {result.prompt!r} -> {result.text!r}", run)
    grid = figure.add_gridspec(2 if lens else 1, 1, height_ratios=[bars_height, lens_height] if lens else [1])
    ax = figure.add_subplot(grid[0])
    bars = ax.bar(range(len(tokens)), [step.prob for step in result.steps], color="#2171b5")
    if plot_width * POINTS / max(len(tokens), 1) >= 8:  # room for each probability, turned, above its bar
        ax.bar_label(bars, [f"{step.prob:.2g}" for step in result.steps], rotation=90, fontsize=6, padding=2)
    ax.set_xlim(-0.5, len(tokens) - 0.5)
    lowest = min((step.prob for step in result.steps), default=1.0)
    if lowest >= LINEAR_FROM:
        ax.set_ylim(0, 1)
        ax.set_ylabel("probability")
    else:  # on 0 to 1, a bar of 3e-4 would not show: a log axis down to the least probable step's decade
        ax.set_yscale("log")
        ax.set_ylim(10 ** math.floor(math.log10(max(lowest, 1e-12))), 1)
        ax.set_ylabel("probability (log scale)")
    ax.set_title("each new token's probability (the model's, before temperature and filtering)")
    label_axis(ax, "x", tokens, plot_width)
    if lens:
        _lens_grid(figure.add_subplot(grid[1]), tokens,
                   ["emb" if layer == 0 else f"layer {layer}" for layer in range(layers)],
                   [[step.lens[layer][1] for step in result.steps] for layer in range(layers)], lens, figure, "step")
    return figure


def classify_figure(result: Classification, run: RunInfo) -> Figure:
    """Label probabilities, most probable on top, and with --explain the first token's attention strip, each
    cell's weight written in it where it fits, and the uniform weight 1/n marked on the colour bar."""
    import matplotlib

    ranked = result.ranked()
    explain = result.explanation
    width = max(6.0, min(16.0, 0.32 * len(explain.tokens) + 1.5)) if explain else 6.0
    plot_width = width - 2.0
    strip_height = 0.9 + _labels_size(explain.tokens, plot_width) if explain else 0
    figure = blank_figure(width, 1.6 + 0.25 * len(ranked) + strip_height)
    caption(figure, f"tfcli classify: {result.text!r} -> {result.prediction}", run)
    grid = figure.add_gridspec(2 if explain else 1, 1,
                               height_ratios=[0.6 + 0.25 * len(ranked), strip_height] if explain else [1])
    ax = figure.add_subplot(grid[0])
    ax.barh(range(len(ranked)), [p for _, p in ranked], color="#2171b5")
    ax.set_yticks(range(len(ranked)), [label for label, _ in ranked])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability")
    if explain:
        strip = figure.add_subplot(grid[1])
        # the absolute scale, 0 to 1, as in the terminal and the page: near-uniform attention looks faint
        cmap = matplotlib.colormaps[ATTENTION_COLOURS]
        image = strip.imshow([explain.weights], cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        where = f"layer {explain.layers[0]}" if len(explain.layers) == 1 else \
            f"layers {explain.layers[0]}-{explain.layers[-1]}"
        strip.set_title(f"what the first token attends to in {where}, mean over heads")
        strip.set_yticks([])
        label_axis(strip, "x", explain.tokens, plot_width)
        cell = plot_width * POINTS / len(explain.tokens)  # points
        if cell >= 4 * CHAR_WIDTH * MIN_FONT:  # room for "0.12"
            for k, w in enumerate(explain.weights):
                strip.text(k, 0, f"{w:.2f}", ha="center", va="center", fontsize=min(6.0, cell / (4 * CHAR_WIDTH)),
                           color=text_colour(cmap, w))
        bar = figure.colorbar(image, ax=strip, label="weight; orange: 1/n")
        bar.ax.axhline(1 / len(explain.tokens), color="#e6550d", linewidth=1.5)
    return figure
