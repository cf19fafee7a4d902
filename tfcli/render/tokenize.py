"""`tfcli tokenize` output: one table per text, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding

TOKEN_COLUMNS = [("#", "right"), ("token", "left"), ("id", "right"), ("seg", "right"), ("span", "right"), ("text", "left")]


def token_table(encoding: Encoding, number: int, tokenizer_name: str) -> Table:
    """One row per token: position, token, id, segment, span start:end and the text it covers (blank for specials)."""
    table = Table(title=f"text {number}: {encoding.text!r}", caption=tokenizer_name, title_justify="left",
                  caption_justify="left")
    for header, justify in TOKEN_COLUMNS:
        table.add_column(header, justify=justify)
    for position, (token, token_id, segment) in enumerate(zip(encoding.tokens, encoding.ids, encoding.type_ids)):
        special = encoding.sequence_ids[position] is None
        start, end = encoding.offsets[position]
        span, covered = ("", "") if special else (f"{start}:{end}", repr(encoding.span_text(position)))
        table.add_row(str(position), token, str(token_id), str(segment), span, covered)
    return table


def record(encoding: Encoding) -> dict[str, Any]:
    """The JSON Lines record of `tokenize`: text, (pair,) tokens, ids, type_ids, attention_mask, offsets."""
    out: dict[str, Any] = {"text": encoding.text}
    if encoding.pair is not None:
        out["pair"] = encoding.pair
    return out | {
        "tokens": encoding.tokens,
        "ids": encoding.ids,
        "type_ids": encoding.type_ids,
        "attention_mask": encoding.attention_mask,
        "offsets": encoding.offsets,
    }
