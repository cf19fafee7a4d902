"""Feed-forward, norms and the transformer block (post-norm "add & norm" or pre-norm)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.attention import Attention, KVCache
from tfcli.model.linear import Linear


def activation(name: str) -> nn.Module:
    return {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_new": nn.GELU(approximate="tanh"),
            "silu": nn.SiLU(), "tanh": nn.Tanh()}[name]


def norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class FeedForward(nn.Module):
    """Position-wise feed-forward: fc2(act(fc1(x))), or the gated form down(act(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gated = config.feed_forward == "gated"
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        if self.gated:
            self.gate = Linear(hidden, inner, bias=bias)
            self.up = Linear(hidden, inner, bias=bias)
            self.down = Linear(inner, hidden, bias=bias)
        else:
            self.fc1 = Linear(hidden, inner, bias=bias)
            self.fc2 = Linear(inner, hidden, bias=bias)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, hidden) -> (B, T, hidden)."""
        if self.gated:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.fc2(self.act(self.fc1(x)))


@dataclass
class BlockOutput:
    hidden: Tensor  # (B, T, hidden)
    attention: Tensor | None = None  # (B, H, T, S) softmax weights, when asked for
    cross_attention: Tensor | None = None
    stages: dict[str, Tensor] = field(default_factory=dict)  # sublayer outputs, when asked for


class Block(nn.Module):
    """Self-attention (+ cross-attention in encoder-decoder decoders) and feed-forward, each with a
    residual connection. Post-norm: x = norm(x + f(x)), as in the original paper and BERT.
    Pre-norm: x = x + f(norm(x)), as in GPT-2 and Llama.
    """

    def __init__(self, config: ModelConfig, cross: bool = False):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attention = Attention(config)
        self.attention_norm = norm(config)
        if cross:
            self.cross_attention = Attention(config, cross=True)
            self.cross_attention_norm = norm(config)
        self.feed_forward = FeedForward(config)
        self.feed_forward_norm = norm(config)

    def _residual(self, x: Tensor, sublayer_norm: nn.Module, sublayer, **kwargs) -> tuple[Tensor, Tensor, Tensor | None]:
        """Apply one sublayer with its residual and norm; returns new x, sublayer output, weights."""
        out, weights = sublayer(sublayer_norm(x) if self.pre_norm else x, **kwargs)
        x = x + out if self.pre_norm else sublayer_norm(x + out)
        return x, out, weights

    def forward(self, x: Tensor, mask: Tensor | None, rotary=None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                need_weights: bool = False, keep_stages: bool = False) -> BlockOutput:
        x, attn_out, weights = self._residual(x, self.attention_norm, self.attention, mask=mask, rotary=rotary,
                                              cache=cache, layer=layer, need_weights=need_weights)
        result = BlockOutput(x, attention=weights)
        if keep_stages:
            result.stages["attention"] = attn_out
        if memory is not None:
            x, cross_out, cross_weights = self._residual(x, self.cross_attention_norm, self.cross_attention,
                                                         mask=memory_mask, memory=memory, cache=cache,
                                                         layer=layer, need_weights=need_weights)
            result.cross_attention = cross_weights
            if keep_stages:
                result.stages["cross_attention"] = cross_out
        x, ff_out, _ = self._residual(x, self.feed_forward_norm, lambda h: (self.feed_forward(h), None))
        result.hidden = x
        if keep_stages:
            result.stages["feed_forward"] = ff_out
        return result
