"""`tfcli attribute` output: the components that write the logit, biggest first, with bars; a line per layer; the
layer x head grid (--by head); the sum check; the JSON Lines record; for --report, the page's section
(`page_section`) and the figure (`figure`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.ablation import ablated_label
from tfcli.commands.attribute.core import Attribution, DatasetAttribution
from tfcli.render.layout import GAP, GLUE, Column, echo, plain, quoted, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.analysis.dataset import Envelope
    from tfcli.tokenizer import Tokenizer

BAR_WIDTH = 24  # the bar of the largest value shown, when the width allows (at least MIN_BAR)
MIN_BAR = 8
POSITIVE, NEGATIVE = "█", "▒"  # told apart without colour; green and red only add to it
FINAL_BIASES = ("final_norm_bias", "unembed_bias")  # after the last layer: the per-layer table's last row
RESIDUAL_SAE = re.compile(r"^(L\d+\.resid_(?:pre|mid|post))(?:#\d+|\.sae_rest|\.sae_error)$")  # its parts' names


def bar(value: float, largest: float, width: int) -> Text:
    """A bar `width` cells long for `largest`: full blocks for a positive value, shaded ones for a negative."""
    cells = round(abs(value) / largest * width) if largest else 0
    if value >= 0:
        return Text(POSITIVE * cells, style="green")
    return Text(NEGATIVE * cells, style="red")


def quantity(result: Attribution) -> str:
    """`logit of ' Mary'` or `logit difference ' Mary' - ' John'`: the tokens' texts `quoted` (a page or a figure
    takes it through `plain`)."""
    if result.foil is None:
        return f"logit of {quoted(result.target.text)}"
    return f"logit difference {quoted(result.target.text)} - {quoted(result.foil.text)}"


def dataset_quantity(result: DatasetAttribution) -> str:
    """As `quantity`; a dataset whose lines differ: each line's."""
    if result.target is None:
        return "logit difference of each line's target - foil" if result.foil_each else "logit of each line's target"
    return quantity(result)


def token_texts(result: Attribution) -> list[str]:
    """The text each token stands for (` Mary`), as the views show them; the vocabulary entries where the result
    has no texts (one built by hand)."""
    return result.token_texts or result.tokens


def position_words(result: Attribution) -> str:
    """`position 13 ' to' (#288)`: the position read, its token's text (`quoted`) and id."""
    where = result.position
    return f"position {where} {quoted(token_texts(result)[where])}{GLUE}(#{result.ids[where]})"


def attribution_lines(result: Attribution, number: int, width: int, top: int) -> list[Text]:
    """The terminal view of one text: what is attributed, the sum check, the top components with bars, a line per
    layer and, with --by head, the layer x head grid. Lines of at most `width` cells."""
    cut = "" if result.read_text is None else \
        f" (as the model read it: {len(result.ids):,} of its {result.untruncated_length:,} tokens)"
    lines = echo(f"text {number}: ", result.read_text or result.text, width, cut)
    lines += words(f"{position_words(result)}: the {quantity(result)} "
                   f"(#{result.target.id}" + (f", #{result.foil.id}" if result.foil else "") + ")", width)
    lines += check_lines(result, width)
    lines += ablation_lines(result, width, "") + sae_lines(result, width, "")
    lines += [Text()] + component_lines(result, width, top, quantity(result))
    return lines + layers_lines(result, width)


def dataset_lines(run: Envelope, width: int, top: int) -> list[Text]:
    """The terminal view of a dataset's run: its prompts, the metric's mean, the sum check, each component's mean
    with its spread, a line per layer and, with --by head, the layer x head grid."""
    result = run.value
    lines = dataset_header(run, width) + ablation_lines(result, width, " (means over the prompts)")
    lines += sae_lines(result, width, ", a mean over the prompts")
    lines += [Text()] + component_lines(result, width, top, dataset_quantity(result), result)
    return lines + layers_lines(result, width)


def layers_lines(result: Attribution, width: int) -> list[Text]:
    """A line per layer and, with --by head, the layer x head grid, each after a blank line."""
    lines = [Text()] + layer_lines(result, width)
    if result.by == "head":
        lines += [Text()] + head_grid_lines(result, width)
    return lines


def dataset_header(run: Envelope, width: int) -> list[Text]:
    """A dataset's prompts, the metric's mean, how a component's mean and spread read, the sum check."""
    result = run.value
    skipped = f" ({run.skipped} bad line{'' if run.skipped == 1 else 's'} skipped)" if run.skipped else ""
    lines = words(f"dataset {run.source}: {run.n} prompt{'' if run.n == 1 else 's'}{skipped}", width,
                  "bold")
    where = "each line's position" if result.position is None else f"position {result.position}"
    ids = "" if result.target is None else \
        f" (#{result.target.id}" + (f", #{result.foil.id}" if result.foil else "") + ")"
    lines += words(f"the {dataset_quantity(result)}{ids} at {where}: mean over the prompts {result.logit:+.4f}", width)
    spread = f"; [low, high]: the 95% bootstrap interval of the mean ({run.resamples} resamples)" \
        if run.resamples else ""
    lines += words(f"each component: its mean over the prompts, std its standard deviation{spread}", width, "dim")
    lines += words(f"sum of the {len(result.components)} means: {result.total:+.4f}; in every prompt the components "
                   f"sum to the model's value (differ by at most {result.worst:.1e})", width)
    return lines


def ablation_lines(result: Attribution, width: int, mean: str) -> list[Text]:
    """With --ablate: what was removed and the model's value with and without it (the components are the ablated
    model's; `mean`: what the values are over a dataset)."""
    if result.ablated is None:
        return []
    return words(f"ablated {ablated_label(result.ablated)}: the model's value {result.logit:+.4f}, "
                 f"{result.unablated:+.4f} with nothing ablated (the ablation moves it by "
                 f"{result.logit - result.unablated:+.4f}){mean}; the components are the ablated model's", width)


def sae_lines(result: Attribution, width: int, mean: str) -> list[Text]:
    """With --sae: each SAE's site and what its features are named among the components."""
    lines = []
    for sae in result.saes:
        active = f"{sae['active']:.1f}" if isinstance(sae["active"], float) else f"{sae['active']}"
        lines += words(f"--sae {sae['path']}: what {sae['site']} holds, split into its features ({sae['label']}#N; "
                       f"{active} active{mean}), the rest of its reconstruction ({sae['label']}.sae_rest) and its "
                       f"error ({sae['label']}.sae_error)", width)
    return lines


def check_lines(result: Attribution, width: int) -> list[Text]:
    """The model's own value beside the sum of the components, so that nobody has to trust the decomposition."""
    before = f" (before the final soft cap at {result.softcap:g})" if result.softcap is not None else ""
    return words(f"model's value{before}: {result.logit:+.4f}; sum of the {len(result.components)} components: "
                 f"{result.total:+.4f} (differ by {abs(result.total - result.logit):.1e})", width)


def component_lines(result: Attribution, width: int, top: int, what: str,
                    dataset: DatasetAttribution | None = None) -> list[Text]:
    """The `top` components by size, with their values (over a `dataset`: their means, with their spread) and
    bars; the rest summed on a line of its own. `what`: the quantity, as the title says it."""
    ranked = sorted(result.components, key=lambda c: -abs(c.value))
    shown_rows, rest = ranked[:top], ranked[top:]
    names = Column.of("component", [c.name for c in shown_rows])
    values = Column.of("mean" if dataset else "value", [f"{c.value:+.4f}" for c in shown_rows], right=True)
    room = width - names.natural_width() - values.natural_width() - 2 * GAP
    largest = max((abs(c.value) for c in shown_rows), default=0.0)
    spread: list[Column] = []
    if dataset is not None:
        stats = [dataset.spread[c.name] for c in shown_rows]
        spread.append(Column.of("std", [f"{std:.4f}" for std, _, _ in stats], right=True))
        if stats and stats[0][1] is not None:  # an interval: the bootstrap ran
            spread.append(Column.of("95% interval", [f"[{low:+.4f}, {high:+.4f}]" for _, low, high in stats],
                                    right=True))
        room -= sum(c.natural_width() + GAP for c in spread)
    bars = Column.of("", [bar(c.value, largest, max(MIN_BAR, min(BAR_WIDTH, room))) for c in shown_rows])
    lines = table([names, values, *spread, bars], width, title=f"the {len(shown_rows)} largest components "
                                                      f"({POSITIVE} raises, {NEGATIVE} lowers the {what})")
    if rest:
        lines += words(f"the other {len(rest)}: {sum(c.value for c in rest):+.4f} in all", width, "dim")
    return lines


def layer_rows(result: Attribution) -> list[tuple[str, float | None, float | None, float]]:
    """The per-layer table of every view, (label, attention, mlp, running total) a row: the embeddings first
    (attention and mlp None), a row per layer (what its attention, heads and bias, and its MLP, all of it, write;
    None where no component is left there: an --sae on a residual site holds it), an --sae's parts on a residual
    site (features, rest and error: every write up to the site) on a row of their own labelled by the site
    (L5.resid_post after layer 5, L5.resid_pre before it), the biases of the final norm and the unembedding last,
    where the model has them."""
    attention, mlp = layer_sums(result)
    present = {(c.layer, c.in_mlp) for c in result.components if c.layer is not None}
    residual = {}  # an --sae on a residual site: its label -> its parts' sum
    for c in result.components:
        found = RESIDUAL_SAE.match(c.name)
        if found and c.layer is None:
            residual[found[1]] = residual.get(found[1], 0.0) + c.value
    after = sum(c.value for c in result.components if c.name in FINAL_BIASES)
    before = sum(c.value for c in result.components if c.layer is None) - after - sum(residual.values())
    rows: list[tuple[str, float | None, float | None, float]] = [("embeddings", None, None, before)]

    def sae_rows(layer: int, point: tuple[str, ...]) -> None:
        for label, value in residual.items():
            if label.startswith(f"L{layer}.") and label.split(".")[1] in point:
                rows.append((label, None, None, rows[-1][3] + value))

    for layer in range(result.layers):
        sae_rows(layer, ("resid_pre",))
        rows.append((str(layer), attention[layer] if (layer, False) in present else None,
                     mlp[layer] if (layer, True) in present else None,
                     rows[-1][3] + attention[layer] + mlp[layer]))
        sae_rows(layer, ("resid_mid", "resid_post"))
    if any(c.name in FINAL_BIASES for c in result.components):
        rows.append(("biases", None, None, rows[-1][3] + after))
    return rows


def layer_lines(result: Attribution, width: int) -> list[Text]:
    """A line per layer (`layer_rows`): what its attention and its MLP write, and the running total."""
    rows = layer_rows(result)

    def cell(value: float | None) -> str:
        return "" if value is None else f"{value:+.4f}"

    columns = [Column.of("layer", [label for label, *_ in rows]),
               Column.of("attention", [cell(a) for _, a, _, _ in rows], right=True),
               Column.of("mlp", [cell(m) for _, _, m, _ in rows], right=True),
               Column.of("running total", [cell(t) for *_, t in rows], right=True)]
    return table(columns, width, title="per layer")


def head_grid_lines(result: Attribution, width: int) -> list[Text]:
    """The layer x head grid of the heads' values (--by head), paged by heads when it does not fit."""
    heads = {(c.layer, c.head): c.value for c in result.components if c.head is not None}
    layers = sorted({layer for layer, _ in heads})
    columns = [Column.of("layer", [str(layer) for layer in layers])]
    for head in range(result.heads):
        columns.append(Column.of(f"H{head}", [f"{heads[(layer, head)]:+.2f}" if (layer, head) in heads else ""
                                              for layer in layers], right=True))
    return table(columns, width, title="each head (rows: layers)",
                 page_note=lambda page: f"heads {page[0].header[1:]}-{page[-1].header[1:]}")


def record(result: Attribution) -> dict[str, Any]:
    """The attribute JSON Lines record: text, ids, tokens, position, target, foil, logit (the model's own value),
    total (the sum of the components), components. A dataset's: dataset_record."""
    return {"text": result.text, "ids": result.ids, "tokens": result.tokens, "position": result.position,
            "target": {"token": result.target.token, "id": result.target.id},
            "foil": {"token": result.foil.token, "id": result.foil.id} if result.foil is not None else None,
            "logit": result.logit, "total": result.total,
            "components": [{"name": c.name, "layer": c.layer, "head": c.head, "neuron": c.neuron, "value": c.value}
                           for c in result.components]} | ablation_record(result) | \
        ({"saes": result.saes} if result.saes else {})


def ablation_record(result: Attribution) -> dict[str, Any]:
    """With --ablate: `ablated` (the specs as given) and `logit_unablated` (the model's value with nothing ablated;
    `logit` is the ablated model's); nothing without it."""
    return {} if result.ablated is None else {"ablated": result.ablated, "logit_unablated": result.unablated}


def dataset_record(run: Envelope) -> dict[str, Any]:
    """The aggregate's record: a single run's keys where they apply (position, target, foil: null where the lines
    differ; logit: the mean of the model's values; total: the sum of the means) and dataset, n, prompts, skipped,
    bootstrap, worst (the largest |sum of the components - model's value| of a prompt), interrupted, components
    as {name, layer, head, neuron, mean, std, low, high} (low, high: null with --bootstrap 0)."""
    result = run.value
    return {"dataset": run.source, "n": run.n, "prompts": run.total, "skipped": run.skipped,
            "bootstrap": run.resamples, "interrupted": run.interrupted, "position": result.position,
            "target": {"token": result.target.token, "id": result.target.id} if result.target is not None else None,
            "foil": {"token": result.foil.token, "id": result.foil.id} if result.foil is not None else None,
            "logit": result.logit, "total": result.total, "worst": result.worst,
            "components": [{"name": c.name, "layer": c.layer, "head": c.head, "neuron": c.neuron, "mean": c.value,
                            "std": result.spread[c.name][0], "low": result.spread[c.name][1],
                            "high": result.spread[c.name][2]} for c in result.components]} | \
        ablation_record(result) | ({"saes": result.saes} if result.saes else {})


def page_section(result: Attribution, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """One text of `attribute` for the --report page (tfcli/commands/attribute/report.js draws it): the record, and
    what the terminal shows that the page shows too: `top` (the run's --top, the components listed),
    `per_layer` (`layer_rows`, as {label, attention, mlp, total}) and `tokens_shown` (the text each token stands
    for, as the view shows them; `tokens` keeps the vocabulary entries)."""
    return record(result) | page_parts(result, quantity(result))


def dataset_page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A dataset's run for the page: as one text's, with what the view says above the lists (`header`), each
    component's value its mean."""
    result = run.value
    section = dataset_record(run)
    section.update(header=[line.plain for line in dataset_header(run, 10**6)],
                   components=[c | {"value": c["mean"]} for c in section["components"]])
    return section | page_parts(result, dataset_quantity(result))


def page_parts(result: Attribution, what: str) -> dict[str, Any]:
    """What the page shows besides the record: the quantity (`what`), the grid's shape, --top, the tokens shown
    and the per-layer rows."""
    return dict(quantity=plain(what), by=result.by, layers=result.layers, heads=result.heads, softcap=result.softcap,
                top=result.top, tokens_shown=token_texts(result),
                per_layer=[{"label": label, "attention": a, "mlp": m, "total": t}
                           for label, a, m, t in layer_rows(result)])


def layer_sums(result: Attribution) -> tuple[list[float], list[float]]:
    """What each layer's attention (heads and bias) and MLP (all of it, neurons included) write."""
    attention, mlp = [0.0] * result.layers, [0.0] * result.layers
    for c in result.components:
        if c.layer is not None:
            (mlp if c.in_mlp else attention)[c.layer] += c.value
    return attention, mlp


def figure(result: Attribution, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """The figure of one text: each layer's attention and MLP as bars (and, with --by head, the layer x head
    heatmap), on one diverging scale: blue raises, red lowers the quantity."""
    return bars_figure(result, run, f"{quantity(result)} at {position_words(result)} of {result.text!r}",
                       (None, None), "")


def dataset_figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A dataset's figure: as one text's, of the components' means, with their standard deviations as error
    bars."""
    result = done.value
    return bars_figure(result, run, f"{dataset_quantity(result)}, each component's mean over the {done.n} prompts "
                       f"of {done.source} (error bars: the standard deviation over the prompts)",
                       result.layer_std, "mean ")


def bars_figure(result: Attribution, run: RunInfo, subject: str, errors: tuple, mean: str) -> Figure:
    """The bars of each layer's attention and MLP (error bars `errors`, per layer: None for none) and the head
    grid, captioned with `subject`; `mean`: how the title calls the values ("mean " over a dataset)."""
    import matplotlib
    import numpy as np

    from tfcli.render.figure import blank_figure, caption

    attention, mlp = layer_sums(result)
    grid_rows = result.by == "head"
    height = 2.6 + (0.3 * result.layers + 0.9 if grid_rows else 0)
    figure = blank_figure(max(5.0, 0.32 * result.layers + 1.6), height + 1.0)
    caption(figure, plain(f"tfcli attribute: {subject}"), run)
    grid = figure.add_gridspec(2 if grid_rows else 1, 1, height_ratios=[2.6, 0.3 * result.layers + 0.9]
                               if grid_rows else [1])
    bars = figure.add_subplot(grid[0])
    x = np.arange(result.layers)
    bars.bar(x - 0.2, attention, 0.4, label="attention", color="#2171b5", yerr=errors[0], error_kw={"linewidth": 0.6})
    bars.bar(x + 0.2, mlp, 0.4, label="MLP", color="#e6550d", yerr=errors[1], error_kw={"linewidth": 0.6})
    bars.axhline(0, color="0.3", linewidth=0.6)
    bars.set_xticks(x)
    bars.set_xlabel("layer")
    bars.set_ylabel("direct contribution")
    bars.legend(fontsize=6, frameon=False)
    bars.set_title(f"{mean}model's value {result.logit:+.4f}; sum of the {len(result.components)} {mean}components "
                   f"{result.total:+.4f}", fontsize=7)
    if grid_rows:
        values = np.full((result.layers, result.heads), np.nan)
        for c in result.components:
            if c.head is not None:
                values[c.layer, c.head] = c.value
        largest = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
        ax = figure.add_subplot(grid[1])
        image = ax.imshow(values, cmap=matplotlib.colormaps["RdBu"], vmin=-largest or -1, vmax=largest or 1,
                          aspect="auto", interpolation="nearest")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(result.heads))
        ax.set_yticks(range(result.layers))
        figure.colorbar(image, ax=ax, label="direct contribution (blue raises, red lowers)")
    return figure
