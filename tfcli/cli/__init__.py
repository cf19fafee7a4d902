"""The `tfcli` command line. Each command's own command line is `tfcli/commands/<command>/cli.py`: it declares and
resolves its options (`options.py` holds the shared ones), opens its session (`session.py`: its tokenizer, model, Ray
workers, progress and Ctrl-C rule), calls its core's pipeline (`core.py` beside it) and prints or writes what that
yields through `output.emit` and its renderer (`render.py` beside it). `app.py` is the Typer app, `console.py` the
messages on stderr, `progress.py` the progress display. No model logic and no pipeline live here.

Importing a command's `cli` module registers it with `app`: one line per command below, in the order `tfcli --help`
lists them.

Option ranges are checked where the options are declared; what depends on the model is checked by
the core against the config, before any model is built, and reported with the option's name.
Results go to stdout (a console laid out for --width and --color); warnings, progress and errors to stderr
(`console.STDERR`). Heavy modules (torch, transformers, tokenizers) are imported inside the commands, so
`--help` is quick. Texts are read as they arrive (`tfcli.texts`), so a stream is answered line by line.
"""

from __future__ import annotations

# each command registers with `app` as it is imported: one line per command, in the order `tfcli --help` lists them
import tfcli.commands.tokens.cli  # noqa: F401
import tfcli.commands.config.cli  # noqa: F401
import tfcli.commands.encode.cli  # noqa: F401
import tfcli.commands.compare.cli  # noqa: F401
import tfcli.commands.classify.cli  # noqa: F401
import tfcli.commands.generate.cli  # noqa: F401
import tfcli.commands.patch.cli  # noqa: F401
import tfcli.commands.attribute.cli  # noqa: F401
import tfcli.commands.heads.cli  # noqa: F401
import tfcli.commands.task.cli  # noqa: F401
import tfcli.commands.steer.cli  # noqa: F401
import tfcli.commands.saliency.cli  # noqa: F401
import tfcli.commands.circuit.cli  # noqa: F401
import tfcli.commands.features.cli  # noqa: F401
import tfcli.commands.sae.cli  # noqa: F401
import tfcli.commands.graph.cli  # noqa: F401
import tfcli.commands.lens.cli  # noqa: F401
from tfcli.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="tfcli")
