"""`tfcli saliency` output: the text with each token shaded by its share of the attributions (in colour; plain
numbers beside each token without it), the largest attributions, the completeness delta, the faithfulness curves;
over a dataset, each aligned position's mean share with its spread. The JSON Lines record, and for --report the
page's section (`page_section`, drawn by tfcli/commands/saliency/report.js) and the figure (`figure`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import (GLUE, SPACE_NOTE, Column, echo, has_space, plain, quoted, table, token_label, words,
                                 wrap)
from tfcli.commands.saliency.core import (METHODS, ContinuationSaliency, DatasetSaliency, KindShare, PositionShare,
                                          Saliency, SaliencyOptions)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.analysis.dataset import Envelope
    from tfcli.tokenizer import Tokenizer

DEFAULT_TOP = 10
# |share| relative to the largest: (lowest, background for a positive, for a negative); below the last, none
# |share| / the text's largest at least this -> the token's style: white on the two darkest backgrounds (black there
# reads at a contrast of about 4:1, white at 5:1), black on the others
SHADES = ((0.8, "white on color(27)", "white on color(160)"), (0.6, "black on color(69)", "black on color(203)"),
          (0.4, "black on color(111)", "black on color(210)"), (0.2, "black on color(153)", "black on color(217)"),
          (0.05, "black on color(195)", "black on color(224)"))
NAMES = dict(zip(METHODS, ("integrated gradients", "gradient (L2 norm)", "input x gradient", "occlusion",
                           "attention rollout")))
BAR, LOWERS = "█", "▒"  # a bar that raises the metric, one that lowers it: told apart without colour too
BARS_NOTE = f"{BAR} raises, {LOWERS} lowers the metric"


def bar(value: float, largest: float) -> Text:
    """A bar of up to 16 cells, its glyph and colour by its sign."""
    return Text((BAR if value >= 0 else LOWERS) * (round(abs(value) / largest * 16) if largest else 0),
                style="blue" if value >= 0 else "red")


def offset_tokens(column: PositionShare) -> str:
    """The token at an aligned offset: the one every text has there, else the two commonest with their counts and
    how many others (`'the' 2, 'a' 1`)."""
    if column.token is not None:
        return quoted(column.token).replace(GLUE, " ")
    shown = ", ".join(f"{quoted(token).replace(GLUE, ' ')} {count}" for token, count in column.tokens[:2])
    rest = len(column.tokens) - 2
    return shown + (f", {rest} other{'s' if rest > 1 else ''}" if rest > 0 else "")


def method_words(options: SaliencyOptions) -> str:
    """`integrated gradients (32 steps, Gauss-Legendre) at embed from zero token embeddings`."""
    name = NAMES[options.method]
    if options.method == "integrated-gradients":
        rule = "Gauss-Legendre" if options.integration == "gausslegendre" else "Riemann trapezoid"
        name += f" ({options.steps} steps, {rule})"
    if options.method != "attention-rollout":
        name += f" at {options.site}"
    return name + f"; baseline: {baseline_words(options.baseline)}"


def baseline_words(baseline: str | None) -> str:
    if baseline is None:
        return "each line's own"
    return {"zero": "zero token embeddings", "pad": "the pad token", "mask": "the mask token"}.get(
        baseline, f"the text {baseline!r}") + (", special tokens kept" if baseline in ("zero", "pad", "mask") else "")


def quantity(result: Saliency | DatasetSaliency) -> str:
    """`the logit difference ' Mary' - ' John'`, `the logit of label positive`, `the norm of the mean-pooled output`;
    tokens `quoted`."""
    if result.metric == "pooled norm":
        return "the norm of the mean-pooled output"
    target, foil = result.target, result.foil
    label = result.metric.startswith("label")
    kind = "log-probability" if result.metric.endswith("logprob") else "logit"

    def name(token) -> str:
        return f"label {token.text}" if label else quoted(token.text)
    if target is None:
        return f"the {kind} (difference) of each text's own target"
    return f"the {kind} of {name(target)}" if foil is None else \
        f"the {kind} difference {name(target)} - {name(foil)}"


def shade(share: float, largest: float) -> str:
    """The background of a token whose share is `share`, the largest |share| of the text being `largest`."""
    level = abs(share) / largest if largest else 0.0
    for lowest, positive, negative in SHADES:
        if level >= lowest:
            return positive if share >= 0 else negative
    return ""


def token_items(result: Saliency, color: bool) -> list[Text]:
    """Each token as it is shown: shaded by its share (colour), or with its attribution beside it (plain)."""
    shares = result.shares
    largest = max(map(abs, shares), default=0.0)
    items = []
    for label, value, share, special in zip(map(token_label, result.token_texts), result.attributions, shares,
                                            result.special):
        if color:
            items.append(Text(label, style=shade(share, largest) or ("dim" if special else "")))
        else:
            items.append(Text(f"{label} {value:+.3f}", style="dim" if special else ""))
    return items


def saliency_lines(result: Saliency, number: int, width: int, color: bool, top: int = DEFAULT_TOP) -> list[Text]:
    """The terminal view of one text (the `number`th shown), lines of at most `width` cells."""
    lines = echo(f"text {number}: ", result.text, width)
    lines += words(method_words(result.options), width)
    lines += words(f"{quantity(result)}{where(result)}: {result.value:+.4f} on the text, {result.baseline_value:+.4f} "
                   "on the baseline", width)
    if result.delta is not None:
        lines += words(f"the attributions sum to {result.total:+.4f}; f(text) - f(baseline) = "
                       f"{result.value - result.baseline_value:+.4f}; completeness delta {result.delta:+.2e}" +
                       (" (small: the attributions account for the change)" if result.delta_advice is None else
                        " (large)"), width)
        if result.delta_advice is not None:
            lines += words(f"the delta is large: {result.delta_advice}", width, "yellow")
    lines.append(Text())
    lines += wrap(token_items(result, color), width, sep=" " if color else "  ")
    note = ("shade: blue raises, red lowers the metric; the darker, the larger the share" if color else
            "each token's attribution beside it")
    lines += words(note + ("; " + SPACE_NOTE if has_space([token_label(t) for t in result.token_texts]) else ""),
                   width, "dim")
    lines += [Text()] + top_lines(result, width, top)
    if result.curves is not None:
        lines += [Text()] + curve_lines(result, width)
    return lines


def where(result: Saliency) -> str:
    if result.position is None:
        return ""
    return f" at position {result.position} {quoted(result.token_texts[result.position])}{GLUE}" \
        f"(#{result.ids[result.position]})"


def top_lines(result: Saliency, width: int, top: int) -> list[Text]:
    """The `top` largest |attributions|: position, token, attribution, share of the absolute sum, bar."""
    shares = result.shares
    ranked = sorted(range(len(result.ids)), key=lambda p: -abs(result.attributions[p]))[:top]
    largest = max((abs(shares[p]) for p in ranked), default=0.0)
    bars = [bar(shares[p], largest) for p in ranked]
    columns = [Column.of("position", [str(p) for p in ranked], right=True),
               Column.of("token", [quoted(result.token_texts[p]).replace(GLUE, " ") for p in ranked]),
               Column.of("attribution", [f"{result.attributions[p]:+.4f}" for p in ranked], right=True),
               Column.of("share", [f"{shares[p]:+.1%}" for p in ranked], right=True),
               Column.of("", bars)]
    return table(columns, width, title=f"the {len(ranked)} largest |attributions| (share: of their absolute sum; "
                 f"{BARS_NOTE})")


def curve_lines(result: Saliency, width: int) -> list[Text]:
    """--faithfulness: the areas against the random orders, and the curves as a table (a row per token replaced)."""
    curves = result.curves
    areas = curves.areas
    lines = words("faithfulness: the metric as the most attributed tokens are replaced by the baseline's first "
                  "(deletion) or restored first (insertion), against the mean of random orders", width, "bold")
    lines += words(f"deletion area {areas['deletion']:+.4f} (random {areas['random_deletion']:+.4f}): lower is more "
                   f"faithful; insertion area {areas['insertion']:+.4f} (random {areas['random_insertion']:+.4f}): "
                   "higher is more faithful", width)
    order = [""] + [quoted(result.token_texts[p]).replace(GLUE, " ") for p in curves.order]
    columns = [Column.of("tokens", [str(k) for k in range(len(order))], right=True),
               Column.of("position", [""] + [str(p) for p in curves.order], right=True),
               Column.of("deleted/restored", order)]
    columns += [Column.of(header, [f"{v:+.4f}" for v in getattr(curves, name)], right=True)
                for header, name in (("deletion", "deletion"), ("random", "random_deletion"),
                                     ("insertion", "insertion"), ("random", "random_insertion"))]
    return lines + table(columns, width)


def dataset_lines(run: Envelope, width: int, color: bool, after_texts: bool = False) -> list[Text]:
    """The run's aggregate: what was run, the mean metric, each aligned position's mean share, |delta|,
    faithfulness; `after_texts`: after the texts' own views, a blank line first."""
    result, resamples = run.value, run.resamples
    lines = [Text()] if after_texts else []
    skipped = f" ({run.skipped} bad line{'' if run.skipped == 1 else 's'} skipped)" if run.skipped else ""
    what = f"dataset {run.source}" if run.source else "the texts"
    lines += words(f"{what}: {run.n} text{'' if run.n == 1 else 's'}{skipped}", width, "bold")
    lines += words(method_words(result.options), width)
    lines += words(f"{quantity(result)}: mean over the texts {result.value:+.4f}", width)
    if result.delta_mean is not None:
        lines += words(f"completeness: mean |delta| {result.delta_mean:.2e}, largest {result.delta_worst:.2e}", width)
    interval = f"; [low, high]: the 95% bootstrap interval of the mean ({resamples} resamples)" \
        if resamples else ""
    lines += [Text()] + words("each position, counted back from the one read (0), as far as every text reaches: "
                              f"the mean share of the attributions' absolute sum{interval}; token: the one there, "
                              f"or the commonest with their texts; {BARS_NOTE}", width, "dim")
    lines += table([Column.of("offset", [str(c.offset) for c in result.columns], right=True),
                    Column.of("token", [offset_tokens(c) for c in result.columns]),
                    *share_columns(result.columns, resamples)], width)
    lines += [Text()] + words("each kind of token: its tokens' shares summed in each text (0 where a text has none), "
                              "their mean over the texts; target and foil: the metric's tokens where the text has "
                              "them, read: the position read", width, "dim")
    lines += table([Column.of("kind", [k.kind for k in result.kinds]),
                    Column.of("texts", [str(k.texts) for k in result.kinds], right=True),
                    *share_columns(result.kinds, resamples)], width)
    if result.areas is not None:
        rows = [("deletion", "lower is more faithful"), ("random_deletion", ""),
                ("insertion", "higher is more faithful"), ("random_insertion", "")]
        columns = [Column.of("area", [name.replace("_", " ") for name, _ in rows]),
                   Column.of("mean", [f"{result.areas[name][0]:+.4f}" for name, _ in rows], right=True),
                   Column.of("std", [f"{result.areas[name][1]:.4f}" for name, _ in rows], right=True)]
        if resamples:
            columns.append(Column.of("95% interval", [f"[{result.areas[name][2]:+.4f}, {result.areas[name][3]:+.4f}]"
                                                      for name, _ in rows], right=True))
        columns.append(Column.of("", [note for _, note in rows]))
        lines += [Text()] + table(columns, width, title="faithfulness: the areas under the curves")
        lines += words(f"the deletion area is below the random one in {result.deletion_beats_random} of "
                       f"{run.n} texts", width)
    return lines


def share_columns(rows: list[PositionShare] | list[KindShare], resamples: int) -> list[Column]:
    """The columns of mean shares (an aligned position's or a kind's): mean, std, the 95% interval with resamples,
    and a bar (blue: raises the metric, red: lowers it)."""
    largest = max((abs(r.mean) for r in rows), default=0.0)
    columns = [Column.of("mean share", [f"{r.mean:+.1%}" for r in rows], right=True),
               Column.of("std", [f"{r.std:.1%}" for r in rows], right=True)]
    if resamples:
        columns.append(Column.of("95% interval", [f"[{r.low:+.1%}, {r.high:+.1%}]" for r in rows], right=True))
    return columns + [Column.of("", [bar(r.mean, largest) for r in rows])]


def continuation_lines(result: ContinuationSaliency, number: int, width: int) -> list[Text]:
    """A continuation's matrix: a row per token of it (its metric at the position before it), a column per token read
    (paged by columns when it does not fit), with each row's value and, for integrated gradients, its delta."""
    lines = echo(f"text {number}: ", result.text, width) + echo("continuation: ", result.continuation, width)
    lines += words(method_words(result.options), width)
    kind = "log-probability" if result.metric == "logprob" else "logit"
    lines += words(f"each row: a token of the continuation, the attributions of its {kind} at the position before it "
                   "to the tokens before it (columns: position and token)", width, "dim")
    deltas = [abs(row.delta) for row in result.rows if row.delta is not None]
    if deltas:
        lines += words(f"completeness: the largest |delta| of a row {max(deltas):.2e}", width)
    rows = result.rows
    columns = [Column.of("token", [quoted(result.token_texts[result.start + k]).replace(GLUE, " ")
                                   for k in range(len(rows))]),
               Column.of(kind, [f"{row.value:+.4f}" for row in rows], right=True)]
    for p in range(len(result.ids) - 1):
        columns.append(Column.of(f"{p}\n{token_label(result.token_texts[p])}",
                                 [f"{row.attributions[p]:+.3f}" if p < len(row.attributions) else ""
                                  for row in rows], right=True))
    def positions(page: list[Column]) -> str:
        return f"positions {page[0].header.split(chr(10))[0]}-{page[-1].header.split(chr(10))[0]}"
    lines += [Text()] + table(columns, width, keys=2, page_note=positions)
    if has_space([token_label(t) for t in result.token_texts]):
        lines += words(SPACE_NOTE, width, "dim")
    return lines


def token_record(token) -> dict[str, Any] | None:
    return None if token is None else {"token": token.token, "id": token.id, "text": token.text}


def options_record(options: SaliencyOptions) -> dict[str, Any]:
    gradients = options.method == "integrated-gradients"
    return {"method": options.method, "site": options.site if options.method != "attention-rollout" else None,
            "baseline": options.baseline, "steps": options.steps if gradients else None,
            "integration": options.integration if gradients else None}


def record(result: Saliency) -> dict[str, Any]:
    """A text's JSON Lines record (docs/commands.md, saliency; a continuation's: continuation_record, a dataset's
    aggregate: dataset_record)."""
    curves = result.curves
    return {"text": result.text, "ids": result.ids, "tokens": result.tokens, "token_texts": result.token_texts,
            "spans": result.spans, "special": result.special, **options_record(result.options),
            "metric": result.metric, "target": token_record(result.target), "foil": token_record(result.foil),
            "position": result.position, "value": result.value, "baseline_value": result.baseline_value,
            "attributions": result.attributions, "total": result.total, "delta": result.delta,
            "delta_advice": result.delta_advice,
            "faithfulness": None if curves is None else {
                "order": curves.order, "deletion": curves.deletion, "insertion": curves.insertion,
                "random_deletion": curves.random_deletion, "random_insertion": curves.random_insertion,
                "areas": curves.areas}}


def continuation_record(result: ContinuationSaliency) -> dict[str, Any]:
    """A continuation's record: the text's and the continuation's ids and tokens, where the continuation starts, and
    a row per token of it: its target, position, value, baseline_value, attributions (one per token before it), total
    and delta."""
    return {"text": result.text, "continuation": result.continuation, "ids": result.ids, "tokens": result.tokens,
            "token_texts": result.token_texts, "start": result.start, **options_record(result.options),
            "metric": result.metric,
            "rows": [{"target": token_record(row.target), "position": row.position, "value": row.value,
                      "baseline_value": row.baseline_value, "attributions": row.attributions, "total": row.total,
                      "delta": row.delta} for row in result.rows]}


def dataset_record(run: Envelope) -> dict[str, Any]:
    spread, result = ("mean", "std", "low", "high"), run.value
    return {"dataset": run.source, "n": run.n, "texts": run.total, "skipped": run.skipped,
            "bootstrap": run.resamples, "interrupted": run.interrupted, **options_record(result.options),
            "metric": result.metric, "target": token_record(result.target), "foil": token_record(result.foil),
            "value": result.value,
            "columns": [{"offset": c.offset, "token": c.token, "tokens": [list(t) for t in c.tokens], "mean": c.mean,
                         "std": c.std, "low": c.low, "high": c.high} for c in result.columns],
            "kinds": [{"kind": k.kind, "texts": k.texts, "mean": k.mean, "std": k.std, "low": k.low, "high": k.high}
                      for k in result.kinds],
            "delta_mean": result.delta_mean, "delta_worst": result.delta_worst,
            "faithfulness": None if result.areas is None else {
                "areas": {name: dict(zip(spread, values)) for name, values in result.areas.items()},
                "deletion_beats_random": result.deletion_beats_random}}


def page_section(result: Saliency, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A text's --report section: the record, its shares, and the sentences the terminal writes above the numbers
    (`header`), so that the page says what they are without wording of its own."""
    header = [plain(f"{method_words(result.options)}"),
              plain(f"{quantity(result)}{where(result)}: {result.value:+.4f} on the text, "
                    f"{result.baseline_value:+.4f} on the baseline")]
    if result.delta is not None:
        header.append(f"the attributions sum to {result.total:+.4f}; completeness delta {result.delta:+.2e}")
        if result.delta_advice is not None:
            header.append(f"the delta is large: {result.delta_advice}")
    return record(result) | {"shares": result.shares, "header": header, "quantity": plain(quantity(result))}


def continuation_page_section(result: ContinuationSaliency, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A continuation's section: its record and the lines the terminal writes above its matrix."""
    header = [line.plain for line in continuation_lines(result, 1, 10**6)[2:5]]
    return continuation_record(result) | {"header": header, "quantity": ""}


def dataset_page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The aggregate's section: its record and the lines the terminal writes above its table."""
    header = [line.plain for line in dataset_lines(run, 10**6, False)[:4]]
    return dataset_record(run) | {"header": header, "quantity": plain(quantity(run.value))}


def figure(result: Saliency, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A text's attributions as bars under its tokens (blue raises, red lowers the metric) and, with
    --faithfulness, the deletion and insertion curves against the random ones."""
    return bars_figure(run, ([token_label(t) for t in result.token_texts], result.attributions, None),
                       plain(f"tfcli saliency: {quantity(result)}{where(result)} of {result.text!r}; "
                             f"{method_words(result.options)}"), "attribution", result.curves)


def dataset_figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A dataset's mean shares per aligned position, with their intervals."""
    import numpy as np

    result = done.value
    labels = [f"{c.offset}\n{'' if c.token is None else token_label(c.token)}" for c in result.columns]
    errors = None if not done.resamples else \
        np.array([[c.mean - c.low for c in result.columns], [c.high - c.mean for c in result.columns]])
    return bars_figure(run, (labels, [c.mean for c in result.columns], errors),
                       plain(f"tfcli saliency: the mean share of each aligned position over the {done.n} texts of "
                             f"{done.source or 'the run'} ({quantity(result)}); {method_words(result.options)}"),
                       "mean share of |attributions|", rotation=0)


def bars_figure(run: RunInfo, bars_of: tuple[list[str], list[float], Any], title: str, ylabel: str,
                curves: Any = None, rotation: int = 90) -> Figure:
    """Bars (labels, turned by `rotation`; values; error bars or None) captioned with `title`, and a text's
    faithfulness `curves` under them where it has them."""
    import numpy as np

    from tfcli.render.figure import blank_figure, caption

    labels, values, errors = bars_of
    figure = blank_figure(max(5.0, 0.32 * len(labels) + 1.6), 3.2 + (2.4 if curves is not None else 0))
    caption(figure, title, run)
    grid = figure.add_gridspec(2 if curves is not None else 1, 1)
    bars = figure.add_subplot(grid[0])
    x = np.arange(len(labels))
    bars.bar(x, values, 0.7, color=["#2171b5" if v >= 0 else "#cb181d" for v in values], yerr=errors,
             error_kw={"linewidth": 0.6})
    bars.axhline(0, color="0.3", linewidth=0.6)
    bars.set_xticks(x, labels, rotation=rotation, fontsize=6)
    bars.set_ylabel(ylabel)
    if curves is not None:
        ax = figure.add_subplot(grid[1])
        share = np.linspace(0, 1, len(curves.deletion))
        for name, style, colour in (("deletion", "-", "#cb181d"), ("random_deletion", "--", "#cb181d"),
                                    ("insertion", "-", "#2171b5"), ("random_insertion", "--", "#2171b5")):
            ax.plot(share, getattr(curves, name), style, color=colour, linewidth=1,
                    label=f"{name.replace('_', ' ')} (area {curves.areas[name]:+.3f})")
        ax.set_xlabel("share of the tokens replaced (deletion) or restored (insertion), most attributed first")
        ax.set_ylabel("metric")
        ax.legend(fontsize=6, frameon=False)
    return figure


def continuation_figure(result: ContinuationSaliency, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A continuation's matrix as a heatmap: a row per token of the continuation, a column per token read, on one
    diverging scale (blue raises, red lowers the row's metric); blank where a row reads no further."""
    import matplotlib
    import numpy as np

    from tfcli.render.figure import blank_figure, caption

    columns = len(result.ids) - 1
    values = np.full((len(result.rows), columns), np.nan)
    for k, row in enumerate(result.rows):
        values[k, :len(row.attributions)] = row.attributions
    largest = float(np.nanmax(np.abs(values))) or 1.0
    figure = blank_figure(max(5.0, 0.32 * columns + 2.0), max(3.0, 0.3 * len(result.rows) + 2.2))
    caption(figure, plain(f"tfcli saliency: {method_words(result.options)}; each token of the continuation "
                          f"{result.continuation!r} (rows) from the tokens before it (columns)"), run)
    ax = figure.add_subplot()
    image = ax.imshow(values, cmap=matplotlib.colormaps["RdBu"], vmin=-largest, vmax=largest, aspect="auto",
                      interpolation="nearest")
    ax.set_xticks(range(columns), [token_label(t) for t in result.token_texts[:columns]], rotation=90, fontsize=6)
    ax.set_yticks(range(len(result.rows)), [token_label(t) for t in result.token_texts[result.start:]], fontsize=6)
    figure.colorbar(image, ax=ax, label="attribution (blue raises, red lowers)")
    return figure
