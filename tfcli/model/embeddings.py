"""Position (learned or sinusoidal) and segment embeddings added to the token embeddings, then a norm."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.norms import norm


def embedding(count: int, dim: int) -> nn.Embedding:
    """An nn.Embedding (count, dim) left uninitialised: a tfcli model gets every weight after it is built
    (random from a seed, or from a checkpoint). On the meta device, where models are built, torch's own
    init (normal_) would also import torch._dynamo, about 1.4 s."""
    return nn.Embedding.from_pretrained(torch.empty(count, dim), freeze=False)


def sinusoidal_table(length: int, dim: int) -> Tensor:
    """The fixed encodings of "Attention is all you need": (length, dim), sin on even, cos on odd dims.
    Computed on the CPU even while a model is built on the meta device: nothing loads it later."""
    cpu = torch.device("cpu")
    position = torch.arange(length, dtype=torch.float32, device=cpu)[:, None]
    rate = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32, device=cpu) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=cpu)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


class Embeddings(nn.Module):
    """Adds positions and segments to token embeddings (B, T, hidden) and normalises when configured.
    Rotary positions are applied inside attention instead, so they add nothing here."""

    def __init__(self, config: ModelConfig, segments: bool):
        super().__init__()
        self.offset = config.position_offset
        self.kind = config.position
        if config.position == "learned":
            self.positions = embedding(config.max_position_embeddings + config.position_offset, config.hidden_size)
        elif config.position == "sinusoidal":
            self.register_buffer("table", sinusoidal_table(config.max_position_embeddings, config.hidden_size),
                                 persistent=False)
        self.segments = embedding(config.type_vocab_size, config.hidden_size) if segments else None
        self.norm = norm(config) if config.embedding_norm else None

    def forward(self, token_embeddings: Tensor, position_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        x = token_embeddings
        if self.kind == "learned":
            x = x + self.positions(position_ids + self.offset)
        elif self.kind == "sinusoidal":
            x = x + self.table[position_ids].to(x.dtype)
        if self.segments is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            x = x + self.segments(token_type_ids)
        return self.norm(x) if self.norm is not None else x
