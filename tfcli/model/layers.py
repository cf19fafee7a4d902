"""Feed-forward and the transformer block: its residual connections and where its norms sit.

A block is attention (+ cross-attention in encoder-decoder decoders) and a feed-forward, each with a residual
connection, one of (config.norm_position):
- post:     x = norm(x + f(x))           the original paper, BERT
- pre:      x = x + f(norm(x))           GPT-2, Llama
- sandwich: x = x + norm2(f(norm1(x)))   Gemma 2 and 3
- sublayer_output: x = x + norm(f(x))    OLMo 2
or, with config.parallel_residual (pre-norm only), both in one step: x = x + attention(norm(x)) +
feed_forward(norm2(x)), where norm2 is norm itself under config.shared_block_norm (GPT-J, Phi-2, Falcon).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.attention import Attention, KVCache
from tfcli.model.disentangled import DisentangledAttention
from tfcli.model.linear import Linear
from tfcli.model.norms import norm


def activation(name: str) -> nn.Module:
    return {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_new": nn.GELU(approximate="tanh"),
            "silu": nn.SiLU(), "tanh": nn.Tanh()}[name]


class FeedForward(nn.Module):
    """Position-wise feed-forward: fc2(act(fc1(x))), or the gated form down(act(gate(x)) * up(x)) with gate
    and up fused in one projection (`gate_up`, gate rows first)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gated = config.feed_forward == "gated"
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        if self.gated:
            self.gate_up = Linear(hidden, 2 * inner, bias=bias)
            self.down = Linear(inner, hidden, bias=bias)
        else:
            self.fc1 = Linear(hidden, inner, bias=bias)
            self.fc2 = Linear(inner, hidden, bias=bias)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, hidden) -> (B, T, hidden)."""
        if self.gated:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(self.act(gate) * up)
        return self.fc2(self.act(self.fc1(x)))


@dataclass
class BlockOutput:
    hidden: Tensor  # (B, T, hidden)
    attention: Tensor | None = None  # (B, H, T, S) softmax weights, when asked for
    cross_attention: Tensor | None = None
    stages: dict[str, Tensor] = field(default_factory=dict)  # sublayer outputs, when asked for


class Block(nn.Module):
    """Self-attention (+ cross-attention), feed-forward, residuals and norms (see the module docstring).
    Each sublayer NAME has `NAME_norm` (its input norm, or for post-norm the norm after the residual) and,
    for sandwich and sublayer_output blocks, `NAME_output_norm` (on its output, inside the residual)."""

    def __init__(self, config: ModelConfig, cross: bool = False, attention_norm: bool = True):
        """attention_norm=False: the attention reads the block's input as it is (ModernBERT's first block)."""
        super().__init__()
        self.norm_position = config.norm_position
        self.input_norms = config.norm_position in ("pre", "sandwich")
        self.output_norms = config.norm_position in ("sandwich", "sublayer_output")
        self.parallel = config.parallel_residual
        attention = DisentangledAttention(config) if config.relative_attention else Attention(config)
        sublayers = {"attention": attention, "cross_attention": Attention(config, cross=True) if cross else None,
                     "feed_forward": FeedForward(config)}
        for name, sublayer in sublayers.items():
            if sublayer is None:
                continue
            setattr(self, name, sublayer)
            if config.norm_position != "sublayer_output" and not (name == "feed_forward" and config.shared_block_norm):
                setattr(self, f"{name}_norm", norm(config))
            if self.output_norms:
                setattr(self, f"{name}_output_norm", norm(config))
        if not attention_norm:
            self.attention_norm = nn.Identity()

    # The norms are read from self._modules by name: nn.Module's attribute lookup (and hasattr, which fails
    # through it) costs more than the norm itself in a decoding step.
    def _input(self, name: str, x: Tensor) -> Tensor:
        """What sublayer `name` reads: x through its input norm, when the block has one."""
        return self._modules[f"{name}_norm"](x) if self.input_norms else x

    def _residual(self, name: str, x: Tensor, sublayer, **kwargs) -> tuple[Tensor, Tensor, Tensor | None]:
        """Apply one sublayer with its residual and norms; returns new x, what it added, weights."""
        out, weights = sublayer(self._input(name, x), **kwargs)
        if self.output_norms:  # what the sublayer adds to the residual stream goes through its output norm
            out = self._modules[f"{name}_output_norm"](out)
        x = self._modules[f"{name}_norm"](x + out) if self.norm_position == "post" else x + out
        return x, out, weights

    def forward(self, x: Tensor, mask: Tensor | None, rotary=None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                need_weights: bool = False, keep_stages: bool = False, relative=None) -> BlockOutput:
        """`relative`: a DeBERTa stack's relative position embeddings and positions (model/disentangled.py)."""
        attention_kwargs = dict(mask=mask, rotary=rotary, cache=cache, layer=layer, need_weights=need_weights)
        if relative is not None:
            attention_kwargs["relative"] = relative
        if self.parallel:
            normed = self._input("attention", x)
            attn_out, weights = self.attention(normed, **attention_kwargs)
            ff_in = self.feed_forward_norm(x) if hasattr(self, "feed_forward_norm") else normed
            ff_out = self.feed_forward(ff_in)
            result = BlockOutput(x + attn_out + ff_out, attention=weights)
        else:
            x, attn_out, weights = self._residual("attention", x, self.attention, **attention_kwargs)
            result = BlockOutput(x, attention=weights)
            if memory is not None:
                x, cross_out, cross_weights = self._residual("cross_attention", x, self.cross_attention,
                                                             mask=memory_mask, memory=memory, cache=cache,
                                                             layer=layer, need_weights=need_weights)
                result.cross_attention = cross_weights
                if keep_stages:
                    result.stages["cross_attention"] = cross_out
            x, ff_out, _ = self._residual("feed_forward", x, lambda h: (self.feed_forward(h), None))
            result.hidden = x
        if keep_stages:
            result.stages["attention"] = attn_out
            result.stages["feed_forward"] = ff_out
        return result
