"""`tfcli attribute`: direct logit attribution. Which components write the prediction at one position: the
logit of a target token (or its difference from a foil's) split into the direct contribution of everything that
writes to the residual stream, read through the model's sites.

The definition is TransformerLens's (`ActivationCache.apply_ln_to_stack` with `stack_head_results` /
`decompose_resid`): the final residual stream at the position is the sum of what each component wrote there (the
embeddings, each head's output through its slice of the output projection, each output projection's bias, each
MLP's output); each is centred when the final norm is a LayerNorm, divided by the final norm's scale at that
position (frozen: the real residual's), times the norm's weight (Gemma's 1 + weight), and dotted with
W_U[target] - W_U[foil]. The final norm's bias and the unembedding's bias are components of their own. The
components sum to the model's own logit (difference): every report carries both.

Shapes: T tokens, d the model width, H heads, D head size, F MLP width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Encoding, Tokenizer

BY = ("component", "head", "neuron")
DEFAULT_TOP = 10
BATCH_SIZE = 16


@dataclass
class Token:
    token: str
    id: int


@dataclass
class Component:
    """One writer to the residual stream and its direct contribution to the logit (difference)."""

    name: str  # embed, pos_embed, type_embed, L{l}H{h}, L{l}.attn, L{l}.attn_bias, L{l}.mlp, L{l}N{n}, ...
    value: float
    layer: int | None = None
    head: int | None = None
    neuron: int | None = None


@dataclass
class Attribution:
    """The attribution of one text."""

    text: str
    ids: list[int]
    tokens: list[str]
    position: int
    target: Token
    foil: Token | None
    logit: float  # the model's own logit (difference) at the position; before a final soft cap, where there is one
    components: list[Component]
    by: str
    layers: int  # the model's
    heads: int
    softcap: float | None = None  # the final logit soft cap the decomposition stops before
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        """The sum of the components: the model's logit (difference) again, to the float precision."""
        return sum(c.value for c in self.components)


@dataclass
class AttributeOptions:
    target: str | None = None  # a token (as it reads: " Mary"), `#ID`, or None: the model's own top prediction
    foil: str | None = None
    position: int | None = None  # None: the last token (a masked-LM encoder: its [MASK], when the text has one)
    by: str = "component"
    layers: list[int] | None = None  # layers broken into heads or neurons; None: every layer
    top: int = DEFAULT_TOP  # rows of the table; with --by neuron, the neurons kept one by one


def check_model(config: ModelConfig, by: str) -> None:
    """Refuse, before any model is built, a model whose logit the components cannot sum to, naming why."""
    if by not in BY:
        raise usage_error(f"by must be one of {', '.join(BY)}, got `{by}`", parameter="by")
    name = config.name
    if config.head not in ("lm", "mlm"):
        has = "no head" if config.head == "none" else f"a `{config.head}` head"
        raise usage_error(f"{name} has {has}: attribute splits the logit of a token, which needs an LM head",
                          "use a decoder (or a masked-LM encoder) with its head")
    if config.architecture == "encoder-decoder":
        raise usage_error(f"{name} is an encoder-decoder: attribute splits a decoder-only or encoder stack's "
                          "residual stream, not one that cross-attention also writes to",
                          "use a decoder-only model; `tfcli patch` works on encoder-decoders")
    if config.norm_position == "post":
        raise usage_error(f"{name} has post-norm blocks: each block normalises the residual stream, so no component "
                          "adds straight to the final one", "attribute works on pre-norm models (GPT-2, Llama, ...)")
    if config.head == "mlm":
        raise usage_error(f"{name}'s masked-LM head transforms the hidden state (dense, activation, norm) before "
                          "the unembedding: the logit is not linear in the residual stream",
                          "attribute needs a model whose head is a linear unembedding (a decoder's LM head)")
    if config.word_embed_proj_dim:
        raise usage_error(f"{name} projects its hidden state out before the unembedding (word_embed_proj_dim): "
                          "attribute does not fold that projection in", "use a model without it")
    if by != "component" and config.norm_position in ("sandwich", "sublayer_output"):
        raise usage_error(f"{name} normalises each sublayer's output before adding it to the residual stream: "
                          f"per-{by} terms are not additive there, per layer they are",
                          "use --by component (the attention and MLP of each layer)")


def check_options(config: ModelConfig, tokenizer: Tokenizer, options: AttributeOptions) -> tuple[Token | None,
                                                                                                 Token | None]:
    """Everything that can be checked before a model is built: the model (check_model), the options that go
    together, and the target and foil tokens, returned as (target or None for the model's own top prediction,
    foil or None)."""
    check_model(config, options.by)
    if options.layers is not None and options.by == "component":
        raise usage_error("--layers picks the layers broken into heads or neurons: give --by head or --by neuron")
    vocab = config.vocab_size
    target = parse_token(tokenizer, options.target, "--target", vocab) if options.target is not None else None
    foil = parse_token(tokenizer, options.foil, "--foil", vocab) if options.foil is not None else None
    return target, foil


def parse_token(tokenizer: Tokenizer, spec: str, option: str, vocab_size: int) -> Token:
    """`#ID` or a string that is one token of the tokenizer (as it reads: " Mary" with its leading space for
    byte-level BPE); anything else is a usage error that shows how the string tokenizes."""
    if spec.startswith("#") and spec[1:].isdigit():
        token_id = int(spec[1:])
        if token_id >= vocab_size:
            raise usage_error(f"{option} {spec}: the model's vocabulary has {vocab_size} tokens (0 to {vocab_size - 1})")
        return Token(tokenizer.id_to_token(token_id) or f"<{token_id}>", token_id)
    token_id = tokenizer.token_to_id(spec)
    if token_id is None:
        encoding = tokenizer.encode([spec], add_special_tokens=False)[0]
        if len(encoding.ids) == 1:
            token_id = encoding.ids[0]
        else:
            pieces = " ".join(repr(t) for t in encoding.tokens) or "no token"
            raise usage_error(f"{option} {spec!r} is not one token of {tokenizer.name}: it reads as "
                              f"{len(encoding.ids)} ({pieces})",
                              "give one token (byte-level BPE tokens carry their leading space: \" Mary\") or #ID")
    return Token(tokenizer.id_to_token(token_id) or spec, token_id)


def model_input(config: ModelConfig, encoding: Encoding) -> list[int]:
    """What the model reads: a decoder reads the text as `generate` reads a prompt, without an end-of-sequence
    token the tokenizer appends (BERT's [SEP]), so that its last position predicts what comes next."""
    ids = list(encoding.ids)
    if config.architecture == "decoder" and len(ids) > 1 and ids[-1] in config.eos_token_ids:
        ids = ids[:-1]
    return ids


def position_of(ids: list[int], tokenizer: Tokenizer, config: ModelConfig, position: int | None) -> int:
    """The position the logit is read at: `position` (negative counts from the end), else a masked-LM encoder's
    [MASK] when the text has one, else the last token."""
    if position is not None:
        if not -len(ids) <= position < len(ids):
            raise usage_error(f"position {position} is out of range: the text has {len(ids)} tokens "
                              f"(0 to {len(ids) - 1})", parameter="position")
        return position % len(ids)
    mask = tokenizer.mask_token_id
    if config.head == "mlm" and mask is not None and mask in ids:
        return ids.index(mask)
    return len(ids) - 1


def site_names(model: TransformerModel, by: str) -> list[str]:
    """The sites an attribution reads: the embeddings, what each sublayer writes, the final norm's scale, and
    with --by neuron the MLP neurons."""
    names = ["embed", "pos_embed", "type_embed", "blocks.0.resid_pre", "final_norm.scale", "final_norm.out"]
    for i, block in enumerate(model.output_stack.blocks):
        if block.output_norms:
            names += [f"blocks.{i}.attn_output_norm.out", f"blocks.{i}.mlp_output_norm.out"]
        else:
            names += [f"blocks.{i}.attn.z", f"blocks.{i}.mlp.out"]
            if by == "neuron":
                names.append(f"blocks.{i}.mlp.post")
    return names


class Unembedding:
    """The linear map from a vector written to the residual stream to its direct contribution to the logit
    (difference), at one position: through the final norm (centred for a LayerNorm, divided by the frozen scale,
    times the weight) and the unembedding direction W_U[target] - W_U[foil]. As centring is linear too, the map is
    a dot product with one vector, `self.vector` (d,). float64 throughout."""

    def __init__(self, model: TransformerModel, target: int, foil: int | None, scale: Tensor | None):
        import torch

        from tfcli.model.norms import RMSNormPlusOne

        head = model.head
        weight = head.unembed.weight.detach().double()
        raw = weight[target] - (weight[foil] if foil is not None else 0)
        if head.input_scale is not None:  # T5's tied head reads the hidden state scaled
            raw = raw * head.input_scale
        self.raw = raw  # (d,) what the final norm's output is dotted with
        vector = raw
        norm = model.output_stack.final_norm
        if norm is not None and norm.weight is not None:
            gain = norm.weight.detach().double()
            vector = vector * (1.0 + gain if isinstance(norm, RMSNormPlusOne) else gain)
        if isinstance(norm, torch.nn.LayerNorm):  # (v - mean v) . u = v . (u - mean u)
            vector = vector - vector.mean()
        if scale is not None:  # the final norm's divisor at this position
            vector = vector / scale.double()
        self.vector = vector

    def __call__(self, vectors: Tensor) -> Tensor:
        """(..., d) written to the stream -> (...) their direct contributions."""
        return vectors.double() @ self.vector


def attribute_row(model: TransformerModel, cache: dict[str, Tensor], row: int, position: int, target: int,
                  foil: int | None, options: AttributeOptions) -> list[Component]:
    """The components of one text (row `row` of the batch's cache) at `position`."""
    def at(name: str) -> Tensor:
        return cache[name][row, position]

    unembed = Unembedding(model, target, foil, at("final_norm.scale")[0] if "final_norm.scale" in cache else None)
    components: list[Component] = []

    def add(name: str, value: Tensor, **where) -> None:
        components.append(Component(name, float(value), **where))

    stack = model.output_stack
    if stack.embeddings.norm is not None:  # the embeddings reach the stream through a norm: one component
        add("embed", unembed(at("blocks.0.resid_pre")))
    else:
        for name in ("embed", "pos_embed", "type_embed"):
            if name in cache:
                add(name, unembed(at(name)))
    broken = set(range(len(stack.blocks)) if options.layers is None else options.layers)
    neurons: list[Component] = []
    for i, block in enumerate(stack.blocks):
        if block.output_norms:  # sandwich, sublayer_output: what each sublayer adds, after its output norm
            add(f"L{i}.attn", unembed(at(f"blocks.{i}.attn_output_norm.out")), layer=i)
            add(f"L{i}.mlp", unembed(at(f"blocks.{i}.mlp_output_norm.out")), layer=i)
            continue
        out = block.attn.out
        z = at(f"blocks.{i}.attn.z").double()  # (H, D)
        read = (unembed.vector @ out.weight.detach().double()).view(z.shape)  # (H, D): what each z direction adds
        per_head = (z * read).sum(-1)  # (H,): each head's z through its slice of W_O
        if options.by == "head" and i in broken:
            for h, value in enumerate(per_head):
                add(f"L{i}H{h}", value, layer=i, head=h)
        else:
            add(f"L{i}.attn", per_head.sum(), layer=i)
        if out.bias is not None:
            add(f"L{i}.attn_bias", unembed(out.bias.detach()), layer=i)
        mlp = unembed(at(f"blocks.{i}.mlp.out"))
        if options.by == "neuron" and i in broken:
            down = block.mlp.down if block.mlp.gated else block.mlp.fc2
            post = at(f"blocks.{i}.mlp.post").double()  # (F,)
            each = post * (unembed.vector @ down.weight.detach().double())  # (F,): activation x its output row
            neurons += [Component(f"L{i}N{n}", v, layer=i, neuron=n) for n, v in enumerate(each.tolist())]
            add(f"L{i}.mlp_rest", mlp, layer=i)  # the rest of that MLP: the neurons kept are taken out below
        else:
            add(f"L{i}.mlp", mlp, layer=i)
    if neurons:
        kept = sorted(neurons, key=lambda c: -abs(c.value))[:options.top]
        rest = {c.name: c for c in components if c.name.endswith(".mlp_rest")}
        for neuron in kept:
            rest[f"L{neuron.layer}.mlp_rest"].value -= neuron.value
        components += sorted(kept, key=lambda c: (c.layer, c.neuron))
    norm = stack.final_norm
    if norm is not None and getattr(norm, "bias", None) is not None:
        add("final_norm_bias", norm.bias.detach().double() @ unembed.raw)
    if model.head.bias is not None:
        bias = model.head.bias.detach().double()
        add("unembed_bias", bias[target] - (bias[foil] if foil is not None else 0))
    return components


def own_logit(model: TransformerModel, logits: Tensor, final: Tensor, target: int, foil: int | None) -> float:
    """The model's own logit (difference) at a position: from its logits (V,), or with a final soft cap, from the
    state its head reads (`final`, (d,)) through the head's linear map, before the cap."""
    if model.head.softcap is None:
        value = logits[target] - (logits[foil] if foil is not None else 0)
        return float(value)
    head, state = model.head, final.double()
    if head.input_scale is not None:
        state = state * head.input_scale
    weight = head.unembed.weight.detach().double()
    value = state @ (weight[target] - (weight[foil] if foil is not None else 0))
    if head.bias is not None:
        value = value + head.bias[target].double() - (head.bias[foil].double() if foil is not None else 0)
    return float(value)


def run(model: TransformerModel, tokenizer: Tokenizer, chunks: Iterable[list[Encoding]], options: AttributeOptions,
        batch_size: int = BATCH_SIZE) -> Iterator[Attribution]:
    """Attribute tokenized texts, chunk by chunk (a stream's batches), in padded batches of `batch_size`; yields one
    Attribution per text, in order. A text gives the same numbers alone or in any batch (right padding, causal
    or masked attention)."""
    import torch

    config = model.config
    fixed_target, foil = check_options(config, tokenizer, options)
    device = model.embed_tokens.weight.device
    names = site_names(model, options.by)
    last = f"blocks.{len(model.output_stack.blocks) - 1}.resid_post"
    for encodings in chunks:
        for start in range(0, len(encodings), batch_size):
            batch = encodings[start:start + batch_size]
            rows = [model_input(config, encoding) for encoding in batch]
            positions = [position_of(ids, tokenizer, config, options.position) for ids in rows]
            width = max(map(len, rows))
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)
            logits, cache = model.run_with_cache(ids, lambda name: name in names or name == last, attention_mask=mask)
            for row, (encoding, token_ids, position) in enumerate(zip(batch, rows, positions)):
                scores = logits[row, position].double()
                target = fixed_target or _token(tokenizer, int(scores.argmax()))
                final = (cache["final_norm.out"] if "final_norm.out" in cache else cache[last])[row, position]
                yield Attribution(
                    encoding.text, token_ids, tokenizer.tokens(token_ids), position,
                    target, foil, own_logit(model, scores, final, target.id, foil and foil.id),
                    attribute_row(model, cache, row, position, target.id, foil and foil.id, options), options.by,
                    len(model.output_stack.blocks), config.num_attention_heads, model.head.softcap)


def _token(tokenizer: Tokenizer, token_id: int) -> Token:
    return Token(tokenizer.id_to_token(token_id) or f"<{token_id}>", token_id)
