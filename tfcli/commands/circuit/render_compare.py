"""`tfcli circuit --method A,B,...` output: the methods compared on the same pairs (compare.Comparison): each one's
circuit, their faithfulness curves side by side, and the paired differences at each size with their intervals;
the JSON record (each method's record as a single run writes it, and the differences); for --report the page's
section (drawn by report.js's comparison) and the figure."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.commands.circuit import render
from tfcli.commands.circuit.compare import Comparison, Difference, StoredComparison
from tfcli.commands.circuit.core import Circuit, CurvePoint
from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.analysis.dataset import Envelope
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"]  # a method's, in --method's order


def one(run: Envelope, result: Circuit) -> Envelope:
    """The run as a single method's: what render's functions read."""
    return dataclasses.replace(run, value=result)


def signed_interval(difference: Difference) -> str:
    if difference.low is None:
        return ""
    return f"[{difference.low:+.3f}, {difference.high:+.3f}]"


def point_cell(point: CurvePoint | None) -> str:
    if point is None:
        return ""
    spread = render.interval(point)
    return render.share(point.faithfulness) + (f" {spread}" if spread else "")


def sizes_of(comparison: Comparison) -> list[int]:
    return sorted({p.edges for result in comparison.circuits for p in result.curve})


def header_lines(run: Envelope) -> list[str]:
    comparison: Comparison = run.value
    first = comparison.circuits[0]
    pairs = f"{run.n} pair{'s' if run.n != 1 else ''}" + (f" of {run.source}" if run.source else "")
    lines = [f"circuits of {render.quantity(first)} over {pairs}, {len(comparison.circuits)} methods on the same "
             f"pairs: {', '.join(r.method for r in comparison.circuits)}",
             f"clean {render.signed(first.clean_value)}, {render.patched_to(first)} "
             f"{render.signed(first.corrupt_value)} (means over the pairs)",
             f"graph: {first.graph.edge_count:,} edges between {len(first.graph.senders) + 1:,} nodes"]
    if run.skipped:
        lines.append(f"{run.skipped} bad lines skipped")
    return lines


def method_lines(run: Envelope) -> list[str]:
    """Each method: what it is, its circuit and faithfulness, its nodes (render.measured_lines)."""
    lines = []
    for result in run.value.circuits:
        lines.append(f"{result.method}: {render.method_words(result)}")
        lines += ["  " + line for line in render.measured_lines(one(run, result))]
    return lines


def lines(run: Envelope, width: int, color: bool) -> list[Text]:
    """The terminal view: the header, each method's circuit, the curves side by side and the paired differences."""
    comparison: Comparison = run.value
    shown: list[Text] = []
    for line in header_lines(run) + method_lines(run):
        shown += words(line, width)
    sizes = sizes_of(comparison)
    if sizes:
        shown.append(Text())
        columns = [Column.of("edges", [f"{size:,}" for size in sizes], right=True)]
        for result in comparison.circuits:
            points = {p.edges: p for p in result.curve}
            columns.append(Column.of(result.method, [point_cell(points.get(size)) for size in sizes]))
        shown += table(columns, width, title="faithfulness of each method's greedy circuits by size [95% interval]")
    if comparison.differences:
        shown.append(Text())
        names = list(dict.fromkeys((d.method, d.minus) for d in comparison.differences))
        columns = [Column.of("edges", [f"{size:,}" for size in sizes], right=True)]
        for method, minus in names:
            found = {d.edges: d for d in comparison.differences if (d.method, d.minus) == (method, minus)}

            def cell(size: int) -> Text:
                d = found.get(size)
                if d is None:
                    return Text("")
                apart = d.low is not None and (d.low > 0 or d.high < 0)  # the interval leaves 0 out
                style = ("blue" if d.value > 0 else "red") if color and apart else ""
                return Text(f"{d.value:+.3f} {signed_interval(d)}".strip(), style=style)
            columns.append(Column(f"{method} - {minus}", [[cell(size)] for size in sizes]))
        shown += table(columns, width, title="paired differences of faithfulness (the same pairs resampled for "
                                             "both) [95% interval]")
    return shown


def difference_record(d: Difference) -> dict[str, Any]:
    return {"method": d.method, "minus": d.minus, "edges": d.edges, "difference": d.value,
            "interval": None if d.low is None else [d.low, d.high]}


def record(run: Envelope) -> dict[str, Any]:
    """The JSON Lines record (docs/commands.md#circuit): each method's record as a single run writes it, and the
    paired differences."""
    comparison: Comparison = run.value
    return {"methods": [render.record(one(run, result)) for result in comparison.circuits],
            "differences": [difference_record(d) for d in comparison.differences],
            "measured_pairs": comparison.measured_pairs}


def page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The page's data: the header, each method's circuit and curve, the differences (report.js `compared`)."""
    comparison: Comparison = run.value
    return {"compared": True, "header": header_lines(run),
            "methods": [{"method": r.method, "words": render.method_words(r), "colour": COLOURS[k % len(COLOURS)],
                         "lines": render.measured_lines(one(run, r)),
                         "curve": [render.point_record(p) for p in r.curve],
                         "measured": None if r.measured is None else render.point_record(r.measured)}
                        for k, r in enumerate(comparison.circuits)],
            "differences": [difference_record(d) for d in comparison.differences]}


def figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """Each method's curve with its intervals (left) and the paired differences with theirs (right), edges on a log
    axis."""
    from matplotlib.figure import Figure

    from tfcli.render.figure import log_axis

    comparison: Comparison = done.value
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    for k, result in enumerate(comparison.circuits):
        colour = COLOURS[k % len(COLOURS)]
        xs = [p.edges for p in result.curve]
        left.plot(xs, [p.faithfulness for p in result.curve], marker="o", color=colour, label=result.method)
        for p in result.curve:
            if p.low is not None:
                left.plot([p.edges, p.edges], [p.low, p.high], color=colour, alpha=0.5)
    left.axhline(1, color="#bbb", linestyle="--", linewidth=0.8)
    left.set_xlabel("edges")
    left.set_ylabel("faithfulness")
    left.legend(fontsize=8)
    pairs = list(dict.fromkeys((d.method, d.minus) for d in comparison.differences))
    for k, (method, minus) in enumerate(pairs):
        found = [d for d in comparison.differences if (d.method, d.minus) == (method, minus)]
        # side by side around each size, so that the intervals do not overlap
        shift = 1.06 ** (k - (len(pairs) - 1) / 2)
        xs = [d.edges * shift for d in found]
        colour = COLOURS[k % len(COLOURS)]
        right.plot(xs, [d.value for d in found], marker="s", linestyle="none", color=colour,
                   label=f"{method} - {minus}")
        for x, d in zip(xs, found):
            if d.low is not None:
                right.plot([x, x], [d.low, d.high], color=colour)
    right.axhline(0, color="#888", linewidth=0.8)
    right.set_xlabel("edges")
    right.set_ylabel("difference of faithfulness (paired 95% interval)")
    if pairs:
        right.legend(fontsize=8)
    for axis in (left, right):
        if any(result.curve for result in comparison.circuits):
            log_axis(axis, "x")
    fig.suptitle(f"tfcli circuit: {run.model}, {len(comparison.circuits)} methods on the same pairs", fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- --compare: runs stored apart


def stored_record(comparison: StoredComparison) -> dict[str, Any]:
    """--compare's JSON record (docs/commands.md#circuit): each curve read, and the paired differences."""
    def point(values: tuple) -> dict[str, Any]:
        return {"faithfulness": values[0], "interval": None if values[1] is None else [values[1], values[2]]}
    return {"pairs": len(comparison.lines),
            "curves": [{"label": c.label, "file": c.file, "method": c.method, "positions": c.positions,
                        "size_unit": c.size_unit,
                        "curve": [{"edges": size, **point(values)} for size, values in sorted(c.points.items())],
                        "circuit": None if c.circuit is None else {"edges": c.circuit[0], **point(c.circuit[1:])}}
                       for c in comparison.curves],
            "differences": [{**difference_record(d), "circuit": d.edges is None} for d in comparison.differences]}


def stored_lines(comparison: StoredComparison, width: int, color: bool) -> list[Text]:
    """--compare's view: the runs read, their curves side by side, each picked circuit, the paired differences."""
    curves = comparison.curves
    shown: list[Text] = []
    head = [f"{len(curves)} curves over the same {len(comparison.lines)} pairs, read from "
            f"{', '.join(dict.fromkeys(c.file for c in curves))}"]
    head += [f"{c.label}: sizes in {'(edge, span) pairs' if c.size_unit == 'edge-span' else 'edges'}"
             for c in curves]
    for line in head:
        shown += words(line, width)
    sizes = sorted({size for c in curves for size in c.points})
    rows = [f"{size:,}" for size in sizes] + ["circuit"]

    def cell(values: tuple | None, edges: int | None = None) -> str:
        if values is None:
            return ""
        spread = "" if values[1] is None else f" [{values[1]:.3f}, {values[2]:.3f}]"
        return (f"{edges:,}: " if edges is not None else "") + f"{values[0]:.3f}{spread}"
    columns = [Column.of("edges", rows, right=True)]
    for c in curves:
        columns.append(Column.of(c.label, [cell(c.points.get(size)) for size in sizes]
                                 + [cell(c.circuit[1:], c.circuit[0]) if c.circuit else ""]))
    shown.append(Text())
    shown += table(columns, width, title="faithfulness by size [95% interval]; circuit: each run's picked one "
                                         "(its size: faithfulness)")
    names = list(dict.fromkeys((d.method, d.minus) for d in comparison.differences))
    if names:
        columns = [Column.of("edges", rows, right=True)]
        for method, minus in names:
            found = {d.edges: d for d in comparison.differences if (d.method, d.minus) == (method, minus)}

            def text(key: int | None) -> Text:
                d = found.get(key)
                if d is None:
                    return Text("")
                apart = d.low is not None and (d.low > 0 or d.high < 0)
                style = ("blue" if d.value > 0 else "red") if color and apart else ""
                return Text(f"{d.value:+.3f} {signed_interval(d)}".strip(), style=style)
            columns.append(Column(f"{method} - {minus}", [[text(size)] for size in sizes] + [[text(None)]]))
        shown.append(Text())
        shown += table(columns, width, title="paired differences of faithfulness (the same pairs resampled for "
                                             "both) [95% interval]")
    return shown
