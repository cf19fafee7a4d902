"""`tfcli classify`: texts -> probabilities over the head's labels, and why (the first token's attention).

Texts run in padded batches; padding is masked out of attention, so a text gets the same
probabilities alone or in any batch. `explain` keeps the attention of the last layer(s) only, so
the other layers stay on the fused fast path. `run` classifies a stream of tokenized batches and yields
each text's `Classification`; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.analysis.names import block_site
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Encoding, Tokenizer

BATCH_SIZE = 32


@dataclass
class Explanation:
    """What the classification (first) token attends to: softmax weights over the input tokens,
    averaged over every head of `layers` (and over those layers)."""

    layers: list[int]
    tokens: list[str]
    weights: list[float]  # one per input token, summing to 1
    texts: list[str] | None = None  # the text each token stands for (Tokenizer.texts): shown; None: the tokens


@dataclass
class Classification:
    text: str
    ids: list[int]
    labels: list[str]  # every label, in head order
    probs: list[float]  # same order
    explanation: Explanation | None = None
    pair: str | None = None  # the second segment (--pair), when given

    @property
    def prediction(self) -> str:
        return self.labels[max(range(len(self.probs)), key=self.probs.__getitem__)]

    def ranked(self, top: int | None = None) -> list[tuple[str, float]]:
        """(label, probability), most probable first; the first `top` only when given."""
        pairs = sorted(zip(self.labels, self.probs), key=lambda pair: -pair[1])
        return pairs[:top] if top is not None else pairs


def check_options(config: ModelConfig, explain: int = 0) -> None:
    """Before a model is built: it must have a classification head (a usage error naming the head it has,
    as for `generate` without an LM head), and `explain` (the layers --explain averages) must exist."""
    if config.head != "classifier":
        has = "no head" if config.head == "none" else f"a `{config.head}` head"
        raise usage_error(f"{config.name} has no classification head: it has {has}",
                          "use a checkpoint saved from a ...ForSequenceClassification model, a config with "
                          "`head: classifier`, or the bundled `--model classifier`")
    total = config.output_layers
    if explain < 0 or explain > total:
        raise usage_error(f"explain_layers must be between 1 and the model's {total} layers, got {explain}",
                          parameter="explain_layers")


def explain_layers(model: TransformerModel, count: int) -> list[int]:
    """The last `count` blocks of the stack feeding the head."""
    check_options(model.config, count)
    total = len(model.output_stack.blocks)
    return list(range(total - count, total))


def run(model: TransformerModel, tokenizer: Tokenizer, chunks: Iterable[list[Encoding]], explain: int = 0,
        batch_size: int = BATCH_SIZE) -> Iterator[Classification]:
    """Classify tokenized texts, chunk by chunk (a stream's batches, see `tfcli.texts.tokenized`), yielding each
    text's classification in order; explain > 0 adds the first token's attention (see `classify`)."""
    for encodings in chunks:
        yield from classify(model, tokenizer, encodings, explain, batch_size)


def classify(model: TransformerModel, tokenizer: Tokenizer, encodings: list[Encoding],
             explain: int = 0, batch_size: int = BATCH_SIZE) -> list[Classification]:
    """Classify tokenized texts in padded batches; explain > 0 adds the first token's attention,
    averaged over heads and over the last `explain` layers."""
    import torch

    check_options(model.config, explain)
    device = next(model.parameters()).device
    layers = explain_layers(model, explain) if explain else []
    patterns = [block_site(i, "attn.pattern") for i in layers]  # the other layers stay on the fused fast path
    results: list[Classification] = []
    for start in range(0, len(encodings), batch_size):
        batch = encodings[start:start + batch_size]
        ids, mask, type_ids = (torch.tensor(rows, device=device) for rows in tokenizer.pad(batch))
        logits, cache = model.run_with_cache(ids, patterns, attention_mask=mask, token_type_ids=type_ids)
        probs = logits.float().softmax(-1).cpu()
        if layers:
            # (B, H, T, S) per layer -> the first query row, mean over heads and layers -> (B, S)
            first = torch.stack([cache[name][:, :, 0, :].float().mean(1) for name in patterns]).mean(0).cpu()
        for row, encoding in enumerate(batch):
            explanation = None
            if layers:
                n = len(encoding.ids)
                explanation = Explanation(layers, list(encoding.tokens), first[row, :n].tolist(),
                                          tokenizer.texts(encoding.ids))
            results.append(Classification(encoding.text, list(encoding.ids), list(model.config.label_names),
                                          probs[row].tolist(), explanation, encoding.pair))
    return results
