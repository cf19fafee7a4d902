"""Norms: LayerNorm, RMSNorm, and Gemma's RMSNorm whose scale is (1 + weight)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig


class RMSNormPlusOne(nn.RMSNorm):
    """RMSNorm that scales by (1 + weight), in float32 (Gemma): a zero weight is the identity scale."""

    def forward(self, x: Tensor) -> Tensor:
        """(..., size) -> (..., size)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


def norm(config: ModelConfig, size: int | None = None) -> nn.Module:
    """The config's norm over the last `size` dimensions (default hidden_size)."""
    size = size or config.hidden_size
    if config.norm == "rmsnorm":
        return nn.RMSNorm(size, eps=config.layer_norm_eps)
    if config.norm == "rmsnorm_plus_one":
        return RMSNormPlusOne(size, eps=config.layer_norm_eps)
    return nn.LayerNorm(size, eps=config.layer_norm_eps, bias=config.norm_bias)
