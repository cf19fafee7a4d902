"""`tfcli graph`: the command line. The transcoders are read and checked against the model's config, and every
output path checked, before the model is built; then one prompt's graph, shown and written."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, warn
from tfcli.cli.options import AT_LEAST_ONE, FoilOption, RunOptions, TargetOption, requires, shared_options, with_help
from tfcli.cli.output import View, emit, write_text
from tfcli.cli.session import session_of
from tfcli.errors import check_output_file, usage_error

FRACTION = requires(lambda value: 0.0 <= value <= 1.0, "must be between 0 and 1")
GRAPH_TARGET = with_help(TargetOption, "Attribute this token's logit (\" Paris\" with its space, or #ID) instead of "
                                       "the top logits.")
GRAPH_FOIL = with_help(FoilOption, "With --target: attribute the difference of the logits target - foil.")


@app.command()
@shared_options(without=("report",), model="Model source: a decoder with an LM head.",
                json_output="One JSON object on stdout: the targets, the scores and the pruned graph's nodes and "
                            "edges.")
def graph(
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The prompt (a special token is put first).",
                                        show_default=False)],
    transcoders: Annotated[Path, typer.Option(metavar="DIR", help="circuit-tracer's per-layer transcoders: a folder "
                                              "with config.yaml and layer_0.safetensors, layer_1.safetensors, "
                                              "...")] = None,
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
    graph_out: Annotated[Path | None, typer.Option(metavar="FILE.json", help="Also write the pruned graph in "
                                                   "circuit-tracer's frontend JSON.")] = None,
    save: Annotated[Path | None, typer.Option(metavar="FILE.safetensors", help="Also write the whole graph: "
                                              "adjacency, active features, tokens, targets.")] = None,
    *,
    run: RunOptions,
) -> None:
    """The attribution graph of a prompt through per-layer transcoders, as circuit-tracer computes it: every active
    feature, error, token and top logit a node, every edge a direct effect with attention patterns and norms
    frozen; pruned by influence on the logits, with its replacement and completeness scores.

    \b
    Examples:
      tfcli graph -m path/to/smollm2 --transcoders path/to/transcoders \\
          "The capital of France is"
      tfcli graph -m path/to/llama --transcoders tc --target " Paris" \\
          --graph-out paris.json "The capital of France is"
    """
    from tfcli.analysis.metric import parse_metric
    from tfcli.analysis.transcoders import check_transcoders, read_transcoders
    from tfcli.api import load_tokenizer_for
    from tfcli.commands.graph import core, graph_file, render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    if transcoders is None:
        raise usage_error("--transcoders is required: the transcoders the graph runs through",
                          "give circuit-tracer's transcoder folder: --transcoders DIR")
    if not text.strip():
        raise usage_error("the prompt is empty: there is nothing to attribute", "give a text")
    if graph_out is not None:
        check_output_file(graph_out, run.force, "give a file name ending in .json", "--graph-out")
    if save is not None:
        check_output_file(save, run.force, "give a file name ending in .safetensors", "--save")
    if foil is not None and target is None:
        raise usage_error("--foil goes with --target: the graph's one target is the logit difference target - foil")
    read = read_transcoders(transcoders)
    source = resolve_source(run.model, run.revision)
    core.check_options(source.config, core.GraphOptions())
    check_transcoders(read, source.config)
    tokenizer = load_tokenizer_for(source)
    target_token, foil_token = parse_metric(source.config, tokenizer, target, foil)
    options = core.GraphOptions(target=target_token, foil=foil_token, max_feature_nodes=max_feature_nodes,
                                batch_size=batch_size, node_threshold=node_threshold, edge_threshold=edge_threshold)
    ids = core.prompt_ids(source.config, tokenizer, text, warn)
    with session_of(source, run, None, "this graph says nothing about a trained model") as session:
        with session.progress("graph", "rows") as progress:
            result = core.attribute(session.model, tokenizer, read, text, ids, options, progress)
    if graph_out is not None:
        import json

        write_text(graph_out, json.dumps(graph_file.frontend_json(result, graph_out.stem)))
    if save is not None:
        from tfcli.errors import replace_atomically

        replace_atomically(save, lambda temporary: graph_file.save_tensors(result, Path(temporary)))
    color = out.color_system is not None
    emit([result], View(out, render.record, lambda shown, number: render.graph_lines(shown, out.width, color)),
         run.json_output)
