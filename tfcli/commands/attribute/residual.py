"""The residual algebra: the output stack's final residual stream at one position is the sum of what each component
wrote there (the embeddings, each head's output through its slice of the output projection, the output projection's
bias, each MLP's output or each of its neurons through its output weights); read through the model's `Readout` (the
final norm folded in, its divisor frozen, and the unembedding direction), each gives its direct contribution to the
logit (difference). This is TransformerLens's `decompose_resid` / `stack_head_results` with `apply_ln_to_stack`.

Shapes: d the model width, H heads, D head size, F MLP width. Float64 throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.analysis.names import block_site

if TYPE_CHECKING:
    from torch import Tensor, nn

    from tfcli.model import TransformerModel
    from tfcli.model.layers import Block
    from tfcli.model.transformer import Readout

BY = ("component", "head", "neuron")


@dataclass
class Component:
    """One writer to the residual stream and its direct contribution to the logit (difference)."""

    name: str  # embed, pos_embed, type_embed, L{l}H{h}, L{l}.attn, L{l}.attn_bias, L{l}.mlp, L{l}N{n}, ...
    value: float
    layer: int | None = None
    head: int | None = None
    neuron: int | None = None

    @property
    def in_mlp(self) -> bool:
        """Whether it is (part of) an MLP's output, else of an attention's or the embeddings'."""
        return ".mlp" in self.name or self.neuron is not None


def writer_sites(model: TransformerModel, by: str) -> list[str]:
    """The sites a decomposition of the output stack reads, every one of which the model has: the embeddings' writers,
    what each block's sublayers write (each head's `attn.z`, the MLP's `out`, with --by neuron its `post`; a block
    with output norms: their outputs), and the final norm's divisor and output (or the last block's output)."""
    stack = model.output_stack
    names = list(stack.embedding_sites)
    for i, block in enumerate(stack.blocks):
        if block.output_norms:
            names += [block_site(i, block.output_site("attn")), block_site(i, block.output_site("mlp"))]
        else:
            names += [block_site(i, "attn.z"), block_site(i, "mlp.out")]
            if by == "neuron":
                names.append(block_site(i, "mlp.post"))
    last = block_site(len(stack.blocks) - 1, "resid_post")
    return names + (["final_norm.scale", "final_norm.out"] if stack.final_norm is not None else [last])


def final_state(model: TransformerModel, cache: dict[str, Tensor]) -> Tensor:
    """What the head reads, (B, T, d): the final norm's output, or the last block's output without one."""
    stack = model.output_stack
    return cache["final_norm.out"] if stack.final_norm is not None else \
        cache[block_site(len(stack.blocks) - 1, "resid_post")]


def direction_at(readout: Readout, cache: dict[str, Tensor], row: int, position: int) -> Tensor:
    """The readout's direction (d,) at one position: divided by the final norm's divisor there, frozen."""
    if not readout.normed:
        return readout.direction
    return readout.direction / cache["final_norm.scale"][row, position, 0].double()


KEPT_FLOAT64_BYTES = 512 * 2**20  # the most float64 weights float64_weight keeps (a large model's: converted each time)


def float64_weight(linear: nn.Module, converted: dict[nn.Module, Tensor]) -> Tensor:
    """A linear layer's weight in float64, kept in `converted` for the next call while they hold less than
    KEPT_FLOAT64_BYTES (a dataset's prompts read each weight again and again)."""
    weight = converted.get(linear)
    if weight is None:
        weight = linear.weight.detach().double()
        if sum(w.numel() for w in converted.values()) * 8 + weight.numel() * 8 <= KEPT_FLOAT64_BYTES:
            converted[linear] = weight
    return weight


def head_values(block: Block, z: Tensor, direction: Tensor, converted: dict[nn.Module, Tensor]) -> Tensor:
    """z (H, D) of one position -> (H,): what each head writes through its slice of the output projection, read
    along `direction` (d,)."""
    read = (direction @ float64_weight(block.attn.out, converted)).view(z.shape)  # (H, D): what each z direction adds
    return (z.double() * read).sum(-1)


def neuron_values(block: Block, post: Tensor, direction: Tensor, converted: dict[nn.Module, Tensor]) -> Tensor:
    """post (F,) of one position -> (F,): each neuron's activation times its output row, read along `direction`."""
    return post.double() * (direction @ float64_weight(block.mlp.output, converted))


def decompose(model: TransformerModel, cache: dict[str, Tensor], where: tuple[int, int], readout: Readout,
              by: str = "component", layers: list[int] | None = None, neurons: int = 10,
              converted: dict[nn.Module, Tensor] | None = None) -> list[Component]:
    """The components of a batch's cache (of `writer_sites`) at `where`, (row, position): with `by` head or neuron
    the blocks of `layers` (None: all) broken into heads or neurons (the `neurons` largest |value| kept one by one,
    the rest of each MLP as `L{l}.mlp_rest`: `kept_neurons`); then the readout's constants (the final norm's and the
    unembedding's biases). They sum to the model's own logit (difference) before a soft cap. `converted`: the
    float64 weights (float64_weight) kept from one call to the next."""
    converted = {} if converted is None else converted
    row, position = where

    def at(name: str) -> Tensor:
        return cache[name][row, position]

    direction = direction_at(readout, cache, row, position)
    components: list[Component] = []

    def add(name: str, value: Tensor | float, **where) -> None:
        components.append(Component(name, float(value), **where))

    stack = model.output_stack
    for site in stack.embedding_sites:  # where a norm follows the embeddings' sum: its output, one component
        add("embed" if site.endswith("resid_pre") else site, at(site).double() @ direction)
    broken = set(range(len(stack.blocks)) if layers is None else layers)
    each_neuron: list[Component] = []
    for i, block in enumerate(stack.blocks):
        if block.output_norms:  # sandwich, sublayer_output: what each sublayer adds, after its output norm
            add(f"L{i}.attn", at(block_site(i, block.output_site("attn"))).double() @ direction, layer=i)
            add(f"L{i}.mlp", at(block_site(i, block.output_site("mlp"))).double() @ direction, layer=i)
            continue
        per_head = head_values(block, at(block_site(i, "attn.z")), direction, converted)
        if by == "head" and i in broken:
            for h, value in enumerate(per_head):
                add(f"L{i}H{h}", value, layer=i, head=h)
        else:
            add(f"L{i}.attn", per_head.sum(), layer=i)
        if block.attn.out.bias is not None:
            add(f"L{i}.attn_bias", block.attn.out.bias.detach().double() @ direction, layer=i)
        mlp = at(block_site(i, "mlp.out")).double() @ direction
        if by == "neuron" and i in broken:
            values = neuron_values(block, at(block_site(i, "mlp.post")), direction, converted)
            each_neuron += [Component(f"L{i}N{n}", v, layer=i, neuron=n) for n, v in enumerate(values.tolist())]
            add(f"L{i}.mlp_rest", mlp, layer=i)  # the rest of that MLP: the neurons kept are taken out below
        else:
            add(f"L{i}.mlp", mlp, layer=i)
    for name, value in readout.constants.items():
        add(name, value)
    if each_neuron:  # each MLP's rest: without the neurons kept one by one
        for component in components:
            if component.name.endswith(".mlp_rest"):
                component.value -= sum(c.value for c in each_neuron if c.layer == component.layer)
        components = kept_neurons(components + each_neuron, neurons)
    return components


def kept_neurons(components: list[Component], neurons: int) -> list[Component]:
    """Components with every neuron of some layers one by one (and each such layer's `L{l}.mlp_rest` without them)
    -> the same with only the `neurons` largest |value| kept one by one, after the rest, in order of layer and
    neuron; the others added back into their layer's rest."""
    each = [c for c in components if c.neuron is not None]
    kept = sorted(each, key=lambda c: -abs(c.value))[:neurons]
    names = {c.name for c in kept}
    rest = {c.layer: Component(c.name, c.value, c.layer) for c in components if c.name.endswith(".mlp_rest")}
    for c in each:
        if c.name not in names:
            rest[c.layer].value += c.value
    others = [rest[c.layer] if c.name.endswith(".mlp_rest") else c for c in components if c.neuron is None]
    after = max(i for i, c in enumerate(others) if c.layer is not None) + 1  # the readout's constants stay last
    return others[:after] + sorted(kept, key=lambda c: (c.layer, c.neuron)) + others[after:]


def before_cap(readout: Readout, state: Tensor) -> float:
    """The logit (difference) the head computes from the state it reads (d,), before a final soft cap: what the
    components sum to when the model caps its logits."""
    return float(state.double() @ readout.head_direction + readout.constants.get("unembed_bias", 0.0))
