"""The maths of `tfcli circuit` (core.py): the graph of a decoder's components, each edge's score over a batch
of clean/corrupt pairs, and the metric with edges patched.

The graph (as the EAP-IG reference, hannamw/EAP-IG, builds it): the nodes are the input (the embeddings, what block
0 reads), every attention head `L{l}H{h}`, every MLP `L{l}.mlp` and the logits. Every node writes into the residual
stream; every later one reads from it, a head through its query, key and value inputs separately (receivers
`L{l}H{h}.q`, `.k`, `.v`; a grouped-query model's key and value inputs per query head, ungrouped as the reference
does), an MLP through its input (`L{l}.mlp`) and the logits through the final norm (`logits`). An edge is a sender
and a receiver that reads it: `L5H1->L9H6.q`. The receivers' inputs are the model's split-input sites
(`blocks.{l}.q_input`, `k_input`, `v_input`, `mlp_in`; the last block's `resid_post` for the logits), each one a copy
of the residual stream of its own (tfcli/model/sites.py).

A sender's counterfactual output (`counterfactuals`): its output on the pair's corrupt text (`corrupt`), or its mean
over the positions of the clean text but the first (`mean`; position 0 keeps its own output: `position_means`). Scores over pairs, the metric a
pair's target - foil logit difference (as `patch`):
- `eap` (Syed et al. 2023): (sender's counterfactual - clean output) . d metric / d (receiver's input), the gradient
  on the clean run, summed over positions: the first-order estimate of patching the edge alone.
- `eap-ig-inputs` (Hanna et al. 2024): the gradient averaged over `steps` runs whose input embeddings go from the
  counterfactual to the clean ones, at k / steps for k = 1 .. steps (one step: EAP).
- `eap-ig-activations` (the reference's EAP-IG-activations): an edge's gradient averaged over `steps` runs of the
  clean input in which its sender's group (the input; one layer's heads; one layer's MLP) outputs clean + (1 - k /
  steps) (counterfactual - clean), k = 1 .. steps, everything else computed (one step: EAP).
- `exact`: each edge patched for real, the receiver reading the sender's counterfactual output instead of its clean
  one: metric(patched) - metric(clean). One run per edge: for small models and checks.

Shapes: B pairs, T tokens, d the model width, H heads, D head size, S senders, R receivers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tfcli.analysis.inputs import padded
from tfcli.analysis.metric import parse_metric
from tfcli.analysis.names import block_site

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.pairs import Pair
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

METHODS = ("eap", "eap-ig-inputs", "eap-ig-activations", "exact")
COUNTERFACTUALS = ("corrupt", "mean")
EXACT_ROWS = 64  # rows (edges x pairs) of one exact run
SCORE_COLUMNS = 64  # receivers of one product of the edges' scores (about two layers'; more wastes products)


# ---------------------------------------------------------------- the graph


@dataclass(frozen=True)
class Graph:
    """The nodes and edges of a model of `layers` blocks of `heads` heads; `parallel`: attention and MLP read the same
    stream (an MLP does not read its own layer's heads). Senders in order: input, then per layer its heads and its
    MLP; receivers: per layer every head's q, then k, then v, then the MLP; then the logits (the reference's order)."""

    layers: int
    heads: int
    parallel: bool = False

    @cached_property
    def senders(self) -> list[str]:
        return ["input"] + [name for layer in range(self.layers) for name in
                            [f"L{layer}H{h}" for h in range(self.heads)] + [f"L{layer}.mlp"]]

    @cached_property
    def receivers(self) -> list[str]:
        return [name for layer in range(self.layers) for name in
                [f"L{layer}H{h}.{kind}" for kind in "qkv" for h in range(self.heads)] + [f"L{layer}.mlp"]] + ["logits"]

    def reads(self, receiver: int) -> int:
        """How many senders (the first ones) receiver `receiver` reads."""
        per = 3 * self.heads + 1
        layer, at = divmod(receiver, per)
        if layer == self.layers:
            return len(self.senders)
        return 1 + layer * (self.heads + 1) + (self.heads if at == 3 * self.heads and not self.parallel else 0)

    @cached_property
    def mask(self) -> Tensor:
        """(S, R) bool: the real edges."""
        import torch

        mask = torch.zeros(len(self.senders), len(self.receivers), dtype=torch.bool)
        for r in range(len(self.receivers)):
            mask[:self.reads(r), r] = True
        return mask

    @cached_property
    def edge_count(self) -> int:
        return int(self.mask.sum())

    def edge_name(self, s: int, r: int) -> str:
        return f"{self.senders[s]}->{self.receivers[r]}"

    def node_of(self, r: int) -> int | None:
        """The sender index of receiver r's node (None: the logits)."""
        per = 3 * self.heads + 1
        layer, at = divmod(r, per)
        if layer == self.layers:
            return None
        return 1 + layer * (self.heads + 1) + (self.heads if at == 3 * self.heads else at % self.heads)

    def inputs_of(self, s: int) -> list[int]:
        """The receivers of sender s's node (a head's q, k, v; an MLP's input; none for the input)."""
        return [r for r in range(len(self.receivers) - 1) if self.node_of(r) == s]

    def nodes_of(self, circuit: Tensor) -> list[str]:
        """The nodes an (S, R) circuit touches, in graph order (the logits last, when an edge reaches them)."""
        senders = circuit.any(1)
        for r in circuit.any(0).nonzero().flatten().tolist():
            node = self.node_of(r)
            if node is not None:
                senders[node] = True
        names = [self.senders[s] for s in senders.nonzero().flatten().tolist()]
        return names + (["logits"] if bool(circuit[:, -1].any()) else [])

    def connects(self, circuit: Tensor) -> bool:
        """Whether an (S, R) circuit has a path from the input to the logits: without one, every path from the
        tokens is patched, and the circuit's faithfulness is 0 by construction whatever its edges."""
        reached = [False] * len(self.senders)
        reached[0] = True
        for s in range(len(self.senders)):  # senders in graph order: a receiver's node comes after its senders
            if not reached[s]:
                continue
            for r in circuit[s].nonzero().flatten().tolist():
                node = self.node_of(r)
                if node is None:
                    return True
                reached[node] = True
        return False

    def groups(self) -> list[tuple[int, int, str]]:
        """(first sender, senders, the site their summed output is added at) of each group eap-ig-activations moves
        at once: the input, then per layer its heads (at the attention output) and its MLP."""
        groups = [(0, 1, block_site(0, "resid_pre"))]
        for layer in range(self.layers):
            first = 1 + layer * (self.heads + 1)
            groups += [(first, self.heads, block_site(layer, "attn.out")),
                       (first + self.heads, 1, block_site(layer, "mlp.out"))]
        return groups


def graph_of(config: ModelConfig) -> Graph:
    return Graph(config.num_hidden_layers, config.num_attention_heads, config.parallel_residual)


# ---------------------------------------------------------------- a batch of pairs


@dataclass
class Batch:
    """Pairs as the model reads them: ids (B, T), right-padded to the longest pair (a causal stack: a position never
    reads the pads after it, and the metric's gradient is 0 there), each pair's length (B,) and its metric: its
    target, foil and position (B,)."""

    clean: Tensor
    corrupt: Tensor
    targets: Tensor
    foils: Tensor | None
    positions: Tensor
    lengths: Tensor

    @property
    def keep(self) -> dict[str, int]:
        """What a pass takes to make the head's logits from the first metric position on only."""
        return {"logits_to_keep": self.clean.shape[1] - int(self.positions.min())}

    def metric(self, logits: Tensor) -> Tensor:
        """(B', K, V), the logits of the last K positions (`keep`), with B' a multiple of B (rows repeat the pairs) ->
        (B',) float64."""
        import torch

        count = logits.shape[0] // len(self.targets)
        at = self.positions.repeat(count) - (self.clean.shape[1] - logits.shape[1])
        rows = logits[torch.arange(logits.shape[0], device=logits.device), at].double()
        value = rows.gather(1, self.targets.repeat(count)[:, None])[:, 0]
        return value if self.foils is None else value - rows.gather(1, self.foils.repeat(count)[:, None])[:, 0]


def batch_of(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair]) -> Batch:
    import torch

    device = model.device
    metrics = [parse_metric(model.config, tokenizer, pair.target, pair.foil, pair.position, prefix="")
               for pair in pairs]
    targets = torch.tensor([target.id for target, _ in metrics], device=device)
    foils = None if metrics[0][1] is None else torch.tensor([foil.id for _, foil in metrics], device=device)
    clean, corrupt = (padded(rows, tokenizer, device)[0] for rows in ([p.ids_clean for p in pairs],
                                                                      [p.ids_corrupt for p in pairs]))
    return Batch(clean, corrupt, targets, foils, torch.tensor([pair.end for pair in pairs], device=device),
                 torch.tensor([len(pair.ids_clean) for pair in pairs], device=device))


def receiver_sites(model: TransformerModel) -> list[tuple[str, int, int]]:
    """(site, first receiver, receivers) of each receivers' input site, in forward order: per layer q_input, k_input,
    v_input (a receiver per head), mlp_in; then the last block's resid_post (the logits')."""
    graph = graph_of(model.config)
    per, heads = 3 * graph.heads + 1, graph.heads
    sites = []
    for layer in range(graph.layers):
        sites += [(block_site(layer, f"{kind}_input"), layer * per + i * heads, heads) for i, kind in enumerate("qkv")]
        sites.append((block_site(layer, "mlp_in"), layer * per + 3 * heads, 1))
    return sites + [(block_site(graph.layers - 1, "resid_post"), graph.layers * per, 1)]


# ---------------------------------------------------------------- the senders' outputs


class Senders:
    """Hooks that keep every sender's output as a pass reaches it: `outputs` (B, T, s, d) of the senders so far, the
    input's (what block 0 reads), then per layer each head's (its z through its slice of the output projection) and
    the MLP's."""

    def __init__(self, model: TransformerModel):
        self.model, self.parts = model, []
        stack = model.output_stack
        self.weights = [plain(block.attn.out) for block in stack.blocks]  # (d, H x D)

    def hooks(self) -> dict[str, Callable]:
        hooks = {block_site(0, "resid_pre"): self.keep_input}
        for layer in range(len(self.weights)):
            hooks[block_site(layer, "attn.z")] = lambda z, layer=layer: self.keep_heads(layer, z)
            hooks[block_site(layer, "mlp.out")] = self.keep_mlp
        return hooks

    def keep_input(self, x: Tensor) -> None:
        self.parts = [x.detach()[:, :, None]]

    def keep_mlp(self, out: Tensor) -> None:
        self.parts.append(out.detach()[:, :, None])

    def keep_heads(self, layer: int, z: Tensor) -> None:
        import torch

        weight = self.weights[layer]
        per_head = weight.view(weight.shape[0], z.shape[2], z.shape[3])  # (d, H, D)
        self.parts.append(torch.einsum("bthe,dhe->bthd", z.detach(), per_head.to(z.dtype)))

    @property
    def outputs(self) -> Tensor:
        import torch

        return torch.cat(self.parts, 2)


def plain(linear: Any) -> Tensor:
    """A linear layer's weight as a plain tensor (put back if the layer packed it: tfcli/model/linear.py)."""
    linear.unpack()
    return linear.weight.detach()


def run_senders(model: TransformerModel, ids: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """A pass keeping every sender's output: (logits from the batch's first metric position, outputs (B, T, S, d))."""
    senders = Senders(model)
    logits = model.run_with_hooks(ids, senders.hooks(), **batch.keep)
    return logits, senders.outputs


def position_means(outputs: Tensor, lengths: Tensor) -> Tensor:
    """(B, T, S, d) -> each pair's mean over its own positions but the first (1 .. `lengths` (B,) - 1), at every
    position but the first, which keeps its own output. Position 0 is the attention sink: its outputs are orders of
    magnitude larger than the others' (SmolLM2-135M's L11.mlp: norm 21,931 there, about 31 elsewhere), so a mean
    over it is its output shrunk, not a typical one (every edge of L11.mlp then scored largest), and putting a mean
    in its place moves the sink every later position attends to. A per-position mean over the dataset
    (TransformerLens's mean ablation) would need texts whose positions play the same roles and a pass over the
    dataset before the scores; this needs neither."""
    import torch

    positions = torch.arange(outputs.shape[1], device=outputs.device)[None]
    inside = ((positions > 0) & (positions < lengths[:, None])).to(outputs.dtype)
    counts = (lengths - 1).clamp(min=1)[:, None, None].to(outputs.dtype)
    means = (outputs * inside[:, :, None, None]).sum(1) / counts  # (B, S, d)
    counter = means[:, None].expand_as(outputs).clone()
    counter[:, 0] = outputs[:, 0]
    return counter


def counterfactual_of(model: TransformerModel, batch: Batch, kind: str, clean: Tensor) -> tuple[Tensor, Tensor]:
    """(m(empty) (B,): the metric with every edge patched, the counterfactual outputs (B, T, S, d)) given the clean
    outputs: the corrupt run's (m(empty) is the corrupt metric), or each pair's clean outputs' mean over its
    positions."""
    import torch

    with torch.no_grad():
        if kind == "corrupt":
            logits, counter = run_senders(model, batch.corrupt, batch)
            return batch.metric(logits), counter
        counter = position_means(clean, batch.lengths)
        empty = torch.zeros_like(graph_of(model.config).mask)
        return patched_metrics(model, batch, counter, [empty])[:, 0], counter


def counterfactuals(model: TransformerModel, batch: Batch, kind: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(clean metric (B,), m(empty) (B,), the clean outputs (B, T, S, d), the counterfactual outputs (B, T, S, d))."""
    import torch

    with torch.no_grad():
        logits, clean = run_senders(model, batch.clean, batch)
    empty, counter = counterfactual_of(model, batch, kind, clean)
    return batch.metric(logits), empty, clean, counter


# ---------------------------------------------------------------- the scores


def gradients(model: TransformerModel, batch: Batch, sites: list[tuple[str, int, int]], ids: Tensor | None = None,
              hooks: dict[str, Callable] | None = None) -> tuple[Tensor, list[Tensor]]:
    """A clean run (or of `ids`, rows repeating the batch's pairs) with autograd, `hooks` as well: (metric (B',), the
    gradient of the summed metric at each of `sites` (B', T, n, d)). What block 0 reads is the leaf (after its hook)."""
    import torch

    hooks = dict(hooks or {})
    first = block_site(0, "resid_pre")
    given = hooks.get(first)

    def begin(x: Tensor) -> Tensor:
        changed = given(x) if given is not None else None
        return (x if changed is None else changed).detach().requires_grad_()

    hooks[first] = begin
    kept: dict[str, Tensor] = {}
    for site, _, _ in sites:
        hooks[site] = lambda x, site=site: kept.__setitem__(site, x)
    with torch.enable_grad():
        metric = batch.metric(model.run_with_hooks(batch.clean if ids is None else ids, hooks, **batch.keep))
        grads = torch.autograd.grad(metric.sum(), [kept[site] for site, _, _ in sites])
    return metric.detach(), [g if g.dim() == 4 else g[:, :, None] for g in grads]


def edge_scores(graph: Graph, differences: Tensor, grads: list[Tensor], sites: list[tuple[str, int, int]],
                senders: tuple[int, int] | None = None) -> Tensor:
    """(B, S, R) float64: each edge's (counterfactual - clean sender output) . gradient at the receiver, summed over
    positions; `differences` (B, T, S, d), `grads` per receiver site (B, T, n, d) (consecutive sites); only senders
    [first, last) when given. A batched product per block of SCORE_COLUMNS receivers or so: (B, s, T x d) by (B, T x
    d, n), s the senders the block's last receiver reads (the rest of the block's products are not edges: zeroed),
    the gradients laid out with d innermost (a transposed copy of them cost as much as the products). On 8 SmolLM2
    pairs: 0.8 s, where a product per site took 2.3 s (it read the differences once per site)."""
    import torch

    batch, length, count, width = differences.shape
    low, high = senders or (0, count)
    by_sender = differences.permute(0, 2, 1, 3).reshape(batch, count, length * width)  # (B, S, T x d)
    scores = torch.zeros(batch, count, len(graph.receivers), dtype=torch.float64)
    blocks = site_blocks(sites)
    for block in blocks:
        first, last = sites[block[0]][1], sites[block[-1]][1] + sites[block[-1]][2]
        reads = min(max(graph.reads(r) for r in range(first, last)), high)
        if reads <= low:
            continue
        columns = torch.cat([grads[i] for i in block], 2).to(differences.dtype)  # (B, T, n, d)
        columns = columns.permute(0, 2, 1, 3).reshape(batch, last - first, length * width)  # d stays innermost
        product = torch.bmm(by_sender[:, low:reads], columns.transpose(1, 2)).double()
        scores[:, low:reads, first:last] = product * graph.mask[low:reads, first:last]
    return scores


def ig_activation_scores(model: TransformerModel, batch: Batch, graph: Graph, clean: Tensor, counter: Tensor,
                         steps: int) -> Tensor:
    """(B, S, R): eap-ig-activations. Per group of senders (Graph.groups), one run of `steps` x B rows, row block k
    adding (1 - k / steps) (counterfactual - clean) of the group's summed output where the group writes it, and the
    gradient at the receivers after the group averaged over the blocks."""
    import torch

    sites = receiver_sites(model)
    differences = counter - clean
    pairs = batch.clean.shape[0]
    weights = 1 - torch.arange(1, steps + 1, dtype=clean.dtype, device=clean.device) / steps  # (steps,)
    ids = batch.clean.repeat(steps, 1)
    scores = torch.zeros(pairs, len(graph.senders), len(graph.receivers), dtype=torch.float64)
    for first, count, site in graph.groups():
        shift = (weights[:, None, None, None] * differences[None, :, :, first:first + count].sum(3)).flatten(0, 1)
        after = [one for one in sites if graph.reads(one[1]) > first]

        def add(x: Tensor, shift: Tensor = shift) -> Tensor:
            return x + shift.to(x.dtype)
        grads = gradients(model, batch, after, ids, {site: add})[1]
        grads = [g.view(steps, pairs, *g.shape[1:]).mean(0) for g in grads]
        scores += edge_scores(graph, differences, grads, after, (first, first + count))
    return scores


def scores_of(model: TransformerModel, batch: Batch, method: str, steps: int, counterfactual: str = "corrupt"
              ) -> tuple[Tensor, Tensor, Tensor]:
    """(clean metric (B,), m(empty) (B,), scores (B, S, R)) of a batch of pairs by `method`."""
    graph = graph_of(model.config)
    if method in ("exact", "eap-ig-activations"):
        clean_metric, empty, clean, counter = counterfactuals(model, batch, counterfactual)
        if method == "exact":
            return clean_metric, empty, exact_scores(model, batch, graph, counter - clean, clean_metric)
        return clean_metric, empty, ig_activation_scores(model, batch, graph, clean, counter, steps)
    sites = receiver_sites(model)
    senders = Senders(model)  # eap, eap-ig-inputs: the clean run with autograd keeps the clean outputs
    clean_metric, grads = gradients(model, batch, sites, hooks=senders.hooks())
    clean = senders.outputs
    empty, counter = counterfactual_of(model, batch, counterfactual, clean)
    first, points = block_site(0, "resid_pre"), steps if method == "eap-ig-inputs" else 1
    for k in range(points - 1, 0, -1):  # eap-ig-inputs: the inputs k / steps of the way from the counterfactual
        point = counter[:, :, 0] + (k / points) * (clean[:, :, 0] - counter[:, :, 0])
        found = gradients(model, batch, sites, hooks={first: lambda x, point=point: point.to(x.dtype)})[1]
        grads = [a + b for a, b in zip(grads, found)]
    grads = [g / points for g in grads]
    return clean_metric, empty, edge_scores(graph, counter - clean, grads, sites)


# ---------------------------------------------------------------- patched runs


def input_hooks(model: TransformerModel, update: Callable[[int, int, int], Tensor | None]) -> dict[str, Callable]:
    """Hooks that add update(first, count, rows) ((rows, T, count, d), or None: nothing) to each receiver site's
    input."""
    hooks = {}
    for site, first, count in receiver_sites(model):
        def add(x: Tensor, first=first, count=count) -> Tensor | None:
            change = update(first, count, x.shape[0])
            if change is None:
                return None
            return x + (change if x.dim() == 4 else change[:, :, 0])
        hooks[site] = add
    return hooks


def exact_scores(model: TransformerModel, batch: Batch, graph: Graph, differences: Tensor, clean: Tensor) -> Tensor:
    """(B, S, R) float64: each edge patched alone, its receiver reading sender's counterfactual output instead of its
    clean one, metric(patched) - metric(clean); `differences` (B, T, S, d) counterfactual - clean outputs. Runs of
    EXACT_ROWS rows, (edges x pairs)."""
    import torch

    pairs = batch.clean.shape[0]
    edges = graph.mask.nonzero().tolist()
    scores = torch.zeros(pairs, len(graph.senders), len(graph.receivers), dtype=torch.float64)
    chunk = max(1, EXACT_ROWS // pairs)
    for start in range(0, len(edges), chunk):
        part = edges[start:start + chunk]

        def update(first: int, count: int, rows: int) -> Tensor | None:
            mine = [(i, s, r - first) for i, (s, r) in enumerate(part) if first <= r < first + count]
            if not mine:
                return None
            change = differences.new_zeros(len(part), pairs, differences.shape[1], count, differences.shape[3])
            for i, s, at in mine:
                change[i, :, :, at] = differences[:, :, s]
            return change.flatten(0, 1)

        ids = batch.clean.repeat(len(part), 1)
        with torch.no_grad():
            patched = batch.metric(model.run_with_hooks(ids, input_hooks(model, update), **batch.keep))
        patched = patched.view(len(part), pairs)
        for i, (s, r) in enumerate(part):
            scores[:, s, r] = patched[i] - clean
    return scores


class Deltas(Senders):
    """Senders' hooks that keep, as a pass reaches each sender, its counterfactual - actual output (`each` (S, B, T,
    d), row s written when the pass reaches sender s) and the running sums: `prefix[k]` (B, T, d) the sum over the
    first k senders."""

    def __init__(self, model: TransformerModel, counter: Tensor):
        super().__init__(model)
        self.counter, self.each, self.prefix, self.reached = counter, None, [], 0

    def keep_input(self, x: Tensor) -> None:
        super().keep_input(x)
        batch, length, count, width = self.counter.shape
        self.each, self.prefix, self.reached = x.new_empty(count, batch, length, width), [x.new_zeros(x.shape)], 0
        self.added()

    def keep_heads(self, layer: int, z: Tensor) -> None:
        super().keep_heads(layer, z)
        self.added()

    def keep_mlp(self, out: Tensor) -> None:
        super().keep_mlp(out)
        self.added()

    def added(self) -> None:
        """The newest part's senders' differences, and the running sums past them."""
        import torch

        part = self.parts[-1]
        for k in range(part.shape[2]):
            s = self.reached
            torch.sub(self.counter[:, :, s], part[:, :, k], out=self.each[s])
            self.prefix.append(self.prefix[-1] + self.each[s])
            self.reached += 1


def patched_metrics(model: TransformerModel, batch: Batch, counter: Tensor, circuits: list[Tensor]) -> Tensor:
    """(B, K): the metric of each (S, R) circuit on the clean run, every edge outside it patched, its receiver reading
    its sender's counterfactual output (`counter` (B, T, S, d)) in place of the output the sender gives in this run.
    A receiver's input gains the sum of the differences of all the senders it reads (a running sum) less those of
    its edges in the circuit: one product (receivers, s) @ (s, B x T x d) per receiver site, s the senders of the
    circuit's edges into the site, or all it reads when they are many (a stack of them per site took 8 of a 14 s
    pass on SmolLM2 for a circuit of 60,000 edges)."""
    import torch

    graph = graph_of(model.config)
    values = []
    with torch.no_grad():
        for circuit in circuits:
            inside = circuit & graph.mask
            deltas = Deltas(model, counter)

            def update(first: int, count: int, rows: int, inside: Tensor = inside, deltas: Deltas = deltas) -> Tensor:
                reads = graph.reads(first)
                change = deltas.prefix[reads][:, :, None].expand(-1, -1, count, -1)
                kept = inside[:reads, first:first + count]  # (s, count)
                used = kept.any(1).nonzero().flatten()
                if not len(used):
                    return change
                flat = deltas.each.view(deltas.each.shape[0], -1)  # (S, B x T x d)
                if len(used) > reads // 4:  # the senders it reads are a view; a few of them, copied
                    weights, differences = kept, flat[:reads]
                else:
                    weights, differences = kept[used], flat.index_select(0, used)
                inner = (weights.T.to(flat.dtype) @ differences).view(count, *deltas.each.shape[1:])
                return change - inner.permute(1, 2, 0, 3)

            hooks = input_hooks(model, update)
            hooks.update(deltas.hooks())
            values.append(batch.metric(model.run_with_hooks(batch.clean, hooks, **batch.keep)))
    return torch.stack(values, 1) if values else counter.new_zeros(counter.shape[0], 0, dtype=torch.float64)


def circuit_metrics(model: TransformerModel, batch: Batch, circuits: list[Tensor], counterfactual: str = "corrupt",
                    ends: bool = True) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """(clean metric (B,), m(empty) (B,), metric (B, K)) of each (S, R) circuit (`patched_metrics`). `ends` False: the
    first two are None, not run (a caller that has them from an earlier run: the corrupt counterfactual then takes
    no clean pass, the mean no run with every edge patched)."""
    import torch

    if ends:
        clean, empty, _, counter = counterfactuals(model, batch, counterfactual)
        return clean, empty, patched_metrics(model, batch, counter, circuits)
    with torch.no_grad():
        counter = run_senders(model, batch.corrupt if counterfactual == "corrupt" else batch.clean, batch)[1]
    if counterfactual == "mean":
        counter = position_means(counter, batch.lengths)
    return None, None, patched_metrics(model, batch, counter, circuits)


# ---------------------------------------------------------------- picking circuits


def site_blocks(sites: list[tuple]) -> list[list[int]]:
    """The receiver sites (each (name, first receiver, receivers)) cut into runs of about SCORE_COLUMNS receivers: one
    product of the edges' scores each."""
    blocks: list[list[int]] = [[]]
    for i, (_, _, n) in enumerate(sites):
        if sum(sites[k][2] for k in blocks[-1]) + n > SCORE_COLUMNS and blocks[-1]:
            blocks.append([])
        blocks[-1].append(i)
    return blocks


def greedy_order(graph: Graph, scores: Tensor, roots: int = 1) -> list[tuple[int, int]]:
    """Every edge, in the order the greedy search from the logits adds them (the reference's apply_greedy): the edge of
    largest |score| among those into a node already in the circuit (at first the logits: the last `roots`
    receivers), its sender joining the circuit and the edges into it joining the candidates. Ties: in graph order."""
    magnitude = scores.abs().tolist()
    heap: list[tuple[float, int, int]] = []

    def candidates(receivers: list[int]) -> None:
        for r in receivers:
            for s in range(graph.reads(r)):
                heapq.heappush(heap, (-magnitude[s][r], s, r))

    candidates(list(range(len(graph.receivers) - roots, len(graph.receivers))))
    inside, order = {None}, []
    while heap:
        _, s, r = heapq.heappop(heap)
        order.append((s, r))
        if s not in inside:
            inside.add(s)
            candidates(graph.inputs_of(s))
    assert len(order) == graph.edge_count
    return order


def circuit_of(graph: Graph, edges: list[tuple[int, int]]) -> Tensor:
    """(S, R) bool: these edges."""
    circuit = graph.mask.new_zeros(graph.mask.shape)
    circuit[[s for s, _ in edges], [r for _, r in edges]] = True
    return circuit
