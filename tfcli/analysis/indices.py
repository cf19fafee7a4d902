"""Selections of layers and heads as people type them (`0,-1`, `8-11`, `-3-`, `all`)."""

from __future__ import annotations

import re

from tfcli.errors import usage_error


def parse_indices(spec: str | None, count: int, what: str, has: str = "the model has",
                  noun: str | None = None) -> list[int] | None:
    """A selection of `count` items as people type it -> sorted indices; None or 'all' -> None (all of them).
    Comma-separated parts, each an index or a range of them, negative counting from the end: '0,-1',
    '8-11', '-3-' (the last three), '2-' (from 2 on), '-4--2', 'all'. `what`: the option, as the errors name it;
    `has`: whose items they are ("the texts have"); `noun`: what the items are called (default: `what`)."""
    if spec is None or spec.strip() == "all":
        return None
    items = counted(count, noun or what)
    hint = f"for example 0,-1 or 8-11 or -3- (the last three) or all; {has} {items} (0 to {count - 1})"
    indices: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        match = RANGE.fullmatch(part)
        if not match or not any(character.isdigit() for character in part):
            raise usage_error(f"{what}: `{part}` is not an index or a range", hint, parameter=what)
        first, dash, last = match.groups()
        start = _index(first, 0, count, what, hint, f"{has} {items}")
        stop = _index(last, count - 1, count, what, hint, f"{has} {items}") if dash else start
        if stop < start:
            raise usage_error(f"{what}: the range `{part}` is empty ({start} comes after {stop})", hint, parameter=what)
        indices.update(range(start, stop + 1))
    return sorted(indices)


RANGE = re.compile(r"(-?\d+)?(?:(-)(-?\d+)?)?")  # 'a', 'a-', 'a-b', '-b' with negative numbers


def _index(text: str | None, default: int, count: int, what: str, hint: str, has: str) -> int:
    """One end of a selection: an index (negative counts from the end) checked against `count` (`has`: "the model
    has 12 layers")."""
    if text is None:
        return default
    index = int(text)
    if not -count <= index < count:
        raise usage_error(f"{what}: {index} is out of range: {has}", hint, parameter=what)
    return index % count


def counted(count: int, what: str) -> str:
    """'12 layers', '1 layer'."""
    return f"{count} {what.removesuffix('s') if count == 1 else what}"


def spans(indices: list[int]) -> str:
    """Sorted indices as people write them, the inverse of parse_indices: [0, 2, 3, 4, 7] -> '0, 2-4, 7'."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
