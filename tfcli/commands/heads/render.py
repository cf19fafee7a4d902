"""`tfcli heads` output: per detector, the top heads (`L{l}H{h}` and score) and a layer x head grid of glyphs on the
terminal views' heat scale (it reads without colour); each text's top heads with --per-text; the JSON Lines records;
the page's section data (`page_section`) and the static figure (`figure`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, heat, heat_legend, shown, table, words, wrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.commands.heads.core import Heads, TextHeads
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

TITLES = {
    "previous": "previous token: share of attention on the token before the query",
    "duplicate": "duplicate token: share on earlier copies of the query's token",
    "induction": "induction: share on the token after an earlier copy of the query's token",
    "first": "first token: mean attention to it",
    "special": "special tokens: mean attention to the text's own ([CLS], [SEP], BOS)",
    "self": "self: mean attention of a token to itself",
    "entropy": "entropy: mean over queries, in bits (lowest, the most focused, first)",
}
LEFT_OUT = {"previous": "fewer than two tokens", "duplicate": "no repeated token", "induction": "no repeated token",
            "special": "no special token"}
UNIT = {"entropy": " bits"}


def ranked(result: Heads, detector: str) -> list[tuple[str, float]]:
    """(head label, score) of every head, the most notable first (highest; lowest for entropy), NaN left out."""
    from tfcli.commands.heads.core import LOWEST_FIRST

    cells = [(result.label(r, h), value) for r, row in enumerate(result.scores[detector])
             for h, value in enumerate(row) if not math.isnan(value)]
    sign = 1 if detector in LOWEST_FIRST else -1
    return sorted(cells, key=lambda cell: sign * cell[1])


def _score(value: float, detector: str) -> str:
    return f"{value:.2f}{UNIT.get(detector, '')}" if detector in UNIT else f"{value:.3f}"


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def heads_lines(result: Heads, width: int, top: int) -> list[Text]:
    """The terminal view of a run: what was measured over how many texts, then per detector its count, the `top`
    heads and the layer x head grid; the scale last. Lines of at most `width` cells."""
    if result.probe is not None:
        head = f"heads on the {result.probe} probe ({len(result.ids or [])} tokens: random tokens, repeated)"
    else:
        head = f"heads over {_plural(result.texts, 'text')}"
    excluded = [what for flag, what in ((result.exclude_first, "the first key"), (result.exclude_self, "the query "
                "itself")) if flag]
    if excluded and any(d in result.detectors for d in ("previous", "duplicate", "induction")):
        head += f"; previous, duplicate and induction leave out attention to {' and '.join(excluded)}"
    lines = words(head, width, "bold")
    for note in result.notes:
        lines += words(note, width, "dim")
    for detector in result.detectors:
        lines += [Text()] + detector_lines(result, detector, width, top)
    lines += [Text()] + heat_legend(width)
    lines += words("each grid: a head's score as a share of that grid's largest, given above it", width, "dim")
    return lines


def detector_lines(result: Heads, detector: str, width: int, top: int) -> list[Text]:
    """One detector: its title, how many texts it counts (and why the others were left out), the top heads,
    the grid."""
    count = result.counts[detector]
    lines = words(Text(TITLES[detector], style="bold"), width)
    counted = f"{_plural(count, 'text')}"
    if count < result.texts:
        counted += f" ({result.texts - count:,} left out: {LEFT_OUT.get(detector, 'nothing to look for')})"
    lines += words(counted, width, "dim")
    if not count:
        return lines
    best = ranked(result, detector)[:top]
    items = [Text("top:", style="dim")] + [Text(label, style="bold") + Text(f" {_score(value, detector)}")
                                            for label, value in best]
    lines += wrap(items, width, indent=len("top:  "))  # a wrapped list stays under its first head
    lines += grid_lines(result, detector, width)
    return lines


def largest(result: Heads, detector: str) -> float:
    """The largest score of a detector's grid (0.0 when no head has one): the top of its scale in every view, the
    terminal's grid (a head's share of it), the page's and the figure's (their darkest colour)."""
    return max((v for row in result.scores[detector] for v in row if not math.isnan(v)), default=0.0)


def grid_lines(result: Heads, detector: str, width: int) -> list[Text]:
    """The layer x head grid: one heat glyph per head, its share of the grid's largest score (said in the title),
    paged by heads when it does not fit."""
    grid = result.scores[detector]
    top = largest(result, detector)
    scale = top or 1.0  # an all-zero grid stays blank
    columns = [Column.of("layer", list(result.layers))]
    for h in range(result.heads):
        cells = [heat(0.0 if math.isnan(row[h]) else row[h] / scale) for row in grid]
        column = Column.of(str(h), cells)
        column.gap = 1
        columns.append(column)
    title = Text(f"heads: share of the largest, {_score(top, detector)}", style="dim")
    return table(columns, width, title=title, page_note=lambda page: f"heads {page[0].header}-{page[-1].header}")


def text_lines(item: TextHeads, number: int, width: int, top: int) -> list[Text]:
    """One text of --per-text: its top heads per detector, or why it was left out; a blank line after."""
    from tfcli.commands.heads.core import LOWEST_FIRST

    lines = words(f"text {number}: {shown(item.text)!r}", width, "bold")
    for detector, grid in item.scores.items():
        if grid is None:
            lines += words(f"{detector}: left out ({LEFT_OUT.get(detector, 'nothing to look for')})", width, "dim")
            continue
        cells = [(f"{item.layers[r]}H{h}", v) for r, row in enumerate(grid) for h, v in enumerate(row)]
        cells.sort(key=lambda cell: cell[1] if detector in LOWEST_FIRST else -cell[1])
        items = [Text(f"{detector}:", style="dim")] + [Text(label, style="bold") + Text(f" {_score(v, detector)}")
                                                      for label, v in cells[:top]]
        lines += wrap(items, width)
    return lines + [Text()]  # a blank line before the next text (or the run's view)


def _finite(grid: list[list[float]]) -> list[list[float | None]]:
    return [[None if math.isnan(v) else v for v in row] for row in grid]


def record(result: Heads) -> dict[str, Any]:
    """The run's JSON record: texts, detectors, layers (each row's name), scores ({detector: [[score per head] per
    layer]}, null where no text counted), counts (texts per detector); the probe's also its ids."""
    out = {"texts": result.texts, "detectors": result.detectors, "layers": result.layers,
           "scores": {d: _finite(result.scores[d]) for d in result.detectors}, "counts": result.counts}
    if result.ids is not None:
        out["ids"] = result.ids
    return out


def text_record(item: TextHeads) -> dict[str, Any]:
    """One text's JSON record (--per-text): text, ids, scores ({detector: grid, or null when left out})."""
    return {"text": item.text, "ids": item.ids, "scores": item.scores}


# ---------------------------------------------------------------- the page and the figure


def page_section(result: Heads, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The page's data: the record, the titles, per detector the top of its grid's scale (`largest`) and its
    `--top` heads as the terminal lists them (`top`, `top_heads`), and per detector and head the text where it
    scores highest (an index into `examples`, each with its tokens per stack, `tokens_shown` the text each stands
    for, and the maps of the heads that point to it)."""
    from tfcli.render.page import WEIGHT_SCALE, pack_weights

    section = record(result) | {"heads": result.heads, "titles": {d: TITLES[d] for d in result.detectors},
                                "notes": result.notes, "probe": result.probe, "best": {}, "examples": {},
                                "largest": {d: largest(result, d) for d in result.detectors},
                                "top": {d: top_heads(result, d) for d in result.detectors}}
    if result.best:
        section["best"] = {d: [[None if b is None else b.text for b in row] for row in grid]
                           for d, grid in result.best.items() if d in result.detectors}
        # a row's stack, as the index of its tokens in `tokens` (the sequences are in the order of the stacks,
        # and so of the rows' prefixes: "", or "encoder." then "decoder.")
        prefixes = list(dict.fromkeys(name[:name.rindex("L")] for name in result.layers))
        for index, kept in result.kept.items():
            maps = kept.get("maps", {})
            stack_of_row = kept.get("stack_of_row", {})
            cells = sorted(maps)
            section["examples"][str(index)] = {
                "text": kept["text"], "tokens": [s.tokens for s in kept["sequences"]],
                "tokens_shown": [s.texts if s.texts is not None else s.tokens for s in kept["sequences"]],
                "maps": [{"row": r, "head": h, "stack": prefixes.index(stack_of_row.get(r, prefixes[0])),
                          "size": int(maps[(r, h)].shape[0])} for r, h in cells],
                "weights": pack_weights([maps[cell] for cell in cells]), "scale": WEIGHT_SCALE}
    return section


def top_heads(result: Heads, detector: str) -> list[dict[str, Any]]:
    """The run's `--top` heads of a detector, as the terminal's `top:` line lists them: {label, row, head, score,
    written (the score as the terminal writes it)}."""
    where = {result.label(r, h): (r, h) for r in range(len(result.layers)) for h in range(result.heads)}
    return [{"label": label, "row": where[label][0], "head": where[label][1], "score": value,
             "written": _score(value, detector)} for label, value in ranked(result, detector)[:result.top]]


def figure(result: Heads, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """One layer x head heatmap per detector, each from 0 to its own largest score (said on its colour bar), three
    to a row."""
    import matplotlib

    from tfcli.render.figure import ATTENTION_COLOURS, blank_figure, caption, text_colour

    detectors = result.detectors
    columns = min(3, len(detectors))
    rows = math.ceil(len(detectors) / columns)
    cell = 0.28 if result.heads <= 16 else 0.16
    panel_w = max(1.8, result.heads * cell) + 0.9
    panel_h = max(1.4, len(result.layers) * cell) + 0.9
    fig = blank_figure(max(6.0, columns * panel_w + 0.6), rows * panel_h + 1.0)
    what = f"the {result.probe} probe" if result.probe else _plural(result.texts, "text")
    caption(fig, f"tfcli heads over {what}", run)
    cmap = matplotlib.colormaps[ATTENTION_COLOURS]
    for k, detector in enumerate(detectors):
        ax = fig.add_subplot(rows, columns, k + 1)
        grid = [[float("nan") if v is None else v for v in row] for row in _finite(result.scores[detector])]
        top = largest(result, detector) or 1.0  # an all-zero grid stays white
        image = ax.imshow(grid, cmap=cmap, vmin=0, vmax=top, aspect="auto", interpolation="nearest")
        ax.set_title(f"{detector} ({_plural(result.counts[detector], 'text')})")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        step = max(1, math.ceil(len(result.layers) / 16))
        rows_shown = range(0, len(result.layers), step)
        ax.set_yticks(rows_shown, [result.layers[i] for i in rows_shown], fontsize=6)
        hstep = max(1, math.ceil(result.heads / 16))
        ax.set_xticks(range(0, result.heads, hstep), [str(h) for h in range(0, result.heads, hstep)], fontsize=6)
        if result.heads <= 16 and len(result.layers) <= 16:  # room for each score in its cell
            for r, row in enumerate(grid):
                for h, value in enumerate(row):
                    if not math.isnan(value):
                        ax.text(h, r, f"{value:.1f}" if detector in UNIT else f"{value:.2f}".lstrip("0"),
                                ha="center", va="center", fontsize=4.5, color=text_colour(cmap, value / top))
        what = "mean entropy" if detector in UNIT else "score"
        scale = f"0 to the largest, {_score(largest(result, detector), detector)}" if result.counts[detector] \
            else "no text counted"
        fig.colorbar(image, ax=ax, shrink=0.8, label=f"{what}: {scale}")
    return fig
