"""DeBERTa's disentangled attention: content and relative position attend to each other.

A stack holds one table of relative position embeddings (`RelativeEmbeddings`, 2 x span rows, optionally
normalised) and the relative position of every query-key pair, bucketed logarithmically beyond a distance.
Each block's attention projects that table with its own query and key projections (or dedicated ones) and
adds two terms to the content-to-content scores q k^T: content-to-position (the query against the key's
relative position embedding, c2p) and position-to-content (the key against the query's, p2c). All three
are scaled by 1 / sqrt(head size x (1 + number of terms)), then the mask and the softmax. The attention
weights tfcli captures are that softmax: what transformers returns as DeBERTa's attentions.

Shapes: B batch, H heads, T queries, S keys (= T), D head size, R = 2 x span relative embeddings.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.attention import head_site
from tfcli.model.embeddings import embedding
from tfcli.model.linear import Linear
from tfcli.model.sites import NO_SITES, Sites


def log_bucket_position(relative: Tensor, buckets: int, max_position: int) -> Tensor:
    """Relative positions (long) -> the same within buckets // 2 of zero, logarithmically coarser beyond,
    reaching +-(buckets // 2 + ...) at max_position; transformers' make_log_bucket_position, in float32."""
    sign = torch.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    distance = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    log_position = torch.ceil(torch.log(distance / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                              * (mid - 1)) + mid
    return torch.where(distance <= mid, relative.type_as(log_position), log_position * sign).long()


def attention_span(config: ModelConfig) -> int:
    """How many relative distances each side of zero the table holds."""
    return config.position_buckets if config.position_buckets > 0 else config.max_relative_positions


class RelativeEmbeddings(nn.Module):
    """The stack's relative position embeddings and, per forward pass, the bucketed relative positions."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.buckets, self.max_position = config.position_buckets, config.max_relative_positions
        self.table = embedding(2 * attention_span(config), config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.norm_rel_ebd else None

    def forward(self, length: int) -> tuple[Tensor, Tensor]:
        """-> the embeddings (R, hidden) and the relative position of query i to key j, (T, T), i - j bucketed."""
        positions = torch.arange(length, device=self.table.weight.device)
        relative = positions[:, None] - positions[None, :]
        if self.buckets > 0 and self.max_position > 0:
            relative = log_bucket_position(relative, self.buckets, self.max_position)
        table = self.table.weight
        return (self.norm(table) if self.norm is not None else table), relative


class DisentangledAttention(nn.Module):
    """Self-attention with DeBERTa's position terms (see the module docstring); Q, K and V fused as in tfcli's
    other attention (`qkv`, `out`), and `pos_query`, `pos_key` for the position terms when the model does not
    share its attention's projections."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_size
        size = self.heads * self.head_dim
        self.qkv = Linear(config.hidden_size, 3 * size, bias=config.attention_bias)
        self.out = Linear(size, config.hidden_size, bias=config.attention_out_bias)
        self.c2p, self.p2c = "c2p" in config.pos_att_type, "p2c" in config.pos_att_type
        own = not config.share_att_key
        self.pos_query = Linear(config.hidden_size, size) if own and self.p2c else None
        self.pos_key = Linear(config.hidden_size, size) if own and self.c2p else None
        self.span = attention_span(config)
        scalar = config.query_pre_attn_scalar or self.head_dim
        self.scale = 1 / math.sqrt(scalar)

    def _split(self, x: Tensor) -> Tensor:
        """(..., N, heads * D) -> (..., heads, N, D)."""
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(-3, -2)

    def forward(self, x: Tensor, mask: Tensor | None, relative: tuple[Tensor, Tensor], sites: Sites = NO_SITES,
                **_) -> Tensor:
        """x (B, T, hidden); relative: the stack's (R, hidden) embeddings and (T, T) relative positions."""
        table, positions = relative
        q, k, v = (self._split(t) for t in self.qkv(x).chunk(3, dim=-1))  # (B, H, T, D)
        if sites:
            q, k, v = head_site(sites, "q", q), head_site(sites, "k", k), head_site(sites, "v", v)
        if self.pos_query is None and self.pos_key is None:  # shared: the attention's own projections
            pos_q, pos_k, _ = (self._split(t) for t in self.qkv(table).chunk(3, dim=-1))  # (H, R, D)
        else:
            pos_q = self._split(self.pos_query(table)) if self.pos_query is not None else None
            pos_k = self._split(self.pos_key(table)) if self.pos_key is not None else None
        bias = torch.zeros((), dtype=x.dtype, device=x.device)
        index = positions.expand(*q.shape[:2], *positions.shape)  # (B, H, T, S)
        if self.c2p:  # query content against the key's relative position
            bias = bias + torch.gather(q @ pos_k.transpose(-1, -2), -1, (index + self.span).clamp(0, 2 * self.span - 1))
        if self.p2c:  # key content against the query's relative position
            by_key = torch.gather(k @ pos_q.transpose(-1, -2), -1, (self.span - index).clamp(0, 2 * self.span - 1))
            bias = bias + by_key.transpose(-1, -2)
        scores_bias = bias * self.scale if mask is None else bias * self.scale + mask
        if sites.wants("pattern"):
            scores = (q @ k.transpose(-1, -2)) * self.scale + scores_bias
            weights = sites("pattern", torch.softmax(scores.float(), dim=-1).to(q.dtype))
            out = weights @ v
        else:
            out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=scores_bias, scale=self.scale)
        z = sites("z", out.transpose(1, 2))  # (B, T, H, D)
        return sites("out", self.out(z.flatten(2)))
