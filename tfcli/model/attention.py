"""Scaled dot-product attention, multi-head attention with fused projections, KV cache.

Variants a config can ask for: grouped-query and multi-query attention (num_key_value_heads), a head size
of its own (head_dim), rotary positions (tfcli/model/rotary.py), a norm over each head of the queries and keys
or over the whole projections (qk_norm), another score scale (query_pre_attn_scalar) and soft-capped scores
(attn_logit_softcapping). Sliding windows are masks (tfcli/model/transformer.py builds them per layer).

Shapes: B batch, T query length, S key length, H query heads, G key/value heads, D head size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.linear import Linear
from tfcli.model.norms import norm, normed_heads
from tfcli.model.rotary import apply_rotary
from tfcli.model.sites import NO_SITES, Sites


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None = None,
                                 softcap: float | None = None,
                                 pattern: Callable[[Tensor], Tensor] | None = None,
                                 before: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
    """softmax(cap(q k^T * scale) + mask) v, scale 1 / sqrt(D) unless given, cap(s) = softcap * tanh(s / softcap)
    when softcap is given.

    q: (B, H, T, D); k, v: (B, G, S, D) with H a multiple of G (grouped-query attention); mask: additive,
    broadcastable to (B, H, T, S), or None. Returns (B, H, T, D). `pattern` (a site) receives the softmax weights
    (B, H, T, S) and returns those the values are weighted with. PyTorch's fused kernel gives the same numbers without
    the weights, so the explicit path runs only when they are wanted (or scores are capped). `before`: the keys and
    values of L positions before k and v, read without joining them to k, v (prefixed_attention: (G, 1 or B, L', D)
    and L); the mask then covers the L + S keys.
    """
    if before is not None:
        return prefixed_attention(q, k, v, mask, before, scale, softcap, pattern)
    groups = q.shape[1] // k.shape[1]
    if pattern is None and softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=groups > 1, scale=scale)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if pattern is not None:
        weights = pattern(weights)
    return weights @ v


def prefixed_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, before: tuple[Tensor, Tensor, int],
                       scale: float | None = None, softcap: float | None = None,
                       pattern: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """scaled_dot_product_attention of q (B, H, T, D) over the keys and values of L positions `before` followed by
    k, v (B, G, T', D), in two blocks under one softmax: a prefix that every row shares is read by one product for the
    whole batch (the rows folded into the product's rows), never copied per row. Returns (B, H, T, D).

    `before`: keys and values (G, 1 or B, L', D), of which the rows after the first L are padding, left out (given_kv
    pads L to a multiple of 8: MKL's product over 295 keys takes 2-3 times as long as over 296), and L.
    Computed in the layout (G, B, H/G * T, .): the query heads of one key/value head side by side; without a gradient
    on the CPU, the prefix through PyTorch's fused kernel (_fused_prefix)."""
    (batch, heads, length, dim), groups = q.shape, k.shape[1]
    before_k, before_v, given = before
    width, shared = before_k.shape[2], before_k.shape[1] == 1
    q = q * (scale if scale is not None else 1 / math.sqrt(dim))  # scaled here: fewer passes over the scores
    queries = q.reshape(batch, groups, heads // groups * length, dim).transpose(0, 1)  # (G, B, M, D)
    if pattern is None and softcap is None and q.device.type == "cpu" and not torch.is_grad_enabled() and \
            (mask is None or not _masks(mask[..., :given])):
        return _fused_prefix(queries, k, v, mask, before, heads, length)
    if shared:  # one product per key/value head: (G, B * M, D) @ (G, D, L')
        folded = queries.reshape(groups, -1, dim)
        first = (folded @ before_k[:, 0].transpose(-1, -2)).view(groups, batch, -1, width)
    else:
        first = queries @ before_k.transpose(-1, -2)  # (G, B, M, L')
    second = queries @ k.transpose(0, 1).transpose(-1, -2)  # (G, B, M, T')
    blocks = []
    for scores, offset, columns in ((first, 0, given), (second, given, k.shape[2])):
        scores = scores.float()
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        part = None if mask is None else mask[..., offset:offset + columns]
        if part is not None and _masks(part):
            scores[..., :columns].add_(_grouped(part, heads, groups, length))
        blocks.append(scores)
    blocks[0][..., given:] = -math.inf  # the padding
    top = torch.maximum(*(scores.detach().amax(-1, keepdim=True) for scores in blocks))  # a shift: no gradient
    blocks = [scores.sub_(top).exp_() for scores in blocks]  # in place: the scores are this function's own
    total = blocks[0].sum(-1, keepdim=True) + blocks[1].sum(-1, keepdim=True)
    if pattern is not None:  # the whole (B, H, T, L + T') weights through the site, then split again
        whole = torch.cat([blocks[0][..., :given], blocks[1]], dim=-1) / total
        whole = whole.to(q.dtype).transpose(0, 1).reshape(batch, heads, length, -1)
        whole = pattern(whole).reshape(batch, groups, heads // groups * length, -1).transpose(0, 1)
        blocks, total = list(whole.split((given, k.shape[2]), dim=-1)), None
        before_v = before_v[:, :, :given]
    blocks = [weights.to(q.dtype) for weights in blocks]
    if shared:
        out = (blocks[0].reshape(groups, -1, blocks[0].shape[-1]) @ before_v[:, 0]).view(groups, batch, -1, dim)
    else:
        out = blocks[0] @ before_v
    out = out + blocks[1] @ v.transpose(0, 1)
    if total is not None:  # the weights' normalisation, on the output: (G, B, M, D) rather than (G, B, M, L + T')
        out = out / total.to(q.dtype)
    return out.transpose(0, 1).reshape(batch, heads, length, dim)


def _fused_prefix(queries: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, before: tuple[Tensor, Tensor, int],
                  heads: int, length: int) -> Tensor:
    """prefixed_attention on the CPU without a gradient, the weights or capped scores, the prefix unmasked (a patch
    sweep's runs): the prefix block through PyTorch's fused kernel, which returns its log-sum-exp, joined to the new
    keys' block by it. Over a long prefix the kernel is 1.3-2x as fast as the products and exp (which write the
    scores out). `queries` (G, B, M, D), already scaled; returns (B, H, T, D)."""
    groups, batch, rows, dim = queries.shape
    *before_k_v, given = before
    # the prefix (1 or B, G, L, D) the rows share, read by one product per key/value head (the rows folded), or each
    # row's own
    keys, values = (t[:, :, :given].transpose(0, 1) for t in before_k_v)
    shared = keys.shape[0] == 1
    folded = queries.reshape(1, groups, -1, dim) if shared else queries.transpose(0, 1)
    prefix_out, prefix_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(folded, keys, values,
                                                                                         scale=1.0)[:2]
    if not shared:
        prefix_out, prefix_lse = prefix_out.transpose(0, 1), prefix_lse.transpose(0, 1)
    prefix_out = prefix_out.reshape(groups, batch, rows, dim).float()  # (G, B, M, D)
    prefix_lse = prefix_lse.reshape(groups, batch, rows, 1).float()  # the log of its weights' total
    scores = (queries @ k.transpose(0, 1).transpose(-1, -2)).float()  # (G, B, M, T')
    if mask is not None and _masks(part := mask[..., given:]):
        scores.add_(_grouped(part, heads, groups, length))
    top = torch.maximum(prefix_lse, scores.amax(-1, keepdim=True))
    weights, prefix_weight = scores.sub_(top).exp_(), (prefix_lse - top).exp_()
    out = prefix_out * prefix_weight + weights @ v.transpose(0, 1).float()
    out = out / (prefix_weight + weights.sum(-1, keepdim=True))
    return out.to(queries.dtype).transpose(0, 1).reshape(batch, heads, length, dim)


def _masks(mask: Tensor) -> bool:
    """Whether an additive mask leaves out anything: one of several rows (a padded batch) or a value not 0."""
    return mask.dim() == 4 and mask.shape[0] > 1 or bool(mask.ne(0).any())


def _grouped(mask: Tensor, heads: int, groups: int, length: int) -> Tensor:
    """An additive mask broadcastable to (B, H, T, S) in prefixed_attention's layout (G, B or 1, H/G * T, S)."""
    mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape)).float()
    mask = mask.expand(mask.shape[0], heads, length, mask.shape[-1])
    return mask.reshape(mask.shape[0], groups, -1, mask.shape[-1]).transpose(0, 1)


def pattern_site(sites: Sites) -> Callable[[Tensor], Tensor] | None:
    """The `pattern` site for scaled_dot_product_attention when the pass needs the weights, else None (fused)."""
    return (lambda weights: sites("pattern", weights)) if sites.wants("pattern") else None


def head_site(sites: Sites, name: str, x: Tensor) -> Tensor:
    """Site `name` of a per-head tensor (B, H, T, D), named in the (B, T, H, D) layout of TransformerLens."""
    return sites(name, x.transpose(1, 2)).transpose(1, 2)


class KVCache:
    """Keys and values of every position seen so far, preallocated so each new token writes in place.

    One buffer pair per self-attention layer, (B, G, max_length, D); cross-attention keys and values
    (computed once from the encoder output) are kept in `cross`. `length` counts cached positions
    and is advanced by the model after each forward.
    """

    def __init__(self, max_length: int):
        self.max_length = max_length
        self.length = 0
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, G, T, D) after the cached positions; return all keys and values so far."""
        end = self.length + k.shape[2]
        if end > self.max_length:
            raise ValueError(f"KV cache holds {self.max_length} positions, {end} needed")
        if layer not in self.keys:
            shape = (k.shape[0], k.shape[1], self.max_length, k.shape[3])
            self.keys[layer] = k.new_zeros(shape)
            self.values[layer] = v.new_zeros(shape)
        keys, values = self.keys[layer], self.values[layer]
        keys.narrow(2, self.length, k.shape[2]).copy_(k)  # narrow + copy_: cheaper than slice assignment
        values.narrow(2, self.length, v.shape[2]).copy_(v)
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def before(self, layer: int, batch: int) -> None:
        """update returns every key and value: none are read apart (PrefixKV's are)."""
        return None


class PrefixKV:
    """The keys and values of the positions before `length`, given (of P runs, per self-attention layer (G, P,
    L', D), after any rotation, L' >= length: the rest padding), row r of a batch that covers the positions after
    them reading run `rows[r]`'s: a pass over the positions that can change reads the others' from another run (the
    patch sweep). Quacks like KVCache; attention reads the given keys and values apart from the new ones (`before`),
    so that a prefix the rows share is never copied per row."""

    def __init__(self, keys: dict[int, Tensor], values: dict[int, Tensor], length: int, rows: Tensor):
        self.keys, self.values, self.length, self.rows = keys, values, length, rows
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (B, G, T, D) of the positions after the given ones, as they are."""
        return k, v

    def before(self, layer: int, batch: int) -> tuple[Tensor, Tensor, int]:
        """The given keys and values (G, 1, L', D) when there is one run, else those of each of the batch's rows
        (G, batch, L', D): its first rows, those that have joined it by this layer; and `length`, L' >= length (the
        rest padding, as given_kv makes it)."""
        keys, values = self.keys[layer], self.values[layer]
        if keys.shape[1] == 1:
            return keys, values, self.length
        rows = self.rows[:batch]
        return keys.index_select(1, rows), values.index_select(1, rows), self.length


class Attention(nn.Module):
    """Multi-head attention. Self-attention projects Q, K and V with one fused linear layer (`qkv`);
    cross-attention projects queries from the decoder (`q`) and keys/values from the encoder (`kv`).
    `q_norm` and `k_norm` (config.qk_norm) normalise the queries and keys before the rotation.
    """

    def __init__(self, config: ModelConfig, cross: bool = False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.kv_heads, config.head_size
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.cross = cross
        if cross:
            self.q = Linear(config.hidden_size, q_size, bias=config.attention_bias)
            self.kv = Linear(config.hidden_size, 2 * kv_size, bias=config.attention_bias)
        else:
            self.qkv = Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.attention_bias)
        self.out = Linear(q_size, config.hidden_size, bias=config.attention_out_bias)
        self.qk_norm = "none" if cross else config.qk_norm
        if self.qk_norm != "none":
            per_head = self.qk_norm == "head"
            self.q_norm = norm(config, self.head_dim if per_head else q_size)
            self.k_norm = norm(config, self.head_dim if per_head else kv_size)
        self.scale = config.query_pre_attn_scalar ** -0.5 if config.query_pre_attn_scalar else None
        self.softcap = config.attn_logit_softcapping
        self.interleaved = config.rotary_interleaved

    def _split(self, x: Tensor, heads: int) -> Tensor:
        """(B, T, heads * D) -> (B, heads, T, D)."""
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, mask: Tensor | None, rotary: tuple[Tensor, Tensor] | None = None,
                memory: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                sites: Sites = NO_SITES) -> Tensor:
        """x (B, T, hidden); memory (B, S, hidden) for cross-attention. Returns (B, T, hidden)."""
        before = None
        if self.cross:
            q = self._split(self.q(x), self.heads)
            if sites:
                q = head_site(sites, "q", q)
            if cache is not None and layer in cache.cross:
                k, v = cache.cross[layer]
            else:
                k, v = (self._split(t, self.kv_heads) for t in self.kv(memory).chunk(2, dim=-1))
                if sites:
                    k, v = head_site(sites, "k", k), head_site(sites, "v", v)
                if cache is not None:
                    cache.cross[layer] = (k, v)
        else:
            qkv = self.qkv(x)
            if self.qk_norm == "projection":  # over the whole query and key projections, before the heads split
                q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
                q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
                qkv = torch.cat([self.q_norm(q), self.k_norm(k), v], dim=-1)
            heads = (self.heads, self.kv_heads, self.kv_heads)
            q, k, v = self._split(qkv, sum(heads)).split(heads, dim=1)  # (B, H + 2G, T, D): views, few operations
            q, k, v = self._positioned(q, k, v, rotary, sites)
            if cache is not None:
                k, v = cache.update(layer, k, v)
                before = cache.before(layer, k.shape[0])
        return self._attend(q, k, v, mask, sites, before)

    def _positioned(self, q: Tensor, k: Tensor, v: Tensor, rotary: tuple[Tensor, Tensor] | None,
                    sites: Sites) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's q, k, v (B, heads, T, D) with the per-head query/key norm and the rotation applied, and
        their sites."""
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = apply_rotary(q, *rotary, self.interleaved), apply_rotary(k, *rotary, self.interleaved)
        if sites:
            q, k, v = head_site(sites, "q", q), head_site(sites, "k", k), head_site(sites, "v", v)
        return q, k, v

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sites: Sites,
                before: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
        """The attention of q (B, H, T, D) over k, v (after the keys and values `before`, when given), its heads'
        outputs (`z`) and their projection (B, T, hidden)."""
        out = scaled_dot_product_attention(q, k, v, mask, self.scale, self.softcap, pattern_site(sites), before)
        z = sites("z", out.transpose(1, 2))  # (B, T, H, D)
        return sites("out", self.out(z.reshape(z.shape[0], z.shape[1], -1)))

    def split_forward(self, inputs: list[Tensor], input_norm: nn.Module, mask: Tensor | None,
                      rotary: tuple[Tensor, Tensor] | None, sites: Sites = NO_SITES) -> Tensor:
        """Self-attention where each query head reads its own inputs, each through `input_norm`: `inputs` the
        query's, key's and value's, (B, T, H, hidden) each; a key/value head's projection is applied to the input of
        every query head that reads it (grouped heads ungrouped, so that its k, v sites are (B, T, H, D)). Returns (B,
        T, hidden), the output projection's, as forward does."""
        if self.qk_norm == "projection":
            raise ValueError("split inputs: a query/key norm over the whole projection mixes the heads' inputs")
        heads, dim = self.heads, self.head_dim
        self.qkv.unpack()  # the plain weight, read by slices (a packed one would be unpacked for each)
        weight, bias = self.qkv.weight, self.qkv.bias
        sizes = (heads * dim, self.kv_heads * dim, self.kv_heads * dim)

        def per_head(w: Tensor) -> Tensor:  # (rows, ...) -> (H, D, ...): a key/value head's for each query head
            return w.reshape(-1, dim, *w.shape[1:]).repeat_interleave(heads * dim // w.shape[0], 0)

        biases = bias.split(sizes) if bias is not None else (None, None, None)
        q, k, v = (normed_heads(input_norm, x, per_head(w), None if b is None else per_head(b))
                   for x, w, b in zip(inputs, weight.split(sizes), biases))
        return self._attend(*self._positioned(q, k, v, rotary, sites), mask, sites)
