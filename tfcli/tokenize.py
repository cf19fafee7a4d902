"""`tfcli tokenize`: texts -> encodings (tokens, ids, segments, offsets) with a model's own tokenizer,
or the bundled BERT WordPiece one. Imported as `tfcli.tokenize` only; it never shadows the standard
library's `tokenize`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding, Tokenizer


def tokenizer_for(model: str | None = None, revision: str | None = None) -> Tokenizer:
    """The tokenizer of a model source (a path, bundled name or hub id; None: the bundled one); `revision`
    picks a version of a hub model."""
    from tfcli.sources import resolve_source
    from tfcli.tokenizer import load_tokenizer

    return load_tokenizer(model if revision is None else resolve_source(model, revision).tokenizer_dir)


def run(tokenizer: Tokenizer, texts: list[str], pair: str | None = None, special_tokens: bool = True,
        max_length: int | None = None) -> list[Encoding]:
    """Tokenize each text (with `pair` as every text's second segment), truncating to max_length."""
    pairs = [pair] * len(texts) if pair is not None else None
    return tokenizer.encode(texts, pairs, add_special_tokens=special_tokens, max_length=max_length)
