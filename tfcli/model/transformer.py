"""Stacks (encoder, decoder), heads and the whole model; every intermediate is a named site (model/sites.py) that
`run_with_cache` keeps and `run_with_hooks` changes.

Shapes: B batch, T tokens, hidden = config.hidden_size, V vocabulary, H heads, S key length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfcli.config import ModelConfig
from tfcli.model.attention import KVCache
from tfcli.model.decoding import generate
from tfcli.model.disentangled import RelativeEmbeddings
from tfcli.model.embeddings import Embeddings, embedding
from tfcli.model.layers import Block, activation
from tfcli.model.linear import Linear
from tfcli.model.norms import RMSNormPlusOne, folded, norm, normed
from tfcli.model.position_bias import RelativePositionBias
from tfcli.model.rotary import Rotary
from tfcli.model.sites import NO_SITES, Hook, Sites, block_site, check_names, name_filter


@dataclass
class ModelOutput:
    """What a forward pass returns; for an encoder-decoder, the decoder's, with the encoder's in `encoder`. Everything
    else a pass computes is a site: `run_with_cache` keeps it."""

    last_hidden_state: Tensor  # (B, T, hidden), after the final norm when the stack has one
    logits: Tensor | None = None  # (B, T, V), (B, num_labels) or (B, T) (a discriminator)
    encoder: ModelOutput | None = None
    cache: KVCache | None = None


@dataclass
class BlockInputs:
    """What every block of a stack reads besides the residual stream (Stack.block_inputs): the additive masks
    (B or 1, 1 or H, T, S) of full and sliding-window layers, the rotary cos and sin of each kind of layer, a DeBERTa
    stack's relative embeddings, the memory cross-attention reads (B, S, hidden) and its mask."""

    mask: Tensor | None
    window_mask: Tensor | None
    rotary: tuple[Tensor, Tensor] | None
    local_rotary: tuple[Tensor, Tensor] | None
    relative: tuple[Tensor, Tensor] | None
    memory: Tensor | None
    cross_mask: Tensor | None

    def rows(self, start: int, stop: int) -> BlockInputs:
        """The same for the queries at positions start .. stop - 1 of a causal pass (keys 0 .. stop - 1), as a pass
        over those positions alone, with the keys and values before `start` given, reads them."""
        def cut(mask: Tensor | None) -> Tensor | None:
            return None if mask is None else mask[..., start:stop, :stop]

        def turned(rotary: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
            return None if rotary is None else (rotary[0][:, :, start:stop], rotary[1][:, :, start:stop])

        return BlockInputs(cut(self.mask), cut(self.window_mask), turned(self.rotary), turned(self.local_rotary),
                           self.relative, self.memory,
                           None if self.cross_mask is None else self.cross_mask[..., start:stop, :])


@dataclass
class Readout:
    """The logit (difference) as a linear function of the final residual stream x (hidden,) at one position, the
    final norm's divisor `scale` frozen at its value there: logit = x . direction / scale + sum(constants) (no
    division without a final norm). Float64."""

    direction: Tensor  # (hidden,): the unembedding direction through the final norm (weight, centring)
    head_direction: Tensor  # (hidden,): what the final norm's output is dotted with (the head's own)
    normed: bool  # whether a final norm divides x by its scale
    constants: dict[str, float]  # what no component writes: final_norm_bias, unembed_bias (where the model has them)


def start_token_id(config: ModelConfig) -> int:
    """The id an encoder-decoder's decoder starts from: decoder_start_token_id, else bos, else 0."""
    if config.decoder_start_token_id is not None:
        return config.decoder_start_token_id
    return config.bos_token_id or 0


def count_parameters(*modules: nn.Module | None) -> int:
    return sum(p.numel() for m in modules if m is not None for p in m.parameters())


def attention_mask_bias(attention_mask: Tensor | None, query_length: int, causal: bool, dtype: torch.dtype,
                        device: torch.device, past: int = 0, window: int | None = None) -> Tensor | None:
    """Additive mask (B or 1, 1, T, S): 0 where a query may attend, the dtype's minimum elsewhere.

    attention_mask (B, S) marks real tokens (1) and padding (0) over all S = past + T keys. A sliding
    `window` keeps the keys less than `window` positions away from the query (causal: the `window` most
    recent, the query's own included; not causal: that far on either side). A finite minimum rather
    than -inf keeps fully padded query rows from producing NaN.
    """
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None
    keys = attention_mask.shape[1] if attention_mask is not None else past + query_length  # cross: S != T
    if window is not None and keys <= window:
        window = None  # no key is out of reach
    if attention_mask is None and window is None and (not causal or query_length == 1):
        return None
    allowed = torch.ones(1, 1, query_length, keys, dtype=torch.bool, device=device)
    query_positions = torch.arange(past, past + query_length, device=device)[:, None]
    key_positions = torch.arange(keys, device=device)[None, :]
    if causal:
        allowed = allowed & (key_positions <= query_positions)
    if window is not None:
        allowed = allowed & ((query_positions - key_positions).abs() < window)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :].bool()
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)


class Stack(nn.Module):
    """Embeddings (positions, segments, norm) then blocks, then an optional final norm."""

    def __init__(self, config: ModelConfig, causal: bool, cross: bool, num_layers: int):
        super().__init__()
        self.causal = causal
        segments = config.type_vocab_size > 0 and not causal
        self.embeddings = Embeddings(config, segments=segments)
        self.sliding = config.sliding_layers(num_layers)  # per block: attends through the sliding window
        self.window = config.sliding_window
        rotary = config.position == "rotary"
        self.rotary = Rotary(config) if rotary else None
        # sliding-window layers may turn at a base of their own (Gemma 3)
        self.local_rotary = Rotary(config, local=True) if rotary and config.local_rope_theta is not None else None
        # blocks may share weights (ALBERT): layer i runs group int(i / (layers / groups)), as transformers counts
        groups = [Block(config, cross=cross, attention_norm=config.first_block_attention_norm or g > 0)
                  for g in range(config.num_hidden_groups or num_layers)]
        self.blocks = nn.ModuleList(groups[int(i / (num_layers / len(groups)))] for i in range(num_layers))
        self.block_names = [block_site(i) for i in range(num_layers)]  # the blocks' sites are named under these
        self.final_norm = norm(config) if config.final_norm else None
        # a relative position bias every block adds to its self-attention scores (T5, MPNet)
        buckets = config.relative_attention_num_buckets
        self.position_bias = RelativePositionBias(config, bidirectional=not causal) if buckets else None
        # DeBERTa's relative position embeddings, which every block's attention projects with its own weights
        self.relative_embeddings = RelativeEmbeddings(config) if config.relative_attention else None
        # token embeddings narrower than the model: projected in, and the output back (OPT-350m)
        width = config.word_embed_proj_dim
        self.project_in = Linear(width, config.hidden_size, bias=False) if width else None
        self.project_out = Linear(config.hidden_size, width, bias=False) if width else None

    def forward(self, token_embeddings: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: KVCache | None = None, sites: Sites = NO_SITES) -> Tensor:
        """token_embeddings (B, T, width); attention_mask (B, past + T); memory (B, S, hidden) -> the stack's output
        (B, T, hidden), after its final norm. Sites: `embed`, the embeddings', each block's under `blocks.{i}`,
        `final_norm.*`."""
        batch, length = token_embeddings.shape[:2]
        device, dtype = token_embeddings.device, token_embeddings.dtype
        past = cache.length if cache is not None else 0
        if attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
        else:
            position_ids = torch.arange(past, past + length, device=device).expand(batch, length)
        token_embeddings = sites("embed", token_embeddings)
        if self.project_in is not None:
            token_embeddings = self.project_in(token_embeddings)
        x = self.embeddings(token_embeddings, position_ids, token_type_ids, sites)
        inputs = self.block_inputs(position_ids, attention_mask, dtype, past, memory, memory_mask)
        return self.run_blocks(x, inputs, cache=cache, sites=sites)

    def block_inputs(self, position_ids: Tensor, attention_mask: Tensor | None, dtype: torch.dtype, past: int = 0,
                     memory: Tensor | None = None, memory_mask: Tensor | None = None) -> BlockInputs:
        """What every block reads besides the residual stream, for queries at `position_ids` (B, T) after `past`
        cached positions; attention_mask (B, past + T) marks real tokens; memory (B, S, hidden) is what
        cross-attention reads, memory_mask (B, S) its real tokens."""
        length, device = position_ids.shape[1], position_ids.device
        rotary = self.rotary(position_ids, dtype) if self.rotary is not None else None
        local_rotary = self.local_rotary(position_ids, dtype) if self.local_rotary is not None else rotary
        mask = attention_mask_bias(attention_mask, length, self.causal, dtype, device, past)
        window_mask = attention_mask_bias(attention_mask, length, self.causal, dtype, device, past, self.window) \
            if any(self.sliding) else None
        cross_mask = attention_mask_bias(memory_mask, length, False, dtype, device) if memory is not None else None
        relative = self.relative_embeddings(length) if self.relative_embeddings is not None else None
        if self.position_bias is not None:  # (1, H, T, S), added to the additive masks
            bias = self.position_bias(length, past + length, past).to(dtype)
            mask = bias if mask is None else mask + bias
            window_mask = None if window_mask is None else window_mask + bias
        return BlockInputs(mask, window_mask, rotary, local_rotary, relative, memory, cross_mask)

    def run_blocks(self, x: Tensor | None, inputs: BlockInputs, first: int = 0, cache: KVCache | None = None,
                   sites: Sites = NO_SITES, joining: Callable[[int], Tensor | None] | None = None) -> Tensor:
        """The residual stream x (B, T, hidden) through blocks `first`.. and the final norm (and output projection):
        the one forward engine, for a whole pass and for one that starts inside the stack (the patch sweep). With
        `joining`, joining(i) gives rows (B', T, hidden) that join the batch as they enter block i (None: none), so
        that x may start as None. A memory of batch 1 is shared by every row."""
        memory = inputs.memory
        shared = memory is not None and memory.shape[0] == 1  # one memory read by every row
        for i in range(first, len(self.blocks)):
            if joining is not None:
                new = joining(i)
                if new is not None:
                    x = new if x is None else torch.cat([x, new])
            if shared:
                memory = inputs.memory.expand(x.shape[0], -1, -1)
            sliding = self.sliding[i]
            x = self.blocks[i](x, inputs.window_mask if sliding else inputs.mask,
                               rotary=inputs.local_rotary if sliding else inputs.rotary, memory=memory,
                               memory_mask=inputs.cross_mask, cache=cache, layer=i,
                               sites=sites.scope(self.block_names[i]), relative=inputs.relative)
        if self.final_norm is not None:
            x = normed(self.final_norm, x, sites, "final_norm")
        if self.project_out is not None:
            x = self.project_out(x)
        return x

    @property
    def embedding_sites(self) -> list[str]:
        """The sites whose sum is the residual stream entering block 0, each a direct writer to it: the embeddings
        (token, position, segment) as they are added, or, where a norm follows their sum, its output alone."""
        if self.embeddings.norm is not None or self.embeddings.project is not None or self.project_in is not None:
            return [block_site(0, "resid_pre")]
        added = {"learned": ["pos_embed"], "sinusoidal": ["pos_embed"], "sinusoidal_halves": ["pos_embed"]}
        return ["embed", *added.get(self.embeddings.kind, []), *(["type_embed"] if self.embeddings.segments else [])]


class LMHead(nn.Module):
    """Unembedding to the vocabulary (tied to the token embeddings when configured). MLM heads first
    transform the hidden state (dense, activation, norm), as BERT's does. With scale_decoder_outputs the
    hidden state is first scaled by hidden_size ** -0.5 (T5's tied head). With final_logit_softcapping
    the logits are cap * tanh(logits / cap) (Gemma 2)."""

    def __init__(self, config: ModelConfig, token_embeddings: nn.Embedding):
        super().__init__()
        self.transform = config.head == "mlm"
        width = config.embedding_size or config.hidden_size  # the token embeddings', which an MLM head maps to
        if self.transform:
            self.dense = Linear(config.hidden_size, width, bias=config.classifier_bias)
            self.act = activation(config.head_act or config.hidden_act)
            self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.unembed = Linear(config.word_embed_proj_dim or width, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.unembed.weight, self.unembed.tied = token_embeddings.weight, True  # packs a copy: linear.py
        self.unembed.packs_after = 3  # a pass and its logit lens stay plain (linear.py)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.lm_head_bias else None
        self.softcap = config.final_logit_softcapping
        self.input_scale = config.hidden_size ** -0.5 if config.scale_decoder_outputs else None

    def readout(self, target: int, foil: int | None) -> tuple[Tensor, float | None]:
        """The logit of `target` (minus that of `foil`) before a soft cap, as a linear function of the head's input x
        (hidden,): x . direction + bias, with direction (hidden,) in float64 and bias None where the head has none. An
        MLM head transforms x first: it has no such form (a ValueError)."""
        if self.transform:
            raise ValueError("an MLM head's logits are not linear in its input")
        weight = self.unembed.weight.detach()  # the two rows made float64, not the whole vocabulary's (exact both ways)
        direction = weight[target].double() - (weight[foil].double() if foil is not None else 0)
        if self.input_scale is not None:  # T5's tied head reads the hidden state scaled
            direction = direction * self.input_scale
        bias = None
        if self.bias is not None:
            bias = float(self.bias[target].double() - (self.bias[foil].double() if foil is not None else 0))
        return direction, bias

    def forward(self, x: Tensor, tokens: Tensor | None = None) -> Tensor:
        """(B, T, hidden) -> (B, T, V); given `tokens` (K,), only their logits: (B, T, K) (a patch sweep reads two
        of the vocabulary's)."""
        if self.input_scale is not None:
            x = x * self.input_scale
        if self.transform:
            x = self.norm(self.act(self.dense(x)))
        logits = self.unembed(x) if tokens is None else x @ self.unembed.weight[tokens].T
        if self.bias is not None:
            logits = logits + (self.bias if tokens is None else self.bias[tokens])
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class ClassificationHead(nn.Module):
    """The first token's hidden state (or the mean of the real tokens': classifier_pooling mean) -> [dense +
    tanh/relu/gelu, as BERT's pooler, + a norm with classifier_norm] -> dropout -> linear."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mean = config.classifier_pooling == "mean"
        pooled = config.classifier_pooler != "none"
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias) if pooled else None
        self.act = activation(config.classifier_pooler) if pooled else None
        self.norm = norm(config) if pooled and config.classifier_norm else None
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.out = Linear(config.hidden_size, config.num_labels)

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T, hidden), mask (B, T) -> (B, num_labels)."""
        if not self.mean:
            x = x[:, 0]
        elif attention_mask is None:
            x = x.mean(1)
        else:
            weights = attention_mask[..., None].to(x.dtype)
            x = (x * weights).sum(1) / weights.sum(1)
        if self.dense is not None:
            x = self.act(self.dense(x))
        if self.norm is not None:
            x = self.norm(x)
        return self.out(self.dropout(x))


class DiscriminatorHead(nn.Module):
    """A score per token (ELECTRA's replaced-token detector): dense -> activation -> linear to one value."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.out = Linear(config.hidden_size, 1)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, hidden) -> (B, T)."""
        return self.out(self.act(self.dense(x))).squeeze(-1)


class TransformerModel(nn.Module):
    """An encoder, a decoder or an encoder-decoder, with an optional head (config.head).

    Encoder-only models have `encoder`; decoder-only models have `decoder` (causal); encoder-decoders
    have both, the decoder attending to the encoder's output through cross-attention. tfcli builds it on
    the meta device (nothing allocated) and then gives it its weights: `init_weights` or
    `assign_parameters(model, tfcli.checkpoints.load_checkpoint(...))` (see api.build_model).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        arch = config.architecture
        width = config.embedding_size or config.word_embed_proj_dim or config.hidden_size
        self.embed_tokens = embedding(config.vocab_size, width)  # the encoder's, or the only one
        own = arch == "encoder-decoder" and not config.share_encoder_decoder_embeddings
        self.decoder_embed_tokens = embedding(config.vocab_size, width) if own else None
        self.encoder = Stack(config, False, False, config.num_hidden_layers) if arch != "decoder" else None
        if arch == "encoder":
            self.decoder = None
        else:
            layers = config.decoder_layers if arch == "encoder-decoder" else config.num_hidden_layers
            self.decoder = Stack(config, causal=True, cross=arch == "encoder-decoder", num_layers=layers)
        self.head: nn.Module | None = None
        if config.head in ("mlm", "lm"):
            self.head = LMHead(config, self.token_embedding(self.output_stack))
        elif config.head == "classifier":
            self.head = ClassificationHead(config)
        elif config.head == "discriminator":
            self.head = DiscriminatorHead(config)
        self.embedding_scale = config.hidden_size ** 0.5 if config.scale_embedding else 1.0

    @property
    def output_stack(self) -> Stack:
        """The stack whose output feeds the head: the decoder when there is one."""
        return self.decoder if self.decoder is not None else self.encoder

    def stacks(self) -> list[tuple[str, Stack]]:
        """The stacks with the prefix of their site names: [("", stack)], or the encoder's and the decoder's."""
        if self.encoder is not None and self.decoder is not None:
            return [("encoder.", self.encoder), ("decoder.", self.decoder)]
        return [("", self.output_stack)]

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (and where its inputs go)."""
        return self.embed_tokens.weight.device

    @property
    def has_final_norm(self) -> bool:
        """Whether the output stack normalises its last residual stream before the head (the site `final_norm.*`)."""
        return self.output_stack.final_norm is not None

    @property
    def final_softcap(self) -> float | None:
        """An LM head's final logit soft cap (Gemma 2's final_logit_softcapping: cap * tanh(logits / cap)), or
        None."""
        return self.lm_head.softcap if self.lm_head is not None else None

    @property
    def lm_head(self) -> LMHead | None:
        """The head when it is an LM (or masked-LM) head, over the vocabulary; else None."""
        return self.head if isinstance(self.head, LMHead) else None

    @property
    def reads_segments(self) -> bool:
        """Whether the (first) stack adds segment embeddings: token_type_ids matter."""
        return self.encoder is not None and self.encoder.embeddings.segments is not None

    def readout(self, target: int, foil: int | None) -> Readout:
        """The logit of `target` (minus `foil`'s) as a linear function of the output stack's last residual stream
        at one position, the final norm's divisor frozen (see Readout). Needs an LM head without the MLM transform and
        no output projection (a ValueError otherwise)."""
        stack = self.output_stack
        if not isinstance(self.head, LMHead) or stack.project_out is not None:
            raise ValueError("the logits are not a linear function of the residual stream")
        head_direction, bias = self.head.readout(target, foil)
        direction, norm_bias = head_direction, None
        if stack.final_norm is not None:
            direction, norm_bias = folded(stack.final_norm, head_direction)
        constants = {name: value for name, value in (("final_norm_bias", norm_bias), ("unembed_bias", bias))
                     if value is not None}
        return Readout(direction, head_direction, stack.final_norm is not None, constants)

    def token_embedding(self, stack: Stack) -> nn.Embedding:
        """The token embedding that feeds `stack`: the decoder's own when it has one, else the shared one."""
        if stack is self.decoder and self.decoder_embed_tokens is not None:
            return self.decoder_embed_tokens
        return self.embed_tokens

    @property
    def long_rope_switch(self) -> int | None:
        """LongRoPE's original_max_position_embeddings: past that length every position turns by its long
        factors, so keys cached before must be computed again (as transformers' Phi-3 does); else None."""
        rotary = self.output_stack.rotary
        return rotary.long_after if rotary is not None else None

    def embed(self, input_ids: Tensor, stack: Stack) -> Tensor:
        """(B, T) token ids -> (B, T, hidden) token embeddings for `stack` (scaled when the config says so)."""
        x = self.token_embedding(stack)(input_ids)
        return x * self.embedding_scale if self.embedding_scale != 1.0 else x

    def start_tokens(self, batch: int, device: torch.device) -> Tensor:
        """The decoder input of an encoder-decoder when none is given: one start token per row (B, 1)."""
        return torch.full((batch, 1), start_token_id(self.config), dtype=torch.long, device=device)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                decoder_input_ids: Tensor | None = None, decoder_attention_mask: Tensor | None = None,
                cache: KVCache | None = None, encoder_output: ModelOutput | None = None,
                logits_to_keep: int | None = None, sites: Sites = NO_SITES) -> ModelOutput:
        """input_ids (B, T). Decoder-only with a cache: input_ids are the new tokens and attention_mask
        covers cached + new positions. Encoder-decoder: decoder_input_ids default to the start token.
        logits_to_keep: an LM head's logits for only the last N positions; 0 for none (unlike transformers,
        where 0 keeps all): a caller that unembeds the hidden states itself, as decoding with the lens does.
        `sites`: what the pass does at its named sites (see run_with_cache and run_with_hooks, the public way)."""
        if self.decoder is None:
            out = ModelOutput(self.encoder(self.embed(input_ids, self.encoder), attention_mask, token_type_ids,
                                           sites=sites))
        elif self.encoder is None:
            out = ModelOutput(self.decoder(self.embed(input_ids, self.decoder), attention_mask, cache=cache,
                                           sites=sites))
        else:
            if encoder_output is None:
                encoder_output = ModelOutput(self.encoder(self.embed(input_ids, self.encoder), attention_mask,
                                                          token_type_ids, sites=sites.scope("encoder")))
            if decoder_input_ids is None:
                decoder_input_ids = self.start_tokens(input_ids.shape[0], input_ids.device)
            out = ModelOutput(self.decoder(self.embed(decoder_input_ids, self.decoder), decoder_attention_mask,
                                           memory=encoder_output.last_hidden_state, memory_mask=attention_mask,
                                           cache=cache, sites=sites.scope("decoder")), encoder=encoder_output)
        if cache is not None:
            cache.length += out.last_hidden_state.shape[1]
            out.cache = cache
        if self.head is not None and logits_to_keep != 0:
            hidden = out.last_hidden_state
            if logits_to_keep is not None and isinstance(self.head, LMHead):
                hidden = hidden[:, -logits_to_keep:]
            out.logits = sites("logits", self.head_logits(hidden, attention_mask))
        return out

    def head_logits(self, hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The head's output for the output stack's output (B, T, hidden): (B, T, V), (B, num_labels) (a classifier,
        which pools the real tokens of `attention_mask`) or (B, T) (a discriminator). An LM head also reads one
        position's (B, hidden) -> (B, V)."""
        if isinstance(self.head, ClassificationHead):
            return self.head(hidden, attention_mask)
        return self.head(hidden)

    def run_with_cache(self, input_ids: Tensor, names: Iterable[str] | Callable[[str], bool] | None = None,
                       hooks: dict[str, Hook] | None = None, grad: bool = False,
                       **inputs) -> tuple[Tensor | None, dict[str, Tensor]]:
        """One forward pass that keeps the values of its sites: every site (`names` None), those named (a list;
        `*` matches any run of characters, as in `blocks.*.attn.pattern`) or those a predicate accepts. `hooks` as
        in run_with_hooks. With `grad` the pass runs with autograd and the kept values keep their gradient: after
        `metric(logits).backward()`, `cache[name].grad` is d metric / d site. `inputs`: what the model takes besides
        input_ids (attention_mask, token_type_ids, decoder_input_ids, ...). Returns the logits (None without a head)
        and the cache {name: tensor}, in the order the pass reached the sites. A name or hook that matches no site of
        the model is a usage error (TfcliError) naming the closest ones."""
        listed = [names] if isinstance(names, str) else None if names is None or callable(names) else list(names)
        sites = Sites(name_filter(listed if listed is not None else names), hooks, grad)
        sites.exact = frozenset(name for name in listed or () if "*" not in name)  # SPLIT_SITES are asked by name
        with torch.set_grad_enabled(grad):
            out = self(input_ids, sites=sites, **inputs)
        check_names([*(listed or []), *sites.hooks], sites.reached)
        return out.logits, sites.cache

    def run_with_hooks(self, input_ids: Tensor, hooks: dict[str, Hook], **inputs) -> Tensor | None:
        """One forward pass with `hooks` {site name: fn}: fn(value) may return a replacement of the same shape (None
        leaves the value as it is); `tfcli.model.sites` has hooks that patch, zero, mean-ablate or add to a site, per
        position and head. Runs under the caller's autograd mode. `inputs` as in run_with_cache. Returns the logits
        (None without a head). A hook on a name the model does not have is a usage error naming the closest sites."""
        sites = Sites(hooks=hooks)
        out = self(input_ids, sites=sites, **inputs)
        check_names(sites.hooks, sites.reached)
        return out.logits

    def site_shapes(self) -> dict[str, tuple[int | str, ...]]:
        """Every site of the model with its shape, in the order a forward pass reaches them; `B` is the batch, `T`
        the tokens (the decoder's, in an encoder-decoder) and `S` the encoder's tokens (see `site_shapes`)."""
        if "_site_shapes" not in self.__dict__:
            self._site_shapes = site_shapes(self.config)
        return self._site_shapes

    @property
    def has_lens(self) -> bool:
        """Whether `unembed` can read a hidden state: through an LM head, or token embeddings as wide as it (or
        as wide as the stack projects it out to); not so for ALBERT or ELECTRA without their MLM head."""
        stack = self.output_stack
        return isinstance(self.head, LMHead) or stack.project_out is not None or \
            self.token_embedding(stack).weight.shape[1] == self.config.hidden_size

    def unembed(self, hidden: Tensor) -> Tensor:
        """Logit lens: what hidden states (..., hidden) of the output stack would predict, (..., V):
        through the final norm and the LM head where the model has them, else the token embeddings
        (see has_lens)."""
        stack = self.output_stack
        if stack.final_norm is not None:
            hidden = stack.final_norm(hidden)
        if stack.project_out is not None:
            hidden = stack.project_out(hidden)
        if isinstance(self.head, LMHead):
            return self.head(hidden)
        return hidden @ self.token_embedding(stack).weight.T

    def generate(self, input_ids: Tensor, max_new_tokens: int = 20, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 use_cache: bool = True, attention_mask: Tensor | None = None,
                 hooks: dict[str, Hook] | None = None) -> Tensor:
        """Prompt + new ids (B, T + new) like transformers' generate (encoder-decoders: the decoder's ids,
        start token first); greedy unless do_sample; `hooks` by site name run on every pass (steering:
        tfcli.analysis.vectors.steering_hooks). See tfcli/model/decoding.py."""
        return generate(self, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p, seed, use_cache,
                        attention_mask, hooks)


SYMBOLS = {10_007: "B", 10_009: "T", 10_037: "S"}  # sizes no model has (primes): each stands for its letter
_SHAPES: dict[str, dict[str, tuple[int | str, ...]]] = {}  # site_shapes by repr(config), a few configs at most


def site_shapes(config: ModelConfig) -> dict[str, tuple[int | str, ...]]:
    """Every site of a model of `config` with its shape, found by a forward pass on the meta device (shapes only:
    nothing is computed or allocated, whatever the model's size); sizes of batch and tokens are given as letters.
    Remembered per config: a check before the model is built and the model's `site_shapes()` make one pass."""
    key = repr(config)
    if key not in _SHAPES:
        if len(_SHAPES) >= 8:
            _SHAPES.clear()
        _SHAPES[key] = _site_shapes(config)
    return dict(_SHAPES[key])


def _site_shapes(config: ModelConfig) -> dict[str, tuple[int | str, ...]]:
    batch, tokens, source = (size for size in SYMBOLS)
    with torch.device("meta"):
        model = TransformerModel(config).to("meta")  # the computed buffers (positions, rotary) too
        ids = torch.zeros(batch, source if config.architecture == "encoder-decoder" else tokens, dtype=torch.long)
        decoder = {"decoder_input_ids": torch.zeros(batch, tokens, dtype=torch.long)} \
            if config.architecture == "encoder-decoder" else {}
        sites = Sites(keep=lambda name: True)
        with torch.no_grad():
            model(ids, sites=sites, **decoder)
    return {name: tuple(SYMBOLS.get(size, size) for size in value.shape) for name, value in sites.cache.items()}


def init_weights(model: nn.Module, seed: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
    """Random weights as Hugging Face initialises them (normal(0, 0.02) for linear and embedding weights,
    zero biases, unit norms: a weight of 1, or of 0 for a (1 + weight) norm), drawn from a generator seeded
    with `seed` so the same seed gives the same model everywhere. Each parameter is made once, directly in
    `dtype` on `device` (the model may be on the meta device): drawn in float32 on the CPU in module order,
    then cast and moved. A tied weight is drawn
    for each module that holds it and keeps the last draw, as it always has (one copy of it at a time)."""
    generator = torch.Generator().manual_seed(seed)
    values: dict[int, Tensor] = {}  # by id of the parameter it replaces
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if name == "weight" and isinstance(module, (nn.Linear, nn.Embedding)):
                values.pop(id(param), None)  # a tied weight's earlier draw, freed before the next
                value = torch.randn(param.shape, generator=generator).mul_(0.02)
            elif name == "weight" and isinstance(module, RMSNormPlusOne):
                value = torch.zeros(param.shape)  # it scales by 1 + weight
            elif name == "weight" and isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                value = torch.ones(param.shape)
            elif name == "bias":
                value = torch.zeros(param.shape)
            else:
                raise TypeError(f"init_weights does not know how to initialise {type(module).__name__}.{name}")
            values[id(param)] = value.to(device=device, dtype=dtype)
    assign_parameters(model, {name: values[id(param)] for name, param in model.named_parameters()})


def assign_parameters(model: nn.Module, tensors: dict[str, Tensor]) -> None:
    """Make `tensors` (keyed by model.named_parameters() names) the model's parameters, replacing those it
    was built with (e.g. on the meta device) without copying; a tied parameter stays one shared parameter."""
    replaced: dict[int, nn.Parameter] = {}
    for name, param in list(model.named_parameters(remove_duplicate=False)):
        if id(param) not in replaced:
            replaced[id(param)] = nn.Parameter(tensors[name], requires_grad=param.requires_grad)
        module_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(module_name), leaf, replaced[id(param)])
