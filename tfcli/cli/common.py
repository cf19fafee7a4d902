"""What every command of the `tfcli` command line shares: the Typer `app` (its error reporting and help layout),
messages and progress on stderr (`say`, `warn`, `note`, `fail`, `count_bar`), building the tokenizer and the model,
`emit`, the one loop that prints a command's results (the terminal view or JSON Lines) and writes its --report, and
`run_dataset`, the runner's face (tfcli/runner.py): an analysis over a dataset or texts. The option types are
`tfcli/cli/options.py`.

Results go to stdout (a console laid out for --width and --color); warnings, progress and errors to stderr
(`err_console`). Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup
from typer.exceptions import TyperException

from tfcli import __version__
from tfcli.errors import TfcliError
from tfcli.render.jsonl import write_jsonl
from tfcli.render.layout import make_console, message_lines, output_width, print_lines
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, Inputs

if TYPE_CHECKING:
    from tfcli.cli.options import DatasetOptions, RunOptions
    from rich.text import Text

    from tfcli.model import TransformerModel
    from tfcli.sources import Source
    from tfcli.tokenizer import Tokenizer

T = TypeVar("T")


@dataclass
class View:
    """How a command shows one result: on `out`, as its JSON record (`record(result)`: a dict, or a list of them)
    or its terminal view (`lines(result, number)`, numbered from 1; `spaced`: a blank line between two); in a
    --report, as `report`: its page section and figure (None: the renderer's `page_section` and `figure`, found by
    the command's name), for a renderer with a result type per mode."""

    out: Console
    record: Callable[[Any], dict[str, Any] | list[dict[str, Any]]]
    lines: Callable[[Any, int], list[Text]]
    spaced: bool = False
    report: tuple[Callable, Callable] | None = None

err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)

# Typer writes an argument's Python type beside its name in --help (`TEXT <list[str]>`): the name alone says it.
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _help_wrap(text: str, width: int, indent: str = "") -> str:
    """click's paragraph wrapping (a paragraph after a `\\b` line kept as written), broken only between words:
    never inside an option name (`--max-length`) or a range (`-3-`), and a word wider than the line kept whole."""
    wrapper = textwrap.TextWrapper(max(width, 10), initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=False, replace_whitespace=False)
    paragraphs: list[str] = []
    for block in text.expandtabs().split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        if lines[0].strip() == "\b":
            paragraphs.append("\n".join(indent + line for line in lines[1:]))
        else:
            extra = " " * (len(lines[0]) - len(lines[0].lstrip()))
            wrapper.initial_indent = wrapper.subsequent_indent = indent + extra
            paragraphs.append(wrapper.fill(" ".join(line.strip() for line in lines)))
    return "\n\n".join(paragraphs)


class _HelpFormatter(click.HelpFormatter):
    """click's help layout, wrapped between whole words (click's own wrapping splits `--max-length` at its
    hyphen)."""

    def write_text(self, text: str) -> None:
        self.write(_help_wrap(text, self.width, " " * self.current_indent) + "\n")

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            if not second:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)))
            else:
                self.write("\n" + " " * (first_col + self.current_indent))
            lines = _help_wrap(second, self.width - first_col - self.current_indent).splitlines() or [""]
            self.write(lines[0] + "\n")
            for line in lines[1:]:
                self.write(" " * (first_col + self.current_indent) + line + "\n")


class _HelpContext(typer.Context):
    formatter_class = _HelpFormatter


class _ErrorReportingGroup(TyperGroup):
    """Turns TfcliError, and any unexpected exception, into `error:` / `hint:` lines and an exit code; a
    reader that goes away (`| head`) ends the run quietly with 0. Its help, and every command's, is wrapped
    between whole words, and lists each command's first sentence in full."""

    context_class = _HelpContext

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            command.context_class = _HelpContext  # the command's --help, wrapped like the group's
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with their summaries (the first sentence of each), in full: never cut with `...`."""
        rows = [(name, command.get_short_help_str(limit=10**6)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: typer.Context) -> Any:
        global _stderr_width
        _stderr_width = None  # until the command reads its --width
        try:
            return super().invoke(ctx)
        except TfcliError as e:
            fail(option_words(e), e.hint, e.exit_code)
        except BrokenPipeError:
            _quiet_stdout()
            raise typer.Exit(0) from None
        except (TyperException, typer.Exit, typer.Abort):
            raise  # typer handles these: usage errors, exits, Ctrl-C (130)
        except MemoryError:  # e.g. importing torch under an address-space limit (ulimit -v)
            fail("out of memory", "close other programs, or raise the memory limit (ulimit -v)", 1)
        except Exception as e:
            if os.environ.get("TFCLI_DEBUG") == "1":
                raise
            fail(f"unexpected {type(e).__name__}: {e}", "this is a bug in tfcli; TFCLI_DEBUG=1 shows the traceback", 1)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush into the closed pipe cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests capture stdout in memory)
        pass


GROUP_SETTINGS = dict(cls=_ErrorReportingGroup, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings={"help_option_names": ["-h", "--help"]})
app = typer.Typer(name="tfcli", **GROUP_SETTINGS)


def command_group(name: str, help: str) -> typer.Typer:
    """A group of sub-commands (`tfcli steer fit`, `tfcli sae train`) with the root group's error reporting and help
    layout, registered under the root."""
    group = typer.Typer(name=name, help=help, **GROUP_SETTINGS)
    app.add_typer(group)
    return group


def _show_version(value: bool) -> None:
    if value:
        print(f"tfcli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """See inside a transformer's forward pass: tokens, shapes, attention, and what each layer would predict."""


# ---------------------------------------------------------------- helpers shared by the commands


_stderr_width: int | None = None  # the command's output width (--width, ...), once it is known


def say(message: str, style: str | None = None, whole: Sequence[str] = ()) -> None:
    """One message on stderr. On a terminal it is wrapped between words to the output width (`whole`: the paths
    in it, never broken), so that the terminal does not break it mid-word; into a file or pipe it stays one line,
    as written, for grep."""
    if err_console.is_terminal:
        message = "\n".join(message_lines(message, _stderr_width or output_width(), whole))
    err_console.print(message, soft_wrap=True, style=style)


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
    global _stderr_width
    _stderr_width = output_width(width)
    return make_console(_stderr_width, color)


def inputs(texts: list[str] | None, file: Path | None, keep_blank: bool = False) -> Inputs:
    return Inputs(texts, file, keep_blank, warn)


def noted(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer, after saying on stderr what a person should know about it (the bundled one standing in
    for a model directory that has none)."""
    if tokenizer.note:
        warn(tokenizer.note)
    return tokenizer


def tokenizer_of(source: Source) -> Tokenizer:
    from tfcli.api import load_tokenizer_for

    return noted(load_tokenizer_for(source))


def started(items: Iterator[T]) -> Iterator[T]:
    """The same items, the first one read now: before a model is built, so that a bad or empty input
    fails early."""
    first = next(items)
    return chain([first], items)


def with_progress(batches: Iterable[T], what: str, count: Callable[[T], int]) -> Iterator[T]:
    """Yield the batches in order; with a progress count on stderr (advanced by count(batch) after each)
    when stderr is a terminal and stdout is not (results go to a pipe or file: on a terminal they show
    progress themselves). Never on pipes."""
    if not err_console.is_terminal or sys.stdout.isatty():
        yield from batches
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_stdout=False: rich would otherwise send the results written to sys.stdout to stderr
    with Progress(TextColumn(what), BarColumn(), TextColumn("{task.completed} texts"), TimeElapsedColumn(),
                  console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task(what, total=None)
        for batch in batches:
            yield batch
            progress.advance(task, count(batch))


def build(source: Source, run: RunOptions, random_means: str | None = None) -> TransformerModel:
    """The model of a resolved source, built on --device in --dtype (--seed: its random weights, where it has no
    weights); says on stderr where its weights came from, and with `random_means` (what the results say nothing
    about), warns when they are random."""
    from tfcli.api import build_model

    model = build_model(source, device=run.device, dtype=run.dtype, seed=run.seed)
    paths = [str(source.weights)] if source.weights is not None else []
    say(f"model: {model.config.name} ({model.config.architecture}); weights: {model.weights_description}",
        whole=paths + [source.description])
    if random_means is not None and not model.trained:
        warn(f"random weights: {random_means}")
    return model


@dataclass
class Report:
    """--report: where (`path`; `force` overwrites), and what the page or figure says of the run: the command, the
    model built from `source`, the tokenizer the page reads tokens with, encode's layers shown in full (`detail`)."""

    path: Path
    force: bool
    command: str
    model: TransformerModel
    source: Source
    tokenizer: Any = None
    detail: list[int] | None = None


def report_of(path: Path | None, force: bool, command: str, model: TransformerModel, source: Source,
              tokenizer: Any = None, detail: list[int] | None = None) -> Report | None:
    """The Report of --report PATH (None without it)."""
    return None if path is None else Report(path, force, command, model, source, tokenizer, detail)


def write_report_file(report: Report, items: list[Any], parts: tuple[Callable, Callable] | None = None) -> None:
    """Write --report from a command's report objects (`parts`: as View.report), and say so on stderr."""
    from tfcli.render.report_file import write_report
    from tfcli.render.run_info import run_info

    path = report.path
    check_report_path(path, report.force, len(items))  # a stream's texts are counted only now
    write_report(path, run_info(report.command, report.model, report.source.description, report.detail), items,
                 report.force, report.tokenizer, parts)
    say(f"wrote {path}", whole=[str(path)])  # a path is never broken across lines


def stderr_is_terminal() -> bool:
    """Whether stderr (`err_console`) is a terminal: then a command may show progress, or a streamed text, there."""
    return err_console.is_terminal


def say_lines(lines: Iterable[Text]) -> None:
    """A view's lines on stderr, as they are (each already within the width)."""
    for line in lines:
        err_console.print(line, soft_wrap=True)


def stderr_width(default: int) -> int:
    """The command's output width (stderr's too), or `default` before it is known."""
    return _stderr_width or default


def pair_ids(source: Source, tokenizer: Tokenizer, clean: str, corrupt: str) -> tuple[list[int], list[int]]:
    """The clean and corrupt texts' ids for the source's model (analysis.pairs.pair_inputs); when their lengths
    differ, the two tokenizations aligned on stderr before the error (its hint says how to reword)."""
    from tfcli.analysis.pairs import LengthMismatch, pair_inputs
    from tfcli.render.patch import alignment_lines

    try:
        return pair_inputs(source.config, tokenizer, clean, corrupt)
    except LengthMismatch as mismatch:
        say_lines(alignment_lines(mismatch.rows, stderr_width(80)))
        raise


PLAIN_EVERY = 60.0  # seconds between two progress lines in a log


class PlainProgress:
    """Progress into a log, for a batch job: a line every PLAIN_EVERY seconds (none for a run that ends sooner)
    with the items done, the rate and the time left; when the rate falls under a fifth of the best seen, a word on
    why (a busy machine) and what helps."""

    def __init__(self, what: str, unit: str, clock: Callable[[], float] | None = None):
        import time

        self.what, self.unit, self.clock = what, unit, clock or time.monotonic
        self.start = self.last = self.clock()
        self.last_done, self.best = 0.0, 0.0

    def __call__(self, done: float, total: int | None, note: str = "") -> None:
        now = self.clock()
        if now - self.last < PLAIN_EVERY:
            return
        rate = (done - self.last_done) / (now - self.last)
        self.best = max(self.best, rate)
        self.last, self.last_done = now, done
        overall = done / (now - self.start)
        line = f"{self.what}: {int(done)} of {total if total is not None else '?'} {self.unit}, {rate:.3g} per s"
        if total is not None and overall > 0:
            line += f", about {duration((total - done) / overall)} left"
        if rate < self.best / 5:
            line += " (slower than before: a busy machine? OMP_NUM_THREADS=1 helps under load)"
        say(line + (f"; {note}" if note else ""))


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
    if not err_console.is_terminal:
        yield PlainProgress(what, unit)
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[note]}"), console=err_console,
                  transient=True, redirect_stdout=False, redirect_stderr=False) as bar:
        task = bar.add_task(what, total=None, note="")

        def progress(done: int, total: int, note: str = "") -> None:
            bar.update(task, completed=done, total=total, note=note)

        yield progress


def emit(results: Iterable[T], view: View, json_output: bool, *, after: Callable[[], None] | None = None,
         truncated: CappedWarnings | None = None, report: Report | None = None, first: int = 1) -> int:
    """The one way a command shows what its core yields: each result, as it comes, as one JSON line
    (`view.record(result)`: a dict, or a list of them, a JSON line each) or as its terminal view (`view.lines(result,
    number)`, numbered from `first`); then `after()`, the note of the texts `truncated` beyond those already said,
    and --report (`report`: every result, written by `write_report_file`). Returns the number of results."""
    number, kept = first - 1, []  # kept: every result, for --report
    for result in results:
        number += 1
        if json_output:
            written = view.record(result)
            write_jsonl(written if isinstance(written, list) else [written])
        else:
            if view.spaced and number > first:
                view.out.print()  # a blank line between results
            print_lines(view.out, view.lines(result, number))
        if report is not None:
            kept.append(result)
    if after is not None:
        after()
    if truncated is not None:
        truncated.finish(number - first + 1)
    if report is not None:
        write_report_file(report, kept, view.report)
    return number - first + 1


def ablation_of(specs: list[str] | None, config, generating: bool = False):
    """--ablate checked against the model's config before it is built (tfcli.analysis.ablation), and said on stderr;
    None without it."""
    from tfcli.analysis.ablation import ablation

    result = ablation(specs, config, generating)
    if result is not None:
        note(f"ablating: {result.label()}")
    return result


def run_dataset(analysis, source: Source, given: DatasetOptions, run: RunOptions, views: tuple[View, View],
                random_means: str, after: Callable[[TransformerModel, Any], None] | None = None) -> None:
    """An analysis over a dataset or texts (tfcli/runner.py): every line read and checked before the model is built
    (a stream's first batch), the items run here or on Ray, a progress bar of items on stderr, each item's result
    shown as a single run shows it (--per-item: `views[0]`), then the aggregate (`views[1]`), its JSON or view and
    --report; Ctrl-C shows the aggregate of the items finished and exits 130. `random_means`: what the results say
    nothing about on random weights; `after(model, aggregate)`: what the command adds before it is shown."""
    from tfcli import runner

    tokenizer = tokenizer_of(source)
    if given.texts is not None:
        batches = ([(item.text, item.where) for item in batch]
                   for batch in given.texts.batches(runner.CHUNK if analysis.streams else None))
        dataset = runner.read_texts(analysis, source.config, tokenizer, batches, given.bootstrap, warn)
    else:
        dataset = runner.read_dataset(analysis, source.config, tokenizer, given.path, given.skip_bad,
                                      given.bootstrap, warn)
    model = build(source, run, random_means)
    cluster = None if given.ray is None else runner.Cluster(given.ray, run.spec(), note)
    item_view, view = views
    shown = 0

    def each(result) -> None:
        nonlocal shown
        if given.per_item:
            shown += 1
            if item_view.spaced and shown > 1 and not run.json_output:
                item_view.out.print()
            emit([result], item_view, run.json_output, first=shown)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(runner.kept(cluster))  # one pool of Ray workers for the run and what `after` runs
            with count_bar(analysis.command, analysis.unit) as progress:
                result = runner.run(analysis, model, tokenizer, dataset, each, progress, cluster)
        except KeyboardInterrupt:
            warn(f"interrupted before any of the {analysis.unit} finished: nothing to show")
            raise typer.Exit(130) from None
        if after is not None:
            after(model, result)
    emit([result], view, run.json_output, report=report_of(run.report, run.force, analysis.command, model, source))
    if result.interrupted:
        warn(f"interrupted: {result.n} {analysis.unit} finished; the aggregate is theirs")
        raise typer.Exit(130)


def warn_spacing(tokenizer: Tokenizer, target: str | None, foil: str | None) -> None:
    """A --target or --foil given without the leading space its word has after a space (" Mary"): said on stderr."""
    from tfcli.analysis.metric import spacing_hint

    for option, spec in (("--target", target), ("--foil", foil)):
        hint = spacing_hint(tokenizer, spec, option)
        if hint is not None:
            warn(hint)
