"""`tfcli steer`: steering vectors. `steer fit` finds a direction per block from contrast pairs and writes it as
llama.cpp's control-vector GGUF or as safetensors; `steer sweep` shows what a vector does strength by strength
(the core is core.py beside it, the file format `tfcli/analysis/vectors.py`, the views render.py;
docs/steering.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import command_group
from tfcli.cli.console import note, output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import inputs, session_of, started, warn_spacing
from tfcli.cli.options import (AT_LEAST_ONE, FileOption, FoilOption, RunOptions, TargetOption, shared_options,
                               with_help)
from tfcli.errors import named_for, usage_error
from tfcli.render.report_file import check_report_path

steer_app = command_group("steer", "Steering vectors: fit a direction per block from contrast pairs, as a file llama.cpp "
                          "reads; sweep its strength and see what it does.")


# the metric options in this module's words (declared once in cli/options.py)
SWEEP_TARGET = with_help(TargetOption, "The effect: this token's logit at each prompt's last position (\" happy\" with "
                                       "its leading space for byte-level BPE, or #ID).")
SWEEP_FOIL = with_help(FoilOption, "The effect is the difference of the logits target - foil.")


@steer_app.command()
@shared_options(without=("report",),
                model="Model source: a path, a bundled config name or a Hugging Face hub id.",
                force="Overwrite the --output file if it exists.",
                json_output="One JSON object on stdout: layers [{layer, separation, gap, resid_norm}], method, "
                            "model_hint, width, output.")
def fit(

    pairs: Annotated[str | None, typer.Option("--pairs", metavar="FILE", help="JSON Lines, one {\"positive\": TEXT, "
                                              "\"negative\": TEXT} per line (`-`: stdin).",
                                              show_default=False)] = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="pca-diff (first principal component of the "
                                        "differences), pca-center (of the pair-centred texts) or mean-diff (mean "
                                        "of the differences).")] = "pca-diff",
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="The blocks to fit, e.g. 8-11 or -4- or 3,7 "
                                               "(default: every block but 0, which llama.cpp never "
                                               "steers).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="PATH", dir_okay=False,
                                                help="Write the vector to PATH: .gguf (llama.cpp's control vector) "
                                                "or .safetensors.", show_default=False)] = None,
    *,
    run: RunOptions,
) -> None:
    """Fit a steering vector: per block, the direction of the residual stream (the block's output at each text's
    last token) that separates the positive texts of contrast pairs from their negatives; print how well it
    separates them and write it where llama.cpp reads it (--control-vector-scaled FILE:STRENGTH).

    \b
    Examples:
      tfcli steer fit -m path/to/model --pairs happy-sad.jsonl -o happy.gguf
      tfcli steer fit -m path/to/model --pairs pairs.jsonl --layers 8-20 \\
          --method mean-diff -o vector.safetensors --json
    """
    from tfcli.commands.steer import core
    from tfcli.analysis.dataset import checked
    from tfcli.analysis.vectors import check_output, write_vector
    from tfcli.commands.steer import render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if run.model is None:
        raise usage_error("give --model: the model to fit the vector on")
    if pairs is None:
        raise usage_error("give --pairs FILE: JSON Lines of {\"positive\": ..., \"negative\": ...}")
    if output is None:
        raise usage_error("give --output PATH (.gguf or .safetensors): where the vector is written")
    core.check_method(method)
    check_output(output, run.force)
    source = resolve_source(run.model, run.revision)
    core.check_model(source.config)
    chosen = core.chosen_layers(source.config, layers)
    check_output(output, run.force, chosen)  # a GGUF cannot hold block 0
    with session_of(source, run, None, "a direction fitted on random weights steers nothing") as session:
        tokenizer = session.tokenizer
        read = checked(pair_lines(pairs), core.PAIR_LINE, lambda line: core.check_pair(source.config, tokenizer, line),
                       False, warn)
        core.check_pairs(read)
        if layers is None:
            note(f"blocks {chosen[0]}-{chosen[-1]}: every block but 0, whose output llama.cpp never steers "
                 "(--layers picks others)" if chosen != [0] else "block 0: the model's only block")
        with session.progress("steer fit", "texts") as progress:
            result = core.fit(session.model, tokenizer, read, method, chosen, progress=progress)
    write_vector(output, result.directions, result.model_hint, run.force)
    result.output = str(output)
    emit([result], View(out, render.record, lambda fitted, number: render.fit_lines(fitted, out.width)), run.json_output)


def pair_lines(path: str) -> list[tuple[int, str]]:
    """The numbered lines of the pairs file, its errors said with --pairs (the dataset reader names --dataset)."""
    from tfcli.analysis.dataset import read_lines
    from tfcli.errors import TfcliError

    try:
        return read_lines(path)
    except TfcliError as error:
        if error.parameter == "dataset":
            error.message = "--pairs " + error.message.removeprefix("dataset ")
            error.parameter = None
            error.args = (error.message,)
        raise


@steer_app.command()
@shared_options(model="Model source with an LM head.",
                json_output="JSON Lines on stdout, one object per prompt and strength: prompt, strength, layers, "
                            "text, ids, effect, kl.")
def sweep(
    prompts: Annotated[list[str] | None, typer.Argument(metavar="PROMPT", show_default=False,
                                                        help="Prompts to continue; `-` alone reads stdin, one per "
                                                        "line.")] = None,
    vector: Annotated[str | None, typer.Option("--vector", metavar="PATH", help="The steering vector: a "
                                               "control-vector .gguf or .safetensors (tfcli steer fit, llama.cpp, "
                                               "repeng).", show_default=False)] = None,
    strengths: Annotated[str, typer.Option(metavar="LIST", help="The strengths to try, comma-separated (0: "
                                           "unsteered).")] = "-4,-2,0,2,4",
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="Steer only these blocks of the vector, e.g. "
                                               "10-20 (default: all it has).")] = None,
    target: SWEEP_TARGET = None,
    foil: SWEEP_FOIL = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", metavar="N", callback=AT_LEAST_ONE,
                                                help="New tokens of each greedy continuation.")] = 20,
    normalize: Annotated[bool, typer.Option("--normalize", help="Keep each position's norm as it was before the "
                                            "vector was added (repeng's normalize).")] = False,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """See what a steering vector does, strength by strength: each prompt's greedy continuation, the effect on a
    token's logit (--target, --foil) and the cost (the KL divergence from the unsteered model's next-token
    distributions over the prompt), so that a strength that breaks the model shows as such.

    \b
    Examples:
      tfcli steer sweep -m path/to/model --vector happy.gguf "I feel" "Today was"
      tfcli steer sweep -m path/to/model --vector happy.gguf --strengths -8,-4,0,4,8 \\
          --layers 10-20 --target " happy" --foil " sad" -n 30 "I feel"
    """
    from tfcli.commands.steer import core
    from tfcli.analysis.indices import parse_indices, spans
    from tfcli.analysis.metric import parse_metric
    from tfcli.analysis.vectors import load_vector
    from tfcli.analysis.inputs import prompts as read_prompts
    from tfcli.commands.steer import render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if run.model is None:
        raise usage_error("give --model: the model to steer")
    if vector is None:
        raise usage_error("give --vector PATH: the steering vector to sweep (tfcli steer fit writes one)")
    if foil is not None and target is None:
        raise usage_error("--foil goes with --target: the effect is the logit difference target - foil")
    chosen_strengths = core.parse_strengths(strengths)
    prompts_in = inputs(prompts, file)
    if run.report is not None:
        check_report_path(run.report, run.force, prompts_in.count or 1)
    source = resolve_source(run.model, run.revision)
    config = source.config
    core.check_model(config)
    with named_for(f"--vector {vector}"):  # an SAE's feature (SAE#N) is read by the SAE's reader
        directions = load_vector(vector, config)
    chosen = parse_indices(layers, config.num_hidden_layers, "layers", noun="blocks")
    blocks = [layer for layer in sorted(directions) if chosen is None or layer in chosen]
    if not blocks:
        raise usage_error(f"--layers {layers}: the vector has none of these blocks",
                          f"it has blocks {spans(sorted(directions))}")
    with session_of(source, run, None, "a vector on random weights steers nothing") as session:
        tokenizer = session.tokenizer
        warn_spacing(tokenizer, target, foil)
        target_token, foil_token = parse_metric(config, tokenizer, target, foil)
        batches = started(read_prompts(config, tokenizer, [item.text for item in batch], max_new_tokens)
                          for batch in prompts_in.batches(1))
        note(f"steering: {vector} at blocks {spans(blocks)}, strengths {', '.join(f'{s:g}' for s in chosen_strengths)}")
        loaded = session.model

        options = core.SweepOptions(vector=directions, name=vector, strengths=chosen_strengths, layers=blocks,
                                    target=target_token, foil=foil_token, normalize=normalize)
        swept = (core.sweep(loaded, tokenizer, prompt, options) for batch in batches for prompt in batch)

        emit(swept, View(out, render.sweep_records,
                         lambda result, number: render.sweep_lines(result, number, out.width), spaced=True),
             run.json_output, report=report_of(run.report, run.force, "steer", loaded, source, tokenizer))
