"""`tfcli patch`'s grids and tables on the terminal (render.py holds the rest of its output): one grid per
site kind (rows: layers; columns: positions, labelled with the clean tokens, `*` where the two texts differ, or
heads), with --method both its attribution twin and their correlation, and the top sites of each kind (`ranked`,
which the page lists too), over a dataset with each one's interval and restored share.

Scores are signed, 1 = the clean value restored, 0 = no effect: each cell is its number (`+0.85`, `-0.12`), so the
grid reads without colour; colour adds a diverging shade (blue restores, red works against it). A grid wider than
the terminal is shown transposed (positions as rows) when that fits, else in pages of columns; nothing is cut. The
first view leaves out of a grid the rows and columns with no |score| of SHOWN or more, naming them (`full`: none);
JSON, the page and the figure have every cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from rich.text import Text

from tfcli.analysis.indices import spans
from tfcli.analysis.names import Kind, kind_of
from tfcli.commands.patch.results import DatasetPatching, Patching
from tfcli.render.layout import GAP, Column, table, token_label, words

SHOWN = 0.05  # the first view leaves out a grid's rows and columns with no |score| this large (--full: all)
# |score| at least this -> background, for positive and negative scores (256-colour palette, text kept readable)
SHADES = ((0.75, "white on color(25)", "white on color(124)"), (0.4, "black on color(74)", "black on color(167)"),
          (0.15, "black on color(153)", "black on color(217)"))


def score(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def cell(value: float | None, color: bool) -> Text:
    """A score as its signed number, with a diverging background when `color`; blank when not computed."""
    text = Text(score(value))
    if color and value is not None and math.isfinite(value):
        for lowest, positive, negative in SHADES:
            if abs(value) >= lowest:
                text.stylize(positive if value > 0 else negative)
                break
    return text


def texts_of(result: Patching) -> tuple[list[str], list[str], list[str] | None]:
    """The text each token stands for (` Mary`), clean, corrupt and the decoder's input, as the views show them; the
    vocabulary entries where the result has no texts (one built by hand)."""
    decoder = result.decoder_token_texts if result.decoder_token_texts is not None else result.decoder_tokens
    return result.token_texts_clean or result.tokens_clean, result.token_texts_corrupt or result.tokens_corrupt, \
        decoder


def positions_of(result: Patching, site: str) -> list[str]:
    """The column labels of a site's positions: the clean tokens' texts, a space as ␣ (an encoder-decoder's decoder:
    its input)."""
    stack, _ = kind_of(site)
    clean, _, decoder = texts_of(result)
    tokens = decoder if stack == "decoder." and decoder is not None else clean
    marked = set(result.differing) if stack != "decoder." else set()
    return [f"{result.column_label(i)}{'*' if i in marked else ''}\n{token_label(t)}" for i, t in enumerate(tokens)]


def head_ranges(pairs: list[tuple[int, int]], heads: int) -> str:
    """(layer, head) pairs in order, as people read them: runs of whole layers as `L0-L5`, the heads of another
    layer as `L6H0-H2,H5`."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)
    parts: list[str] = []
    whole: list[int] = []  # a run of whole layers, not yet said

    def flush() -> None:
        if whole:
            parts.append(f"L{whole[0]}" if len(whole) == 1 else f"L{whole[0]}-L{whole[-1]}")
            whole.clear()

    for layer, hs in by_layer.items():
        if len(hs) == heads:
            if whole and layer != whole[-1] + 1:
                flush()
            whole.append(layer)
        else:
            flush()
            parts.append(f"L{layer}H" + ",H".join(spans(hs).replace("-", "-H").split(", ")))
    flush()
    return ", ".join(parts)


def reached(result: Patching, site: str) -> bool:
    """Whether a site kind's activation grid has anything to show: a run finished (or it needs none)."""
    return result.method == "attribution" or not result.runs.get(site) or bool(result.finished.get(site))


def grids_lines(result: Patching, said: list[tuple[str, str]], width: int, color: bool, top: int, full: bool,
                more: Callable[[list[Ranked]], list[Column]] = lambda best: []) -> list[Text]:
    """The view after its header: what needs saying, the grids, the top sites (and the columns `more(best)`)."""
    lines = []
    for sentence, style in said:
        lines += words(sentence, width, style)
    nothing = result.interrupted and result.done == 0
    left_out = False
    for site, grid in result.grids.items():
        twins = [("", grid)] if reached(result, site) and not nothing else []
        if result.attribution_grids is not None:
            twins.append(("attribution estimate: ", result.attribution_grids[site]))
        if not twins:
            continue
        rows, columns = _kept(result, site, [g for _, g in twins], full)
        what = "score or estimate" if len(twins) == 2 else "estimate" if twins[0][0] or \
            result.method == "attribution" else "score"
        if not rows:  # nothing of SHOWN or more
            lines += [Text()] + words(f"{site}: no |{what}| ≥ {SHOWN:g} (--full shows the grid)", width)
            left_out = True
            continue
        for label, values in twins:
            lines += [Text()] + grid_lines(result, site, values, width, color, label, rows, columns)
        if len(twins) == 2:
            r, n = correlation(flat(grid), flat(twins[1][1]))
            lines += words(f"{site}: activation and attribution correlate r = {r:+.3f} over {n} sites" if r is not None
                           else f"{site}: too few sites to correlate", width)
        note = _left_out_note(result, site, grid, rows, columns, what)
        if note:
            lines += words(note, width, "dim")
            left_out = True
    if not nothing or result.method == "attribution":
        best = top_lines(result, width, top, more)
        lines += [Text()] + best if best else []
    if left_out:
        lines += [Text()] + words("--full shows every grid whole", width, "dim")
    return lines


def ranges_of(result: Patching, columns: list[int]) -> str:
    """Columns by position as people read them, runs joined: `0, 2-4` (positions), `-15 to -6, -2` (a dataset's
    columns counted back from the metric's)."""
    if result.column_label(0) == "0":
        return spans(columns)
    runs = [[int(part) for part in run.split("-")] for run in spans(columns).split(", ")] if columns else []
    return ", ".join(result.column_label(run[0]) + (f" to {result.column_label(run[-1])}" if len(run) > 1 else "")
                     for run in runs)


def _matrix(grid: list, kind: Kind) -> list[list[float | None]]:
    """A grid as the view's rows (layers; heads-by-position: each layer's heads) of columns."""
    return [row for layer in grid for row in layer] if len(kind.axes) == 2 else grid


def _kept(result: Patching, site: str, grids: list[list], full: bool) -> tuple[list[int], list[int]]:
    """The rows and columns of a site kind's grids (and twin) shown: every one with `full`, else those with a
    |value| of SHOWN or more in one of them."""
    _, kind = kind_of(site)
    matrices = [_matrix(g, kind) for g in grids]
    height, breadth = len(matrices[0]), len(matrices[0][0]) if matrices[0] else 0
    if full:
        return list(range(height)), list(range(breadth))

    def big(v: float | None) -> bool:
        return v is not None and abs(v) >= SHOWN

    rows = [r for r in range(height) if any(big(v) for m in matrices for v in m[r])]
    columns = [c for c in range(breadth) if any(big(m[r][c]) for m in matrices for r in range(height))]
    return rows, columns


def _left_out_note(result: Patching, site: str, grid: list, rows: list[int], columns: list[int], what: str) -> str:
    """Which rows and columns the compact view left out of a site kind's grid (`what` its cells are), and how
    many."""
    _, kind = kind_of(site)
    matrix = _matrix(grid, kind)
    height, breadth = len(matrix), len(matrix[0]) if matrix else 0
    gone_rows = [r for r in range(height) if r not in set(rows)]
    gone_columns = [c for c in range(breadth) if c not in set(columns)]
    parts = []
    if gone_rows:
        if len(kind.axes) == 2:
            heads = len(grid[0])
            parts.append(f"heads {head_ranges([divmod(r, heads) for r in gone_rows], heads)} ({len(gone_rows)} of "
                         f"{height})")
        else:
            parts.append(f"layers {spans(gone_rows)} ({len(gone_rows)} of {height})")
    if gone_columns:
        across = kind.axes[-1]
        named = ranges_of(result, gone_columns) if across == "position" else ", ".join(f"H{c}" for c in gone_columns)
        parts.append(f"{across}s {named} ({len(gone_columns)} of {breadth})")
    if not parts:
        return ""
    return f"{site}: left out, no |{what}| ≥ {SHOWN:g}: {'; '.join(parts)}"


def grid_lines(result: Patching, site: str, grid: list, width: int, color: bool, label: str,
               rows_kept: list[int] | None = None, columns_kept: list[int] | None = None) -> list[Text]:
    """One site kind's grid: rows layers (heads-by-position: a row per layer and head), columns positions or heads;
    transposed when that fits and the other way does not, else paged. `rows_kept`, `columns_kept`: the rows and
    columns shown (default: all)."""
    _, kind = kind_of(site)
    title = f"{label}{site}: {kind.what}"
    if kind.axes == ("head", "position"):
        rows = [f"L{layer}H{head}" for layer in range(len(grid)) for head in range(len(grid[layer]))]
        key = "head"
    else:
        rows, key = [str(layer) for layer in range(len(grid))], "layer"
    values = _matrix(grid, kind)
    across_what = kind.axes[-1]  # what the columns are
    headers = positions_of(result, site) if across_what == "position" else \
        [f"H{h}" for h in range(len(values[0]) if values else 0)]
    rows_kept = list(range(len(rows))) if rows_kept is None else rows_kept
    columns_kept = list(range(len(headers))) if columns_kept is None else columns_kept
    rows, values = [rows[r] for r in rows_kept], [[values[r][c] for c in columns_kept] for r in rows_kept]
    headers = [headers[c] for c in columns_kept]
    columns = [Column.of(key, rows)] + [Column.of(header, [cell(row[c], color) for row in values], right=True)
                                        for c, header in enumerate(headers)]
    if _width(columns) > width:
        # positions (or heads) as rows, layers as columns: better when it fits
        across = [Column.of(across_what, [h.replace("\n", " ") for h in headers])]
        across += [Column.of(name, [cell(row[c], color) for c in range(len(headers))], right=True)
                   for name, row in zip(rows, values)]
        if _width(across) <= width:
            return table(across, width, title=f"{title} (rows: {across_what}s; columns: {key}s)")

    def page_note(page: list[Column]) -> str:
        first, last = (c.header.split("\n")[0].rstrip("*").lstrip("H") for c in (page[0], page[-1]))
        return f"{across_what}s {first}-{last}"

    return table(columns, width, title=f"{title} (rows: {key}s)", page_note=page_note)


def _width(columns: list[Column]) -> int:
    return sum(c.natural_width() for c in columns) + GAP * (len(columns) - 1)


def flat(grid: list) -> list[float | None]:
    """A grid's values in order, nested lists flattened."""
    out: list[float | None] = []
    for item in grid:
        out += flat(item) if isinstance(item, list) else [item]
    return out


def correlation(a: list[float | None], b: list[float | None]) -> tuple[float | None, int]:
    """Pearson's r of the pairs where both are known, and how many; None where it is undefined."""
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    n = len(pairs)
    if n < 2:
        return None, n
    mx, my = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
    return (sxy / math.sqrt(sxx * syy), n) if sxx > 0 and syy > 0 else (None, n)


class Ranked(NamedTuple):
    """A computed site in a top list: its kind, where (`L3 at 9* ␣John`, `L6H9`), its score, its attribution
    estimate (--method both) and its cell in the grid (layer, then its index along the kind's axes)."""

    site: str
    where: str
    score: float
    estimate: float | None
    cell: tuple[int, ...]


def ranked(result: Patching) -> dict[str, list[Ranked]]:
    """Per site kind, every computed site, largest |score| first; `where` marks a position where the texts differ
    with `*`, as the grids do."""
    out: dict[str, list[Ranked]] = {}
    differing = set(result.differing)
    for site, grid in result.grids.items():
        stack, kind = kind_of(site)
        if not reached(result, site) or (result.interrupted and result.done == 0 and result.method != "attribution"):
            continue
        clean, _, decoder_texts = texts_of(result)
        decoder = stack == "decoder." and decoder_texts is not None
        tokens = decoder_texts if decoder else clean

        def at(p: int) -> str:
            label = result.column_label(p) if not decoder else str(p)
            return f"at {label}{'*' if p in differing and not decoder else ''} {token_label(tokens[p])}"

        other = result.attribution_grids[site] if result.attribution_grids is not None else None
        items = []
        for layer, row in enumerate(grid):
            for k, value in enumerate(row):
                estimate = other[layer][k] if other is not None else None
                if kind.axes == ("head", "position"):
                    items += [Ranked(site, f"L{layer}H{k} {at(p)}", v, estimate[p] if estimate is not None else None,
                                     (layer, k, p)) for p, v in enumerate(value) if v is not None]
                elif value is not None:
                    where = f"L{layer} {at(k)}" if kind.axes == ("position",) else f"L{layer}H{k}"
                    items.append(Ranked(site, where, value, estimate, (layer, k)))
        out[site] = sorted(items, key=lambda item: -abs(item.score))
    return out


def at_cell(grid: list, cell: tuple[int, ...]) -> Any:
    for index in cell:
        grid = grid[index]
    return grid


def spread(result: DatasetPatching, item: Ranked) -> tuple[str, str]:
    """A dataset's site: its interval ('[+0.12, +0.40]', '' without) and restored share ('63%')."""
    low_high = at_cell(result.intervals[item.site], item.cell) if result.intervals is not None else None
    share = at_cell(result.restored_share[item.site], item.cell) if result.restored_share is not None else None
    return ("" if low_high is None else f"[{low_high[0]:+.2f}, {low_high[1]:+.2f}]",
            "" if share is None else f"{share:.0%}")


def spread_columns(result: DatasetPatching, best: list[Ranked]) -> list[Column]:
    """Over a dataset, each top site's interval (with a bootstrap) and restored share."""
    spreads = [spread(result, item) for item in best]
    columns = [Column.of("95% interval", [low_high for low_high, _ in spreads], right=True)] \
        if result.intervals is not None else []
    return columns + [Column.of("restored", [share for _, share in spreads], right=True)]


def top_lines(result: Patching, width: int, top: int,
              more: Callable[[list[Ranked]], list[Column]] = lambda best: []) -> list[Text]:
    """The `top` sites of each site kind by |score|, then the columns `more(best)` (a dataset's spread), with the
    attribution estimate beside each under --method both; no lines when nothing was computed."""
    per_kind = ranked(result)
    best = [item for items in per_kind.values() for item in items[:top]]
    if not best:
        return []
    label = "attribution estimate" if result.method == "attribution" else "score"
    columns = [Column.of("site", [item.site for item in best]), Column.of("where", [item.where for item in best]),
               Column.of(label, [f"{item.score:+.4f}" for item in best], right=True)]
    columns += more(best)
    if result.attribution_grids is not None:
        columns.append(Column.of("attribution", [f"{item.estimate:+.4f}" if item.estimate is not None else ""
                                                 for item in best], right=True))
    each = " of each site kind" if len(per_kind) > 1 else ""
    return table(columns, width, keys=2, title=f"the {top} sites with the largest scores{each}")
