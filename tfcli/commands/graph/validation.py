"""Whether a graph predicts interventions: for its most influential feature nodes, the effect of removing each on the
first logit target as the graph predicts it against the effect measured by removing it in the model.

- **Measured**: feature f (layer l, position p, activation a) removed in the model: the output site of layer l's
  transcoder (the MLP's output) at position p lowered by a * W_dec[f], the rest of that output (the transcoder's
  error included) kept; every later attention pattern, norm, MLP and feature computed by the model as it runs. The
  effect is the change of what the logit node reads: the final norm's output at the last position dotted with the
  target's vector (its demeaned unembedding row, or target - foil).
- **Predicted**: the graph's total effect of the same removal: the logit node's change when f's output goes to zero
  and every feature node downstream follows linearly (an active feature's activation moves as its pre-activation does,
  the edges into it being effects on its pre-activation), errors and tokens fixed, attention and norms frozen:
  Δ = -[(I - M)^-1]_{logit, f}, M the adjacency with each feature's row divided by its activation. `direct` is the
  edge alone, -A[logit, f].
The two differ where attention and norms move or features cross their thresholds; their Pearson correlation over the
nodes validated says how well the graph predicts interventions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.transcoders import Transcoders
    from tfcli.model.transformer import Transformer


@dataclass
class Validation:
    """The validated feature nodes (indices into the adjacency, most influential first) with, for each, the effect
    on the first target predicted by the graph (through every path, and by the direct edge) and measured in the
    model; their correlation (None for fewer than 3 nodes or a constant column)."""

    nodes: list[int]
    predicted: list[float]
    direct: list[float]
    measured: list[float]
    correlation: float | None


def predicted_effects(adjacency: Tensor, activations: Tensor, n_features: int, logit: int) -> tuple[Tensor, Tensor]:
    """For every feature node (n,): its removal's total effect on node `logit` through the graph, and its direct
    effect. activations (n,): the feature nodes' activations. Solved in float64 by the series z = e + M^T z (a DAG's
    M is nilpotent): row `logit` of (I - M)^-1."""
    import torch

    matrix = adjacency.double().clone()
    matrix[:n_features] /= activations.double()[:, None]
    row = torch.zeros(len(matrix), dtype=torch.float64)
    row[logit] = 1.0
    total, current = row.clone(), row
    for _ in range(len(matrix) + 1):
        current = current @ matrix
        if not current.any():
            break
        total += current
    return -total[:n_features], -adjacency[logit, :n_features].double()


def measured_effects(model: Transformer, transcoders: Transcoders, ids: Tensor, features: Tensor, values: Tensor,
                     vector: Tensor, readout: str) -> list[float]:
    """Each feature (k, 3: layer, position, feature) with its activation (k,) removed in its own row of one batch:
    the change of readout . vector at the last position against the prompt's own pass. ids (1, T)."""
    import torch

    rows = len(features)
    if transcoders.cross_layer:  # a feature writes every layer from its own on
        from tfcli.commands.graph.cross_layer import removal_hooks

        hooks = removal_hooks(transcoders, features, values)
    else:
        hooks = removal_hooks_per_layer(transcoders, features, values)
    with torch.no_grad():
        _, clean = model.run_with_cache(ids, names=[readout])
        _, ablated = model.run_with_cache(ids.expand(rows, -1), names=[readout], hooks=hooks)
    vector = vector.float().to(ids.device)
    base = clean[readout][0, -1].float() @ vector
    return (ablated[readout][:, -1].float() @ vector - base).cpu().tolist()


def removal_hooks_per_layer(transcoders: Transcoders, features: Tensor, values: Tensor) -> dict:
    """Feature k (layer l, position p, activation a) removed in row k: layer l's output site lowered at p by
    a * W_dec[feature]."""
    import torch

    decoders = torch.stack([transcoders.layers[int(layer)]["W_dec"][int(feature)] for layer, _, feature in features])
    deltas = decoders * values[:, None]  # (k, d)

    def removed(layer: int):
        at = (features[:, 0] == layer).nonzero()[:, 0]

        def hook(value: Tensor) -> Tensor:
            value = value.clone()
            value[at, features[at, 1]] -= deltas[at].to(value.device, value.dtype)
            return value
        return hook

    return {transcoders.output_site(layer): removed(layer) for layer in features[:, 0].unique().tolist()}


def pearson(xs: list[float], ys: list[float]) -> float | None:
    import math

    if len(xs) < 3:  # two points always correlate by +-1
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def validate(model: Transformer, transcoders: Transcoders, graph, vector: Tensor, readout: str, count: int
             ) -> Validation:
    """The `count` feature nodes of the largest influence on the logits, predicted against measured (graph: a
    core.Graph, pruned; vector: the first target's)."""
    import torch

    n = graph.n_features
    influence = graph.pruned.node_influence[:n]
    order = torch.argsort(influence, descending=True)[:min(count, n)]
    active = graph.selected[order]
    features, values = graph.active_features[active], graph.activation_values[active]
    logit = graph.adjacency.shape[0] - len(graph.logit_ids)
    total, direct = predicted_effects(graph.adjacency, graph.activation_values[graph.selected], n, logit)
    ids = torch.tensor([graph.ids], device=model.device)
    measured = measured_effects(model, transcoders, ids, features, values, vector, readout) if len(order) else []
    predicted = total[order].tolist()
    return Validation(order.tolist(), predicted, direct[order].tolist(), measured, pearson(predicted, measured))
