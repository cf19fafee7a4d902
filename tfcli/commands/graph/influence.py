"""Influence on the logits, pruning and the two scores of an attribution graph, as circuit-tracer 0.5.0 defines them
(circuit_tracer/graph.py: normalize_matrix, compute_influence, prune_graph, compute_graph_scores,
compute_partial_influences).

The adjacency A (N, N) has rows for targets and columns for sources, in the node order features (n), errors (layers x
positions, layer-major), tokens (positions), logits (K). Its rows normalised by their sum of |weights|, Â, the
influence of each node on the logits is w Â + w Â^2 + ..., w (N,) the logits' probabilities on the last K entries (a
DAG: the series ends)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


def normalized(matrix: Tensor) -> Tensor:
    """|A| with each row divided by its sum (at least 1e-10)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=1e-10)


def influence(matrix: Tensor, weights: Tensor, max_iter: int = 1000) -> Tensor:
    """weights @ (A + A^2 + ...) (N,), summed until a power is all zeros (a DAG's adjacency is nilpotent)."""
    current = weights @ matrix
    total = current
    steps = 0
    while current.any():
        if steps >= max_iter:
            raise RuntimeError(f"the influence did not converge in {steps} steps: the graph has a cycle")
        current = current @ matrix
        total = total + current
        steps += 1
    return total


def logit_weights(adjacency: Tensor, probabilities: Tensor) -> Tensor:
    """(N,): zeros, the logits' probabilities on the last K nodes."""
    import torch

    weights = torch.zeros(adjacency.shape[0], dtype=adjacency.dtype)
    weights[-len(probabilities):] = probabilities.to(adjacency.dtype)
    return weights


def threshold_of(scores: Tensor, fraction: float) -> Tensor:
    """The score above which the largest scores keep `fraction` of their total (circuit-tracer's find_threshold: the
    scores sorted from the largest, the first whose cumulative share reaches `fraction`). Only the positive scores
    are sorted, the zeros put after them: the same sorted values, for a fraction of the work where most are zeros
    (a pruned graph's edges: 2 % of 9.3 M scores)."""
    import torch

    if scores.numel() and bool(scores.min() >= 0):  # (a NaN fails it too: the whole sort)
        positive = scores[scores > 0]
        ordered = torch.cat([torch.sort(positive, descending=True).values,
                             scores.new_zeros(scores.numel() - positive.numel())])
    else:
        ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    index = min(int(torch.searchsorted(cumulative, fraction).item()), len(cumulative) - 1)
    return ordered[index]


@dataclass
class Pruned:
    """What pruning keeps: node_mask (N,), edge_mask (N, N) (rows targets), each node's influence on the logits
    (N,) and its cumulative share, from the most influential down (N,), as circuit-tracer's frontend shows it."""

    node_mask: Tensor
    edge_mask: Tensor
    node_influence: Tensor
    cumulative: Tensor


def prune(adjacency: Tensor, probabilities: Tensor, n_features: int, n_tokens: int, node_threshold: float = 0.8,
          edge_threshold: float = 0.98) -> Pruned:
    """circuit-tracer's prune_graph: nodes that keep `node_threshold` of the influence (tokens and logits always),
    then edges of the pruned graph that keep `edge_threshold` of the edge influence; then, until nothing changes,
    feature and error nodes without a kept outgoing edge, and feature nodes without a kept incoming one, dropped."""
    import torch

    n_logits = len(probabilities)
    weights = logit_weights(adjacency, probabilities)
    node_influence = influence(normalized(adjacency), weights)
    node_mask = node_influence >= threshold_of(node_influence, node_threshold)
    node_mask[-n_logits - n_tokens:] = True
    pruned = adjacency.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normal = normalized(pruned)
    edge_scores = normal * (influence(normal, weights) + weights)[:, None]
    edge_mask = edge_scores >= threshold_of(edge_scores.flatten(), edge_threshold)
    inner = slice(0, adjacency.shape[0] - n_logits - n_tokens)  # features and errors
    old = node_mask.clone()
    node_mask[inner] &= edge_mask[:, inner].any(0)
    node_mask[:n_features] &= edge_mask[:n_features].any(1)
    while not torch.all(node_mask == old):
        old[:] = node_mask
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[inner] &= edge_mask[:, inner].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
    ordered, order = torch.sort(node_influence, descending=True)
    cumulative = torch.zeros_like(node_influence)
    cumulative[order] = torch.cumsum(ordered, dim=0) / torch.sum(ordered)
    return Pruned(node_mask, edge_mask, node_influence, cumulative)


def scores(adjacency: Tensor, probabilities: Tensor, n_features: int, n_layers: int, n_tokens: int) -> tuple[float,
                                                                                                              float]:
    """circuit-tracer's compute_graph_scores: (replacement, completeness). Replacement: the tokens' influence on the
    logits over the tokens' and the errors' together. Completeness: the share of each node's normalised inputs
    that does not come from errors, weighted by the node's influence (plus the logits' own weights)."""
    weights = logit_weights(adjacency, probabilities)
    normal = normalized(adjacency)
    node_influence = influence(normal, weights)
    errors = slice(n_features, n_features + n_tokens * n_layers)
    tokens = slice(errors.stop, errors.stop + n_tokens)
    token_influence, error_influence = node_influence[tokens].sum(), node_influence[errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    output_influence = node_influence + weights
    completeness = ((1 - normal[:, errors].sum(dim=-1)) * output_influence).sum() / output_influence.sum()
    return float(replacement), float(completeness)


def partial_influences(edges: Tensor, probabilities: Tensor, row_nodes: Tensor, max_iter: int = 128) -> Tensor:
    """circuit-tracer's compute_partial_influences: each node's influence (N,) from the rows computed so far
    (`edges` (rows, N), row i being node row_nodes[i]'s inputs), by power iteration from the logits."""
    import torch

    normal = edges.abs()
    normal = normal / normal.sum(dim=1, keepdim=True).clamp(min=1e-8)
    total = torch.zeros(edges.shape[1], dtype=edges.dtype)
    product = torch.zeros(edges.shape[1], dtype=edges.dtype)
    product[-len(probabilities):] = probabilities.to(edges.dtype)
    for _ in range(max_iter):
        product = product[row_nodes] @ normal
        if not product.any():
            return total
        total += product
    raise RuntimeError("the partial influences did not converge")
