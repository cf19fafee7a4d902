"""`tfcli graph`: the command line. The transcoders are read and checked against the model's config, every prompt
read and checked and every output path checked before the model is built; then each prompt's graph through the
runner (`run_dataset`: --file, stdin, progress, Ctrl-C keeping the graphs finished), shown and written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.options import (AT_LEAST_ONE, DatasetOptions, FileOption, FoilOption, RunOptions, TargetOption,
                               TextsArgument, requires, shared_options, with_help)
from tfcli.cli.output import View, write_text
from tfcli.cli.session import inputs, run_dataset
from tfcli.errors import check_output_file, file_error, usage_error
from tfcli.render.report_file import check_report_path

AT_LEAST_ZERO = requires(lambda value: value >= 0, "must be at least 0")
FRACTION = requires(lambda value: 0.0 <= value <= 1.0, "must be between 0 and 1")
GRAPH_TARGET = with_help(TargetOption, "Attribute this token's logit (\" Paris\" with its space, or #ID) instead of "
                                       "the top logits.")
GRAPH_FOIL = with_help(FoilOption, "With --target: attribute the difference of the logits target - foil.")


@app.command()
@shared_options(model="Model source: a decoder with an LM head.",
                json_output="One JSON object per prompt on stdout: the targets, the scores, the pruned graph's nodes "
                            "and edges, the validation.")
def graph(
    texts: TextsArgument = None,
    transcoders: Annotated[Path, typer.Option(metavar="DIR", help="Per-layer transcoders: circuit-tracer's folder "
                                              "(config.yaml and layer_0.safetensors, layer_1.safetensors, ...), or "
                                              "a folder holding a folder per layer of SAELens's (cfg.json, "
                                              "sae_weights.safetensors) or sparsify's (layers.L.mlp); or "
                                              "circuit-tracer's cross-layer transcoder (config.yaml, "
                                              "W_enc_0.safetensors, W_dec_0.safetensors, ...).")] = None,
    target: GRAPH_TARGET = None,
    foil: GRAPH_FOIL = None,
    max_feature_nodes: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="At most N "
                                                          "feature nodes, the most influential (default: every "
                                                          "active feature).")] = None,
    node_threshold: Annotated[float, typer.Option(metavar="F", callback=FRACTION, help="Pruning: keep the nodes "
                                                  "that carry this share of the influence on the logits.")] = 0.8,
    edge_threshold: Annotated[float, typer.Option(metavar="F", callback=FRACTION, help="Pruning: keep the edges "
                                                  "that carry this share of the edge influence.")] = 0.98,
    batch_size: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Targets per backward "
                                            "pass.")] = 64,
    validate: Annotated[int, typer.Option(metavar="N", callback=AT_LEAST_ZERO, help="Validation: the N most "
                                          "influential feature nodes removed in the model one at a time, the "
                                          "measured change of the first target against the graph's prediction "
                                          "(0: none).")] = 10,
    graph_out: Annotated[Path | None, typer.Option(metavar="FILE.json", help="Also write the pruned graph in "
                                                   "circuit-tracer's frontend JSON (several prompts: FILE-1.json, "
                                                   "FILE-2.json, ...).")] = None,
    save: Annotated[Path | None, typer.Option(metavar="FILE.safetensors", help="Also write the whole graph: "
                                              "adjacency, active features, tokens, targets (several prompts: "
                                              "numbered as --graph-out).")] = None,
    contexts: Annotated[Path | None, typer.Option(metavar="FILE", help="Also label each feature on the pruned graph "
                                                  "by its 3 top activating contexts in this corpus (a text file, one "
                                                  "text per line).")] = None,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """The attribution graph of each prompt through per-layer transcoders, as circuit-tracer computes it: every active
    feature, error, token and top logit a node, every edge a direct effect with attention patterns and norms
    frozen; pruned by influence on the logits, with its replacement and completeness scores, and validated by
    removing its most influential features in the model.

    \b
    Examples:
      tfcli graph -m path/to/smollm2 --transcoders path/to/transcoders \\
          "The capital of France is"
      tfcli graph -m path/to/llama --transcoders tc --target " Paris" \\
          --graph-out paris.json --report paris.html "The capital of France is"
      tfcli graph -m path/to/llama --transcoders tc --file prompts.txt --json
    """
    from tfcli.analysis.metric import parse_metric
    from tfcli.analysis.transcoders import check_transcoders
    from tfcli.api import load_tokenizer_for
    from tfcli.commands.graph import core, render
    from tfcli.commands.graph.transcoder_sets import read_set
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if transcoders is None:
        raise usage_error("--transcoders is required: the transcoders the graph runs through",
                          "give a transcoder set's folder: --transcoders DIR")
    texts_in = inputs(texts, file)
    single = texts_in.count == 1
    outputs = [(option, path) for option, path in (("--graph-out", graph_out), ("--save", save)) if path is not None]
    for option, path in outputs:
        for numbered in [path] if single else [numbered_path(path, i) for i in range(1, (texts_in.count or 1) + 1)]:
            check_output_file(numbered, run.force, f"give a file name ending in {path.suffix or '.json'}", option)
    if foil is not None and target is None:
        raise usage_error("--foil goes with --target: the graph's one target is the logit difference target - foil")
    if run.report is not None:
        if not single and run.report.suffix.lower() != ".html":
            raise usage_error(f"--report {run.report}: several prompts go on a page, a section each",
                              "end the file name in .html, or give one prompt")
        check_report_path(run.report, run.force, 1)
    read = read_set(transcoders)
    source = resolve_source(run.model, run.revision)
    core.check_options(source.config, core.GraphOptions())
    check_transcoders(read, source.config)
    # read here only for --target and --contexts (the session reads its own for the prompts: a second read costs 0.1 s)
    tokenizer = load_tokenizer_for(source) if target is not None or contexts is not None else None
    target_token, foil_token = parse_metric(source.config, tokenizer, target, foil)
    corpus = read_corpus(contexts, source.config, tokenizer) if contexts is not None else None
    options = core.GraphOptions(target=target_token, foil=foil_token, max_feature_nodes=max_feature_nodes,
                                batch_size=batch_size, node_threshold=node_threshold, edge_threshold=edge_threshold,
                                validate=validate)
    color = out.color_system is not None
    graph_view = View(out, render.record, lambda shown, number: render.graph_lines(shown, out.width, color),
                      spaced=True)
    view = None if single else View(out, render.graphs_record, lambda run_, number: render.summary_lines(
        run_, out.width), report=(render.graphs_page_section, lambda run_, info, tokens: render.figure(
            run_.graphs[0], info, tokens)))  # a figure holds one prompt's graph: refused above for several
    run_dataset(core.GraphAnalysis(read, options, warn, corpus), source,
                DatasetOptions(path=None, bootstrap=0, per_item=not single and not run.json_output, skip_bad=False,
                               ray=None, texts=texts_in),
                run, (graph_view, view), "this graph says nothing about a trained model",
                after=None if not outputs else written(graph_out, save, single, run.force))


def read_corpus(path: Path, config, tokenizer) -> list[tuple[int, list[int]]]:
    """--contexts FILE: each text's line number and ids, read as the graph reads a prompt (a special token first);
    blank lines skipped."""
    from tfcli.commands.graph.core import prompt_ids
    from tfcli.texts import LineReader

    if not path.is_file():
        raise file_error(f"--contexts {path}: no such file", "give a text file, one text per line")
    corpus = [(number, prompt_ids(config, tokenizer, text, warn))
              for number, text in LineReader(path.open("rb"), str(path), close=True) if text.strip()]
    if not corpus:
        raise file_error(f"--contexts {path} holds no text", "give a text file, one text per line")
    return corpus


def numbered_path(path: Path, number: int) -> Path:
    """Several prompts' files: FILE.json -> FILE-1.json, FILE-2.json, ..."""
    return path.with_name(f"{path.stem}-{number}{path.suffix}")


def written(graph_out: Path | None, save: Path | None, single: bool, force: bool):
    """The runner's `after`: each finished graph's --graph-out and --save files (Ctrl-C: those of the graphs that
    finished)."""
    def after(session, envelope) -> None:
        import json

        from tfcli.commands.graph import graph_file
        from tfcli.errors import replace_atomically

        for number, result in enumerate(envelope.value.graphs, 1):
            if graph_out is not None:
                path = graph_out if single else numbered_path(graph_out, number)
                check_output_file(path, force, "give a file name ending in .json", "--graph-out")
                write_text(path, json.dumps(graph_file.frontend_json(result, path.stem)))
            if save is not None:
                path = save if single else numbered_path(save, number)
                check_output_file(path, force, "give a file name ending in .safetensors", "--save")
                replace_atomically(path, lambda temporary, shown=result: graph_file.save_tensors(shown,
                                                                                                   Path(temporary)))
    return after
