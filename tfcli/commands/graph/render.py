"""`tfcli graph`'s outputs: the terminal view (the scores, then the pruned graph from the logits back to the tokens,
layer by layer, then the validation), the JSON record of the pruned graph (docs/commands.md#graph lists its keys),
several prompts' summary, and the --report page's data and figure (report.js draws the page)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from tfcli.analysis.contexts import Context
from tfcli.commands.graph.core import Graph, Graphs, Node, fires_at, kept_edges, kept_nodes, node_of
from tfcli.render.layout import SPACE_NOTE, has_space, quoted, token_label, words, wrap

INPUTS_SHOWN = 4  # each node's strongest kept inputs in the view


def name_of(node: Node) -> str:
    """A node's short name: `L2 f13@5` (layer 2's feature 13 at position 5), `err L2@5`, `tok@5`, `logit` (its
    text follows)."""
    if node.kind == "feature":
        return f"L{node.layer} f{node.feature}@{node.position}"
    if node.kind == "error":
        return f"err L{node.layer}@{node.position}"
    if node.kind == "token":
        return f"tok@{node.position}"
    return "logit"


def graph_lines(graph: Graph, width: int, color: bool = False) -> list[Text]:
    """The scores, the targets, then each kept node from the logits back to the tokens, layer by layer: its
    influence, a feature's activation and the tokens it fires at in this prompt, and its strongest kept inputs."""
    nodes = kept_nodes(graph)
    by_index = {node.index: node for node in nodes}
    inputs: dict[int, list[tuple[int, float]]] = {}
    for source, target, weight in kept_edges(graph):
        inputs.setdefault(target, []).append((source, weight))
    where = fires_at(graph)
    features = sum(node.kind == "feature" for node in nodes)
    n_edges = sum(len(edges) for edges in inputs.values())
    lines = words(f"graph of {quoted(graph.text)}: {len(graph.ids)} tokens, a special one first", width, "bold")
    lines += words(f"replacement score {graph.replacement:.3f}, completeness score {graph.completeness:.3f}", width)
    lines += words(f"pruned (node threshold {graph.options.node_threshold:g}, edge threshold "
                   f"{graph.options.edge_threshold:g}): {features} of {graph.n_features} feature nodes "
                   f"({len(graph.active_features)} active), {len(nodes)} nodes, {n_edges} edges", width)
    style = "bold" if color else ""

    def section(title: str, members: list[Node]) -> None:
        if not members:
            return
        lines.append(Text(""))
        lines.append(Text(title, style=style))
        for node in sorted(members, key=lambda n: (-n.influence if n.kind != "logit" else -(n.probability or 0))):
            lines.extend(node_lines(graph, node, inputs.get(node.index, []), by_index, where, width, color))

    section("logits", [n for n in nodes if n.kind == "logit"])
    for layer in reversed(range(graph.n_layers)):
        section(f"layer {layer}", [n for n in nodes if n.layer == layer])
    section("tokens", [n for n in nodes if n.kind == "token"])
    if graph.contexts and has_space([token_label(t) for found in graph.contexts.values() for c in found
                                     for t in (*c.before, c.token, *c.after)]):
        lines += [Text(""), *words(SPACE_NOTE, width, "dim")]
    if graph.validation is not None:
        lines.append(Text(""))
        lines.extend(validation_lines(graph, width, style))
    return lines


def validation_lines(graph: Graph, width: int, style: str = "") -> list[Text]:
    """The validation: each feature node removed, the graph's predicted effect on the first target (through every
    path, and by its direct edge) and the effect measured in the model; their correlation."""
    found = graph.validation
    correlation = "undefined" if found.correlation is None else f"{found.correlation:+.3f}"
    lines = words(f"validation: the {len(found.nodes)} most influential features removed, the change of "
                  f"{quoted(graph.logit_labels[0])} (the demeaned logit the graph reads), predicted by the graph "
                  f"against measured in the model: correlation {correlation}", width, style)
    for index, predicted, direct, measured in zip(found.nodes, found.predicted, found.direct, found.measured):
        node = node_of(graph, index)
        lines += wrap([f"  {name_of(node)} {quoted(node.text)}", f"predicted {predicted:+.4g}",
                       f"(direct {direct:+.4g})", f"measured {measured:+.4g}"], width, sep="  ", indent=4)
    return lines


def validation_record(graph: Graph) -> dict[str, Any] | None:
    found = graph.validation
    if found is None:
        return None
    nodes = []
    for index, predicted, direct, measured in zip(found.nodes, found.predicted, found.direct, found.measured):
        node = node_of(graph, index)
        nodes.append({"index": index, "layer": node.layer, "position": node.position, "feature": node.feature,
                      "predicted": predicted, "direct": direct, "measured": measured})
    return {"target": graph.logit_labels[0], "nodes": nodes, "correlation": found.correlation}


def summary_lines(run: Graphs, width: int) -> list[Text]:
    """Several prompts: a line per graph (its first target, its scores, what pruning kept, the validation's
    correlation)."""
    lines = [Text(""), *words(f"{len(run.graphs)} graphs", width, "bold")]  # after the last graph's view
    for number, graph in enumerate(run.graphs, 1):
        kept = kept_nodes(graph)
        features = sum(node.kind == "feature" for node in kept)
        found = graph.validation
        parts = [f"{number}. {quoted(graph.text)}", f"-> {quoted(graph.logit_labels[0])} "
                 f"p {float(graph.logit_probabilities[0]):.3f}", f"replacement {graph.replacement:.3f}",
                 f"completeness {graph.completeness:.3f}", f"{features} of {graph.n_features} features kept"]
        if found is not None and found.correlation is not None:
            parts.append(f"validation r {found.correlation:+.3f}")
        lines += wrap(parts, width, sep="  ", indent=3)
    return lines


def graphs_record(run: Graphs) -> list[dict[str, Any]]:
    """Several prompts: a JSON line per graph, each its prompt's record."""
    return [record(graph) for graph in run.graphs]


def node_lines(graph: Graph, node: Node, inputs: list[tuple[int, float]], by_index: dict[int, Node],
               where: dict[tuple[int, int], list[int]], width: int, color: bool = False) -> list[Text]:
    head = [f"{name_of(node)} {quoted(node.text)}"]
    if node.kind == "logit":
        head.append(f"p {node.probability:.3f}")
    else:
        head.append(f"influence {node.influence:.3g}")
    if node.kind == "feature":
        head.append(f"activation {node.activation:.3g}")
        positions = where[node.layer, node.feature]
        head.append("fires at " + ", ".join(f"{quoted(graph.tokens[p])}@{p}" for p in positions))
    lines = wrap(["  " + head[0], *head[1:]], width, sep="  ", indent=4)
    if node.kind == "feature" and graph.contexts is not None:
        lines += context_lines(graph.contexts.get((node.layer, node.feature), []), width, color)
    if inputs:
        shown = [f"{name_of(by_index[source])} {weight:+.3g}" for source, weight in inputs[:INPUTS_SHOWN]]
        more = [f"(+{len(inputs) - INPUTS_SHOWN} more)"] if len(inputs) > INPUTS_SHOWN else []
        lines += wrap(["    <-", *shown, *more], width, sep="  ", indent=7)
    return lines


def context_lines(contexts: list, width: int, color: bool) -> list[Text]:
    """--contexts: a feature's top contexts in the corpus, a line each: its line number, position and activation,
    then its tokens, the one it fires at in [ ] (highlighted in colour)."""
    if not contexts:
        return wrap(["    in the corpus: active on no token"], width, indent=6)
    lines = []
    for c in contexts:
        token = Text(token_label(c.token), style="bold reverse") if color else Text(f"[{token_label(c.token)}]")
        items = [f"    line {c.text}@{c.position} {c.activation:.3g}:", *map(token_label, c.before), token,
                 *map(token_label, c.after)]
        lines += wrap(items, width, sep=" ", indent=8)
    return lines


def contexts_of(graph: Graph, node: Node) -> list[Context] | None:
    """A feature node's top contexts with --contexts; None otherwise."""
    if graph.contexts is None or node.kind != "feature":
        return None
    return graph.contexts.get((node.layer, node.feature), [])


def node_record(node: Node, contexts: list[Context] | None = None) -> dict[str, Any]:
    return {"index": node.index, "kind": node.kind, "layer": node.layer, "position": node.position,
            "feature": node.feature, "text": node.text, "activation": node.activation,
            "probability": node.probability, "influence": node.influence,
            "contexts": None if contexts is None else [
                {"activation": c.activation, "line": c.text, "position": c.position, "before": c.before,
                 "token": c.token, "after": c.after} for c in contexts]}


def record(graph: Graph) -> dict[str, Any]:
    """The JSON record: the prompt, the targets, the scores and the pruned graph (docs/commands.md#graph)."""
    return {
        "text": graph.text, "ids": graph.ids, "tokens": graph.tokens,
        "targets": [{"id": i, "text": text, "probability": float(p)}
                    for i, text, p in zip(graph.logit_ids, graph.logit_labels, graph.logit_probabilities)],
        "replacement_score": graph.replacement, "completeness_score": graph.completeness,
        "active_features": len(graph.active_features), "feature_nodes": graph.n_features,
        "node_threshold": graph.options.node_threshold, "edge_threshold": graph.options.edge_threshold,
        "transcoders": graph.transcoders,
        "nodes": [node_record(node, contexts_of(graph, node)) for node in kept_nodes(graph)],
        "edges": [{"source": s, "target": t, "weight": w} for s, t, w in kept_edges(graph)],
        "validation": validation_record(graph),
    }


# ------------------------------------------------------------------------------------------ the --report page


def place(graph: Graph, node: Node) -> tuple[int, int]:
    """Where a node is drawn: (position, row), the row -1 for tokens, its layer for features and errors, the number of
    layers for the logits."""
    if node.kind == "token":
        return node.position, -1
    if node.kind == "logit":
        return node.position, graph.n_layers
    return node.position, node.layer


def page_section(graph: Graph, tokenizer: Any = None) -> dict[str, Any]:
    """The page's data of one graph: the header, the tokens and layers, the pruned graph's nodes (each with its place,
    its label, its influence) and edges, the validation."""
    nodes = kept_nodes(graph)
    found = validation_record(graph)
    return {
        "header": [f"graph of {quoted(graph.text)}",
                   f"replacement score {graph.replacement:.3f}, completeness score {graph.completeness:.3f}",
                   "targets: " + ", ".join(f"{quoted(label)} p {float(p):.3f}" for label, p in
                                           zip(graph.logit_labels, graph.logit_probabilities))],
        "tokens": graph.tokens, "layers": graph.n_layers,
        "nodes": [{"index": node.index, "kind": node.kind, "x": place(graph, node)[0], "row": place(graph, node)[1],
                   "label": f"{name_of(node)} {quoted(node.text)}", "influence": node.influence,
                   "activation": node.activation, "contexts": context_texts(contexts_of(graph, node))}
                  for node in nodes],
        "edges": [{"source": s, "target": t, "weight": w} for s, t, w in kept_edges(graph)],
        "validation": found,
    }


def context_texts(contexts: list[Context] | None) -> list[str] | None:
    """The page's hover label of a feature's contexts: `line 3@4 1.23: the cat [sat] on the mat` each."""
    if contexts is None:
        return None
    return [f"line {c.text}@{c.position} {c.activation:.3g}: {''.join(c.before)}[{c.token}]{''.join(c.after)}"
            for c in contexts] or ["in the corpus: active on no token"]


def graphs_page_section(run: Graphs, tokenizer: Any = None) -> dict[str, Any]:
    """Several prompts: a graph each."""
    return {"graphs": [page_section(graph, tokenizer) for graph in run.graphs]}


def figure(graph: Graph, run: Any, tokenizer: Any = None):
    """The pruned graph: a column per position, a row per layer (tokens at the bottom, logits at the top), an edge's
    width by its |weight| (blue positive, red negative), each node named."""
    from tfcli.render.figure import blank_figure, caption

    section = page_section(graph)
    columns, rows = len(graph.tokens), graph.n_layers + 2
    fig = blank_figure(max(6.0, 1.1 * columns), 1.2 + 0.5 * rows)
    ax = fig.subplots()
    spots = cells(section["nodes"])
    largest = max([abs(e["weight"]) for e in section["edges"]], default=1.0) or 1.0
    for edge in sorted(section["edges"], key=lambda e: abs(e["weight"])):
        (x0, y0), (x1, y1) = spots[edge["source"]], spots[edge["target"]]
        ax.plot([x0, x1], [y0, y1], color="#2166ac" if edge["weight"] >= 0 else "#b2182b",
                linewidth=0.3 + 2.5 * abs(edge["weight"]) / largest, alpha=0.6)
    for node in section["nodes"]:
        x, y = spots[node["index"]]
        ax.scatter([x], [y], s=18, color=NODE_COLORS[node["kind"]], zorder=3)
        if node["kind"] != "token":
            ax.annotate(name_of(node_of(graph, node["index"])), (x, y), fontsize=5, xytext=(2, 2),
                        textcoords="offset points")
    ax.set_xticks(range(columns), [quoted(token) for token in graph.tokens], rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(-1, graph.n_layers + 1), ["tokens", *[f"L{i}" for i in range(graph.n_layers)], "logits"],
                  fontsize=7)
    caption(fig, f"tfcli graph of {graph.text!r}: replacement {graph.replacement:.3f}, completeness "
                 f"{graph.completeness:.3f}", run)
    return fig


NODE_COLORS = {"feature": "#333333", "error": "#999999", "token": "#2563eb", "logit": "#16a34a"}


def cells(nodes: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Each node's (x, y): its position and row, the nodes of one cell spread across it (report.js does the same)."""
    by_cell: dict[tuple[int, int], list[int]] = {}
    for node in nodes:
        by_cell.setdefault((node["x"], node["row"]), []).append(node["index"])
    spots = {}
    for (x, row), members in by_cell.items():
        for k, index in enumerate(members):
            spots[index] = (x + (k + 0.5) / len(members) * 0.8 - 0.4, float(row))
    return spots
