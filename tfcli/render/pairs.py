"""A clean/corrupt pair's two tokenizations side by side: what `patch` and `circuit` show on stderr when a pair's
lengths differ (analysis.pairs.LengthMismatch)."""

from __future__ import annotations

from rich.text import Text

from tfcli.render.layout import Column, table


def alignment_lines(rows: list[tuple[int | None, str | None, int | None, str | None, str]], width: int) -> list[Text]:
    """The clean and corrupt tokenizations side by side (LengthMismatch.rows), for the refusal of two lengths."""
    columns = [Column.of("#", ["" if i is None else str(i) for i, _, _, _, _ in rows], right=True),
               Column.of("clean", ["" if t is None else repr(t) for _, t, _, _, _ in rows]),
               Column.of("", [mark for _, _, _, _, mark in rows]),
               Column.of("#", ["" if j is None else str(j) for _, _, j, _, _ in rows], right=True),
               Column.of("corrupt", ["" if t is None else repr(t) for _, _, _, t, _ in rows])]
    return table(columns, width, keys=0, title="the two tokenizations, aligned (= the same, ≠ differs, - only in "
                 "clean, + only in corrupt)")
