"""`tfcli circuit`: which edges between a decoder's components carry a task, and how faithful the circuit they make is
(core.py), over one clean/corrupt pair or a --dataset of them. The edges' scores run through the runner
(`run_dataset`: progress, Ctrl-C, --per-item, --ray); the circuit's faithfulness is then measured over the same
pairs through the runner again (on the same Ray cluster with --ray), a run per batch of circuits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, say
from tfcli.cli.options import DatasetFlags, FoilOption, PositionOption, RunOptions, TargetOption, shared_options
from tfcli.cli.output import View, write_text
from tfcli.cli.session import analyse, pair_ids, run_dataset, session_of, warn_spacing
from tfcli.errors import check_output_file, usage_error
from tfcli.render.report_file import check_report_path


@app.command()
@shared_options(default_model="gpt2-small", dataset=True,
                model="Model source: a pre-norm decoder with an LM head (default: the bundled `gpt2-small`, random "
                      "weights).",
                json_output="One JSON object on stdout: every edge with its score, the circuit, its faithfulness "
                            "and the curve (with --per-item, each pair's first).")
def circuit(
    clean: Annotated[str | None, typer.Argument(metavar="CLEAN", help="The clean text.", show_default=False)] = None,
    corrupt: Annotated[str | None, typer.Argument(metavar="CORRUPT", help="The corrupted text (as many tokens as "
                                                  "CLEAN): the counterfactual every edge is patched from (not "
                                                  "needed with --counterfactual mean).",
                                                  show_default=False)] = None,
    target: TargetOption = None,
    foil: FoilOption = None,
    position: PositionOption = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="eap-ig-inputs (edge attribution patching with "
                                        "integrated gradients on the inputs: the default), eap (one gradient: faster), "
                                        "eap-ig-activations (on each "
                                        "layer's outputs), exact (each edge patched: small models) or edge-pruning "
                                        "(a mask per edge trained for faithfulness); several, comma-separated "
                                        "(eap,eap-ig-inputs,edge-pruning): each one's curve over the same pairs and "
                                        "the paired intervals of their differences.")] = "eap-ig-inputs",
    ig_steps: Annotated[int, typer.Option(metavar="N", help="eap-ig-inputs, eap-ig-activations: the points between "
                                          "the counterfactual and the clean values.")] = 5,
    steps: Annotated[int, typer.Option(metavar="N", help="edge-pruning: the masks' training steps (a batch of 8 "
                                       "pairs each; Ctrl-C stops the training and keeps the masks so far).")] = 200,
    target_edges: Annotated[int | None, typer.Option(metavar="N", help="edge-pruning: the edges the masks are "
                                                     "trained to keep (the circuit picked without --top, --faithful "
                                                     "or --edges; default 1,000, or the graph's edges if "
                                                     "fewer).")] = None,
    counterfactual: Annotated[str, typer.Option(metavar="KIND", help="What an edge is patched to: corrupt (the "
                                                "sender's output on the corrupt text) or mean (its mean over the "
                                                "clean text's positions but the first, the attention sink, which "
                                                "keeps its own).")] = "corrupt",
    positions: Annotated[str, typer.Option(metavar="KIND", help="all (an edge is one edge at every position) or "
                                           "spans (every edge scored and kept per position span, the spans the "
                                           "--dataset's lines name: an (edge, span) pair counts as one edge; eap or "
                                           "eap-ig-inputs).")] = "all",
    top: Annotated[int | None, typer.Option(metavar="N", help="The circuit: the greedy top N edges (default "
                                            "100).")] = None,
    faithful: Annotated[float | None, typer.Option(metavar="F", help="The circuit: the smallest greedy one found "
                                                   "whose faithfulness reaches F (0 to 1).")] = None,
    edges: Annotated[Path | None, typer.Option(metavar="FILE", help="The circuit: the edges in FILE (a line each, "
                                               "`L5H1 -> L9H6.q`, with --positions spans `L5H1 -> L9H6.q@s2`; "
                                               "or a graph in the EAP-IG reference's JSON).")] = None,
    sizes: Annotated[str | None, typer.Option(metavar="SIZES", help="The faithfulness curve's circuit sizes in edges "
                                              "(default 10,30,100,300,1000).")] = None,
    show: Annotated[int, typer.Option(metavar="N", help="Edges listed by |score|.")] = 20,
    graph_out: Annotated[Path | None, typer.Option(metavar="FILE.json", help="Also write the graph (every edge's "
                                                   "score, the circuit) in the EAP-IG reference's JSON.")] = None,
    compare_runs: Annotated[list[str] | None, typer.Option("--compare", metavar="FILE", help="Instead of a run: "
                                                           "the curves of --dataset --json records made apart over "
                                                           "the same pairs (give it twice or more, e.g. one "
                                                           "with --positions spans), side by side, with the paired "
                                                           "intervals of their differences; no model is built.")
                            ] = None,
    *,
    run: RunOptions,
    data: DatasetFlags,
) -> None:
    """Score every edge between the input, the heads, the MLPs and the logits (EAP-IG, EAP, exact patching or Edge
    Pruning), pick a circuit and measure its faithfulness with every other edge patched; or compare stored runs.

    \b
    Examples:
      tfcli circuit -m path/to/gpt2 --target " Mary" --foil " John" \\
          "When Mary and John went to the store, John gave a drink to" \\
          "When John and Mary went to the store, Mary gave a drink to"
      tfcli task ioi -m path/to/gpt2 --n 100 > ioi.jsonl
      tfcli circuit -m path/to/gpt2 --dataset ioi.jsonl --faithful 0.8
      tfcli circuit -m path/to/gpt2 --dataset ioi.jsonl --top 200 \\
          --graph-out circuit.json --report circuit.html
      tfcli circuit -m path/to/gpt2 --dataset ioi.jsonl \\
          --method eap-ig-inputs,eap --json > both.json
      tfcli circuit -m path/to/gpt2 --dataset ioi.jsonl \\
          --positions spans --json > spans.json
      tfcli circuit --compare both.json --compare spans.json
    """
    from tfcli.commands.circuit import compare, core, graph_file
    from tfcli.analysis.dataset import Dataset, line_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair
    from tfcli.commands.circuit import render
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    color = out.color_system is not None
    if compare_runs:
        if clean is not None or data.dataset is not None:
            raise usage_error("--compare reads stored runs: give no CLEAN text or --dataset", parameter="compare_runs")
        from tfcli.analysis.dataset import BOOTSTRAP
        from tfcli.cli.output import emit
        from tfcli.commands.circuit import render_compare

        records = [(path, compare.read_record(path)) for path in compare_runs]
        if sum(len(record.get("methods", [record])) for _, record in records) < 2:
            raise usage_error("--compare needs two curves or more: give two files (or one of several methods)",
                              parameter="compare_runs")
        compared = compare.compare_stored(records, BOOTSTRAP if data.bootstrap is None else data.bootstrap)
        emit([compared], View(out, render_compare.stored_record,
                              lambda value, number: render_compare.stored_lines(value, out.width, color)),
             run.json_output)
        return
    if run.report is not None:
        check_report_path(run.report, run.force, 1)
    if graph_out is not None:
        check_output_file(graph_out, run.force, "give a file name ending in .json", "--graph-out")
    if show < 1:
        raise usage_error(f"--show must be 1 or more, got {show}", parameter="show")
    cluster = data.cluster(data.dataset is not None, "a --dataset")
    options = core.CircuitOptions(method=method, steps=ig_steps, top=top, faithful=faithful, edges=None,
                                  edges_file=None if edges is None else str(edges), sizes=core.parse_sizes(sizes),
                                  counterfactual=counterfactual, positions=positions,
                                  train_steps=steps, target_edges=target_edges)
    if data.dataset is not None:
        if clean is not None:
            raise usage_error("give CLEAN CORRUPT or --dataset, not both")
        data.each_line_has(target=target, foil=foil, position=position)
    else:
        data.only_with_a_dataset("bootstrap", "per_item", "skip_bad")
        if corrupt is None and counterfactual == "mean":
            corrupt = clean  # not read: each edge is patched to the clean outputs' means
        if clean is None or corrupt is None:
            raise usage_error("give a CLEAN and a CORRUPT text (or --dataset FILE)")
        if target is None:
            raise usage_error("give --target: the token whose logit is the metric", parameter="target")
        if positions == "spans":
            raise usage_error("--positions spans reads the spans of a --dataset's lines",
                              "write the pair as a line with its `spans` (docs/datasets.md#spans)",
                              parameter="positions")
    source = resolve_source(run.model, run.revision)
    core.check_options(source.config, options)  # before the model is built
    graph = core.graph_of(source.config)
    if edges is not None and positions == "spans":  # placed at the dataset's spans once it is read
        options.span_edges = graph_file.read_edges(str(edges), graph, spans=True)
    elif edges is not None:
        options.edges = graph_file.read_edges(str(edges), graph)
    several = len(options.methods) > 1
    if compare.PRUNING in options.methods or several:
        if data.per_item:
            raise usage_error("--per-item shows one method's scores of each pair: give one --method other than "
                              "edge-pruning (its masks are trained over all the pairs)", parameter="per_item")
        if graph_out is not None and several:
            raise usage_error("--graph-out writes one method's graph: give one --method", parameter="graph_out")
    analysis = compare.first_stage(options, graph)
    random_means = "these edges say nothing about a trained model"

    def measure(session, scored) -> None:
        """The circuit's later stages on the command's session: the circuit picked and the curve, measured over the
        pairs scored (a run per batch of circuits, on the --ray workers when given, as the scores); and --graph-out."""
        result, pairs = scored.value, scored.dataset()

        def faithfulness(circuits, ends):
            done = session.run(core.CircuitFaithfulness(circuits, options.counterfactual, ends, result.graph), pairs,
                               stage="faithfulness")
            return done.value if done.value is not None else core.Measured([], None, None, 0, True)
        if options.methods != [result.method] or result.method == compare.PRUNING:
            scored.value = several_methods(session, scored)
        else:
            core.measure(result, options, faithfulness, say, scored.interrupted)
        if graph_out is not None:  # one method's Circuit (several are refused above)
            write_text(graph_out, json.dumps(graph_file.reference_json(scored.value,
                                                                       session.model.config.hidden_size)))

    def several_methods(session, scored):
        """edge-pruning, or several methods: each method's scores over the first stage's pairs (edge-pruning: its
        masks trained), then each one's circuit and curve and their paired differences (compare.py). One method:
        its Circuit; several: their Comparison."""
        import dataclasses

        from tfcli.commands.circuit import pruning

        first, pairs = scored.value, scored.dataset()
        circuits = []
        for method in options.methods:
            if method == compare.PRUNING:
                with session.progress("edge pruning", "steps") as progress:
                    trained = pruning.train(session.model, session.tokenizer, pairs.items, options.counterfactual,
                                            pruning.PruningOptions(steps=options.train_steps,
                                                                   target_edges=options.target_edges or
                                                                   pruning.TARGET_EDGES), progress)
                session.interrupted |= trained.interrupted
                circuits.append(dataclasses.replace(first, method=method, training=trained))
            elif method == first.method:
                circuits.append(first)
            else:
                done = session.run(core.CircuitScores(dataclasses.replace(options, method=method), graph), pairs,
                                   stage=method)
                if done.value is None:
                    say(f"{method}: interrupted before any pair was scored; left out")
                    continue
                circuits.append(done.value)

        def rows(circuits, ends, over):
            stage = f"{runs.method} faithfulness" if several and runs.method else "faithfulness"
            done = session.run(compare.RowsOf(circuits, options.counterfactual, ends), over, stage=stage)
            return done.value
        runs = compare.Faithfulness(rows, pairs)
        comparison = compare.compared(circuits, options, runs, say, scored.interrupted or session.interrupted)
        return comparison if several else circuits[0]

    if several:
        from tfcli.commands.circuit import render_compare

        views = (None, View(out, render_compare.record, lambda run, number: render_compare.lines(run, out.width, color),
                            of_run=True, report=(render_compare.page_section, render_compare.figure)))
    else:
        views = (View(out, render.pair_record, lambda result, number: render.pair_lines(result, out.width, color)),
                 View(out, render.record, lambda run, number: render.circuit_lines(run, out.width, color, show),
                      of_run=True))
    if data.dataset is not None:
        run_dataset(analysis, source, data.options(cluster), run, views, random_means, after=measure)
        return
    with session_of(source, run, None, random_means) as session:
        warn_spacing(session.tokenizer, target, foil)
        pair_ids(source, session.tokenizer, clean, corrupt)  # two lengths: the alignment and a hint, as patch shows
        pair = check_pair(source.config, session.tokenizer, line_of(1, {"clean": clean, "corrupt": corrupt,
                                                                         "target": target, "foil": foil,
                                                                         "position": position}, PAIR_LINE))
        pair.line = None
        analyse(session, analysis, Dataset("", [pair], 0, 0), source, run, views, after=measure)
