"""The commands that show a forward pass: tokenize, config, encode, compare, classify, generate. Each declares and
resolves its options, builds what it needs through `tfcli.cli.session`, calls its core module's pipeline
(`tfcli/<command>.py`; tokenize's is `tfcli/tokens.py`) and shows what that yields through `emit` and the renderer
of the same name in `tfcli/render/`. Heavy modules (torch, transformers, tokenizers) are imported inside the
commands, so that `--help` is quick."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tfcli import __version__
from tfcli.cli.app import app
from tfcli.cli.console import note, output_console, say, stderr_is_terminal, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.progress import with_progress
from tfcli.cli.session import ablation_of, inputs, noted, session_of, started
from tfcli.cli.options import (AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE, PROBABILITY, AblateOption, FileOption,
                               MaxLengthOption, PairOption, RunOptions, TextsArgument, shared_options)
from tfcli.errors import usage_error
from tfcli.render.layout import print_lines
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings, tokenized

if TYPE_CHECKING:
    from rich.text import Text


@app.command()
@shared_options(without=("device", "dtype", "seed", "report", "force"))
def tokenize(
    texts: TextsArgument = None,
    pair: PairOption = None,
    no_special: Annotated[bool, typer.Option("--no-special", help="Leave out special tokens ([CLS], [SEP], ...).")] = False,
    max_length: Annotated[int | None, typer.Option("--max-length", metavar="N", help="Truncate to at most N tokens.")] = None,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """Show how texts split into tokens: ids, segments, and the characters each token covers.

    \b
    Examples:
      tfcli tokenize "time flies like an arrow"
      tail -f log.txt | tfcli tokenize --json -
    """
    from tfcli import tokens as core
    from tfcli.render import tokens as render

    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file, keep_blank=True)
    tokenizer = noted(core.tokenizer_for(run.model, run.revision))
    batches = with_progress(texts_in.batches(core.BATCH_SIZE), "tokenize", len)
    encodings = core.run(tokenizer, batches, pair, not no_special, max_length, warn)
    emit(encodings, View(out, render.record,
                         lambda encoding, number: render.token_lines(encoding, number, tokenizer.name, out.width)),
         run.json_output)


def _one_source(positional: str | None, option: str | None) -> str | None:
    """A model source given as the positional SRC or as --model SRC (one habit works everywhere), not both."""
    if positional is not None and option is not None:
        raise usage_error("give the model source once: as SRC or with --model, not both")
    return positional if positional is not None else option


@app.command("config")
@shared_options(without=("device", "dtype", "seed", "report", "force"),
                json_output="JSON on stdout: one object.")
def show_config(
    source: Annotated[str | None, typer.Argument(metavar="SRC", show_default=False,
                                                 help="Path, bundled name or hub id (default: bert-base).")] = None,
    sites: Annotated[bool, typer.Option("--sites", help="List the model's named sites (what run_with_cache keeps "
                                        "and encode --sites saves) with their shapes.")] = False,
    *,
    run: RunOptions,
) -> None:
    """Print the resolved config of a model source and its parameter count, or with --sites its named sites.

    \b
    Examples:
      tfcli config tiny
      tfcli config --model path/to/checkpoint --json
      tfcli config gpt2-small --sites
    """
    from tfcli.api import describe
    from tfcli.render import config as render
    from tfcli.sources import bundled_names

    summary = describe(_one_source(source, run.model), run.revision, sites=sites)
    if run.json_output:
        from tfcli.render.jsonl import write_jsonl

        write_jsonl([render.record(summary)])
    else:
        out = output_console(run.width, run.color)
        lines = render.site_lines(summary, out.width) if sites else render.config_lines(summary, bundled_names(),
                                                                                          out.width)
        print_lines(out, lines)


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
    from tfcli import encode as core
    from tfcli.render import encode as render
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
        every_layer = list(range(max(source.config.num_hidden_layers, source.config.output_layers)))
        detail = None if layers is None else options.layers if options.layers is not None else every_layer
        view = render.View(detail, attention_top, out.color_system is not None, 1 if top_k is None else top_k,
                           lens=top_k is not None)
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


@app.command()
@shared_options(without=("seed", "report", "force"),
                dtype="float32, float16 or bfloat16: both models run in it.")
def compare(
    arguments: Annotated[list[str] | None, typer.Argument(metavar="SRC TEXT", show_default=False,
                                                          help="A checkpoint directory (config.json + weights), unless "
                                                          "--model gives it, then texts; `-` alone reads stdin.")] = None,
    file: FileOption = None,
    tolerance: Annotated[float | None, typer.Option(metavar="T", callback=POSITIVE, show_default=False,
                                                    help="Largest difference that counts as a match (default: 1e-4 "
                                                    "in float32; in bfloat16 0.05 and in float16 0.01 of each "
                                                    "tensor's largest value).")] = None,
    *,
    run: RunOptions,
) -> None:
    """Run transformers' own model on the same checkpoint and texts; print each tensor's max abs difference.
    Exits 1 when a difference exceeds --tolerance.

    \b
    Examples:
      tfcli compare path/to/checkpoint "time flies like an arrow"
      tfcli compare --model path/to/checkpoint --json - < texts.txt
    """
    from tfcli import compare as core
    from tfcli.render import compare as render

    arguments = list(arguments or [])
    model = run.model
    if model is None:
        if not arguments:
            raise usage_error("no model source given", "tfcli compare SRC TEXT... or tfcli compare --model SRC TEXT...")
        model = arguments.pop(0)
    elif arguments and _names_a_model(arguments[0], model):
        raise usage_error("give the model source once: as SRC or with --model, not both",
                          f"with --model every argument is a text: tfcli compare --model {model} TEXT...")
    out = output_console(run.width, run.color)
    texts_in = inputs(arguments or None, file)
    batches = started(texts_in.batches(1))
    models = core.load(model, run.device, run.revision, run.dtype)
    noted(models.tokenizer)
    positions = models.resolved.config.max_position_embeddings
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = (tokenized(models.tokenizer, batch, positions, truncated) for batch in batches)
    worst, failed, tolerance_said = 0.0, 0, ""

    def judged(comparisons: Iterator[core.Comparison]) -> Iterator[core.Comparison]:
        """The same comparisons, the largest difference and the failures counted on the way."""
        nonlocal worst, failed, tolerance_said
        for comparison in comparisons:
            worst = max(worst, comparison.worst_failure)
            failed += not comparison.matches
            tolerance_said = render.tolerance_words(comparison)
            yield comparison

    count = emit(judged(core.run_all(models, chunks, tolerance)),
                 View(out, render.record, lambda comparison, number: render.compare_lines(comparison, number,
                                                                                          out.width), spaced=True),
                 run.json_output, truncated=truncated)
    if failed:
        which = f"in {failed} of {count} texts " if count > 1 else ""
        say(f"largest difference {worst:.3g} {which}exceeds {tolerance_said}")
        raise typer.Exit(1)


def _names_a_model(argument: str, model: str) -> bool:
    """Whether compare's first text is in fact a model source (the --model one again, or a checkpoint path): the
    mistake `tfcli compare ckpt --model ckpt hi`, which would otherwise run the path as a text."""
    if argument == model:
        return True
    path = Path(argument)
    try:
        return (path.is_dir() and (path / "config.json").is_file()) or (
            path.is_file() and path.suffix.lower() in (".json", ".yaml", ".yml", ".gguf", ".safetensors", ".bin"))
    except OSError:  # a text too long to be a path
        return False


@app.command()
@shared_options(model="Model source with a classification head (default: the bundled `classifier`, random weights).")
def classify(
    texts: TextsArgument = None,
    top: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE,
                                            help="Show only the N most probable labels in the table.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Show what the first token attends to in the last "
                                          "layer(s), mean over heads.")] = False,
    explain_layers: Annotated[int | None, typer.Option("--explain-layers", metavar="N", callback=AT_LEAST_ONE,
                                                       help="Average --explain over the last N layers (default 1).")] = None,
    pair: PairOption = None,
    max_length: MaxLengthOption = None,
    file: FileOption = None,
    *,
    run: RunOptions,
) -> None:
    """Classify texts: every label's probability and the prediction; --explain shows why.

    \b
    Examples:
      tfcli classify --model path/to/classifier "I loved this film" "bad acting"
      tfcli classify --model path/to/nli-model --explain "A man is eating." \\
          --pair "Someone eats."
    """
    from tfcli import classify as core
    from tfcli.render import classify as render
    from tfcli.sources import resolve_source

    if explain_layers is not None and not explain:
        raise usage_error("--explain-layers goes with --explain", "add --explain to see the first token's attention")
    out = output_console(run.width, run.color)
    texts_in = inputs(texts, file)
    if run.report is not None:
        check_report_path(run.report, run.force, texts_in.count or 1)
    source = resolve_source(run.model or "classifier", run.revision)
    explained = (explain_layers or 1) if explain else 0
    core.check_options(source.config, explained)  # before building a model for nothing
    with session_of(source, run, None, "these probabilities say nothing about the texts") as session:
        tokenizer = session.tokenizer
        positions = source.config.max_position_embeddings
        truncated = CappedWarnings(warn, "texts truncated")
        chunks = (tokenized(tokenizer, batch, positions, truncated, pair, max_length)
                  for batch in texts_in.batches(core.BATCH_SIZE))
        chunks = started(chunks)
        loaded = session.model

        def lines(result: core.Classification, number: int) -> list[Text]:
            shown = render.classification_lines(result, number, out.width, top)
            why = [] if result.explanation is None else render.explanation_lines(result.explanation, out.width)
            return shown + why

        emit(core.run(loaded, tokenizer, session.counted(chunks, "classify", len), explained),
             View(out, render.record, lines, spaced=True), run.json_output, truncated=truncated,
             report=report_of(run.report, run.force, "classify", loaded, source))


def steering(specs: list[str] | None, layers: str | None, normalize: bool, config) -> tuple | None:
    """--steer PATH[:STRENGTH] (repeated), --steer-layers and --steer-normalize, read and checked against the
    model's config before it is built: (vectors, strengths, normalize, layers) for steer.steering_hooks and the
    blocks steered, or None without --steer (said on stderr: which files, strengths and blocks)."""
    if not specs:
        if layers is not None or normalize:
            raise usage_error("--steer-layers and --steer-normalize go with --steer PATH[:STRENGTH]")
        return None
    from tfcli.analysis.indices import parse_indices, spans
    from tfcli.analysis.vectors import load_vector

    vectors, strengths = [], []
    for spec in specs:
        path, _, strength = spec.rpartition(":")
        if not path or Path(spec).exists():
            path, strength = spec, "1"
        try:
            value = float(strength)
        except ValueError:
            raise usage_error(f"--steer {spec}: the strength `{strength}` is not a number",
                              "give PATH or PATH:STRENGTH, e.g. happy.gguf:4 or happy.gguf:-2") from None
        vectors.append(load_vector(path, config))
        strengths.append(value)
    chosen = parse_indices(layers, config.num_hidden_layers, "steer-layers", noun="blocks")
    blocks = sorted({layer for vector in vectors for layer in vector if chosen is None or layer in chosen})
    if not blocks:
        raise usage_error("--steer-layers leaves no block of the vectors to steer")
    note(f"steering: {', '.join(specs)} at blocks {spans(blocks)}" + (" (each position's norm kept)" if normalize
                                                                         else ""))
    return vectors, strengths, normalize, chosen, blocks


@app.command()
@shared_options(model="Model source with an LM head (default: the bundled `gpt2-small`, random weights).",
                seed="Seed of the random weights (when the model has none) and of sampling.",
                json_output="JSON Lines on stdout, one object per prompt.")
def generate(
    prompts: Annotated[list[str] | None, typer.Argument(metavar="PROMPT", show_default=False,
                                                        help="Prompts to continue; `-` alone reads stdin, one per line.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", metavar="N", callback=AT_LEAST_ONE,
                                                help="Stop after N new tokens.")] = 20,
    greedy: Annotated[bool, typer.Option("--greedy", help="Take the most probable token each step (the default "
                                         "when no sampling option is given).")] = False,
    temperature: Annotated[float | None, typer.Option(metavar="T", callback=POSITIVE,
                                                      help="Sample, dividing the logits by T (> 0).")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k", metavar="K", callback=AT_LEAST_ONE,
                                              help="Sample from the K most probable tokens.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", metavar="P", callback=PROBABILITY,
                                                help="Sample from the most probable tokens whose probabilities "
                                                "add up to P, in (0, 1].")] = None,
    lens: Annotated[bool, typer.Option("--lens", help="Show what each layer would have predicted at every step.")] = False,
    steer: Annotated[list[str] | None, typer.Option(metavar="PATH[:STRENGTH]", help="Add a steering vector (a "
                                                    "control-vector .gguf or .safetensors: tfcli steer fit, llama.cpp, "
                                                    "repeng; or SAE#N, an SAE's feature N) times STRENGTH (default 1) "
                                                    "to each of its blocks' output, at every position; several add "
                                                    "up.")] = None,
    steer_layers: Annotated[str | None, typer.Option("--steer-layers", metavar="LAYERS", help="Steer only these "
                                                     "blocks of the vectors, e.g. 10-20 (default: all they have).")] = None,
    steer_normalize: Annotated[bool, typer.Option("--steer-normalize", help="Keep each position's norm as it was "
                                                  "before the vector was added (repeng's normalize).")] = False,
    ablate: Annotated[list[str] | None, typer.Option(metavar="SITE", help="Zero a component while generating: a "
                                                     "head (L23H3), a sublayer's output (L5.mlp, L5.attn) or any "
                                                     "site name, * allowed; an SAE's feature, SAE#N (SAE#N=V: "
                                                     "clamped to V), its error term kept; repeatable.")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False,
                                              help="Read prompts from FILE, one per line.")] = None,
    *,
    run: RunOptions,
) -> None:
    """Continue prompts token by token: the text appears as it is made, then a step table (probability,
    alternatives, and with --lens each layer's guess).

    \b
    Examples:
      tfcli generate --model path/to/gpt2 -n 10 --lens "time flies like"
      tfcli generate --model path/to/gpt2 --temperature 0.8 --top-p 0.9 \\
          --seed 1 "Once upon a time"
      tfcli generate --model path/to/model.gguf --steer happy.gguf:4 "I feel"
    """
    from tfcli import generate as core
    from tfcli.model.decoding import Sampling
    from tfcli.render import generate as render
    from tfcli.sources import resolve_source

    do_sample = any(option is not None for option in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise usage_error("--greedy cannot be combined with --temperature, --top-k or --top-p",
                          "leave out --greedy to sample")
    out = output_console(run.width, run.color)
    prompts_in = inputs(prompts, file)
    if run.report is not None:
        check_report_path(run.report, run.force, prompts_in.count or 1)
    sampling = Sampling(do_sample, temperature if temperature is not None else 1.0, top_k, top_p, run.seed)
    source = resolve_source(run.model or core.DEFAULT_MODEL, run.revision)
    sampling.check(source.config.vocab_size)  # before the model is built
    vectors = steering(steer, steer_layers, steer_normalize, source.config)
    ablation = ablation_of(ablate, source.config, generating=True)
    ablations = ablation and ablation.hooks
    with session_of(source, run, None, "these continuations say nothing about the prompts") as session:
        tokenizer = session.tokenizer
        batches = (core.prompts(source.config, tokenizer, [item.text for item in batch], max_new_tokens)
                   for batch in prompts_in.batches(1))
        batches = started(batches)
        loaded = session.model
        # the text appears once, as it is made: on stdout when that is the terminal (the table follows without it),
        # else on stderr when that is a terminal (stdout, a file or pipe, gets the text with the table)
        live = sys.stdout if out.is_terminal and not run.json_output else sys.stderr if stderr_is_terminal() else None

        def show_text(piece: str) -> None:
            live.write(piece)
            live.flush()

        def ended(generations: Iterator[core.Generation]) -> Iterator[core.Generation]:
            """The same generations, each streamed text ended with its line."""
            for generation in generations:
                if live:
                    show_text("\n")
                yield generation

        hooks = ablations
        if vectors is not None:
            from tfcli.model.sites import merged
            from tfcli.analysis.vectors import steering_hooks

            hooks = merged(ablations, steering_hooks(loaded, *vectors[:4]))
        changed = render.changes_record(None if vectors is None else (steer, vectors[4], steer_normalize),
                                        ablation and ablation.specs)
        generations = core.run(loaded, tokenizer, batches, sampling, lens, show_text if live else None,
                               warn, hooks)
        emit(ended(generations),
             View(out, lambda result: render.record(result, tokenizer) | changed,
                  lambda result, number: render.generation_lines(result, tokenizer, number,
                                                                 run.seed if do_sample else None,
                                                                 out.width, with_text=live is not sys.stdout,
                                                                 changed=changed)),
             run.json_output, report=report_of(run.report, run.force, "generate", loaded, source, tokenizer))


