"""`tfcli circuit` with edge-pruning or several methods (`--method eap,eap-ig-inputs,edge-pruning`): each method's
scores over the same pairs (edge-pruning's: its masks' keep probabilities, pruning.py), each method's circuit and
curve measured as core.measure measures one method's, and, at each curve size, the difference of two methods'
faithfulness with its PAIRED bootstrap interval: both circuits' patched metrics are kept per pair, and each resample
draws the same pairs for both (tfcli.analysis.dataset.resample_counts, seeded), so the interval is that of
sum over drawn pairs (m(C_b) - m(C_a)) / sum over drawn pairs (m(full) - m(empty)).

A faithfulness run's per-pair metrics are kept (`Faithfulness`), keyed by circuit: a circuit two methods share (the
whole graph at the curve's cap) or that a method's picked circuit repeats is run once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Dataset, Done
from tfcli.commands.circuit.core import (Circuit, CircuitFaithfulness, CircuitOptions, CircuitScores, Measured,
                                         PairScores, curve_sizes, measure, ordered)
from tfcli.commands.circuit.edges import batch_of, circuit_of, counterfactuals, greedy_order
from tfcli.commands.circuit.pruning import METHOD as PRUNING
from tfcli.commands.circuit.pruning import Pruned
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.pairs import Pair
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer


@dataclass
class Ends(CircuitScores):
    """edge-pruning's first stage: each pair's clean metric and m(empty) (its scores come from the training, after:
    zeros here)."""

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None):
        import torch

        from tfcli.analysis.metric import parse_metric

        def run(batch: list[Pair]) -> list[PairScores]:
            clean, empty = counterfactuals(model, batch_of(model, tokenizer, batch), self.options.counterfactual)[:2]
            zeros = torch.zeros(self.graph.mask.shape)
            return [PairScores(pair.line, float(a), float(b), zeros, *parse_metric(model.config, tokenizer, pair.target,
                                                                                    pair.foil, pair.position,
                                                                                    prefix=""), self.graph)
                    for pair, a, b in zip(batch, clean.tolist(), empty.tolist())]
        return ordered(pairs, run, progress)


def first_stage(options: CircuitOptions, graph: Any) -> CircuitScores:
    """The analysis of the command's first stage: the first method's scores (edge-pruning: the pairs' ends)."""
    method = options.methods[0]  # one method: its options themselves (the first stage may fill in --edges' spans)
    one = options if method == options.method else dataclasses.replace(options, method=method)
    return Ends(one, graph) if method == PRUNING else CircuitScores(one, graph)


def pruned(result: Circuit, training: Pruned, options: CircuitOptions) -> CircuitOptions:
    """edge-pruning's Circuit from its training: the scores the keep probabilities; without --top, --faithful or
    --edges, the circuit picked the edges the masks keep (the options for core.measure that pick it)."""
    graph = result.graph
    result.scores, result.training, result.steps = training.scores(graph), training, training.steps
    if options.top is None and options.faithful is None and options.edges is None:
        result.picked, result.wanted = "pruned", training.target_edges
        return dataclasses.replace(options, edges=training.circuit(graph))
    return options


# ---------------------------------------------------------------- faithfulness, kept per pair


@dataclass
class Rows:
    """A faithfulness run's per-pair values: the pairs' lines, m(full) and m(empty) (N,) and each circuit's m(C)
    (N, K); `pairs` the pairs finished (a later run goes over them), `interrupted` whether Ctrl-C cut it short."""

    lines: list[Any]
    clean: Tensor
    empty: Tensor
    values: Tensor
    interrupted: bool
    pairs: Dataset | None = None


@dataclass
class RowsOf(CircuitFaithfulness):
    """CircuitFaithfulness whose aggregate is its per-pair values (Rows), not their ratio."""

    def aggregate(self, done: Done, dataset: Dataset) -> Rows:
        import torch

        kept = list(done)
        pairs, rows = zip(*kept)
        clean = torch.tensor([r[0] for r in rows], dtype=torch.float64)
        empty = torch.tensor([r[1] for r in rows], dtype=torch.float64)
        if float((clean - empty).sum().abs()) < 1e-9:
            raise TfcliError("no faithfulness to measure: the clean and corrupt texts give the same metric "
                             "over the pairs", "choose corrupt texts on which the model behaves differently")
        values = torch.tensor([r[2] for r in rows], dtype=torch.float64).view(len(rows), -1)
        return Rows([pair.line for pair in pairs], clean, empty, values, done.interrupted,
                    Dataset(dataset.path, list(pairs), dataset.skipped, dataset.resamples))


class Faithfulness:
    """core.measure's `run(circuits, ends)` over the same pairs for every method: each circuit's per-pair metric
    kept (by its bytes), a circuit measured before not run again; `run_rows(circuits, ends, pairs)` runs the rest
    (RowsOf through the session). The first run's pairs (all, or those finished before a Ctrl-C) are every later
    run's; a later run cut short gives nothing (n 0: that method's curve is not measured)."""

    def __init__(self, run_rows: Callable[[list[Tensor], Any, Dataset], Rows | None], pairs: Dataset):
        self.run_rows, self.pairs = run_rows, pairs
        self.kept: dict[bytes, Tensor] = {}  # circuit -> (N,) m(C) per pair
        self.clean: Tensor | None = None
        self.empty: Tensor | None = None
        self.ends: dict[Any, tuple[float, float]] | None = None
        self.resamples = pairs.resamples

    @staticmethod
    def key(circuit: Tensor) -> bytes:
        return circuit.numpy().tobytes()

    def __call__(self, circuits: list[Tensor], ends: Any = None) -> Measured:
        missing = list({self.key(c): c for c in circuits if self.key(c) not in self.kept}.values())
        if missing:
            rows = self.run_rows(missing, self.ends, self.pairs)
            if rows is None or (self.clean is not None and len(rows.lines) < len(self.clean)):
                return Measured([], None, None, 0, True)
            if self.clean is None:
                self.clean, self.empty, self.pairs = rows.clean, rows.empty, rows.pairs
                self.ends = {line: (float(a), float(b)) for line, a, b in zip(rows.lines, rows.clean, rows.empty)}
            for k, circuit in enumerate(missing):
                self.kept[self.key(circuit)] = rows.values[:, k]
        return self.measured(circuits)

    def measured(self, circuits: list[Tensor]) -> Measured:
        """The faithfulness of each circuit (all kept), as CircuitFaithfulness.aggregate gives it."""
        import torch

        from tfcli.analysis.dataset import ratio_of_means

        values = torch.stack([self.kept[self.key(c)] for c in circuits], 1)
        score, low, high = ratio_of_means(values - self.empty[:, None], self.clean - self.empty, self.resamples)
        score, low, high = (None if x is None else (x + 0.0).tolist() for x in (score, low, high))  # no -0.0
        return Measured(score, low, high, len(self.clean), False, dict(self.ends))

    def difference(self, later: Tensor, earlier: Tensor) -> tuple[float, float | None, float | None]:
        """faithfulness(later) - faithfulness(earlier) over the same pairs, with the paired bootstrap interval (None
        without resamples): sum(m(later) - m(earlier)) / sum(m(full) - m(empty)) over each resample's pairs."""
        from tfcli.analysis.dataset import ratio_of_means

        gained = (self.kept[self.key(later)] - self.kept[self.key(earlier)])[:, None]
        value, low, high = ratio_of_means(gained, self.clean - self.empty, self.resamples)
        value, low, high = (None if x is None else float(x[0]) + 0.0 for x in (value, low, high))  # no -0.0
        return value, low, high


# ---------------------------------------------------------------- several methods


@dataclass
class Difference:
    """At a curve size: faithfulness(`method`) - faithfulness(`minus`), with its paired 95% interval."""

    method: str
    minus: str
    edges: int
    value: float
    low: float | None
    high: float | None


@dataclass
class Comparison:
    """Several methods over the same pairs: each one's Circuit (its scores, circuit and curve) and the paired
    differences of every later method's faithfulness minus every earlier one's at each curve size."""

    circuits: list[Circuit]
    differences: list[Difference]
    measured_pairs: int = 0


def compared(circuits: list[Circuit], options: CircuitOptions, runs: Faithfulness,
             note: Callable[[str], None] | None, interrupted: bool) -> Comparison:
    """Each method's circuit and curve (core.measure on the shared runs), then the paired differences at the curve's
    sizes (where both methods' curves were measured)."""
    for result in circuits:
        mine = dataclasses.replace(options, method=result.method)
        if result.training is not None:
            mine = pruned(result, result.training, mine)
        said = note
        if note is not None and len(circuits) > 1:  # --faithful's steps, each method's named
            said = (lambda text, method=result.method: note(f"{method}: {text}"))
        measure(result, mine, runs, said, interrupted)
    differences = []
    graph = circuits[0].graph
    sizes = curve_sizes(graph, options.sizes)
    for j, later in enumerate(circuits):
        for earlier in circuits[:j]:
            if not later.curve or not earlier.curve:
                continue
            first, second = greedy_order(graph, earlier.scores), greedy_order(graph, later.scores)
            for size in sizes:
                value, low, high = runs.difference(circuit_of(graph, second[:size]), circuit_of(graph, first[:size]))
                differences.append(Difference(later.method, earlier.method, size, value, low, high))
    pairs = runs.clean
    return Comparison(circuits, differences, 0 if pairs is None else len(pairs))
