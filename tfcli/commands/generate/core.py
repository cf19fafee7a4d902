"""`tfcli generate`: prompts checked and tokenized for a model, the decoding loop streamed, the text decoded.

The loop itself is `tfcli.model.decoding` (what `model.generate` runs too); this module joins it to a
tokenizer and returns one plain `Generation` report per prompt: `run` generates for a stream of prompt
batches (`prompts`), warning through a callback when a prompt leaves less room than asked; nothing here
prints. Everything about the prompts is checked against the config, before a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.inputs import GenerationPrompt, prompts

if TYPE_CHECKING:
    from tfcli.analysis.sae import SAE
    from tfcli.model import TransformerModel
    from tfcli.model.decoding import Sampling, Step
    from tfcli.model.sites import Hook
    from tfcli.tokenizer import Tokenizer

DEFAULT_MODEL = "gpt2-small"  # the bundled default (bert-base) is an encoder and cannot generate


@dataclass
class Generation:
    prompt: str
    prompt_ids: list[int]
    generated_ids: list[int] = field(default_factory=list)  # new tokens only (no start token)
    text: str = ""  # what the new tokens add to the text (decoded after the prompt), special tokens left out
    full_text: str = ""  # what reads on: prompt + new tokens (decoders), the new tokens (encoder-decoders)
    steps: list[Step] = field(default_factory=list)
    stopped_at_eos: bool = False
    lens_from: str | None = None  # --lens tuned:DIR: the tuned lens's folder (None: the logit lens, or no lens)


def run(model: TransformerModel, tokenizer: Tokenizer, batches: Iterable[list[GenerationPrompt]],
        sampling: Sampling, lens: bool | Callable = False, on_text: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None, hooks: dict[str, Hook] | None = None) -> Iterator[Generation]:
    """Generate for each prompt of a stream of batches (`prompts`), yielding each prompt's generation in order;
    `warn` hears when fewer new tokens than asked fit after a prompt, and on_text receives each new piece of text
    as soon as it is decoded; `hooks` (by site name: steering) run on every pass."""
    number = 0
    for batch in batches:
        for prompt in batch:
            number += 1
            if prompt.budget < prompt.asked and warn is not None:
                tokens = f"{prompt.budget} new token{'s' if prompt.budget != 1 else ''}"
                warn(f"prompt {number}: only {tokens} fit in the model's {model.config.max_position_embeddings} "
                     "positions")
            yield generate_one(model, tokenizer, prompt, sampling, lens, on_text, hooks)


def generate_one(model: TransformerModel, tokenizer: Tokenizer, prompt: GenerationPrompt, sampling: Sampling,
                 lens: bool | Callable = False, on_text: Callable[[str], None] | None = None,
                 hooks: dict[str, Hook] | None = None) -> Generation:
    """Generate for one prompt; on_text receives each new piece of text as soon as it is decoded; `hooks` run on
    every pass."""
    import torch

    from tfcli.model.decoding import stream

    context = [] if model.encoder is not None else prompt.ids  # decoded with the new tokens, so words join right
    prompt_text = tokenizer.decode(context)
    result = Generation(prompt.text, prompt.ids, full_text=prompt_text)
    if on_text is not None and result.full_text:
        on_text(result.full_text)
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
    for step in stream(model, input_ids, prompt.budget, sampling, lens=lens, hooks=hooks):
        result.steps.append(step)
        result.generated_ids.append(step.token_id)
        full = tokenizer.decode(context + result.generated_ids)
        if on_text is not None and full.startswith(result.full_text) and len(full) > len(result.full_text):
            on_text(full[len(result.full_text):])
        result.full_text = full
        result.stopped_at_eos = step.eos
    # decoded after the prompt, not alone: a WordPiece continuation (`##beau`) joins the prompt's last word
    result.text = (result.full_text[len(prompt_text):] if context and result.full_text.startswith(prompt_text)
                   else tokenizer.decode(result.generated_ids))
    return result


def feature_scale(model: TransformerModel, ids: list[int], sae: SAE, feature: int, strength: float
                  ) -> dict[str, float]:
    """What `--steer SAE#N:S` adds, on one prompt, in numbers a person can weigh S by: S is in feature N's activation
    units (S x W_dec[N] is what the feature writes at activation S: the rows have unit norm for `sae train`'s, so
    a vector of norm S |W_dec[N]|); against it, the feature's largest activation on the prompt and the median norm
    of the site it is added to (block L's output; position 0, the attention sink, left out), the vector's norm as a
    share of it (a transcoder: its features read its input site, and the vector goes to the output of its block).
    One pass of the prompt, unsteered."""
    import torch

    block = f"blocks.{sae.site.split('.')[1]}.resid_post"  # the block the vector is added to (vectors.feature_vector)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.device), names=[sae.site, block])
    x = cache[sae.site][0].float()
    norms = cache[block][0].float().norm(dim=-1)
    median = float((norms[1:] if len(norms) > 1 else norms).median())
    acts = sae.encode(x.cpu())[:, feature]
    added = abs(strength) * float(sae.weights["W_dec"][feature].norm())
    return {"strength": strength, "activation": float((acts[1:] if len(acts) > 1 else acts).max()),
            "site_norm": median, "share": added / median if median > 0 else float("inf")}
