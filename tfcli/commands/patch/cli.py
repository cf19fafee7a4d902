"""tfcli patch: the command line (its options, its session, its output)."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import ablation_of, pair_ids, run_dataset, session_of, warn_spacing
from tfcli.cli.options import (AT_LEAST_ONE, AblateOption, DatasetFlags, FoilOption, PositionOption, RunOptions,
                               TargetOption, shared_options, with_help)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path

# the metric options in this module's words (declared once in cli/options.py)
PATCH_TARGET = with_help(TargetOption, "The token whose logit is the metric: one token of the model's tokenizer (\" "
                                       "Mary\" with its leading space for byte-level BPE) or #ID; a classifier's label "
                                       "name or #index (with --dataset: each line's).")
PATCH_POSITION = with_help(PositionOption, "The position the metric is read at, negative counting from the end "
                                           "(default: the last token; a masked-LM encoder: its [MASK]).")


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
    from tfcli.commands.patch import core, render
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
