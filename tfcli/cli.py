"""The `tfcli` command line: each command parses options, calls its core module (`tfcli/<command>.py`),
and hands the result to its renderer (`tfcli/render/<command>.py`). No model logic lives here.

Option ranges are checked where the options are declared; what depends on the model is checked by
the core against the config, before any model is built, and reported with the option's name.
Results go to stdout (`console`); warnings, progress and errors to stderr (`err_console`).
Heavy modules (torch, transformers, tokenizers) are imported inside the commands, so `--help` is quick.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup
from typer.exceptions import TyperException

from tfcli import __version__
from tfcli.errors import TfcliError, usage_error
from tfcli.render.report_file import check_report_path

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.sources import Source
    from tfcli.tokenizer import Encoding

T = TypeVar("T")

# rich drops colour by itself when NO_COLOR is set or the stream is not a terminal. Piped tables get
# a wide page (or $COLUMNS) so that files and pagers receive whole cells rather than truncated ones.
console = Console(highlight=False, markup=False, emoji=False,
                  width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 200))
err_console = Console(stderr=True, highlight=False, markup=False, emoji=False)


class _ErrorReportingGroup(TyperGroup):
    """Turns TfcliError, and any unexpected exception, into `error:` / `hint:` lines and an exit code."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TfcliError as e:
            fail(option_words(e), e.hint, e.exit_code)
        except (TyperException, typer.Exit, typer.Abort, BrokenPipeError):
            raise  # typer handles these: usage errors, exits, Ctrl-C (130), closed pipes
        except Exception as e:
            if os.environ.get("TFCLI_DEBUG") == "1":
                raise
            fail(f"unexpected {type(e).__name__}: {e}", "this is a bug in tfcli; TFCLI_DEBUG=1 shows the traceback", 1)


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


def fail(message: str, hint: str | None, exit_code: int) -> None:
    """Print `error: message` (and `hint: hint`) on stderr and exit."""
    err_console.print(f"error: {message}", soft_wrap=True)
    if hint:
        err_console.print(f"hint: {hint}", soft_wrap=True)
    raise typer.Exit(exit_code)


def warn(message: str) -> None:
    err_console.print(f"warning: {message}", soft_wrap=True)


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
POSITIVE = requires(lambda value: value > 0, "must be positive")
PROBABILITY = requires(lambda value: 0 < value <= 1, "must be in (0, 1]")
SEED_RANGE = requires(lambda value: 0 <= value < 2**64, "must be between 0 and 2**64 - 1")


def read_texts(texts: list[str] | None, file: Path | None, allow_empty: bool = False) -> list[str]:
    """The input texts: the arguments, stdin (one per line) when `-` is the only argument, or FILE's lines.
    An empty or whitespace-only text is refused unless allow_empty (tokenize shows its special tokens):
    a forward pass over it says nothing about any text."""
    source = None  # where lines came from, for messages
    if file is not None:
        if texts:
            raise usage_error("give texts as arguments or with --file, not both")
        try:
            texts, source = _lines(file.read_bytes(), str(file)), str(file)
        except OSError as e:
            raise usage_error(f"cannot read {file}: {e.strerror}") from e
    elif texts == ["-"]:
        texts, source = _lines(sys.stdin.buffer.read(), "stdin"), "stdin"
    if not texts:
        raise usage_error("no text given", "pass texts as arguments, `-` to read stdin, or --file PATH")
    for number, text in enumerate([] if allow_empty else texts, 1):
        if not text.strip():
            where = f" (line {number} of {source})" if source else ""
            raise usage_error(f"text {number}{where} is {'only whitespace' if text else 'empty'}: there is nothing to run",
                              "give some text" + ("; drop blank lines first, e.g. with `grep -v '^[[:space:]]*$'`"
                                                  if source else ""))
    return texts


def _lines(data: bytes, source: str) -> list[str]:
    """Decode UTF-8 bytes into lines (without their line endings); a bad byte is the user's error."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise TfcliError(
            f"{source} is not valid UTF-8: line {line}, byte offset {e.start}",
            "convert it first, e.g. `iconv -f latin1 -t utf-8`",
        ) from e
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def warn_truncated(encodings: list[Encoding], shown: int = 5) -> None:
    """One warning per truncated text, the first `shown` of them, then a count (a stream stays readable)."""
    truncated = [(number, e) for number, e in enumerate(encodings, 1) if e.truncated]
    for number, encoding in truncated[:shown]:
        warn(f"text {number} truncated from {encoding.untruncated_length} to {len(encoding.ids)} tokens")
    if len(truncated) > shown:
        warn(f"{len(truncated) - shown} more texts truncated ({len(truncated)} of {len(encodings)} in all)")


def with_progress(batches: Iterable[T], total: int, batch_size: int, what: str, count: Callable[[T], int]) -> Iterator[T]:
    """Yield the batches in order; with a progress bar on stderr (advanced by count(batch) after each)
    when stderr is a terminal, stdout is not (results go to a pipe or file: on a terminal they show
    progress themselves) and there is more than one batch. Never on pipes."""
    if total <= batch_size or not err_console.is_terminal or console.is_terminal:
        yield from batches
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # redirect_stdout=False: rich would otherwise send the results written to sys.stdout to stderr
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task(what, total=total)
        for batch in batches:
            yield batch
            progress.advance(task, count(batch))


def build(source: Source, device: str, dtype: str, seed: int) -> TransformerModel:
    """The model of a resolved source; says on stderr where its weights came from."""
    from tfcli.api import build_model

    model = build_model(source, device=device, dtype=dtype, seed=seed)
    err_console.print(f"model: {model.config.name} ({model.config.architecture}); weights: "
                      f"{model.weights_description}", soft_wrap=True)
    return model


def write_report_file(path: Path, command: str, model: TransformerModel, source: Source, items: list[Any],
                      overwrite: bool, tokenizer: Any = None) -> None:
    """Write --report PATH from a command's report objects, and say so on stderr."""
    from tfcli.render.report_file import run_info, write_report

    write_report(path, run_info(command, model, source.description), items, overwrite, tokenizer)
    err_console.print(f"wrote {path}")


TextsArgument = Annotated[
    list[str] | None,
    typer.Argument(metavar="TEXT", help="Texts to process; `-` alone reads stdin, one text per line.", show_default=False),
]
FileOption = Annotated[Path | None, typer.Option("--file", "-f", help="Read texts from FILE, one per line.", dir_okay=False)]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model source: a path, a bundled config name or a Hugging Face hub id."),
]
RevisionOption = Annotated[str | None, typer.Option(help="Branch, tag or commit of a Hugging Face hub model.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, one object per text.")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")]
DtypeOption = Annotated[str, typer.Option(help="float32, float16 or bfloat16.")]
SeedOption = Annotated[int, typer.Option(help="Seed of the random weights when the model has none.", callback=SEED_RANGE)]
ReportOption = Annotated[Path | None, typer.Option(
    "--report", metavar="PATH", dir_okay=False,
    help="Also write the results to PATH: an interactive page (.html) or a figure (.svg, .png, .pdf).")]
ReportForceOption = Annotated[bool, typer.Option("--force", help="Overwrite the --report file if it exists.")]


# ---------------------------------------------------------------- commands


def _show_version(value: bool) -> None:
    if value:
        console.print(f"tfcli {__version__}")
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
    pair: Annotated[str | None, typer.Option(help="Second segment, paired with every text.")] = None,
    no_special: Annotated[bool, typer.Option("--no-special", help="Leave out special tokens ([CLS], [SEP], ...).")] = False,
    max_length: Annotated[int | None, typer.Option(metavar="N", help="Truncate to at most N tokens.")] = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    file: FileOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show how texts split into tokens: ids, segments, and the characters each token covers."""
    from tfcli import tokenize as core
    from tfcli.render import tokenize as render
    from tfcli.render.jsonl import write_jsonl

    tokenized = core.run(read_texts(texts, file, allow_empty=True), model, pair, not no_special, max_length,
                         revision)
    encodings = tokenized.encodings
    warn_truncated(encodings)
    size = 1000
    chunks = (encodings[start:start + size] for start in range(0, len(encodings), size))
    number = 0
    for chunk in with_progress(chunks, len(encodings), size, "tokenize", len):
        if json_output:
            write_jsonl(render.record(e) for e in chunk)
            continue
        for encoding in chunk:
            number += 1
            console.print(render.token_table(encoding, number, tokenized.tokenizer_name))


@app.command("config")
def show_config(
    source: Annotated[str | None, typer.Argument(metavar="SRC", help="Path, bundled name or hub id (default: bert-base).")] = None,
    revision: RevisionOption = None,
    json_output: JsonOption = False,
) -> None:
    """Print the resolved config of a model source and its parameter count."""
    from tfcli.api import describe
    from tfcli.render import config as render
    from tfcli.sources import bundled_names

    summary = describe(source, revision)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([render.record(summary)])
    else:
        console.print(render.config_table(summary, bundled_names()))


@app.command()
def encode(
    texts: TextsArgument = None,
    model: ModelOption = None,
    revision: RevisionOption = None,
    layers: Annotated[str | None, typer.Option(help="Blocks to show, e.g. 0,-1 (default: all).")] = None,
    heads: Annotated[str | None, typer.Option(help="Heads to show, e.g. 0,3 or all (default: their mean).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Top unembedded tokens per layer and position.",
                                       callback=AT_LEAST_ONE)] = 3,
    target: Annotated[str | None, typer.Option(help="Decoder input of an encoder-decoder (default: the start token).")] = None,
    no_truncate: Annotated[bool, typer.Option("--no-truncate", help="Refuse texts longer than the position table.")] = False,
    save: Annotated[Path | None, typer.Option(help="Write input_ids, hidden.{i}, attention.{i}, logits to FILE.safetensors.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --save or --report file if it exists.")] = False,
    report: ReportOption = None,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
    max_capture_mb: Annotated[float, typer.Option("--max-capture-mb", metavar="MB", callback=POSITIVE,
                                                  help="Most memory a batch's captured attention, hidden states "
                                                  "and logits may hold.")] = 1024,
) -> None:
    """Run a forward pass and show every stage's shape, the attention maps and the logit lens."""
    from tfcli import encode as core
    from tfcli.api import load_tokenizer_for
    from tfcli.render import encode as render
    from tfcli.render.jsonl import write_jsonl
    from tfcli.sources import resolve_source

    inputs = read_texts(texts, file)
    if save is not None:
        render.check_save_path(save, overwrite=force)  # before any work, so nothing is lost or overwritten
    if report is not None:
        check_report_path(report, force, len(inputs))
    source = resolve_source(model, revision)
    options = core.check_options(source.config, layers, heads, top_k)
    options.keep_heads = report is not None  # the page's head selector shows every head behind a mean
    tokenizer = load_tokenizer_for(source)
    decoder_input = core.decoder_input(source.config, tokenizer, target)
    encodings = tokenizer.encode_for_model(inputs, source.config.max_position_embeddings, truncate=not no_truncate)
    warn_truncated(encodings)
    loaded = build(source, device, dtype, seed)
    batch_size, note = core.capture_batch_size(loaded, options, encodings, decoder_input, max_capture_mb,
                                               save is not None)
    if note:
        warn(note)
    number = 0
    reported = []  # every text's report, for --report
    batches = core.run(loaded, tokenizer, encodings, options, decoder_input, batch_size, keep_tensors=save is not None)
    for batch in with_progress(batches, len(encodings), batch_size, "encode", lambda b: len(b.reports)):
        for text_report in batch.reports:
            number += 1
            if json_output:
                write_jsonl([render.record(text_report, loaded.trained)])
            else:
                render.print_report(console, text_report, number)
        if report is not None:
            reported += batch.reports
        if save is not None:
            render.save_tensors(save, batch.tensors, overwrite=force)
            err_console.print(f"saved {save}")
    if report is not None:
        write_report_file(report, "encode", loaded, source, reported, force)


@app.command()
def compare(
    source: Annotated[str, typer.Argument(metavar="SRC", help="A checkpoint directory (config.json + weights).")],
    text: Annotated[str, typer.Argument(help="The input text.")],
    device: DeviceOption = "cpu",
    tolerance: Annotated[float, typer.Option(help="Largest difference that counts as a match.")] = 1e-4,
    json_output: JsonOption = False,
) -> None:
    """Run transformers' own model on the same checkpoint and text; print each tensor's max abs difference."""
    from tfcli import compare as core
    from tfcli.render import compare as render

    comparison = core.run(source, text, device, tolerance)
    warn_truncated([comparison.encoding])
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([render.record(comparison)])
    else:
        console.print(render.compare_table(comparison))
    if not comparison.matches:
        err_console.print(f"largest difference {comparison.worst:.3g} exceeds {tolerance:g}")
        raise typer.Exit(1)


@app.command()
def classify(
    texts: TextsArgument = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model source with a classification head "
                                              "(default: the bundled `classifier`, random weights).")] = None,
    revision: RevisionOption = None,
    top: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE,
                                            help="Show only the N most probable labels in the table.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show what the first token attends to in the last layer(s), mean over heads.")] = False,
    explain_layers: Annotated[int, typer.Option("--explain-layers", metavar="N", callback=AT_LEAST_ONE,
                                                help="Average --explain over the last N layers.")] = 1,
    report: ReportOption = None,
    force: ReportForceOption = False,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
) -> None:
    """Classify texts: every label's probability and the prediction; --explain shows why."""
    from tfcli import classify as core
    from tfcli.api import load_tokenizer_for
    from tfcli.render import classify as render
    from tfcli.sources import resolve_source

    inputs = read_texts(texts, file)
    if report is not None:
        check_report_path(report, force, len(inputs))
    source = resolve_source(model or "classifier", revision)
    core.require_classifier(source.config)  # before building a model for nothing
    tokenizer = load_tokenizer_for(source)
    encodings = tokenizer.encode_for_model(inputs, source.config.max_position_embeddings)
    loaded = build(source, device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these probabilities say nothing about the texts")
    warn_truncated(encodings)
    results = core.run(loaded, tokenizer, encodings, explain=explain_layers if explain else 0)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl(render.record(result) for result in results)
    else:
        for number, result in enumerate(results, 1):
            console.print(render.classification_table(result, number, top))
            if result.explanation is not None:
                console.print(render.heat_strip(result.explanation))
    if report is not None:
        write_report_file(report, "classify", loaded, source, results, force)


@app.command()
def generate(
    prompts: Annotated[list[str] | None, typer.Argument(metavar="PROMPT", show_default=False,
                                                        help="Prompts to continue; `-` alone reads stdin, one per line.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model source with an LM head "
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
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: Annotated[int, typer.Option(help="Seed of the random weights (when the model has none) and of sampling.",
                                      callback=SEED_RANGE)] = 0,
    json_output: JsonOption = False,
) -> None:
    """Continue prompts token by token: the text streams to stderr as it is made, then a step table
    (probability, alternatives, and with --lens each layer's guess) on stdout."""
    from tfcli import generate as core
    from tfcli.api import load_tokenizer_for
    from tfcli.model.decoding import Sampling
    from tfcli.render import generate as render
    from tfcli.sources import resolve_source

    inputs = read_texts(prompts, None)
    if report is not None:
        check_report_path(report, force, len(inputs))
    do_sample = any(option is not None for option in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise usage_error("--greedy cannot be combined with --temperature, --top-k or --top-p",
                          "leave out --greedy to sample")
    sampling = Sampling(do_sample, temperature if temperature is not None else 1.0, top_k, top_p, seed)
    source = resolve_source(model or core.DEFAULT_MODEL, revision)
    tokenizer = load_tokenizer_for(source)
    prepared = core.prompts(source.config, tokenizer, inputs, max_new_tokens)
    loaded = build(source, device, dtype, seed)
    live = err_console.is_terminal

    def show(piece: str) -> None:
        sys.stderr.write(piece)
        sys.stderr.flush()

    generations = []  # for --report
    for number, prompt in enumerate(prepared, 1):
        if prompt.budget < max_new_tokens:
            warn(f"prompt {number}: only {prompt.budget} new tokens fit in the model's "
                 f"{loaded.config.max_position_embeddings} positions")
        result = core.run(loaded, tokenizer, prompt, sampling, lens=lens, on_text=show if live else None)
        if live:
            show("\n")
        if json_output:
            from tfcli.render.jsonl import write_jsonl

            write_jsonl([render.record(result, tokenizer)])
        else:
            render.print_generation(console, result, tokenizer, number, seed if do_sample else None)
        generations.append(result)
    if report is not None:
        write_report_file(report, "generate", loaded, source, generations, force, tokenizer)
