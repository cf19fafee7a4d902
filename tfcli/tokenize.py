"""`tfcli tokenize`: texts -> encodings (tokens, ids, segments, offsets) with a model's own tokenizer,
or the bundled BERT WordPiece one. Imported as `tfcli.tokenize` only; it never shadows the standard
library's `tokenize`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding


@dataclass
class Tokenized:
    tokenizer_name: str  # which tokenizer, for the output
    encodings: list[Encoding]


def run(texts: list[str], model: str | None = None, pair: str | None = None, special_tokens: bool = True,
        max_length: int | None = None, revision: str | None = None) -> Tokenized:
    """Tokenize each text (with `pair` as every text's second segment), truncating to max_length.
    `revision` picks a version of a hub model."""
    from tfcli.sources import resolve_source
    from tfcli.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model if revision is None else resolve_source(model, revision).tokenizer_dir)
    pairs = [pair] * len(texts) if pair is not None else None
    return Tokenized(tokenizer.name, tokenizer.encode(texts, pairs, add_special_tokens=special_tokens,
                                                      max_length=max_length))
