"""`tfcli circuit`: which edges between components carry a task, and how faithful the circuit they make is.

The graph, the counterfactuals and the scores (`eap`, `eap-ig-inputs`, `eap-ig-activations`, `exact`) are
edges.py's (beside this module). Here: the options, the analyses the runner runs over the pairs (each pair's scores,
then the faithfulness of circuits) and picking the circuit.

A circuit C's faithfulness: every edge outside it patched (its receiver reading the sender's counterfactual output in
place of the one it gives in this run), (m(C) - m(empty)) / (m(full) - m(empty)) summed over the pairs, with a
bootstrap interval (`measure`; circuits picked greedily from the logits backwards: `greedy_order`).

Shapes: S senders, R receivers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Dataset, Done
from tfcli.commands.circuit import spans
from tfcli.commands.circuit.edges import (COUNTERFACTUALS, METHODS, Graph, batch_of, circuit_metrics, circuit_of,
                                          graph_of, scores_of)
from tfcli.commands.circuit.spans import greedy_order
from tfcli.commands.circuit.pruning import METHOD as PRUNING
from tfcli.analysis.metric import Token, check_head, parse_metric
from tfcli.analysis.pairs import OverPairs, Pair
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

SIZES = (10, 30, 100, 300, 1000)  # the faithfulness curve's circuit sizes, in edges (capped at the graph's)
BATCH = 8  # pairs run together
DEFAULT_TOP = 100  # the circuit's edges without --top, --faithful or --edges


# ---------------------------------------------------------------- the model


def check_model(config: ModelConfig) -> None:
    """What the graph needs, before any model is built: a decoder with an LM head whose blocks add each sublayer's
    output to the residual stream as it is (pre-norm, or parallel)."""
    if config.architecture != "decoder":
        kind = "an encoder-only model" if config.architecture == "encoder" else "an encoder-decoder"
        raise usage_error(f"{config.name} is {kind}: circuit reads a decoder's logits at a pair's last token",
                          "use a decoder-only model with an LM head (GPT-2, Llama, SmolLM2, ...)")
    check_head(config, ("lm",), "circuit reads the logit difference of two tokens", "use a model with an LM head")
    if config.norm_position != "pre":
        raise usage_error(f"{config.name} has {config.norm_position}-norm blocks: a circuit's edges need each "
                          "sublayer's output added to the residual stream as it is (pre-norm blocks)",
                          "use a pre-norm model (GPT-2, Llama, Mistral, Qwen2, Pythia, ...)")
    if config.qk_norm == "projection":
        raise usage_error(f"{config.name} normalises its queries and keys over the whole projection: the heads' "
                          "inputs cannot be split")


# ---------------------------------------------------------------- options and circuits given


@dataclass(kw_only=True)
class CircuitOptions:
    method: str = "eap-ig-inputs"  # the default: EAP's small circuits recover nothing on SmolLM2's IOI (issue 62)
    steps: int = 5  # eap-ig-inputs, eap-ig-activations
    top: int | None = None  # the circuit: the greedy top N edges ...
    faithful: float | None = None  # ... or the smallest reaching this faithfulness ...
    edges: list[tuple[int, int]] | None = None  # ... or these (--edges FILE)
    edges_file: str | None = None
    sizes: tuple[int, ...] = SIZES
    counterfactual: str = "corrupt"  # what an edge is patched to: the corrupt run's outputs, or the clean ones' means
    positions: str = "all"  # "spans": every edge scored and kept per position span (spans.py)
    span_edges: list[tuple[int, int, str | None]] | None = None  # --edges with --positions spans, spans unchecked
    train_steps: int = 200  # edge-pruning: the masks' training steps (pruning.py) ...
    target_edges: int | None = None  # ... and the edges they are trained to keep (None: 1,000, or the graph's)

    @property
    def methods(self) -> list[str]:
        """--method's methods: one, or several compared on the same pairs (compare.py)."""
        return [part.strip() for part in self.method.split(",")]


def check_options(config: ModelConfig, options: CircuitOptions) -> None:
    """The model and the options, before any model is built."""
    check_model(config)
    names = METHODS + (PRUNING,)
    for method in options.methods:
        if method not in names:
            raise usage_error(f"method must be one of {', '.join(names)} (or several, comma-separated), got "
                              f"`{method}`", parameter="method")
    if len(set(options.methods)) < len(options.methods):
        raise usage_error(f"--method `{options.method}` names a method twice", parameter="method")
    if options.train_steps < 1:
        raise usage_error(f"--steps must be 1 or more, got {options.train_steps}", parameter="steps")
    edge_count = graph_of(config).edge_count
    if options.target_edges is not None and not 1 <= options.target_edges <= edge_count:
        raise usage_error(f"--target-edges must be 1 to the graph's {edge_count:,} edges, got {options.target_edges:,}",
                          parameter="target_edges")
    if options.counterfactual not in COUNTERFACTUALS:
        raise usage_error(f"--counterfactual must be one of {', '.join(COUNTERFACTUALS)}, got "
                          f"`{options.counterfactual}`", parameter="counterfactual")
    if options.positions not in spans.POSITIONS:
        raise usage_error(f"--positions must be one of {', '.join(spans.POSITIONS)}, got `{options.positions}`",
                          parameter="positions")
    if options.positions == "spans" and len(options.methods) > 1:
        raise usage_error("--positions spans takes one method at a time, not several", parameter="method")
    if options.positions == "spans" and options.method not in spans.SPAN_METHODS:
        raise usage_error(f"--positions spans scores with {' or '.join(spans.SPAN_METHODS)}, not {options.method}",
                          parameter="method")
    if options.steps < 1:
        raise usage_error(f"--ig-steps must be 1 or more, got {options.steps}", parameter="ig_steps")
    given = [name for name, value in (("--top", options.top), ("--faithful", options.faithful),
                                      ("--edges", options.edges_file)) if value is not None]
    if len(given) > 1:
        raise usage_error(f"give one of {', '.join(given)}: each picks the circuit")
    if options.faithful is not None and not 0 < options.faithful <= 1:
        raise usage_error(f"--faithful must be above 0 and at most 1, got {options.faithful}",
                          "a circuit's faithfulness is a share of the clean behaviour: 0.8 is 80%",
                          parameter="faithful")
    if options.top is not None and options.top < 1:
        raise usage_error(f"--top must be 1 or more, got {options.top}", parameter="top")
    if not options.sizes or any(size < 1 for size in options.sizes):
        raise usage_error("--sizes: give circuit sizes of 1 edge or more, e.g. 10,30,100", parameter="sizes")


def parse_sizes(spec: str | None) -> tuple[int, ...]:
    if spec is None:
        return SIZES
    try:
        return tuple(sorted({int(part) for part in spec.split(",") if part.strip()}))
    except ValueError:
        raise usage_error(f"--sizes: `{spec}` is not a list of numbers of edges", "e.g. --sizes 10,30,100",
                          parameter="sizes") from None


# ---------------------------------------------------------------- picking circuits


def curve_sizes(graph: Graph, sizes: tuple[int, ...]) -> list[int]:
    """The curve's sizes, capped at the graph's edges (its size the last when one passed it)."""
    return sorted({min(size, graph.edge_count) for size in sizes})


# ---------------------------------------------------------------- over a dataset (or one pair)


@dataclass
class PairScores:
    """One pair's result: its clean and corrupt metric and its edges' scores (S, R) (0 where no edge)."""

    line: int | None
    clean_value: float
    corrupt_value: float
    scores: Tensor
    target: Token | None = None
    foil: Token | None = None
    graph: Graph | None = None


@dataclass
class CurvePoint:
    """A circuit measured: its size in edges and nodes, its faithfulness and the 95% bootstrap interval (None: none)."""

    edges: int
    nodes: int
    faithfulness: float
    low: float | None = None
    high: float | None = None
    metrics: list[float] | None = None  # m(C) per pair, in the pairs' order (a later paired comparison: compare.py)


@dataclass
class Circuit:
    """The aggregate: the edges' scores averaged over the pairs (S, R; how many, and of what dataset, is the run's
    Envelope), the circuit picked (`picked`: "top", "faithful" or "edges", with `wanted` its N, F or file) with its
    faithfulness over `measured_pairs` pairs, and the curve."""

    graph: Graph
    method: str
    steps: int
    scores: Tensor
    clean_value: float  # means over the pairs
    corrupt_value: float
    target: Token | None  # None: the pairs' differ
    foil: Token | None
    picked: str = "top"
    wanted: Any = DEFAULT_TOP
    circuit: Tensor | None = None
    measured: CurvePoint | None = None
    curve: list[CurvePoint] = field(default_factory=list)
    measured_pairs: int = 0  # the pairs the faithfulness is over (fewer than the scores' after a Ctrl-C)
    counterfactual: str = "corrupt"  # corrupt_value is m(empty): with "mean", every edge patched to the means
    training: Any = None  # edge-pruning: its training (pruning.Pruned)
    ends: dict[int | None, tuple[float, float]] = field(default_factory=dict)  # each pair's (m(full), m(empty))

    def top_edges(self, count: int | None = None) -> list[tuple[str, str, float, bool]]:
        """(sender, receiver, score, in the circuit) of the edges by |score|, largest first (ties in graph order)."""
        graph, scores = self.graph, self.scores
        edges = graph.mask.nonzero().tolist()
        edges.sort(key=lambda e: -abs(float(scores[e[0], e[1]])))
        return [(graph.senders[s], graph.receivers[r], float(scores[s, r]),
                 bool(self.circuit[s, r]) if self.circuit is not None else False) for s, r in edges[:count]]


@dataclass
class Measured:
    """Faithfulness of K circuits over `n` pairs: (K,) values with their intervals (None without a bootstrap), and
    `ends`, each pair's (m(full), m(empty)) by its line (what a later run need not run again), and `metrics` (N, K)
    each pair's m(C) of each circuit, in the order of `ends`."""

    values: list[float]
    lows: list[float] | None
    highs: list[float] | None
    n: int
    interrupted: bool
    ends: dict[int | None, tuple[float, float]] = field(default_factory=dict)
    metrics: list[list[float]] | None = None


def windows(pairs: list[Pair]) -> Iterator[list[Pair]]:
    """The pairs in batches of at most BATCH (right-padded together: Batch)."""
    for start in range(0, len(pairs), BATCH):
        yield pairs[start:start + BATCH]


def ordered(pairs: list[Pair], run: Callable[[list[Pair]], list[Any]], progress: Callable[[float], None] | None
            ) -> Iterator[Any]:
    """run(batch) over the pairs' batches, each result in the pairs' order."""
    for start, batch in zip(range(0, len(pairs), BATCH), windows(pairs)):
        results = run(batch)
        if progress is not None:
            progress(start + len(batch))
        yield from results


@dataclass
class CircuitScores(OverPairs):
    """The edges' scores over the pairs (an item is a pair, checked as patch's: OverPairs): an item's result is its
    PairScores, the aggregate a Circuit (its circuit and faithfulness are measured after, by the command:
    `measure`)."""

    options: CircuitOptions
    command = "circuit"

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Any) -> Pair:
        if self.options.positions == "spans":
            return spans.check_span_pair(config, tokenizer, line, self.options.counterfactual == "corrupt")
        return super().check(config, tokenizer, line)

    def check_items(self, pairs: list[Pair]) -> None:
        """With --positions spans, the dataset's spans make the graph (a SpanGraph) and place --edges' spans."""
        super().check_items(pairs)
        if self.options.positions == "spans":
            graph = self.graph
            self.graph = spans.SpanGraph(graph.layers, graph.heads, graph.parallel, spans.schema_of(pairs))
            if self.options.span_edges is not None:
                self.options.edges = spans.edge_spans(self.graph, self.options.span_edges,
                                                      f"--edges {self.options.edges_file}")

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[PairScores]:
        def run(batch: list[Pair]) -> list[PairScores]:
            if isinstance(self.graph, spans.SpanGraph):
                clean, corrupt, scores = spans.scores_of(model, spans.span_batch_of(model, tokenizer, batch,
                                                                                    self.graph), self.graph,
                                                         self.options.method, self.options.steps,
                                                         self.options.counterfactual)
            else:
                clean, corrupt, scores = scores_of(model, batch_of(model, tokenizer, batch), self.options.method,
                                                   self.options.steps, self.options.counterfactual)
            tokens = [parse_metric(model.config, tokenizer, p.target, p.foil, p.position, prefix="") for p in batch]
            return [PairScores(pair.line, float(a), float(b), s.float(), *metric, self.graph) for pair, a, b, s, metric
                    in zip(batch, clean.tolist(), corrupt.tolist(), scores, tokens)]
        return ordered(pairs, run, progress)

    def aggregate(self, done: Done, dataset: Dataset) -> Circuit:
        total, n, clean, corrupt, tokens = None, 0, 0.0, 0.0, set()
        for _, result in done:
            total = result.scores.double() if total is None else total + result.scores
            n += 1
            tokens.add((result.target.id, result.foil and result.foil.id))
            first = result
            clean, corrupt = clean + result.clean_value, corrupt + result.corrupt_value
        options = self.options
        picked, wanted = ("edges", options.edges_file) if options.edges is not None else \
            ("faithful", options.faithful) if options.faithful is not None else ("top", options.top or DEFAULT_TOP)
        return Circuit(self.graph, options.method, options.steps, total / n, clean / n, corrupt / n,
                       *((first.target, first.foil) if len(tokens) == 1 else (None, None)), picked=picked,
                       wanted=wanted, counterfactual=options.counterfactual)

    graph: Graph | None = None  # set by the command from the config (before any model is built)


@dataclass
class CircuitFaithfulness(OverPairs):
    """The faithfulness of K circuits (S, R): an item's result is (clean, corrupt, the metric of each circuit (K,)),
    the aggregate a Measured: sum(m(C) - m(empty)) / sum(m(full) - m(empty)) over the pairs, with the bootstrap's
    interval."""

    circuits: list[Tensor]
    counterfactual: str = "corrupt"
    ends: dict[int | None, tuple[float, float]] | None = None  # each pair's (m(full), m(empty)): not run again
    graph: Graph | None = None  # a SpanGraph: circuits of (edge, span) pairs (--positions spans)
    command = "circuit"

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[tuple[float, float, list[float]]]:
        def run(batch: list[Pair]) -> list[tuple[float, float, list[float]]]:
            if isinstance(self.graph, spans.SpanGraph):
                clean, corrupt, values = spans.circuit_metrics(
                    model, spans.span_batch_of(model, tokenizer, batch, self.graph), self.graph, self.circuits,
                    self.counterfactual, ends=self.ends is None)
            else:
                clean, corrupt, values = circuit_metrics(model, batch_of(model, tokenizer, batch), self.circuits,
                                                         self.counterfactual, ends=self.ends is None)
            if self.ends is not None:
                clean, corrupt = zip(*(self.ends[pair.line] for pair in batch))
            else:
                clean, corrupt = clean.tolist(), corrupt.tolist()
            return list(zip(clean, corrupt, values.tolist()))
        return ordered(pairs, run, progress)

    def aggregate(self, done: Done, dataset: Dataset) -> Measured:
        import torch

        from tfcli.analysis.dataset import ratio_of_means

        pairs, rows = zip(*done)  # the runner gives at least one
        clean = torch.tensor([r[0] for r in rows], dtype=torch.float64)
        corrupt = torch.tensor([r[1] for r in rows], dtype=torch.float64)
        values = torch.tensor([r[2] for r in rows], dtype=torch.float64).view(len(rows), -1)
        if float((clean - corrupt).sum().abs()) < 1e-9:
            raise TfcliError("no faithfulness to measure: the clean and corrupt texts give the same metric "
                             "over the pairs", "choose corrupt texts on which the model behaves differently")
        score, low, high = ratio_of_means(values - corrupt[:, None], clean - corrupt, dataset.resamples)
        return Measured(score.tolist(), None if low is None else low.tolist(), None if high is None else high.tolist(),
                        len(rows), done.interrupted, {pair.line: row[:2] for pair, row in zip(pairs, rows)},
                        values.tolist())


def measure(result: Circuit, options: CircuitOptions, run: Callable[..., Measured],
            note: Callable[[str], None] | None = None, interrupted: bool = False) -> None:
    """The circuit picked and the curve, each measured by run(circuits, ends) (the faithfulness over the pairs; `ends`
    the pairs' m(full) and m(empty) from the first run, or None): the curve's circuits and the picked one in one run
    (once where it is one of the curve's); with --faithful, the smallest greedy circuit found reaching it, by
    bisection between the curve's sizes (the whole graph's faithfulness is 1), a run per step that reuses the first
    run's m(full) and m(empty), each step said through `note`. No bisection once a run was `interrupted` (the
    scores' included): what finished is kept."""
    graph = result.graph
    order = greedy_order(graph, result.scores)
    sizes = curve_sizes(graph, options.sizes)
    circuits = [circuit_of(graph, order[:size]) for size in sizes]
    chosen = None
    if options.edges is not None:
        chosen = circuit_of(graph, options.edges)
    elif options.faithful is None:
        chosen = circuit_of(graph, order[:min(options.top or DEFAULT_TOP, graph.edge_count)])
    same = next((k for k, circuit in enumerate(circuits) if chosen is not None and bool((circuit == chosen).all())),
                None)  # the picked circuit is one of the curve's: measured once
    measured = run(circuits + ([chosen] if chosen is not None and same is None else []), None)
    if not measured.n:  # interrupted before any pair finished
        return
    points = [point(graph, circuit, measured, k) for k, circuit in enumerate(circuits)]
    result.curve, result.measured_pairs, result.ends = points, measured.n, dict(measured.ends)
    interrupted |= measured.interrupted
    if chosen is not None:
        result.circuit, result.measured = chosen, point(graph, chosen, measured,
                                                        len(circuits) if same is None else same)
        return
    wanted = options.faithful
    low, high = 0, graph.edge_count
    best = None
    for size, p in zip(sizes, points):
        if p.faithfulness >= wanted:
            high, best = size, p
            break
        low = size
    while high - low > 1 and not interrupted:
        middle = (low + high) // 2
        circuit = circuit_of(graph, order[:middle])
        again = run([circuit], measured.ends)
        interrupted |= again.interrupted
        if again.n < result.measured_pairs:  # interrupted: what finished is not comparable; keep what was measured
            break
        found = point(graph, circuit, again, 0)
        if found.faithfulness >= wanted:
            high, best = middle, found
        else:
            low = middle
        if note is not None:
            note(f"--faithful {wanted:g}: {middle:,} edges {found.faithfulness:.3f}; the circuit has "
                 f"{low + 1:,}-{high:,} edges")
    if best is None:  # no circuit measured reached it: the whole graph's faithfulness is 1
        best = CurvePoint(high, len(graph.nodes_of(graph.mask)), 1.0, None, None,
                          [full for full, _ in measured.ends.values()])
    result.circuit, result.measured = circuit_of(graph, order[:best.edges]), best


def point(graph: Graph, circuit: Tensor, measured: Measured, k: int) -> CurvePoint:
    return CurvePoint(int(circuit.sum()), len(graph.nodes_of(circuit)), measured.values[k],
                      measured.lows[k] if measured.lows else None, measured.highs[k] if measured.highs else None,
                      None if measured.metrics is None else [row[k] for row in measured.metrics])
