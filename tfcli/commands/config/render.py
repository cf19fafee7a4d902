"""`tfcli config` output: the resolved config as a key/value table, and the JSON Lines record."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.render.layout import Column, table, words

if TYPE_CHECKING:
    from tfcli.api import SourceSummary


def config_lines(summary: SourceSummary, bundled: list[str], width: int) -> list[Text]:
    """Two columns, key and value: every config field (a list value wraps between its items); then the
    parameter count."""
    config = summary.source.config
    items = list(config.to_dict().items())
    values = [[Text(str(v)) for v in value] if isinstance(value, list) and value else [Text(str(value))]
              for _, value in items]
    columns = [Column.of("key", [key for key, _ in items]), Column("value", values, sep=", ")]
    return (words(f"{config.name}: {summary.source.description}", width, "bold") + table(columns, width)
            + words(f"{summary.parameters:,} parameters; bundled configs: {', '.join(bundled)}", width, "dim"))


def site_lines(summary: SourceSummary, width: int) -> list[Text]:
    """The model's sites with their shapes, a row per site of the stacks' first rows and per kind of block site:
    `blocks.*.attn.z` with the blocks that have it (`0-11`), when every one of them has it in the same shape."""
    rows: dict[tuple[str, tuple], list[int]] = {}  # (name, with blocks.* for a block's; shape) -> blocks
    for name, shape in summary.sites.items():
        match = re.match(r"(.*?blocks\.)(\d+)(\..*)", name)
        key = (f"{match[1]}*{match[3]}", shape) if match else (name, shape)
        rows.setdefault(key, []).append(int(match[2]) if match else -1)
    columns = [Column.of("site", [name for name, _ in rows]),
               Column.of("blocks", [_runs(blocks) if blocks[0] >= 0 else "" for blocks in rows.values()]),
               Column.of("shape", ["(" + ", ".join(map(str, shape)) + ")" for _, shape in rows])]
    config = summary.source.config
    return (words(f"{config.name}: {summary.source.description}", width, "bold") + table(columns, width)
            + words("B: batch, T: tokens (the decoder's input in an encoder-decoder), S: the encoder's tokens; "
                    "a name with * stands for each block's (blocks.0.attn.z, ...)", width, "dim"))


def _runs(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def record(summary: SourceSummary) -> dict[str, Any]:
    """The JSON Lines record of `config`: source, config, parameters, weights (and with --sites, `sites`: each
    site's shape, letters for the batch and token sizes)."""
    weights = summary.source.weights
    record = {"source": summary.source.description, "config": summary.source.config.to_dict(),
              "parameters": summary.parameters, "weights": str(weights) if weights else None}
    if summary.sites is not None:
        record["sites"] = {name: list(shape) for name, shape in summary.sites.items()}
    return record
