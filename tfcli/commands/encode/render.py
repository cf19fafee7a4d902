"""Render an `encode` report: the terminal view (tokens, stages, attention heatmaps, logit lens and a
summary of every layer), the JSON Lines record, and for --report the page's section (`page_section`) and the
figure (`figure`).

The terminal view shows some layers in detail (`View.detail`: by default the last one) and a line per
position summarising every captured layer; the JSON record holds everything that was captured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.analysis.ablation import ablated_label
from tfcli.render.layout import (GAP, SPACE_NOTE, Column, echo, has_space, heat_legend, heat_row, key_column_widths,
                                 layer_runs, table, token_label, words, wrap)

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from torch import Tensor

    from tfcli.commands.encode.core import AttentionMap, LensRow, StageRow, TextReport
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

KIND_TITLES = {"self": "attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention (decoder query -> encoder key)"}
ATTENTION_DECIMALS = 4  # the JSON's attention weights
FIGURE_TITLES = {"self": "", "encoder": "encoder ", "decoder": "decoder ", "cross": "cross "}  # a figure's maps


@dataclass
class View:
    """What the terminal shows of a report (the JSON record holds everything captured)."""

    detail: list[int] | None = None  # layers shown in full (maps, lens, sublayer stages); None: the last one
    attention_top: int | None = None  # keys listed per query beside a map; None: up to 3, as many as fit beside it
    color: bool = True  # colour the heatmaps' cells (the glyphs carry the levels without it)
    lens_top: int = 1  # tokens shown per layer and position (at most those captured)
    lens: bool = False  # the logit lens of the layers in full, even when the summary of every layer shows


def report_lines(report: TextReport, number: int, width: int, view: View = View()) -> list[Text]:
    """The terminal view of one text, as lines of at most `width` cells."""
    lines = heading(report, number, width)
    if report.ablated:
        lines += words(f"ablated: {ablated_label(report.ablated)}", width)
    if report.pair is not None:
        lines += words(pair_heading(report), width)
    lines += token_lines("tokens", texts_of(report), width)
    if report.target_tokens is not None:
        lines += token_lines("decoder input", target_texts_of(report), width)
    lines += [Text()] + stage_lines(report.stages, width, view.detail)
    if report.sites:
        lines += [Text()] + site_lines(report.sites, width)
    for amap in report.attention:
        if in_detail(amap.layer, [a.layer for a in report.attention if a.kind == amap.kind], view.detail):
            lines += [Text()] + heatmap_lines(amap, width, view.attention_top, view.color)
    summary = summary_lines(report, width) if _some_layer_not_in_detail(report, view.detail) else []
    if report.lens and (view.lens or not summary):  # asked for, or no summary to say what it predicts
        lines += [Text()] + lens_lines(report, width, view.detail, view.lens_top)
    return lines + ([Text()] + summary if summary else [])


def heading(report: TextReport, number: int, width: int) -> list[Text]:
    """`text 1: 'time flies'`; of a truncated text, only what the model read, saying how much that is; a long text
    in at most three lines (its beginning and end: the tokens follow in full)."""
    if report.read_text is None:
        return echo(f"text {number}: ", report.text, width)
    return echo(f"text {number}, {cut_note(report, report.read_text, report.text)}: ", report.read_text, width)


def pair_heading(report: TextReport) -> str:
    if report.read_pair is None:
        return f"pair: {report.pair!r}"
    counted = report.read_text is None  # the token count goes with the first part that was cut
    return f"pair, {cut_note(report, report.read_pair, report.pair or '', counted)}: {report.read_pair!r}"


def cut_note(report: TextReport, read: str, whole: str, tokens: bool = True) -> str:
    """'as the model read it (512 of its 5,002 tokens; 2,541 of 31,012 characters)'."""
    counts = [f"{len(report.ids):,} of its {report.untruncated_length:,} tokens"] if tokens else []
    return f"as the model read it ({'; '.join(counts + [f'{len(read):,} of {len(whole):,} characters'])})"


def in_detail(layer: int, layers: list[int], detail: list[int] | None) -> bool:
    """Whether `layer` (one of `layers`, those of its kind) is shown in full: the chosen ones, or the last."""
    return layer == max(layers) if detail is None else layer in detail


def _some_layer_not_in_detail(report: TextReport, detail: list[int] | None) -> bool:
    kinds = [[a.layer for a in report.attention if a.kind == kind] for kind in {a.kind for a in report.attention}]
    return any(not in_detail(layer, layers, detail) for layers in kinds + [[r.layer for r in report.lens]]
               for layer in layers)


def texts_of(report: TextReport) -> list[str]:
    """The text each token stands for (` Mary`; WordPiece's `##ing` and `[CLS]` as they are): what the views show
    (the vocabulary entries where the report has none)."""
    return report.token_texts if report.token_texts is not None else report.tokens


def target_texts_of(report: TextReport) -> list[str]:
    """The decoder input's texts (`texts_of`), an encoder-decoder's."""
    return report.target_token_texts if report.target_token_texts is not None else report.target_tokens or []


def positions_texts(report: TextReport) -> list[str]:
    """The texts of the positions the lens reads: the decoder input's in an encoder-decoder, else the text's."""
    return target_texts_of(report) if report.target_tokens is not None else texts_of(report)


def query_texts(amap: AttentionMap) -> list[str]:
    return amap.query_texts if amap.query_texts is not None else amap.query_tokens


def key_texts(amap: AttentionMap) -> list[str]:
    return amap.key_texts if amap.key_texts is not None else amap.key_tokens


def lens_texts(row: LensRow) -> list[list[str]]:
    """Per position, the text of each of a lens row's top tokens."""
    return row.texts if row.texts is not None else [[token for token, _, _ in top] for top in row.top]


def token_lines(label: str, texts: list[str], width: int) -> list[Text]:
    """`label:` then each token's text (`token_label`: a space as ␣, said in the label when one shows) with its
    position, wrapped between tokens: `tokens: 0 [CLS]  1 the ...`, `tokens (␣ = a space): 0 When  1 ␣Mary ...`."""
    labels = [token_label(t) for t in texts]
    items = [Text(f"{i} {t}") for i, t in enumerate(labels)]
    said = f" ({SPACE_NOTE})" if has_space(labels) else ""
    return wrap([Text(f"{label}{said}: ") + items[0], *items[1:]], width)


def stage_lines(stages: list[StageRow], width: int, detail: list[int] | None) -> list[Text]:
    """The stages table: every stage's shape, parameters and statistics. Sublayer rows (attention,
    feed-forward) only for the blocks in detail (by default each stack's last block)."""
    def stack_blocks(row: StageRow) -> list[int]:  # the blocks of the row's stack (encoder, decoder)
        return [r.block for r in stages if r.block is not None and _stack(r) == _stack(row)]

    rows = [r for r in stages if r.block is None or in_detail(r.block, stack_blocks(r), detail)]
    dtypes = {r.dtype for r in rows}
    columns = [Column.of("stage", [r.name for r in rows]),
               Column.of("shape", ["(" + ", ".join(map(str, r.shape)) + ")" for r in rows], right=True)]
    if len(dtypes) > 1:
        columns.append(Column.of("dtype", [r.dtype for r in rows]))
    columns += [Column.of("params", [f"{r.parameters:,}" for r in rows], right=True),
                Column.of("mean", [f"{r.mean:+.4f}" for r in rows], right=True),
                Column.of("std", [f"{r.std:.4f}" for r in rows], right=True),
                Column.of("norm", [f"{r.norm:.2f}" for r in rows], right=True)]
    notes = [dtypes.pop()] if len(dtypes) == 1 else []
    if len(rows) < len(stages):
        blocks = sorted({r.block for r in rows if r.block is not None})
        notes.append("sublayers of the last block only" if detail is None else
                     "sublayers of block " + ", ".join(map(str, blocks)) + " only")
    return table(columns, width, title="stages" + (f" ({'; '.join(notes)})" if notes else ""))


def _stack(row: StageRow) -> str:
    """The stack a stage belongs to: its site's prefix (`encoder.`, `decoder.`), or "" in a one-stack model."""
    return row.name.partition(".")[0] if row.name.startswith(("encoder.", "decoder.")) else ""


def site_lines(sites: dict[str, Tensor], width: int) -> list[Text]:
    """The sites --sites kept (their values are in --json and --save): shape and statistics of each."""
    from tfcli.commands.encode.core import stage_row

    rows = [stage_row(name, value, 0) for name, value in sites.items()]
    columns = [Column.of("site", [r.name for r in rows]),
               Column.of("shape", ["(" + ", ".join(map(str, r.shape)) + ")" for r in rows], right=True),
               Column.of("mean", [f"{r.mean:+.4f}" for r in rows], right=True),
               Column.of("std", [f"{r.std:.4f}" for r in rows], right=True),
               Column.of("norm", [f"{r.norm:.2f}" for r in rows], right=True)]
    return table(columns, width, title="sites (--sites; their values: --json, --save)")


def heatmap_lines(amap: AttentionMap, width: int, top: int | None = None, color: bool = True) -> list[Text]:
    """A query x key heatmap, a cell per weight shaded on an absolute scale (a glyph, coloured when `color`),
    the keys numbered as in the token list and paged when they do not fit; beside it, the `top` keys each
    query attends to most, with their weights (None: up to 3, as many as fit beside the map)."""
    weights = amap.weights.tolist()
    queries = Column.of("query", [f"{i} {token_label(t)}" for i, t in enumerate(query_texts(amap))])
    count = len(amap.key_tokens)
    label = key_column_widths([queries], width)[0] + GAP
    # a space between cells when the whole map fits so (and the keys each query attends to most fit beside
    # it: else cells side by side, if that makes room for them), else none; then as many keys as fit a page
    layouts = [(spaced, k) for spaced in (True, False) for k in ([top] if top is not None else [3, 2])]
    layouts += [(spaced, 1) for spaced in (True, False) if top is None]
    mosts = {k: _most_attended(amap, k) for _, k in layouts}
    spaced, k = next(((spaced, k) for spaced, k in layouts
                      if label + (2 * count - 1 if spaced else count) + GAP + mosts[k].natural_width() <= width),
                     (label + 2 * count - 1 <= width, top or 3))
    most = mosts[k]
    step = 2 if spaced else 1
    per_page = max(1, (width - label + step - 1) // step)
    pages = [range(start, min(start + per_page, count)) for start in range(0, count, per_page)]
    digits = len(str(count - 1))
    keys = [Column("\n".join((" " * (step - 1)).join(str(k).rjust(digits)[level] for k in keys)
                             for level in range(digits)),
                   [[heat_row([row[k] for k in keys], spaced, color)] for row in weights]) for keys in pages]
    key_range = {id(column): keys for column, keys in zip(keys, pages)}

    def note(columns: list[Column]) -> str:
        shown_keys = [k for c in columns if id(c) in key_range for k in key_range[id(c)]]
        parts = [f"keys {shown_keys[0]}-{shown_keys[-1]}"] if shown_keys else []
        return ", ".join(parts + (["attends most to"] if columns[-1] is most else []))

    head = "mean of heads" if amap.head == "mean" else f"head {amap.head}"
    title = f"{KIND_TITLES[amap.kind]}: layer {amap.layer}, {head}"
    return (table([queries, *keys, most], width, title=title, page_note=note, rule=False)
            + words("rows: queries, columns: keys (numbered as in the tokens)", width, "dim") + heat_legend(width))


def _most_attended(amap: AttentionMap, top: int) -> Column:
    """Per query, the `top` keys it attends to most: `2 animal 0.31` (key 2, weight 0.31)."""
    keys, weights = amap.top(top)
    texts = key_texts(amap)
    return Column("attends most to", [[Text(f"{k} {token_label(texts[k])} {w:.2f}")
                                       for rank, (k, w) in enumerate(zip(ks, ws)) if rank == 0 or w >= 0.005]
                                      for ks, ws in zip(keys, weights)])


def lens_lines(report: TextReport, width: int, detail: list[int] | None, top: int) -> list[Text]:
    """The logit lens of the layers in detail: a row per position, a column per layer, the top tokens
    with their probabilities (a long text grows downwards; more layers go on further pages)."""
    positions = positions_texts(report)
    rows = [r for r in report.lens if in_detail(r.layer, [x.layer for x in report.lens], detail)]
    columns = [Column.of("position", [f"{i} {token_label(t)}" for i, t in enumerate(positions)])]
    columns += [Column(f"layer {row.layer}", [[Text(f"{token_label(text)} {p:.2g}")
                                               for text, (_, _, p) in zip(texts[:top], tops[:top])]
                                              for texts, tops in zip(lens_texts(row), row.top)]) for row in rows]
    if sum(GAP + c.natural_width() for c in columns) - GAP > width:  # not on one page so: a token per line
        for column in columns[1:]:
            column.sep = "\n"
    count = min(top, len(rows[0].top[0]))  # tokens per cell
    tokens = f"{count} tokens" if count > 1 else "token"
    name = "logit lens" if report.lens_from is None else f"tuned lens {report.lens_from}"
    title = (f"{name}: the top {tokens} each layer predicts, through {report.lens_through}" if report.lens_predicts
             else f"{name}: each layer's top {tokens} through {report.lens_through} (no LM head: not a "
                  "prediction)")
    layer_of = {id(column): row.layer for column, row in zip(columns[1:], rows)}

    def page_note(page: list[Column]) -> str:  # 'layer 3', 'layers 1-2'
        first, last = layer_of[id(page[0])], layer_of[id(page[-1])]
        return ("layer " if first == last else "layers ") + _layers(first, last)

    return table(columns, width, title=title, page_note=page_note)


def summary_lines(report: TextReport, width: int) -> list[Text]:
    """Every captured layer at a glance, a row per position: the key each query attends to most and the
    token each position predicts, runs of layers that agree merged (`0-3: 2 animal` = layers 0 to 3)."""
    tables: dict[tuple[str, ...], list[Column]] = {}  # query tokens -> their columns
    texts: dict[tuple[str, ...], list[str]] = {}  # query tokens -> their texts, shown
    groups: dict[tuple[str, str], list[AttentionMap]] = {}
    for amap in report.attention:
        groups.setdefault((amap.kind, str(amap.head)), []).append(amap)
    for (kind, head), maps in groups.items():
        header = ("" if kind == "self" else f"{kind}: ") + "attends most to" + ("" if head == "mean" else f" (head {head})")
        tops = [(m.layer, m.top(1)[0]) for m in maps]
        cells = []
        keys_shown = key_texts(maps[0])
        for query in range(len(maps[0].query_tokens)):
            runs = layer_runs([(layer, keys[query][0]) for layer, keys in tops])
            cells.append([Text(f"{_layers(a, b)}: {k} {token_label(keys_shown[k])}") for a, b, k in runs])
        tables.setdefault(tuple(maps[0].query_tokens), []).append(Column(header, cells))
        texts.setdefault(tuple(maps[0].query_tokens), query_texts(maps[0]))
    if report.lens:
        positions = tuple(report.target_tokens if report.target_tokens is not None else report.tokens)
        tops_shown = [lens_texts(row) for row in report.lens]
        cells = []
        for position in range(len(positions)):
            runs = layer_runs([(row.layer, (row.top[position][0][1], shown[position][0]))  # (id, text): runs of a token
                               for row, shown in zip(report.lens, tops_shown)])
            cells.append([Text(f"{_layers(a, b)}: {token_label(text)}") for a, b, (_, text) in runs])
        tables.setdefault(positions, []).append(Column(LENS_COLUMN[report.lens_predicts], cells))
        texts.setdefault(positions, positions_texts(report))

    def title(page: list[Column]) -> str:  # a page of the lens column alone is not titled by attention's example
        lens_only = all(column.header in LENS_COLUMN.values() for column in page)
        example = SUMMARY_EXAMPLES[report.lens_predicts if lens_only else "attention"]
        return f"every layer, a line per position: runs of layers that agree merged ({example})"

    lines = []
    for tokens, columns in tables.items():
        keys = Column.of("position", [f"{i} {token_label(t)}" for i, t in enumerate(texts[tokens])])
        lines += ([Text()] if lines else []) + table([keys, *columns], width, title=title)
    if report.lens:
        lines += [Text()] + words(lens_caption(report), width, "dim")
    return lines


LENS_COLUMN = {True: "predicts", False: "lens top token"}  # the summary's lens column: a prediction head or not
SUMMARY_EXAMPLES = {"attention": "`1-5: 0 [CLS]`: layers 1 to 5 attend most to key 0, [CLS]",
                    True: "`1-5: Paris`: layers 1 to 5 predict Paris",
                    False: "`1-5: Paris`: the top token of layers 1 to 5 is Paris"}


def lens_caption(report: TextReport) -> str:
    """What the summary's lens column reads each layer through."""
    tuned = "" if report.lens_from is None else f" (tuned lens {report.lens_from})"
    if report.lens_predicts:
        return f"predicts{tuned}: each layer's output through {report.lens_through}"
    return (f"lens top token: each layer's output through {report.lens_through} (no LM head: mostly the input "
            "token, not a prediction)")


def _layers(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def record(report: TextReport, trained: bool, weights_from: str | Path | None = None,
           seed: int | None = None, attention_weights: bool = True) -> dict[str, Any]:
    """The encode JSON Lines record (docs/commands.md, "encode"): text, (pair,) tokens, ids, shapes, attention, lens,
    weights (`loaded` from a checkpoint, the file in `weights_from`, which tfcli cannot tell trained or not; `random`:
    drawn from `seed`). `weights_from` and `seed` are left out when not given; each attention map's query x key
    `weights` too when not `attention_weights` (--no-attention-weights)."""
    record: dict[str, Any] = {"text": report.text}
    if report.pair is not None:
        record["pair"] = report.pair
    record |= {"tokens": report.tokens, "ids": report.ids}
    if report.target_ids is not None:
        record |= {"target_tokens": report.target_tokens, "target_ids": report.target_ids}
    record["shapes"] = [{"stage": r.name, "shape": r.shape, "dtype": r.dtype, "params": r.parameters,
                         "mean": round(r.mean, 6), "std": round(r.std, 6), "norm": round(r.norm, 4)}
                        for r in report.stages]
    record["attention"] = [_attention_record(a, attention_weights) for a in report.attention]
    record["lens"] = [{"layer": row.layer,
                       "top": [[{"token": t, "id": i, "prob": round(p, 6)} for t, i, p in top] for top in row.top]}
                      for row in report.lens]
    if report.lens_from is not None:
        record["lens_from"] = report.lens_from
    if report.ablated:
        record["ablated"] = report.ablated
    record["weights"] = "loaded" if trained else "random"
    if trained and weights_from is not None:
        record["weights_from"] = str(weights_from)
    elif not trained and seed is not None:
        record["seed"] = seed
    if report.sites:  # --sites: each value for this text's real tokens, rounded to 6 decimals
        record["sites"] = {name: value.double().round(decimals=6).tolist() for name, value in report.sites.items()}
    return record


def _attention_record(amap: AttentionMap, weights: bool = True) -> dict[str, Any]:
    """One map: per query the key it attends to most and that weight, and (`weights`) every weight (query x key)."""
    keys, values = amap.top(1)
    scale = 10 ** ATTENTION_DECIMALS
    entry = {"kind": amap.kind, "layer": amap.layer, "head": amap.head,
             "max_key": [k[0] for k in keys], "max_weight": [round(v[0], 6) for v in values]}
    if weights:
        entry["weights"] = ((amap.weights.double() * scale).round() / scale).tolist()  # float64: 0.251, not 0.25099998
    return entry


# ---------------------------------------------------------------- the --report page and figure


def page_section(report: TextReport, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """One text of `encode` for the --report page: tokens, stages, every attention map (the mean's heads too,
    when kept), lens. `tokens` and the lens's `vocabulary` are vocabulary entries; `tokens_shown` and
    `vocabulary_shown` (one for one) the text each stands for, what the page shows."""
    from tfcli.render.page import WEIGHT_SCALE, pack_weights

    token_lists = {"tokens": report.tokens}
    shown_lists = {"tokens": texts_of(report)}
    if report.target_tokens is not None:
        token_lists["target"] = report.target_tokens
        shown_lists["target"] = target_texts_of(report)

    def list_name(tokens: list[str]) -> str:
        return "target" if tokens is report.target_tokens else "tokens"

    maps, matrices = [], []
    for amap in report.attention:
        heads = [(amap.head, amap.weights)]
        if amap.heads is not None:
            heads += list(enumerate(amap.heads))
        for head, weights in heads:
            maps.append({"kind": amap.kind, "layer": amap.layer, "head": head, "rows": weights.shape[0],
                         "cols": weights.shape[1], "query": list_name(amap.query_tokens),
                         "key": list_name(amap.key_tokens)})
            matrices.append(weights)
    vocabulary: dict[str, int] = {}  # the lens's tokens, each stored once
    vocabulary_shown: list[str] = []  # and the text each stands for

    def entry(token: str, text: str) -> int:
        if token not in vocabulary:
            vocabulary[token] = len(vocabulary)
            vocabulary_shown.append(text)
        return vocabulary[token]

    lens = [{"layer": row.layer,
             "top": [[[entry(token, text), _round(p)] for (token, _, p), text in zip(top, texts)]
                     for top, texts in zip(row.top, lens_texts(row))]}
            for row in report.lens]
    # a truncated text: what the model read (the terminal shows the same), and how much that is of the whole
    cut = None if report.read_text is None and report.read_pair is None else {
        "tokens": len(report.ids), "of_tokens": report.untruncated_length, "characters": len(report.shown_text),
        "of_characters": len(report.text)}
    return {"text": report.shown_text, "cut": cut, "tokens": token_lists, "tokens_shown": shown_lists,
            "stages": [[s.name, s.shape, s.dtype, s.parameters, s.mean, s.std, s.norm] for s in report.stages],
            "attention": {"maps": maps, "weights": pack_weights(matrices), "scale": WEIGHT_SCALE},
            "lens": {"positions": "target" if report.target_tokens is not None else "tokens", "rows": lens,
                     "vocabulary": list(vocabulary), "vocabulary_shown": vocabulary_shown,
                     "through": report.lens_through,
                     "predicts": report.lens_predicts}}


def _round(p: float) -> float:
    return float(f"{p:.3g}")


def figure(report: TextReport, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """The maps the terminal shows in full (`run.detail`; one row per layer when several heads are selected, else
    wrapped four to a row), one colour bar (0 to 1), and the lens grid of every layer below."""
    from tfcli.render.figure import (ATTENTION_COLOURS, blank_figure, caption, label_axis, labels_size, lens_grid,
                                     lens_layout, panel_side)

    layers = {kind: [m.layer for m in report.attention if m.kind == kind] for kind in {m.kind for m in report.attention}}
    maps = [m for m in report.attention if in_detail(m.layer, layers[m.kind], run.detail)]
    per_layer = max(1, sum(1 for m in maps if (m.kind, m.layer) == (maps[0].kind, maps[0].layer))) if maps else 1
    columns = per_layer if per_layer > 1 else min(4, max(1, len(maps)))
    rows = math.ceil(len(maps) / columns) if maps else 0
    # each token's text, a space as ␣ (token_label), as the terminal shows it
    positions = [token_label(t) for t in positions_texts(report)]
    queries = {id(m): [token_label(t) for t in query_texts(m)] for m in maps}
    keys = {id(m): [token_label(t) for t in key_texts(m)] for m in maps}
    panel = panel_side(max(len(report.tokens), len(report.target_tokens or [])))
    slot_width = panel + max((labels_size(queries[id(m)], panel) for m in maps), default=0) + 0.5
    slot_height = panel + max((labels_size(keys[id(m)], panel) for m in maps), default=0) + 0.8
    width = max(columns * slot_width + 1.2, 6.0)
    guesses = [[token_label(texts[0]) for texts in lens_texts(row)] for row in report.lens]
    lens = lens_layout(positions, guesses, width - 2.0) if report.lens else None
    lens_height = 0.3 + lens["row"] * len(report.lens) + lens["ticks"] if lens else 0
    figure = blank_figure(width, rows * slot_height + lens_height + 1.0)
    cut = f", {cut_note(report, report.read_text, report.text)}" if report.read_text is not None else ""
    labels = positions + [label for m in maps for label in queries[id(m)] + keys[id(m)]] + \
        [label for row in guesses for label in row]
    caption(figure, f"tfcli encode{cut}: {report.shown_text!r}" + (f" ({SPACE_NOTE})" if has_space(labels) else ""),
            run)
    grid = figure.add_gridspec(rows + (1 if lens else 0), columns,
                               height_ratios=[slot_height] * rows + ([lens_height] if lens else []))
    axes, image = [], None
    for index, amap in enumerate(maps):
        ax = figure.add_subplot(grid[index // columns, index % columns])
        image = ax.imshow(amap.weights.float().cpu().numpy(), cmap=ATTENTION_COLOURS, vmin=0, vmax=1,
                          interpolation="nearest", aspect="equal")
        head = "mean of heads" if amap.head == "mean" else f"head {amap.head}"
        ax.set_title(f"{FIGURE_TITLES[amap.kind]}layer {amap.layer}, {head}")
        label_axis(ax, "y", queries[id(amap)], panel)
        label_axis(ax, "x", keys[id(amap)], panel)
        if index % columns == 0:
            ax.set_ylabel("query")
        if index + columns >= len(maps):  # the lowest map of its column
            ax.set_xlabel("key")
        axes.append(ax)
    if image is not None:
        figure.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    if lens:
        what = f"position, through {report.lens_through}" + ("" if report.lens_predicts else
                                                               " (no LM head: not a prediction)")
        lens_grid(figure.add_subplot(grid[rows, :]), positions, [f"layer {row.layer}" for row in report.lens],
                  [[top[0][2] for top in row.top] for row in report.lens], lens, figure, what)
    return figure
