"""Relative position bias (T5, MPNet): one learned scalar per head and relative-distance bucket, added to
the attention scores of every block of a stack (the table lives in the stack, as T5's first block and
MPNet's encoder hold it, and is shared by all blocks).

Shapes: H heads, T queries, S keys.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.embeddings import embedding


def relative_position_bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Tensor:
    """Key position minus query position -> bucket in [0, num_buckets), as Mesh TensorFlow's T5 counts
    them: half the buckets (per direction, when bidirectional) for exact small distances, the rest
    logarithmically wider up to max_distance, beyond which all share the last bucket. A causal stack
    (not bidirectional) has only the distances to earlier keys."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -relative_position.clamp(max=0)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """The (1, H, T, S) bias a stack adds to every block's attention scores."""

    def __init__(self, config: ModelConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.num_buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.table = embedding(self.num_buckets, config.num_attention_heads)

    def forward(self, query_length: int, key_length: int, past: int = 0) -> Tensor:
        """Queries at positions past .. past + query_length - 1, keys at 0 .. key_length - 1."""
        device = self.table.weight.device
        queries = torch.arange(past, past + query_length, device=device)[:, None]
        keys = torch.arange(key_length, device=device)[None, :]
        buckets = relative_position_bucket(keys - queries, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table(buckets).permute(2, 0, 1)[None]  # (T, S, H) -> (1, H, T, S)
