"""tfcli attribute: the command line (its options, its session, its output)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import ablation_of, inputs, run_dataset, session_of, started, warn_spacing
from tfcli.cli.options import (AT_LEAST_ONE, AblateOption, DatasetFlags, FileOption, FoilOption, MaxLengthOption,
                               PositionOption, RunOptions, TargetOption, TextsArgument, shared_options, with_help)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, tokenized

# the metric options in this module's words (declared once in cli/options.py)
ATTRIBUTE_TARGET = with_help(TargetOption, "The token whose logit is split: one token of the model's tokenizer (\" "
                                           "Mary\" with its leading space for byte-level BPE) or #ID (default: the "
                                           "model's own top prediction).")
ATTRIBUTE_FOIL = with_help(FoilOption, "Split the difference of the logits target - foil instead.")
ATTRIBUTE_POSITION = with_help(PositionOption, "The position read, negative counting from the end (default: the last "
                                               "token).")


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
    from tfcli.commands.attribute import core
    from tfcli.analysis.indices import parse_indices
    from tfcli.commands.attribute import render
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
