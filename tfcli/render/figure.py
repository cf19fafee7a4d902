"""`--report FIGURE.svg|.png|.pdf`: static figures for papers and slides, drawn with matplotlib (imported here
only, so that start-up stays fast). One figure per text; a PDF holds one page per text.

- encode: the selected layers/heads as query x key heatmaps with token labels and a colour bar, then the
  logit lens (layers x positions, shaded by the top token's probability, the token written in each cell);
- generate: each step's probability with its token and, with --lens, the layers x steps lens grid;
- classify: the label probabilities and, with --explain, the first token's attention strip.

Tokens are real text in SVG (`svg.fonttype: none`) and PDF (TrueType, `pdf.fonttype: 42`), so they can be
searched and edited; math parsing is off, so a `$` in a token stays a `$`.
"""

from __future__ import annotations

import math
import warnings
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.classify import Classification
    from tfcli.encode import TextReport
    from tfcli.generate import Generation
    from tfcli.render.report_file import RunInfo
    from tfcli.tokenizer import Tokenizer

STYLE = {"svg.fonttype": "none", "pdf.fonttype": 42, "text.parse_math": False, "font.size": 8,
         "axes.titlesize": 8, "savefig.dpi": 150}
ATTENTION_COLOURS = "Blues"
PROBABILITY_COLOURS = "viridis"
KIND_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross "}
LABELLED_TOKENS = 64  # more tokens than this per axis: no tick labels (they would overlap)


def save_figure(stream: IO[bytes], fmt: str, run: RunInfo, items: list[Any], tokenizer: Tokenizer | None = None) -> None:
    """Write the figure(s) of `items` to `stream` in format `fmt` (svg, png, pdf; several pages only in pdf)."""
    import matplotlib

    draw = {"encode": encode_figure, "generate": lambda item, run: generate_figure(item, run, tokenizer),
            "classify": classify_figure}[run.command]
    with matplotlib.rc_context(STYLE), warnings.catch_warnings():
        # a token in a script the font lacks shows as a box; matplotlib's warning per glyph would flood stderr
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        figures = [draw(item, run) for item in items]
        if fmt == "pdf":
            from matplotlib.backends.backend_pdf import PdfPages

            with PdfPages(stream, metadata={"Creator": f"tfcli {run.version}", "Title": f"tfcli {run.command}"}) as pdf:
                for figure in figures:
                    pdf.savefig(figure)
        else:
            figures[0].savefig(stream, format=fmt)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _caption(figure: Figure, title: str, run: RunInfo) -> None:
    figure.suptitle(title, fontsize=9, ha="left", x=0.01)
    # supxlabel, not text: constrained layout makes room for it under the tick labels
    figure.supxlabel(f"{run.model}; weights {run.weights}; tfcli {run.version}", fontsize=6, color="0.4",
                     x=0.01, ha="left")


def _label_axes(ax: Any, rows: list[str], columns: list[str]) -> None:
    """Token tick labels on both axes (rows down the left, columns rotated along the bottom)."""
    for tokens, ticks, labels, rotation in ((rows, ax.set_yticks, ax.set_yticklabels, 0),
                                            (columns, ax.set_xticks, ax.set_xticklabels, 90)):
        if len(tokens) <= LABELLED_TOKENS:
            size = max(3.0, min(7.0, 260 / max(len(tokens), 1)))
            ticks(range(len(tokens)))
            labels(tokens, fontsize=size, rotation=rotation)
        else:
            ticks([])
    ax.tick_params(length=0)


def encode_figure(report: TextReport, run: RunInfo) -> Figure:
    """The selected maps (one row per layer when several heads are selected, else wrapped four to a row),
    one shared colour bar, and the lens grid below."""
    maps = report.attention
    per_layer = max(1, sum(1 for m in maps if (m.kind, m.layer) == (maps[0].kind, maps[0].layer))) if maps else 1
    columns = per_layer if per_layer > 1 else min(4, max(1, len(maps)))
    rows = math.ceil(len(maps) / columns) if maps else 0
    tokens = max(len(report.tokens), len(report.target_tokens or []))
    panel = min(4.0, max(2.2, tokens * 0.16))
    lens_height = (0.5 + 0.28 * len(report.lens)) if report.lens else 0
    figure = _figure(columns * panel + 1.2, rows * panel + lens_height + 0.8)
    _caption(figure, f"tfcli encode: {report.text!r}", run)
    grid = figure.add_gridspec(rows + (1 if report.lens else 0), columns,
                               height_ratios=[panel] * rows + ([lens_height] if report.lens else []))
    top = max((m.weights.max().item() for m in maps), default=1.0) or 1.0
    axes, image = [], None
    for index, amap in enumerate(maps):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        image = ax.imshow(amap.weights.float().cpu().numpy(), cmap=ATTENTION_COLOURS, vmin=0, vmax=top,
                          interpolation="nearest", aspect="equal")
        head = "mean of heads" if amap.head == "mean" else f"head {amap.head}"
        ax.set_title(f"{KIND_TITLES[amap.kind]}layer {amap.layer}, {head}")
        _label_axes(ax, amap.query_tokens, amap.key_tokens)
        axes.append(ax)
    if image is not None:
        figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight (rows: queries, columns: keys)")
    if report.lens:
        positions = report.target_tokens if report.target_tokens is not None else report.tokens
        _lens_grid(figure.add_subplot(grid[rows, :]), positions, [f"layer {row.layer}" for row in report.lens],
                   [[top[0][0] for top in row.top] for row in report.lens],
                   [[top[0][2] for top in row.top] for row in report.lens], figure, "position")
    return figure


def _lens_grid(ax: Any, columns: list[str], rows: list[str], tokens: list[list[str]], probs: list[list[float]],
               figure: Figure, what: str) -> None:
    """rows x columns cells shaded by probability, each cell's top token written in it when there is room."""
    image = ax.imshow(probs, cmap=PROBABILITY_COLOURS, vmin=0, vmax=1, interpolation="nearest", aspect="auto")
    ax.set_title(f"logit lens: each layer's top token per {what}, shaded by its probability")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    if len(columns) <= LABELLED_TOKENS:
        ax.set_xticks(range(len(columns)))
        ax.set_xticklabels(columns, rotation=90, fontsize=max(3.0, min(7.0, 260 / len(columns))))
        size = max(2.5, min(6.0, 160 / len(columns)))
        for r, row in enumerate(tokens):
            for c, token in enumerate(row):
                ax.text(c, r, token if len(token) <= 8 else token[:7] + "…", ha="center", va="center", fontsize=size,
                        color="black" if probs[r][c] > 0.6 else "white")
    else:
        ax.set_xticks([])
    ax.tick_params(length=0)
    figure.colorbar(image, ax=ax, label="probability", shrink=0.9)


def generate_figure(result: Generation, run: RunInfo, tokenizer: Tokenizer) -> Figure:
    """Each new token's probability (bars, tokens along the bottom) and, with --lens, the layers x steps grid."""
    from tfcli.generate import token_text

    tokens = [token_text(tokenizer, step.token_id) for step in result.steps]
    lens = bool(result.steps) and result.steps[0].lens is not None
    layers = len(result.steps[0].lens) if lens else 0
    width = min(16.0, max(5.0, 0.35 * len(tokens) + 2))
    figure = _figure(width, 2.6 + (0.5 + 0.28 * layers if lens else 0))
    _caption(figure, f"tfcli generate: {result.prompt!r} -> {result.text!r}", run)
    grid = figure.add_gridspec(2 if lens else 1, 1, height_ratios=[2.0, 0.5 + 0.28 * layers] if lens else [1])
    ax = figure.add_subplot(grid[0])
    ax.bar(range(len(tokens)), [step.prob for step in result.steps], color="#2171b5")
    ax.set_ylim(0, 1)
    ax.set_ylabel("probability")
    ax.set_title("each new token's probability (the model's, before temperature and filtering)")
    ax.set_xticks(range(len(tokens)))
    ax.set_xticklabels([repr(t) for t in tokens], rotation=90)
    if lens:
        _lens_grid(figure.add_subplot(grid[1]), [repr(t) for t in tokens],
                   ["emb" if layer == 0 else f"layer {layer}" for layer in range(layers)],
                   [[token_text(tokenizer, step.lens[layer][0]) for step in result.steps] for layer in range(layers)],
                   [[step.lens[layer][1] for step in result.steps] for layer in range(layers)], figure, "step")
    return figure


def classify_figure(result: Classification, run: RunInfo) -> Figure:
    """Label probabilities, most probable on top, and with --explain the first token's attention strip."""
    ranked = result.ranked()
    explain = result.explanation
    figure = _figure(max(5.0, min(16.0, 0.32 * len(explain.tokens) + 1.5)) if explain else 5.0,
                     1.2 + 0.25 * len(ranked) + (1.6 if explain else 0))
    _caption(figure, f"tfcli classify: {result.text!r} -> {result.prediction}", run)
    grid = figure.add_gridspec(2 if explain else 1, 1, height_ratios=[0.3 + 0.25 * len(ranked), 1.2] if explain else [1])
    ax = figure.add_subplot(grid[0])
    ax.barh(range(len(ranked)), [p for _, p in ranked], color="#2171b5")
    ax.set_yticks(range(len(ranked)))
    ax.set_yticklabels([label for label, _ in ranked])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability")
    if explain:
        strip = figure.add_subplot(grid[1])
        image = strip.imshow([explain.weights], cmap=ATTENTION_COLOURS, vmin=0, aspect="auto", interpolation="nearest")
        where = f"layer {explain.layers[0]}" if len(explain.layers) == 1 else \
            f"layers {explain.layers[0]}-{explain.layers[-1]}"
        strip.set_title(f"what the first token attends to in {where}, mean over heads")
        _label_axes(strip, [], explain.tokens)
        figure.colorbar(image, ax=strip, label="weight")
    return figure
