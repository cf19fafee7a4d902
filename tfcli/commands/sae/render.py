"""`tfcli sae train`'s renderer: the trained SAE's run (or, with --transcoder, the transcoders') as a JSON record and
as a few lines of text (the transcoders' figures a table, a row per layer)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from tfcli.commands.sae.core import Trained
    from tfcli.commands.sae.transcoder import TranscodersTrained


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


def transcoder_record(result: TranscodersTrained) -> dict[str, Any]:
    """The transcoders' run as its JSON record (`figures`: a dict per layer)."""
    return asdict(result)


def transcoder_view(result: TranscodersTrained, width: int) -> list[Text]:
    """The run in a few lines, then a table of each layer's figures on the held-out tokens."""
    kind = "top-k training, JumpReLU thresholds written" + (", skip matrix" if result.skip else "")
    resumed = f", resumed at {result.resumed_from:,}" if result.resumed_from is not None else ""
    head = [f"transcoders: {result.out} ({result.layers} layers, {result.latents} features each, k {result.k}; "
            f"{kind})",
            f"each reads {result.input_site} ({result.feature_input_hook}) and writes {result.output_site} "
            f"({result.feature_output_hook}), {result.d_model} wide",
            f"trained: {result.tokens:,} tokens in {result.steps:,} steps of {result.batch} (lr {result.lr:.3g})"
            f"{resumed}; {result.tokens_per_second:,.0f} tokens/s here; last training FVU {result.fvu:.3f} "
            "(mean over layers)"]
    if result.outliers or result.held_outliers:
        head.append(f"left out: {result.outliers:,} training and {result.held_outliers} held-out tokens of outlying "
                    "norm (--outlier)")
    lines = [line for text in head for line in words(text, width)]
    figures = result.figures
    columns = [Column.of("layer", [str(f.layer) for f in figures], right=True),
               Column.of("explained\nvariance", [f"{f.explained:.3f}" for f in figures], right=True),
               Column.of("top-k\nexplained", [f"{f.explained_topk:.3f}" for f in figures], right=True),
               Column.of("L0", [f"{f.l0:.1f}" for f in figures], right=True),
               Column.of("dead", [f"{f.dead}" for f in figures], right=True),
               Column.of("dead in\ntraining", [f"{f.dead_in_training}" for f in figures], right=True)]
    lines.append(Text())
    lines += table(columns, width, title=f"held-out ({result.held_out:,} tokens): each layer's MLP output as the "
                                         "files compute it (JumpReLU), and with top-k")
    return lines
