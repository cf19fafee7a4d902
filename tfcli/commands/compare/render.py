"""`tfcli compare` output: one row per compared tensor, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from tfcli.commands.compare.core import Comparison


def tolerance_words(comparison: Comparison) -> str:
    """The tolerance as a person reads it: `0.0001`, in bfloat16 and float16 `0.05 of each tensor's largest value`,
    and in float32 where a tensor's scale allows more, `0.0001, or 1e-05 of a tensor's largest value where that is
    more`."""
    from tfcli.commands.compare.core import FLOAT32_SCALED

    said = f"{comparison.tolerance:g}"
    if comparison.relative:
        return f"{said} of each tensor's largest value"
    return f"{said}, or {FLOAT32_SCALED:g} of a tensor's largest value where that is more" if comparison.scaled \
        else said


def compare_lines(comparison: Comparison, number: int, width: int) -> list[Text]:
    """One row per compared tensor: its shape, the max abs difference (in bfloat16 and float16 also the largest
    difference allowed for it) and whether it matches; then a line that sums it up."""
    differences = comparison.differences
    columns = [Column.of("tensor", [d.name for d in differences]),
               Column.of("shape", [str(tuple(d.shape)) for d in differences], right=True),
               Column.of("max abs diff", [f"{d.max_abs_diff:.3g}" for d in differences], right=True)]
    if comparison.relative or comparison.scaled:  # what was allowed, where it is not the tolerance itself
        columns.append(Column.of("allowed", [f"{comparison.allowed(d):.3g}" for d in differences], right=True))
    columns.append(Column.of("match", ["ok" if comparison.within(d) else "DIFFERS" for d in differences]))
    title = (f"text {number}: {comparison.text!r}: tfcli vs transformers on {comparison.source} "
             f"({comparison.dtype + ', ' if comparison.relative else ''}tolerance {tolerance_words(comparison)})")
    return words(title, width, "bold") + table(columns, width) + words(summary(comparison), width)


def summary(comparison: Comparison) -> str:
    """`all 8 tensors match (largest difference 3.1e-06, tolerance 0.0001)`, or which ones differ."""
    differences = comparison.differences
    worst = max(differences, key=lambda d: d.max_abs_diff)
    bad = [d.name for d in comparison.failing]
    if not bad:
        return (f"all {len(differences)} tensors match (largest difference {worst.max_abs_diff:.3g}, "
                f"{worst.name}; tolerance {tolerance_words(comparison)})")
    return (f"{len(bad)} of {len(differences)} tensors differ by more than {tolerance_words(comparison)}: "
            + ", ".join(bad))


def record(comparison: Comparison) -> dict[str, Any]:
    """The JSON Lines record of `compare`: text, ids, tolerance, max_abs_diff, matches, tensors (name, shape,
    max_abs_diff, allowed: the largest difference that counts as a match for it)."""
    return {"text": comparison.text, "ids": comparison.ids, "tolerance": comparison.tolerance,
            "max_abs_diff": comparison.worst, "matches": comparison.matches,
            "tensors": [{"name": d.name, "shape": d.shape, "max_abs_diff": d.max_abs_diff,
                         "allowed": comparison.allowed(d)} for d in comparison.differences]}
