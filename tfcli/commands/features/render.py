"""`tfcli features`: a text's features per token and the SAE's error (or a feature's activation on every token), and
the aggregate over texts (the error's means, a feature's top activating contexts): terminal views that never cut a
token or a number, JSON Lines records, --report page sections and figures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.commands.features.core import CorpusFeatures, Direct, Losses, Several, TextFeatures
from tfcli.render.layout import SPACE_NOTE, Column, echo, has_space, plain, table, token_label, words, wrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.render.run_info import RunInfo
    from tfcli.analysis.dataset import Envelope
    from tfcli.tokenizer import Tokenizer

SHADES = ((0.8, "white on color(27)"), (0.6, "black on color(69)"), (0.4, "black on color(111)"),
          (0.2, "black on color(153)"), (1e-9, "black on color(195)"))


def number(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def sae_words(sae: dict[str, Any]) -> str:
    """`SAE sae/ (SAELens standard, 64 features) reads blocks.1.resid_post (its hook blocks.1.hook_resid_post)`."""
    kind = sae["architecture"].replace("_", " ") + (f", k = {sae['k']}" if sae["k"] else "")
    head = f", head {sae['head']}" if sae["head"] is not None else ""
    what = f"reads {sae['site']}{head}" + (f" and stands for {sae['site_out']}" if sae["site_out"] else "")
    hooks = sae["hook"] + (f" -> {sae['hook_out']}" if sae["hook_out"] else "")
    return f"SAE {sae['path']} ({sae['format']} {kind}, {sae['d_sae']} features) {what} (its hook {hooks})"


def loss_words(losses: Losses) -> list[str]:
    recovered = losses.recovered
    return [f"next-token loss over {losses.count} positions: clean {losses.clean:.4f}; spliced {losses.spliced:.4f} "
            f"({losses.spliced - losses.clean:+.4f}); with the error term {losses.with_error:.4f}; zeroed "
            f"{losses.zero:.4f}",
            ("loss recovered n/a (zeroing changes nothing)" if recovered is None else
             f"loss recovered {recovered:.1%}") + f"; KL(clean || spliced) {losses.kl:.4f} per position, "
            f"with the error term {losses.kl_with_error:.2e}"]


WHY = {"first": "position 0", "special": "special tokens", "outlier": "outliers (norm over 10x the text's median)"}


def left_out_words(left_out: dict[str, int], every_token: bool, positions: list[int] | None = None) -> str:
    """What the figures left out and how to have it measured: `left out of the figures: position 0, 1 special
    token ...`."""
    if every_token:
        return "every token measured (--all-tokens): position 0, special tokens and outliers included"
    if not left_out:
        return "no token left out of the figures (position 0, special tokens and outliers would be)"
    parts = [WHY[why] if why == "first" and left_out[why] == 1 else
             f"{WHY[why]} ({left_out[why]}{' texts' if why == 'first' else ''})" for why in WHY if left_out.get(why)]
    where = f" (position{'s' if len(positions) > 1 else ''} {', '.join(map(str, positions))})" if positions else ""
    return (f"left out of the figures, as sae train leaves them out: {', '.join(parts)}{where}; --all-tokens "
            "measures them")


def counts(left_out: dict[int, str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for why in left_out.values():
        found[why] = found.get(why, 0) + 1
    return found


def shade(value: float, largest: float) -> str:
    level = value / largest if largest > 0 else 0.0
    return next((style for lowest, style in SHADES if level >= lowest), "")


def activation_items(result: TextFeatures, color: bool) -> list[Text]:
    """Each token shaded by the feature's activation (colour), or with the activation beside it where active."""
    largest = max(result.activations, default=0.0)
    items = []
    for label, value in zip(map(token_label, result.tokens), result.activations):
        if color:
            items.append(Text(label, style=shade(value, largest)))
        else:
            items.append(Text(f"{label} {value:.3f}" if value > 0 else label))
    return items


def features_lines(result: TextFeatures, number_shown: int, width: int, color: bool,
                   echoed: bool = True) -> list[Text]:
    """The terminal view of one text (the `number_shown`th), lines of at most `width` cells (`echoed`: the text
    first)."""
    lines = echo(f"text {number_shown}: ", result.text, width) if echoed else []
    lines += words(sae_words(result.sae), width)
    if result.feature is not None:
        return lines + [Text()] + feature_text_lines(result, width, color)
    n, measured = len(result.ids), result.measured
    m = max(len(measured), 1)
    cosines = [result.cosine[p] for p in measured if result.cosine[p] is not None]
    lines += words(f"error at the site: MSE {sum(result.mse[p] for p in measured) / m:.4g} per value (mean over "
                   f"tokens); explained variance {number(result.explained_text)} (the text's tokens together); cosine "
                   f"{number(sum(cosines) / len(cosines) if cosines else None)}; L0 "
                   f"{sum(result.l0[p] for p in measured) / m:.1f} (means over tokens)", width)
    lines += words(left_out_words(counts(result.left_out), result.every_token, [p for p in sorted(result.left_out) if p]),
                   width, "dim")
    if result.losses is not None:
        for sentence in loss_words(result.losses):
            lines += words(sentence, width)
    else:
        lines += words("no next-token loss: the model is not a decoder with an LM head", width, "dim")
    if result.direct is not None:
        lines += [Text()] + direct_lines(result.direct, result.tokens, width)
    columns = [Column.of("position", [f"{p}*" if p in result.left_out else str(p) for p in range(n)], right=True),
               Column.of("token", [token_label(t) for t in result.tokens]),
               Column.of("L0", [str(v) for v in result.l0], right=True),
               Column.of("MSE", [f"{v:.3g}" for v in result.mse], right=True),
               Column.of("EV", [number(v, 3) for v in result.explained], right=True),
               Column.of("cos", [number(v, 3) for v in result.cosine], right=True)]
    if result.kl is not None:
        columns.append(Column.of("KL", [f"{v:.3g}" for v in result.kl], right=True))
    columns.append(Column("top features (index:activation)",
                          [[Text(f"{i}:{v:.3g}") for i, v in top] or [Text("none active", style="dim")]
                           for top in result.top]))
    lines += [Text()] + table(columns, width, keys=2)
    lines += words(("*: left out of the figures above, neither measured nor spliced; " if result.left_out else "") +
                   "EV: explained variance against the mean of the text's measured tokens at the site; KL: the clean "
                   "next-token distribution's divergence from the spliced one" +
                   ("; " + SPACE_NOTE if has_space([token_label(t) for t in result.tokens]) else ""), width, "dim")
    return lines


def metric_words(direct: Direct) -> str:
    target = repr(direct.target.text)
    return f"logit({target})" + (f" - logit({direct.foil.text!r})" if direct.foil is not None else "")


def direct_lines(direct: Direct, tokens: list[str], width: int) -> list[Text]:
    """Each active feature's direct effect on the logit (difference) at the last position, the largest first."""
    summed = sum(effect for _, _, effect in direct.features)
    lines = words(f"direct effects on {metric_words(direct)} at position {direct.position} "
                  f"{token_label(tokens[direct.position])} (the model's: {direct.logit:+.4f}): the site adds "
                  f"{direct.site:+.4f} = features {summed:+.4f} + the rest of the reconstruction {direct.rest:+.4f} "
                  f"+ the error term {direct.error:+.4f}", width)
    shown = direct.features[:max(5, len(direct.features) and 10)]
    if not shown:
        return lines + words("no feature is active there", width, "dim")
    columns = [Column.of("feature", [str(i) for i, _, _ in shown], right=True),
               Column.of("activation", [f"{a:.4f}" for _, a, _ in shown], right=True),
               Column.of("direct effect", [f"{e:+.4f}" for _, _, e in shown], right=True)]
    return lines + table(columns, width, title=f"the {len(shown)} largest |direct effects| of the "
                         f"{len(direct.features)} active features")


def feature_text_lines(result: TextFeatures, width: int, color: bool) -> list[Text]:
    acts = [result.activations[p] for p in result.measured]
    active = sum(1 for a in acts if a > 0)
    lines = words(f"feature {result.feature}: active on {active} of {len(acts)} tokens measured, largest "
                  f"{max(acts, default=0.0):.4f}", width)
    lines += words(left_out_words(counts(result.left_out), result.every_token, [p for p in sorted(result.left_out) if p]),
                   width, "dim")
    lines += wrap(activation_items(result, color), width, sep=" " if color else "  ")
    note = "shade: the darker, the more active" if color else "the activation beside each token where active"
    return lines + words(note + ("; " + SPACE_NOTE if has_space([token_label(t) for t in result.tokens]) else ""),
                         width, "dim")


def corpus_lines(run: Envelope, width: int, color: bool) -> list[Text]:
    """The run's aggregate over texts, as part_lines shows it."""
    return part_lines(run.value, run, width, color)


def part_lines(result: CorpusFeatures, run: Envelope, width: int, color: bool, heading: bool = True) -> list[Text]:
    """An SAE's aggregate over the run's texts: the error's means, the losses, and a feature's top activating
    contexts."""
    texts = f"{run.n} text{'' if run.n == 1 else 's'}"
    lines = words(f"features over {texts} ({result.tokens} tokens, {result.measured} measured)" +
                  (" (interrupted: the texts finished)" if run.interrupted else ""), width, "bold") if heading \
        else []
    lines += words(sae_words(result.sae), width)
    lines += words(left_out_words(result.left_out, result.every_token), width, "dim")
    if result.feature is None:
        lines += words(f"error at the site: MSE {result.mse:.4g} per value; explained variance "
                       f"{number(result.explained)} (the mean of the texts'); cosine {number(result.cosine)}; L0 "
                       f"{result.l0:.1f} (means over tokens)", width)
        if result.losses is not None:
            for sentence in loss_words(result.losses):
                lines += words(sentence, width)
        return lines
    lines += words(f"feature {result.feature}: active on {result.active} of {result.measured} tokens measured "
                   f"({result.active / max(result.measured, 1):.2%}); largest activation {result.max_activation:.4f}, "
                   f"mean {result.mean_activation:.4g} over every token measured", width)
    if not result.contexts:
        return lines + words("no context: the feature is active on no token", width, "dim")
    context = []
    for c in result.contexts:
        items = [Text(token_label(t), style="dim") for t in c.before]
        items.append(Text(token_label(c.token), style="bold reverse" if color else ""))
        if not color:
            items[-1] = Text(f"[{token_label(c.token)}]")
        items += [Text(token_label(t), style="dim") for t in c.after]
        context.append(items)
    columns = [Column.of("activation", [f"{c.activation:.4f}" for c in result.contexts], right=True),
               Column.of("text", [str(c.text) for c in result.contexts], right=True),
               Column.of("position", [str(c.position) for c in result.contexts], right=True),
               Column("context (the token " + ("highlighted)" if color else "in [ ])"), context, sep=" ")]
    tokens = [t for c in result.contexts for t in (*c.before, c.token, *c.after)]
    # the numbers are the keys: a context wider than the room beside them wraps in its cell, never a page of its own
    return lines + [Text()] + table(columns, width, keys=3, title=f"the {len(result.contexts)} top activating "
                                    "contexts") + \
        (words(SPACE_NOTE, width, "dim") if has_space([token_label(t) for t in tokens]) else [])


def several_lines(result: Several, number_shown: int, width: int, color: bool) -> list[Text]:
    """Several SAEs' views of one text (--sae repeated), one after the other; the text is echoed once."""
    lines = features_lines(result.parts[0], number_shown, width, color)
    for part in result.parts[1:]:
        lines += [Text()] + features_lines(part, number_shown, width, color, echoed=False)
    return lines


def several_corpus_lines(run: Envelope, width: int, color: bool) -> list[Text]:
    parts = run.value.parts
    lines = part_lines(parts[0], run, width, color)
    for part in parts[1:]:
        lines += [Text()] + part_lines(part, run, width, color, heading=False)
    return lines


# ---------------------------------------------------------------------------------------------------- JSON Lines


def losses_record(losses: Losses | None) -> dict[str, Any] | None:
    if losses is None:
        return None
    return {"clean": losses.clean, "spliced": losses.spliced, "with_error": losses.with_error, "zero": losses.zero,
            "recovered": losses.recovered, "kl": losses.kl, "kl_with_error": losses.kl_with_error,
            "positions": losses.count}


def record(result: TextFeatures) -> dict[str, Any]:
    """A text's JSON Lines record (docs/commands.md, features)."""
    return {"text": result.text, "ids": result.ids, "tokens": result.tokens, "sae": result.sae,
            "features": [[[i, v] for i, v in top] for top in result.top], "mse": result.mse,
            "explained_variance": result.explained, "cosine": result.cosine, "l0": result.l0,
            "explained_variance_text": result.explained_text, "loss": losses_record(result.losses), "kl": result.kl,
            "feature": result.feature, "activations": result.activations, "direct": direct_record(result.direct),
            "left_out": [{"position": p, "why": why} for p, why in sorted(result.left_out.items())]}


def direct_record(direct: Direct | None) -> dict[str, Any] | None:
    if direct is None:
        return None
    return {"position": direct.position, "target": {"token": direct.target.token, "id": direct.target.id,
                                                    "text": direct.target.text},
            "foil": None if direct.foil is None else {"token": direct.foil.token, "id": direct.foil.id,
                                                      "text": direct.foil.text},
            "logit": direct.logit, "site": direct.site, "rest": direct.rest, "error": direct.error,
            "features": [[i, a, e] for i, a, e in direct.features]}


def corpus_record(run: Envelope) -> dict[str, Any]:
    """The run's aggregate record."""
    return part_record(run.value, run)


def part_record(result: CorpusFeatures, run: Envelope) -> dict[str, Any]:
    """An SAE's aggregate record over the run's texts."""
    return {"texts": run.n, "tokens": result.tokens, "sae": result.sae, "mse": result.mse,
            "explained_variance": result.explained, "cosine": result.cosine, "l0": result.l0,
            "loss": losses_record(result.losses), "feature": result.feature, "active": result.active,
            "max_activation": result.max_activation, "mean_activation": result.mean_activation,
            "contexts": [{"activation": c.activation, "text": c.text, "position": c.position, "before": c.before,
                          "token": c.token, "after": c.after} for c in result.contexts],
            "measured": result.measured, "left_out": result.left_out, "interrupted": run.interrupted}


def several_record(result: Several) -> list[dict[str, Any]]:
    """A text's records, one per SAE (each names its SAE in `sae`)."""
    return [record(part) for part in result.parts]


def several_corpus_record(run: Envelope) -> list[dict[str, Any]]:
    return [part_record(part, run) for part in run.value.parts]


# ---------------------------------------------------------------------------------------------------- --report


def page_section(result: TextFeatures, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """A text's section: its record and the sentences the terminal writes above its table (`header`)."""
    header = [line.plain for line in features_lines(result, 1, 10**6, False, echoed=False)]
    cut = next((k for k, line in enumerate(header) if not line), len(header))
    return record(result) | {"header": [plain(line) for line in header[:cut]], "corpus": False}


def corpus_page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The run's aggregate section, as part_section makes it."""
    return part_section(run.value, run)


def part_section(result: CorpusFeatures, run: Envelope) -> dict[str, Any]:
    """An SAE's aggregate section: its record and the sentences above its contexts."""
    header = [line.plain for line in part_lines(result, run, 10**6, False)]
    cut = next((k for k, line in enumerate(header) if not line), len(header))
    return part_record(result, run) | {"header": [plain(line) for line in header[:cut]], "corpus": True}


def several_page_section(result: Several, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """Several SAEs' sections of one text, drawn one after the other."""
    return {"several": True, "parts": [page_section(part, tokenizer) for part in result.parts]}


def several_corpus_page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    return {"several": True, "parts": [part_section(part, run) for part in run.value.parts]}


def figure(result: TextFeatures, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """A text's bars under its tokens: the feature's activation (with --feature), else each token's L0 and the
    explained variance."""
    import numpy as np

    from tfcli.render.figure import blank_figure, caption

    labels = [token_label(t) for t in result.tokens]
    figure = blank_figure(max(5.0, 0.32 * len(labels) + 1.6), 3.4)
    caption(figure, plain(f"tfcli features: {result.text!r}; {sae_words(result.sae)}"), run)
    ax = figure.add_subplot()
    x = np.arange(len(labels))
    if result.feature is not None:
        ax.bar(x, result.activations, 0.7, color="#2171b5")
        ax.set_ylabel(f"feature {result.feature}'s activation")
    else:
        ax.bar(x, result.l0, 0.7, color="#2171b5")
        ax.set_ylabel("features active (L0)")
    ax.set_xticks(x, labels, rotation=90, fontsize=6)
    return figure


def corpus_figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """The top contexts' activations as bars (with --feature), else the error's means."""
    import numpy as np

    from tfcli.render.figure import blank_figure, caption

    result = done.value
    figure = blank_figure(6.0, 3.4)
    caption(figure, plain(f"tfcli features over {done.n} texts; {sae_words(result.sae)}"), run)
    ax = figure.add_subplot()
    if result.feature is not None and result.contexts:
        labels = [f"{c.text}:{c.position} {token_label(c.token)}" for c in result.contexts]
        ax.barh(np.arange(len(labels))[::-1], [c.activation for c in result.contexts], color="#2171b5")
        ax.set_yticks(np.arange(len(labels))[::-1], labels, fontsize=6)
        ax.set_xlabel(f"feature {result.feature}'s activation (text:position token)")
    else:
        names = ["explained variance", "cosine"] + (["loss recovered"] if result.losses else [])
        values = [result.explained or 0.0, result.cosine or 0.0] + \
            ([result.losses.recovered or 0.0] if result.losses else [])
        ax.bar(np.arange(len(names)), values, 0.6, color="#2171b5")
        ax.set_xticks(np.arange(len(names)), names)
    return figure
