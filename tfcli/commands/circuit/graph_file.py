"""`tfcli circuit`'s graph files, read and written here: `--edges FILE` (a circuit to measure: one edge a line, or a
graph in the EAP-IG reference's JSON) and `--graph-out FILE.json` (the scored graph in that JSON, which the
reference's Graph.from_json reads). tfcli's node names and the reference's differ (L3H2 is a3.h2, L3.mlp is m3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from tfcli.commands.circuit.core import Circuit, Graph


def node_name(reference: str) -> str:
    """An EAP-IG reference node's name as tfcli's: a3.h2 -> L3H2, m3 -> L3.mlp."""
    return re.sub(r"^m(\d+)$", r"L\1.mlp", re.sub(r"^a(\d+)\.h(\d+)$", r"L\1H\2", reference))


def read_edges(path: str, graph: Graph, spans: bool = False) -> list[tuple[int, int]] | list[tuple[int, int, Any]]:
    """A circuit file: one edge a line (`L5H1 -> L9H6.q`, `input -> L0.mlp`; `#` starts a comment), or a graph in the
    EAP-IG reference's JSON (its edges with in_graph true). A node the model does not have, or an edge that is not one
    (a receiver before its sender): a usage error naming the line. With `spans` (--positions spans), an edge may end
    in `@SPAN` (`L5H1 -> L9H6.q@s2`: the edge at that span; without: at every span) and each is (sender, receiver,
    span or None), the span checked against the dataset's later (spans.edge_spans)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TfcliError(f"--edges {path}: {getattr(exc, 'strerror', None) or exc}", parameter="edges") from None
    lines: list[tuple[str, str]] = []
    if text.lstrip().startswith("{"):
        try:
            edges = json.loads(text)["edges"]
            for name, info in edges.items():
                if info.get("in_graph"):
                    parent, child = name.split("->")
                    child, at, span = child.partition("@")
                    kind = re.search(r"<([qkv])>$", child)
                    child = node_name(re.sub(r"<[qkv]>$", "", child)) + (f".{kind.group(1)}" if kind else "")
                    lines.append((f"edge {name}", f"{node_name(parent)}->{child}{at}{span}"))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TfcliError(f"--edges {path}: not a graph in the EAP-IG reference's JSON (its `edges`, each "
                             "`parent->child` with `in_graph`)", parameter="edges") from None
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                lines.append((f"line {number}", line))
    senders = {name: i for i, name in enumerate(graph.senders)}
    receivers = {name: i for i, name in enumerate(graph.receivers)}
    has = f"it has layers 0-{graph.layers - 1} and heads 0-{graph.heads - 1}"
    edges_read: list[Any] = []
    for where, line in lines:
        line, at, span = line.partition("@")
        line, span = line.strip(), span.strip() or None
        if at and not spans:
            raise TfcliError(f"--edges {path} {where}: `{line}@{span}` names a span: edges at spans are measured with "
                             "--positions spans", parameter="edges")
        if at and span is None:
            raise TfcliError(f"--edges {path} {where}: no span after `@`", "e.g. L5H1 -> L9H6.q@s2", parameter="edges")
        parts = [part.strip() for part in line.replace("→", "->").split("->")]
        if len(parts) != 2 or not all(parts):
            raise TfcliError(f"--edges {path} {where}: `{line}` is not an edge SENDER -> RECEIVER",
                             "e.g. L5H1 -> L9H6.q, input -> L0.mlp, L11.mlp -> logits", parameter="edges")
        sender, receiver = parts
        for name, known in ((sender, senders), (receiver, receivers)):
            if name not in known:
                node = name.rsplit(".", 1)[0] if name.endswith((".q", ".k", ".v")) else name
                what = "node" if node not in senders and node != "logits" else \
                    "sender" if known is senders else "receiver"
                raise TfcliError(f"--edges {path} {where}: the model has no {what} `{name}`",
                                 f"{has}; a sender is input, LnHm or Ln.mlp, a receiver LnHm.q, .k or .v, Ln.mlp or "
                                 "logits", parameter="edges")
        s, r = senders[sender], receivers[receiver]
        if s >= graph.reads(r):
            raise TfcliError(f"--edges {path} {where}: `{line}` is not an edge: {receiver} does not read {sender} "
                             "(it comes later in the model)", parameter="edges")
        edges_read.append((s, r, span) if spans else (s, r))
    if not edges_read:
        raise TfcliError(f"--edges {path}: no edge in it", parameter="edges")
    return sorted(set(edges_read), key=lambda edge: (*edge[:2], str(edge[2:])))


def reference_name(node: str) -> str:
    """tfcli's node name as the EAP-IG reference's: L3H2 -> a3.h2, L3.mlp -> m3."""
    match = re.match(r"^L(\d+)(?:H(\d+)|\.mlp)$", node)
    if match is None:
        return node
    return f"m{match.group(1)}" if match.group(2) is None else f"a{match.group(1)}.h{match.group(2)}"


def reference_json(result: Circuit, d_model: int) -> dict[str, Any]:
    """The graph in the EAP-IG reference's JSON (its Graph.to_json, read back by Graph.from_json): cfg, every node
    with in_graph, every edge `parent->child` (`<q>`, `<k>`, `<v>` into a head) with its score and in_graph. With
    spans: an edge per (edge, span), `parent->child@span` with its `span`, and cfg's `spans` (the reference, which has
    no spans, does not read it; --edges does)."""
    graph, circuit = result.graph, result.circuit
    touched = set(graph.nodes_of(circuit)) if circuit is not None else set()
    nodes = {reference_name(name): {"in_graph": name in touched} for name in graph.senders}
    nodes["logits"] = {"in_graph": True}
    edges = {}
    spans = getattr(graph, "spans", None)  # a SpanGraph (--positions spans): an edge per (edge, span), `...@span`
    for s, r in graph.mask.nonzero().tolist():
        receiver, span = graph.split(r) if spans else (graph.receivers[r], None)
        kind = receiver[-1] if receiver.endswith((".q", ".k", ".v")) else None
        child = reference_name(receiver[:-2] if kind else receiver)
        name = f"{reference_name(graph.senders[s])}->{child}" + (f"<{kind}>" if kind else "") + \
            (f"@{span}" if span else "")
        edges[name] = {"score": float(result.scores[s, r]),
                       "in_graph": bool(circuit[s, r]) if circuit is not None else False} | \
            ({"span": span} if span else {})
    cfg = {"n_layers": graph.layers, "n_heads": graph.heads, "parallel_attn_mlp": graph.parallel, "d_model": d_model}
    return {"cfg": cfg | ({"spans": list(spans)} if spans else {}), "nodes": nodes, "edges": edges}
