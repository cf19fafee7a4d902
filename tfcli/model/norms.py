"""Norms: LayerNorm, RMSNorm, and Gemma's RMSNorm whose scale is (1 + weight); a norm with its named sites."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.sites import Sites


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


def divisor(norm: nn.Module, x: Tensor) -> Tensor:
    """What `norm` divides x (..., size) by, per position (..., 1): sqrt(variance + eps) for a LayerNorm,
    sqrt(mean square + eps) for an RMSNorm; computed in float32, returned in x's dtype."""
    h = x.float()
    spread = h.var(-1, keepdim=True, correction=0) if isinstance(norm, nn.LayerNorm) else h.pow(2).mean(-1, keepdim=True)
    eps = norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps
    return torch.sqrt(spread + eps).to(x.dtype)


def divided_by(norm: nn.Module, x: Tensor, scale: Tensor) -> Tensor:
    """`norm`(x) computed with the divisor `scale` (..., 1) given rather than its own: what a hooked scale changes."""
    h = x.float()
    if isinstance(norm, nn.LayerNorm):
        h = h - h.mean(-1, keepdim=True)
    h = h / scale.float()
    if norm.weight is not None:
        h = h * (1.0 + norm.weight.float() if isinstance(norm, RMSNormPlusOne) else norm.weight.float())
    if isinstance(norm, nn.LayerNorm) and norm.bias is not None:
        h = h + norm.bias.float()
    return h.to(x.dtype)


def folded(norm: nn.Module, direction: Tensor) -> tuple[Tensor, float | None]:
    """A norm read through a direction u (size,), its divisor frozen: norm(x) . u = (x . folded) / scale + constant.
    folded = u times the norm's weight (Gemma's 1 + weight), centred for a LayerNorm ((x - mean x) . w = x . (w -
    mean w)); constant = the norm's bias . u, None without a bias. Float64."""
    u = direction.double()
    if norm.weight is not None:
        gain = norm.weight.detach().double()
        u = u * (1.0 + gain if isinstance(norm, RMSNormPlusOne) else gain)
    constant = None
    if isinstance(norm, nn.LayerNorm):
        if norm.bias is not None:
            constant = float(norm.bias.detach().double() @ direction.double())
        u = u - u.mean()
    return u, constant


def normed(norm: nn.Module, x: Tensor, sites: Sites, name: str, output_site: bool = True) -> Tensor:
    """norm(x) with its sites: `name.scale` (B, T, 1) and, with output_site, `name.out` (left out where the output is
    itself a residual-stream site). The fused norm computes it unless a hook changes the scale."""
    if not sites or isinstance(norm, nn.Identity):  # a plain pass; or no norm here (ModernBERT's first block)
        return norm(x)
    if sites.wants(name + ".scale"):
        scale = divisor(norm, x)
        used = sites(name + ".scale", scale)
        out = norm(x) if used is scale else divided_by(norm, x, used)
    else:
        out = norm(x)
    return sites(name + ".out", out) if output_site else out
