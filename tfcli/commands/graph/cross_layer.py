"""The graph through a cross-layer transcoder (circuit-tracer's CLT, analysis/transcoders.py with `cross_layer`):
layer i's features read layer i's input site and write the output site of every layer j >= i, by W_dec_i[:, j - i].
As circuit-tracer's CrossLayerTranscoder.compute_attribution_components and AttributionContext: a feature node has a
decoder vector (its row times its activation) at each layer it writes, and its edge into a target is the sum over
them; the error at layer j is the output there minus b_dec[j] and every decoder vector written to j."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.transcoders import Transcoders
    from tfcli.model.sites import Hook
    from tfcli.model.transformer import Transformer


def node_fields(model: Transformer, transcoders: Transcoders, ids: Tensor) -> dict[str, Tensor]:
    """core.find_nodes's Nodes for a CLT, as its fields: the active features (n, 3) in (layer, position, feature)
    order and their values (n,), their encoder rows (n, d), their decoder vectors (m, d) with `writes` (m, 2: the
    feature node, the layer written), the errors (L, T, d) (position 0's zero), the token vectors (T, d), the last
    position's logits (V,)."""
    import torch

    layers = range(transcoders.n_layers)
    names = ["blocks.0.resid_pre", *(transcoders.input_site(l) for l in layers),
             *(transcoders.output_site(l) for l in layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names=names)
        xs = [cache[transcoders.input_site(l)][0].float() for l in layers]
        acts = [transcoders.encode(l, x) for l, x in enumerate(xs)]
        for act in acts:
            act[:1] = 0
        recon = transcoders.reconstructions(acts, xs)
        errors = torch.stack([cache[transcoders.output_site(l)][0].float() - recon[l] for l in layers])
        errors[:, :1] = 0
        stacked = torch.stack(acts)  # (L, T, F)
        features = stacked.nonzero()
        values = stacked[features[:, 0], features[:, 1], features[:, 2]]
        encoders = torch.empty(len(features), transcoders.d_model)
        decoders, writes = [], []
        for layer in layers:
            at = (features[:, 0] == layer).nonzero()[:, 0]
            encoders[at] = transcoders.layers[layer]["W_enc"][features[at, 2]]
            rows = transcoders.layers[layer]["W_dec"][features[at, 2]] * values[at, None, None]  # (n_l, L - l, d)
            decoders.append(rows.reshape(-1, transcoders.d_model))
            written = torch.arange(layer, transcoders.n_layers)
            writes.append(torch.stack([at.repeat_interleave(len(written)), written.repeat(len(at))], dim=1))
    return {"features": features, "values": values, "encoders": encoders, "decoders": torch.cat(decoders),
            "errors": errors, "tokens": cache["blocks.0.resid_pre"][0].float(), "logits": logits[0, -1].float(),
            "writes": torch.cat(writes)}


def feature_columns(grads: list[Tensor], b: int, nodes, length: int) -> Tensor:
    """The feature columns (b, n) of a batch of targets' rows (nodes: core.Nodes) from the gradients over the
    prompt's first `length` positions (later features have no effect on these targets: 0): for each decoder vector,
    the gradient at the output site of the layer it writes and the feature's position, dotted with it, summed per
    feature node."""
    import torch

    columns = torch.zeros(b, len(nodes.features))
    before = nodes.features[nodes.writes[:, 0], 1] < length
    node, written, decoders = nodes.writes[before, 0], nodes.writes[before, 1], nodes.decoders[before]
    positions = nodes.features[node, 1]
    for layer in written.unique().tolist():
        at = (written == layer).nonzero()[:, 0]
        read = grads[layer][:b, positions[at]].float()  # (b, m_layer, d)
        columns.index_add_(1, node[at], (read * decoders[at]).sum(-1))
    return columns


def removal_hooks(transcoders: Transcoders, features: Tensor, values: Tensor) -> dict[str, Hook]:
    """validation.measured_effects's hooks for a CLT: feature k (layer i, position p, activation a) removed in row k
    of the batch: every output site j >= i lowered at p by a * W_dec_i[feature, j - i]."""
    import torch

    hooks = {}
    for layer in range(transcoders.n_layers):
        at = (features[:, 0] <= layer).nonzero()[:, 0]
        if not len(at):
            continue
        deltas = torch.stack([transcoders.layers[int(features[k, 0])]["W_dec"][int(features[k, 2]),
                                                                              layer - int(features[k, 0])]
                              for k in at.tolist()]) * values[at, None]

        def hook(value: Tensor, at: Tensor = at, deltas: Tensor = deltas) -> Tensor:
            value = value.clone()
            value[at, features[at, 1]] -= deltas.to(value.device, value.dtype)
            return value
        hooks[transcoders.output_site(layer)] = hook
    return hooks
