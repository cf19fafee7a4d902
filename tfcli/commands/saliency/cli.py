"""`tfcli saliency`: which input tokens a prediction rests on (core.py), over one text, several, --file or
--dataset, all through the runner (`run_dataset`): the command declares its options, checks them before any model is
built and hands the analysis on."""

from __future__ import annotations

from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console
from tfcli.cli.output import View
from tfcli.cli.session import inputs, run_dataset
from tfcli.cli.options import (AT_LEAST_ONE, DatasetFlags, DatasetOptions, FileOption, FoilOption, PositionOption,
                               RunOptions, TargetOption, TextsArgument, shared_options, with_help)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path


# the metric options in this module's words (declared once in cli/options.py)
SALIENCY_TARGET = with_help(TargetOption, "The token whose logit is the metric (\" Mary\" with its leading space for "
                                          "byte-level BPE, or #ID), or a classifier's label (default: the model's own "
                                          "top prediction).")
SALIENCY_POSITION = with_help(PositionOption, "The position read, negative counting from the end (default: the last "
                                              "token; a masked-LM encoder: its [MASK]).")


@app.command()
@shared_options(default_model="gpt2-small", dataset=True,
                model="Model source with an LM, masked-LM or classifier head, or an encoder without a head (default: "
                      "the bundled `gpt2-small`, random weights).",
                seed="Seed of the random weights (when the model has none) and of --faithfulness's random orders.")
def saliency(
    texts: TextsArgument = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="integrated-gradients, gradient, input-x-gradient, "
                                        "occlusion or attention-rollout.")] = "integrated-gradients",
    target: SALIENCY_TARGET = None,
    foil: FoilOption = None,
    position: SALIENCY_POSITION = None,
    metric: Annotated[str, typer.Option(metavar="WHAT", help="logit, or logprob (the log-softmax of the head's "
                                        "output).")] = "logit",
    baseline: Annotated[str | None, typer.Option(metavar="BASELINE", help="What a token is replaced by: pad (else "
                                                 "the end token), zero (zero token embeddings), mask, or a text of as "
                                                 "many tokens; special tokens are kept (default: pad, or a dataset "
                                                 "line's baseline or corrupt text).")] = None,
    steps: Annotated[int, typer.Option(metavar="N", help="Integrated gradients: the points of the integral.")] = 32,
    integration: Annotated[str, typer.Option(metavar="RULE", help="Integrated gradients: gausslegendre or riemann "
                                             "(Captum's riemann_trapezoid).")] = "gausslegendre",
    site: Annotated[str, typer.Option(metavar="SITE", help="Where the gradients and occlusion act: embed (the token "
                                      "embeddings) or blocks.L.resid_pre (and resid_mid, resid_post, attn.out, "
                                      "mlp.out).")] = "embed",
    continuation: Annotated[str | None, typer.Option(metavar="TEXT", help="A text that follows (\" Paris\" with its "
                                                     "space): each of its tokens attributed to the tokens before it, "
                                                     "a row each.")] = None,
    generate: Annotated[int | None, typer.Option(metavar="N", help="The model's own greedy continuation of N tokens "
                                                 "(to its end token), attributed as --continuation's.")] = None,
    faithfulness: Annotated[bool, typer.Option("--faithfulness", help="Also the deletion and insertion curves against "
                                               "random orders, and their areas.")] = False,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens listed by their "
                                     "attribution.")] = 10,
    file: FileOption = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
) -> None:
    """Attribute a prediction to the input tokens: integrated gradients (with its completeness delta), gradients,
    occlusion or attention rollout, with faithfulness curves.

    \b
    Examples:
      tfcli saliency -m path/to/gpt2 --target " Mary" --foil " John" \\
          "When Mary and John went to the store, John gave a drink to"
      tfcli saliency -m path/to/gpt2 --method occlusion --faithfulness \\
          "The capital of France is"
      tfcli saliency -m path/to/classifier --target positive \\
          "a gripping, funny film"
      tfcli saliency -m path/to/gpt2 "The capital of France is" \\
          --continuation " Paris, a city"
      tfcli saliency -m path/to/gpt2 "The capital of France is" --generate 6
      tfcli saliency -m path/to/gpt2 --dataset ioi.jsonl --bootstrap 1000
    """
    from tfcli.commands.saliency import core, render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if data.dataset is not None:
        if texts or file is not None:
            raise usage_error("give texts (or --file) or --dataset, not both")
        data.each_line_has(target=target, foil=foil, position=position)
        for name, value in (("continuation", continuation), ("generate", generate)):
            if value is not None:
                raise usage_error(f"--{name} is for one text: its matrix has no mean over a dataset")
    data.only_with_a_dataset("skip_bad")
    options = core.SaliencyOptions(method=method, baseline=baseline, steps=steps, integration=integration, site=site,
                                   target=target, foil=foil, position=position, faithfulness=faithfulness,
                                   seed=run.seed, metric=metric, continuation=continuation, generate=generate)
    texts_in = inputs(texts, file) if data.dataset is None else None
    single = texts_in is not None and texts_in.count == 1
    cluster = data.cluster(not single, "a --dataset or several texts")
    if run.report is not None:
        check_report_path(run.report, run.force, 1)
    source = resolve_source(run.model, run.revision)
    core.check_options(source.config, options)  # before the model is built; each text's checks follow
    each = data.per_item or (texts_in is not None and not single)  # several texts: each text's view, then the aggregate
    color = out.color_system is not None
    text_view = View(out, render.record, lambda result, number: render.saliency_lines(result, number, out.width,
                                                                                      color, top), spaced=True)
    matrix = continuation is not None or generate is not None
    if matrix:  # one text: its matrix, the aggregate of one
        text_view = view = View(out, render.continuation_record, lambda result, number: render.continuation_lines(
            result, number, out.width), report=(render.continuation_page_section, render.continuation_figure))
    elif single:  # one text: its result alone
        view = None
    else:
        view = View(out, render.dataset_record, lambda done, number: render.dataset_lines(done, out.width, color,
                                                                                          after_texts=each),
                    report=(render.dataset_page_section, render.dataset_figure), of_run=True)
    run_dataset((core.ContinuationAnalysis if matrix else core.SaliencyAnalysis)(options), source,
                DatasetOptions(path=data.dataset, bootstrap=0 if single else data.bootstrap, per_item=each,
                               skip_bad=data.skip_bad, ray=cluster, texts=texts_in),
                run,
                (text_view, view), "these attributions say nothing about a trained model")
