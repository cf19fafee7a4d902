"""What a forward pass returns and, on request, keeps: `Capture` asks, `ModelOutput` holds.

Captured tensors follow the names `--save` uses: `hidden_states[i]` is `hidden.{i}` (0 = the
embeddings' output, i = the output of block i - 1), `attentions[i]` is `attention.{i}`. Sublayer
outputs (`stages`) are keyed by the path of the module that produced them inside its stack
(`blocks.{i}.attention`, `blocks.{i}.cross_attention`, `blocks.{i}.feed_forward`, `final_norm`), so a
report can find that module, and its parameters, in the module tree.

Shapes: B batch, T tokens, hidden = config.hidden_size, V vocabulary, H heads, S key length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.model.attention import KVCache


@dataclass
class Capture:
    """What a forward pass keeps besides its result. Attention weights force the explicit softmax path
    in the layers they are kept for; other layers stay on the fused fast path."""

    hidden_states: bool = True
    attention: bool = True
    layers: list[int] | None = None  # blocks whose attention weights are kept; None = every block
    heads: list[int] | None = None  # heads kept; None = every head
    stages: bool = False  # every sublayer's output (and the hidden states: block outputs are among them)

    def wants_attention(self, layer: int) -> bool:
        return self.attention and (self.layers is None or layer in self.layers)

    @property
    def wants_hidden_states(self) -> bool:
        return self.hidden_states or self.stages


@dataclass
class ModelOutput:
    """One stack's results; for an encoder-decoder, the decoder's, with the encoder's in `encoder`."""

    last_hidden_state: Tensor  # (B, T, hidden), after the final norm when the stack has one
    logits: Tensor | None = None  # (B, T, V) or (B, num_labels)
    hidden_states: list[Tensor] = field(default_factory=list)  # hidden.{i}: embeddings, then each block (before final norm)
    attentions: dict[int, Tensor] = field(default_factory=dict)  # attention.{i}: block -> (B, H, T, S) softmax weights
    cross_attentions: dict[int, Tensor] = field(default_factory=dict)  # cross_attention.{i}
    stages: dict[str, Tensor] = field(default_factory=dict)  # module path in the stack -> its output (B, T, hidden)
    encoder: ModelOutput | None = None
    cache: KVCache | None = None
