"""Decoding: greedy or sampled decoding with a KV cache, one token's work per step, watchable step by step.

`decode` is the loop (batched; yields the tensors of each step), `generate` collects it into ids as
transformers' `generate` returns them, and `stream` turns it into `Step` records for one prompt, each with
the chosen token's probability, the most probable alternatives and, optionally, the logit lens (what every
layer's hidden state at that step would have predicted, through `model.unembed`). With the lens, one product
with the unembedding per step serves every hidden state at once, the last one's row being the step's logits.

Shapes: B batch, T prompt length, V vocabulary, L layers (L + 1 hidden states, embeddings first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from torch import nn

from tfcli.errors import TfcliError, usage_error
from tfcli.model.attention import KVCache
from tfcli.model.sites import NO_SITES, Hook, Sites, hidden_site

if TYPE_CHECKING:
    from tfcli.config import ModelConfig

# `model` below is a tfcli TransformerModel (model/transformer.py, which imports this module for its `generate`):
# typed as the nn.Module it is, so that this module does not import that one back.


@dataclass
class Sampling:
    """How the next token is chosen: argmax (greedy), or drawn after temperature, top-k and top-p (in that
    order, as transformers applies them) from a seeded generator."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def check(self, vocab_size: int | None = None) -> None:
        """A usage error for a setting out of range (top_k larger than `vocab_size`, when given)."""
        if not self.temperature > 0:
            raise usage_error(f"temperature must be > 0, got {self.temperature}",
                              "use a value such as 0.7 or 1.0; for deterministic output use do_sample=False",
                              parameter="temperature")
        if self.top_k is not None and self.top_k < 1:
            raise usage_error(f"top_k must be >= 1, got {self.top_k}", "use None to keep every token", parameter="top_k")
        if self.top_k is not None and vocab_size is not None and self.top_k > vocab_size:
            raise usage_error(f"top_k {self.top_k} is larger than the vocabulary ({vocab_size})",
                              f"at most {vocab_size}, which keeps every token", parameter="top_k")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise usage_error(f"top_p must be in (0, 1], got {self.top_p}", "for example 0.9; 1 keeps every token",
                              parameter="top_p")


@dataclass
class StepTensors:
    """One decoding step for the whole batch."""

    tokens: Tensor  # (B,) the chosen ids (padding for rows that had already finished)
    logits: Tensor  # (B, V) float32 scores the tokens were chosen from, before temperature and filtering
    lens: Tensor | None  # (L + 1, B, V) float32, with lens: what each hidden state predicts; the last row is logits
    finished: Tensor  # (B,) bool: the row has produced its end-of-sequence token (at this step or before)


@dataclass
class Step:
    """One generated token of one prompt, for display."""

    index: int  # 0 for the first new token
    token_id: int
    prob: float  # the model's probability for it (softmax of the logits, temperature 1)
    top: list[tuple[int, float]]  # the most probable tokens and their probabilities, best first
    lens: list[tuple[int, float]] | None  # per hidden state (0 = embeddings): top token, its probability
    eos: bool  # this token ends the sequence


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> Tensor:
    """(B, V) scores -> (B,) token ids."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    scores = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        ordered, order = scores.sort(dim=-1)  # ascending
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - sampling.top_p
        drop[:, -1] = False  # always keep the most probable token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def check_can_generate(config: ModelConfig, prompt_length: int | None = None, max_new_tokens: int = 1) -> None:
    """A clear error for a model without an LM head, an empty or too long prompt, or max_new_tokens < 1.
    Needs only the config, so it runs before any model is built."""
    if config.head != "lm" or config.architecture == "encoder":
        raise usage_error(f"{config.name} cannot generate: its head is `{config.head}` "
                          f"({config.architecture}), generation needs an `lm` head on a decoder",
                          "use a decoder or encoder-decoder with `head: lm`, e.g. --model gpt2-small")
    if max_new_tokens < 1:
        raise usage_error(f"max_new_tokens must be >= 1, got {max_new_tokens}", parameter="max_new_tokens")
    if prompt_length == 0:
        raise usage_error("the prompt is empty", "give some text to continue")
    positions = config.max_position_embeddings  # the generating stack's position table / trained context
    if prompt_length is not None and prompt_length > positions:
        raise usage_error(f"the prompt has {prompt_length} tokens, more than the model's {positions} positions",
                          "shorten the prompt")
    if prompt_length == positions and config.architecture == "decoder":  # a decoder continues it in that table
        raise usage_error(f"the prompt has {prompt_length} tokens, which fill the model's {positions} positions: "
                          "no room for a new token", "shorten the prompt")


def force(tokens: Tensor, config: ModelConfig, length: int, last: bool) -> Tensor:
    """The tokens a checkpoint's config forces, as transformers' generate does by default: forced_bos_token_id
    first (when the sequence so far, decoder start or prompt, is one token long), forced_eos_token_id as the
    last token max_new_tokens allows. (B,) ids in and out."""
    if config.forced_bos_token_id is not None and length == 1:
        return torch.full_like(tokens, config.forced_bos_token_id)
    if config.forced_eos_token_id is not None and last:
        return torch.full_like(tokens, config.forced_eos_token_id)
    return tokens


@torch.inference_mode()
def decode(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
           max_new_tokens: int = 20, sampling: Sampling | None = None, use_cache: bool = True,
           lens: bool | Callable[[Tensor], Tensor] = False, hooks: dict[str, Hook] | None = None
           ) -> Iterator[StepTensors]:
    """Yield one StepTensors per new token until max_new_tokens or every row has hit end of sequence. `hooks` (by
    site name) run on every pass, the prompt's and each step's (steering).

    input_ids (B, T): the prompt (decoder-only, left-padded for batches) or the encoder input
    (encoder-decoder: the decoder starts from the start token). With use_cache, the prompt runs once and
    each later step feeds only the newest token; without it, every step re-runs the whole sequence.
    """
    sampling = sampling or Sampling()
    sampling.check(model.config.vocab_size)
    config = model.config
    batch, length = input_ids.shape
    seq2seq = model.encoder is not None
    check_can_generate(config, length, max_new_tokens)
    positions = config.max_position_embeddings
    room = positions - (1 if seq2seq else length)
    if max_new_tokens > room:
        raise usage_error(f"{max_new_tokens} new tokens do not fit: the model has {positions} positions "
                          f"and the {'decoder start token' if seq2seq else 'prompt'} takes "
                          f"{positions - room}", f"ask for at most {room} new tokens")
    if int(input_ids.max()) >= config.vocab_size or int(input_ids.min()) < 0:
        raise TfcliError(f"token id {int(input_ids.max())} is outside the model's vocabulary ({config.vocab_size})",
                         "the tokenizer and the model do not belong together")
    device = input_ids.device
    generator = None
    if sampling.do_sample and sampling.seed is not None:
        generator = torch.Generator(device=device).manual_seed(sampling.seed)
    eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=device)  # any of them ends a row
    pad = config.pad_token_id
    pad = pad if pad is not None else (config.eos_token_ids[0] if len(eos) else 0)
    prefix = "decoder." if seq2seq else ""
    hidden_names = [prefix + hidden_site(i) for i in range(len(model.output_stack.blocks) + 1)]  # the lens reads these
    keep = set(hidden_names)
    mask = attention_mask if attention_mask is not None and not bool(attention_mask.all()) else None
    finished = torch.zeros(batch, dtype=torch.bool, device=device)

    if seq2seq:
        sequence = model.start_tokens(batch, device)  # the decoder's ids, (B, 1 + new so far)
        cache = KVCache(1 + max_new_tokens) if use_cache else None
        encoder_output = None
    else:
        sequence = input_ids
        cache = KVCache(length + max_new_tokens) if use_cache else None
    step_input = sequence
    logits_kept = 0 if lens else 1  # with the lens, its product with the unembedding makes the logits
    unembed = model.lm_head.unembed if lens and model.lm_head is not None else None
    if unembed is not None:  # a tied head packs its copy for the lens's products too (model/linear.py), while this runs
        kept = unembed.copy_rows, unembed._copy
        unembed.copy_rows = len(hidden_names) * batch
    try:
        for step in range(max_new_tokens):
            sites = Sites(keep if lens else None, hooks) if lens or hooks else NO_SITES
            if seq2seq:
                out = model(input_ids, attention_mask=mask, decoder_input_ids=step_input, cache=cache,
                            encoder_output=encoder_output, logits_to_keep=logits_kept, sites=sites)
                encoder_output = out.encoder
            else:
                out = model(step_input, attention_mask=mask, cache=cache, logits_to_keep=logits_kept, sites=sites)
            if lens:  # the last position's hidden states (L + 1, B, hidden), all before the final norm -> (L + 1, B, V)
                unembed_all = lens if callable(lens) else model.unembed  # a function: a tuned lens's, then unembed
                lens_logits = unembed_all(torch.stack([sites.cache[name][:, -1] for name in hidden_names])).float()
                logits = lens_logits[-1]  # (B, V)
            else:
                lens_logits, logits = None, out.logits[:, -1].float()
            tokens = force(choose(logits, sampling, generator), config, sequence.shape[1], step == max_new_tokens - 1)
            if len(eos):
                tokens = tokens.masked_fill(finished, pad)
                finished = finished | torch.isin(tokens, eos)
            yield StepTensors(tokens, logits, lens_logits, finished.clone())
            sequence = torch.cat([sequence, tokens[:, None]], dim=1)
            if bool(finished.all()):
                return
            if mask is not None and not seq2seq:
                mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
            step_input = tokens[:, None] if use_cache else sequence
            switch = model.long_rope_switch
            if cache is not None and switch is not None and cache.length <= switch < sequence.shape[1]:
                cache = KVCache(length + max_new_tokens)  # LongRoPE turned to its long factors: recompute every key
                step_input = sequence
    finally:
        if unembed is not None:  # the copy made for the lens goes with it
            unembed.copy_rows, unembed._copy = kept


def generate(model: nn.Module, input_ids: Tensor, max_new_tokens: int, do_sample: bool, temperature: float,
             top_k: int | None, top_p: float | None, seed: int | None, use_cache: bool,
             attention_mask: Tensor | None, hooks: dict[str, Hook] | None = None) -> Tensor:
    """Prompt + new ids (B, T + new), as transformers' generate returns them; for an encoder-decoder, the
    decoder's ids starting with the decoder start token. Rows that finish early are padded. The defaults are
    TransformerModel.generate's, the public entry."""
    sampling = Sampling(do_sample, temperature, top_k, top_p, seed)
    seq2seq = model.encoder is not None
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    sequence = model.start_tokens(input_ids.shape[0], input_ids.device) if seq2seq else input_ids
    new = [step.tokens for step in decode(model, input_ids, attention_mask, max_new_tokens, sampling, use_cache,
                                          hooks=hooks)]
    return torch.cat([sequence, torch.stack(new, dim=1)], dim=1)  # max_new_tokens >= 1: never empty


@torch.no_grad()
def stream(model: nn.Module, input_ids: Tensor, max_new_tokens: int = 20, sampling: Sampling | None = None,
           use_cache: bool = True, lens: bool | Callable[[Tensor], Tensor] = False, top: int = 5,
           hooks: dict[str, Hook] | None = None) -> Iterator[Step]:
    """One prompt (1, T) -> a Step per new token, as soon as it is chosen (`hooks`: as decode runs them)."""
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.shape[0] != 1:
        raise ValueError("stream takes one prompt; use generate for batches")
    for index, step in enumerate(decode(model, input_ids, None, max_new_tokens, sampling, use_cache, lens, hooks)):
        probs = step.logits[0].softmax(dim=-1)
        token = int(step.tokens[0])
        best = probs.topk(min(top, probs.shape[-1]))
        layer_tops = None
        if step.lens is not None:
            values, ids = step.lens[:, 0].softmax(dim=-1).max(dim=-1)  # per hidden state
            layer_tops = [(int(i), float(v)) for i, v in zip(ids, values)]
        yield Step(index, token, float(probs[token]), [(int(i), float(p)) for p, i in zip(*best)], layer_tops,
                   eos=bool(step.finished[0]))
