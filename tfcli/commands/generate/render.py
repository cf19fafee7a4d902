"""`tfcli generate` output: the step table (with the logit lens per layer) and the JSON Lines record; for
--report, the page's section (`page_section`) and the figure (`figure`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.ablation import ablated_label
from tfcli.analysis.indices import spans
from tfcli.render.layout import SPACE_NOTE, Column, has_space, layer_runs, table, token_label, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.commands.generate.core import Generation
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

LINEAR_FROM = 0.1  # the figure: a probability axis from 0 to 1 when every step is at least this probable, else log


def _shown(tokenizer: Tokenizer, token_id: int) -> str:
    return repr(tokenizer.text_of(token_id))


def generation_lines(result: Generation, tokenizer: Tokenizer, number: int, sampled_seed: int | None, width: int,
                     with_text: bool = True, changed: dict[str, Any] | None = None) -> list[Text]:
    """The text (prompt and continuation; left out when it was already streamed to the same terminal), what
    --steer and --ablate changed (`changed`: changes_record's keys), then the step table; `sampled_seed` is None for
    greedy runs. Lines of at most `width` cells."""
    lines = [line for paragraph in result.full_text.split("\n") for line in words(paragraph, width)] if with_text else []
    changed = changed or {}
    if "steered" in changed:
        steered = changed["steered"]
        kept = " (each position's norm kept)" if steered["normalize"] else ""
        lines += words(f"steered: {', '.join(steered['vectors'])} at blocks {spans(steered['blocks'])}{kept}", width)
        for scale in steered.get("features", []):
            lines += words(feature_words(scale), width, "dim")
    if "ablated" in changed:
        lines += words(f"ablated: {ablated_label(changed['ablated'])}", width)
    ended = "stopped at end of sequence" if result.stopped_at_eos else f"{len(result.steps)} new tokens"
    mode = "greedy" if sampled_seed is None else f"sampled (seed {sampled_seed})"
    return lines + step_lines(result, tokenizer, f"prompt {number}: {ended}, {mode}", width)


def changes_record(steered: tuple[list[str], list[int], bool] | None, ablated: list[str] | None) -> dict[str, Any]:
    """What --steer and --ablate changed, for the record and the view: `steered` {vectors (PATH:STRENGTH as given),
    blocks, normalize} and `ablated` (the specs as given); nothing without them."""
    out: dict[str, Any] = {}
    if steered is not None:
        vectors, blocks, normalize = steered
        out["steered"] = {"vectors": vectors, "blocks": blocks, "normalize": normalize}
    if ablated:
        out["ablated"] = ablated
    return out


def scaled(changed: dict[str, Any], scales: dict[tuple, list], result: Generation) -> dict[str, Any]:
    """`changed` with, for a prompt steered by SAE features, `steered.features`: per feature what its strength means
    there ({spec, feature, block, strength, activation, site_norm, share}: generate.core.feature_scale)."""
    found = scales.get(tuple(result.prompt_ids))
    if not found or "steered" not in changed:
        return changed
    return changed | {"steered": changed["steered"] | {"features": found}}


def feature_words(scale: dict[str, Any]) -> str:
    """A feature's steering strength in the numbers a person weighs it by."""
    return (f"{scale['spec']}: {scale['strength']:g} x feature {scale['feature']}'s decoder row, the feature made "
            f"{scale['strength']:g} more active (its strength is in the feature's activation units; on this prompt "
            f"the feature reaches {scale['activation']:.4g}); block {scale['block']}'s output has a median norm of "
            f"{scale['site_norm']:.4g} here, so the vector added is {scale['share']:.0%} of it")


def probability(p: float) -> str:
    """A probability with three decimals, so that a column reads alike (0.900 beside 0.702); under 0.001 in
    scientific notation (1.2e-04), never a bare 0.000."""
    return f"{p:.3f}" if p >= 0.0005 else f"{p:.1e}"


def step_lines(result: Generation, tokenizer: Tokenizer, title: str, width: int) -> list[Text]:
    """One row per new token: its probability and the most probable alternatives; with the lens, what each
    hidden state (emb = the embeddings, then each block) would have predicted at that step."""
    steps = result.steps
    columns = [Column.of("step", [str(s.index) for s in steps], right=True),
               Column.of("token", [_shown(tokenizer, s.token_id) + (" (end)" if s.eos else "") for s in steps]),
               Column.of("id", [str(s.token_id) for s in steps], right=True),
               Column.of("prob", [probability(s.prob) for s in steps], right=True),
               Column("top alternatives", [[Text(f"{_shown(tokenizer, i)} {probability(p)}") for i, p in s.top
                                            if i != s.token_id] for s in steps])]
    if _has_lens(result):
        name = "lens" if result.lens_from is None else f"tuned lens {result.lens_from}"
        columns.append(Column(f"{name}: top token by layer (emb = embeddings)",
                              [lens_runs(s.lens, tokenizer) for s in steps], sep=" · "))
    caption = "probabilities are the model's (softmax of the logits, before temperature and filtering)" + (
        f"; lens: each layer's top token through {'' if result.lens_from is None else 'its translator, '}the final "
        "norm and unembedding" if _has_lens(result) else "")
    return table(columns, width, keys=2, title=title) + words(caption, width, "dim")


def lens_runs(lens: list[tuple[int, float]], tokenizer: Tokenizer) -> list[Text]:
    """Each layer's top token, runs of layers that agree merged: ["emb 'a'", "1-5 'b'", "6-12 'c'"]."""

    def name(layer: int) -> str:
        return "emb" if layer == 0 else str(layer)

    runs = layer_runs([(layer, token_id) for layer, (token_id, _) in enumerate(lens)])
    return [Text(f"{name(a)}{'' if a == b else '-' + name(b)} {_shown(tokenizer, t)}") for a, b, t in runs]


def _has_lens(result: Generation) -> bool:
    return bool(result.steps) and result.steps[0].lens is not None


def record(result: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """The JSON Lines record of `generate`: prompt, ids (the input ids), prompt_ids, generated_ids, text, steps."""

    def token(i: int, p: float) -> dict[str, Any]:
        return {"id": i, "token": tokenizer.text_of(i), "prob": round(p, 6)}

    steps = []
    for step in result.steps:
        record = {"step": step.index, **token(step.token_id, step.prob), "eos": step.eos,
                  "top": [token(i, p) for i, p in step.top]}
        if step.lens is not None:
            record["lens"] = [{"layer": layer, **token(i, p)} for layer, (i, p) in enumerate(step.lens)]
        steps.append(record)
    found = {"prompt": result.prompt, "ids": result.prompt_ids, "prompt_ids": result.prompt_ids,
             "generated_ids": result.generated_ids, "text": result.text, "steps": steps}
    return found if result.lens_from is None else found | {"lens_from": result.lens_from}


# ---------------------------------------------------------------- the --report page and figure


def page_section(result: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """One prompt of `generate` for the --report page: its JSON record (steps with token, prob, alternatives, lens)
    and the text."""
    return record(result, tokenizer) | {"full_text": result.full_text, "stopped_at_eos": result.stopped_at_eos}


def figure(result: Generation, run: RunInfo, tokenizer: Tokenizer) -> Figure:
    """Each new token's probability (bars, tokens along the bottom) and, with --lens, the layers x steps grid."""
    from tfcli.render.figure import (CELL_TOKEN, CHAR_WIDTH, POINTS, blank_figure, caption, label_axis, labels_size,
                                     lens_grid, lens_layout, log_axis)

    # each token's text, a space as ␣ (token_label), as every grid's labels show it
    tokens = [token_label(tokenizer.text_of(step.token_id)) for step in result.steps]
    guesses = [[token_label(tokenizer.text_of(step.lens[layer][0])) for step in result.steps]
               for layer in range(len(result.steps[0].lens))] if result.steps and result.steps[0].lens else []
    # a step is as wide as its lens cells' tokens written across (so far as 16 inches allow)
    longest = min(CELL_TOKEN, max((len(t) for row in guesses for t in row), default=0))
    width = min(16.0, max(6.0, len(tokens) * max(0.35, 1.15 * longest * CHAR_WIDTH * 5.5 / POINTS) + 2))
    plot_width = width - 2.0  # less the row labels and the colour bar
    layers = len(guesses)
    lens = lens_layout(tokens, guesses, plot_width) if guesses else None
    bars_height = 2.2 + labels_size(tokens, plot_width)
    lens_height = 0.3 + lens["row"] * layers + lens["ticks"] if lens else 0
    figure = blank_figure(width, bars_height + lens_height + 1.0)
    said = f" ({SPACE_NOTE})" if has_space(tokens + [t for row in guesses for t in row]) else ""
    caption(figure, f"tfcli generate: {result.prompt!r} -> {result.text!r}{said}", run)
    grid = figure.add_gridspec(2 if lens else 1, 1, height_ratios=[bars_height, lens_height] if lens else [1])
    ax = figure.add_subplot(grid[0])
    bars = ax.bar(range(len(tokens)), [step.prob for step in result.steps], color="#2171b5")
    if plot_width * POINTS / max(len(tokens), 1) >= 8:  # room for each probability, turned, above its bar
        ax.bar_label(bars, [f"{step.prob:.2g}" for step in result.steps], rotation=90, fontsize=6, padding=2)
    ax.set_xlim(-0.5, len(tokens) - 0.5)
    lowest = min((step.prob for step in result.steps), default=1.0)
    if lowest >= LINEAR_FROM:
        ax.set_ylim(0, 1)
        ax.set_ylabel("probability")
    else:  # on 0 to 1, a bar of 3e-4 would not show: a log axis down to the least probable step's decade
        log_axis(ax, "y")
        ax.set_ylim(10 ** math.floor(math.log10(max(lowest, 1e-12))), 1)
        ax.set_ylabel("probability (log scale)")
    ax.set_title("each new token's probability (the model's, before temperature and filtering)")
    label_axis(ax, "x", tokens, plot_width)
    if lens:
        lens_grid(figure.add_subplot(grid[1]), tokens,
                  ["emb" if layer == 0 else f"layer {layer}" for layer in range(layers)],
                  [[step.lens[layer][1] for step in result.steps] for layer in range(layers)], lens, figure, "step")
    return figure
