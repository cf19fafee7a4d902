"""Progress on stderr: a bar on a terminal (`count_bar`, `with_progress`), a plain line now and then into a log
(`PlainProgress`)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tfcli.cli.console import STDERR, say

T = TypeVar("T")


def with_progress(batches: Iterable[T], what: str, count: Callable[[T], int]) -> Iterator[T]:
    """Yield the batches in order; with a progress count on stderr (advanced by count(batch) after each)
    when stderr is a terminal and stdout is not (results go to a pipe or file: on a terminal they show
    progress themselves). Never on pipes."""
    if not STDERR.console.is_terminal or sys.stdout.isatty():
        yield from batches
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_stdout=False: rich would otherwise send the results written to sys.stdout to stderr
    with Progress(TextColumn(what), BarColumn(), TextColumn("{task.completed} texts"), TimeElapsedColumn(),
                  console=STDERR.console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task(what, total=None)
        for batch in batches:
            yield batch
            progress.advance(task, count(batch))


PLAIN_EVERY = 60.0  # seconds between two progress lines in a log


class PlainProgress:
    """Progress into a log, for a batch job: a first line at once (what runs, over how many items), then a line every
    PLAIN_EVERY seconds with the items done, the rate and the time left (when the rate falls under a fifth of the best
    seen, a word on why (a busy machine) and what helps), and a last line at the end (`end`): how many in how long."""

    def __init__(self, what: str, unit: str, clock: Callable[[], float] | None = None):
        import time

        self.what, self.unit, self.clock = what, unit, clock or time.monotonic
        self.start = self.last = self.clock()
        self.last_done, self.best = 0.0, 0.0
        self.done: float = 0.0
        self.total: int | None = None
        self.told = False  # the first line said

    def __call__(self, done: float, total: int | None, note: str = "") -> None:
        now = self.clock()
        self.done, self.total = done, total if total is not None else self.total
        of = f"{self.total:,}" if self.total is not None else "?"
        if not self.told:
            self.told = True
            say(f"{self.what}: started, over {of} {self.unit}" + (f"; {note}" if note else ""))
            return
        if now - self.last < PLAIN_EVERY:
            return
        rate = (done - self.last_done) / (now - self.last)
        self.best = max(self.best, rate)
        self.last, self.last_done = now, done
        overall = done / (now - self.start)
        line = f"{self.what}: {int(done):,} of {of} {self.unit}, {rate:.3g} per s"
        if self.total is not None and overall > 0:
            line += f", about {duration((self.total - done) / overall)} left"
        if rate < self.best / 5:
            line += " (slower than before: a busy machine? OMP_NUM_THREADS=1 helps under load)"
        say(line + (f"; {note}" if note else ""))

    def end(self, interrupted: bool = False) -> None:
        """The last line: the items done (of how many) and the time taken; nothing where no first line was said."""
        if self.told:
            of = f" of {self.total:,}" if self.total is not None else ""
            say(f"{self.what}: {'interrupted after' if interrupted else 'done,'} {int(self.done):,}{of} {self.unit} "
                f"in {duration(self.clock() - self.start)}")


def duration(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `1 h 5 min`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"

@contextlib.contextmanager
def count_bar(what: str, unit: str) -> Iterator[Callable[..., None]]:
    """On a terminal stderr, a bar counting `done` of `total` `unit` with the time left, gone when the block ends,
    before the results are printed; into a log (stderr not a terminal), a plain line now and then (PlainProgress).
    It yields the callback `progress(done, total, note="")` that advances it (`note`: said after it, e.g. the
    workers alive)."""
    if not STDERR.console.is_terminal:
        plain = PlainProgress(what, unit)
        try:
            yield plain
        except BaseException:
            plain.end(interrupted=True)
            raise
        plain.end()
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[note]}"), console=STDERR.console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(what, total=None, note="")

        def progress(done: int, total: int, note: str = "") -> None:
            bar.update(task, completed=done, total=total, note=note)

        yield progress
