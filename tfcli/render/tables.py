"""Rich tables for terminal output."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding

TOKEN_COLUMNS = [("#", "right"), ("token", "left"), ("id", "right"), ("seg", "right"), ("span", "right"), ("text", "left")]


def token_table(encoding: Encoding, title: str, caption: str | None = None) -> Table:
    """One row per token: position, token, id, segment, span start:end and the text it covers (blank for specials)."""
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for header, justify in TOKEN_COLUMNS:
        table.add_column(header, justify=justify)
    for position, (token, token_id, segment) in enumerate(zip(encoding.tokens, encoding.ids, encoding.type_ids)):
        special = encoding.sequence_ids[position] is None
        start, end = encoding.offsets[position]
        span, covered = ("", "") if special else (f"{start}:{end}", repr(encoding.span_text(position)))
        table.add_row(str(position), token, str(token_id), str(segment), span, covered)
    return table


def key_value_table(values: dict, title: str, caption: str) -> Table:
    """Two columns, key and value (e.g. a resolved config)."""
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    for key, value in values.items():
        table.add_row(key, str(value))
    return table


def compare_table(differences, title: str, tolerance: float) -> Table:
    """One row per compared tensor: its shape, the max abs difference and whether it is within tolerance."""
    table = Table(title=f"{title} (tolerance {tolerance:g})", title_justify="left")
    for header in ("tensor", "shape", "max abs diff", ""):
        table.add_column(header, no_wrap=True)
    for d in differences:
        table.add_row(d.name, str(tuple(d.shape)), f"{d.max_abs_diff:.3g}", "ok" if d.max_abs_diff <= tolerance else "DIFFERS")
    return table
