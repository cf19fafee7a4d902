"""`tfcli classify` output: a table of labels and probabilities per text, and the --explain heat strip."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from tfcli.classify import Classification, Explanation

BAR_WIDTH = 30
SHADES = " ░▒▓█"  # heat strip in plain text: weight relative to the largest, darker is more


def bar(probability: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of eighth-blocks, `width` characters for probability 1."""
    eighths = round(max(0.0, min(1.0, probability)) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])


def classification_table(result: Classification, number: int, top: int | None = None) -> Table:
    """Every label (or the `top` most probable), most probable first, with its probability and a bar."""
    table = Table(title=f"text {number}: {result.text!r}", title_justify="left", caption_justify="left",
                  caption=f"prediction: {result.prediction}")
    table.add_column("label")
    table.add_column("prob", justify="right")
    table.add_column("", min_width=BAR_WIDTH)
    table.add_column("")
    prediction = result.prediction
    for label, probability in result.ranked(top):
        mark = "◀ prediction" if label == prediction else ""
        style = "bold" if label == prediction else None
        table.add_row(Text(label, style=style or ""), f"{probability:.4f}", Text(bar(probability), style="cyan"), mark)
    return table


def heat_strip(explanation: Explanation, top: int = 3) -> Group:
    """The tokens on one line, shaded by attention (background colour on a terminal, a shade line
    under them everywhere), then the most attended tokens with their weights."""
    layers = explanation.layers
    where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
    heading = Text(f"why: first token's attention in {where}, mean over heads", style="dim")
    peak = max(explanation.weights, default=0.0) or 1.0
    tokens, shades = Text(), Text()
    for token, weight in zip(explanation.tokens, explanation.weights):
        level = weight / peak
        shade = 255 - round(level * 200)
        tokens.append(token, style=f"black on rgb(255,{shade},{shade})" if level > 0.05 else "")
        tokens.append(" ")
        shades.append(SHADES[min(len(SHADES) - 1, round(level * (len(SHADES) - 1)))] * len(token) + " ")
    ranked = sorted(zip(explanation.tokens, explanation.weights), key=lambda pair: -pair[1])[:top]
    most = Text("most attended: " + ", ".join(f"{token} {weight:.3f}" for token, weight in ranked))
    return Group(heading, tokens, shades, most)


def record(result: Classification) -> dict[str, Any]:
    """The JSON Lines record of `classify`: text, ids, labels, probs, prediction (and `explain` when asked for)."""
    out: dict[str, Any] = {"text": result.text, "ids": result.ids, "labels": result.labels, "probs": result.probs,
                           "prediction": result.prediction}
    if result.explanation is not None:
        e = result.explanation
        out["explain"] = {"layers": e.layers, "tokens": e.tokens, "weights": e.weights}
    return out
