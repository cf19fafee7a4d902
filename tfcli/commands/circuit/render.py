"""`tfcli circuit` output: what was run and on what, the circuit picked (its size in edges and nodes, its faithfulness
with its interval), the faithfulness curve and the edges of largest |score| (table views that page rather than cut);
the JSON Lines record; for --report the page's section (drawn by tfcli/commands/circuit/report.js: the circuit as a
layered graph beside its curve) and the figure."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.commands.circuit.core import Circuit, CurvePoint, PairScores
from tfcli.render.layout import Column, quoted, table, words

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tfcli.analysis.dataset import Envelope

    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

DEFAULT_TOP = 20  # edges listed
METHODS = {"eap": "edge attribution patching (EAP)", "eap-ig-inputs": "EAP with integrated gradients on the inputs",
           "eap-ig-activations": "EAP with integrated gradients on each layer's outputs",
           "exact": "exact patching of each edge",
           "edge-pruning": "Edge Pruning (a hard-concrete mask per edge trained for faithfulness)"}


def signed(value: float) -> str:
    """A metric value or a score, at one precision everywhere (the page's too)."""
    return f"{value:+.4f}"


def share(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def interval(point: CurvePoint) -> str:
    return "" if point.low is None else f"[{point.low:.3f}, {point.high:.3f}]"


def quantity(result: Circuit) -> str:
    if result.target is None:
        return "each pair's logit difference target - foil"
    return f"the logit difference {quoted(result.target.text)} - {quoted(result.foil.text)}" \
        if result.foil is not None else f"the logit of {quoted(result.target.text)}"


def method_words(result: Circuit) -> str:
    if result.training is not None:
        return METHODS[result.method] + ", " + training_words(result.training)
    return METHODS[result.method] + (f", {result.steps} steps" if result.method.startswith("eap-ig") else "")


def training_words(training: Any) -> str:
    """edge-pruning's training in words: its steps, its target and where it ended."""
    stopped = f" (stopped by Ctrl-C after {training.steps:,} of {training.planned:,})" if training.interrupted else ""
    last = f", last KL {training.kl[-1]:.4f} with {training.kept[-1]:,.0f} edges expected kept" if training.kl else ""
    return f"{training.steps:,} training steps{stopped} towards {training.target_edges:,} edges{last}"


def picked_words(result: Circuit) -> str:
    if result.picked == "edges":
        return f"the edges of {result.wanted}"
    if result.picked == "pruned":
        return f"the edges Edge Pruning's masks keep, trained towards {result.wanted:,}"
    if result.picked == "faithful":
        return f"the smallest greedy circuit found reaching a faithfulness of {result.wanted:g}"
    return f"the greedy top {result.wanted:,} edges"


def patched_to(result: Circuit) -> str:
    return "every edge patched to the means" if result.counterfactual == "mean" else "corrupt"


def spans_of(graph: Any) -> tuple[str, ...] | None:
    """The spans of a SpanGraph (--positions spans), None for the position-blind graph."""
    return getattr(graph, "spans", None)


def unit(graph: Any, count: int | None = None) -> str:
    """What a circuit's size counts: edges, or (edge, span) pairs with --positions spans."""
    plural = count is None or count != 1
    return ("(edge, span) pairs" if plural else "(edge, span) pair") if spans_of(graph) else \
        ("edges" if plural else "edge")


def receiver_record(graph: Any, r: int) -> dict[str, Any]:
    """{"receiver": the model's receiver, "span": its span (None without spans)} of receiver r."""
    receiver, span = graph.split(r) if spans_of(graph) else (graph.receivers[r], None)
    return {"receiver": receiver, "span": span}


def graph_line(graph: Any) -> str:
    spans = spans_of(graph)
    if not spans:
        return f"graph: {graph.edge_count:,} edges between {len(graph.senders) + 1:,} nodes"
    return (f"graph: {graph.base.edge_count:,} edges between {len(graph.senders) + 1:,} nodes, each at {len(spans)} "
            f"spans ({', '.join(spans)}): {graph.edge_count:,} (edge, span) pairs; sizes count (edge, span) pairs")


def header_lines(run: Envelope) -> list[str]:
    result = run.value
    pairs = f"{run.n} pair{'s' if run.n != 1 else ''}" + (f" of {run.source}" if run.source else "")
    lines = [f"circuit of {quantity(result)} over {pairs}, by {method_words(result)}",
             f"clean {signed(result.clean_value)}, {patched_to(result)} {signed(result.corrupt_value)} (means over "
             "the pairs)",
             graph_line(result.graph)]
    if run.skipped:
        lines.append(f"{run.skipped} bad lines skipped")
    return lines


def measured_lines(run: Envelope) -> list[str]:
    result, point = run.value, run.value.measured
    if point is None:
        return ["circuit: not measured (interrupted)"]
    pairs = f" over {result.measured_pairs} pairs" if result.measured_pairs != run.n else ""
    spread = f", 95% interval {interval(point)}" if point.low is not None else ""
    lines = [f"circuit: {point.edges:,} {unit(result.graph, point.edges)}, {point.nodes:,} nodes "
             f"({picked_words(result)})",
             f"faithfulness {share(point.faithfulness)}{spread}{pairs}: (m(C) - m(empty)) / (m(full) - m(empty)), "
             f"every edge outside the circuit patched to its {'mean' if result.counterfactual == 'mean' else 'corrupt'}"
             " value",
             f"its nodes: {', '.join(result.graph.nodes_of(result.circuit))}"]
    if not result.graph.connects(result.circuit):
        lines.append("warning: the circuit has no path from the input to the logits, so every path from the tokens "
                     "is patched and its faithfulness is 0 by construction: give it edges from the input (a larger "
                     "--top, or --faithful)")
    return lines


def circuit_lines(run: Envelope, width: int, color: bool, top: int = DEFAULT_TOP) -> list[Text]:
    """The terminal view of the run: the header, the circuit and its faithfulness, the curve and the top edges."""
    lines: list[Text] = []
    result = run.value
    for line in header_lines(run) + measured_lines(run):
        lines += words(line, width)
    if result.curve:
        lines.append(Text())
        lines += table([Column.of("(edge, span) pairs" if spans_of(result.graph) else "edges",
                                  [f"{p.edges:,}" for p in result.curve], right=True),
                        Column.of("nodes", [f"{p.nodes:,}" for p in result.curve], right=True),
                        Column.of("faithfulness", [share(p.faithfulness) for p in result.curve], right=True),
                        Column.of("95% interval", [interval(p) for p in result.curve])], width,
                       title="faithfulness of the greedy circuits by size")
    lines.append(Text())
    lines += edges_table(result.top_edges(top), width, color, f"the {top} {unit(result.graph)} of largest |score|"
                         + (" (a receiver@span)" if spans_of(result.graph) else ""))
    return lines


def edges_table(edges: list[tuple[str, str, float, bool]], width: int, color: bool, title: str) -> list[Text]:
    """The edges as a table; with spans a receiver is `L9H6.q@s2`: the edge at span s2."""
    def score_cell(value: float) -> Text:
        return Text(signed(value), style=("blue" if value >= 0 else "red") if color else "")
    return table([Column.of("#", [str(i) for i in range(1, len(edges) + 1)], right=True),
                  Column.of("sender", [s for s, _, _, _ in edges]),
                  Column.of("receiver", [r for _, r, _, _ in edges]),
                  Column("score", [[score_cell(v)] for _, _, v, _ in edges], right=True),
                  Column.of("in circuit", ["yes" if inside else "" for _, _, _, inside in edges])],
                 width, title=title)


def pair_lines(result: PairScores, width: int, color: bool, top: int = 10) -> list[Text]:
    """--per-item: a pair's metric and its edges of largest |score|."""
    edges = top_pair_edges(result, top)
    head = f"line {result.line}: " if result.line is not None else ""
    return words(f"{head}clean {signed(result.clean_value)}, corrupt {signed(result.corrupt_value)}", width) + \
        edges_table([(s, r, v, False) for s, r, v in edges], width, color, f"the pair's {top} edges of largest |score|")


def top_pair_edges(result: PairScores, top: int) -> list[tuple[str, str, float]]:
    """(sender, receiver, score) of a pair's `top` edges of largest |score|."""
    graph, scores = result.graph, result.scores
    flat = scores.flatten()
    receivers = scores.shape[1]
    order = flat.abs().argsort(descending=True, stable=True)[:top].tolist()
    return [(graph.senders[i // receivers], graph.receivers[i % receivers], float(flat[i])) for i in order
            if flat[i] != 0]


def pair_edge_record(graph: Any, sender: str, receiver: str, score: float) -> dict[str, Any]:
    name, at, span = receiver.partition("@")
    return {"sender": sender, "receiver": name, "score": score} | ({"span": span} if at else {})


def point_record(point: CurvePoint) -> dict[str, Any]:
    return {"edges": point.edges, "nodes": point.nodes, "faithfulness": point.faithfulness,
            "interval": None if point.low is None else [point.low, point.high]}


def token_record(token: Any) -> dict[str, Any] | None:
    return None if token is None else {"token": token.token, "id": token.id, "text": token.text}


def record(run: Envelope) -> dict[str, Any]:
    """The JSON Lines record of the run (docs/commands.md#circuit lists its keys)."""
    result = run.value
    graph, circuit = result.graph, result.circuit
    return {
        "method": result.method, "ig_steps": result.steps if result.method.startswith("eap-ig") else None,
        "pruning": training_record(result.training),
        "counterfactual": result.counterfactual,
        "target": token_record(result.target), "foil": token_record(result.foil),
        "clean_value": result.clean_value, "corrupt_value": result.corrupt_value,
        "dataset": run.source or None, "n": run.n, "pairs": run.total, "skipped": run.skipped,
        "interrupted": run.interrupted,
        "positions": "spans" if spans_of(graph) else "all",
        "spans": list(spans_of(graph)) if spans_of(graph) else None,
        "size_unit": "edge-span" if spans_of(graph) else "edge",
        "graph": {"layers": graph.layers, "heads": graph.heads, "parallel": graph.parallel,
                  "edges": graph.edge_count, "nodes": len(graph.senders) + 1,
                  "model_edges": graph.base.edge_count if spans_of(graph) else graph.edge_count},
        "circuit": None if result.measured is None else {
            "picked": result.picked, "wanted": result.wanted, **point_record(result.measured),
            "pairs": result.measured_pairs, "metrics": result.measured.metrics},
        "nodes": graph.nodes_of(circuit) if circuit is not None else [],
        "connected": graph.connects(circuit) if circuit is not None else None,
        "curve": [{**point_record(p), "metrics": p.metrics} for p in result.curve],
        "pair_ends": pair_ends(result),
        "edges": [{"sender": graph.senders[s], **receiver_record(graph, r), "score": float(result.scores[s, r]),
                   "in_circuit": bool(circuit[s, r]) if circuit is not None else False}
                  for s, r in graph.mask.nonzero().tolist()],
    }


def pair_ends(result: Circuit) -> dict[str, list[Any]] | None:
    """The pairs the faithfulness is over, in order: their lines, m(full) and m(empty) (with each curve point's and
    the circuit's `metrics`, m(C) per pair: what `--compare` pairs two runs' curves by)."""
    if not result.ends:
        return None
    lines = list(result.ends)
    return {"lines": lines, "clean": [result.ends[line][0] for line in lines],
            "empty": [result.ends[line][1] for line in lines]}


def training_record(training: Any) -> dict[str, Any] | None:
    """edge-pruning's training (None for the other methods)."""
    if training is None:
        return None
    return {"steps": training.planned, "steps_run": training.steps, "target_edges": training.target_edges,
            "expected_edges": training.kept[-1] if training.kept else None,
            "kl": training.kl[-1] if training.kl else None, "interrupted": training.interrupted,
            "kl_by_step": training.kl, "expected_edges_by_step": training.kept}


def pair_record(result: PairScores) -> dict[str, Any]:
    """--per-item's record of a pair: its line, metric values and its 10 edges of largest |score|."""
    return {"line": result.line, "clean_value": result.clean_value, "corrupt_value": result.corrupt_value,
            "top_edges": [pair_edge_record(result.graph, s, r, v) for s, r, v in top_pair_edges(result, 10)]}


def page_section(run: Envelope, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The page's data: the header, the graph's layout (layers, heads), the circuit's edges with their scores, the
    curve and the top edges."""
    result = run.value
    graph, circuit = result.graph, result.circuit
    edges = [] if circuit is None else [{"sender": graph.senders[s], **receiver_record(graph, r),
                                         "score": float(result.scores[s, r])} for s, r in circuit.nonzero().tolist()]
    return {"header": header_lines(run) + measured_lines(run), "layers": graph.layers,
            "heads": graph.heads, "edges": edges, "nodes": graph.nodes_of(circuit) if circuit is not None else [],
            "curve": [point_record(p) for p in result.curve],
            "measured": None if result.measured is None else point_record(result.measured),
            "top": [{"sender": s, "receiver": r, "score": v, "in_circuit": inside}
                    for s, r, v, inside in result.top_edges(DEFAULT_TOP)]}


def position(node: str, heads: int, layers: int) -> tuple[float, float]:
    """Where a node is drawn: (x, y), a row per layer (input at the bottom, logits at the top), heads then the MLP."""
    match = re.match(r"^L(\d+)(?:H(\d+)|\.mlp)", node)
    if match is None:
        return (heads / 2, -1.0) if node == "input" else (heads / 2, float(layers))
    return (float(heads) + 0.5 if match.group(2) is None else float(match.group(2))), float(match.group(1))


def figure(done: Envelope, run: RunInfo, tokenizer: Tokenizer | None) -> Figure:
    """The circuit as a layered graph (edge width by |score|, blue positive, red negative) beside its curve."""
    from matplotlib.figure import Figure

    from tfcli.render.figure import log_axis

    result = done.value
    graph = result.graph
    section = page_section(done, tokenizer)
    fig = Figure(figsize=(11, 1.5 + 0.45 * graph.layers))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    largest = max([abs(e["score"]) for e in section["edges"]], default=1.0) or 1.0
    for edge in section["edges"]:
        (x0, y0), (x1, y1) = (position(edge["sender"], graph.heads, graph.layers),
                              position(edge["receiver"], graph.heads, graph.layers))
        left.plot([x0, x1], [y0, y1], color="#2166ac" if edge["score"] >= 0 else "#b2182b",
                  linewidth=0.3 + 3 * abs(edge["score"]) / largest, alpha=0.7)
    for node in section["nodes"] + ["logits"]:
        x, y = position(node, graph.heads, graph.layers)
        left.scatter([x], [y], s=30, color="black", zorder=3)
        left.annotate(node, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    left.set_yticks(range(-1, graph.layers + 1), ["input", *[f"L{i}" for i in range(graph.layers)], "logits"])
    left.set_xticks([])
    measured = result.measured
    left.set_title(f"circuit: {measured.edges:,} edges, {measured.nodes:,} nodes, faithfulness "
                   f"{share(measured.faithfulness)}" if measured is not None else "circuit", fontsize=9)
    if result.curve:
        right.plot([p.edges for p in result.curve], [p.faithfulness for p in result.curve], marker="o")
        for p in result.curve:
            if p.low is not None:
                right.plot([p.edges, p.edges], [p.low, p.high], color="grey")
        if measured is not None:  # the circuit picked, ringed (it may lie between the curve's sizes)
            right.scatter([measured.edges], [measured.faithfulness], s=90, facecolors="none", edgecolors="#2563eb",
                          zorder=3)
            right.annotate(f"circuit: {measured.edges:,}", (measured.edges, measured.faithfulness), fontsize=7,
                           color="#2563eb", xytext=(0, 8), textcoords="offset points", ha="center")
        log_axis(right, "x")
    right.set_xlabel("edges")
    right.set_ylabel("faithfulness")
    fig.suptitle(f"tfcli circuit: {run.model}", fontsize=9)
    fig.tight_layout()
    return fig
