"""`tfcli steer` output. `fit`: per block, how well the fitted direction separates the pairs (the share of pairs whose
positive projects above its negative, and the mean gap in standard deviations of the projections) and the norm of
the residual stream there, the block that separates best named; and the JSON object. `sweep`: per prompt, a row per
strength (the effect, the cost, the continuation), its JSON Lines (one object per prompt and strength), the --report
page's section and the figure."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.indices import spans
from tfcli.render.layout import Column, echo, plain, quoted, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.commands.steer.core import SteerFit, Sweep
    from tfcli.tokenizer import Tokenizer

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
               Column.of("resid norm", [f"{fit.resid_norm:.1f}" for fit in rows], right=True)]
    unit = result.method != "mean-diff"  # a principal component is a unit vector: its norm says nothing
    if not unit:
        columns.append(Column.of("|v|", [f"{float(fit.direction.norm()):.2f}" for fit in rows], right=True))
    lines += table(columns, width)
    size = "the direction is a unit vector: strength S adds a vector of norm S" if unit else \
        "strength S adds a vector of norm S x |v|, the direction's norm"
    lines += words(Text("separated: the share of pairs whose positive text projects above its negative on the "
                        "block's direction; gap: the mean projection gap (positive - negative) in standard deviations "
                        "of all the texts' projections; resid norm: the median norm of the block's output at the "
                        f"texts' last tokens, the scale a strength meets ({size})", style="dim"), width)
    if top is not None and len(rows) > 1:
        lines += words(Text(f"best: block {top}, the highest share separated (then gap): the block whose direction "
                            "tells the pairs apart best. It need not be the one to steer (late blocks have a larger "
                            "resid norm and fewer blocks after them to act on the vector): compare bands of blocks "
                            "with `tfcli steer sweep --layers`"), width)
    if result.output is not None:
        lines += words(Text(f"wrote {result.output}: direction.L is added to the output of block L"), width)
    return lines


def record(result: SteerFit) -> dict[str, Any]:
    """The JSON object: layers [{layer, separation, gap, resid_norm}], method, model_hint, width, output."""
    return {
        "layers": [{"layer": fit.layer, "separation": fit.separation,
                    "gap": None if math.isnan(fit.gap) else fit.gap, "resid_norm": fit.resid_norm}
                   for fit in result.layers],
        "method": result.method,
        "model_hint": result.model_hint,
        "width": result.width,
        "output": result.output,
    }


def effect_words(result: Sweep) -> str:
    """`the logit difference ' happy' - ' sad' at position 2 ' feel'`: what `effect` is (`quoted` tokens)."""
    what = f"logit of {quoted(result.target.text)}" if result.foil is None else \
        f"logit difference {quoted(result.target.text)} - {quoted(result.foil.text)}"
    last = len(result.ids) - 1
    return f"the {what} at the prompt's last position ({last} {quoted(result.token_texts[last])})"


def sweep_header(result: Sweep) -> list[str]:
    """What was steered and how effect and cost are measured: the view's and the page's sentences."""
    kept = " (each position's norm kept)" if result.normalize else ""
    out = [f"vector {result.vector} at blocks {spans(result.layers)}{kept}, times each strength, added to the blocks' "
           "outputs at every position; greedy continuations"]
    if result.target is not None:
        out.append(f"effect: {effect_words(result)}")
    out.append(f"KL: the cost, the mean over the prompt's {len(result.ids)} positions of the KL divergence (nats) of "
               "the steered next-token distribution from the unsteered one")
    return out


def strength_label(strength: float) -> str:
    """`+4`, `-2`, `0`."""
    return f"{strength:+g}" if strength else "0"


def sweep_lines(result: Sweep, number: int, width: int) -> list[Text]:
    """The terminal view of one prompt: what was steered, then a row per strength (effect, KL, the continuation
    wrapped at its spaces in the room left), lines of at most `width` cells."""
    lines = echo(f"prompt {number}: ", result.prompt, width)
    for sentence in sweep_header(result):
        lines += words(plain(sentence), width, "dim")
    steps = result.steps
    columns = [Column.of("strength", [strength_label(step.strength) for step in steps], right=True)]
    if result.target is not None:
        columns.append(Column.of("effect", [f"{step.effect:+.3f}" for step in steps], right=True))
    columns.append(Column.of("KL", [f"{step.kl:.3f}" for step in steps], right=True))
    # the continuation's words, each an item: a narrow column breaks it between words, never inside one
    columns.append(Column("continuation", [[Text(word) for word in repr(step.text).split(" ")] for step in steps],
                          sep=" "))
    return lines + [Text()] + table(columns, width, keys=len(columns) - 1)


def sweep_records(result: Sweep) -> list[dict[str, Any]]:
    """One JSON object per strength: prompt, strength, layers, text (the continuation), ids (its tokens), effect
    (null without --target), kl."""
    return [{"prompt": result.prompt, "strength": step.strength, "layers": result.layers, "text": step.text,
             "ids": step.ids, "effect": step.effect, "kl": step.kl} for step in result.steps]


def page_section(result: Sweep, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """One prompt of `steer sweep` for the --report page (tfcli/commands/steer/report.js draws it): the records, the
    header sentences and what `effect` is."""
    return {"prompt": result.prompt, "vector": result.vector, "layers": result.layers,
            "header": [plain(sentence) for sentence in sweep_header(result)],
            "effect": None if result.target is None else plain(effect_words(result)),
            "steps": sweep_records(result)}


def figure(result: Sweep, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """Strength against effect (left axis, with --target) and cost (KL, right axis), the continuations beside."""
    import textwrap

    from tfcli.render.figure import blank_figure, caption

    steps = sorted(result.steps, key=lambda step: step.strength)
    strengths = [step.strength for step in steps]
    lines = [f"{strength_label(step.strength)}: {step.text!r}" for step in steps]
    wrapped = [textwrap.wrap(line, 60, subsequent_indent="    ", break_long_words=True) or [""] for line in lines]
    height = max(3.2, 0.16 * sum(len(w) for w in wrapped) + 1.6)
    figure = blank_figure(9.0, height)
    effect = f"; effect: {effect_words(result)}" if result.target is not None else ""
    caption(figure, plain(f"tfcli steer sweep: {result.vector} at blocks {spans(result.layers)} on "
                          f"{result.prompt!r}{effect}"), run)
    grid = figure.add_gridspec(1, 2, width_ratios=[1, 1.25])
    ax = figure.add_subplot(grid[0])
    cost = ax.twinx() if result.target is not None else ax
    if result.target is not None:
        ax.plot(strengths, [step.effect for step in steps], "o-", color="#2171b5", label="effect")
        ax.set_ylabel("effect", color="#2171b5")
    cost.plot(strengths, [step.kl for step in steps], "s--", color="#e6550d", label="KL")
    cost.set_ylabel("cost: mean KL from unsteered (nats)", color="#e6550d")
    ax.set_xlabel("strength")
    ax.set_xticks(strengths)
    ax.axvline(0, color="0.7", linewidth=0.6)
    text = figure.add_subplot(grid[1])
    text.axis("off")
    text.text(0, 1, "\n".join(line for w in wrapped for line in w), va="top", ha="left", fontsize=6.5,
              family="monospace", transform=text.transAxes)
    return figure
