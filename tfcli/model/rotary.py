"""Rotary position embeddings (RoPE): frequencies, plain or scaled, and the rotation of queries and keys.

Variants, as Hugging Face transformers computes them (`modeling_rope_utils.py`):
- scaling (`config.rope_scaling`): `linear` (positions divided by the factor), `dynamic` (NTK: the base grows
  once a sequence passes max_position_embeddings), `llama3` (Llama 3.1+: low frequencies divided by the factor,
  a smooth ramp between), `yarn` (a ramp between interpolated and original frequencies, cos/sin scaled),
  `longrope` (Phi-3: per-pair factors, short ones up to original_max_position_embeddings, long ones once a
  sequence is longer; cos/sin scaled; see TransformerModel.long_rope_switch for what that means to a cache);
- partial rotation (`partial_rotary_factor`): only the first `config.rotary_dim` dimensions of each head turn;
- pair layout: the two halves of those dimensions (Llama, GPT-NeoX) or adjacent pairs (`rotary_interleaved`, GPT-J);
- a base of its own for sliding-window layers (`local_rope_theta`, Gemma 3), never scaled.

Shapes: B batch, T tokens, R = config.rotary_dim rotated dimensions, D head size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig


def default_frequencies(dim: int, theta: float | Tensor) -> Tensor:
    """(dim / 2,) inverse frequencies theta^(-2i / dim), float32."""
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)


def scaled_frequencies(dim: int, theta: float, scaling: dict | None, max_positions: int) -> tuple[Tensor, float]:
    """Inverse frequencies (dim / 2,) for a rope_scaling (None: plain RoPE) and the factor cos and sin are
    multiplied by (YaRN's attention factor; 1 otherwise). `dynamic` starts out plain (see Rotary.forward)."""
    kind = scaling["rope_type"] if scaling else "default"
    inv_freq = default_frequencies(dim, theta)
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return llama3_frequencies(inv_freq, scaling), 1.0
    if kind == "yarn":
        return yarn_frequencies(dim, theta, scaling, max_positions)
    if kind == "longrope":
        short = longrope_frequencies(dim, theta, scaling, "short_factor")  # the long ones: see Rotary
        return short, longrope_attention_factor(scaling, max_positions)
    return inv_freq, 1.0  # default, dynamic


def longrope_frequencies(dim: int, theta: float, scaling: dict, which: str) -> Tensor:
    """LongRoPE: each pair's frequency divided by its own factor (`short_factor` or `long_factor`)."""
    factors = torch.tensor(scaling[which], dtype=torch.float32, device="cpu")
    return 1.0 / (factors * theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))


def longrope_attention_factor(scaling: dict, max_positions: int) -> float:
    """What LongRoPE scales cos and sin by: attention_factor, else sqrt(1 + ln(factor) / ln(original)) with
    factor max_position_embeddings / original_max_position_embeddings unless given."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_positions / original
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def llama3_frequencies(inv_freq: Tensor, scaling: dict) -> Tensor:
    """Llama 3.1: wavelengths longer than original / low_freq_factor are divided by the factor, shorter than
    original / high_freq_factor kept, and those between interpolated smoothly."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelength < original / high) * ~(wavelength > original / low)
    return torch.where(medium, smoothed, scaled)


def yarn_frequencies(dim: int, theta: float, scaling: dict, max_positions: int) -> tuple[Tensor, float]:
    """YaRN: original frequencies for the fast dimensions, interpolated ones (divided by the factor) for the slow
    ones, a linear ramp between (bounded by beta_fast and beta_slow rotations); cos and sin scaled by the
    attention factor (by default 0.1 ln(factor) + 1)."""
    factor = scaling.get("factor") or max_positions / scaling["original_max_position_embeddings"]
    original = scaling["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.get("beta_fast") or 32), correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    powers = theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * powers)) * (1 - extrapolation) + (1.0 / powers) * extrapolation
    return inv_freq, float(attention_factor)


class Rotary(nn.Module):
    """cos and sin of each position's angles, for the rotated dimensions of a head."""

    def __init__(self, config: ModelConfig, local: bool = False):
        super().__init__()
        self.dim = config.rotary_dim
        self.interleaved = config.rotary_interleaved
        self.max_positions = config.max_position_embeddings
        self.theta = config.local_rope_theta if local else config.rope_theta
        self.scaling = None if local else config.rope_scaling
        inv_freq, self.attention_factor = scaled_frequencies(self.dim, self.theta, self.scaling, self.max_positions)
        # on the CPU even while the model is built on the meta device: nothing loads it later
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        longrope = bool(self.scaling) and self.scaling["rope_type"] == "longrope"
        # LongRoPE: the length past which its long factors apply
        self.long_after = self.scaling["original_max_position_embeddings"] if longrope else None
        if longrope:
            self.register_buffer("long_inv_freq", longrope_frequencies(self.dim, self.theta, self.scaling,
                                                                       "long_factor"), persistent=False)

    def frequencies(self, position_ids: Tensor) -> Tensor:
        """As transformers recomputes them on every forward: dynamic NTK scaling grows the base once the longest
        position passes max_position_embeddings, LongRoPE takes its long factors once it passes
        original_max_position_embeddings; every other kind is fixed. (On the meta device, where a model's sites are
        listed with their shapes, positions have no values: the frequencies of a short text serve.)"""
        if position_ids.is_meta:
            return self.inv_freq
        if self.long_after is not None:
            return self.long_inv_freq if int(position_ids.max()) + 1 > self.long_after else self.inv_freq
        if not self.scaling or self.scaling["rope_type"] != "dynamic":
            return self.inv_freq
        length = int(position_ids.max()) + 1
        if length <= self.max_positions:
            return self.inv_freq
        factor = self.scaling["factor"]
        growth = torch.tensor(factor * length / self.max_positions - (factor - 1), dtype=torch.float32)
        base = self.theta * growth ** (self.dim / (self.dim - 2))
        return default_frequencies(self.dim, base).to(self.inv_freq.device)

    def forward(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """position_ids (B, T) -> cos, sin (B, 1, T, R), in float32 then cast to dtype."""
        inv_freq = self.frequencies(position_ids).float()
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        if self.interleaved:
            angles = freqs.repeat_interleave(2, dim=-1)[:, None]
        else:
            angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """Rotate the first R dimensions of x (B, heads, T, D) by the position angles; the rest pass unchanged."""
    rotary_dim = cos.shape[-1]
    turned, kept = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:  # pairs (x0, x1), (x2, x3), ... -> (-x1, x0), (-x3, x2), ...
        rotated = torch.stack((-turned[..., 1::2], turned[..., 0::2]), dim=-1).flatten(-2)
    else:  # halves (a, b) -> (-b, a)
        half = rotary_dim // 2
        rotated = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
    turned = turned * cos + rotated * sin
    return torch.cat((turned, kept), dim=-1) if kept.shape[-1] else turned
