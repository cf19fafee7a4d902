"""`tfcli features`: what a sparse autoencoder or transcoder (tfcli/analysis/sae.py) sees in a text and what its
reconstruction costs the model (core.py), over one text, several, --file or --dataset, all through the
runner (`run_dataset`): the command reads the SAE, checks it against the model's sites before any model is built and
hands the analysis on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console
from tfcli.cli.output import View
from tfcli.cli.session import inputs, run_dataset
from tfcli.cli.options import (AT_LEAST_ONE, DatasetFlags, DatasetOptions, FileOption, FoilOption, RunOptions,
                               TargetOption, TextsArgument, shared_options, with_help)
from tfcli.errors import usage_error
from tfcli.render.report_file import check_report_path


# the metric options in this module's words (declared once in cli/options.py)
FEATURES_TARGET = with_help(TargetOption, "Each active feature's direct effect on this token's logit at the last "
                                          "position (\" Mary\" with its space, or #ID).")
FEATURES_FOIL = with_help(FoilOption, "With --target: on the difference of the logits target - foil.")


@app.command()
@shared_options(default_model="gpt2-small", dataset=True, without=("bootstrap",),
                model="Model source the SAE was trained on (default: the bundled `gpt2-small`, random weights).")
def features(
    texts: TextsArgument = None,
    sae: Annotated[list[Path] | None, typer.Option(metavar="PATH", help="The SAE or transcoder: a folder of SAELens "
                                                   "(cfg.json + sae_weights.safetensors), Gemma Scope (params.npz; "
                                                   "params.safetensors + config.json), Llama Scope (hyperparams.json "
                                                   "+ checkpoints/) or sparsify (a layers.N folder); repeatable, one "
                                                   "per site.")] = None,
    site: Annotated[str | None, typer.Option(metavar="SITE", help="The site the SAE reads, where its file does not "
                                             "say (blocks.L.resid_post; tfcli config --sites lists them); with one "
                                             "--sae.")] = None,
    feature: Annotated[int | None, typer.Option(metavar="N", help="Follow feature N: its activation on every token "
                                                "and, over texts, its top activating contexts.")] = None,
    top: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Features listed per token.")] = 5,
    contexts: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="With --feature: the top "
                                          "activating contexts kept over the texts.")] = 10,
    all_tokens: Annotated[bool, typer.Option("--all-tokens", help="Measure every token: by default position 0, "
                                             "special tokens and outliers (a norm over 10x the text's median) are "
                                             "left out of the figures and not spliced, as sae train leaves them "
                                             "out.")] = False,
    target: FEATURES_TARGET = None,
    foil: FEATURES_FOIL = None,
    file: FileOption = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
) -> None:
    """Read a sparse autoencoder's features at their site: per token the top features, the SAE's error (MSE,
    explained variance, cosine, L0) and the model's next-token loss with the reconstruction spliced in; or one
    feature's activations and its top contexts over a corpus.

    \b
    Examples:
      tfcli features -m path/to/gpt2 --sae path/to/sae "The cat sat on the mat"
      tfcli features -m path/to/gpt2 --sae path/to/sae --feature 1234 \\
          --file corpus.txt
      tfcli features -m path/to/llama --sae sparsify-run/layers.6 --json \\
          "The capital of France is"
    """
    from tfcli.commands.features import core
    from tfcli.analysis.metric import check_head, parse_metric
    from tfcli.api import load_tokenizer_for
    from tfcli.analysis.sae import check_saes, read_sae
    from tfcli.commands.features import render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if not sae:
        raise usage_error("--sae is required: the SAE to read", "give an SAE's folder: --sae PATH")
    if site is not None and len(sae) > 1:
        raise usage_error("--site is for one --sae", "each of several SAEs reads the site its file names")
    if data.dataset is not None and (texts or file is not None):
        raise usage_error("give texts (or --file) or --dataset, not both")
    data.only_with_a_dataset("skip_bad")
    texts_in = inputs(texts, file) if data.dataset is None else None
    single = texts_in is not None and texts_in.count == 1
    cluster = data.cluster(not single, "a --dataset or several texts")
    if run.report is not None:
        check_report_path(run.report, run.force, 1)
        if len(sae) > 1 and run.report.suffix.lower() != ".html":
            raise usage_error("--report with several --sae: a page (.html), whose sections are one per SAE")
    if foil is not None and target is None:
        raise usage_error("--foil goes with --target: the effect is on the logit difference target - foil")
    dictionaries = [read_sae(path, site) for path in sae]
    source = resolve_source(run.model, run.revision)
    target_token = foil_token = None
    if target is not None:
        check_head(source.config, ("lm",), "direct effects read an LM head's logits", "use a decoder with an LM head")
    check_saes(dictionaries, source.config, None if target is None else "--target with --sae")  # before the build
    if target is not None:
        # the runner says its warnings
        target_token, foil_token = parse_metric(source.config, load_tokenizer_for(source), target, foil)
    options = core.FeaturesOptions(top=top, feature=feature, contexts=contexts, target=target_token, foil=foil_token,
                                   every_token=all_tokens)
    sites = set()
    for dictionary in dictionaries:
        core.check_options(dictionary, options)
        if dictionary.site in sites:
            raise usage_error(f"--sae {dictionary.path}: another --sae reads {dictionary.site} too",
                              "one SAE per site")
        sites.add(dictionary.site)
    color = out.color_system is not None
    if len(dictionaries) == 1:
        text_view = View(out, render.record, lambda result, number: render.features_lines(
            result, number, out.width, color), spaced=True)
        view = None if single else View(out, render.corpus_record, lambda done, number: render.corpus_lines(
            done, out.width, color), report=(render.corpus_page_section, render.corpus_figure), of_run=True)
    else:
        text_view = View(out, render.several_record, lambda result, number: render.several_lines(
            result, number, out.width, color), spaced=True, report=(render.several_page_section, None))
        view = None if single else View(out, render.several_corpus_record, lambda done, number:
                                             render.several_corpus_lines(done, out.width, color),
                                             report=(render.several_corpus_page_section, None), of_run=True)
    each = data.per_item or (texts_in is not None and (texts_in.count or 0) > 1)
    run_dataset(core.FeaturesAnalysis(dictionaries, options), source,
                DatasetOptions(path=data.dataset, bootstrap=0, per_item=each, skip_bad=data.skip_bad, ray=cluster,
                               texts=texts_in), run,
                (text_view, view), "these features say nothing about a trained model")
