"""Position-aware edges (`tfcli circuit --positions spans`; Haklay et al., ACL 2025, "Position-aware Automatic
Circuit Discovery"): every edge scored and kept per position span, the spans named by the dataset's lines.

A line's `spans` ({"clean": {name: [start, end]}, "corrupt": {...}}, character ranges of each text) name the tokens
that play the same role across the dataset (IOI's `io`, `s1`, `s2`, `end`); a token belongs to the span holding its
last character that is not a space, a token of no span (a start token the tokenizer adds, the template's other words)
to `other`. Every line names the same spans (the dataset's schema); the clean and corrupt texts may differ in length:
each text is cut into segments, runs of tokens of one span (a special token a segment of its own), the two texts'
segments must come in the same order, and a clean token takes its counterfactual from the corrupt token at the same
place from its segment's end (right-aligned: the last token of a name, the one that says it, faces the other's last;
a clean segment longer than the corrupt one reads the corrupt's first token for its extra tokens).

The graph (`SpanGraph`): receiver r at span k is receiver r x K + k (`L9H6.q@s2`), so an (edge, span) pair is an
edge of it and a circuit an (S, R x K) mask; sizes count (edge, span) pairs. Scores (the paper's non-crossing
edges): edge (u -> v) at span k is the per-position attribution (u's counterfactual - clean output at t) . (the
metric's gradient at v's input at t) summed over the positions t of span k, t the position of the residual stream u
writes and v reads (for a head's key or value input, the key's position). Summed over the spans, the position-blind
score. The paper's crossing edges (a head's key and value read at one span, its query at another) are not scored.
Faithfulness: an (edge, span) pair outside the circuit is patched at its span's positions only.

Shapes: B pairs, T tokens (the clean texts'), T' (the corrupt texts'), S senders, R receivers, K spans, d width.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tfcli.analysis.inputs import check_length, model_input
from tfcli.analysis.metric import parse_metric, position_of
from tfcli.analysis.pairs import Pair
from tfcli.commands.circuit.edges import (Batch, Deltas, Graph, Senders, batch_of, gradients, site_blocks,
                                          graph_of, input_hooks, patched_metrics, position_means, receiver_sites,
                                          run_senders)
from tfcli.commands.circuit.edges import counterfactual_of as blind_counterfactual
from tfcli.commands.circuit.edges import greedy_order as blind_order
from tfcli.analysis.names import block_site
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.dataset import Line
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Encoding, Tokenizer

OTHER = "other"  # the positions of no named span
POSITIONS = ("all", "spans")
SPAN_NAME = re.compile(r"[A-Za-z0-9_+.-]+")
SPAN_METHODS = ("eap", "eap-ig-inputs")


# ---------------------------------------------------------------- the graph


@dataclass(frozen=True)
class SpanGraph(Graph):
    """The graph with each receiver at each of `spans`: receiver r x K + k is the model's receiver r at span k."""

    spans: tuple[str, ...] = ()

    @cached_property
    def base(self) -> Graph:
        return Graph(self.layers, self.heads, self.parallel)

    @cached_property
    def receivers(self) -> list[str]:
        return [f"{name}@{span}" for name in self.base.receivers for span in self.spans]

    def reads(self, receiver: int) -> int:
        return self.base.reads(receiver // len(self.spans))

    @cached_property
    def mask(self) -> Tensor:
        return self.base.mask.repeat_interleave(len(self.spans), 1)

    def node_of(self, r: int) -> int | None:
        return self.base.node_of(r // len(self.spans))

    def inputs_of(self, s: int) -> list[int]:
        return [r * len(self.spans) + k for r in self.base.inputs_of(s) for k in range(len(self.spans))]

    def collapsed(self, circuit: Tensor) -> Tensor:
        """(S, R x K) -> (S, R): the edges kept at some span."""
        return circuit.view(circuit.shape[0], -1, len(self.spans)).any(2)

    def nodes_of(self, circuit: Tensor) -> list[str]:
        return self.base.nodes_of(self.collapsed(circuit))

    def connects(self, circuit: Tensor) -> bool:
        return self.base.connects(self.collapsed(circuit))

    def split(self, r: int) -> tuple[str, str]:
        """(the model's receiver, the span) of receiver r."""
        base, k = divmod(r, len(self.spans))
        return self.base.receivers[base], self.spans[k]


def greedy_order(graph: Graph, scores: Tensor) -> list[tuple[int, int]]:
    """edges.greedy_order, from every span's logits receiver at once for a SpanGraph: the (edge, span) pair of
    largest |score| into a node already in the circuit joins it."""
    return blind_order(graph, scores, len(graph.spans) if isinstance(graph, SpanGraph) else 1)


# ---------------------------------------------------------------- a line's spans


@dataclass
class SpanPair(Pair):
    """A pair with its spans: `labels` each clean token's span, `names` the line's named spans in the order given,
    `source` the corrupt position each clean position reads its counterfactual from (None: not aligned, the mean
    counterfactual reads no corrupt text)."""

    labels: list[str] = field(default_factory=list)
    names: tuple[str, ...] = ()
    source: list[int] | None = None


def span_ranges(value: Any, text: str, side: str) -> dict[str, tuple[int, int]]:
    """A line's spans of one text checked: names (not `other`), [start, end) character ranges inside the text, apart."""
    if not isinstance(value, dict):
        raise usage_error(f"`spans` has no `{side}` object of name: [start, end]",
                          'e.g. "spans": {"clean": {"io": [10, 14]}, "corrupt": {"io": [10, 13]}}')
    ranges = {}
    for name, where in value.items():
        if not SPAN_NAME.fullmatch(name) or name == OTHER:
            raise usage_error(f"span name `{name}`: a name is letters, digits, _ + . - and not `{OTHER}` (the "
                              "positions of no span)")
        if not (isinstance(where, list) and len(where) == 2 and all(isinstance(i, int) and not isinstance(i, bool)
                                                                    for i in where)
                and 0 <= where[0] < where[1] <= len(text)):
            raise usage_error(f"the {side} span `{name}` is {where!r}: give [start, end], character offsets of the "
                              f"{side} text (0 <= start < end <= {len(text)})")
        ranges[name] = (where[0], where[1])
    ordered = sorted(ranges.items(), key=lambda item: item[1])
    for (first, (_, end)), (second, (start, _)) in zip(ordered, ordered[1:]):
        if start < end:
            raise usage_error(f"the {side} spans `{first}` and `{second}` overlap: a token belongs to one span")
    return ranges


def token_labels(encoding: Encoding, length: int, ranges: dict[str, tuple[int, int]]) -> list[tuple[str, bool]]:
    """(span, special) of each of the first `length` tokens: the span holding the token's last character that is not
    a space; `other` for a token of no span, a special token (no characters) and a token of spaces."""
    labels = []
    for position in range(length):
        start, end = encoding.offsets[position]
        piece = encoding.text[start:end].rstrip() if encoding.sequence_ids[position] is not None else ""
        last = start + len(piece) - 1
        name = next((name for name, (a, b) in ranges.items() if piece.strip() and a <= last < b), OTHER)
        labels.append((name, encoding.sequence_ids[position] is None))
    return labels


def segments(labels: list[tuple[str, bool]]) -> list[tuple[tuple[str, bool], list[int]]]:
    """Runs of equal (span, special) labels: (label, positions)."""
    runs: list[tuple[tuple[str, bool], list[int]]] = []
    for position, label in enumerate(labels):
        if runs and runs[-1][0] == label:
            runs[-1][1].append(position)
        else:
            runs.append((label, [position]))
    return runs


def aligned(clean: list[tuple[str, bool]], corrupt: list[tuple[str, bool]]) -> list[int]:
    """The corrupt position each clean position reads: segment by segment, right-aligned (module docstring)."""
    ours, theirs = segments(clean), segments(corrupt)
    if [label for label, _ in ours] != [label for label, _ in theirs]:
        def shown(runs):
            return ", ".join(("start token" if special else name) for (name, special), _ in runs)
        raise usage_error(f"the clean and corrupt texts' spans do not align: the clean text reads {shown(ours)}; "
                          f"the corrupt one {shown(theirs)}",
                          "give both texts the same spans in the same order (the same name for the same role)")
    source = []
    for (_, mine), (_, other) in zip(ours, theirs):
        shift = len(other) - len(mine)
        source += [other[max(0, i + shift)] for i in range(len(mine))]
    return source


def check_span_pair(config: ModelConfig, tokenizer: Tokenizer, line: Line, align: bool) -> SpanPair:
    """A dataset line of a pair with its spans (the clean and corrupt texts may differ in length), checked before any
    model is built; `align`: the corrupt text's spans are read and aligned (the corrupt counterfactual)."""
    fields = line.fields
    spans = fields.get("spans")
    if spans is None:
        raise usage_error("no `spans`: --positions spans reads each line's spans",
                          "tfcli task writes them; docs/datasets.md#spans has the keys")
    if not isinstance(spans, dict) or not set(spans) <= {"clean", "corrupt"}:
        raise usage_error("`spans` must be an object with `clean` and `corrupt`, each {name: [start, end]}")
    parse_metric(config, tokenizer, fields["target"], fields["foil"], fields["position"], prefix="")
    encodings = tokenizer.encode([fields["clean"], fields["corrupt"]])
    ids = [model_input(config, encoding) for encoding in encodings]
    for text, row in zip(("clean", "corrupt"), ids):
        check_length(config, len(row), f"the {text} text has")
    sides = ("clean", "corrupt") if align else ("clean",)
    ranges = {side: span_ranges(spans.get(side), fields[side], side) for side in sides}
    if align and set(ranges["clean"]) != set(ranges["corrupt"]):
        raise usage_error(f"the clean text's spans ({', '.join(ranges['clean']) or 'none'}) are not the corrupt "
                          f"one's ({', '.join(ranges['corrupt']) or 'none'})",
                          "name the same spans in both texts: a span is one role (the same name in both)")
    labels = {side: token_labels(encodings[k], len(ids[k]), ranges[side]) for k, side in enumerate(sides)}
    for side in sides:
        found = {name for name, _ in labels[side]}
        empty = [name for name in ranges[side] if name not in found]
        if empty:
            raise usage_error(f"the {side} span `{empty[0]}` covers no token of the {side} text",
                              "a span covers the characters of at least one token")
    source = aligned(labels["clean"], labels["corrupt"]) if align else None
    end = position_of(ids[0], tokenizer, config, fields["position"])
    return SpanPair(line.number, fields["clean"], fields["corrupt"], ids[0], ids[1], fields["target"],
                    fields["foil"], fields["position"], end, labels=[name for name, _ in labels["clean"]],
                    names=tuple(ranges["clean"]), source=source)


def schema_of(pairs: list[SpanPair]) -> tuple[str, ...]:
    """The dataset's spans: the first line's names, in its order, then `other` when some token is of no span. Every
    line names the same spans, or a usage error names the first that does not."""
    first = pairs[0]
    for pair in pairs[1:]:
        if set(pair.names) != set(first.names):
            raise usage_error(f"line {pair.line} names the spans {', '.join(pair.names)} where line {first.line} "
                              f"names {', '.join(first.names)}: a dataset's lines share one schema of spans",
                              "name the same spans on every line (a span is a role: io, s1, s2, end)")
    other = any(OTHER in pair.labels for pair in pairs)
    return first.names + ((OTHER,) if other else ())


# ---------------------------------------------------------------- a batch


@dataclass
class SpanBatch(Batch):
    """A Batch whose corrupt texts (B, T') may differ in length from the clean ones: `spans` (B, T) each clean
    position's span index (a pad: 0), `source` (B, T) the corrupt position it reads (a pad: 0), `identity` whether
    every pair's source is its own position (then the corrupt run's metric is m(empty))."""

    spans: Tensor
    source: Tensor
    identity: bool


def span_batch_of(model: TransformerModel, tokenizer: Tokenizer, pairs: list[SpanPair], graph: SpanGraph
                  ) -> SpanBatch:
    import torch

    batch = batch_of(model, tokenizer, pairs)  # the clean and corrupt ids each padded to their own longest
    index = {name: k for k, name in enumerate(graph.spans)}
    width, device = batch.clean.shape[1], model.device
    spans = torch.tensor([[index[name] for name in pair.labels] + [0] * (width - len(pair.labels)) for pair in pairs],
                         device=device)
    rows = [pair.source if pair.source is not None else list(range(len(pair.labels))) for pair in pairs]
    source = torch.tensor([row + [0] * (width - len(row)) for row in rows], device=device)
    identity = all(row == list(range(len(row))) and len(pair.ids_corrupt) == len(row) for pair, row in zip(pairs, rows))
    return SpanBatch(batch.clean, batch.corrupt, batch.targets, batch.foils, batch.positions, batch.lengths, spans,
                     source, identity)


def aligned_corrupt(model: TransformerModel, batch: SpanBatch) -> tuple[Tensor, Tensor]:
    """The corrupt run: (its metric (B,), each clean position's counterfactual outputs (B, T, S, d), read at its
    `source` corrupt position). The metric is read at the clean texts' metric positions: m(empty) only when
    `identity`."""
    import torch

    with torch.no_grad():
        logits, outputs = run_senders(model, batch.corrupt, batch)
    at = batch.source[:, :, None, None].expand(-1, -1, *outputs.shape[2:])
    return (batch.metric(logits) if batch.identity else None), outputs.gather(1, at)


def counterfactual_of(model: TransformerModel, batch: SpanBatch, kind: str, clean: Tensor) -> tuple[Tensor, Tensor]:
    """(m(empty) (B,), the counterfactual outputs (B, T, S, d)): edges.counterfactual_of with the corrupt outputs
    aligned; m(empty) is a run with every edge patched unless the texts align position for position."""
    import torch

    if kind == "mean":
        return blind_counterfactual(model, batch, kind, clean)
    empty, counter = aligned_corrupt(model, batch)
    if empty is None:
        empty = patched_metrics(model, batch, counter, [torch.zeros_like(graph_of(model.config).mask)])[:, 0]
    return empty, counter


# ---------------------------------------------------------------- the scores


def span_edge_scores(graph: SpanGraph, differences: Tensor, grads: list[Tensor], sites: list[tuple[str, int, int]],
                     spans: Tensor) -> Tensor:
    """(B, S, R x K) float64: edges.edge_scores per span. Per block of receivers, the per-position products (B x T,
    s, d) @ (B x T, d, n) summed over each span's positions (`spans` (B, T) indices): as many products as the
    position-blind score's, in smaller pieces."""
    import torch

    base, count = graph.base, len(graph.spans)
    batch, length, senders, width = differences.shape
    by_position = differences.reshape(batch * length, senders, width)
    onehot = torch.nn.functional.one_hot(spans, count).to(differences.dtype)  # (B, T, K)
    scores = torch.zeros(batch, senders, len(base.receivers), count, dtype=torch.float64)
    blocks = site_blocks(sites)
    for block in blocks:
        first, last = sites[block[0]][1], sites[block[-1]][1] + sites[block[-1]][2]
        reads = max(base.reads(r) for r in range(first, last))
        columns = torch.cat([grads[i] for i in block], 2).to(differences.dtype)  # (B, T, n, d)
        columns = columns.reshape(batch * length, last - first, width).transpose(1, 2)  # (B x T, d, n)
        product = torch.bmm(by_position[:, :reads], columns)  # (B x T, s, n)
        summed = torch.einsum("btsn,btk->bsnk", product.view(batch, length, reads, last - first), onehot)
        scores[:, :reads, first:last] = summed.double() * base.mask[:reads, first:last, None]
    return scores.flatten(2)


def scores_of(model: TransformerModel, batch: SpanBatch, graph: SpanGraph, method: str, steps: int,
              counterfactual: str = "corrupt") -> tuple[Tensor, Tensor, Tensor]:
    """(clean metric (B,), m(empty) (B,), scores (B, S, R x K)) by eap or eap-ig-inputs (edges.scores_of's runs)."""
    sites = receiver_sites(model)
    senders = Senders(model)
    clean_metric, grads = gradients(model, batch, sites, hooks=senders.hooks())
    clean = senders.outputs
    empty, counter = counterfactual_of(model, batch, counterfactual, clean)
    first, points = block_site(0, "resid_pre"), steps if method == "eap-ig-inputs" else 1
    for k in range(points - 1, 0, -1):
        point = counter[:, :, 0] + (k / points) * (clean[:, :, 0] - counter[:, :, 0])
        found = gradients(model, batch, sites, hooks={first: lambda x, point=point: point.to(x.dtype)})[1]
        grads = [a + b for a, b in zip(grads, found)]
    grads = [g / points for g in grads]
    return clean_metric, empty, span_edge_scores(graph, counter - clean, grads, sites, batch.spans)


# ---------------------------------------------------------------- patched runs


def span_patched_metrics(model: TransformerModel, batch: SpanBatch, graph: SpanGraph, counter: Tensor,
                         circuits: list[Tensor]) -> Tensor:
    """(B, C): edges.patched_metrics of each (S, R x K) circuit, an (edge, span) pair outside it patched at its span's
    positions only: a receiver's input at position t gains the differences of all the senders it reads less those
    of its edges kept at t's span (a product per span the site keeps edges at, masked to the span's positions)."""
    import torch

    base, count = graph.base, len(graph.spans)
    onehot = torch.nn.functional.one_hot(batch.spans, count).to(counter.dtype)  # (B, T, K)
    values = []
    with torch.no_grad():
        for circuit in circuits:
            inside = (circuit & graph.mask).view(circuit.shape[0], -1, count)
            deltas = Deltas(model, counter)

            def update(first: int, number: int, rows: int, inside: Tensor = inside, deltas: Deltas = deltas
                       ) -> Tensor:
                reads = base.reads(first)
                change = deltas.prefix[reads][:, :, None].expand(-1, -1, number, -1)
                kept = inside[:reads, first:first + number]  # (s, n, K)
                used = kept.any(2).any(1).nonzero().flatten()
                if not len(used):
                    return change
                each = deltas.each
                differences = each.view(each.shape[0], -1).index_select(0, used)  # (u, B x T x d)
                inner = None
                for k in kept.any(1).any(0).nonzero().flatten().tolist():
                    part = (kept[used, :, k].T.to(each.dtype) @ differences).view(number, *each.shape[1:])
                    part = part * onehot[None, :, :, k, None]  # at span k's positions only
                    inner = part if inner is None else inner + part
                return change - inner.permute(1, 2, 0, 3)

            hooks = input_hooks(model, update)
            hooks.update(deltas.hooks())
            values.append(batch.metric(model.run_with_hooks(batch.clean, hooks, **batch.keep)))
    return torch.stack(values, 1) if values else counter.new_zeros(counter.shape[0], 0, dtype=torch.float64)


def circuit_metrics(model: TransformerModel, batch: SpanBatch, graph: SpanGraph, circuits: list[Tensor],
                    counterfactual: str = "corrupt", ends: bool = True
                    ) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """edges.circuit_metrics of (S, R x K) circuits: (clean metric (B,), m(empty) (B,), metric (B, C)); `ends`
    False: the first two None, not run."""
    import torch

    if ends:
        with torch.no_grad():
            logits, clean = run_senders(model, batch.clean, batch)
        empty, counter = counterfactual_of(model, batch, counterfactual, clean)
        return batch.metric(logits), empty, span_patched_metrics(model, batch, graph, counter, circuits)
    if counterfactual == "corrupt":
        counter = aligned_corrupt(model, batch)[1]
    else:
        with torch.no_grad():
            counter = position_means(run_senders(model, batch.clean, batch)[1], batch.lengths)
    return None, None, span_patched_metrics(model, batch, graph, counter, circuits)


# ---------------------------------------------------------------- edges read from a file


def edge_spans(graph: SpanGraph, edges: list[tuple[int, int, str | None]], where: str) -> list[tuple[int, int]]:
    """(sender, model's receiver, span or None: every span) -> the SpanGraph's edges; a span the dataset does not
    name: an error (exit 1, as --edges' other faults)."""
    count, index = len(graph.spans), {name: k for k, name in enumerate(graph.spans)}
    found = []
    for s, r, span in edges:
        if span is not None and span not in index:
            raise TfcliError(f"{where}: the dataset has no span `{span}`; its spans are {', '.join(graph.spans)}",
                             parameter="edges")
        found += [(s, r * count + k) for k in ([index[span]] if span is not None else range(count))]
    return sorted(set(found))
