"""`tfcli patch` output: what is measured (the metric on the clean and the corrupt text), one grid per site kind
(rows: layers; columns: positions, labelled with the clean tokens, `*` where the two texts differ, or heads), the
top sites as a list, with --method both the attribution estimate beside each and their correlation; the JSON
record; the page's section data and the figure.

Scores are signed, 1 = the clean value restored, 0 = no effect: each cell is its number (`+0.85`, `-0.12`), so the
grid reads without colour; colour adds a diverging shade (blue restores, red works against it). A grid wider than
the terminal is shown transposed (positions as rows) when that fits, else in pages of columns; nothing is cut.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.names import Kind, kind_of
from tfcli.render.layout import GAP, Column, shown, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.patch import Patching
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

DEFAULT_TOP = 10
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


def quantity(result: Patching) -> str:
    what = "label" if result.label_metric else "logit"
    if result.foil is None:
        return f"{what} of {result.target.token!r}"
    return f"{what} difference {result.target.token!r} - {result.foil.token!r}"


def positions_of(result: Patching, site: str) -> list[str]:
    """The column labels of a site's positions: the clean tokens (an encoder-decoder's decoder: its input)."""
    stack, _ = kind_of(site)
    tokens = result.decoder_tokens if stack == "decoder." and result.decoder_tokens is not None else result.tokens_clean
    marked = set(result.differing) if stack != "decoder." else set()
    return [f"{i}{'*' if i in marked else ''}\n{shown(t)}" for i, t in enumerate(tokens)]


def patch_lines(result: Patching, width: int, color: bool, top: int = DEFAULT_TOP) -> list[Text]:
    """The terminal view: the texts, the metric, a grid per site kind (and its attribution twin with --method
    both), the top sites. Lines of at most `width` cells."""
    lines = words(f"clean:   {result.clean!r}", width, "bold") + words(f"corrupt: {result.corrupt!r}", width, "bold")
    where = "" if result.position is None else \
        f" at position {result.position} {shown((result.decoder_tokens or result.tokens_clean)[result.position])}"
    ids = f"#{result.target.id}" + (f", #{result.foil.id}" if result.foil is not None else "")
    lines += words(f"the {quantity(result)}{where} ({ids}): clean {result.clean_value:+.4f}, corrupt "
                   f"{result.corrupt_value:+.4f}", width)
    if result.differing:
        pairs = ", ".join(f"{i} {shown(result.tokens_clean[i])!r}/{shown(result.tokens_corrupt[i])!r}"
                          for i in result.differing)
        lines += words(f"the texts differ at {pairs} (* in the grids)", width)
    method = {"activation": "activation patching", "attribution": "attribution patching (the first-order estimate "
              "from one backward pass)", "both": "activation patching, each grid followed by its attribution "
              "estimate"}[result.method]
    lines += words(f"{method}; score = (patched - corrupt) / (clean - corrupt): 1 restores the clean value, 0 has "
                   "no effect, negative works against it", width, "dim")
    if result.interrupted:
        lines += words(f"interrupted: {result.done} of {result.total} sites patched; the others are blank", width,
                       "yellow")
    for site, grid in result.grids.items():
        lines += [Text()] + grid_lines(result, site, grid, width, color, "")
        if result.attribution_grids is not None:
            estimate = result.attribution_grids[site]
            lines += [Text()] + grid_lines(result, site, estimate, width, color, "attribution estimate: ")
            r, n = correlation(flat(grid), flat(estimate))
            lines += words(f"{site}: activation and attribution correlate r = {r:+.3f} over {n} sites" if r is not None
                           else f"{site}: too few sites to correlate", width)
    lines += [Text()] + top_lines(result, width, top)
    return lines


def grid_lines(result: Patching, site: str, grid: list, width: int, color: bool, label: str) -> list[Text]:
    """One site kind's grid: rows layers (heads-by-position: a row per layer and head), columns positions or heads;
    transposed when that fits and the other way does not, else paged."""
    _, kind = kind_of(site)
    title = f"{label}{site}: {kind.what}"
    if kind.axes == ("head", "position"):
        rows = [f"L{layer}H{head}" for layer in range(len(grid)) for head in range(len(grid[layer]))]
        values = [grid[layer][head] for layer in range(len(grid)) for head in range(len(grid[layer]))]
        key = "head"
    else:
        rows, values, key = [str(layer) for layer in range(len(grid))], grid, "layer"
    across_what = kind.axes[-1]  # what the columns are
    headers = positions_of(result, site) if across_what == "position" else \
        [f"H{h}" for h in range(len(grid[0]) if grid else 0)]
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


def alignment_lines(rows: list[tuple[int | None, str | None, int | None, str | None, str]], width: int) -> list[Text]:
    """The clean and corrupt tokenizations side by side (LengthMismatch.rows), for the refusal of two lengths."""
    columns = [Column.of("#", ["" if i is None else str(i) for i, _, _, _, _ in rows], right=True),
               Column.of("clean", ["" if t is None else repr(t) for _, t, _, _, _ in rows]),
               Column.of("", [mark for _, _, _, _, mark in rows]),
               Column.of("#", ["" if j is None else str(j) for _, _, j, _, _ in rows], right=True),
               Column.of("corrupt", ["" if t is None else repr(t) for _, _, _, t, _ in rows])]
    return table(columns, width, keys=0, title="the two tokenizations, aligned (≠ differs, - only in clean, + only "
                 "in corrupt)")


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


def ranked(result: Patching) -> list[tuple[str, str, float, float | None]]:
    """Every computed site as (site kind, where, score, attribution estimate or None), largest |score| first."""
    out = []
    for site, grid in result.grids.items():
        stack, kind = kind_of(site)
        other = result.attribution_grids[site] if result.attribution_grids is not None else None
        tokens = result.decoder_tokens if stack == "decoder." and result.decoder_tokens else result.tokens_clean
        for layer, row in enumerate(grid):
            for k, value in enumerate(row):
                estimate = other[layer][k] if other is not None else None
                if kind.axes == ("head", "position"):
                    for p, v in enumerate(value):
                        if v is not None:
                            out.append((site, f"L{layer}H{k} at {p} {shown(tokens[p])}", v,
                                        estimate[p] if estimate is not None else None))
                elif value is not None:
                    where = f"L{layer} at {k} {shown(tokens[k])}" if kind.axes == ("position",) else \
                        f"L{layer}H{k}"
                    out.append((site, where, value, estimate))
    return sorted(out, key=lambda item: -abs(item[2]))


def top_lines(result: Patching, width: int, top: int) -> list[Text]:
    """The `top` sites by |score|, with the attribution estimate beside each under --method both."""
    best = ranked(result)[:top]
    label = "attribution estimate" if result.method == "attribution" else "score"
    columns = [Column.of("site", [site for site, _, _, _ in best]), Column.of("where", [w for _, w, _, _ in best]),
               Column.of(label, [f"{v:+.4f}" for _, _, v, _ in best], right=True)]
    if result.attribution_grids is not None:
        columns.append(Column.of("attribution", [f"{e:+.4f}" if e is not None else "" for _, _, _, e in best],
                                 right=True))
    return table(columns, width, keys=2, title=f"the {len(best)} sites with the largest scores")


def record(result: Patching) -> dict[str, Any]:
    """The patch JSON record: clean, corrupt, tokens_clean, tokens_corrupt, ids_clean, ids_corrupt, position, target,
    foil, clean_value, corrupt_value, method, grids (and attribution_grids with --method both; decoder_tokens for an
    encoder-decoder)."""
    out = {"clean": result.clean, "corrupt": result.corrupt, "tokens_clean": result.tokens_clean,
           "tokens_corrupt": result.tokens_corrupt, "ids_clean": result.ids_clean, "ids_corrupt": result.ids_corrupt,
           "position": result.position, "target": {"token": result.target.token, "id": result.target.id},
           "foil": {"token": result.foil.token, "id": result.foil.id} if result.foil is not None else None,
           "clean_value": result.clean_value, "corrupt_value": result.corrupt_value, "method": result.method,
           "grids": result.grids}
    if result.attribution_grids is not None:
        out["attribution_grids"] = result.attribution_grids
    if result.decoder_tokens is not None:
        out["decoder_tokens"] = result.decoder_tokens
    return out


def page_section(result: Patching, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The page's data for one pair: the JSON record, what is measured, the positions that differ, the correlations
    (--method both), the top sites and whether the sweep was interrupted."""
    correlations = {}
    if result.attribution_grids is not None:
        for site in result.grids:
            r, n = correlation(flat(result.grids[site]), flat(result.attribution_grids[site]))
            correlations[site] = {"r": r, "n": n}
    top = [{"site": s, "where": w, "score": v, "attribution": e} for s, w, v, e in ranked(result)[:DEFAULT_TOP]]
    kinds = {site: {"axes": list(kind.axes), "what": kind.what} for site in result.grids
             for _, kind in [kind_of(site)]}  # the page reads a grid's layout from here, not from the kinds' names
    return record(result) | {"quantity": quantity(result), "differing": result.differing, "kinds": kinds,
                             "correlations": correlations, "top": top, "interrupted": result.interrupted,
                             "done": result.done, "total": result.total}


def figure(result: Patching, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A heatmap per site kind, rows layers (heads-by-position: layer and head), columns positions (clean tokens)
    or heads; with --method both its attribution estimate beside it. One diverging scale symmetric about 0 (at least
    -1 to 1) in a colour bar under them; each value written in its cell where the cell is large enough."""
    import matplotlib
    import numpy as np

    from tfcli.render.figure import POINTS, blank_figure, caption, label_axis, text_colour

    twins = [("activation patching", result.grids)] if result.method != "attribution" else []
    if result.attribution_grids is not None or result.method == "attribution":
        twins.append(("attribution estimate", result.attribution_grids or result.grids))
    rows_of: list[tuple[str, list[str], list[str]]] = []  # per site kind: (site, row labels, column labels)
    for site, grid in result.grids.items():
        _, kind = kind_of(site)
        tokens = [h.split("\n", 1)[1] + ("*" if "*" in h.split("\n", 1)[0] else "") for h in positions_of(result, site)]
        if kind.axes == ("head", "position"):
            rows_of.append((site, [f"L{layer}H{h}" for layer in range(len(grid)) for h in range(len(grid[layer]))],
                            tokens))
        elif kind.axes == ("position",):
            rows_of.append((site, [str(layer) for layer in range(len(grid))], tokens))
        else:
            rows_of.append((site, [str(layer) for layer in range(len(grid))], [f"H{h}" for h in range(len(grid[0]))]))

    def data(grid: list, kind: Kind) -> Any:
        flat_rows = [r for layer in grid for r in layer] if len(kind.axes) == 2 else grid
        return np.array([[np.nan if v is None else v for v in row] for row in flat_rows], dtype=float)

    values = [v for _, grids in twins for grid in grids.values() for v in flat(grid) if v is not None]
    top = max([1.0] + [abs(v) for v in values])
    cmap = matplotlib.colormaps["RdBu"]
    widest = max(len(columns) for _, _, columns in rows_of)
    cell_width = 0.32
    panel_width = max(3.0, min(8.5, 0.6 + cell_width * widest))
    width = 0.4 + panel_width * len(twins)
    longest = max(len(label) for _, _, columns in rows_of for label in columns)
    cell_heights = [max(0.12, min(0.3, 9.0 / len(rows))) for _, rows, _ in rows_of]  # a tall grid: thinner rows
    heights = [0.6 + h * len(rows) + 0.09 * longest for h, (_, rows, _) in zip(cell_heights, rows_of)]
    fig = blank_figure(width, 1.2 + sum(heights))
    caption(fig, f"tfcli patch: {quantity(result)}, clean {result.clean_value:+.3f}, corrupt "
                 f"{result.corrupt_value:+.3f}; {result.clean!r} vs {result.corrupt!r}", run)
    layout = fig.add_gridspec(len(rows_of), len(twins), height_ratios=heights)
    image = None
    axes = []
    for index, ((site, rows, columns), cell_height) in enumerate(zip(rows_of, cell_heights)):
        _, kind = kind_of(site)
        for column, (what, grids) in enumerate(twins):
            ax = fig.add_subplot(layout[index, column])
            cells = data(grids[site], kind)
            image = ax.imshow(cells, cmap=cmap, vmin=-top, vmax=top, aspect="auto", interpolation="nearest")
            ax.set_title(f"{site}: {what}")
            label_axis(ax, "x", columns, panel_width - 0.6)
            label_axis(ax, "y", rows, cell_height * len(rows))
            if column == 0:
                ax.set_ylabel("layer, head" if len(kind.axes) == 2 else "layer")
            across = (panel_width - 0.6) * POINTS / max(len(columns), 1)  # a cell's width and height in points
            font = min(6.0, across / 4.5, cell_height * POINTS * 0.6)
            if font >= 4.0:
                for (r, c), v in np.ndenumerate(cells):
                    if not np.isnan(v):
                        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=font,
                                color=text_colour(cmap, (v + top) / (2 * top)))
            axes.append(ax)
    if image is not None:
        fig.colorbar(image, ax=axes, location="bottom", shrink=0.6, aspect=40,
                     label="score: 1 restores the clean value, 0 no effect, negative works against it")
    return fig
