"""`tfcli sae train`'s renderer: the trained SAE's run as a JSON record and as a few lines of text."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfcli.commands.sae.core import Trained


def record(result: Trained) -> dict[str, Any]:
    """The run as its JSON record."""
    return asdict(result)


def summary(result: Trained) -> list[str]:
    """The run in a few lines."""
    resumed = f", resumed at {result.resumed_from:,}" if result.resumed_from is not None else ""
    lines = [f"sae: {result.out} (topk, {result.latents} latents, k {result.k}) at {result.site} "
             f"(hook {result.hook}, {result.d_in} wide)",
             f"trained: {result.tokens:,} tokens in {result.steps:,} steps of {result.batch} (lr {result.lr:.3g})"
             f"{resumed}; {result.tokens_per_second:,.0f} tokens/s here",
             f"held-out ({result.held_out:,} tokens): explained variance {result.explained:.3f}, L0 {result.l0:.1f}, "
             f"dead latents {result.dead} of {result.latents} ({100 * result.dead / result.latents:.1f}%)"]
    if result.outliers or result.held_outliers:
        lines.append(f"left out: {result.outliers:,} training and {result.held_outliers} held-out tokens of outlying "
                     "norm (--outlier)")
    if result.history:
        lines.append(f"training: last FVU {result.fvu:.3f}; {result.dead_in_training} latents not fired in the "
                     "dead window when it stopped")
    return lines
