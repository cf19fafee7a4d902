"""`tfcli generate` for one prompt: tokenize it for the model, stream the steps, decode the text.

The decoding loop itself is `tfcli.model.generate`; this module joins it to a tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.errors import usage_error
from tfcli.model.generate import Sampling, Step, check_can_generate, position_limit, stream

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

DEFAULT_MODEL = "gpt2-small"  # the bundled default (bert-base) is an encoder and cannot generate


@dataclass
class Generation:
    prompt: str
    prompt_ids: list[int]  # what the model reads: the decoder's prompt, or the encoder's input
    generated_ids: list[int] = field(default_factory=list)  # new tokens only (no start token)
    text: str = ""  # the new tokens decoded, special tokens left out
    full_text: str = ""  # what reads on: prompt + new tokens (decoders), the new tokens (encoder-decoders)
    steps: list[Step] = field(default_factory=list)
    stopped_at_eos: bool = False


def prompt_ids(model: TransformerModel, tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The prompt's token ids. A decoder continues the prompt, so an end-of-sequence token that the
    tokenizer appends (BERT's [SEP] ends every text) is dropped; an encoder reads the text as encoded."""
    if not prompt.strip():
        raise usage_error("the prompt is empty", "give some text to continue")
    ids = tokenizer.encode([prompt])[0].ids
    eos = model.config.eos_token_id
    if model.encoder is None and len(ids) > 1 and eos is not None and ids[-1] == eos:
        ids = ids[:-1]
    return ids


def max_new_tokens_that_fit(model: TransformerModel, prompt_length: int, wanted: int) -> int:
    """`wanted`, or fewer when the position table ends first (at least 1 once the prompt fits)."""
    check_can_generate(model, prompt_length, wanted)
    used = 1 if model.encoder is not None else prompt_length
    return max(1, min(wanted, position_limit(model) - used))


def run(model: TransformerModel, tokenizer: Tokenizer, prompt: str, ids: list[int], max_new_tokens: int,
        sampling: Sampling, lens: bool = False, on_text: Callable[[str], None] | None = None) -> Generation:
    """Generate for one prompt; on_text receives each new piece of text as soon as it is decoded."""
    import torch

    context = [] if model.encoder is not None else ids  # decoded with the new tokens, so words join right
    result = Generation(prompt, ids, full_text=tokenizer.decode(context))
    if on_text is not None and result.full_text:
        on_text(result.full_text)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    for step in stream(model, input_ids, max_new_tokens, sampling, lens=lens):
        result.steps.append(step)
        result.generated_ids.append(step.token_id)
        full = tokenizer.decode(context + result.generated_ids)
        if on_text is not None and full.startswith(result.full_text) and len(full) > len(result.full_text):
            on_text(full[len(result.full_text):])
        result.full_text = full
        result.stopped_at_eos = step.eos
    result.text = tokenizer.decode(result.generated_ids)
    return result


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as it reads: decoded where that gives clean text, else its vocabulary entry."""
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if not text or "\ufffd" in text:
        text = tokenizer.id_to_token(token_id) or f"<{token_id}>"
    return text
