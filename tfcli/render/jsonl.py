"""JSON Lines output: one compact object per line, flushed as it is written."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO


def write_jsonl(records: Iterable[dict[str, Any]], stream: TextIO | None = None) -> None:
    """Write each record as one JSON line to stream (sys.stdout at call time when None)."""
    stream = stream or sys.stdout
    for record in records:
        stream.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        stream.flush()
