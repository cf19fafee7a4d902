"""tfcli tokenize: the command line (its options, its session, its output)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.output import View, emit
from tfcli.cli.progress import with_progress
from tfcli.cli.session import inputs, noted
from tfcli.cli.options import FileOption, PairOption, RunOptions, TextsArgument, shared_options

@app.command()
@shared_options(without=("device", "dtype", "seed", "report", "force"))
def tokenize(
    texts: TextsArgument = None,
    pair: PairOption = None,
    no_special: Annotated[bool, typer.Option("--no-special", help="Leave out special tokens ([CLS], [SEP], ...).")] = False,
    max_length: Annotated[int | None, typer.Option("--max-length", metavar="N", help="Truncate to at most N tokens.")] = None,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """Show how texts split into tokens: ids, segments, and the characters each token covers.

    \b
    Examples:
      tfcli tokenize "time flies like an arrow"
      tail -f log.txt | tfcli tokenize --json -
    """
    from tfcli.commands.tokens import core, render

    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file, keep_blank=True)
    tokenizer = noted(core.tokenizer_for(run.model, run.revision))
    batches = with_progress(texts_in.batches(core.BATCH_SIZE), "tokenize", len)
    encodings = core.run(tokenizer, batches, pair, not no_special, max_length, warn)
    emit(encodings, View(out, render.record,
                         lambda encoding, number: render.token_lines(encoding, number, tokenizer.name, out.width)),
         run.json_output)
