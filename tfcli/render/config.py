"""`tfcli config` output: the resolved config as a key/value table, and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

if TYPE_CHECKING:
    from tfcli.api import SourceSummary


def config_table(summary: SourceSummary, bundled: list[str]) -> Table:
    """Two columns, key and value: every config field; the caption gives the parameter count."""
    config = summary.source.config
    table = Table(title=f"{config.name}: {summary.source.description}", title_justify="left", caption_justify="left",
                  caption=f"{summary.parameters:,} parameters; bundled configs: {', '.join(bundled)}")
    table.add_column("key", no_wrap=True)
    table.add_column("value")
    for key, value in config.to_dict().items():
        table.add_row(key, str(value))
    return table


def record(summary: SourceSummary) -> dict[str, Any]:
    """The JSON Lines record of `config`: source, config, parameters, weights."""
    weights = summary.source.weights
    return {"source": summary.source.description, "config": summary.source.config.to_dict(),
            "parameters": summary.parameters, "weights": str(weights) if weights else None}
