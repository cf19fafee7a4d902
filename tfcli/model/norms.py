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


def normed_heads(norm: nn.Module, copies: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Each head's projection of its own normed copy of the stream (a split pass: model/attention.py), copies (B, T, H,
    hidden) -> (B, H, T, D), `weight` (H, D, hidden) and `bias` (H, D) each head's, each copy's gradient its own.
    Copies no hook changed (one tensor expanded: stride 0 over H), under no weight that wants a gradient, are normed
    once and projected by one product; the backward pass then needs each head's projection back (a product) and
    two terms per position and head, the norm's, read off the small (B, H, T, D) side: normed per copy, the norm's
    backward over (B, T, H, hidden) took a third of a split pass on SmolLM2 (_NormedHeads)."""
    plain = copies.stride(2) != 0 or isinstance(norm, nn.Identity) or \
        any(p.requires_grad for p in (weight, bias, *norm.parameters()) if p is not None)
    if plain:
        out = torch.einsum("bthi,hdi->bhtd", norm(copies), weight.to(copies.dtype))
        return out if bias is None else out + bias[None, :, None].to(copies.dtype)
    return _NormedHeads.apply(copies, norm, weight, bias)


class _NormedHeads(torch.autograd.Function):
    """normed_heads for copies of one stream x (B, T, d): out_h = W_h norm(x) + b_h. The norm is gain * x̂ (+ a bias),
    x̂ = (x - mean x, a LayerNorm's) / scale. For δ_h = d loss / d out_h, copy h's gradient is
    (g'_h - mean g'_h (LayerNorm) - x̂ mean(g'_h x̂)) / scale with g'_h = (W_h^T δ_h) * gain, where
    mean(g'_h x̂) = δ_h . W_h (gain x̂) / d and mean(g'_h) = δ_h . W_h gain / d: dot products of D-wide vectors."""

    @staticmethod
    def forward(ctx, copies: Tensor, norm: nn.Module, weight: Tensor, bias: Tensor | None) -> Tensor:
        x = copies[:, :, 0]
        heads, dim, width = weight.shape
        projected = (norm(x) @ weight.reshape(heads * dim, width).to(x.dtype).T).view(*x.shape[:2], heads, dim)
        out = projected.transpose(1, 2)  # (B, H, T, D)
        if bias is not None:
            out = out + bias[None, :, None].to(x.dtype)
        if not ctx.needs_input_grad[0]:
            return out
        h = x.float()
        layer = isinstance(norm, nn.LayerNorm)
        if layer:
            h = h - h.mean(-1, keepdim=True)
        scale = divisor(norm, x).float()
        gain = None if norm.weight is None else \
            (1.0 + norm.weight.float()) if isinstance(norm, RMSNormPlusOne) else norm.weight.float()
        gained = weight.float() if gain is None else weight.float() * gain  # (H, D, d): W_h diag(gain)
        along = projected.float()  # W_h (gain x̂), the projection of the normed x less the norm's bias's
        if getattr(norm, "bias", None) is not None:
            along = along - weight.float() @ norm.bias.float()
        centre = gained.sum(-1) / width if layer else None  # (H, D): W_h gain / d
        ctx.save_for_backward(h / scale, scale, gained, (along / width).transpose(1, 2), centre)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        unit, scale, gained, along, centre = ctx.saved_tensors  # (B, T, d), (B, T, 1), (H, D, d), (B, H, T, D), (H, D)
        delta = grad.float() / scale[:, None]  # (B, H, T, D), over the scale
        heads, dim, width = gained.shape
        back = torch.bmm(delta.transpose(0, 1).reshape(heads, -1, dim), gained)  # (H, B x T, d): g' / scale
        back = back.view(heads, *unit.shape)
        back.addcmul_(unit, (delta * along).sum(-1).transpose(0, 1)[..., None], value=-1)
        if centre is not None:
            back -= (delta * centre[None, :, None]).sum(-1).transpose(0, 1)[..., None]
        return back.permute(1, 2, 0, 3).to(grad.dtype), None, None, None
