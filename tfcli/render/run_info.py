"""What a `--report` file says about the run it comes from (`RunInfo`): the command, the model and its
weights, tfcli's version and the command line. The page (`render/page.py`) and the figures
(`render/figure.py`) show it; `render/report_file.py` writes them."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LONG_ARGUMENT = 60  # characters: a longer argument (a whole text) is shortened in the command line a page shows
KEPT = 40  # characters of its start that the short command line keeps


@dataclass
class RunInfo:
    """Where a report's numbers come from, shown on the page and under each figure."""

    command: str  # encode, generate or classify
    model: str  # the config's name and architecture
    source: str  # what --model resolved to
    weights: str  # "loaded from ..." or "random (seed 0), from ..."
    trained: bool  # loaded from a checkpoint (which may itself hold random weights)
    version: str  # tfcli's
    command_line: str  # the exact command line, quoted for a POSIX shell
    short_command_line: str = ""  # the same with each long argument shortened (what the page shows at first)
    detail: list[int] | None = None  # encode: the layers the terminal shows in full (None: the last), as View.detail


def run_info(command: str, model: Any, source_description: str, detail: list[int] | None = None) -> RunInfo:
    """The RunInfo of a run of `command` on a built model (`trained`, `weights_description`, `config`); `detail`:
    the layers encode's terminal view shows in full (None: the last one), which the figures draw."""
    from tfcli import __version__

    return RunInfo(command, f"{model.config.name} ({model.config.architecture})", source_description,
                   model.weights_description, model.trained, __version__, command_line(sys.argv),
                   command_line(sys.argv, short=True), detail)


def command_line(argv: list[str], short: bool = False) -> str:
    """The command as typed, quoted for a POSIX shell; `python -m tfcli` shows as that, not as the path of
    tfcli's __main__.py that Python puts in argv[0]. `short`: an argument longer than LONG_ARGUMENT characters
    shows as its start and its length, `'the start…' (24,361 characters)` (no longer a command to run)."""
    started = Path(argv[0])
    program = "python -m tfcli" if (started.parent.name, started.name) == ("tfcli", "__main__.py") else quote(argv[0])

    def shown(argument: str) -> str:
        if short and len(argument) > LONG_ARGUMENT:
            return f"{quote(argument[:KEPT] + '…')} ({len(argument):,} characters)"
        return quote(argument)

    return " ".join([program, *map(shown, argv[1:])])


def quote(argument: str) -> str:
    """`argument` as a POSIX shell reads it back, as people write it: bare when it can be, else in single quotes,
    or in double quotes when it holds a single quote and nothing a shell expands there (`"didn't"`, not
    `'didn'"'"'t'`)."""
    quoted = shlex.quote(argument)
    if "'" in argument and not set(argument) & set('"$`\\!'):
        return f'"{argument}"'
    return quoted
