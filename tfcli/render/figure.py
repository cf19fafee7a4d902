"""`--report FIGURE.svg|.png|.pdf`: static figures for papers and slides, drawn with matplotlib (imported only
when a figure is written, so that start-up stays fast). One figure per text; a PDF holds one page per text.

Each command's figure is drawn by its renderer, `tfcli.commands.<command>.render`, found by name: its
`figure(item, run, tokenizer)`, with the helpers here (the figure and its caption, token labels, the lens grid):

- encode: the selected layers/heads as query x key heatmaps with token labels and one colour bar, then the
  logit lens (layers x positions, shaded by the top token's probability, the token written in each cell);
- generate: each step's probability with its token and, with --lens, the layers x steps lens grid;
- classify: the label probabilities and, with --explain, the first token's attention strip;
- attribute, patch, heads: their own grids and bars.

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
import importlib
import logging
import math
import re
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

STYLE = {"svg.fonttype": "none", "pdf.fonttype": 42, "text.parse_math": False, "font.size": 8,
         "axes.titlesize": 8}
DPI = 150
MAX_PIXELS = 6000  # longest side of a PNG; a larger figure gets fewer dots per inch
ATTENTION_COLOURS = "Blues"
PROBABILITY_COLOURS = "viridis"
POINTS = 72  # per inch
CHAR_WIDTH = 0.62  # a character's average width, as a fraction of the font size (DejaVu Sans)
MIN_FONT, MAX_FONT = 4.5, 7.0  # token labels: smaller is unreadable in print, larger crowds a short text
CELL_TOKEN = 10  # characters of a token written inside a lens cell (the tick labels carry whole tokens)
ROW = 0.28  # inches per lens row with horizontal text
# font files on the machine with CJK characters, used after DejaVu Sans for the characters it lacks
CJK_FONT_FILES = re.compile(r"NotoSans(Mono)?CJK|NotoSerifCJK|SourceHan|wqy|DroidSansFallback|ipag|ipaex|Takao|"
                            r"Nanum|UnDotum|HanaMin|unifont", re.IGNORECASE)


def save_figure(stream: IO[bytes], fmt: str, run: RunInfo, items: list[Any], tokenizer: Tokenizer | None = None,
                draw: Callable[..., Figure] | None = None) -> None:
    """Write the figure(s) of `items` to `stream` in format `fmt` (svg, png, pdf; several pages only in pdf), each
    drawn by `draw(item, run, tokenizer)` (None: the command's renderer's, `tfcli.commands.<command>.render.figure`)."""
    import matplotlib

    draw = draw or importlib.import_module(f"tfcli.commands.{run.command}.render").figure
    families, _ = _fonts()
    # a CJK font of one weight (WenQuanYi's 500) is drawn as it is: not a line per text on stderr
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    with matplotlib.rc_context(STYLE | {"font.family": families}), warnings.catch_warnings():
        # a token in a script the fonts lack shows as a box (said under the figure); matplotlib's warning per
        # glyph would flood stderr
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        figures = [draw(item, run, tokenizer) for item in items]
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


def log_axis(ax: Any, axis: str) -> None:
    """A log scale along `axis` ("x" or "y") labelled in plain numbers (1,000, 0.001): matplotlib writes its decades as
    math text, which STYLE turns off (a `$` in a token stays a `$`), so they would show as `$\\mathdefault{10^{2}}$`."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 1 else f"{value:g}"))
    scale.set_minor_formatter(NullFormatter())


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


def panel_side(tokens: int) -> float:
    """A heatmap's side in inches: 2.2-4 for a short text, then about 0.09 inch a token, up to 12."""
    return max(2.2, min(4.0, 0.16 * tokens), min(12.0, 0.09 * tokens))


def labels_size(tokens: list[str], length: float) -> float:
    """Inches taken across an axis by its token labels (written along `length` inches)."""
    font, step = _tick_font(len(tokens), length)
    widest = max((len(t) + (0 if step == 1 else 4) for t in tokens), default=1)
    return widest * CHAR_WIDTH * font / POINTS


def text_colour(cmap: Any, value: float) -> str:
    """Black or white, whichever reads on `cmap`'s colour for `value`."""
    red, green, blue, _ = cmap(value)
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"


def lens_layout(columns: list[str], tokens: list[list[str]], width: float) -> dict[str, Any]:
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
    return layout | {"tokens": shown, "width": width, "ticks": labels_size(columns, width) + 0.1}


def lens_grid(ax: Any, columns: list[str], rows: list[str], probs: list[list[float]], layout: dict[str, Any],
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
