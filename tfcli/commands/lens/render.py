"""`tfcli lens` output: per layer, the KL of the model's final distribution from the logit lens's and the tuned
lens's on held-out tokens, and how often each lens's top token is the model's (`lens eval`, and the end of `lens
fit`, after what the run trained); the JSON objects; and the --report figure (both lenses' KL and agreement by
layer)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.commands.lens.core import Evaluated, Fitted
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

NOTE = ("layer l: the residual stream entering block l (0: the embeddings); KL: of the model's final distribution "
        "from the lens's, in nats, mean over the tokens; top-1: how often the lens's top token is the model's")


def eval_lines(result: Evaluated, width: int) -> list[Text]:
    """The lens against the logit lens, a row per layer (lines of at most `width` cells)."""
    held = result.held_out
    head = (f"tuned lens {result.lens} on {result.model} ({result.layers} layers, {result.d} wide): "
            f"{held.tokens:,} held-out tokens")
    lines = words(Text(head, style="bold"), width)
    layers = range(result.layers)
    better = [Text(f"{held.kl_tuned[l]:.3f}", style="green" if held.kl_tuned[l] < held.kl_logit[l] else "")
              for l in layers]
    columns = [Column.of("layer", [str(l) for l in layers], right=True),
               Column.of("KL logit", [f"{held.kl_logit[l]:.3f}" for l in layers], right=True),
               Column.of("KL tuned", better, right=True),
               Column.of("top-1 logit", [f"{held.top1_logit[l]:.1%}" for l in layers], right=True),
               Column.of("top-1 tuned", [f"{held.top1_tuned[l]:.1%}" for l in layers], right=True)]
    lines += table(columns, width)
    lines += words(Text(NOTE, style="dim"), width)
    return lines


def fit_lines(result: Fitted, width: int) -> list[Text]:
    """What the run trained, then the evaluation on its held-out tokens."""
    resumed = f", resumed at {result.resumed_from:,}" if result.resumed_from is not None else ""
    stopped = " (interrupted)" if result.interrupted else " (the corpus ran out)" if result.ran_out else ""
    lines = words(Text(f"lens: {result.out} ({result.layers} translators, {result.d} wide) for {result.model}",
                       style="bold"), width)
    lines += words(Text(f"fitted: {result.tokens:,} tokens in {result.steps:,} steps of {result.batch:,}{stopped}"
                        f"{resumed} (SGD, Nesterov momentum 0.9, lr {result.lr:g} decaying to 0); "
                        f"{result.tokens_per_second:,.0f} tokens/s here"), width)
    if result.history:
        first = result.history[0][1]
        lines += words(Text(f"loss (KL summed over layers, nats): {first:.3f} over the first steps, "
                            f"{result.loss:.3f} at the last"), width)
    if result.evaluated is not None:
        lines += [Text()] + eval_lines(result.evaluated, width)
    return lines


def layers_record(result: Evaluated) -> list[dict[str, Any]]:
    held = result.held_out
    return [{"layer": l, "kl_logit": held.kl_logit[l], "kl_tuned": held.kl_tuned[l],
             "top1_logit": held.top1_logit[l], "top1_tuned": held.top1_tuned[l]} for l in range(result.layers)]


def record(result: Evaluated) -> dict[str, Any]:
    """`lens eval --json`: the lens, the model, the held-out tokens and a row per layer."""
    return {"lens": result.lens, "model": result.model, "layers": result.layers, "d_model": result.d,
            "tokens": result.held_out.tokens, "per_layer": layers_record(result)}


def fit_record(result: Fitted) -> dict[str, Any]:
    """`lens fit --json`: the run, and its evaluation as `lens eval --json` gives it (`held_out`)."""
    found = {key: value for key, value in asdict(result).items() if key != "evaluated"}
    found["history"] = [list(entry) for entry in result.history]
    found["held_out"] = record(result.evaluated) if result.evaluated is not None else None
    return found


def page_section(result: Evaluated, tokenizer: Tokenizer | None) -> dict[str, Any]:
    return record(result)


def figure(result: Evaluated | Fitted, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """Two panels over the layers: each lens's KL from the final distribution (log scale), and its top-1
    agreement with the model."""
    from matplotlib.ticker import MaxNLocator

    from tfcli.render.figure import blank_figure, caption, log_axis

    evaluated = getattr(result, "evaluated", None) or result
    held = evaluated.held_out
    layers = list(range(evaluated.layers))
    fig = blank_figure(7.0, 3.4)
    caption(fig, f"tfcli lens: tuned lens {evaluated.lens} against the logit lens, {held.tokens:,} held-out tokens; "
            "layer l: the residual stream entering block l (0: the embeddings)", run)
    kl_axes, top_axes = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for axes, (logit, tuned), label in ((kl_axes, (held.kl_logit, held.kl_tuned), "KL from the final (nats)"),
                                        (top_axes, (held.top1_logit, held.top1_tuned), "top-1 agreement")):
        axes.plot(layers, logit, marker="o", markersize=3, label="logit lens", color="#999999")
        axes.plot(layers, tuned, marker="o", markersize=3, label="tuned lens", color="#1f77b4")
        axes.set_xlabel("layer")
        axes.set_ylabel(label)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
    if min(held.kl_tuned + held.kl_logit) > 0:
        log_axis(kl_axes, "y")
    top_axes.set_ylim(0, 1)
    kl_axes.legend(fontsize=7)
    return fig
