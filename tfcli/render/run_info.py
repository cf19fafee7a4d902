"""What a `--report` file says about the run it comes from (`RunInfo`): the command, the model and its
weights, tfcli's version and the command line. The page (`render/page.py`) and the figures
(`render/figure.py`) show it; `render/report_file.py` writes them."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RunInfo:
    """Where a report's numbers come from, shown on the page and under each figure."""

    command: str  # encode, generate or classify
    model: str  # the config's name and architecture
    source: str  # what --model resolved to
    weights: str  # "trained, loaded from ..." or "random (seed 0), from ..."
    trained: bool
    version: str  # tfcli's
    command_line: str  # the exact command line


def run_info(command: str, model: Any, source_description: str) -> RunInfo:
    """The RunInfo of a run of `command` on a built model (`trained`, `weights_description`, `config`)."""
    from tfcli import __version__

    return RunInfo(command, f"{model.config.name} ({model.config.architecture})", source_description,
                   model.weights_description, model.trained, __version__, command_line(sys.argv))


def command_line(argv: list[str]) -> str:
    """The command as typed, quoted for a POSIX shell; `python -m tfcli` shows as that, not as the path of
    tfcli's __main__.py that Python puts in argv[0]."""
    started = Path(argv[0])
    program = "python -m tfcli" if (started.parent.name, started.name) == ("tfcli", "__main__.py") else shlex.quote(argv[0])
    return " ".join([program, *map(shlex.quote, argv[1:])])
