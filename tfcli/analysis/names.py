"""Site names as analyses build them, and the kinds of site an analysis sweeps (`tfcli patch --sites`), each with
the site it reads and the axes one patch of it selects: what patch, heads, the renderers and the next analyses read.

The names themselves are the model's (tfcli/model/sites.py, `block_site`; docs/sites.md): `blocks.{l}.{leaf}` under a stack's
prefix (`""`, or `encoder.` / `decoder.` in an encoder-decoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.model.sites import block_site

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel


def every_block(model: TransformerModel, leaf: str, causal: bool = False) -> list[str]:
    """The site `leaf` of every block of every stack, the encoder's first (`causal`: of the causal stacks only)."""
    return [block_site(i, leaf, prefix) for prefix, stack in model.stacks() if stack.causal or not causal
            for i in range(len(stack.blocks))]


@dataclass(frozen=True)
class Kind:
    """A kind of site a sweep patches: the site under `blocks.{l}.`, and what one patch of it selects besides its
    layer, in the order its grid nests them: ("position",), ("head",) (every position) or ("head", "position")."""

    name: str
    leaf: str
    axes: tuple[str, ...]
    what: str  # as the views say it, `{l}` for the layer

    @property
    def per_key_value_head(self) -> bool:
        """k and v have one per key/value head (grouped-query attention), the others one per query head."""
        return self.leaf in ("attn.k", "attn.v")

    def heads(self, config: ModelConfig) -> int:
        return config.kv_heads if self.per_key_value_head else config.num_attention_heads


KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("resid", "resid_pre", ("position",), "the residual stream entering the block (blocks.{l}.resid_pre)"),
    Kind("attn", "attn.out", ("position",), "the attention's output (blocks.{l}.attn.out)"),
    Kind("mlp", "mlp.out", ("position",), "the MLP's output (blocks.{l}.mlp.out)"),
    Kind("heads", "attn.z", ("head",), "each head's output at every position (blocks.{l}.attn.z)"),
    Kind("heads-by-position", "attn.z", ("head", "position"), "each head's output at one position (blocks.{l}.attn.z)"),
    Kind("q", "attn.q", ("head",), "each head's queries at every position (blocks.{l}.attn.q)"),
    Kind("k", "attn.k", ("head",), "each key/value head's keys at every position (blocks.{l}.attn.k)"),
    Kind("v", "attn.v", ("head",), "each key/value head's values at every position (blocks.{l}.attn.v)"),
    Kind("pattern", "attn.pattern", ("head",), "each head's attention pattern (blocks.{l}.attn.pattern)"),
)}


def kind_of(grid: str) -> tuple[str, Kind]:
    """A grid's name -> its stack prefix and kind: `decoder.resid` -> ("decoder.", KINDS["resid"])."""
    stack, _, name = grid.rpartition(".") if grid.startswith(("encoder.", "decoder.")) else ("", "", grid)
    return (stack + "." if stack else ""), KINDS[name]
