"""The patching engine that `patch` (and any analysis that puts back activations: a circuit's edges) runs on: the
sites of a sweep (`Patch`, one site at a layer, position and/or head), and the patched runs that score them against
a metric of a batch of pairs (`PairMetric`).

The naive sweep (`naive_sweep`, what TransformerLens's patching.py does) runs one whole forward pass per site. The
fast sweep (`fast_sweep`) computes the same numbers with far less: a patched run at layer l starts from the corrupt
run's residual stream entering block l (nothing below l changes); on a causal stack a patch at position p changes
nothing before p, so the run covers only positions p .. the metric's position and reads the corrupt run's keys and
values before p; and the patched runs are batched, a batch growing as it goes down the layers (a run patched at
layer l joins the batch at block l). Every score equals the naive sweep's to float precision (tests/test_patch.py
checks 1e-4). `attribution` is the first-order estimate of every patch from one backward pass.

Shapes: P pairs, T tokens, d the model width, H heads, G key/value heads, D head size, R patched rows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.analysis.names import KINDS, Kind, block_site

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.model import TransformerModel
    from tfcli.model.sites import Hook
    from tfcli.model.transformer import BlockInputs, LMHead, Stack

BATCH_MB = 256  # the most memory one batch of patched runs may hold (activations, roughly)

@dataclass(frozen=True)
class Patch:
    """One patched site: a kind (analysis.names.KINDS) at a layer (of a stack: "", "encoder." or "decoder."), at one
    position and/or head, as the kind's axes say."""

    kind: str
    layer: int
    position: int | None = None  # None: every position
    head: int | None = None  # None: every head
    stack: str = ""
    pair: int = 0  # a batch of pairs (run_pairs): the pair it is patched in

    @property
    def name(self) -> str:
        return block_site(self.layer, KINDS[self.kind].leaf, self.stack)

    @property
    def grid(self) -> str:
        return self.stack + self.kind

    @property
    def cell(self) -> tuple[int, ...]:
        """Where the patch's score goes in its layer's row of the grid: its index along each of the kind's axes."""
        return tuple(getattr(self, axis) for axis in KINDS[self.kind].axes)


# ---------------------------------------------------------------- the sites of a sweep


def patches(model: TransformerModel, kinds: tuple[str, ...], positions: dict[str, Sequence[int]], pair: int = 0
            ) -> list[Patch]:
    """Every site of the sweep in pair `pair`, kind by kind, layer by layer, then along the kind's axes: along a
    position axis at `positions` (by stack); a kind without one patches every position."""
    out: list[Patch] = []
    for prefix, stack in model.stacks():
        for name in kinds:
            kind = KINDS[name]
            sizes = {"position": positions[prefix], "head": range(kind.heads(model.config))}
            for layer in range(len(stack.blocks)):
                out += [Patch(name, layer, stack=prefix, pair=pair, **dict(zip(kind.axes, cell)))
                        for cell in itertools.product(*(sizes[axis] for axis in kind.axes))]
    return out


def count_patches(model: TransformerModel, kinds: tuple[str, ...], positions: dict[str, Sequence[int]]) -> int:
    """len(patches(model, kinds, positions)), without making them."""
    return sum(len(stack.blocks) * math.prod(len(positions[prefix]) if axis == "position" else
                                             KINDS[name].heads(model.config) for axis in KINDS[name].axes)
               for prefix, stack in model.stacks() for name in kinds)


def unchanged(stack: Stack, prefix: str, at: int, first: int | None, position: int | None) -> bool:
    """Whether a patch at position `at` of a stack (`prefix`) changes nothing, on a causal stack: before the `first`
    position where the texts differ (the stack that reads the texts: every activation there is the same in both
    runs), or after the metric's `position` (it cannot reach it)."""
    if not stack.causal:
        return False
    if prefix == "" and first is not None and at < first:
        return True
    return position is not None and at > position


def empty_grid(kind: Kind, layers: int, heads: int, length: int, zeros: Collection[int] = ()) -> list:
    """A layer's row per layer, nested along the kind's axes, every score None but those at the positions `zeros`,
    0.0 (the patches there change nothing)."""
    def nested(axes: tuple[str, ...], zero: bool) -> list:
        size = {"position": length, "head": heads}[axes[0]]
        cells = [zero or axes[0] == "position" and i in zeros for i in range(size)]
        return [0.0 if z else None for z in cells] if len(axes) == 1 else [nested(axes[1:], z) for z in cells]

    return [nested(kind.axes, False) for _ in range(layers)]


def put(grids: dict[str, list], patch: Patch, value: float) -> None:
    row = grids[patch.grid][patch.layer]
    for index in patch.cell[:-1]:
        row = row[index]
    row[patch.cell[-1]] = value


class PairMetric:
    """The metric of a batch of pairs, each with its own target and foil (`targets`, `foils`: (P,) ids; foils None:
    the target's logit alone): target - foil at `position` of a token head's logits, or of a classifier's labels
    (position None)."""

    def __init__(self, targets: Tensor, foils: Tensor | None, position: int | None):
        self.targets, self.foils, self.position = targets, foils, position

    def of_rows(self, logits: Tensor, pairs: Tensor) -> Tensor:
        """(R, V) logits of rows patched in `pairs` (R,) -> (R,) in float64."""
        logits = logits.double()
        value = logits.gather(1, self.targets[pairs, None])[:, 0]
        return value - logits.gather(1, self.foils[pairs, None])[:, 0] if self.foils is not None else value

    def of_hidden(self, head: LMHead, hidden: Tensor, pairs: Tensor) -> Tensor:
        """of_rows of the logits an LM head gives the rows' output `hidden` (R, d), computing only the columns read
        (a sweep's full-vocabulary products cost a tenth of a SmolLM2-shaped sweep)."""
        import torch

        read = [self.targets[pairs]] + ([self.foils[pairs]] if self.foils is not None else [])
        tokens, columns = torch.cat(read).unique(return_inverse=True)
        logits, rows = head(hidden, tokens).double(), torch.arange(len(pairs), device=hidden.device)
        value = logits[rows, columns[:len(pairs)]]
        return value - logits[rows, columns[len(pairs):]] if self.foils is not None else value

    def __call__(self, logits: Tensor) -> Tensor:
        """The pairs' logits, (P, T, V) or (P, labels) -> (P,)."""
        import torch

        rows = logits[:, self.position] if self.position is not None else logits
        return self.of_rows(rows, torch.arange(rows.shape[0], device=rows.device))


@dataclass
class PairRuns:
    """The clean and corrupt runs of a batch of pairs that a sweep patches between: their caches by site (P, ...),
    the metric (its position: where every pair reads it), the model's other inputs (an encoder-decoder's decoder
    ids), the --ablate hooks every pass runs with, and the `first` position where some pair's texts differ."""

    clean: dict[str, Tensor]
    corrupt: dict[str, Tensor]
    metric: PairMetric
    inputs: dict[str, Any]
    removed: dict[str, Hook] | None = None
    first: int | None = None


def corrupt_run(model: TransformerModel, ids: Tensor, names: list[str], clean: dict[str, Tensor], start: int,
                hooks: dict[str, Hook] | None, grad: bool, **inputs) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """The corrupt run of the texts `ids` (P, T) through a causal stack whose tokens before `start` are the clean
    texts' (0: none are): the values there are the clean run's (`clean`, which holds every block's attn.k and
    attn.v), so the run covers the positions from `start` only, reading the clean run's keys and values before
    them, which is exact and costs the text's ending instead of the whole text. Returns the logits (of the
    positions run), the run's own cache (positions from `start`: what `attribution` differentiates, kept with its
    graph under `grad`) and the cache of every position (the clean run's values before `start`, detached)."""
    import torch

    from tfcli.model import sites
    from tfcli.model.attention import PrefixKV

    if not start:
        logits, cache = model.run_with_cache(ids, names, hooks, grad=grad, **inputs)
        return logits, cache, cache
    layers = len(dict(model.stacks())[""].blocks)
    given = [{i: given_kv(clean[block_site(i, f"attn.{which}")], start) for i in range(layers)} for which in "kv"]
    prefix = PrefixKV(*given, start, torch.arange(ids.shape[0], device=ids.device))
    logits, ending = model.run_with_cache(ids[:, start:], names, hooks, grad=grad, cache=prefix, **inputs)
    whole = {}
    for name, value in ending.items():
        axis = sites.axes(name)[0]
        whole[name] = torch.cat([clean[name].narrow(axis, 0, start).to(value.dtype), value.detach()], dim=axis)
    return logits, ending, whole


def attribution(logits: Tensor, cache: dict[str, Tensor], clean_cache: dict[str, Tensor], metric: PairMetric,
                sweep: list[Patch], names: list[str], start: int = 0) -> list[float]:
    """(clean - corrupt) . d metric / d site, the gradient on the corrupt runs (their `logits` and `cache`, kept with
    their graph; the cache of the positions from `start`, corrupt_run's: before it clean and corrupt are the same),
    for every patch of the sweep, from one backward pass (the pairs' runs are independent rows): the products summed
    over every axis of the site but those the patch's kind selects along."""
    import torch

    from tfcli.model import sites

    grads = dict(zip(names, torch.autograd.grad(metric(logits).sum(), [cache[n] for n in names], allow_unused=True)))
    sums: dict[tuple[str, str], Tensor] = {}  # (site, kind) -> the products summed, (P, *the kind's axes)
    for patch in sweep:
        if (patch.name, patch.kind) in sums:
            continue
        grad = grads[patch.name]
        if grad is None:  # the metric does not depend on it (a site after the metric's position)
            grad = torch.zeros_like(cache[patch.name])
        position_axis, head_axis = sites.axes(patch.name)
        clean = clean_cache[patch.name].double()
        clean, corrupt = clean.narrow(position_axis, start, clean.shape[position_axis] - start), \
            cache[patch.name].detach().double()
        product = (clean - corrupt) * grad.double()
        if start:  # the positions before it: clean - corrupt is 0
            product = torch.cat([product.new_zeros(product.shape[:position_axis] + (start,) +
                                                   product.shape[position_axis + 1:]), product], dim=position_axis)
        kept = [{"position": position_axis, "head": head_axis}[axis] for axis in KINDS[patch.kind].axes]
        summed = product.sum([d for d in range(1, product.dim()) if d not in kept])  # its axes in increasing order
        sums[patch.name, patch.kind] = summed.permute([0] + [1 + sorted(kept).index(d) for d in kept])
    return [float(sums[patch.name, patch.kind][(patch.pair, *patch.cell)]) for patch in sweep]


def naive_sweep(model: TransformerModel, sweep: list[Patch], runs: PairRuns, corrupt: Tensor
                ) -> Iterator[tuple[list[Patch], list[float]]]:
    """One whole forward pass of the corrupt texts `corrupt` (P, T) per site, the pairs it is patched in as one
    batch, the clean value put back with a hook (what TransformerLens's patching functions do), the hooks of
    --ablate first on every pass."""
    import torch

    from tfcli.model import sites

    clean_cache, metric, inputs = runs.clean, runs.metric, runs.inputs

    by_site: dict[Patch, list[Patch]] = {}
    for patch in sweep:
        by_site.setdefault(dataclasses.replace(patch, pair=0), []).append(patch)
    for site, patched in by_site.items():
        rows = torch.tensor([p.pair for p in patched], device=corrupt.device)
        positions = None if site.position is None else [site.position]
        heads = None if site.head is None else [site.head]
        hook = sites.replace(site.name, clean_cache[site.name][rows], positions, heads)
        with torch.no_grad():
            logits = model.run_with_hooks(corrupt[rows], sites.merged(runs.removed, {site.name: hook}),
                                          **{name: value[rows] for name, value in inputs.items()})
        rows_read = logits[:, metric.position] if metric.position is not None else logits
        yield patched, metric.of_rows(rows_read, rows).tolist()


# ---------------------------------------------------------------- the fast sweep


def _hook(placed: list[tuple[int, Patch]], source: Tensor, start: int) -> Callable[[Tensor], Tensor]:
    """A hook on one site for a batch of patched runs: row r of `placed` (row, patch) gets its pair's clean run's
    value (`source`, the site of the pairs' whole texts, (P, ...)) where its patch selects; the batch covers the
    positions from `start` (a pattern: the queries, its keys from 0)."""
    import torch

    from tfcli.model import sites

    name, axes = placed[0][1].name, KINDS[placed[0][1].kind].axes
    position_axis, head_axis = sites.axes(name)
    order = (position_axis,) if head_axis is None else (position_axis, head_axis)
    device = source.device
    rows = torch.tensor([r for r, _ in placed], device=device)
    pairs = torch.tensor([p.pair for _, p in placed], device=device)
    heads = torch.tensor([p.head if p.head is not None else 0 for _, p in placed], device=device)
    positions = torch.tensor([p.position - start if p.position is not None else 0 for _, p in placed],
                             device=device)
    clean = source.movedim(order, list(range(1, len(order) + 1)))  # (P, T, [H,] ...): positions, then heads

    def hook(value: Tensor) -> Tensor:
        value = value.clone()
        patched = value.movedim(order, list(range(1, len(order) + 1)))  # a view: (B, T', [H,] ...)
        src = clean[:, start:start + patched.shape[1]][..., :patched.shape[-1]].to(value.dtype)
        if axes == ("position",):
            patched[rows, positions] = src[pairs, positions]
        elif axes == ("head",):  # every position
            patched[rows, :, heads] = src[pairs, :, heads]
        else:  # one head at one position
            patched[rows, positions, heads] = src[pairs, positions, heads]
        return value
    return hook


def _hooks(chunk: list[Patch], clean_cache: dict[str, Tensor], start: int) -> dict[str, Callable[[Tensor], Tensor]]:
    """The hooks of a batch of patched runs (row r: chunk[r]), by site; two kinds on one site (heads and
    heads-by-position share attn.z) compose."""
    from tfcli.model.sites import merged

    by_site: dict[tuple[str, str], list[tuple[int, Patch]]] = {}
    for row, patch in enumerate(chunk):
        by_site.setdefault((patch.name, patch.kind), []).append((row, patch))
    return merged(*({name: _hook(placed, clean_cache[name], start)} for (name, _), placed in by_site.items())) or {}


def _patched_runs(stack: Stack, prefix: str, chunk: list[Patch], resid: Callable[[int], Tensor], runs: PairRuns,
                  inputs: BlockInputs, start: int, cache: Any) -> Tensor:
    """The patched runs of `chunk` (sorted by layer) through `stack`, over the positions `inputs` cover from
    `start`: each joins the batch at its layer, entering with its pair's corrupt run's stream there (`resid(layer)`,
    (P, T', d)), reads that run's keys and values before `start` (`cache`) and gets its clean run's values where
    its patch selects (`runs`). Returns the stack's output (B, T', d) after its final norm (and projection)."""
    import torch

    from tfcli.model import Sites
    from tfcli.model.sites import NO_SITES, merged

    joining = {layer: [p.pair for p in group] for layer, group in itertools.groupby(chunk, key=lambda p: p.layer)}

    def entering(layer: int) -> Tensor | None:
        if layer not in joining:
            return None
        x = resid(layer)
        return x[torch.tensor(joining[layer], device=x.device)]

    hooks = merged(runs.removed, _hooks(chunk, runs.clean, start))
    sites = NO_SITES if not hooks else Sites(hooks=hooks).scope(prefix[:-1]) if prefix else Sites(hooks=hooks)
    return stack.run_blocks(None, inputs, chunk[0].layer, cache, sites, entering)


def _rows(batch: list[Patch], rows: int) -> Iterator[list[Patch]]:
    for k in range(0, len(batch), rows):
        yield batch[k:k + rows]


def given_kv(site: Tensor, length: int) -> Tensor:
    """A k or v site's values (P, T, G, D) before `length`, as PrefixKV reads them: (G, P, L', D), L' the length
    rounded up to a multiple of 8, the rows after `length` zeros (MKL multiplies by 296 keys 2-3x faster than by
    295)."""
    out = site.new_zeros(site.shape[2], site.shape[0], -(-length // 8) * 8, site.shape[3])
    out[:, :, :length] = site[:, :length].permute(2, 0, 1, 3)
    return out


def fast_sweep(model: TransformerModel, sweep: list[Patch], runs: PairRuns, batch_mb: float = BATCH_MB
               ) -> Iterator[tuple[list[Patch], list[float]]]:
    """The same scores as naive_sweep, batch by batch (see the module docstring): yields (patches, metric values).
    The sweep holds no patch that cannot change the metric (`unchanged`: patch.run_pairs scores those 0 without a
    run). A patch of every position (a head, q, k, v, pattern) on the causal stack that reads the texts runs from
    the `first` position where some pair's texts differ: before it the clean and corrupt values are the same. The
    pairs' patched runs share the batches, each row reading its own pair's runs."""
    import torch

    from tfcli.model.attention import PrefixKV
    from tfcli.model.transformer import ModelOutput

    config = model.config
    corrupt_cache, metric, inputs, first = runs.corrupt, runs.metric, runs.inputs, runs.first
    position = metric.position
    by_prefix = dict(model.stacks())
    groups: dict[tuple[str, int], list[Patch]] = {}
    for patch in sweep:  # a causal stack: the run covers the positions from the patched one (or the first) on
        causal = by_prefix[patch.stack].causal and position is not None
        start = 0 if not causal else patch.position if patch.position is not None else \
            first if patch.stack == "" and first is not None else 0
        groups.setdefault((patch.stack, start), []).append(patch)
    longest = max(t.shape[1] for t in corrupt_cache.values() if t.dim() >= 2)
    width = max(config.hidden_size, config.intermediate_size, config.num_attention_heads * longest)
    element = torch.finfo(model.embed_tokens.weight.dtype).bits // 8

    def resid_of(prefix: str, start: int, stop: int) -> Callable[[int], Tensor]:
        return lambda layer: corrupt_cache[block_site(layer, "resid_pre", prefix)][:, start:stop]

    entering = {prefix: corrupt_cache[block_site(0, "resid_pre", prefix)] for prefix in by_prefix}
    full = {prefix: x.shape[1] for prefix, x in entering.items()}
    device = model.device
    with torch.no_grad():
        memory = None
        if "encoder." in by_prefix:  # the corrupt run's memory, from the stream entering the encoder's last block
            encoder, x = by_prefix["encoder."], entering["encoder."]
            last = len(encoder.blocks) - 1
            memory = encoder.run_blocks(resid_of("encoder.", 0, full["encoder."])(last),
                                        _whole_pass(encoder, x), last)
        whole = {prefix: _whole_pass(stack, entering[prefix], memory if prefix == "decoder." else None)
                 for prefix, stack in by_prefix.items()}
    for (prefix, start), group in groups.items():
        stack = by_prefix[prefix]
        stop = position + 1 if stack.causal and position is not None else full[prefix]
        rows = max(1, int(batch_mb * 2**20 // ((stop - start) * width * element * 8)))
        group.sort(key=lambda p: p.layer)
        given = None  # a causal stack's keys and values before `start`: the corrupt runs', (G, P, start, D) per layer
        if stack.causal and start > 0:
            given = [{i: given_kv(corrupt_cache[block_site(i, f"attn.{which}", prefix)], start)
                      for i in range(len(stack.blocks))} for which in "kv"]
        for chunk in _rows(group, rows):
            pairs = torch.tensor([p.pair for p in chunk], device=device)  # the batch's rows: joining in this order
            cache = PrefixKV(*given, start, pairs) if given is not None else None  # its cross-attention's per batch
            with torch.no_grad():
                hidden = _patched_runs(stack, prefix, chunk, resid_of(prefix, start, stop), runs,
                                       whole[prefix].rows(start, stop), start, cache)
                if prefix == "encoder.":  # the patched memory, then the whole decoder (one pair: run_pairs)
                    decoder_ids = inputs["decoder_input_ids"][:1].expand(len(chunk), -1)
                    logits = model(decoder_ids, decoder_input_ids=decoder_ids,
                                   encoder_output=ModelOutput(hidden)).logits
                    values = metric.of_rows(logits[:, metric.position], pairs)
                elif position is None:  # a classifier: the labels of the whole text
                    values = metric.of_rows(model.head_logits(hidden), pairs)
                else:
                    values = metric.of_hidden(model.head, hidden[:, position - start], pairs)
            yield chunk, values.tolist()


def _whole_pass(stack: Stack, x: Tensor, memory: Tensor | None = None) -> BlockInputs:
    """What a stack's blocks read in a whole pass over the tokens of x (1, T, d) (no padding), the memory given."""
    import torch

    positions = torch.arange(x.shape[1], device=x.device)[None]
    return stack.block_inputs(positions, None, x.dtype, memory=memory)
