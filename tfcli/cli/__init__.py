"""The `tfcli` command line: each command declares and resolves its options (`options.py`), opens its session
(`session.py`: its tokenizer, model, Ray workers, progress and Ctrl-C rule), calls its core module's pipeline
(`tfcli/<command>.py`; tokenize's is `tfcli/tokens.py`), and prints or writes what that yields through
`output.emit` and the renderer of the same name in `tfcli/render/`. `app.py` is the Typer app, `console.py` the
messages on stderr, `progress.py` the progress display. No model logic and no pipeline live here.

The commands are in `see.py` (tokenize, config, encode, compare, classify, generate: a forward pass shown) and
`why.py` (patch, attribute, heads: what makes a model do what it does), then `task.py` (task: the datasets those
read); importing them registers them with `app`, in the order `tfcli --help` lists them.

Option ranges are checked where the options are declared; what depends on the model is checked by
the core against the config, before any model is built, and reported with the option's name.
Results go to stdout (a console laid out for --width and --color); warnings, progress and errors to stderr
(`console.STDERR`). Heavy modules (torch, transformers, tokenizers) are imported inside the commands, so
`--help` is quick. Texts are read as they arrive (`tfcli.texts`), so a stream is answered line by line.
"""

from __future__ import annotations

from tfcli.cli import see, why, task, steer, saliency, circuit, features, sae  # noqa: F401  (their commands register with `app`)
from tfcli.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="tfcli")
