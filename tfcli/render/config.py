"""`tfcli config` output: the resolved config as a key/value table, and the JSON Lines record."""

from __future__ import annotations

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


def record(summary: SourceSummary) -> dict[str, Any]:
    """The JSON Lines record of `config`: source, config, parameters, weights."""
    weights = summary.source.weights
    return {"source": summary.source.description, "config": summary.source.config.to_dict(),
            "parameters": summary.parameters, "weights": str(weights) if weights else None}
