"""tfcli heads: the command line (its options, its session, its output)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import note, output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import inputs, run_dataset, session_of
from tfcli.cli.options import (AT_LEAST_ONE, DatasetFlags, DatasetOptions, FileOption, MaxLengthOption, RunOptions,
                               TextsArgument, shared_options)
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings

@app.command()
@shared_options(dataset=True, without=("dataset", "bootstrap", "per_item", "skip_bad"),
                seed="Seed of the random weights (when the model has none) and of the probe's tokens.",
                json_output="JSON Lines on stdout: one object for the run (with --per-text, one per text before it).")
def heads(
    texts: TextsArgument = None,
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
    file: FileOption = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
) -> None:
    """Score every head over a text or a whole corpus: previous-token, duplicate-token and induction heads, and
    the attention to the first token, special tokens and itself, and its entropy.

    \b
    Examples:
      tfcli heads --model path/to/gpt2 --probe induction
      tfcli heads -m bert-base-uncased --detect previous,special --file corpus.txt
    """
    from tfcli.commands.heads import core, render
    from tfcli.sources import resolve_source

    detectors = core.parse_detectors(detect)
    core.check_probe(probe, probe_length, bool(texts) or file is not None)
    cluster = data.cluster(probe is None, "texts, not --probe")
    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file) if probe is None else None
    if run.report is not None:
        check_report_path(run.report, run.force, 1)  # one report of the run, whatever the number of texts
    source = resolve_source(run.model, run.revision)
    options = core.HeadsOptions(detectors=detectors, exclude_first=exclude_first, exclude_self=exclude_self,
                                per_text=per_text, top=top,
                                keep_best=run.report is not None and run.report.suffix.lower() == ".html")
    views = (View(out, render.text_record, lambda item, number: render.text_lines(item, number, out.width, top)),
             View(out, render.record, lambda scores, number: render.heads_lines(scores, out.width, top)))
    truncated = CappedWarnings(warn, "texts truncated")

    def finish(session, summary: core.Heads) -> None:
        """Said after the texts, before the run's scores: the texts truncated, the notes (in the view itself
        without --json), and for the page, the maps of the texts where each head scores highest."""
        truncated.finish(summary.texts)
        if run.json_output:
            for line in summary.notes:
                note(line)
        if options.keep_best:
            core.attach_maps(session.model, summary)

    if probe is None:
        run_dataset(core.HeadsCorpus(options, max_length, truncated), source,
                    DatasetOptions(path=None, bootstrap=0, per_item=per_text, skip_bad=False, ray=cluster,
                                   texts=texts_in),
                    run, views,
                    "these scores say nothing about a trained model", lambda session, done: finish(session, done.value))
        return
    with session_of(source, run, None, "these scores say nothing about a trained model") as session:
        length = probe_length or core.DEFAULT_PROBE_LENGTH
        core.probe_ids(source.config, session.tokenizer, length, run.seed)  # its checks, before the model is built
        *each_text, summary = core.run_probe(session.model, session.tokenizer, options, length, run.seed)
        emit(each_text, views[0], run.json_output)
        finish(session, summary)
        emit([summary], views[1], run.json_output,
             report=report_of(run.report, run.force, "heads", session.model, source))
