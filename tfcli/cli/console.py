"""Messages on stderr, as every command writes them: `say` (wrapped to the output width on a terminal, one line into a
log), `warn`, `note`, `fail` (an `error:`/`hint:` pair and the exit), and the stdout console of a command
(`output_console`), whose width the messages take."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from tfcli.errors import TfcliError
from tfcli.render.layout import make_console, message_lines, output_width

if TYPE_CHECKING:
    from rich.text import Text


@dataclass
class Stderr:
    """stderr as the commands write to it: its console, and the width a message wraps to on a terminal (`width`: the
    command's output width, set by `output_console` once --width is read; None before, the terminal's)."""

    console: Console
    width: int | None = None


STDERR = Stderr(Console(stderr=True, highlight=False, markup=False, emoji=False))


def say(message: str, style: str | None = None, whole: Sequence[str] = ()) -> None:
    """One message on stderr. On a terminal it is wrapped between words to the output width (`whole`: the paths
    in it, never broken), so that the terminal does not break it mid-word; into a file or pipe it stays one line,
    as written, for grep."""
    if STDERR.console.is_terminal:
        message = "\n".join(message_lines(message, STDERR.width or output_width(), whole))
    STDERR.console.print(message, soft_wrap=True, style=style)


def fail(message: str, hint: str | None, exit_code: int) -> None:
    """Print `error: message` (and `hint: hint`) on stderr and exit."""
    say(f"error: {message}")
    if hint:
        say(f"hint: {hint}")
    raise typer.Exit(exit_code)

def warn(message: str) -> None:
    say(f"warning: {message}")

def note(message: str) -> None:
    say(message, style="dim")

def option_words(error: TfcliError) -> str:
    """A library error about a parameter (`top_k must be >= 1`) said with the option's name (`--top-k ...`)."""
    name = error.parameter
    if name and error.message.startswith(name):
        return "--" + name.replace("_", "-") + error.message[len(name):]
    return error.message


def output_console(width: int | None, color: bool | None) -> Console:
    """The stdout console of a command: `--width` (else $COLUMNS, the terminal's, or 120) and `--color`. Its
    width is stderr's too (`say`)."""
    STDERR.width = output_width(width)
    return make_console(STDERR.width, color)


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal: then a command may show progress, or a streamed text, there."""
    return STDERR.console.is_terminal


def say_lines(lines: Iterable[Text]) -> None:
    """A view's lines on stderr, as they are (each already within the width)."""
    for line in lines:
        STDERR.console.print(line, soft_wrap=True)


def stderr_width(default: int) -> int:
    """The command's output width (stderr's too), or `default` before it is known."""
    return STDERR.width or default
