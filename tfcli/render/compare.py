"""`tfcli compare` output: one row per compared tensor, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:
    from tfcli.compare import Comparison


def compare_table(comparison: Comparison) -> Table:
    """One row per compared tensor: its shape, the max abs difference and whether it is within tolerance."""
    tolerance = comparison.tolerance
    table = Table(title=f"tfcli vs transformers on {comparison.source} (tolerance {tolerance:g})", title_justify="left")
    for header in ("tensor", "shape", "max abs diff", ""):
        table.add_column(header, no_wrap=True)
    for d in comparison.differences:
        table.add_row(d.name, str(tuple(d.shape)), f"{d.max_abs_diff:.3g}", "ok" if d.max_abs_diff <= tolerance else "DIFFERS")
    return table


def record(comparison: Comparison) -> dict[str, Any]:
    """The JSON Lines record of `compare`: text, ids, tolerance, max_abs_diff, tensors."""
    return {"text": comparison.text, "ids": comparison.ids, "tolerance": comparison.tolerance,
            "max_abs_diff": comparison.worst,
            "tensors": [{"name": d.name, "shape": d.shape, "max_abs_diff": d.max_abs_diff}
                        for d in comparison.differences]}
