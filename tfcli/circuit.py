"""`tfcli circuit`: which edges between components carry a task, and how faithful the circuit they make is.

The graph (as the EAP-IG reference, hannamw/EAP-IG, builds it): the nodes are the input (the embeddings, what block
0 reads), every attention head `L{l}H{h}`, every MLP `L{l}.mlp` and the logits. Every node writes into the residual
stream; every later one reads from it, a head through its query, key and value inputs separately (receivers
`L{l}H{h}.q`, `.k`, `.v`; a grouped-query model's key and value inputs per query head, ungrouped as the reference
does), an MLP through its input (`L{l}.mlp`) and the logits through the final norm (`logits`). An edge is a sender
and a receiver that reads it: `L5H1->L9H6.q`. The receivers' inputs are the model's split-input sites
(`blocks.{l}.q_input`, `k_input`, `v_input`, `mlp_in`; the last block's `resid_post` for the logits), each one a copy
of the residual stream of its own (tfcli/model/sites.py).

Scores over clean/corrupt pairs, the metric a pair's target - foil logit difference (as `patch`):
- `eap` (Syed et al. 2023): (sender's corrupt - clean output) . d metric / d (receiver's input), the gradient on the
  clean run, summed over positions, averaged over pairs: the first-order estimate of patching the edge alone.
- `eap-ig-inputs` (Hanna et al. 2024): the gradient averaged over `steps` runs whose input embeddings go from the
  corrupt to the clean ones, at k / steps for k = 1 .. steps (one step: EAP).
- `exact`: each edge patched for real, the receiver reading the sender's corrupt output instead of its clean one:
  metric(patched) - metric(clean). One run per edge: for small models and checks.

A circuit C's faithfulness: every edge outside it patched (its receiver reading the sender's corrupt output in place
of the one it gives in this run), (m(C) - m(empty)) / (m(full) - m(empty)) summed over the pairs, with a bootstrap
interval (`measure`; circuits picked greedily from the logits backwards: `greedy_order`).

Shapes: B pairs, T tokens, d the model width, H heads, D head size, S senders, R receivers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Dataset, Done, Line, check_one_metric
from tfcli.analysis.metric import Token, check_head, parse_metric
from tfcli.analysis.names import block_site
from tfcli.analysis.pairs import PAIR_LINE, Pair, check_pair
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

METHODS = ("eap", "eap-ig-inputs", "exact")
SIZES = (10, 30, 100, 300, 1000)  # the faithfulness curve's circuit sizes, in edges (capped at the graph's)
BATCH = 8  # pairs run together
EXACT_ROWS = 64  # rows (edges x pairs) of one exact run
DEFAULT_TOP = 100  # the circuit's edges without --top, --faithful or --edges


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


def graph_of(config: ModelConfig) -> Graph:
    return Graph(config.num_hidden_layers, config.num_attention_heads, config.parallel_residual)


def check_model(config: ModelConfig) -> None:
    """What the graph needs, before any model is built: a decoder with an LM head whose blocks add each sublayer's
    output to the residual stream as it is (pre-norm, or parallel)."""
    if config.architecture != "decoder":
        kind = "an encoder-only model" if config.architecture == "encoder" else "an encoder-decoder"
        raise usage_error(f"{config.name} is {kind}: circuit reads a decoder's logits at a pair's last token",
                          "use a decoder-only model with an LM head (GPT-2, Llama, SmolLM2, ...)")
    check_head(config, ("lm",), "circuit reads the logit difference of two tokens", "use a model with an LM head")
    if config.norm_position != "pre":
        raise usage_error(f"{config.name} has {config.norm_position}-norm blocks: a circuit's edges need each "
                          "sublayer's output added to the residual stream as it is (pre-norm blocks)",
                          "use a pre-norm model (GPT-2, Llama, Mistral, Qwen2, Pythia, ...)")
    if config.qk_norm == "projection":
        raise usage_error(f"{config.name} normalises its queries and keys over the whole projection: the heads' "
                          "inputs cannot be split")


# ---------------------------------------------------------------- options and circuits given


@dataclass
class CircuitOptions:
    method: str = "eap"
    steps: int = 5  # eap-ig-inputs
    top: int | None = None  # the circuit: the greedy top N edges ...
    faithful: float | None = None  # ... or the smallest reaching this faithfulness ...
    edges: list[tuple[int, int]] | None = None  # ... or these (--edges FILE)
    edges_file: str | None = None
    sizes: tuple[int, ...] = SIZES


def check_options(config: ModelConfig, options: CircuitOptions) -> None:
    """The model and the options, before any model is built."""
    check_model(config)
    if options.method not in METHODS:
        raise usage_error(f"method must be one of {', '.join(METHODS)}, got `{options.method}`", parameter="method")
    if options.steps < 1:
        raise usage_error(f"--ig-steps must be 1 or more, got {options.steps}", parameter="ig_steps")
    given = [name for name, value in (("--top", options.top), ("--faithful", options.faithful),
                                      ("--edges", options.edges_file)) if value is not None]
    if len(given) > 1:
        raise usage_error(f"give one of {', '.join(given)}: each picks the circuit")
    if options.faithful is not None and not 0 < options.faithful <= 1:
        raise usage_error(f"--faithful must be above 0 and at most 1, got {options.faithful}",
                          "a circuit's faithfulness is a share of the clean behaviour: 0.8 is 80%",
                          parameter="faithful")
    if options.top is not None and options.top < 1:
        raise usage_error(f"--top must be 1 or more, got {options.top}", parameter="top")
    if not options.sizes or any(size < 1 for size in options.sizes):
        raise usage_error("--sizes: give circuit sizes of 1 edge or more, e.g. 10,30,100", parameter="sizes")


def parse_sizes(spec: str | None) -> tuple[int, ...]:
    if spec is None:
        return SIZES
    try:
        return tuple(sorted({int(part) for part in spec.split(",") if part.strip()}))
    except ValueError:
        raise usage_error(f"--sizes: `{spec}` is not a list of numbers of edges", "e.g. --sizes 10,30,100",
                          parameter="sizes") from None


# ---------------------------------------------------------------- runs on a batch of pairs


@dataclass
class Batch:
    """Pairs as the model reads them: ids (B, T), right-padded to the longest pair (a causal stack: a position never
    reads the pads after it, and the metric's gradient is 0 there), and each pair's metric: its target, foil and
    position (B,)."""

    clean: Tensor
    corrupt: Tensor
    targets: Tensor
    foils: Tensor | None
    positions: Tensor

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
    length = max(len(pair.ids_clean) for pair in pairs)
    pad = tokenizer.pad_token_id or 0

    def padded(rows: list[list[int]]) -> Tensor:
        return torch.tensor([row + [pad] * (length - len(row)) for row in rows], device=device)

    return Batch(padded([p.ids_clean for p in pairs]), padded([p.ids_corrupt for p in pairs]), targets, foils,
                 torch.tensor([pair.end for pair in pairs], device=device))


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
            hooks[block_site(layer, "mlp.out")] = lambda out: self.parts.append(out.detach()[:, :, None])
        return hooks

    def keep_input(self, x: Tensor) -> None:
        self.parts = [x.detach()[:, :, None]]

    def keep_heads(self, layer: int, z: Tensor) -> None:
        weight = self.weights[layer]
        per_head = weight.view(weight.shape[0], z.shape[2], z.shape[3])  # (d, H, D)
        import torch

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


def gradients(model: TransformerModel, batch: Batch, start: Tensor | None = None) -> tuple[Tensor, Tensor, list]:
    """The clean run with autograd (its input `start`, (B, T, d), in place of what block 0 reads, when given): (metric
    (B,), sender outputs (B, T, S, d), the gradient of the summed metric at each receiver site, as receiver_sites
    lists them, (B, T, n, d))."""
    import torch

    sites = receiver_sites(model)
    kept: dict[str, Tensor] = {}
    senders = Senders(model)
    hooks = senders.hooks()

    def begin(x: Tensor) -> Tensor:
        leaf = (x if start is None else start.to(x.dtype)).detach().requires_grad_()
        senders.keep_input(leaf)
        return leaf

    hooks[block_site(0, "resid_pre")] = begin
    for site, _, _ in sites:
        hooks[site] = lambda x, site=site: kept.__setitem__(site, x)
    with torch.enable_grad():
        metric = batch.metric(model.run_with_hooks(batch.clean, hooks, **batch.keep))
        grads = torch.autograd.grad(metric.sum(), [kept[site] for site, _, _ in sites])
    return metric.detach(), senders.outputs, [g if g.dim() == 4 else g[:, :, None] for g in grads]


def edge_scores(graph: Graph, differences: Tensor, grads: list[Tensor], sites: list[tuple[str, int, int]]) -> Tensor:
    """(B, S, R) float64: each edge's (corrupt - clean sender output) . gradient at the receiver, summed over positions;
    `differences` (B, T, S, d), `grads` per receiver site (B, T, n, d). A batched product per site: (B, s, T x d) by
    (B, T x d, n)."""
    import torch

    batch, length, senders, width = differences.shape
    by_sender = differences.permute(0, 2, 1, 3).reshape(batch, senders, length * width)  # (B, S, T x d)
    scores = torch.zeros(batch, senders, len(graph.receivers), dtype=torch.float64)
    for (_, first, count), grad in zip(sites, grads):
        reads = graph.reads(first)
        columns = grad.to(differences.dtype).permute(0, 1, 3, 2).reshape(batch, length * width, count)
        scores[:, :reads, first:first + count] = torch.bmm(by_sender[:, :reads], columns).double()
    return scores


def scores_of(model: TransformerModel, batch: Batch, method: str, steps: int) -> tuple[Tensor, Tensor, Tensor]:
    """(clean metric (B,), corrupt metric (B,), scores (B, S, R)) of a batch of pairs by `method`."""
    import torch

    graph = graph_of(model.config)
    with torch.no_grad():
        corrupt_logits, corrupt = run_senders(model, batch.corrupt, batch)
        corrupt_metric = batch.metric(corrupt_logits)
        if method == "exact":
            clean_logits, clean = run_senders(model, batch.clean, batch)
            clean_metric = batch.metric(clean_logits)
            return clean_metric, corrupt_metric, exact_scores(model, batch, graph, corrupt - clean, clean_metric)
    sites = receiver_sites(model)
    if method == "eap":
        metric, clean, grads = gradients(model, batch)
    else:  # eap-ig-inputs: gradients at k / steps of the way from the corrupt input to the clean one, k = steps .. 1
        metric, clean, grads = gradients(model, batch)  # k = steps: the clean run itself, whose outputs it keeps
        for k in range(steps - 1, 0, -1):
            point = corrupt[:, :, 0] + (k / steps) * (clean[:, :, 0] - corrupt[:, :, 0])
            grads = [a + b for a, b in zip(grads, gradients(model, batch, point)[2])]
        grads = [g / steps for g in grads]
    return metric, corrupt_metric, edge_scores(graph, corrupt - clean, grads, sites)


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
    """(B, S, R) float64: each edge patched alone, its receiver reading sender's corrupt output instead of its clean
    one, metric(patched) - metric(clean); `differences` (B, T, S, d) corrupt - clean outputs. Runs of EXACT_ROWS rows,
    (edges x pairs)."""
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
            patched = batch.metric(model.run_with_hooks(ids, input_hooks(model, update), **batch.keep)).view(len(part), pairs)
        for i, (s, r) in enumerate(part):
            scores[:, s, r] = patched[i] - clean
    return scores


def circuit_metrics(model: TransformerModel, batch: Batch, circuits: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(clean metric (B,), corrupt metric (B,), metric (B, K)) of each (S, R) circuit: every edge outside it patched,
    its receiver reading its sender's corrupt output in place of the output the sender gives in this run."""
    import torch

    with torch.no_grad():
        corrupt_logits, corrupt = run_senders(model, batch.corrupt, batch)
        clean = batch.metric(model(batch.clean, **batch.keep).logits)
        values = []
        for circuit in circuits:
            outside = (~circuit).to(corrupt.dtype)  # (S, R)
            senders = Senders(model)

            def update(first: int, count: int, rows: int) -> Tensor:
                actual = senders.outputs
                known = actual.shape[2]
                return torch.einsum("btsd,sr->btrd", corrupt[:, :, :known] - actual,
                                    outside[:known, first:first + count])

            hooks = input_hooks(model, update)
            hooks.update(senders.hooks())
            values.append(batch.metric(model.run_with_hooks(batch.clean, hooks, **batch.keep)))
    return clean, batch.metric(corrupt_logits), torch.stack(values, 1) if values else clean[:, None][:, :0]


# ---------------------------------------------------------------- picking circuits


def greedy_order(graph: Graph, scores: Tensor) -> list[tuple[int, int]]:
    """Every edge, in the order the greedy search from the logits adds them (the reference's apply_greedy): the edge of
    largest |score| among those into a node already in the circuit (at first the logits), its sender joining the
    circuit and the edges into it joining the candidates. Ties: in graph order."""
    magnitude = scores.abs().tolist()
    mask = graph.mask
    heap: list[tuple[float, int, int]] = []

    def candidates(receivers: list[int]) -> None:
        for r in receivers:
            for s in range(graph.reads(r)):
                heapq.heappush(heap, (-magnitude[s][r], s, r))

    candidates([len(graph.receivers) - 1])
    inside, order = {None}, []
    while heap:
        _, s, r = heapq.heappop(heap)
        order.append((s, r))
        if s not in inside:
            inside.add(s)
            candidates(graph.inputs_of(s))
    assert len(order) == int(mask.sum())
    return order


def circuit_of(graph: Graph, edges: list[tuple[int, int]]) -> Tensor:
    """(S, R) bool: these edges."""
    circuit = graph.mask.new_zeros(graph.mask.shape)
    circuit[[s for s, _ in edges], [r for _, r in edges]] = True
    return circuit


def curve_sizes(graph: Graph, sizes: tuple[int, ...]) -> list[int]:
    """The curve's sizes, capped at the graph's edges (its size the last when one passed it)."""
    return sorted({min(size, graph.edge_count) for size in sizes})


# ---------------------------------------------------------------- over a dataset (or one pair)


@dataclass
class PairScores:
    """One pair's result: its clean and corrupt metric and its edges' scores (S, R) (0 where no edge)."""

    line: int | None
    clean_value: float
    corrupt_value: float
    scores: Tensor
    target: Token | None = None
    foil: Token | None = None
    graph: Graph | None = None


@dataclass
class CurvePoint:
    """A circuit measured: its size in edges and nodes, its faithfulness and the 95% bootstrap interval (None: none)."""

    edges: int
    nodes: int
    faithfulness: float
    low: float | None = None
    high: float | None = None


@dataclass
class Circuit:
    """The aggregate: the edges' scores averaged over the `n` pairs (S, R), the circuit picked (`picked`: "top",
    "faithful" or "edges", with `wanted` its N, F or file) with its faithfulness, and the curve."""

    graph: Graph
    method: str
    steps: int
    scores: Tensor
    clean_value: float  # means over the pairs
    corrupt_value: float
    target: Token | None  # None: the pairs' differ
    foil: Token | None
    n: int = 0
    pairs: int = 0
    skipped: int = 0
    resamples: int = 0
    interrupted: bool = False
    dataset: str = ""
    items: list[Pair] = field(default_factory=list, repr=False)
    picked: str = "top"
    wanted: Any = DEFAULT_TOP
    circuit: Tensor | None = None
    measured: CurvePoint | None = None
    curve: list[CurvePoint] = field(default_factory=list)
    measured_pairs: int = 0  # the pairs the faithfulness is over (fewer than n after a Ctrl-C)

    def top_edges(self, count: int | None = None) -> list[tuple[str, str, float, bool]]:
        """(sender, receiver, score, in the circuit) of the edges by |score|, largest first (ties in graph order)."""
        graph, scores = self.graph, self.scores
        edges = graph.mask.nonzero().tolist()
        edges.sort(key=lambda e: -abs(float(scores[e[0], e[1]])))
        return [(graph.senders[s], graph.receivers[r], float(scores[s, r]),
                 bool(self.circuit[s, r]) if self.circuit is not None else False) for s, r in edges[:count]]


@dataclass
class Measured:
    """Faithfulness of K circuits over `n` pairs: (K,) values with their intervals (None without a bootstrap)."""

    values: list[float]
    lows: list[float] | None
    highs: list[float] | None
    n: int
    interrupted: bool


def windows(pairs: list[Pair]) -> Iterator[list[Pair]]:
    """The pairs in batches of at most BATCH (right-padded together: Batch)."""
    for start in range(0, len(pairs), BATCH):
        yield pairs[start:start + BATCH]


def ordered(pairs: list[Pair], run: Callable[[list[Pair]], list[Any]], progress: Callable[[float], None] | None
            ) -> Iterator[Any]:
    """run(batch) over the pairs' batches, each result in the pairs' order."""
    for start, batch in zip(range(0, len(pairs), BATCH), windows(pairs)):
        results = run(batch)
        if progress is not None:
            progress(start + len(batch))
        yield from results


class OverPairs:
    """What both analyses of the runner (tfcli/runner.py) share: an item is a clean/corrupt pair, checked as patch's."""

    command, unit, line, block, streams = "circuit", "pairs", PAIR_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
        return check_pair(config, tokenizer, line)

    def check_items(self, pairs: list[Pair]) -> None:
        check_one_metric([(pair.line, pair.foil is not None) for pair in pairs])

    def shown(self, result: Any) -> Any:
        return result


@dataclass
class CircuitScores(OverPairs):
    """An item's result is its PairScores, the aggregate a Circuit (its circuit and faithfulness are measured after,
    by the command: `measure`)."""

    options: CircuitOptions

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[PairScores]:
        def run(batch: list[Pair]) -> list[PairScores]:
            clean, corrupt, scores = scores_of(model, batch_of(model, tokenizer, batch), self.options.method,
                                               self.options.steps)
            tokens = [parse_metric(model.config, tokenizer, p.target, p.foil, p.position, prefix="") for p in batch]
            return [PairScores(pair.line, float(a), float(b), s.float(), *metric, self.graph) for pair, a, b, s, metric
                    in zip(batch, clean.tolist(), corrupt.tolist(), scores, tokens)]
        return ordered(pairs, run, progress)

    def aggregate(self, done: Done, dataset: Dataset) -> Circuit:
        total, items, clean, corrupt, tokens = None, [], 0.0, 0.0, set()
        for pair, result in done:
            total = result.scores.double() if total is None else total + result.scores
            items.append(pair)
            tokens.add((result.target.id, result.foil and result.foil.id))
            first = result
            clean, corrupt = clean + result.clean_value, corrupt + result.corrupt_value
        n, options = len(items), self.options
        picked, wanted = ("edges", options.edges_file) if options.edges is not None else \
            ("faithful", options.faithful) if options.faithful is not None else ("top", options.top or DEFAULT_TOP)
        return Circuit(self.graph, options.method, options.steps, total / n, clean / n, corrupt / n,
                       *((first.target, first.foil) if len(tokens) == 1 else (None, None)), n=n, pairs=len(dataset.items),
                       skipped=dataset.skipped, resamples=dataset.resamples, interrupted=done.interrupted,
                       dataset=dataset.path, items=items, picked=picked, wanted=wanted)

    graph: Graph | None = None  # set by the command from the config (before any model is built)


@dataclass
class CircuitFaithfulness(OverPairs):
    """The faithfulness of K circuits (S, R): an item's result is (clean, corrupt, the metric of each circuit (K,)),
    the aggregate a Measured: sum(m(C) - m(empty)) / sum(m(full) - m(empty)) over the pairs, with the bootstrap's
    interval."""

    circuits: list[Tensor]

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[tuple[float, float, list[float]]]:
        def run(batch: list[Pair]) -> list[tuple[float, float, list[float]]]:
            clean, corrupt, values = circuit_metrics(model, batch_of(model, tokenizer, batch), self.circuits)
            return list(zip(clean.tolist(), corrupt.tolist(), values.tolist()))
        return ordered(pairs, run, progress)

    def aggregate(self, done: Done, dataset: Dataset) -> Measured:
        import torch

        from tfcli.analysis.dataset import ratio_of_means

        rows = [result for _, result in done]
        clean = torch.tensor([r[0] for r in rows], dtype=torch.float64)
        corrupt = torch.tensor([r[1] for r in rows], dtype=torch.float64)
        values = torch.tensor([r[2] for r in rows], dtype=torch.float64).view(len(rows), -1)
        if float((clean - corrupt).sum().abs()) < 1e-9:
            raise TfcliError("no faithfulness to measure: the clean and corrupt texts give the same metric "
                             "over the pairs", "choose corrupt texts on which the model behaves differently")
        score, low, high = ratio_of_means(values - corrupt[:, None], clean - corrupt, dataset.resamples)
        return Measured(score.tolist(), None if low is None else low.tolist(), None if high is None else high.tolist(),
                        len(rows), done.interrupted)


def measure(result: Circuit, options: CircuitOptions, run: Callable[[list[Tensor]], Measured]) -> None:
    """The circuit picked and the curve, each measured by run(circuits) (the faithfulness over the pairs): the curve's
    circuits and the picked one in one run; with --faithful, the smallest greedy circuit found reaching it, by
    bisection between the curve's sizes (the whole graph's faithfulness is 1)."""
    graph = result.graph
    order = greedy_order(graph, result.scores)
    sizes = curve_sizes(graph, options.sizes)
    circuits = [circuit_of(graph, order[:size]) for size in sizes]
    chosen = None
    if options.edges is not None:
        chosen = circuit_of(graph, options.edges)
    elif options.faithful is None:
        chosen = circuit_of(graph, order[:min(options.top or DEFAULT_TOP, graph.edge_count)])
    measured = run(circuits + ([chosen] if chosen is not None else []))
    if not measured.n:  # interrupted before any pair finished
        result.interrupted = True
        return
    points = [point(graph, circuit, measured, k) for k, circuit in enumerate(circuits)]
    result.curve, result.measured_pairs = points, measured.n
    result.interrupted |= measured.interrupted
    if chosen is not None:
        result.circuit, result.measured = chosen, point(graph, chosen, measured, len(circuits))
        return
    wanted = options.faithful
    low, high = 0, graph.edge_count
    best = None
    for size, p in zip(sizes, points):
        if p.faithfulness >= wanted:
            high, best = size, p
            break
        low = size
    while high - low > 1 and not result.interrupted:
        middle = (low + high) // 2
        circuit = circuit_of(graph, order[:middle])
        again = run([circuit])
        result.interrupted |= again.interrupted
        if again.n < result.measured_pairs:  # interrupted: what finished is not comparable; keep what was measured
            break
        found = point(graph, circuit, again, 0)
        if found.faithfulness >= wanted:
            high, best = middle, found
        else:
            low = middle
    if best is None or best.edges != high:
        whole = circuit_of(graph, order[:high])
        best = CurvePoint(high, len(graph.nodes_of(whole)), 1.0, None, None) if high == graph.edge_count else \
            point(graph, whole, run([whole]), 0)
    result.circuit, result.measured = circuit_of(graph, order[:best.edges]), best


def point(graph: Graph, circuit: Tensor, measured: Measured, k: int) -> CurvePoint:
    return CurvePoint(int(circuit.sum()), len(graph.nodes_of(circuit)), measured.values[k],
                      measured.lows[k] if measured.lows else None, measured.highs[k] if measured.highs else None)
