"""JSON Lines output: one compact object per line, flushed as it is written."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

# Characters that some readers take for line breaks (Unicode line and paragraph separators, NEL): JSON allows
# them raw inside strings, but a record must stay on one line for every reader, so they are escaped.
LINE_BREAKS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def dumps(record: dict[str, Any]) -> str:
    """One record as one line of JSON (UTF-8 text kept as is, except line-breaking characters escaped)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).translate(LINE_BREAKS)


def write_jsonl(records: Iterable[dict[str, Any]], stream: TextIO | None = None) -> None:
    """Write each record as one JSON line to stream (sys.stdout at call time when None)."""
    stream = stream or sys.stdout
    for record in records:
        stream.write(dumps(record) + "\n")
        stream.flush()
