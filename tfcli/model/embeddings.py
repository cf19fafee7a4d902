"""Position (learned or sinusoidal) and segment embeddings added to the token embeddings, then a norm.
(Rotary and relative positions act inside attention: rotary.py, position_bias.py.)"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.linear import Linear
from tfcli.model.norms import norm, normed
from tfcli.model.sites import NO_SITES, Sites


def embedding(count: int, dim: int) -> nn.Embedding:
    """An nn.Embedding (count, dim) left uninitialised: a tfcli model gets every weight after it is built
    (random from a seed, or from a checkpoint). On the meta device, where models are built, torch's own
    init (normal_) would also import torch._dynamo, about 1.4 s."""
    return nn.Embedding.from_pretrained(torch.empty(count, dim), freeze=False)


def sinusoidal_table(length: int, dim: int, halves: bool = False) -> Tensor:
    """The fixed encodings of "Attention is all you need": (length, dim) float32, sin(p / 10000^(2i/dim)) on
    even dims and the cos on odd ones, or with `halves` all the sines first, then all the cosines (Marian).
    Computed in float64, as transformers computes Marian's, and on the CPU even while a model is built on
    the meta device: nothing loads it later."""
    cpu = torch.device("cpu")
    position = torch.arange(length, dtype=torch.float64, device=cpu)[:, None]
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=cpu) * (-math.log(10000.0) / dim))
    sin, cos = torch.sin(position * rate), torch.cos(position * rate)
    if halves:
        return torch.cat([sin, cos], dim=1).float()
    table = torch.zeros(length, dim, dtype=torch.float64, device=cpu)
    table[:, 0::2] = sin
    table[:, 1::2] = cos
    return table.float()


class Embeddings(nn.Module):
    """Adds positions and segments to token embeddings (B, T, width) and normalises when configured; with
    config.embedding_size (ALBERT, ELECTRA) the embeddings are that wide and a linear layer (`project`) then
    maps them to hidden_size. Rotary and relative positions act inside attention instead."""

    def __init__(self, config: ModelConfig, segments: bool):
        super().__init__()
        self.offset = config.position_offset
        self.kind = config.position
        width = config.embedding_size or config.hidden_size
        if config.position == "learned":
            self.positions = embedding(config.max_position_embeddings + config.position_offset, width)
        elif config.position in ("sinusoidal", "sinusoidal_halves"):
            table = sinusoidal_table(config.max_position_embeddings, width, halves=config.position == "sinusoidal_halves")
            self.register_buffer("table", table, persistent=False)
        self.segments = embedding(config.type_vocab_size, width) if segments else None
        self.norm = norm(config, width) if config.embedding_norm else None
        self.project = Linear(width, config.hidden_size) if config.embedding_size is not None else None

    def forward(self, token_embeddings: Tensor, position_ids: Tensor, token_type_ids: Tensor | None,
                sites: Sites = NO_SITES) -> Tensor:
        """(B, T, width) token embeddings, (B, T) positions and segments -> (B, T, hidden_size). Sites: `pos_embed`
        and `type_embed` (what is added), `embed_norm.scale` (and `embed_norm.out` when a projection follows)."""
        x = token_embeddings
        if self.kind == "learned":
            x = x + sites("pos_embed", self.positions(position_ids + self.offset if self.offset else position_ids))
        elif self.kind in ("sinusoidal", "sinusoidal_halves"):
            x = x + sites("pos_embed", self.table[position_ids].to(x.dtype))
        if self.segments is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            x = x + sites("type_embed", self.segments(token_type_ids))
        if self.norm is not None:
            x = normed(self.norm, x, sites, "embed_norm", output_site=self.project is not None)
        return self.project(x) if self.project is not None else x
