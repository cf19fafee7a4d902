"""`tfcli classify` output: a table of labels and probabilities per text, and the --explain heat strip; the JSON
Lines record; for --report, the page's section (`page_section`) and the figure (`figure`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import (GAP, SPACE_NOTE, Column, echo, fold, has_space, heat, heat_legend, table, token_label,
                                 words, wrap)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.commands.classify.core import Classification, Explanation
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

BAR_WIDTH = 30  # the bar of probability 1, when the width allows (at least MIN_BAR)
MIN_BAR = 10
PREDICTION = "◀ prediction"


def bar(probability: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of eighth-blocks, `width` characters for probability 1."""
    eighths = round(max(0.0, min(1.0, probability)) * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + ("" if part == 0 else " ▏▎▍▌▋▊▉"[part])


def classification_lines(result: Classification, number: int, width: int, top: int | None = None) -> list[Text]:
    """Every label (or the `top` most probable), most probable first, with its probability and a bar, then
    the prediction; lines of at most `width` cells."""
    ranked = result.ranked(top)
    prediction = result.prediction
    labels = Column.of("label", [Text(label, style="bold" if label == prediction else "") for label, _ in ranked])
    probs = Column.of("prob", [f"{p:.4f}" for _, p in ranked], right=True)
    marks = Column.of("", [PREDICTION if label == prediction else "" for label, _ in ranked])
    room = width - min(labels.natural_width(), width // 2) - probs.natural_width() - marks.natural_width() - 3 * GAP
    bar_width = max(MIN_BAR, min(BAR_WIDTH, room))
    bars = Column.of("", [Text(bar(p, bar_width), style="cyan") for _, p in ranked])
    title = echo(f"text {number}: ", result.text, width, f" + {result.pair!r}" if result.pair is not None else "")
    return (title + table([labels, probs, bars, marks], width)
            + [Text(f"prediction: {prediction}")])


def labels_of(explanation: Explanation) -> list[str]:
    """Each token's text as a label (`token_label`: ` Mary` as `␣Mary`), as every view shows them."""
    return [token_label(t) for t in (explanation.texts if explanation.texts is not None else explanation.tokens)]


def explanation_lines(explanation: Explanation, width: int, top: int = 3) -> list[Text]:
    """The tokens (their texts, a space as ␣), each with a shade line under it: its weight on the same absolute
    scale as encode's heatmaps (the glyph, coloured when colour is on); then the most attended tokens with their
    weights."""
    layers = explanation.layers
    where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"
    labels = labels_of(explanation)
    said = f"; {SPACE_NOTE}" if has_space(labels) else ""
    lines = words(f"why: first token's attention in {where}, mean over heads{said}", width, "dim")
    tokens, shades = Text(), Text()
    for token, weight in zip(labels, explanation.weights):
        for piece in fold(Text(token), width):
            if tokens.cell_len and tokens.cell_len + 1 + piece.cell_len > width:
                lines += [tokens, shades]
                tokens, shades = Text(), Text()
            if tokens.cell_len:
                tokens.append(" ")
                shades.append(" ")
            tokens.append_text(piece)
            shades.append(heat(weight).plain * piece.cell_len, style=heat(weight).style)
    lines += [tokens, shades] if tokens.cell_len else []
    ranked = sorted(zip(labels, explanation.weights), key=lambda pair: -pair[1])[:top]
    most = [Text("most attended:")] + [Text(f"{token} {weight:.3f}") for token, weight in ranked]
    return lines + wrap(most, width) + heat_legend(width)


def record(result: Classification) -> dict[str, Any]:
    """The JSON Lines record of `classify`: text, (pair,) ids, labels, probs, prediction (and `explain` when asked
    for)."""
    out: dict[str, Any] = {"text": result.text} | ({"pair": result.pair} if result.pair is not None else {})
    out |= {"ids": result.ids, "labels": result.labels, "probs": result.probs, "prediction": result.prediction}
    if result.explanation is not None:
        e = result.explanation
        out["explain"] = {"layers": e.layers, "tokens": e.tokens, "weights": e.weights}
    return out


# ---------------------------------------------------------------- the --report page and figure


def page_section(result: Classification, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """One text of `classify` for the --report page: its JSON record (labels, probs, prediction, explain; explain's
    `tokens_shown`: the text each token stands for, what the page shows)."""
    section = record(result)
    if result.explanation is not None:
        e = result.explanation
        section["explain"] = section["explain"] | {"tokens_shown": e.texts if e.texts is not None else e.tokens}
    return section


def figure(result: Classification, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """Label probabilities, most probable on top, and with --explain the first token's attention strip, each
    cell's weight written in it where it fits, and the uniform weight 1/n marked on the colour bar."""
    import matplotlib

    from tfcli.render.figure import (ATTENTION_COLOURS, CHAR_WIDTH, MIN_FONT, POINTS, blank_figure, caption,
                                     label_axis, labels_size, text_colour)

    ranked = result.ranked()
    explain = result.explanation
    labels = labels_of(explain) if explain else []
    width = max(6.0, min(16.0, 0.32 * len(explain.tokens) + 1.5)) if explain else 6.0
    plot_width = width - 2.0
    strip_height = 0.9 + labels_size(labels, plot_width) if explain else 0
    figure = blank_figure(width, 1.6 + 0.25 * len(ranked) + strip_height)
    caption(figure, f"tfcli classify: {result.text!r} -> {result.prediction}" +
            (f" ({SPACE_NOTE})" if has_space(labels) else ""), run)
    grid = figure.add_gridspec(2 if explain else 1, 1,
                               height_ratios=[0.6 + 0.25 * len(ranked), strip_height] if explain else [1])
    ax = figure.add_subplot(grid[0])
    ax.barh(range(len(ranked)), [p for _, p in ranked], color="#2171b5")
    ax.set_yticks(range(len(ranked)), [label for label, _ in ranked])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("probability")
    if explain:
        strip = figure.add_subplot(grid[1])
        # the absolute scale, 0 to 1, as in the terminal and the page: near-uniform attention looks faint
        cmap = matplotlib.colormaps[ATTENTION_COLOURS]
        image = strip.imshow([explain.weights], cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        where = f"layer {explain.layers[0]}" if len(explain.layers) == 1 else \
            f"layers {explain.layers[0]}-{explain.layers[-1]}"
        strip.set_title(f"what the first token attends to in {where}, mean over heads")
        strip.set_yticks([])
        label_axis(strip, "x", labels, plot_width)
        cell = plot_width * POINTS / len(explain.tokens)  # points
        if cell >= 4 * CHAR_WIDTH * MIN_FONT:  # room for "0.12"
            for k, w in enumerate(explain.weights):
                strip.text(k, 0, f"{w:.2f}", ha="center", va="center", fontsize=min(6.0, cell / (4 * CHAR_WIDTH)),
                           color=text_colour(cmap, w))
        colour_bar = figure.colorbar(image, ax=strip, label="weight; orange: 1/n")
        colour_bar.ax.axhline(1 / len(explain.tokens), color="#e6550d", linewidth=1.5)
    return figure
