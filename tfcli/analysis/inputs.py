"""What a model reads of the texts an analysis runs on: a decoder's text read as a prompt, refused where it is longer
than a table of learned positions reads (`check_length`), a batch of id lists padded into ids and a mask, a text read
at one position with its metric (`Prompt`: `attribute`, `saliency`), and prompts to generate from
(`GenerationPrompt`: `generate`, `steer sweep`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.errors import usage_error

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from tfcli.analysis.metric import Token
    from tfcli.config import ModelConfig
    from tfcli.tokenizer import Encoding, Tokenizer


def model_input(config: ModelConfig, encoding: Encoding) -> list[int]:
    """What the model reads: a decoder reads the text as `generate` reads a prompt, without an end-of-sequence
    token the tokenizer appends (BERT's [SEP]), so that its last position predicts what comes next."""
    ids = list(encoding.ids)
    if config.architecture == "decoder" and len(ids) > 1 and ids[-1] in config.eos_token_ids:
        ids = ids[:-1]
    return ids


def check_length(config: ModelConfig, length: int, what: str = "the text has") -> None:
    """Refuse `length` tokens where the model reads its positions from a learned table shorter than that (rotary,
    sinusoidal and relative positions read any length). `what`: what is that long, as the message names it ("the
    text has", "a text has", "the clean text has", "the text and its continuation have")."""
    limit = config.max_position_embeddings
    if limit and length > limit and config.position == "learned":
        raise usage_error(f"{what} {length} tokens: the model has {limit} positions")


def padded(rows: list[list[int]], tokenizer: Tokenizer, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Id lists of any lengths -> ids (B, T) right-padded with the tokenizer's pad id (0 without one) and the mask
    of real tokens (B, T), on `device`."""
    import torch

    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=device)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=device)
    return ids, mask


@dataclass
class Prompt:
    """One text read and checked, to be read at one position: its ids as the model reads them, the metric's target
    (None: the model's top prediction), foil and position (None: a label or a pooled output), and where it comes
    from. `attribute` and `saliency` read it; the fields after `encoding` are saliency's."""

    text: str
    ids: list[int]
    target: Token | None
    foil: Token | None
    position: int | None
    line: int | None = None  # a dataset's line (saliency: a text of the arguments as line 1, 2, ...)
    encoding: Encoding | None = None  # a text of the command line (for what the model read of a long one)
    special: list[bool] = field(default_factory=list)  # which ids are special tokens
    spans: list[list[int] | None] = field(default_factory=list)  # each id's characters in the text (None: special)
    baseline: list[int] | None = None  # the baseline's ids (None: zero embeddings)
    continuation: int | None = None  # where the continuation's tokens start in `ids` (None: none)
    baseline_spec: str = "pad"  # the baseline as given: pad, zero, mask or a text


@dataclass
class GenerationPrompt:
    """One prompt to generate from, tokenized for the model, and how many new tokens fit after it."""

    text: str
    ids: list[int]  # what the model reads: the decoder's prompt, or the encoder's input
    budget: int  # new tokens that fit in the position table (at most the number asked for)
    asked: int = 0  # new tokens asked for (more than the budget: the position table ends first)


def prompts(config: ModelConfig, tokenizer: Tokenizer, texts: list[str],
            max_new_tokens: int) -> list[GenerationPrompt]:
    """Tokenize prompts for a model that can generate (else a clear error naming its head). A decoder
    continues the prompt, so an end-of-sequence token that the tokenizer appends (BERT's [SEP] ends every
    text) is dropped; an encoder reads the text as encoded. A prompt longer than the position table is
    refused; a budget shorter than `max_new_tokens` means the table ends first."""
    from tfcli.model.decoding import check_can_generate

    check_can_generate(config, max_new_tokens=max_new_tokens)
    out = []
    for text in texts:
        if not text.strip():
            raise usage_error("the prompt is empty", "give some text to continue")
        ids = model_input(config, tokenizer.encode([text])[0])
        check_can_generate(config, len(ids), max_new_tokens)
        used = len(ids) if config.architecture == "decoder" else 1  # an encoder-decoder's decoder starts from one token
        out.append(GenerationPrompt(text, ids, max(1, min(max_new_tokens, config.max_position_embeddings - used)),
                                    max_new_tokens))
    return out
