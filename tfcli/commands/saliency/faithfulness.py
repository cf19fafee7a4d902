"""Whether an attribution is faithful: deletion and insertion curves (Samek et al. 2017; Petsiuk et al. 2018's
RISE), for any order of positions and any metric of rows: the metric as the positions are replaced by the
baseline's one more at a time, most attributed first (deletion), or restored from the baseline (insertion), against
the mean of random orders, with the area under each curve. `saliency --faithfulness` measures its tokens' order
with them; an analysis that ranks positions (or components at positions) can measure its own.

Shapes: P positions of the input, T its length, d its trailing dimensions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

RANDOM_ORDERS = 4  # the random curves: the mean over this many seeded orders


@dataclass
class Curves:
    """The metric with the first k positions of an order replaced by the baseline's (deletion) or restored from it
    (insertion), k = 0 .. P, for the attributions' order (most attributed first) and the mean of RANDOM_ORDERS
    random orders; the areas under them (trapezoids over the share of positions, 0 to 1, in the metric's units)."""

    order: list[int]  # positions, most attributed first
    deletion: list[float]
    insertion: list[float]
    random_deletion: list[float]
    random_insertion: list[float]

    @property
    def areas(self) -> dict[str, float]:
        return {name: area(getattr(self, name)) for name in ("deletion", "insertion", "random_deletion",
                                                             "random_insertion")}


def area(values: list[float]) -> float:
    """The trapezoid area under values at 0, 1/n, ..., 1."""
    n = len(values) - 1
    return values[0] if n == 0 else (sum(values) - (values[0] + values[-1]) / 2) / n


def curves(metric: Callable[[Tensor], Tensor], x: Tensor, baseline: Tensor, attributions: Tensor,
           positions: list[int], seed: int) -> Curves:
    """The curves of `positions` (those that may be replaced) in the order of `attributions` (T,) and in
    RANDOM_ORDERS random orders (a generator seeded with `seed`): `metric` maps rows (R, T, ...) made of `x` and
    `baseline` (T, ...) to their values (R,)."""
    import torch

    order = sorted(positions, key=lambda p: -float(attributions[p]))
    generator = torch.Generator().manual_seed(seed % 2**63)
    randoms = [[positions[i] for i in torch.randperm(len(positions), generator=generator).tolist()]
               for _ in range(RANDOM_ORDERS)]
    rows = []
    for ranking in [order, *randoms]:
        for first, other in ((x, baseline), (baseline, x)):  # deletion: x losing positions; insertion: x' gaining
            for k in range(len(ranking) + 1):
                row = first.clone()
                row[ranking[:k]] = other[ranking[:k]]
                rows.append(row)
    values = metric(torch.stack(rows)).view(1 + RANDOM_ORDERS, 2, len(positions) + 1)
    random = values[1:].mean(0)
    return Curves(order, values[0, 0].tolist(), values[0, 1].tolist(), random[0].tolist(), random[1].tolist())
