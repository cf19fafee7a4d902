"""`tfcli circuit` with edge-pruning or several methods (`--method eap,eap-ig-inputs,edge-pruning`): each method's
scores over the same pairs (edge-pruning's: -ln P(z = 0) of its masks, pruning.py), each method's circuit and
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
    """edge-pruning's Circuit from its training: the scores -ln P(z = 0) (Pruned.scores); without --top, --faithful or
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
        self.method: str | None = None  # whose circuits are being measured (compared sets it): the progress names it

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
        return Measured(score, low, high, len(self.clean), False, dict(self.ends), values.tolist())

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
    """At a curve size (`edges`; None: each one's picked circuit, --compare): faithfulness(`method`) -
    faithfulness(`minus`), with its paired 95% interval."""

    method: str
    minus: str
    edges: int | None
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
        runs.method = result.method
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


# ---------------------------------------------------------------- runs stored apart: --compare A.json B.json


@dataclass
class StoredCurve:
    """One method's curve read back from a --json record (`file`): its label (the method, `(spans)` with --positions
    spans), size unit, points {edges: (faithfulness, low, high, m(C) per pair)}, its picked circuit (edges,
    faithfulness, low, high, m(C) per pair; None if none) and its pairs' `ends` (the record's `pair_ends`)."""

    label: str
    file: str
    method: str
    positions: str
    size_unit: str
    points: dict[int, tuple[float, float | None, float | None, list[float]]]
    circuit: tuple[int, float, float | None, float | None, list[float]] | None
    ends: dict[str, list[Any]]


@dataclass
class StoredComparison:
    """Curves of runs made apart over the same pairs (in the pairs' order `lines`, with m(full) and m(empty) of the
    first run), the paired differences of every later curve minus every earlier one at their common sizes, and of
    their picked circuits (`edges` None)."""

    curves: list[StoredCurve]
    lines: list[Any]
    differences: list[Difference]


GAP_TOLERANCE = 1e-3  # the runs' m(full) and m(empty) per pair must agree to this share of the mean |gap|


def read_record(path: str) -> dict[str, Any]:
    """A circuit --json record from `path` (gzipped if it ends .gz; with --per-item, its last line, the aggregate)."""
    import gzip
    import json

    from tfcli.errors import file_error

    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        record = json.loads(lines[-1]) if lines else None
    except (OSError, UnicodeDecodeError, EOFError, json.JSONDecodeError) as exc:
        raise file_error(f"--compare {path}: cannot read it as a circuit --json record ({exc})",
                         "give the output of `tfcli circuit --dataset FILE --json`") from None
    if not isinstance(record, dict) or not ("methods" in record or "curve" in record):
        raise file_error(f"--compare {path}: not a circuit --json record (no `curve` or `methods`)",
                         "give the output of `tfcli circuit --dataset FILE --json`")
    return record


def stored_curves(record: dict[str, Any], file: str) -> list[StoredCurve]:
    """The curves of one --json record: a single method's, or each of several methods' (`methods`)."""
    try:
        return [curve_of(method, file) for method in (record["methods"] if "methods" in record else [record])]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TfcliError(f"--compare {file}: not a circuit --json record ({type(exc).__name__}: {exc})",
                         "give the output of `tfcli circuit --dataset FILE --json`") from None


def curve_of(method: dict[str, Any], file: str) -> StoredCurve:
    """One method's StoredCurve from its record."""
    if not method.get("pair_ends") or any(p.get("metrics") is None for p in method["curve"]):
        raise TfcliError(f"--compare {file}: no per-pair metrics (`pair_ends`, each point's `metrics`)",
                         "rerun it with this version of tfcli with --dataset and --json")
    spans = method.get("positions") == "spans"
    label = method["method"] + (" (spans)" if spans else "")
    interval = (lambda p: (p["interval"] or [None, None]))
    points = {p["edges"]: (p["faithfulness"], *interval(p), p["metrics"]) for p in method["curve"]}
    picked = method.get("circuit")
    circuit = None if not picked or picked.get("metrics") is None else (
        picked["edges"], picked["faithfulness"], *interval(picked), picked["metrics"])
    return StoredCurve(label, file, method["method"], method.get("positions") or "all",
                       method.get("size_unit") or "edge", points, circuit, method["pair_ends"])


def compare_stored(records: list[tuple[str, dict[str, Any]]], resamples: int) -> StoredComparison:
    """The curves of several stored runs (file name, record) over the same pairs, and their paired differences:
    sum(m_later(C) - m_earlier(C)) / sum(m(full) - m(empty)) over each seeded resample of the pairs (the same draws
    as a run with several methods makes). Refused where the runs are over other pairs or their ends differ."""
    import torch

    from tfcli.analysis.dataset import LEAST_FOR_BOOTSTRAP, ratio_of_means

    curves = [curve for file, record in records for curve in stored_curves(record, file)]
    first = curves[0].ends
    clean, empty = (torch.tensor(first[key], dtype=torch.float64) for key in ("clean", "empty"))
    scale = float((clean - empty).abs().mean())
    if len(clean) < LEAST_FOR_BOOTSTRAP:  # as a run: no interval over so few pairs
        resamples = 0
    for curve in curves[1:]:
        ends = curve.ends
        if ends["lines"] != first["lines"]:
            raise TfcliError(f"{curve.file} is over other pairs than {curves[0].file} (its lines differ)",
                             "compare runs over the same --dataset")
        apart = max(float((torch.tensor(ends[key], dtype=torch.float64) - value).abs().max())
                    for key, value in (("clean", clean), ("empty", empty)))
        if apart > GAP_TOLERANCE * scale:
            raise TfcliError(f"{curve.file}'s clean or corrupt metrics differ from {curves[0].file}'s by {apart:.3g}: "
                             "another model, dataset or --counterfactual", "compare runs of the same model and pairs")
    seen: dict[str, int] = {}
    for curve in curves:  # the same method in two files: each named by its file too
        seen[curve.label] = seen.get(curve.label, 0) + 1
    for curve in curves:
        if seen[curve.label] > 1:
            curve.label += f" [{curve.file}]"

    def difference(later: list[float], earlier: list[float]) -> tuple[float, float | None, float | None]:
        gained = (torch.tensor(later, dtype=torch.float64) - torch.tensor(earlier, dtype=torch.float64))[:, None]
        value, low, high = ratio_of_means(gained, clean - empty, resamples)
        return tuple(None if x is None else float(x[0]) + 0.0 for x in (value, low, high))  # type: ignore

    differences = []
    for j, later in enumerate(curves):
        for earlier in curves[:j]:
            for size in sorted(set(later.points) & set(earlier.points)):
                differences.append(Difference(later.label, earlier.label, size,
                                              *difference(later.points[size][3], earlier.points[size][3])))
            if later.circuit is not None and earlier.circuit is not None:
                differences.append(Difference(later.label, earlier.label, None,
                                              *difference(later.circuit[4], earlier.circuit[4])))
    return StoredComparison(curves, list(first["lines"]), differences)
