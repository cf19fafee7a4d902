"""`tfcli tokenize` output: one table per text, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, shown, table, words

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding


def token_lines(encoding: Encoding, number: int, tokenizer_name: str, width: int) -> list[Text]:
    """One row per token: position, token, id, segment, span start:end and the text it covers (blank for
    specials), as lines of at most `width` cells; then which tokenizer (`tokenizer: NAME`, NAME a path for a model's
    own: said, not a bare path)."""
    rows = range(len(encoding.ids))
    spans = [("", "") if encoding.sequence_ids[i] is None else
             (f"{encoding.offsets[i][0]}:{encoding.offsets[i][1]}", repr(encoding.span_text(i))) for i in rows]
    columns = [Column.of("#", [str(i) for i in rows], right=True),
               Column.of("token", [shown(t) for t in encoding.tokens]),
               Column.of("id", [str(i) for i in encoding.ids], right=True),
               Column.of("seg", [str(s) for s in encoding.type_ids], right=True),
               Column.of("span", [span for span, _ in spans], right=True),
               Column.of("text", [text for _, text in spans])]
    title = f"text {number}: {encoding.text!r}" + (f" + {encoding.pair!r}" if encoding.pair is not None else "")
    return words(title, width, "bold") + table(columns, width, keys=2) + [Text(f"tokenizer: {tokenizer_name}", style="dim")]


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
