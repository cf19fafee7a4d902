"""`tfcli circuit --method edge-pruning`: Edge Pruning (Bhaskar et al., NeurIPS 2024, "Finding Transformer Circuits
with Edge Pruning"; princeton-nlp/Edge-Pruning). Every edge of the graph (edges.py) gets a hard-concrete mask z in
[0, 1] (Louizos et al. 2018: log alpha per edge, stretched to (-0.1, 1.1), temperature 2/3, clamped), and a
receiver reads, from each sender, z times its output in this run plus (1 - z) times its counterfactual output (the
corrupt run's, or the means: edges.py's counterfactuals):

    input(receiver) = x + sum over senders s of (1 - z[s, receiver]) (counterfactual_s - output_s)

where x is what the receiver reads unmasked (a 0/1 mask is the circuit's patched run, as `patched_metrics` does it).
The masks are trained on the pairs, a batch of pairs per step, for the paper's faithfulness loss: the KL divergence
from the full model's next-token distribution to the masked one at the metric position (the paper's loss for IOI;
it does not reward a circuit that overshoots the clean logit difference, as a loss on the logit difference would),
plus the paper's Lagrangian on the expected sparsity s (the share of edges whose mask is 0):

    loss = KL + l1 (s - t) + l2 (s - t)^2

l1, l2 trained to maximise it, the masks to minimise it, the target t raised linearly from 0 to the wanted sparsity
over the first WARMUP of the steps (the paper: 2,500 of 3,000). The optimiser is the paper's code's (its
fpt2_ioi.py): AdamW, learning rate 0.8 and torch's weight decay 0.01 for both, the rate rising linearly from 0 over
the first LR_WARMUP of the steps and falling linearly to 0 at the last (transformers' linear schedule with warm-up).
The weight decay matters: a log alpha the KL has driven high leaves the hard concrete's range (every draw clamped to
1, the sparsity term's gradient P(z > 0) P(z = 0) l1 / edges under Adam's epsilon) and only the decay brings it
back; with Adam alone, on SmolLM2, the expected kept edges stalled at 85,000 from step 190 to 375 of 1,000 while the
target fell to 72,000. The circuit found: the round(expected kept) edges of largest log alpha (the paper's
deterministic mask). An edge's score is -ln P(z = 0), how surely the masks keep it (its probability of being kept,
P(z > 0), is 1 - e^-score): it orders the greedy curve as any method's scores do, by log alpha, where P(z > 0) reads
1 for every edge well kept.

The masks are (S, R) over the position-blind graph; a mask per (edge, span) would add a span axis to `log_alpha` and
to `weights` (`MaskedRun` reads its (S, R) slice per receiver site). Shapes: B pairs, T tokens, d the model width, H
heads, D head size, S senders, R receivers, V the vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.names import block_site
from tfcli.commands.circuit.edges import (Batch, Graph, batch_of, counterfactual_of, graph_of, input_hooks, plain,
                                          run_senders)

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.pairs import Pair
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

METHOD = "edge-pruning"
LEFT, RIGHT, TEMPERATURE = -0.1, 1.1, 2 / 3  # the hard concrete's stretch and temperature (the paper's l0.py)
EPS = 1e-6  # the uniform noise's bounds
KEEP_SHIFT = TEMPERATURE * math.log(-LEFT / RIGHT)  # log alpha - KEEP_SHIFT: the log odds of a mask's z > 0
START = 3.0  # every log alpha at first: each edge kept with probability 0.99 (the paper: 10; see `train`)
LEARNING_RATE = 0.8  # AdamW's, for the masks and the Lagrange multipliers (the paper's IOI runs)
WEIGHT_DECAY = 0.01  # AdamW's (torch's default, which the paper's code keeps): it pulls every log alpha towards 0
WARMUP = 5 / 6  # the share of the steps over which the target sparsity rises from 0 (the paper: 2,500 of 3,000)
LR_WARMUP = 1 / 15  # the share over which the learning rate rises from 0, then falls to 0 at the end (200 of 3,000)
STEPS = 200
MERGE = 8  # groups of senders joined into one block of differences (MaskedRun)
TARGET_EDGES = 1000


@dataclass(kw_only=True)
class PruningOptions:
    """--steps, --target-edges; the batch of pairs per step; the noise's seed."""

    steps: int = STEPS
    target_edges: int = TARGET_EDGES
    batch: int = 8
    seed: int = 0
    learning_rate: float = LEARNING_RATE


@dataclass
class Pruned:
    """The trained masks' log alpha (S, R) float32 (off-graph entries unused), the steps run (of `planned`), the
    edges they were trained to keep, each step's KL and expected kept edges, and whether Ctrl-C ended the training
    (the masks so far are kept)."""

    log_alpha: Tensor
    steps: int
    planned: int = 0
    target_edges: int = 0
    kl: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)
    interrupted: bool = False

    def scores(self, graph: Graph) -> Tensor:
        """(S, R) float64: each edge's -ln P(z = 0) = softplus(log alpha - KEEP_SHIFT), 0 off the graph. Increasing in
        log alpha, positive, and unsaturated: P(z > 0) is 1.0 in float64 from a log alpha of about 35, which the
        training passes, and a curve ordered by it ties every edge kept."""
        import torch

        return torch.nn.functional.softplus(self.log_alpha.double() - KEEP_SHIFT) * graph.mask

    def circuit(self, graph: Graph) -> list[tuple[int, int]]:
        """The found circuit's edges: the round(expected kept) of largest log alpha (ties in graph order)."""
        import torch

        edges = graph.mask.nonzero()
        alphas = self.log_alpha[edges[:, 0], edges[:, 1]]
        count = int(round(float(keep_probability(alphas.double()).sum())))
        order = torch.sort(-alphas, stable=True).indices[:count]
        return [tuple(edge) for edge in edges[order].tolist()]


# ---------------------------------------------------------------- the hard concrete


def keep_probability(log_alpha: Tensor) -> Tensor:
    """P(z > 0) of each mask: sigmoid(log alpha - temperature log(-left / right))."""
    import torch

    return torch.sigmoid(log_alpha - KEEP_SHIFT)


def sample(log_alpha: Tensor, generator: object) -> Tensor:
    """A draw of the masks (same shape): sigmoid((log u - log(1 - u) + log alpha) / temperature), stretched to (left,
    right) and clamped to [0, 1]."""
    import torch

    u = torch.rand(log_alpha.shape, generator=generator).clamp(EPS, 1 - EPS).to(log_alpha.device)
    s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / TEMPERATURE)
    return (s * (RIGHT - LEFT) + LEFT).clamp(0, 1)


# ---------------------------------------------------------------- the masked forward


class MaskedRun:
    """Hooks for one pass in which receiver r reads sender s's output weighted by `weights[s, r]` and its
    counterfactual weighted by 1 - weights[s, r] (`weights` (S, R), any real values, differentiable). As the pass
    reaches each group of senders (the input; a layer's heads; a layer's MLP) it keeps their counterfactual - actual
    outputs (n, B x T x d), with autograd, every MERGE groups joined into one block (each kept twice at most); a
    receiver site adds, per block and group it reads, (1 - weights[block, site])^T @ differences. A product per group
    and site took 6 s and 4 GB for 2 SmolLM2 pairs (3,600 thin products, each slice of the weights a full (S, R)
    gradient); a stack of all the senders per site, a copy of them per layer."""

    def __init__(self, model: TransformerModel, counter: Tensor, weights: Tensor):
        self.graph = graph_of(model.config)
        self.counter = counter.permute(2, 0, 1, 3)  # (S, B, T, d)
        self.weights = weights
        self.out = [plain(block.attn.out) for block in model.output_stack.blocks]  # (d, H x D)
        self.blocks: list[tuple[int, Tensor]] = []  # (first sender, differences (n, B x T x d)), joined
        self.pending: list[tuple[int, Tensor]] = []  # the groups since
        self.shape: tuple[int, ...] = ()  # (B, T, d)

    def keep(self, first: int, outputs: Tensor) -> None:
        """outputs (n, B, T, d) of senders first .. first + n."""
        import torch

        count = outputs.shape[0]
        self.shape = tuple(outputs.shape[1:])
        differences = self.counter[first:first + count].to(outputs.dtype) - outputs
        self.pending.append((first, differences.reshape(count, -1)))
        if len(self.pending) == MERGE:
            self.blocks.append((self.pending[0][0], torch.cat([part for _, part in self.pending])))
            self.pending = []

    def keep_heads(self, layer: int, z: Tensor) -> None:
        import torch

        weight = self.out[layer]
        per_head = weight.view(weight.shape[0], z.shape[2], z.shape[3]).to(z.dtype)  # (d, H, D)
        self.keep(1 + layer * (self.graph.heads + 1), torch.einsum("bthe,dhe->hbtd", z, per_head))

    def change(self, first: int, count: int, rows: int) -> Tensor:
        """(B, T, count, d): what receivers first .. first + count gain."""
        reads = self.graph.reads(first)
        taken = 1 - self.weights[:reads, first:first + count]  # (reads, count)
        total = None
        for start, differences in self.blocks + self.pending:
            if start >= reads:
                break
            n = min(differences.shape[0], reads - start)  # a parallel block's MLP does not read its heads
            part = taken[start:start + n].T.to(differences.dtype) @ differences[:n]  # (count, B x T x d)
            total = part if total is None else total + part
        return total.view(count, *self.shape).permute(1, 2, 0, 3)

    def hooks(self, model: TransformerModel) -> dict[str, Callable]:
        hooks = input_hooks(model, self.change)
        hooks[block_site(0, "resid_pre")] = lambda x: self.keep(0, x[None])
        for layer in range(self.graph.layers):
            hooks[block_site(layer, "attn.z")] = lambda z, layer=layer: self.keep_heads(layer, z)
            hooks[block_site(layer, "mlp.out")] = lambda out, layer=layer: self.keep(
                1 + layer * (self.graph.heads + 1) + self.graph.heads, out[None])
        return hooks


def masked_logits(model: TransformerModel, batch: Batch, counter: Tensor, weights: Tensor) -> Tensor:
    """(B, K, V): the logits of the clean run (from the batch's first metric position, `Batch.keep`) with every edge
    read through `weights` (S, R) (MaskedRun), under the caller's autograd mode; `counter` (B, T, S, d)."""
    run = MaskedRun(model, counter, weights)
    return model.run_with_hooks(batch.clean, run.hooks(model), **batch.keep)


def at_metric(batch: Batch, logits: Tensor) -> Tensor:
    """(B, K, V) -> (B, V): each pair's logits at its metric position."""
    import torch

    at = batch.positions - (batch.clean.shape[1] - logits.shape[1])
    return logits[torch.arange(logits.shape[0], device=logits.device), at]


def kl_loss(full: Tensor, masked: Tensor) -> Tensor:
    """The mean over pairs of KL(full || masked), from (B, V) logits each."""
    import torch

    full_log, masked_log = torch.log_softmax(full.float(), -1), torch.log_softmax(masked.float(), -1)
    return (full_log.exp() * (full_log - masked_log)).sum(-1).mean()


# ---------------------------------------------------------------- training


def target_sparsity(step: int, steps: int, final: float) -> float:
    """The Lagrangian's target at `step` (0-based): from 0 up to `final` over the first WARMUP of the steps."""
    warmup = max(1, round(WARMUP * steps))
    return final * min(1.0, step / warmup)


def learning_rate_scale(step: int, steps: int) -> float:
    """The learning rate's factor at `step` (0-based): rising from 0 over the first LR_WARMUP of the steps, then
    falling linearly to 0 at `steps` (transformers' get_linear_schedule_with_warmup, which the paper's code uses)."""
    warmup = max(1, round(LR_WARMUP * steps))
    if step < warmup:
        return step / warmup
    return max(0.0, (steps - step) / max(1, steps - warmup))


def train(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair], counterfactual: str,
          options: PruningOptions, progress: Callable[..., None] | None = None) -> Pruned:
    """The masks trained on `pairs` (a batch of `options.batch` pairs per step, the pairs in a seeded random order each
    pass over them) for options.steps steps; `progress(steps done, steps, note)`. Ctrl-C ends the training with the
    masks so far (`Pruned.interrupted`). Every log alpha starts at START = 3, not the paper's 10: at 10 a draw of the
    mask is 1 (clamped, no gradient) but for 2 in 10,000, and the sparsity term's gradient on a log alpha, l1
    P(z > 0) (1 - P(z > 0)) / edges, is under Adam's epsilon (1e-8) until the multipliers have grown, or the weight
    decay brought it down, over hundreds of steps (the paper runs 3,000 on a GPU; on SmolLM2's 123,211 edges over 30
    steps on a CPU no mask moved); at 3, a fifth of the draws fall inside (0, 1) and the masks move from the first
    step."""
    import torch

    graph = graph_of(model.config)
    final = 1 - min(options.target_edges, graph.edge_count) / graph.edge_count
    log_alpha = torch.full(graph.mask.shape, START, device=model.device, requires_grad=True)
    lambdas = torch.zeros(2, device=model.device, requires_grad=True)
    optimiser = torch.optim.AdamW([{"params": [log_alpha]}, {"params": [lambdas], "maximize": True}],
                                  lr=options.learning_rate, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: learning_rate_scale(step, options.steps))
    generator = torch.Generator().manual_seed(options.seed)
    edges = graph.mask.to(model.device)
    pruned = Pruned(log_alpha.detach(), 0, options.steps, min(options.target_edges, graph.edge_count))
    order: list[int] = []
    try:
        for step in range(options.steps):
            if len(order) < options.batch:
                order += torch.randperm(len(pairs), generator=generator).tolist()
            chosen, order = [pairs[i] for i in order[:options.batch]], order[options.batch:]
            batch = batch_of(model, tokenizer, chosen)
            with torch.no_grad():
                full, clean = run_senders(model, batch.clean, batch)
                counter = counterfactual_of(model, batch, counterfactual, clean)[1]
            z = sample(log_alpha, generator)
            with torch.enable_grad():
                masked = masked_logits(model, batch, counter, z)
                kl = kl_loss(at_metric(batch, full), at_metric(batch, masked))
                kept = keep_probability(log_alpha)[edges].sum()
                gap = (1 - kept / graph.edge_count) - target_sparsity(step, options.steps, final)
                loss = kl + lambdas[0] * gap + lambdas[1] * gap ** 2
                optimiser.zero_grad()
                loss.backward()
            optimiser.step()
            schedule.step()
            kl, kept = max(float(kl.detach()), 0.0), float(kept.detach())  # a KL of -1e-9 (rounding) is 0
            pruned.kl.append(kl)
            pruned.kept.append(kept)
            pruned.steps = step + 1
            if progress is not None:
                progress(step + 1, options.steps, f"KL {kl:.4f}, {kept:,.0f} edges kept")
    except KeyboardInterrupt:
        pruned.interrupted = True
    pruned.log_alpha = log_alpha.detach().clone()
    return pruned
