"""The `tfcli` command line: each command parses options, calls the core, and hands the result to render.

Results go to stdout (`console`); warnings, progress and errors to stderr (`err_console`).
Heavy modules (torch, transformers, tokenizers) are imported inside the commands, so `--help` is quick.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup
from typer.exceptions import TyperException

from tfcli import __version__
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding

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
            fail(e.message, e.hint, e.exit_code)
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


def batches(items: list, size: int, what: str):
    """Yield (start, items[start:start + size]) in order; with a progress bar on stderr when stderr is a
    terminal, stdout is not (results go to a pipe or file: on a terminal they show progress themselves)
    and there is more than one batch. Never on pipes."""
    spans = range(0, len(items), size)
    if len(spans) <= 1 or not err_console.is_terminal or console.is_terminal:
        for start in spans:
            yield start, items[start:start + size]
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # redirect_stdout=False: rich would otherwise send the results written to sys.stdout to stderr
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        task = progress.add_task(what, total=len(items))
        for start in spans:
            yield start, items[start:start + size]
            progress.advance(task, len(items[start:start + size]))


TextsArgument = Annotated[
    list[str] | None,
    typer.Argument(metavar="TEXT", help="Texts to process; `-` alone reads stdin, one text per line.", show_default=False),
]
FileOption = Annotated[Path | None, typer.Option("--file", "-f", help="Read texts from FILE, one per line.", dir_okay=False)]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Model source: a path, a bundled config name or a Hugging Face hub id."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, one object per text.")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")]
DtypeOption = Annotated[str, typer.Option(help="float32, float16 or bfloat16.")]
SeedOption = Annotated[int, typer.Option(help="Seed of the random weights when the model has none.")]


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
    file: FileOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show how texts split into tokens: ids, segments, and the characters each token covers."""
    from tfcli.tokenizer import load_tokenizer

    inputs = read_texts(texts, file, allow_empty=True)
    tokenizer = load_tokenizer(model)
    pairs = [pair] * len(inputs) if pair is not None else None
    encodings = tokenizer.encode(inputs, pairs, add_special_tokens=not no_special, max_length=max_length)
    warn_truncated(encodings)
    from tfcli.render.jsonl import write_jsonl
    from tfcli.render.tables import token_table

    for start, batch in batches(encodings, 1000, "tokenize"):
        if json_output:
            write_jsonl(_tokenize_record(e) for e in batch)
            continue
        for number, encoding in enumerate(batch, start + 1):
            console.print(token_table(encoding, title=f"text {number}: {encoding.text!r}", caption=tokenizer.name))


def _tokenize_record(encoding: Encoding) -> dict[str, Any]:
    """The JSON Lines record of `tokenize` (keys fixed by DESIGN.md)."""
    record = {"text": encoding.text}
    if encoding.pair is not None:
        record["pair"] = encoding.pair
    return record | {
        "tokens": encoding.tokens,
        "ids": encoding.ids,
        "type_ids": encoding.type_ids,
        "attention_mask": encoding.attention_mask,
        "offsets": encoding.offsets,
    }


# ---------------------------------------------------------------- tfcli config


@app.command("config")
def show_config(
    source: Annotated[str | None, typer.Argument(metavar="SRC", help="Path, bundled name or hub id (default: bert-base).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Print the resolved config of a model source and its parameter count."""
    from tfcli.model.transformer import parameter_count
    from tfcli.sources import bundled_names, resolve_source

    resolved = resolve_source(source)
    config = resolved.config
    parameters = parameter_count(config)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([{"source": resolved.description, "config": config.to_dict(), "parameters": parameters,
                      "weights": str(resolved.weights) if resolved.weights else None}])
        return
    from tfcli.render.tables import key_value_table

    console.print(key_value_table(config.to_dict(), title=f"{config.name}: {resolved.description}",
                                  caption=f"{parameters:,} parameters; bundled configs: {', '.join(bundled_names())}"))


# ---------------------------------------------------------------- tfcli encode


def load_for_command(model: str | None, device: str, dtype: str, seed: int):
    """Model and tokenizer for a command; says on stderr where the weights came from."""
    from tfcli.api import load_model_and_tokenizer

    loaded, tokenizer = load_model_and_tokenizer(model, device=device, dtype=dtype, seed=seed)
    err_console.print(f"model: {loaded.config.name} ({loaded.config.architecture}); weights: "
                      f"{loaded.weights_description}", soft_wrap=True)
    return loaded, tokenizer


def tokenize_for_model(tokenizer, config, texts: list[str], truncate: bool) -> list[Encoding]:
    """Tokenize texts for a model, truncating to its position table (or refusing, with --no-truncate)."""
    encodings = tokenizer.encode(texts, max_length=config.max_position_embeddings)
    for number, encoding in enumerate(encodings, 1):
        if encoding.truncated and not truncate:
            raise usage_error(f"text {number} has {encoding.untruncated_length} tokens, more than the model's "
                              f"{config.max_position_embeddings} positions", "drop --no-truncate to truncate it")
    warn_truncated(encodings)
    return encodings


@app.command()
def encode(
    texts: TextsArgument = None,
    model: ModelOption = None,
    layers: Annotated[str | None, typer.Option(help="Blocks to show, e.g. 0,-1 (default: all).")] = None,
    heads: Annotated[str | None, typer.Option(help="Heads to show, e.g. 0,3 or all (default: their mean).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Top unembedded tokens per layer and position.")] = 3,
    target: Annotated[str | None, typer.Option(help="Decoder input of an encoder-decoder (default: the start token).")] = None,
    no_truncate: Annotated[bool, typer.Option("--no-truncate", help="Refuse texts longer than the position table.")] = False,
    save: Annotated[Path | None, typer.Option(help="Write input_ids, hidden.{i}, attention.{i}, logits to FILE.safetensors.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --save file if it exists.")] = False,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
    max_capture_mb: Annotated[float, typer.Option("--max-capture-mb", metavar="MB", help="Most memory a batch's "
                                                  "captured attention, hidden states and logits may hold.")] = 1024,
) -> None:
    """Run a forward pass and show every stage's shape, the attention maps and the logit lens."""
    from tfcli import inspect
    from tfcli.render import report as render

    inputs = read_texts(texts, file)
    if top_k <= 0:
        raise usage_error(f"--top-k must be at least 1, got {top_k}")
    if save is not None:
        render.check_save_path(save, overwrite=force)  # before any work, so nothing is lost or overwritten
    loaded, tokenizer = load_for_command(model, device, dtype, seed)
    if top_k > loaded.config.vocab_size:
        raise usage_error(f"--top-k {top_k} is larger than the vocabulary ({loaded.config.vocab_size})")
    head_count = loaded.config.num_attention_heads
    selected_heads = None  # None: show the mean over heads
    if heads is not None:
        selected_heads = inspect.parse_indices(heads, head_count, "heads") or list(range(head_count))
    options = inspect.EncodeOptions(layers=inspect.parse_indices(layers, inspect.block_count(loaded), "layers"),
                                    heads=selected_heads, top_k=top_k)
    decoder_input = inspect.decoder_input(loaded, tokenizer, target)
    encodings = tokenize_for_model(tokenizer, loaded.config, inputs, truncate=not no_truncate)
    batch_size, note = inspect.capture_batch_size(loaded, options, encodings, decoder_input, max_capture_mb,
                                                  save is not None)
    if note:
        warn(note)
    for start, batch in batches(encodings, batch_size, "encode"):
        out, model_inputs = inspect.encode_batch(loaded, tokenizer, batch, decoder_input, options)
        for row, encoding in enumerate(batch):
            text_report = inspect.text_report(loaded, out, row, encoding, decoder_input, options, tokenizer)
            if json_output:
                from tfcli.render.jsonl import write_jsonl

                write_jsonl([render.json_record(text_report, loaded.trained)])
            else:
                render.render_report(console, text_report, start + row + 1)
        if save is not None:
            render.save_tensors(save, inspect.saved_tensors(out, model_inputs), overwrite=force)
            err_console.print(f"saved {save}")


# ---------------------------------------------------------------- tfcli compare


@app.command()
def compare(
    source: Annotated[str, typer.Argument(metavar="SRC", help="A checkpoint directory (config.json + weights).")],
    text: Annotated[str, typer.Argument(help="The input text.")],
    device: DeviceOption = "cpu",
    tolerance: Annotated[float, typer.Option(help="Largest difference that counts as a match.")] = 1e-4,
    json_output: JsonOption = False,
) -> None:
    """Run transformers' own model on the same checkpoint and text; print each tensor's max abs difference."""
    import torch

    from tfcli import compare as comparison
    from tfcli.api import build_model
    from tfcli.sources import resolve_source
    from tfcli.tokenizer import load_tokenizer

    resolved = resolve_source(source)
    loaded = build_model(resolved, device=device)
    encoding = tokenize_for_model(load_tokenizer(resolved.tokenizer_dir), loaded.config, [text], truncate=True)[0]
    input_ids = torch.tensor([encoding.ids], device=loaded.embed_tokens.weight.device)
    differences = comparison.compare(loaded, resolved, input_ids)
    worst = max(d.max_abs_diff for d in differences)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([{"text": text, "ids": encoding.ids, "tolerance": tolerance, "max_abs_diff": worst,
                      "tensors": [{"name": d.name, "shape": d.shape, "max_abs_diff": d.max_abs_diff}
                                  for d in differences]}])
    else:
        from tfcli.render.tables import compare_table

        console.print(compare_table(differences, f"tfcli vs transformers on {source}", tolerance))
    if worst > tolerance:
        err_console.print(f"largest difference {worst:.3g} exceeds {tolerance:g}")
        raise typer.Exit(1)


# ---------------------------------------------------------------- tfcli classify


@app.command()
def classify(
    texts: TextsArgument = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model source with a classification head "
                                              "(default: the bundled `classifier`, random weights).")] = None,
    top: Annotated[int | None, typer.Option(metavar="N", help="Show only the N most probable labels in the table.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show what the first token attends to in the last layer(s), mean over heads.")] = False,
    explain_layers: Annotated[int, typer.Option("--explain-layers", metavar="N", help="Average --explain over the last N layers.")] = 1,
    file: FileOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: JsonOption = False,
) -> None:
    """Classify texts: every label's probability and the prediction; --explain shows why."""
    from tfcli.classify import classify as run_classify
    from tfcli.classify import require_classifier

    inputs = read_texts(texts, file)
    if top is not None and top < 1:
        raise usage_error(f"--top must be at least 1, got {top}")
    from tfcli.sources import resolve_source

    require_classifier(resolve_source(model or "classifier").config)  # before building a model for nothing
    loaded, tokenizer = load_for_command(model or "classifier", device, dtype, seed)
    if not loaded.trained:
        warn("random weights: these probabilities say nothing about the texts")
    encodings = tokenize_for_model(tokenizer, loaded.config, inputs, truncate=True)
    results = run_classify(loaded, tokenizer, encodings, explain=explain_layers if explain else 0)
    if json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl(result.record() for result in results)
        return
    from tfcli.render.classify import classification_table, heat_strip

    for number, result in enumerate(results, 1):
        console.print(classification_table(result, number, top))
        if result.explanation is not None:
            console.print(heat_strip(result.explanation))


# ---------------------------------------------------------------- tfcli generate


@app.command()
def generate(
    prompts: Annotated[list[str] | None, typer.Argument(metavar="PROMPT", show_default=False,
                                                        help="Prompts to continue; `-` alone reads stdin, one per line.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model source with an LM head "
                                              "(default: the bundled `gpt2-small`, random weights).")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", metavar="N", help="Stop after N new tokens.")] = 20,
    greedy: Annotated[bool, typer.Option("--greedy", help="Take the most probable token each step (the default "
                                         "when no sampling option is given).")] = False,
    temperature: Annotated[float | None, typer.Option(metavar="T", help="Sample, dividing the logits by T (> 0).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", metavar="K", help="Sample from the K most probable tokens.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", metavar="P", help="Sample from the most probable tokens "
                                                "whose probabilities add up to P, in (0, 1].")] = None,
    lens: Annotated[bool, typer.Option("--lens", help="Show what each layer would have predicted at every step.")] = False,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: Annotated[int, typer.Option(help="Seed of the random weights (when the model has none) and of sampling.")] = 0,
    json_output: JsonOption = False,
) -> None:
    """Continue prompts token by token: the text streams to stderr as it is made, then a step table
    (probability, alternatives, and with --lens each layer's guess) on stdout."""
    from tfcli import generation
    from tfcli.model.generate import Sampling

    inputs = read_texts(prompts, None)
    do_sample = any(option is not None for option in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise usage_error("--greedy cannot be combined with --temperature, --top-k or --top-p",
                          "leave out --greedy to sample")
    sampling = Sampling(do_sample, temperature if temperature is not None else 1.0, top_k, top_p, seed)
    sampling.check()
    if max_new_tokens <= 0:
        raise usage_error(f"--max-new-tokens must be 1 or more, got {max_new_tokens}")
    loaded, tokenizer = load_for_command(model or generation.DEFAULT_MODEL, device, dtype, seed)
    prompt_ids = [generation.prompt_ids(loaded, tokenizer, prompt) for prompt in inputs]
    budgets = [generation.max_new_tokens_that_fit(loaded, len(ids), max_new_tokens) for ids in prompt_ids]
    live = err_console.is_terminal

    def show(piece: str) -> None:
        sys.stderr.write(piece)
        sys.stderr.flush()

    for number, (prompt, ids, budget) in enumerate(zip(inputs, prompt_ids, budgets), 1):
        if budget < max_new_tokens:
            warn(f"prompt {number}: only {budget} new tokens fit in the model's "
                 f"{loaded.config.max_position_embeddings} positions")
        result = generation.run(loaded, tokenizer, prompt, ids, budget, sampling, lens=lens,
                                on_text=show if live else None)
        if live:
            show("\n")
        if json_output:
            from tfcli.render.jsonl import write_jsonl
            from tfcli.render.generate import generate_record

            write_jsonl([generate_record(result, tokenizer)])
            continue
        from tfcli.render.generate import step_table

        console.print(result.full_text, soft_wrap=True)
        ended = "stopped at end of sequence" if result.stopped_at_eos else f"{len(result.steps)} new tokens"
        mode = "greedy" if not do_sample else f"sampled (seed {seed})"
        console.print(step_table(result, tokenizer, f"prompt {number}: {ended}, {mode}"))
