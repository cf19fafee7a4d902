"""What every command of the `tfcli` command line shares: the Typer `app` (its error reporting and help layout),
messages on stderr (`say`, `warn`, `note`, `fail`), the option types, building the tokenizer and the model, and
`emit`, the one loop that prints a command's results (the terminal view or JSON Lines) and writes its --report.

Results go to stdout (a console laid out for --width and --color); warnings, progress and errors to stderr
(`err_console`). Nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import click
import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup
from typer.exceptions import TyperException

from tfcli import __version__
from tfcli.errors import TfcliError, usage_error
from tfcli.render.jsonl import write_jsonl
from tfcli.render.layout import MIN_WIDTH, make_console, message_lines, output_width, print_lines
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, Inputs

if TYPE_CHECKING:
    from rich.text import Text

    from tfcli.model import TransformerModel
    from tfcli.sources import Source
    from tfcli.tokenizer import Tokenizer

T = TypeVar("T")

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


app = typer.Typer(
    name="tfcli",
    cls=_ErrorReportingGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


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


def requires(test: Callable[[Any], bool], requirement: str):
    """An option callback: a usage error naming the option when a given value fails `test`."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is not None and not test(value):
            raise usage_error(f"{param.opts[0]} {requirement}, got {value}")
        return value

    return check


AT_LEAST_ONE = requires(lambda value: value >= 1, "must be at least 1")
NOT_NEGATIVE = requires(lambda value: value >= 0, "must be at least 0")
POSITIVE = requires(lambda value: value > 0, "must be positive")
PROBABILITY = requires(lambda value: 0 < value <= 1, "must be in (0, 1]")
SEED_RANGE = requires(lambda value: 0 <= value < 2**64, "must be between 0 and 2**64 - 1")
WIDE_ENOUGH = requires(lambda value: value >= MIN_WIDTH, f"must be at least {MIN_WIDTH}")


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


def build(source: Source, device: str, dtype: str, seed: int, random_means: str | None = None) -> TransformerModel:
    """The model of a resolved source; says on stderr where its weights came from, and with `random_means` (what
    the results say nothing about), warns when they are random."""
    from tfcli.api import build_model

    model = build_model(source, device=device, dtype=dtype, seed=seed)
    paths = [str(source.weights)] if source.weights is not None else []
    say(f"model: {model.config.name} ({model.config.architecture}); weights: {model.weights_description}",
        whole=paths + [source.description])
    if random_means is not None and not model.trained:
        warn(f"random weights: {random_means}")
    return model


def write_report_file(path: Path, command: str, model: TransformerModel, source: Source, items: list[Any],
                      overwrite: bool, tokenizer: Any = None, detail: list[int] | None = None) -> None:
    """Write --report PATH from a command's report objects, and say so on stderr (`detail`: encode's layers shown
    in full, which a figure draws)."""
    from tfcli.render.report_file import write_report
    from tfcli.render.run_info import run_info

    check_report_path(path, overwrite, len(items))  # a stream's texts are counted only now
    write_report(path, run_info(command, model, source.description, detail), items, overwrite, tokenizer)
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


@contextlib.contextmanager
def count_bar(what: str, unit: str) -> Iterator[Callable[..., None] | None]:
    """On a terminal stderr, a bar counting `done` of `total` `unit` with the time left (a pipe gets none: None),
    gone when the block ends, before the results are printed. It yields the callback `progress(done, total,
    note="")` that advances it (`note`: said after it, e.g. the workers alive)."""
    if not err_console.is_terminal:
        yield None
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


def emit(results: Iterable[T], *, out: Console, json_output: bool,
         record: Callable[[T], dict[str, Any] | list[dict[str, Any]]],
         lines: Callable[[T, int], list[Text]], spaced: bool = False, after: Callable[[], None] | None = None,
         truncated: CappedWarnings | None = None, report: Path | None = None, force: bool = False,
         command: str = "", model: TransformerModel | None = None, source: Source | None = None,
         tokenizer: Any = None, detail: list[int] | None = None) -> int:
    """The one way a command shows what its core yields: each result, as it comes, as one JSON line
    (`record(result)`) or as its terminal view (`lines(result, number)`, numbered from 1; `spaced`: a blank line
    between two); then `after()`, the note of the texts `truncated` beyond those already said, and --report
    `report` (`command`'s report of every result, written by `write_report_file`); `record` may give a list, a JSON
    line each (steer sweep: one per strength). Returns the number of results."""
    number, kept = 0, []  # kept: every result, for --report
    for result in results:
        number += 1
        if json_output:
            written = record(result)
            write_jsonl(written if isinstance(written, list) else [written])
        else:
            if spaced and number > 1:
                out.print()  # a blank line between results
            print_lines(out, lines(result, number))
        if report is not None:
            kept.append(result)
    if after is not None:
        after()
    if truncated is not None:
        truncated.finish(number)
    if report is not None:
        write_report_file(report, command, model, source, kept, force, tokenizer, detail)
    return number


TextsArgument = Annotated[
    list[str] | None,
    typer.Argument(metavar="TEXT", help="Texts to process; `-` alone reads stdin, one text per line.",
                   show_default=False),
]
FileOption = Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False,
                                                 help="Read texts from FILE, one per line.")]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", metavar="SRC", help="Model source: a path, a bundled config name or a Hugging Face hub id."),
]
RevisionOption = Annotated[str | None, typer.Option(metavar="REV", help="Branch, tag or commit of a Hugging Face hub model.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, one object per text.")]
DeviceOption = Annotated[str, typer.Option(metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps.")]
DtypeOption = Annotated[str, typer.Option(metavar="DTYPE", help="float32, float16 or bfloat16.")]
SeedOption = Annotated[int, typer.Option(metavar="N", help="Seed of the random weights when the model has none.",
                                         callback=SEED_RANGE)]
PairOption = Annotated[str | None, typer.Option(metavar="TEXT", help="Second segment, paired with every text.")]
# no range check here: the smallest useful N depends on the tokenizer's special tokens, which it checks (one message)
MaxLengthOption = Annotated[int | None, typer.Option("--max-length", metavar="N",
                                                     help="Truncate texts to at most N tokens (default: the model's "
                                                     "positions).")]
ReportOption = Annotated[Path | None, typer.Option(
    "--report", metavar="PATH", dir_okay=False,
    help="Also write the results to PATH: an interactive page (.html) or a figure (.svg, .png, .pdf).")]
ReportForceOption = Annotated[bool, typer.Option("--force", help="Overwrite the --report file if it exists.")]
DatasetOption = Annotated[str | None, typer.Option(
    "--dataset", metavar="FILE", help="Run over a dataset instead: JSON Lines, one item per line (`-`: stdin); "
    "prints the aggregate with its spread (docs/datasets.md).")]
SkipBadOption = Annotated[bool, typer.Option("--skip-bad", help="With --dataset: skip the lines that cannot be used "
                                             "(saying why on stderr) instead of refusing the dataset.")]
BootstrapOption = Annotated[int | None, typer.Option(metavar="N", help="With --dataset: resamples of the 95% "
                                                     "bootstrap interval over items (default 1000; 0: none).")]
PerItemOption = Annotated[bool, typer.Option("--per-item", help="With --dataset: first each item's result, as a "
                                             "single run prints it, then the aggregate.")]
WidthOption = Annotated[int | None, typer.Option(
    "--width", metavar="N", callback=WIDE_ENOUGH,
    help="Lay tables out for N columns (default: $COLUMNS, else the terminal's width, else 120).")]
ColorOption = Annotated[bool | None, typer.Option(
    "--color/--no-color", show_default=False,
    help="Colour on or off (default: on when stdout is a terminal and NO_COLOR is unset).")]

AblateOption = Annotated[list[str] | None, typer.Option(
    "--ablate", metavar="SITE[:zero|mean]", help="Run with a component removed: a head (L23H3), a sublayer's output "
    "(L5.mlp, L5.attn) or any site name, * allowed; zeroed, or :mean (its mean over the text's positions); "
    "repeatable.")]


def ablation_of(specs: list[str] | None, config, generating: bool = False):
    """--ablate checked against the model's config before it is built (tfcli.analysis.ablation), and said on stderr;
    None without it."""
    from tfcli.analysis.ablation import ablation

    result = ablation(specs, config, generating)
    if result is not None:
        note(f"ablating: {result.label()}")
    return result
RayOption = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS", help="Spread the dataset over a Ray cluster: its address (ray://HOST:10001, auto) "
    "or `local` (one on this machine); default $TFCLI_RAY_ADDRESS (docs/ray.md).")]
RayWorkersOption = Annotated[int | None, typer.Option("--ray-workers", metavar="N", help="With --ray: workers, each "
                                                      "with the model loaded (default: one per CPU of the cluster).")]
RayGpusOption = Annotated[float | None, typer.Option("--ray-gpus-per-worker", metavar="G", help="With --ray: GPUs "
                                                     "per worker (the model goes on its GPU).")]


def ray_settings(address: str | None, workers: int | None, gpus: float | None, dataset: bool, what: str):
    """--ray (or $TFCLI_RAY_ADDRESS where the command runs a dataset) and its options, checked (tfcli.cluster);
    None for a run on this process."""
    from tfcli.cluster import check_settings

    if not dataset:
        if address is not None or workers is not None or gpus is not None:
            raise usage_error(f"--ray and its options are for {what}")
        return None
    return check_settings(address or os.environ.get("TFCLI_RAY_ADDRESS") or None, workers, gpus)


def on_cluster(settings, model: str | None, revision: str | None, device: str, dtype: str, seed: int, work,
               items: list, options, progress: Callable[..., None] | None, block: int | None = None) -> Iterator:
    """`work`'s results over `items` from the workers of `settings`' Ray cluster (tfcli.cluster: each worker builds
    the model as the driver did), in the order of `items`; the cluster starts when the first result is asked for
    (said on stderr) and its workers end with the iteration. `progress`: count_bar's callback."""
    from tfcli.cluster import BLOCK, Cluster, flattened, spec_of

    with Cluster(settings, spec_of(model, revision, device, dtype, seed)) as cluster:
        workers = len(cluster.workers)
        note(f"ray: {workers} workers at {settings.address}")
        told = None if progress is None else \
            (lambda done, total, alive: progress(done, total, f"{alive} of {workers} workers alive"))
        yield from flattened(cluster.map(work, items, options, told, block or BLOCK))
