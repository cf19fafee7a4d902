"""The commands that ask why a model does what it does: patch (activation and attribution patching), attribute
(direct logit attribution) and heads (what every head does). Each declares and resolves its options, builds what
it needs through `tfcli.cli.session`, calls its core module (`tfcli/<command>.py`) and shows what that yields
through `emit` and the renderer of the same name in `tfcli/render/`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import note, output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import ablation_of, inputs, pair_ids, run_dataset, session_of, started, warn_spacing
from tfcli.cli.options import (AT_LEAST_ONE, AblateOption, DatasetFlags, DatasetOptions, FileOption, FoilOption,
                               MaxLengthOption, PositionOption, RunOptions, TargetOption, TextsArgument, shared_options,
                               with_help)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, tokenized


# the metric options in this module's words (declared once in cli/options.py)
PATCH_TARGET = with_help(TargetOption, "The token whose logit is the metric: one token of the model's tokenizer (\" "
                                       "Mary\" with its leading space for byte-level BPE) or #ID; a classifier's label "
                                       "name or #index (with --dataset: each line's).")
PATCH_POSITION = with_help(PositionOption, "The position the metric is read at, negative counting from the end "
                                           "(default: the last token; a masked-LM encoder: its [MASK]).")
ATTRIBUTE_TARGET = with_help(TargetOption, "The token whose logit is split: one token of the model's tokenizer (\" "
                                           "Mary\" with its leading space for byte-level BPE) or #ID (default: the "
                                           "model's own top prediction).")
ATTRIBUTE_FOIL = with_help(FoilOption, "Split the difference of the logits target - foil instead.")
ATTRIBUTE_POSITION = with_help(PositionOption, "The position read, negative counting from the end (default: the last "
                                               "token).")


@app.command()
@shared_options(default_model="gpt2-small", dataset=True,
                model="Model source with an LM, masked-LM or classifier head (default: the bundled `gpt2-small`, "
                      "random weights).",
                json_output="One JSON object on stdout (with --dataset: the aggregate, after each item's with "
                            "--per-item).")
def patch(
    clean: Annotated[str | None, typer.Argument(metavar="CLEAN", help="The clean text, whose behaviour is "
                                                "restored.", show_default=False)] = None,
    corrupt: Annotated[str | None, typer.Argument(metavar="CORRUPT", help="The corrupted text (as many tokens as "
                                                  "CLEAN), into which clean activations are put back.",
                                                  show_default=False)] = None,
    target: PATCH_TARGET = None,
    foil: FoilOption = None,
    position: PATCH_POSITION = None,
    sites: Annotated[str | None, typer.Option(metavar="KINDS", help="Comma-separated: resid, attn, mlp (per layer "
                                              "and position), heads (per layer and head), heads-by-position, q, k, "
                                              "v, pattern (default: resid,attn,mlp,heads).")] = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="activation (patch each site for real), attribution "
                                        "(the first-order estimate from one backward pass) or both.")] = "activation",
    positions: Annotated[str | None, typer.Option(metavar="POSITIONS", help="The positions resid, attn, mlp and "
                                                  "heads-by-position patch, e.g. 20- or -5- or 3,7 (negative "
                                                  "counting from the end; default: all).")] = None,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Sites listed per site "
                                     "kind.")] = 5,
    full: Annotated[bool, typer.Option("--full", help="Show every grid whole (by default the view leaves out the "
                                       "rows and columns with no |score| of 0.05 or more, naming them).")] = False,
    align: Annotated[str | None, typer.Option(metavar="WHERE", help="With --dataset of pairs of different lengths: "
                                              "end (positions counted back from the metric's: -1, -2, ...).")] = None,
    ablate: AblateOption = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
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
      tfcli patch -m path/to/gpt2 LONG_CLEAN LONG_CORRUPT --target " Paris" \\
          --sites resid --positions -5-
      tfcli task ioi -m path/to/gpt2 --n 100 > ioi.jsonl
      tfcli patch -m path/to/gpt2 --dataset ioi.jsonl --sites heads
    """
    from tfcli import patch as core
    from tfcli.render import patch as render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if run.report is not None:
        check_report_path(run.report, run.force, 1)
    cluster = data.cluster(data.dataset is not None, "a --dataset")
    if data.dataset is not None:
        if clean is not None:
            raise usage_error("give CLEAN CORRUPT or --dataset, not both")
        data.each_line_has(target=target, foil=foil, position=position)
        source = resolve_source(run.model, run.revision)
        options = core.PatchOptions(target="", sites=core.parse_sites(sites), method=method,
                                    ablation=ablation_of(ablate, source.config))
        core.check_sweep(source.config, options)
        run_dataset(core.PatchDataset(options, align, positions, top), source, data.options(cluster), run,
                    (View(out, render.record, lambda result, number: render.patch_lines(
                        result, out.width, out.color_system is not None, top, full)),
                     View(out, render.dataset_record, lambda done, number: render.dataset_lines(
                         done, out.width, out.color_system is not None, top, full),
                          report=(render.dataset_page_section, render.dataset_figure), of_run=True)),
                    "these scores say nothing about a trained model")
        return
    if align is not None:
        raise usage_error("--align is for a --dataset")
    data.only_with_a_dataset("bootstrap", "per_item", "skip_bad")
    if clean is None or corrupt is None:
        raise usage_error("give a CLEAN and a CORRUPT text (or --dataset FILE)")
    if target is None:
        raise usage_error("give --target: the token whose logit is the metric", parameter="target")
    source = resolve_source(run.model, run.revision)
    options = core.PatchOptions(target=target, foil=foil, position=position, sites=core.parse_sites(sites),
                                method=method, ablation=ablation_of(ablate, source.config))
    with session_of(source, run, None, "these scores say nothing about a trained model") as session:
        tokenizer = session.tokenizer
        warn_spacing(tokenizer, target, foil)
        core.check_options(source.config, tokenizer, options)  # before the model is built
        ids_clean, ids_corrupt = pair_ids(source, tokenizer, clean, corrupt)
        options.positions = core.parse_positions(positions, len(ids_clean))
        loaded = session.model
        with session.progress("patch", "sites") as progress:
            result = core.run_ids(loaded, tokenizer, ids_clean, ids_corrupt, options, progress, texts=(clean, corrupt))
    result.top = top  # the page lists as many as the terminal
    if result.small_gap:
        warn(f"the corrupt text barely moves the metric (clean {result.clean_value:+.4f}, corrupt "
             f"{result.corrupt_value:+.4f}): the scores, divided by that gap, read small changes as large ones")
    emit([result], View(out, render.record, lambda patching, number: render.patch_lines(
        patching, out.width, out.color_system is not None, top, full)),
         run.json_output, report=report_of(run.report, run.force, "patch", loaded, source))
    if result.interrupted:
        warn(f"interrupted: {result.done} of {result.total} sites patched")
        raise typer.Exit(130)


def saes_of(paths: list[Path] | None, config) -> tuple:
    """The SAEs of --sae, each checked against the model's sites, as one whose features write to the residual
    stream and as one that reads what a layer writes there (check_saes), before the model is built."""
    from tfcli.analysis.sae import check_saes, read_sae

    saes = tuple(read_sae(path) for path in paths or ())
    check_saes(saes, config, "--sae", components=True)
    return saes


@app.command()
@shared_options(default_model="gpt2-small", dataset=True,
                model="Model source with an LM head (default: the bundled `gpt2-small`, random weights).")
def attribute(
    texts: TextsArgument = None,
    target: ATTRIBUTE_TARGET = None,
    foil: ATTRIBUTE_FOIL = None,
    position: ATTRIBUTE_POSITION = None,
    by: Annotated[str, typer.Option(metavar="WHAT", help="component (embeddings, each layer's attention and MLP), "
                                    "head (each head) or neuron (the largest MLP neurons).")] = "component",
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="With --by head or neuron: the layers broken "
                                               "into heads or neurons, e.g. 8-11 or -3- (default: all).")] = None,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Components listed (with --by neuron, "
                                     "also the neurons kept one by one).")] = 10,
    max_length: MaxLengthOption = None,
    file: FileOption = None,
    ablate: AblateOption = None,
    sae: Annotated[list[Path] | None, typer.Option(metavar="PATH", help="An SAE or transcoder (a folder, as "
                                                   "`features --sae` reads) whose site's components are split into "
                                                   "its active features, its rest and its error; repeat for "
                                                   "several.")] = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
) -> None:
    """Split a logit (or the difference of two) into the direct contribution of every component that writes to
    the residual stream: embeddings, heads, MLPs, neurons, biases (direct logit attribution); with --sae, what an
    SAE's site holds into its features.

    \b
    Examples:
      tfcli attribute -m path/to/gpt2 --target " Mary" --foil " John" --by head \\
          "When Mary and John went to the store, John gave a drink to"
      tfcli attribute -m path/to/gpt2 --by neuron --layers -2- \\
          "The capital of France is"
      tfcli attribute -m path/to/gpt2 --dataset ioi.jsonl --by head
    """
    from tfcli import attribute as core
    from tfcli.analysis.indices import parse_indices
    from tfcli.render import attribute as render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if data.dataset is not None:
        if texts or file is not None:
            raise usage_error("give texts (or --file) or --dataset, not both")
        data.each_line_has(target=target, foil=foil, position=position)
        if max_length is not None:
            raise usage_error("--max-length is for texts: a dataset's lines are read whole")
    data.only_with_a_dataset("bootstrap", "per_item", "skip_bad")
    cluster = data.cluster(data.dataset is not None, "a --dataset")
    texts_in = inputs(texts, file) if data.dataset is None else None
    if run.report is not None:
        check_report_path(run.report, run.force, 1 if data.dataset is not None else texts_in.count or 1)
    source = resolve_source(run.model, run.revision)
    core.check_model(source.config, by)  # before the model is built
    selected = parse_indices(layers, source.config.num_hidden_layers, "layers")
    options = core.AttributeOptions(target=target, foil=foil, position=position, by=by, layers=selected, top=top,
                                    ablation=ablation_of(ablate, source.config), saes=saes_of(sae, source.config))
    if data.dataset is not None:
        if layers is not None and by == "component":
            raise usage_error("--layers picks the layers broken into heads or neurons: give --by head or --by neuron")
        run_dataset(core.AttributeDataset(options), source, data.options(cluster), run,
                    (View(out, render.record, lambda result, number: render.attribution_lines(result, number,
                                                                                             out.width, top)),
                     View(out, render.dataset_record, lambda done, number: render.dataset_lines(done, out.width, top),
                          report=(render.dataset_page_section, render.dataset_figure), of_run=True)),
                    "these components say nothing about a trained model")
        return
    with session_of(source, run, None, "these components say nothing about a trained model") as session:
        tokenizer = session.tokenizer
        warn_spacing(tokenizer, target, foil)
        core.check_options(source.config, tokenizer, options)
        truncated = CappedWarnings(warn, "texts truncated")
        chunks = started(tokenized(tokenizer, batch, source.config.max_position_embeddings, truncated,
                                   max_length=max_length) for batch in texts_in.batches(core.BATCH_SIZE))
        loaded = session.model
        emit(core.run(loaded, tokenizer, session.counted(chunks, "attribute", len), options),
             View(out, render.record, lambda result, number: render.attribution_lines(result, number, out.width, top)),
             run.json_output, truncated=truncated, report=report_of(run.report, run.force, "attribute", loaded, source))


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
    from tfcli import heads as core
    from tfcli.render import heads as render
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
