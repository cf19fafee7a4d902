"""`tfcli compare` output: one row per compared tensor, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from tfcli.compare import Comparison


def compare_lines(comparison: Comparison, number: int, width: int) -> list[Text]:
    """One row per compared tensor: its shape, the max abs difference and whether it is within tolerance."""
    tolerance = comparison.tolerance
    differences = comparison.differences
    columns = [Column.of("tensor", [d.name for d in differences]),
               Column.of("shape", [str(tuple(d.shape)) for d in differences], right=True),
               Column.of("max abs diff", [f"{d.max_abs_diff:.3g}" for d in differences], right=True),
               Column.of("", ["ok" if d.max_abs_diff <= tolerance else "DIFFERS" for d in differences])]
    title = f"text {number}: {comparison.text!r}: tfcli vs transformers on {comparison.source} (tolerance {tolerance:g})"
    return words(title, width, "bold") + table(columns, width)


def record(comparison: Comparison) -> dict[str, Any]:
    """The JSON Lines record of `compare`: text, ids, tolerance, max_abs_diff, tensors."""
    return {"text": comparison.text, "ids": comparison.ids, "tolerance": comparison.tolerance,
            "max_abs_diff": comparison.worst,
            "tensors": [{"name": d.name, "shape": d.shape, "max_abs_diff": d.max_abs_diff}
                        for d in comparison.differences]}
