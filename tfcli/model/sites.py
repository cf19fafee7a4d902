"""Named sites: every intermediate value of a forward pass has one name, and one mechanism reads it, changes it and
keeps its gradient.

A forward pass takes a `Sites` (the default, `NO_SITES`, does nothing: the plain fast path). At each site the model
calls `sites(name, value)`, which runs the hook registered for that name (it may return a replacement), keeps the
value when the name is asked for, and returns the value the pass goes on with. Names are those of TransformerLens,
without its `hook_` (docs/sites.md has the table for every kind of block):

    embed, pos_embed, type_embed, embed_norm.scale
    blocks.{l}.resid_pre
    blocks.{l}.attn_norm.scale, blocks.{l}.attn_norm.out           (pre-norm and sandwich blocks)
    blocks.{l}.attn.q, .k, .v      (B, T, H, D) per head, after rotary (k, v: the key/value heads)
    blocks.{l}.attn.pattern        (B, H, T, S) softmax weights
    blocks.{l}.attn.z              (B, T, H, D) each head's weighted values, before the output projection
    blocks.{l}.attn.out            (B, T, hidden) the output projection
    blocks.{l}.attn_output_norm.scale, .out                         (sandwich and sublayer_output blocks)
    blocks.{l}.resid_mid           the residual stream between attention and MLP (not in parallel blocks)
    blocks.{l}.cross_attn.*, blocks.{l}.resid_mid_cross           (an encoder-decoder's decoder)
    blocks.{l}.mlp_norm.scale, .out, blocks.{l}.mlp.pre, [.pre_linear,] .post, .out, blocks.{l}.mlp_output_norm.*
    blocks.{l}.resid_post          the block's output (what block l + 1 reads)
    final_norm.scale, final_norm.out, logits
    blocks.{l}.q_input, .k_input, .v_input  (B, T, H, d) each query head's own copy of the residual stream its query,
                                   key and value read (k, v per query head: grouped heads ungrouped); blocks.{l}.mlp_in
                                   (B, T, d) the MLP's. Asked for only by name (a hook, or a name listed exactly): a
                                   pass that asks runs its attention on these split inputs (TransformerLens's
                                   use_split_qkv_input), what a circuit's edges need; no listing of every site has them

A norm's `.scale` is its divisor per position (B, T, 1): sqrt(variance + eps) for a LayerNorm, sqrt(mean square +
eps) for an RMSNorm. A norm's output that is itself the residual stream (post-norm blocks, the embeddings' norm)
is named as the stream (`resid_mid`, `resid_post`, `blocks.0.resid_pre`), not `.out`. Encoder-decoders prefix
`encoder.` / `decoder.` (but not `logits`).

Shapes: B batch, T tokens (queries), S keys, H heads, D head size.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from tfcli.errors import usage_error

Hook = Callable[[Tensor], "Tensor | None"]  # a site's value -> its replacement, or None to leave it as it is

HEAD_SITES = ("q", "k", "v", "z", "q_input", "k_input", "v_input")  # (B, T, H, D): positions on axis 1, heads on axis 2
PATTERN_SITES = ("pattern",)  # (B, H, T, S): heads on axis 1, queries on axis 2
SPLIT_SITES = ("q_input", "k_input", "v_input", "mlp_in")  # reached only when asked by name (Sites.asks)


class Sites:
    """What one forward pass does at its named sites: `hooks` by name (each may replace the value) and the names it
    keeps (`keep(name)`, or a set of names), in `cache` in the order the pass reaches them; with `grad`, kept values
    stay in the autograd graph with their gradient retained (a backward pass from any scalar fills
    `cache[name].grad`). When every wanted name is known (hooks, and a set to keep), a scope holding none of them
    runs as a plain pass (`NO_SITES`): the lens or a steering vector does not slow the attention and MLP down."""

    def __init__(self, keep: Callable[[str], bool] | set[str] | frozenset[str] | None = None,
                 hooks: dict[str, Hook] | None = None, grad: bool = False):
        self.hooks = hooks or {}
        named = isinstance(keep, (set, frozenset))
        self.keep = keep.__contains__ if named else keep
        self.grad = grad
        self.exact: frozenset[str] = frozenset(keep) if named else frozenset()  # the names kept, given exactly
        self.cache: dict[str, Tensor] = {}
        self.reached: list[str] = []  # every site the pass reached, in order (shared by the scoped copies)
        self.prefix = ""
        self.scopes: set[str] | None = None  # the prefixes ("blocks.", "blocks.3.", ...) of the wanted names, if known
        if named or keep is None:
            self.scopes = {name[:i + 1] for name in [*self.hooks, *(keep or ())] for i, c in enumerate(name) if c == "."}

    def __bool__(self) -> bool:
        return True

    def scope(self, name: str) -> Sites:
        """The same sites under `name.` (a stack, a block, a sublayer): `scope("blocks.3")("resid_pre", x)`."""
        prefix = f"{self.prefix}{name}."
        if self.scopes is not None and prefix not in self.scopes:
            return NO_SITES  # nothing wanted under it: its sites are not reached (check_names never needs them)
        scoped = copy.copy(self)
        scoped.prefix = prefix
        return scoped

    def wants(self, name: str) -> bool:
        """Whether the pass must produce `name` (hooked or kept): a pattern or a norm's scale is computed only so."""
        full = self.prefix + name
        return full in self.hooks or (self.keep is not None and self.keep(full))

    def asks(self, name: str) -> bool:
        """Whether the pass must produce `name`, one of the sites reached only when asked by name (SPLIT_SITES): hooked,
        or kept by its exact name (not by a pattern nor by keeping everything)."""
        full = self.prefix + name
        return full in self.hooks or full in self.exact

    def __call__(self, name: str, value: Tensor) -> Tensor:
        """The value the pass goes on with at site `name`: the hook's replacement when it returns one, kept when asked."""
        full = self.prefix + name
        self.reached.append(full)
        hook = self.hooks.get(full)
        if hook is not None:
            replaced = hook(value)
            if replaced is not None:
                if not isinstance(replaced, Tensor) or replaced.shape != value.shape:
                    got = tuple(replaced.shape) if isinstance(replaced, Tensor) else type(replaced).__name__
                    raise usage_error(f"the hook on {full} returned {got}, not a tensor of the site's shape "
                                      f"{tuple(value.shape)}", "return a tensor of the same shape, or None")
                value = replaced.to(value.dtype)
        if self.keep is not None and self.keep(full):
            if not self.grad:
                self.cache[full] = value.detach()
                return value
            if not value.requires_grad:  # nothing before it needs a gradient: the graph starts here
                value = value.detach().requires_grad_()
            elif not value.is_leaf:
                value.retain_grad()
            self.cache[full] = value
        return value


class _NoSites(Sites):
    """The sites of a plain forward pass: nothing hooked, nothing kept, no cost."""

    def __bool__(self) -> bool:
        return False

    def scope(self, name: str) -> Sites:
        return self

    def wants(self, name: str) -> bool:
        return False

    def asks(self, name: str) -> bool:
        return False

    def __call__(self, name: str, value: Tensor) -> Tensor:
        return value


NO_SITES: Sites = _NoSites()


def name_filter(names: Iterable[str] | Callable[[str], bool] | None) -> Callable[[str], bool]:
    """What `run_with_cache(names=...)` takes -> a predicate: None keeps every site, a callable is used as it is, a
    list keeps those names (each may hold `*` wildcards, as `fnmatch` reads them)."""
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    exact = {name for name in names if "*" not in name}
    patterns = [name for name in names if "*" in name]
    return lambda name: name in exact or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def check_names(names: Iterable[str], known: Iterable[str]) -> None:
    """A usage error for a name (or a `*` pattern) that matches none of the `known` sites, with the closest names."""
    import difflib

    known = list(known)
    exact = set(known)
    for name in names:
        if name not in exact and not any(fnmatch.fnmatchcase(site, name) for site in known):
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "`tfcli config SRC --sites` lists them"
            raise usage_error(f"the model has no site `{name}`", hint)


# ---------------------------------------------------------------- hooks that edit a site


def axes(name: str) -> tuple[int, int | None]:
    """Where site `name`'s tensor holds its positions (a pattern's queries) and its heads (None: no head axis)."""
    leaf = name.rsplit(".", 1)[-1]
    return (2, 1) if leaf in PATTERN_SITES else (1, 2 if leaf in HEAD_SITES else None)


def selection(name: str, value: Tensor, positions: Iterable[int] | None = None,
              heads: Iterable[int] | None = None) -> Tensor:
    """A boolean mask, broadcastable to `value` (the tensor of site `name`), true at the given positions (query
    positions for a pattern) and heads; None selects all of them. Negative indices count from the end."""
    position_axis, head_axis = axes(name)
    mask = torch.ones((1,) * value.dim(), dtype=torch.bool, device=value.device)
    for axis, chosen, what in ((position_axis, positions, "positions"), (head_axis, heads, "heads")):
        if chosen is None:
            continue
        if axis is None or axis >= value.dim():
            raise usage_error(f"{name} has no {what} axis to select from (shape {tuple(value.shape)})")
        size = value.shape[axis]
        chosen = list(chosen)
        if any(not -size <= i < size for i in chosen):
            raise usage_error(f"{what} {chosen} out of range for {name}: it has {size}")
        along = torch.zeros(size, dtype=torch.bool, device=value.device)
        along[[i % size for i in chosen]] = True
        shape = [1] * value.dim()
        shape[axis] = size
        mask = mask & along.view(shape)
    return mask


def merged(*groups: dict[str, Hook] | None) -> dict[str, Hook] | None:
    """Several sets of hooks as one, composed in order on a site two of them touch (each given what the one before
    returned, or the value itself where that one returned None); None if there is none."""
    out: dict[str, Hook] = {}
    for group in groups:
        for name, hook in (group or {}).items():
            earlier = out.get(name)
            out[name] = hook if earlier is None else _chained(earlier, hook)
    return out or None


def _chained(first: Hook, then: Hook) -> Hook:
    def both(value: Tensor) -> Tensor | None:
        replaced = first(value)
        value = value if replaced is None else replaced
        again = then(value)
        return value if again is None else again
    return both


def replace(name: str, source: Tensor, positions: Iterable[int] | None = None,
            heads: Iterable[int] | None = None) -> Hook:
    """Patch site `name` with `source` (a tensor of the site's shape, e.g. from another run's cache) where selected."""
    return lambda value: torch.where(selection(name, value, positions, heads), source.to(value), value)


def zero(name: str, positions: Iterable[int] | None = None, heads: Iterable[int] | None = None) -> Hook:
    """Zero-ablate site `name` where selected."""
    return lambda value: value.masked_fill(selection(name, value, positions, heads), 0)


def mean(name: str, positions: Iterable[int] | None = None, heads: Iterable[int] | None = None) -> Hook:
    """Replace site `name` where selected by its mean over the positions of the same text (mean-ablation)."""
    axis = axes(name)[0]
    return lambda value: torch.where(selection(name, value, positions, heads), value.mean(axis, keepdim=True), value)


def add(name: str, vector: Tensor, positions: Iterable[int] | None = None,
        heads: Iterable[int] | None = None) -> Hook:
    """Add `vector` (broadcastable to the site: e.g. (hidden,) for a residual site, a steering vector) where selected."""
    return lambda value: value + selection(name, value, positions, heads) * vector.to(value)


# ---------------------------------------------------------------- the names `--save` keeps for scripts


def block_site(layer: int, leaf: str = "", stack: str = "") -> str:
    """The one place a block's site names are made: `blocks.{layer}.{leaf}` under the stack's prefix (3, "attn.z",
    "decoder.") -> decoder.blocks.3.attn.z; without a leaf, the block's own scope (`blocks.3`)."""
    return f"{stack}blocks.{layer}" + (f".{leaf}" if leaf else "")


def hidden_site(index: int) -> str:
    """`--save`'s hidden.{index}: 0 is the embeddings' output (block 0's input), i the output of block i - 1."""
    return block_site(0, "resid_pre") if index == 0 else block_site(index - 1, "resid_post")
