"""The graph's files: --graph-out, circuit-tracer's frontend JSON (utils/create_graph_files.py and
frontend/graph_models.py: `metadata`, `qParams`, `nodes`, `links`, the pruned graph), and --save, the whole graph as
safetensors (the adjacency in circuit-tracer's node order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcli.commands.graph.core import Graph, kept_edges, kept_nodes


def cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def frontend_node(graph: Graph, node, cumulative: float, target_logit: bool) -> dict[str, Any]:
    """One node as circuit-tracer's Node model writes it (error nodes' ids: error_id)."""
    base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "clerp": "",
            "influence": cumulative, "activation": None, "ctx_idx": node.position}
    if node.kind == "feature":
        return {**base, "node_id": f"{node.layer}_{node.feature}_{node.position}",
                "feature": cantor(node.layer, node.feature), "layer": str(node.layer),
                "feature_type": "cross layer transcoder", "jsNodeId": f"{node.layer}_{node.feature}-0",
                "activation": node.activation}
    if node.kind == "error":
        return {**base, "node_id": error_id(node.layer, node.position), "feature": -1, "layer": str(node.layer),
                "feature_type": "mlp reconstruction error", "jsNodeId": f"{node.layer}_{node.position}-0"}
    if node.kind == "token":
        vocab = graph.ids[node.position]
        return {**base, "node_id": f"E_{vocab}_{node.position}", "feature": node.position, "layer": "E",
                "feature_type": "embedding", "jsNodeId": f"E_{vocab}-{node.position}"}
    k = node.index - (graph.adjacency.shape[0] - len(graph.logit_ids))
    vocab, layer = graph.logit_ids[k], str(graph.n_layers + 1)
    return {**base, "node_id": f"{layer}_{vocab}_{node.position}", "feature": vocab, "layer": layer,
            "feature_type": "logit", "token_prob": node.probability, "is_target_logit": target_logit,
            "jsNodeId": f"L_{vocab}-{node.position}", "influence": None,
            "clerp": f'Output "{node.text}" (p={node.probability:.3f})'}


def error_id(layer: int, position: int) -> str:
    """circuit-tracer writes `0_{layer}_{position}`, which is also layer 0's feature `layer` at that position: tfcli
    writes `0_err{layer}_{position}`, which no feature id can be (the frontend's util-cg.js uses node_id only as a
    key, and builds a feature's own id from its layer, feature and position)."""
    return f"0_err{layer}_{position}"


def frontend_json(graph: Graph, slug: str) -> dict[str, Any]:
    """circuit-tracer's create_graph_files output for the pruned graph: its nodes with their cumulative influence,
    its kept edges between them, the prompt's tokens."""
    cumulative = graph.pruned.cumulative
    nodes, first_logit = {}, graph.adjacency.shape[0] - len(graph.logit_ids)
    for node in kept_nodes(graph):
        nodes[node.index] = frontend_node(graph, node, float(cumulative[node.index]), node.index == first_logit)
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for s, t, w in kept_edges(graph) if s in nodes and t in nodes]
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [node for node in nodes.values()
            if node["node_id"] in connected or node["feature_type"] in ("embedding", "logit")]
    scan = graph.transcoders.get("scan")
    metadata = {"slug": slug, "scan": scan if isinstance(scan, str) else "custom",
                "transcoder_list": scan if isinstance(scan, list) else [], "prompt_tokens": graph.tokens,
                "prompt": graph.text, "node_threshold": graph.options.node_threshold, "schema_version": 1}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def save_tensors(graph: Graph, path: Path) -> None:
    """--save: adjacency (N, N), active_features (n_active, 3), activation_values (n_active,), selected_features
    (n,), input_tokens (T,), logit_tokens (K,), logit_probabilities (K,)."""
    import torch
    from safetensors.torch import save_file

    save_file({"adjacency": graph.adjacency.contiguous(), "active_features": graph.active_features.contiguous(),
               "activation_values": graph.activation_values.contiguous(),
               "selected_features": graph.selected.contiguous(), "input_tokens": torch.tensor(graph.ids),
               "logit_tokens": torch.tensor(graph.logit_ids),
               "logit_probabilities": graph.logit_probabilities.float().contiguous()}, str(path))
