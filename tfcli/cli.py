"""The `tfcli` command line: each command declares and resolves its options, builds what it needs through the
shared helpers below, calls its core module's pipeline (`tfcli/<command>.py`; tokenize's is `tfcli/tokens.py`),
and prints or writes what that yields through the renderer of the same name in `tfcli/render/`. No model logic
and no pipeline live here.

Option ranges are checked where the options are declared; what depends on the model is checked by
the core against the config, before any model is built, and reported with the option's name.
Results go to stdout (a console laid out for --width and --color); warnings, progress and errors to stderr
(`err_console`). Heavy modules (torch, transformers, tokenizers) are imported inside the commands, so `--help`
is quick. Texts are read as they arrive (`tfcli.texts`), so a stream is answered line by line.
"""

from __future__ import annotations

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
from tfcli.render.layout import MIN_WIDTH, make_console, message_lines, output_width, print_lines
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, Inputs, tokenized

if TYPE_CHECKING:
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


def main() -> None:
    """Console-script entry point."""
    app(prog_name="tfcli")


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


def build(source: Source, device: str, dtype: str, seed: int) -> TransformerModel:
    """The model of a resolved source; says on stderr where its weights came from."""
    from tfcli.api import build_model

    model = build_model(source, device=device, dtype=dtype, seed=seed)
    paths = [str(source.weights)] if source.weights is not None else []
    say(f"model: {model.config.name} ({model.config.architecture}); weights: {model.weights_description}",
        whole=paths + [source.description])
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
WidthOption = Annotated[int | None, typer.Option(
    "--width", metavar="N", callback=WIDE_ENOUGH,
    help="Lay tables out for N columns (default: $COLUMNS, else the terminal's width, else 120).")]
ColorOption = Annotated[bool | None, typer.Option(
    "--color/--no-color", show_default=False,
    help="Colour on or off (default: on when stdout is a terminal and NO_COLOR is unset).")]


# ---------------------------------------------------------------- commands


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


@app.command()
def tokenize(
    texts: TextsArgument = None,
    pair: PairOption = None,
    no_special: Annotated[bool, typer.Option("--no-special", help="Leave out special tokens ([CLS], [SEP], ...).")] = False,
    max_length: Annotated[int | None, typer.Option("--max-length", metavar="N", help="Truncate to at most N tokens.")] = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    file: FileOption = None,
    json_output: JsonOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Show how texts split into tokens: ids, segments, and the characters each token covers.

    \b
    Examples:
      tfcli tokenize "time flies like an arrow"
      tail -f log.txt | tfcli tokenize --json -
    """
    from tfcli import tokens as core
    from tfcli.render import tokens as render
    from tfcli.render.jsonl import write_jsonl

    out = output_console(width, color)
    texts_in = inputs(texts, file, keep_blank=True)
    tokenizer = noted(core.tokenizer_for(model, revision))
    batches = with_progress(texts_in.batches(core.BATCH_SIZE), "tokenize", len)
    for number, encoding in enumerate(core.run(tokenizer, batches, pair, not no_special, max_length, warn), 1):
        if json_output:
            write_jsonl([render.record(encoding)])
        else:
            print_lines(out, render.token_lines(encoding, number, tokenizer.name, out.width))


def _one_source(positional: str | None, option: str | None) -> str | None:
    """A model source given as the positional SRC or as --model SRC (one habit works everywhere), not both."""
    if positional is not None and option is not None:
        raise usage_error("give the model source once: as SRC or with --model, not both")
    return positional if positional is not None else option


@app.command("config")
def show_config(
    source: Annotated[str | None, typer.Argument(metavar="SRC", show_default=False,
                                                 help="Path, bundled name or hub id (default: bert-base).")] = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    sites: Annotated[bool, typer.Option("--sites", help="List the model's named sites (what run_with_cache keeps "
                                        "and encode --sites saves) with their shapes.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="JSON on stdout: one object.")] = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Print the resolved config of a model source and its parameter count, or with --sites its named sites.

    \b
    Examples:
      tfcli config tiny
      tfcli config --model path/to/checkpoint --json
      tfcli config gpt2-small --sites
    """
    from tfcli.api import describe
    from tfcli.render import config as render
    from tfcli.sources import bundled_names

    summary = describe(_one_source(source, model), revision, sites=sites)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([render.record(summary)])
    else:
        out = output_console(width, color)
        lines = render.site_lines(summary, out.width) if sites else render.config_lines(summary, bundled_names(),
                                                                                          out.width)
        print_lines(out, lines)


@app.command()
def encode(
    texts: TextsArgument = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="Blocks to capture and show in full: 0,-1 or "
                                               "8-11 or -3- (the last three) or all (default: capture all, show the "
                                               "last in full and a line per position for the others).")] = None,
    heads: Annotated[str | None, typer.Option(metavar="HEADS", help="Heads to show, e.g. 0,3 or 0-5 or all "
                                              "(default: their mean).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", metavar="N", callback=NOT_NEGATIVE,
                                              help="The logit lens's top N tokens per layer and position, in a "
                                              "lens table of the layers shown in full and in --json; 0 switches the "
                                              "lens off (default: 3 in --json, no lens table, the top token only in "
                                              "the line per position).")] = None,
    attention_top: Annotated[int | None, typer.Option("--attn-top", metavar="N", callback=AT_LEAST_ONE,
                                                      help="Keys listed per query beside each attention map "
                                                      "(default: up to 3, as many as fit beside it).")] = None,
    pair: PairOption = None,
    max_length: MaxLengthOption = None,
    target: Annotated[str | None, typer.Option(metavar="TEXT", help="Decoder input of an encoder-decoder "
                                               "(default: the start token).")] = None,
    no_truncate: Annotated[bool, typer.Option("--no-truncate", help="Refuse texts longer than the position table "
                                              "(or --max-length).")] = False,
    save: Annotated[Path | None, typer.Option(metavar="FILE", help="Write input_ids, hidden.{i}, attention.{i}, "
                                              "logits (and --sites) to FILE.safetensors.")] = None,
    sites: Annotated[list[str] | None, typer.Option("--sites", metavar="PATTERN", help="Also keep these sites "
                                                    "(names such as blocks.3.attn.z, `*` for any run of characters; "
                                                    "repeatable): a table, in --json and --save under their names. "
                                                    "`tfcli config SRC --sites` lists them.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --save or --report file if it exists.")] = False,
    report: ReportOption = None,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
    no_attention_weights: Annotated[bool, typer.Option("--no-attention-weights", help="With --json: leave each "
                                                       "attention map's query x key `weights` out of the record (its "
                                                       "max_key and max_weight stay): a 512-token record shrinks "
                                                       "from megabytes to kilobytes.")] = False,
    max_capture_mb: Annotated[float, typer.Option("--max-capture-mb", metavar="MB", callback=POSITIVE,
                                                  help="Most memory a batch's captured attention, hidden states "
                                                  "and logits may hold.")] = 1024,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Run a forward pass and show every stage's shape, the attention maps and the logit lens.

    \b
    Examples:
      tfcli encode --model path/to/checkpoint \\
          "The animal didn't cross the street because it was too tired"
      tfcli encode --layers all --heads 0-3 --top-k 5 "time flies like an arrow"
    """
    from tfcli import encode as core
    from tfcli.render import encode as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    if no_attention_weights and not json_output:
        raise usage_error("--no-attention-weights goes with --json", "add --json, or leave it out")
    out = output_console(width, color)
    texts_in = inputs(texts, file)
    if save is not None:
        core.check_save_path(save, overwrite=force)  # before any work, so nothing is lost or overwritten
    if report is not None:
        check_report_path(report, force, texts_in.count or 1)
    source = resolve_source(model, revision)
    options = core.check_options(source.config, layers, heads, core.DEFAULT_TOP_K if top_k is None else top_k, sites)
    options.keep_heads = report is not None  # the page's head selector shows every head behind a mean
    tokenizer = tokenizer_of(source)
    decoder_input = core.decoder_input(source.config, tokenizer, target)
    positions = source.config.max_position_embeddings
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = (tokenized(tokenizer, batch, positions, truncated, pair, max_length, no_truncate)
              for batch in texts_in.batches(None if save is not None else core.MAX_BATCH))
    chunks = started(chunks)
    loaded = build(source, device, dtype, seed)
    every_layer = list(range(max(source.config.num_hidden_layers, core.block_count(source.config))))
    detail = None if layers is None else options.layers if options.layers is not None else every_layer
    view = render.View(detail, attention_top, out.color_system is not None, 1 if top_k is None else top_k,
                       lens=top_k is not None)
    save_to = None if save is None else core.SaveTo(save, force, {
        "tfcli_version": __version__, "model": source.description, "weights": loaded.weights_description})
    number, reported = 0, []  # reported: every text's report, for --report
    for text_report in core.run(loaded, tokenizer, with_progress(chunks, "encode", len), options, decoder_input,
                                max_capture_mb, save_to, warn):
        number += 1
        if json_output:
            write_jsonl([render.record(text_report, loaded.trained, source.weights, seed,
                                       attention_weights=not no_attention_weights)])
        else:
            print_lines(out, render.report_lines(text_report, number, out.width, view))
        if report is not None:
            reported.append(text_report)
    if save is not None:
        say(f"saved {save}", whole=[str(save)])
    truncated.finish(number)
    if report is not None:
        write_report_file(report, "encode", loaded, source, reported, force, detail=detail)
    if not json_output and layers is None:  # last, where it is still on the screen when the run ends
        note("showing the last layer in full and a line per position for every layer; see more with "
             "--layers all (or 2-4, -3-), --heads all, --top-k 5, --json")


@app.command()
def compare(
    arguments: Annotated[list[str] | None, typer.Argument(metavar="SRC TEXT", show_default=False,
                                                          help="A checkpoint directory (config.json + weights), unless "
                                                          "--model gives it, then texts; `-` alone reads stdin.")] = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="float32, float16 or bfloat16: both models run in it.")] = "float32",
    tolerance: Annotated[float | None, typer.Option(metavar="T", callback=POSITIVE, show_default=False,
                                                    help="Largest difference that counts as a match (default: 1e-4 "
                                                    "in float32; in bfloat16 0.05 and in float16 0.01 of each "
                                                    "tensor's largest value).")] = None,
    json_output: JsonOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Run transformers' own model on the same checkpoint and texts; print each tensor's max abs difference.
    Exits 1 when a difference exceeds --tolerance.

    \b
    Examples:
      tfcli compare path/to/checkpoint "time flies like an arrow"
      tfcli compare --model path/to/checkpoint --json - < texts.txt
    """
    from tfcli import compare as core
    from tfcli.render import compare as render
    from tfcli.render.jsonl import write_jsonl

    arguments = list(arguments or [])
    if model is None:
        if not arguments:
            raise usage_error("no model source given", "tfcli compare SRC TEXT... or tfcli compare --model SRC TEXT...")
        model = arguments.pop(0)
    elif arguments and _names_a_model(arguments[0], model):
        raise usage_error("give the model source once: as SRC or with --model, not both",
                          f"with --model every argument is a text: tfcli compare --model {model} TEXT...")
    out = output_console(width, color)
    texts_in = inputs(arguments or None, file)
    batches = started(texts_in.batches(1))
    models = core.load(model, device, revision, dtype)
    noted(models.tokenizer)
    positions = models.resolved.config.max_position_embeddings
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = (tokenized(models.tokenizer, batch, positions, truncated) for batch in batches)
    worst, number, failed, tolerance_said = 0.0, 0, 0, ""
    for comparison in core.run_all(models, chunks, tolerance):
        number += 1
        if number > 1 and not json_output:
            out.print()  # a blank line between texts
        worst = max(worst, comparison.worst_relative if comparison.relative else comparison.worst)
        failed += not comparison.matches
        tolerance_said = render.tolerance_words(comparison)
        if json_output:
            write_jsonl([render.record(comparison)])
        else:
            print_lines(out, render.compare_lines(comparison, number, out.width))
    truncated.finish(number)
    if failed:
        which = f"in {failed} of {number} texts " if number > 1 else ""
        say(f"largest difference {worst:.3g} {which}exceeds {tolerance_said}")
        raise typer.Exit(1)


def _names_a_model(argument: str, model: str) -> bool:
    """Whether compare's first text is in fact a model source (the --model one again, or a checkpoint path): the
    mistake `tfcli compare ckpt --model ckpt hi`, which would otherwise run the path as a text."""
    if argument == model:
        return True
    path = Path(argument)
    try:
        return (path.is_dir() and (path / "config.json").is_file()) or (
            path.is_file() and path.suffix.lower() in (".json", ".yaml", ".yml", ".gguf", ".safetensors", ".bin"))
    except OSError:  # a text too long to be a path
        return False


@app.command()
def classify(
    texts: TextsArgument = None,
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="SRC", help="Model source with a "
                                              "classification head (default: the bundled `classifier`, random "
                                              "weights).")] = None,
    revision: RevisionOption = None,
    top: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE,
                                            help="Show only the N most probable labels in the table.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show what the first token attends to in the last "
                                          "layer(s), mean over heads.")] = False,
    explain_layers: Annotated[int | None, typer.Option("--explain-layers", metavar="N", callback=AT_LEAST_ONE,
                                                       help="Average --explain over the last N layers (default 1).")] = None,
    pair: PairOption = None,
    max_length: MaxLengthOption = None,
    report: ReportOption = None,
    force: ReportForceOption = False,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Classify texts: every label's probability and the prediction; --explain shows why.

    \b
    Examples:
      tfcli classify --model path/to/classifier "I loved this film" "bad acting"
      tfcli classify --model path/to/nli-model --explain "A man is eating." \\
          --pair "Someone eats."
    """
    from tfcli import classify as core
    from tfcli.render import classify as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    if explain_layers is not None and not explain:
        raise usage_error("--explain-layers goes with --explain", "add --explain to see the first token's attention")
    out = output_console(width, color)
    texts_in = inputs(texts, file)
    if report is not None:
        check_report_path(report, force, texts_in.count or 1)
    source = resolve_source(model or "classifier", revision)
    explained = (explain_layers or 1) if explain else 0
    core.check_options(source.config, explained)  # before building a model for nothing
    tokenizer = tokenizer_of(source)
    positions = source.config.max_position_embeddings
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = (tokenized(tokenizer, batch, positions, truncated, pair, max_length)
              for batch in texts_in.batches(core.BATCH_SIZE))
    chunks = started(chunks)
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these probabilities say nothing about the texts")
    results, number = [], 0  # results: for --report
    for result in core.run(loaded, tokenizer, with_progress(chunks, "classify", len), explained):
        number += 1
        if json_output:
            write_jsonl([render.record(result)])
        else:
            if number > 1:
                out.print()  # a blank line between texts
            print_lines(out, render.classification_lines(result, number, out.width, top))
            if result.explanation is not None:
                print_lines(out, render.explanation_lines(result.explanation, out.width))
        if report is not None:
            results.append(result)
    truncated.finish(number)
    if report is not None:
        write_report_file(report, "classify", loaded, source, results, force)


@app.command()
def generate(
    prompts: Annotated[list[str] | None, typer.Argument(metavar="PROMPT", show_default=False,
                                                        help="Prompts to continue; `-` alone reads stdin, one per line.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="SRC", help="Model source with an LM head "
                                              "(default: the bundled `gpt2-small`, random weights).")] = None,
    revision: RevisionOption = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", metavar="N", callback=AT_LEAST_ONE,
                                                help="Stop after N new tokens.")] = 20,
    greedy: Annotated[bool, typer.Option("--greedy", help="Take the most probable token each step (the default "
                                         "when no sampling option is given).")] = False,
    temperature: Annotated[float | None, typer.Option(metavar="T", callback=POSITIVE,
                                                      help="Sample, dividing the logits by T (> 0).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", metavar="K", callback=AT_LEAST_ONE,
                                              help="Sample from the K most probable tokens.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", metavar="P", callback=PROBABILITY,
                                                help="Sample from the most probable tokens whose probabilities "
                                                "add up to P, in (0, 1].")] = None,
    lens: Annotated[bool, typer.Option("--lens", help="Show what each layer would have predicted at every step.")] = False,
    report: ReportOption = None,
    force: ReportForceOption = False,
    file: Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False,
                                              help="Read prompts from FILE, one per line.")] = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: Annotated[int, typer.Option(metavar="N", callback=SEED_RANGE,
                                      help="Seed of the random weights (when the model has none) and of sampling.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, one object per prompt.")] = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Continue prompts token by token: the text appears as it is made, then a step table (probability,
    alternatives, and with --lens each layer's guess).

    \b
    Examples:
      tfcli generate --model path/to/gpt2 -n 10 --lens "time flies like"
      tfcli generate --model path/to/gpt2 --temperature 0.8 --top-p 0.9 \\
          --seed 1 "Once upon a time"
    """
    from tfcli import generate as core
    from tfcli.model.decoding import Sampling
    from tfcli.render import generate as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    do_sample = any(option is not None for option in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise usage_error("--greedy cannot be combined with --temperature, --top-k or --top-p",
                          "leave out --greedy to sample")
    out = output_console(width, color)
    prompts_in = inputs(prompts, file)
    if report is not None:
        check_report_path(report, force, prompts_in.count or 1)
    sampling = Sampling(do_sample, temperature if temperature is not None else 1.0, top_k, top_p, seed)
    source = resolve_source(model or core.DEFAULT_MODEL, revision)
    sampling.check(source.config.vocab_size)  # before the model is built
    tokenizer = tokenizer_of(source)
    batches = (core.prompts(source.config, tokenizer, [item.text for item in batch], max_new_tokens)
               for batch in prompts_in.batches(1))
    batches = started(batches)
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these continuations say nothing about the prompts")
    # the text appears once, as it is made: on stdout when that is the terminal (the table follows without it),
    # else on stderr when that is a terminal (stdout, a file or pipe, gets the text with the table)
    live = sys.stdout if out.is_terminal and not json_output else sys.stderr if err_console.is_terminal else None

    def show_text(piece: str) -> None:
        live.write(piece)
        live.flush()

    generations, number = [], 0  # generations: for --report
    for result in core.run(loaded, tokenizer, batches, sampling, max_new_tokens, lens, show_text if live else None,
                           warn):
        number += 1
        if live:
            show_text("\n")
        if json_output:
            write_jsonl([render.record(result, tokenizer)])
        else:
            print_lines(out, render.generation_lines(result, tokenizer, number, seed if do_sample else None,
                                                     out.width, with_text=live is not sys.stdout))
        if report is not None:
            generations.append(result)
    if report is not None:
        write_report_file(report, "generate", loaded, source, generations, force, tokenizer)


@app.command()
def patch(
    clean: Annotated[str, typer.Argument(metavar="CLEAN", help="The clean text, whose behaviour is restored.",
                                         show_default=False)],
    corrupt: Annotated[str, typer.Argument(metavar="CORRUPT", help="The corrupted text (as many tokens as CLEAN), "
                                           "into which clean activations are put back.", show_default=False)],
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="SRC", help="Model source with an LM, "
                                              "masked-LM or classifier head (default: the bundled `gpt2-small`, "
                                              "random weights).")] = None,
    revision: RevisionOption = None,
    target: Annotated[str, typer.Option(metavar="TOKEN", help="The token whose logit is the metric: one token of the "
                                        "model's tokenizer (\" Mary\" with its leading space for byte-level BPE) or "
                                        "#ID; a classifier's label name or #index.", show_default=False)] = ...,
    foil: Annotated[str | None, typer.Option(metavar="TOKEN", help="The metric is the difference of the logits "
                                             "target - foil.")] = None,
    position: Annotated[int | None, typer.Option(metavar="N", help="The position the metric is read at, negative "
                                                 "counting from the end (default: the last token; a masked-LM "
                                                 "encoder: its [MASK]).")] = None,
    sites: Annotated[str | None, typer.Option(metavar="KINDS", help="Comma-separated: resid, attn, mlp (per layer "
                                              "and position), heads (per layer and head), heads-by-position, q, k, "
                                              "v, pattern (default: resid,attn,mlp,heads).")] = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="activation (patch each site for real), attribution "
                                        "(the first-order estimate from one backward pass) or both.")] = "activation",
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Sites listed.")] = 10,
    report: ReportOption = None,
    force: ReportForceOption = False,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Put back activations of a clean run into a corrupted one, site by site, and see how much of the clean logit
    (difference) each restores (activation patching; attribution patching estimates it from one backward pass).

    \b
    Examples:
      tfcli patch -m path/to/gpt2 --target " Mary" --foil " John" \\
          "When Mary and John went to the store, John gave a drink to" \\
          "When John and Mary went to the store, Mary gave a drink to"
      tfcli patch -m path/to/gpt2 CLEAN CORRUPT --target " Paris" --sites heads \\
          --method both
    """
    import contextlib

    from tfcli import patch as core
    from tfcli.render import patch as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    out = output_console(width, color)
    if report is not None:
        check_report_path(report, force, 1)
    source = resolve_source(model or "gpt2-small", revision)
    options = core.PatchOptions(target, foil, position, core.parse_sites(sites), method)
    tokenizer = tokenizer_of(source)
    core.check_options(source.config, tokenizer, options)  # before the model is built
    try:
        ids_clean, ids_corrupt = core.pair_inputs(source.config, tokenizer, clean, corrupt)
    except core.LengthMismatch as mismatch:
        for line in render.alignment_lines(mismatch.rows, _stderr_width or 80):
            err_console.print(line, soft_wrap=True)
        raise
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these scores say nothing about a trained model")
    with contextlib.ExitStack() as stack:
        progress = None
        if err_console.is_terminal:  # a bar on stderr, gone before the results are printed
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = stack.enter_context(Progress(
                TextColumn("patch"), BarColumn(), MofNCompleteColumn(), TextColumn("sites"), TimeElapsedColumn(),
                console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False))
            task = bar.add_task("patch", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

        result = core.run_ids(loaded, tokenizer, ids_clean, ids_corrupt, options, progress, clean, corrupt)
    if json_output:
        write_jsonl([render.record(result)])
    else:
        print_lines(out, render.patch_lines(result, out.width, out.color_system is not None, top))
    if report is not None:
        write_report_file(report, "patch", loaded, source, [result], force)
    if result.interrupted:
        warn(f"interrupted: {result.done} of {result.total} sites patched")
        raise typer.Exit(130)


@app.command()
def attribute(
    texts: TextsArgument = None,
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="SRC", help="Model source with an LM head "
                                              "(default: the bundled `gpt2-small`, random weights).")] = None,
    revision: RevisionOption = None,
    target: Annotated[str | None, typer.Option(metavar="TOKEN", help="The token whose logit is split: one token of "
                                               "the model's tokenizer (\" Mary\" with its leading space for "
                                               "byte-level BPE) or #ID (default: the model's own top prediction).")] = None,
    foil: Annotated[str | None, typer.Option(metavar="TOKEN", help="Split the difference of the logits target - foil "
                                             "instead.")] = None,
    position: Annotated[int | None, typer.Option(metavar="N", help="The position read, negative counting from the "
                                                 "end (default: the last token).")] = None,
    by: Annotated[str, typer.Option(metavar="WHAT", help="component (embeddings, each layer's attention and MLP), "
                                    "head (each head) or neuron (the largest MLP neurons).")] = "component",
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="With --by head or neuron: the layers broken "
                                               "into heads or neurons, e.g. 8-11 or -3- (default: all).")] = None,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Components listed (with --by neuron, "
                                     "also the neurons kept one by one).")] = 10,
    max_length: MaxLengthOption = None,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
    report: ReportOption = None,
    force: ReportForceOption = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Split a logit (or the difference of two) into the direct contribution of every component that writes to
    the residual stream: embeddings, heads, MLPs, neurons, biases (direct logit attribution).

    \b
    Examples:
      tfcli attribute -m path/to/gpt2 --target " Mary" --foil " John" --by head \\
          "When Mary and John went to the store, John gave a drink to"
      tfcli attribute -m path/to/gpt2 --by neuron --layers -2- \\
          "The capital of France is"
    """
    from tfcli import attribute as core
    from tfcli.encode import parse_indices
    from tfcli.render import attribute as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    out = output_console(width, color)
    texts_in = inputs(texts, file)
    if report is not None:
        check_report_path(report, force, texts_in.count or 1)
    source = resolve_source(model or "gpt2-small", revision)
    core.check_model(source.config, by)  # before the model is built
    selected = parse_indices(layers, source.config.num_hidden_layers, "layers")
    options = core.AttributeOptions(target, foil, position, by, selected, top)
    tokenizer = tokenizer_of(source)
    core.check_options(source.config, tokenizer, options)
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = started(tokenized(tokenizer, batch, source.config.max_position_embeddings, truncated,
                               max_length=max_length) for batch in texts_in.batches(core.BATCH_SIZE))
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these components say nothing about a trained model")
    number, results = 0, []  # results: for --report
    for result in core.run(loaded, tokenizer, with_progress(chunks, "attribute", len), options):
        number += 1
        if json_output:
            write_jsonl([render.record(result)])
        else:
            print_lines(out, render.attribution_lines(result, number, out.width, top))
        if report is not None:
            results.append(result)
    truncated.finish(number)
    if report is not None:
        write_report_file(report, "attribute", loaded, source, results, force)


@app.command()
def heads(
    texts: TextsArgument = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    detect: Annotated[str | None, typer.Option(metavar="DETECTORS", help="Comma-separated: previous, duplicate, "
                                               "induction (scored as TransformerLens's detect_head), first, "
                                               "special, self (mean attention to them), entropy (bits) or all "
                                               "(the default).")] = None,
    exclude_first: Annotated[bool, typer.Option("--exclude-first", help="previous, duplicate, induction: leave out "
                                                "the attention to the first token (exclude_bos).")] = False,
    exclude_self: Annotated[bool, typer.Option("--exclude-self", help="previous, duplicate, induction: leave out "
                                               "the attention of a token to itself (exclude_current_token).")] = False,
    probe: Annotated[str | None, typer.Option(metavar="KIND", help="Run a probe instead of texts: induction (random "
                                              "tokens repeated once, after the start token; --seed draws them).")] = None,
    probe_length: Annotated[int | None, typer.Option("--probe-length", metavar="N", callback=AT_LEAST_ONE,
                                                     help="Random tokens in the probe, before the repeat "
                                                     "(default 50).")] = None,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Heads listed per detector.")] = 5,
    per_text: Annotated[bool, typer.Option("--per-text", help="Also each text's top heads (with --json, one object "
                                           "per text before the run's).")] = False,
    max_length: MaxLengthOption = None,
    report: ReportOption = None,
    force: ReportForceOption = False,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: Annotated[int, typer.Option(metavar="N", callback=SEED_RANGE,
                                      help="Seed of the random weights (when the model has none) and of the "
                                      "probe's tokens.")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="JSON Lines on stdout: one object for the run (with "
                                              "--per-text, one per text before it).")] = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Score every head over a text or a whole corpus: previous-token, duplicate-token and induction heads, and
    the attention to the first token, special tokens and itself, and its entropy.

    \b
    Examples:
      tfcli heads --model path/to/gpt2 --probe induction
      tfcli heads -m bert-base-uncased --detect previous,special --file corpus.txt
    """
    from tfcli import heads as core
    from tfcli.render import heads as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    detectors = core.parse_detectors(detect)
    core.check_probe(probe, probe_length, bool(texts) or file is not None)
    out = output_console(width, color)
    texts_in = inputs(texts, file) if probe is None else None
    if report is not None:
        check_report_path(report, force, 1)  # one report of the run, whatever the number of texts
    source = resolve_source(model, revision)
    options = core.HeadsOptions(detectors, exclude_first, exclude_self, per_text,
                                keep_best=report is not None and report.suffix.lower() == ".html")
    tokenizer = tokenizer_of(source)
    length = probe_length or core.DEFAULT_PROBE_LENGTH
    truncated = CappedWarnings(warn, "texts truncated")
    if probe is not None:
        core.probe_ids(source.config, tokenizer, length, seed)  # its checks, before the model is built
    else:
        chunks = started(tokenized(tokenizer, batch, source.config.max_position_embeddings, truncated,
                                   max_length=max_length) for batch in texts_in.batches(core.CHUNK))
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these scores say nothing about a trained model")
    results = core.run_probe(loaded, tokenizer, options, length, seed) if probe is not None else \
        core.run(loaded, tokenizer, with_progress(chunks, "heads", len), options)
    number, summary = 0, None
    for item in results:
        if isinstance(item, core.TextHeads):
            number += 1
            if json_output:
                write_jsonl([render.text_record(item)])
            else:
                print_lines(out, render.text_lines(item, number, out.width, top))
        else:
            summary = item
    truncated.finish(summary.texts)
    if json_output:
        for line in summary.notes:
            note(line)
        write_jsonl([render.record(summary)])
    else:
        print_lines(out, render.heads_lines(summary, out.width, top))
    if report is not None:
        if options.keep_best:
            core.attach_maps(loaded, summary)
        write_report_file(report, "heads", loaded, source, [summary], force)
