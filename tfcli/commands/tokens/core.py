"""`tfcli tokenize`: texts -> encodings (tokens, ids, segments, offsets) with a model's own tokenizer,
or the bundled BERT WordPiece one. `run` tokenizes a stream of text batches and yields each text's encoding,
warning (through a callback) about the texts it truncates; nothing here prints."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from tfcli.texts import CappedWarnings, check_truncated

if TYPE_CHECKING:
    from tfcli.texts import Input
    from tfcli.tokenizer import Encoding, Tokenizer

BATCH_SIZE = 1000  # texts tokenized at a time


def tokenizer_for(model: str | None = None, revision: str | None = None) -> Tokenizer:
    """The tokenizer of a model source (a path, bundled name or hub id; None: the bundled one); `revision`
    picks a version of a hub model."""
    from tfcli.sources import resolve_source
    from tfcli.tokenizer.loading import load_tokenizer

    return load_tokenizer(model if revision is None else resolve_source(model, revision).tokenizer_dir)


def tokenize(tokenizer: Tokenizer, texts: list[str], pair: str | None = None, special_tokens: bool = True,
             max_length: int | None = None) -> list[Encoding]:
    """Tokenize each text (with `pair` as every text's second segment), truncating to max_length."""
    pairs = [pair] * len(texts) if pair is not None else None
    return tokenizer.encode(texts, pairs, add_special_tokens=special_tokens, max_length=max_length)


def run(tokenizer: Tokenizer, batches: Iterable[list[Input]], pair: str | None = None, special_tokens: bool = True,
        max_length: int | None = None, warn: Callable[[str], None] | None = None) -> Iterator[Encoding]:
    """Tokenize batches of input texts (`tfcli.texts.Inputs.batches`), yielding each text's encoding in order;
    `warn` hears about the truncated texts (the first few, then how many in all, once the texts are done)."""
    truncated = CappedWarnings(warn or (lambda message: None), "texts truncated")
    count = 0
    for batch in batches:
        encodings = tokenize(tokenizer, [item.text for item in batch], pair, special_tokens, max_length)
        check_truncated(batch, encodings, truncated)
        count += len(encodings)
        yield from encodings
    truncated.finish(count)
