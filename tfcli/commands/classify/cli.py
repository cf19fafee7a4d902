"""tfcli classify: the command line (its options, its session, its output)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import inputs, session_of, started
from tfcli.cli.options import (AT_LEAST_ONE, FileOption, MaxLengthOption, PairOption, RunOptions, TextsArgument,
                               shared_options)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, tokenized

if TYPE_CHECKING:
    from rich.text import Text

@app.command()
@shared_options(model="Model source with a classification head (default: the bundled `classifier`, random weights).")
def classify(
    texts: TextsArgument = None,
    top: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE,
                                            help="Show only the N most probable labels in the table.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show what the first token attends to in the last "
                                          "layer(s), mean over heads.")] = False,
    explain_layers: Annotated[int | None, typer.Option("--explain-layers", metavar="N", callback=AT_LEAST_ONE,
                                                       help="Average --explain over the last N layers (default 1).")] = None,
    pair: PairOption = None,
    max_length: MaxLengthOption = None,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """Classify texts: every label's probability and the prediction; --explain shows why.

    \b
    Examples:
      tfcli classify --model path/to/classifier "I loved this film" "bad acting"
      tfcli classify --model path/to/nli-model --explain "A man is eating." \\
          --pair "Someone eats."
    """
    from tfcli.commands.classify import core, render
    from tfcli.sources import resolve_source

    if explain_layers is not None and not explain:
        raise usage_error("--explain-layers goes with --explain", "add --explain to see the first token's attention")
    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file)
    if run.report is not None:
        check_report_path(run.report, run.force, texts_in.count or 1)
    source = resolve_source(run.model or "classifier", run.revision)
    explained = (explain_layers or 1) if explain else 0
    core.check_options(source.config, explained)  # before building a model for nothing
    with session_of(source, run, None, "these probabilities say nothing about the texts") as session:
        tokenizer = session.tokenizer
        positions = source.config.max_position_embeddings
        truncated = CappedWarnings(warn, "texts truncated")
        chunks = (tokenized(tokenizer, batch, positions, truncated, pair, max_length)
                  for batch in texts_in.batches(core.BATCH_SIZE))
        chunks = started(chunks)
        loaded = session.model

        def lines(result: core.Classification, number: int) -> list[Text]:
            shown = render.classification_lines(result, number, out.width, top)
            why = [] if result.explanation is None else render.explanation_lines(result.explanation, out.width)
            return shown + why

        emit(core.run(loaded, tokenizer, session.counted(chunks, "classify", len), explained),
             View(out, render.record, lines, spaced=True), run.json_output, truncated=truncated,
             report=report_of(run.report, run.force, "classify", loaded, source))
