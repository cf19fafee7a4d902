"""`tfcli attribute`: direct logit attribution. Which components write the prediction at one position: the
logit of a target token (or its difference from a foil's) split into the direct contribution of everything that
writes to the residual stream, read through the model's sites.

The definition is TransformerLens's (`ActivationCache.apply_ln_to_stack` with `stack_head_results` /
`decompose_resid`): the final residual stream at the position is the sum of what each component wrote there (the
embeddings, each head's output through its slice of the output projection, each output projection's bias, each
MLP's output); each is centred when the final norm is a LayerNorm, divided by the final norm's scale at that
position (frozen: the real residual's), times the norm's weight (Gemma's 1 + weight), and dotted with
W_U[target] - W_U[foil]. The final norm's bias and the unembedding's bias are components of their own. The
components sum to the model's own logit (difference): every report carries both. The algebra is the analysis
layer's (tfcli/analysis/residual.py, the model's `readout`); this module reads the texts and makes the reports.

Shapes: T tokens, d the model width, H heads, D head size, F MLP width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.inputs import model_input, padded
from tfcli.analysis.metric import Metric, Token, parse_token, position_of, token_of
from tfcli.analysis.residual import BY, Component, before_cap, decompose, final_state, writer_sites
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Encoding, Tokenizer

DEFAULT_TOP = 10
BATCH_SIZE = 16


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
    top: int = DEFAULT_TOP  # components listed: the run's --top (the terminal's and the page's lists)
    read_text: str | None = None  # a truncated text: what the model read of it (None: all of it)
    untruncated_length: int | None = None  # and how many tokens the whole text has

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


def run(model: TransformerModel, tokenizer: Tokenizer, chunks: Iterable[list[Encoding]], options: AttributeOptions,
        batch_size: int = BATCH_SIZE) -> Iterator[Attribution]:
    """Attribute tokenized texts, chunk by chunk (a stream's batches), in padded batches of `batch_size`; yields one
    Attribution per text, in order. A text gives the same numbers alone or in any batch (right padding, causal
    or masked attention)."""
    config = model.config
    fixed_target, foil = check_options(config, tokenizer, options)
    device = model.embed_tokens.weight.device
    names = writer_sites(model, options.by)
    layers = len(model.output_stack.blocks)
    for encodings in chunks:
        for start in range(0, len(encodings), batch_size):
            batch = encodings[start:start + batch_size]
            rows = [model_input(config, encoding) for encoding in batch]
            positions = [position_of(ids, tokenizer, config, options.position) for ids in rows]
            ids, mask = padded(rows, tokenizer, device)
            logits, cache = model.run_with_cache(ids, names, attention_mask=mask)
            state = final_state(model, cache)
            for row, (encoding, token_ids, position) in enumerate(zip(batch, rows, positions)):
                scores = logits[row, position].double()
                target = fixed_target or token_of(tokenizer, int(scores.argmax()))
                readout = model.readout(target.id, foil and foil.id)
                value = float(Metric(target.id, foil and foil.id, None).of_row(scores[None])[0]) \
                    if model.lm_head.softcap is None else before_cap(readout, state[row, position])
                yield Attribution(
                    encoding.text, token_ids, tokenizer.tokens(token_ids), position, target, foil, value,
                    decompose(model, cache, row, position, readout, options.by, options.layers, options.top),
                    options.by, layers, config.num_attention_heads, model.lm_head.softcap, top=options.top,
                    read_text=encoding.read_part(0),
                    untruncated_length=encoding.untruncated_length if encoding.truncated else None)
