"""tfcli encode: the command line (its options, its session, its output)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli import __version__
from tfcli.cli.app import app
from tfcli.cli.console import note, output_console, say, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import ablation_of, inputs, session_of, started
from tfcli.cli.options import (AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE, AblateOption, FileOption, MaxLengthOption,
                               PairOption, RunOptions, TextsArgument, shared_options)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, tokenized

@app.command()
@shared_options(force="Overwrite the --save or --report file if it exists.")
def encode(
    texts: TextsArgument = None,
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
    lens: Annotated[str, typer.Option(metavar="logit|tuned:DIR", help="The lens each layer is read through: the "
                                      "logit lens, or a tuned lens's folder (tfcli lens fit, tuned-lens), whose "
                                      "table it shows.")] = "logit",
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
    ablate: AblateOption = None,
    file: FileOption = None,
    no_attention_weights: Annotated[bool, typer.Option("--no-attention-weights", help="With --json: leave each "
                                                       "attention map's query x key `weights` out of the record (its "
                                                       "max_key and max_weight stay): a 512-token record shrinks "
                                                       "from megabytes to kilobytes.")] = False,
    max_capture_mb: Annotated[float, typer.Option("--max-capture-mb", metavar="MB", callback=POSITIVE,
                                                  help="Most memory a batch's captured attention, hidden states "
                                                  "and logits may hold.")] = 1024,
    *,
    run: RunOptions,
) -> None:
    """Run a forward pass and show every stage's shape, the attention maps and the logit lens.

    \b
    Examples:
      tfcli encode --model path/to/checkpoint \\
          "The animal didn't cross the street because it was too tired"
      tfcli encode --layers all --heads 0-3 --top-k 5 "time flies like an arrow"
    """
    from tfcli.analysis.tuned_lens import check_lens, lens_folder, read_lens
    from tfcli.commands.encode import core, render
    from tfcli.sources import resolve_source

    if no_attention_weights and not run.json_output:
        raise usage_error("--no-attention-weights goes with --json", "add --json, or leave it out")
    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file)
    if save is not None:
        core.check_save_path(save, overwrite=run.force)  # before any work, so nothing is lost or overwritten
    if run.report is not None:
        check_report_path(run.report, run.force, texts_in.count or 1)
    source = resolve_source(run.model, run.revision)
    tuned = lens_folder(lens)
    if tuned is not None:
        check_lens(tuned, source.config)
    options = core.check_options(source.config, layers, heads, core.DEFAULT_TOP_K if top_k is None else top_k, sites)
    options.keep_heads = run.report is not None  # the page's head selector shows every head behind a mean
    options.ablation = ablation_of(ablate, source.config)
    with session_of(source, run, None) as session:
        tokenizer = session.tokenizer
        decoder_input = core.decoder_input(source.config, tokenizer, target)
        positions = source.config.max_position_embeddings
        truncated = CappedWarnings(warn, "texts truncated")
        chunks = (tokenized(tokenizer, batch, positions, truncated, pair, max_length, no_truncate)
                  for batch in texts_in.batches(None if save is not None else core.MAX_BATCH))
        chunks = started(chunks)
        loaded = session.model
        options.tuned = None if tuned is None else read_lens(tuned, loaded, "--lens")
        every_layer = list(range(max(source.config.num_hidden_layers, source.config.output_layers)))
        detail = None if layers is None else options.layers if options.layers is not None else every_layer
        view = render.View(detail, attention_top, out.color_system is not None, 1 if top_k is None else top_k,
                           lens=top_k is not None or tuned is not None)
        save_to = None if save is None else core.SaveTo(save, run.force, {
            "tfcli_version": __version__, "model": source.description, "weights": loaded.weights_description})
        reports = core.run(loaded, tokenizer, session.counted(chunks, "encode", len), options, decoder_input,
                           max_capture_mb, save_to, warn)
        emit(reports, View(out, lambda text_report: render.record(text_report, loaded.trained, source.weights, run.seed,
                                                                  attention_weights=not no_attention_weights),
                           lambda text_report, number: render.report_lines(text_report, number, out.width, view)),
             run.json_output, after=None if save is None else lambda: say(f"saved {save}", whole=[str(save)]),
             truncated=truncated, report=report_of(run.report, run.force, "encode", loaded, source, detail=detail))
        if not run.json_output and layers is None:  # last, where it is still on the screen when the run ends
            note("showing the last layer in full and a line per position for every layer; see more with "
                 "--layers all (or 2-4, -3-), --heads all, --top-k 5, --json")
