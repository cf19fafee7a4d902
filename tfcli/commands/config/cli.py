"""tfcli config: the command line (its options, its session, its output)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console
from tfcli.cli.options import RunOptions, shared_options
from tfcli.errors import usage_error
from tfcli.render.layout import print_lines

def _one_source(positional: str | None, option: str | None) -> str | None:
    """A model source given as the positional SRC or as --model SRC (one habit works everywhere), not both."""
    if positional is not None and option is not None:
        raise usage_error("give the model source once: as SRC or with --model, not both")
    return positional if positional is not None else option


@app.command("config")
@shared_options(without=("device", "dtype", "seed", "report", "force"),
                json_output="JSON on stdout: one object.")
def show_config(
    source: Annotated[str | None, typer.Argument(metavar="SRC", show_default=False,
                                                 help="Path, bundled name or hub id (default: bert-base).")] = None,
    sites: Annotated[bool, typer.Option("--sites", help="List the model's named sites (what run_with_cache keeps "
                                        "and encode --sites saves) with their shapes.")] = False,
    *,
    run: RunOptions,
) -> None:
    """Print the resolved config of a model source and its parameter count, or with --sites its named sites.

    \b
    Examples:
      tfcli config tiny
      tfcli config --model path/to/checkpoint --json
      tfcli config gpt2-small --sites
    """
    from tfcli.api import describe
    from tfcli.commands.config import render
    from tfcli.sources import bundled_names

    summary = describe(_one_source(source, run.model), run.revision, sites=sites)
    if run.json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([render.record(summary)])
    else:
        out = output_console(run.width, run.color)
        lines = render.site_lines(summary, out.width) if sites else render.config_lines(summary, bundled_names(),
                                                                                          out.width)
        print_lines(out, lines)
