"""`tfcli steer fit` output: per block, how well the fitted direction separates the pairs (the share of pairs whose
positive projects above its negative, and the mean gap in standard deviations of the projections), the block that
separates best marked; and the JSON object."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from tfcli.steer import SteerFit

METHOD_WORDS = {"pca-diff": "first principal component of the differences",
                "pca-center": "first principal component of the pair-centred representations",
                "mean-diff": "mean of the differences"}


def _number(value: float, digits: int = 2, sign: bool = False) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def best(result: SteerFit) -> int | None:
    """The block whose direction separates the pairs best: the highest share, then the largest gap."""
    if not result.layers:
        return None
    key = max(result.layers, key=lambda fit: (fit.separation, -math.inf if math.isnan(fit.gap) else fit.gap))
    return key.layer


def fit_lines(result: SteerFit, width: int) -> list[Text]:
    """The terminal view: what was fitted, then one row per block (lines of at most `width` cells)."""
    head = (f"steer fit: {result.method} ({METHOD_WORDS.get(result.method, result.method)}) over {result.pairs} "
            f"pairs; {result.model_hint}, {result.width} wide")
    lines = words(Text(head, style="bold"), width)
    top = best(result)
    rows = result.layers
    columns = [Column.of("block", [str(fit.layer) for fit in rows], right=True),
               Column.of("separated", [f"{fit.separation:.0%}" for fit in rows], right=True),
               Column.of("gap (sd)", [_number(fit.gap, sign=True) for fit in rows], right=True),
               Column.of("norm", [f"{float(fit.direction.norm()):.3g}" for fit in rows], right=True),
               Column.of("", ["best" if fit.layer == top else "" for fit in rows])]
    lines += table(columns, width)
    lines += words(Text("separated: the share of pairs whose positive text projects above its negative on the "
                        "block's direction; gap: the mean projection gap (positive - negative) in standard deviations "
                        "of all the texts' projections", style="dim"), width)
    if result.output is not None:
        lines += words(Text(f"wrote {result.output}: direction.L is added to the output of block L"), width)
    return lines


def record(result: SteerFit) -> dict[str, Any]:
    """The JSON object: layers [{layer, separation, gap}], method, model_hint, width, output."""
    return {
        "layers": [{"layer": fit.layer, "separation": fit.separation,
                    "gap": None if math.isnan(fit.gap) else fit.gap} for fit in result.layers],
        "method": result.method,
        "model_hint": result.model_hint,
        "width": result.width,
        "output": result.output,
    }
