"""`tfcli patch` output: what is measured (the metric on the clean and the corrupt text), what needs saying beside
the scores (`notes`: a small gap, the positions that score 0 without a run, the positions swept, an interruption),
one grid per site kind and the top sites of each kind, with --method both the attribution estimate beside each and
their correlation (drawn by render_grids.py, which says how a grid reads); the JSON record; the page's
section data and the figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.ablation import ablated_label
from tfcli.analysis.indices import spans
from tfcli.analysis.names import Kind, kind_of
from tfcli.analysis.pairs import SMALL_GAP
from tfcli.commands.patch.results import Patching
from tfcli.render.layout import GLUE, SPACE_NOTE, has_space, plain, quoted, words
from tfcli.commands.patch.render_grids import (Ranked, correlation, flat, grids_lines, positions_of, ranges_of, ranked,
                                               reached, spread, spread_columns, texts_of)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.analysis.dataset import Envelope
    from tfcli.tokenizer import Tokenizer

DEFAULT_TOP = 5  # sites listed per site kind


def quantity(result: Patching) -> str:
    what = "label" if result.label_metric else "logit"
    if result.target is None:  # a dataset whose lines have different ones
        return f"{what} difference of each line's target - foil" if result.foil_each else \
            f"{what} of each line's target"
    if result.foil is None:
        return f"{what} of {quoted(result.target.text)}"
    return f"{what} difference {quoted(result.target.text)} - {quoted(result.foil.text)}"


def space_note(result: Patching) -> str:
    """`; ␣ = a space` where a grid's column (a position's token) shows one, else nothing."""
    labels = [label for site in result.grids if "position" in kind_of(site)[1].axes
              for label in positions_of(result, site)]
    return f"; {SPACE_NOTE}" if has_space(labels) else ""


def notes(result: Patching) -> list[tuple[str, str]]:
    """What a pair's scores need said beside them, as (sentence, style): a small gap, the sites scored 0 without a
    run, the positions swept, an interruption. The view and the page both say them."""
    out = ablation_notes(result, "")
    if result.small_gap:
        size = max(abs(result.clean_value), abs(result.corrupt_value), 1.0)
        out.append((f"warning: the corrupt text barely moves the metric: clean - corrupt = "
                    f"{result.clean_value - result.corrupt_value:+.4f}, under {SMALL_GAP:g} x {size:.4f} (its size); "
                    "every score is divided by that gap, so changes of the metric too small to mean anything read as "
                    "large scores", "yellow"))
    swept = result.positions if result.positions is not None else list(range(len(result.tokens_clean)))
    if result.unchanged:
        first = result.first_difference
        before = [p for p in swept if result.before_first and first is not None and p < first]
        after = [p for p in swept if result.position is not None and result.decoder_tokens is None
                 and p > result.position]
        where = [f"{spans(before)} (before the first difference)"] if before else []
        where += [f"{spans(after)} (after the metric's)"] if after else []
        plural = "s" if len(before) + len(after) > 1 else ""
        count = counted(result.unchanged, "site")
        out.append((f"position{plural} {' and '.join(where)} score{'' if plural else 's'} exactly 0 without a run: "
                    f"on a causal model a patch there changes nothing ({count})" if where else
                    f"{count} score exactly 0 without a run: a patch there changes nothing", "dim"))
    if result.positions is not None:
        out.append((f"positions swept (--positions): {spans(result.positions)} of 0-{len(result.tokens_clean) - 1}; "
                    "the others are not patched (blank)", "dim"))
    if result.interrupted:
        if result.done == 0:
            out.append(("interrupted before any patched run finished: no activation score to show", "yellow"))
        else:
            missed = [site for site in result.grids if result.runs.get(site) and not result.finished.get(site)]
            out.append((f"interrupted: {result.done} of {result.total} patched runs finished; only those are shown"
                        + (f" (not reached: {', '.join(missed)})" if missed else ""), "yellow"))
    return out


def ablation_notes(result: Patching, means: str) -> list[tuple[str, str]]:
    """With --ablate: what every run ran without, and the clean and corrupt values with and without it (`means`:
    what they are over a dataset)."""
    if result.ablated is None:
        return []
    clean, corrupt = result.unablated
    return [(f"ablated {ablated_label(result.ablated)} in every run (clean, corrupt and patched): clean "
             f"{result.clean_value:+.4f}, corrupt {result.corrupt_value:+.4f}; with nothing ablated clean "
             f"{clean:+.4f}, corrupt {corrupt:+.4f}{means}", "")]


def dataset_notes(run: Envelope) -> list[tuple[str, str]]:
    """What a dataset's scores need said beside them: --ablate, a small gap of the means, pairs whose own gap is
    small, the columns swept, an interruption."""
    result = run.value
    out = ablation_notes(result, " (means over the pairs)")
    if result.small_gap:
        out.append((f"warning: over the dataset the corrupt texts barely move the metric: mean clean - mean corrupt "
                    f"= {result.clean_value - result.corrupt_value:+.4f}; every score is divided by that gap",
                    "yellow"))
    if result.small_gaps:
        out.append((f"{counted(result.small_gaps, 'pair')} of {run.n} barely move{'s' if result.small_gaps == 1 else ''} "
                    f"the metric (|clean - corrupt| under {SMALL_GAP:g} of its size): their own shares read noise",
                    "dim"))
    if result.positions is not None:
        out.append((f"positions swept (--positions): {ranges_of(result, result.positions)}; the others are not "
                    "patched (blank)", "dim"))
    if run.interrupted:
        out.append((f"interrupted: {run.n} of {run.total} pairs finished; the aggregate is theirs", "yellow"))
    return out


def patch_lines(result: Patching, width: int, color: bool, top: int = DEFAULT_TOP, full: bool = False) -> list[Text]:
    """A pair's terminal view: the texts, the metric, what needs saying (notes), a grid per site kind (and its
    attribution twin with --method both), the top sites of each kind. Unless `full`, a grid leaves out its rows and
    columns with no |score| of SHOWN or more, naming them. Lines of at most `width` cells."""
    return header(result, width) + grids_lines(result, notes(result), width, color, top, full)


def dataset_lines(run: Envelope, width: int, color: bool, top: int = DEFAULT_TOP,
                  full: bool = False) -> list[Text]:
    """A dataset's terminal view, as a pair's, of its run's aggregate: the top sites with their spread."""
    result = run.value
    return dataset_header(run, width) + grids_lines(result, dataset_notes(run), width, color, top, full,
                                                    lambda best: spread_columns(result, best))


METHODS = {"activation": "activation patching", "attribution": "attribution patching (the first-order estimate from "
           "one backward pass)", "both": "activation patching, each grid followed by its attribution estimate"}


def header(result: Patching, width: int) -> list[Text]:
    """A pair's texts, the metric on both, where they differ, how a score reads."""
    lines = words(f"clean:   {result.clean!r}", width, "bold") + words(f"corrupt: {result.corrupt!r}", width, "bold")
    clean, corrupt, decoder = texts_of(result)
    where = ""
    if result.position is not None:
        at = (decoder or clean)[result.position]  # its id: the clean text's (the decoder's ids are not kept)
        where = f" at position {result.position} {quoted(at)}" + \
            (f"{GLUE}(#{result.ids_clean[result.position]})" if decoder is None else "")
    ids = f"#{result.target.id}" + (f", #{result.foil.id}" if result.foil is not None else "")
    lines += words(f"the {quantity(result)} ({ids}){where}: clean {result.clean_value:+.4f}, corrupt "
                   f"{result.corrupt_value:+.4f}", width)
    if result.differing:
        pairs = ", ".join(f"{i} {quoted(clean[i])}/{quoted(corrupt[i])}" for i in result.differing)
        lines += words(f"the texts differ at {pairs} (* in the grids)", width)
    lines += words(f"{METHODS[result.method]}; score = (patched - corrupt) / (clean - corrupt): 1 restores the clean "
                   f"value, 0 has no effect, negative works against it{space_note(result)}", width, "dim")
    return lines


def dataset_header(run: Envelope, width: int) -> list[Text]:
    """A dataset's pairs, the metric's means, how a score, its interval and its share read, and what the columns
    are."""
    result = run.value
    counts = [f"{counted(run.skipped, 'bad line')} skipped"] if run.skipped else []
    counts += [f"{counted(result.equal, 'pair')} whose clean and corrupt values are equal, left out of the "
               "shares"] if result.equal else []
    lines = words(f"dataset {run.source}: {counted(run.n, 'pair')}" + (f" ({'; '.join(counts)})" if counts
                                                                     else ""), width, "bold")
    where = "" if result.position is None else " at the last position" if result.align == "end" else \
        f" at position {result.position}"
    ids = "" if result.target is None else \
        f" (#{result.target.id}" + (f", #{result.foil.id}" if result.foil is not None else "") + ")"
    lines += words(f"the {quantity(result)}{where}{ids}, mean over the pairs: clean {result.clean_value:+.4f}, "
                   f"corrupt {result.corrupt_value:+.4f}", width)
    spread = f"; [low, high]: its 95% bootstrap interval over pairs ({run.resamples} resamples)" \
        if run.resamples else ""
    lines += words(f"{METHODS[result.method]}; score = (mean patched - mean corrupt) / (mean clean - mean corrupt) "
                   f"over the pairs: 1 restores the clean value, 0 has no effect{spread}; restored: the share of "
                   "pairs in which the site restores at least half of that pair's own difference", width, "dim")
    if result.align is not None:
        start = "positions" if result.align == "start" else \
            "positions counted back from the metric's (-1: the metric's position)"
        marks = "; * where the pairs' tokens differ" if result.varying else ""
        corrupted = f"; clean and corrupt differ at {ranges_of(result, result.corrupted)}" if result.corrupted else ""
        lines += words(f"columns: {start}, labelled with the first pair's tokens{marks}{corrupted}"
                       f"{space_note(result)}", width, "dim")
    return lines


def counted(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def record(result: Patching) -> dict[str, Any]:
    """The patch JSON record: clean, corrupt, tokens_clean, tokens_corrupt, ids_clean, ids_corrupt, position, target,
    foil, clean_value, corrupt_value, small_gap, method, positions, grids (and attribution_grids with --method both;
    decoder_tokens for an encoder-decoder). A dataset's: dataset_record."""
    out = {"clean": result.clean, "corrupt": result.corrupt, "tokens_clean": result.tokens_clean,
           "tokens_corrupt": result.tokens_corrupt, "ids_clean": result.ids_clean, "ids_corrupt": result.ids_corrupt,
           "position": result.position, "target": token_record(result.target), "foil": token_record(result.foil),
           "clean_value": result.clean_value, "corrupt_value": result.corrupt_value, "small_gap": result.small_gap,
           "method": result.method,
           "positions": result.positions if result.positions is not None else list(range(len(result.ids_clean))),
           "grids": result.grids}
    if result.attribution_grids is not None:
        out["attribution_grids"] = result.attribution_grids
    if result.decoder_tokens is not None:
        out["decoder_tokens"] = result.decoder_tokens
    return out | ablation_record(result)


def ablation_record(result: Patching) -> dict[str, Any]:
    """With --ablate: `ablated` (the specs as given) and `clean_value_unablated`, `corrupt_value_unablated` (the
    values with nothing ablated; `clean_value` and `corrupt_value` are the ablated model's); nothing without it."""
    if result.ablated is None:
        return {}
    return {"ablated": result.ablated, "clean_value_unablated": result.unablated[0],
            "corrupt_value_unablated": result.unablated[1]}


def token_record(token: Any) -> dict[str, Any] | None:
    return None if token is None else {"token": token.token, "id": token.id}


def dataset_record(run: Envelope) -> dict[str, Any]:
    """The aggregate's JSON record: a single run's keys where they apply (position, target, foil: null where the
    lines differ; clean_value and corrupt_value: the means; grids: the aggregate scores) and dataset, n, pairs,
    skipped, equal, small_gaps, interrupted, align, columns (each column's label; null without a kind by
    position), tokens_clean (the first pair's tokens there), varying, corrupted, bootstrap, intervals
    (shaped as grids, [low, high] per cell; null with --bootstrap 0), restored_share (shaped as grids);
    with --method both attribution_grids and attribution_intervals."""
    result = run.value
    columns = len(result.tokens_clean)
    out = {"dataset": run.source, "n": run.n, "pairs": run.total, "skipped": run.skipped,
           "equal": result.equal, "small_gaps": result.small_gaps, "interrupted": run.interrupted,
           "align": result.align, "columns": [result.column_label(c) for c in range(columns)] if result.align else None,
           "tokens_clean": result.tokens_clean if result.align else None, "varying": result.varying,
           "corrupted": result.corrupted, "position": result.position, "target": token_record(result.target),
           "foil": token_record(result.foil), "clean_value": result.clean_value,
           "corrupt_value": result.corrupt_value, "small_gap": result.small_gap, "method": result.method,
           "positions": result.positions if result.positions is not None else
           (list(range(columns)) if result.align else None),
           "grids": result.grids, "bootstrap": run.resamples, "intervals": result.intervals,
           "restored_share": result.restored_share}
    if result.attribution_grids is not None:
        out["attribution_grids"] = result.attribution_grids
        out["attribution_intervals"] = result.attribution_intervals
    if result.decoder_tokens is not None:
        out["decoder_tokens"] = result.decoder_tokens
    return out | ablation_record(result)


def page_section(result: Patching, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The page's data for one pair: the JSON record, what is measured, the positions that differ, the correlations
    (--method both), the top sites of each kind, what needs saying (`notes`, as the view says it), whether the sweep
    was interrupted and which grids it reached; `tokens_clean_shown`, `tokens_corrupt_shown`, `decoder_tokens_shown`:
    the text each token stands for, as the view shows them (the record's tokens_* are vocabulary entries)."""
    correlations = {}
    if result.attribution_grids is not None:
        for site in result.grids:
            r, n = correlation(flat(result.grids[site]), flat(result.attribution_grids[site]))
            correlations[site] = {"r": r, "n": n}
    top, _ = page_top(result)
    return record(result) | {"quantity": plain(quantity(result)), "differing": result.differing,
                             "kinds": page_kinds(result), "correlations": correlations, "top": top,
                             "top_each": result.top,
                             "notes": [{"text": text, "style": style} for text, style in notes(result)],
                             "reached": {site: reached(result, site) and not (result.interrupted and result.done == 0
                                                                              and result.method != "attribution")
                                         for site in result.grids},
                             "interrupted": result.interrupted, "done": result.done, "total": result.total} | \
        shown_tokens(result)


def dataset_page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A dataset's page data: as a pair's, with each top site's interval and share, and the view's header."""
    result = run.value
    top, best = page_top(result)
    for entry, item in zip(top, best):
        entry["interval"], entry["restored"] = spread(result, item)
    return dataset_record(run) | {"quantity": plain(quantity(result)), "kinds": page_kinds(result), "top": top,
                                  "top_each": result.top,
                                  "header": [line.plain for line in dataset_header(run, 10**6)],
                                  "notes": [{"text": text, "style": style} for text, style in dataset_notes(run)],
                                  "reached": dict.fromkeys(result.grids, True), "correlations": {}} | \
        shown_tokens(result)


def page_kinds(result: Patching) -> dict[str, dict[str, Any]]:
    """Each grid's axes and what it patches: the page reads a grid's layout from here, not from the kinds' names."""
    return {site: {"axes": list(kind_of(site)[1].axes), "what": kind_of(site)[1].what} for site in result.grids}


def page_top(result: Patching) -> tuple[list[dict[str, Any]], list[Ranked]]:
    """The top sites of each kind as the page lists them, and as ranked."""
    best = [item for items in ranked(result).values() for item in items[:result.top]]
    return [{"site": item.site, "where": item.where, "score": item.score, "attribution": item.estimate}
            for item in best], best


def shown_tokens(result: Patching) -> dict[str, Any]:
    """`tokens_clean_shown`, `tokens_corrupt_shown`, `decoder_tokens_shown`: the text each token stands for."""
    clean, corrupt, decoder = texts_of(result)
    return {"tokens_clean_shown": clean, "tokens_corrupt_shown": corrupt, "decoder_tokens_shown": decoder}


def figure(result: Patching, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A heatmap per site kind, rows layers (heads-by-position: layer and head), columns positions (clean tokens)
    or heads; with --method both its attribution estimate beside it. One diverging scale symmetric about 0 (at least
    -1 to 1) in a colour bar under them; each value written in its cell where the cell is large enough."""
    return grids_figure(result, run, f"{result.clean!r} vs {result.corrupt!r}")


def dataset_figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A dataset's figure: as a pair's, with the share of pairs each site restores beside its scores."""
    result = done.value
    shares = None if result.restored_share is None else [("share of pairs restored (≥ half)", result.restored_share)]
    return grids_figure(result, run, f"over the {done.n} pairs of {done.source} (means)", shares)


def grids_figure(result: Patching, run: RunInfo, subject: str, more: list[tuple[str, dict]] | None = None) -> Figure:
    """The heatmaps side by side (the scores, --method both's estimate, then `more`), captioned with `subject`."""
    import matplotlib
    import numpy as np

    from tfcli.render.figure import POINTS, blank_figure, caption, label_axis, text_colour

    twins = [("activation patching", result.grids)] if result.method != "attribution" else []
    if result.attribution_grids is not None or result.method == "attribution":
        twins.append(("attribution estimate", result.attribution_grids or result.grids))
    twins += more or []
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
    bar = 0.8  # the colour bar's own row under the grids, a little space, its ticks and label: clear of the caption
    fig = blank_figure(width, 1.2 + sum(heights) + bar)
    caption(fig, plain(f"tfcli patch: {quantity(result)}, clean {result.clean_value:+.3f}, corrupt "
                       f"{result.corrupt_value:+.3f}; {subject}{space_note(result)}"), run)
    layout = fig.add_gridspec(len(rows_of) + 1, len(twins), height_ratios=heights + [bar])
    image = None
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
    if image is not None:
        middle = layout[-1, :].subgridspec(2, 3, width_ratios=[1, 3, 1], height_ratios=[0.2, 0.6])[1, 1]
        fig.colorbar(image, cax=fig.add_subplot(middle), orientation="horizontal",
                     label="score: 1 restores the clean value, 0 no effect, negative works against it")
    return fig
