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

from collections.abc import Callable

from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.attention import Attention, KVCache
from tfcli.model.disentangled import DisentangledAttention
from tfcli.model.linear import Linear
from tfcli.model.norms import norm, normed
from tfcli.model.sites import NO_SITES, Sites


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

    @property
    def output(self) -> Linear:
        """The projection from the neurons (`post`, (inner,)) back to the residual stream: row n of its weight's
        transpose is what neuron n writes per unit of activation."""
        return self.down if self.gated else self.fc2

    def forward(self, x: Tensor, sites: Sites = NO_SITES) -> Tensor:
        """(B, T, hidden) -> (B, T, hidden). Sites (B, T, inner): `pre` (the activation's input: the gate's
        projection when gated), `pre_linear` (gated: the up projection), `post` (after the activation, times the
        up projection when gated); then `out` (B, T, hidden)."""
        if self.gated:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            post = self.act(sites("pre", gate)) * sites("pre_linear", up)
            return sites("out", self.down(sites("post", post)))
        return sites("out", self.fc2(sites("post", self.act(sites("pre", self.fc1(x))))))


class Block(nn.Module):
    """Self-attention `attn` (+ cross-attention `cross_attn`), feed-forward `mlp`, residuals and norms (see the module
    docstring). Each sublayer NAME has `NAME_norm` (its input norm, or for post-norm the norm after the residual) and,
    for sandwich and sublayer_output blocks, `NAME_output_norm` (on its output, inside the residual). Its sites, under
    `blocks.{l}.`: resid_pre, the sublayers' and norms' own, resid_mid (after attention; resid_mid_cross after
    cross-attention), resid_post (tfcli/model/sites.py)."""

    def __init__(self, config: ModelConfig, cross: bool = False, attention_norm: bool = True):
        """attention_norm=False: the attention reads the block's input as it is (ModernBERT's first block)."""
        super().__init__()
        self.norm_position = config.norm_position
        self.input_norms = config.norm_position in ("pre", "sandwich")
        self.output_norms = config.norm_position in ("sandwich", "sublayer_output")
        self.parallel = config.parallel_residual
        attention = DisentangledAttention(config) if config.relative_attention else Attention(config)
        sublayers = {"attn": attention, "cross_attn": Attention(config, cross=True) if cross else None,
                     "mlp": FeedForward(config)}
        for name, sublayer in sublayers.items():
            if sublayer is None:
                continue
            setattr(self, name, sublayer)
            if config.norm_position != "sublayer_output" and not (name == "mlp" and config.shared_block_norm):
                setattr(self, f"{name}_norm", norm(config))
            if self.output_norms:
                setattr(self, f"{name}_output_norm", norm(config))
        if not attention_norm:
            self.attn_norm = nn.Identity()

    def sublayers(self) -> dict[str, list[nn.Module]]:
        """Each sublayer this block has (attn, cross_attn, mlp), with the norms that go with it (before, after or
        both), in forward order."""
        return {name: [m for part, m in self.named_children() if part == name or part.startswith(name + "_")]
                for name in ("attn", "cross_attn", "mlp") if name in self._modules}

    def output_site(self, name: str) -> str:
        """The site (under `blocks.{l}.`) of what sublayer `name` adds to the residual stream: its output norm's
        output where the block has output norms, else the sublayer's own output."""
        return f"{name}_output_norm.out" if self.output_norms else f"{name}.out"

    # The norms are read from self._modules by name: nn.Module's attribute lookup (and hasattr, which fails
    # through it) costs more than the norm itself in a decoding step.
    def _sublayer(self, name: str, x: Tensor, sites: Sites, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """x after sublayer `name` (`sublayer`: what it reads -> what it outputs), with its residual and norms."""
        if self.norm_position == "post":
            return normed(self._modules[f"{name}_norm"], x + sublayer(x), sites, f"{name}_norm", output_site=False)
        h = normed(self._modules[f"{name}_norm"], x, sites, f"{name}_norm") if self.input_norms else x
        out = sublayer(h)
        if self.output_norms:  # what the sublayer adds to the residual stream goes through its output norm
            out = normed(self._modules[f"{name}_output_norm"], out, sites, f"{name}_output_norm")
        return x + out

    def forward(self, x: Tensor, mask: Tensor | None, rotary=None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None, layer: int = 0,
                sites: Sites = NO_SITES, relative=None) -> Tensor:
        """(B, T, hidden) -> (B, T, hidden). `relative`: a DeBERTa stack's relative position embeddings and positions
        (model/disentangled.py). `sites`: this block's (scoped to `blocks.{layer}`)."""
        x = sites("resid_pre", x)
        extra = {"relative": relative} if relative is not None else {}

        def attend(h: Tensor) -> Tensor:
            return self.attn(h, mask, rotary=rotary, cache=cache, layer=layer, sites=sites.scope("attn"), **extra)

        def feed_forward(h: Tensor) -> Tensor:
            return self.mlp(h, sites.scope("mlp"))

        if sites.asks("q_input") or sites.asks("k_input") or sites.asks("v_input") or sites.asks("mlp_in"):
            return sites("resid_post", self.split_forward(x, mask, rotary, cache, sites))
        if self.parallel:
            h = normed(self._modules["attn_norm"], x, sites, "attn_norm")
            mlp_norm = self._modules.get("mlp_norm")
            x = x + attend(h) + feed_forward(normed(mlp_norm, x, sites, "mlp_norm") if mlp_norm is not None else h)
        else:
            x = sites("resid_mid", self._sublayer("attn", x, sites, attend))
            if memory is not None:
                def cross_attend(h: Tensor) -> Tensor:
                    return self.cross_attn(h, memory_mask, memory=memory, cache=cache, layer=layer,
                                           sites=sites.scope("cross_attn"))

                x = sites("resid_mid_cross", self._sublayer("cross_attn", x, sites, cross_attend))
            x = self._sublayer("mlp", x, sites, feed_forward)
        return sites("resid_post", x)

    def split_forward(self, x: Tensor, mask: Tensor | None, rotary, cache: KVCache | None, sites: Sites) -> Tensor:
        """The block on split inputs (sites.SPLIT_SITES), pre-norm or parallel blocks of self-attention only: each
        query head reads its query, key and value from copies of x of its own, `q_input`, `k_input`, `v_input` (B, T,
        H, hidden; a key/value head's projection applied for every query head that reads it), each through the
        attention's norm; the MLP reads `mlp_in` (B, T, hidden). Every copy equals x unless a hook changes it, and a
        gradient at one is the metric's through that input alone. (B, T, hidden) -> (B, T, hidden), before
        resid_post."""
        if self.norm_position != "pre" or "cross_attn" in self._modules or cache is not None \
                or not isinstance(self.attn, Attention):
            raise ValueError("split inputs (q_input, k_input, v_input, mlp_in) need a pre-norm self-attention block "
                             "without a cache")
        batch, length, hidden = x.shape
        wide = (batch, length, self.attn.heads, hidden)
        inputs = [sites(f"{name}_input", x[:, :, None].expand(wide)) for name in "qkv"]  # three tensors: a gradient each
        attn_norm = self._modules["attn_norm"]
        out = self.attn.split_forward(inputs, attn_norm, mask, rotary, sites.scope("attn"))
        mlp_norm = self._modules.get("mlp_norm")
        if self.parallel:
            mlp_in = sites("mlp_in", x.view_as(x))
            return x + out + self.mlp(mlp_norm(mlp_in) if mlp_norm is not None else attn_norm(mlp_in),
                                      sites.scope("mlp"))
        x = sites("resid_mid", x + out)
        mlp_in = sites("mlp_in", x.view_as(x))
        return x + self.mlp(mlp_norm(mlp_in), sites.scope("mlp"))
