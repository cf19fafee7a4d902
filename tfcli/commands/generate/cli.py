"""tfcli generate: the command line (its options, its session, its output)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import note, output_console, stderr_is_terminal, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import ablation_of, inputs, session_of, started
from tfcli.cli.options import AT_LEAST_ONE, POSITIVE, PROBABILITY, RunOptions, shared_options
from tfcli.errors import named_for, usage_error
from tfcli.render.report_file import check_report_path

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
        with named_for(f"--steer {spec}"):  # an SAE's feature (SAE#N) is read by the SAE's reader
            vectors.append(load_vector(path, config))
        strengths.append(value)
    chosen = parse_indices(layers, config.num_hidden_layers, "steer-layers", noun="blocks")
    blocks = sorted({layer for vector in vectors for layer in vector if chosen is None or layer in chosen})
    if not blocks:
        raise usage_error("--steer-layers leaves no block of the vectors to steer")
    note(f"steering: {', '.join(specs)} at blocks {spans(blocks)}" + (" (each position's norm kept)" if normalize
                                                                         else ""))
    return vectors, strengths, normalize, chosen, blocks


def feature_scales(model, batches: Iterator[list], specs: list[str]) -> tuple[Iterator[list], dict[tuple, list]]:
    """The prompts' batches, passed on as they come, and {prompt's ids: [{spec, feature, block, strength, activation,
    site_norm, share}, ...]}, filled as each prompt passes: for each --steer SAE#N:S, what S means on that prompt
    (core.feature_scale). Nothing without a feature among the specs."""
    from tfcli.analysis.sae import read_sae
    from tfcli.commands.generate import core

    features = []
    for spec in specs:
        path, _, strength = spec.rpartition(":")
        if not path or Path(spec).exists():
            path, strength = spec, "1"
        folder, _, number = path.rpartition("#")
        if folder and not Path(path).exists():
            features.append((spec, read_sae(folder), int(number), float(strength)))
    scales: dict[tuple, list] = {}

    def measured(batches: Iterator[list]) -> Iterator[list]:
        for batch in batches:
            for prompt in batch:
                scales[tuple(prompt.ids)] = [{"spec": spec, "feature": n, "block": int(sae.site.split(".")[1])}
                                      | core.feature_scale(model, prompt.ids, sae, n, strength)
                                      for spec, sae, n, strength in features]
            yield batch
    return (measured(batches) if features else batches), scales


def lens_value(lens: bool, prompts: list[str] | None) -> tuple[list[str] | None, Path | None]:
    """`--lens` is a flag, so that `--lens "time flies"` stays a prompt; its value, `logit` or `tuned:DIR`, is the
    first argument of that form, taken from the prompts: (the prompts left, the tuned lens's folder or None)."""
    from tfcli.analysis.tuned_lens import lens_folder

    given = [p for p in prompts or () if p == "logit" or p.startswith("tuned:")]
    if not lens or not given:
        return prompts, None
    left = list(prompts)
    left.remove(given[0])
    return left or None, lens_folder(given[0])


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
    lens: Annotated[bool, typer.Option("--lens", help="Show what each layer would have predicted at every step "
                                       "(the logit lens; `--lens tuned:DIR`: a tuned lens's folder, tfcli lens fit "
                                       "or tuned-lens).")] = False,
    steer: Annotated[list[str] | None, typer.Option(metavar="PATH[:STRENGTH]", help="Add a steering vector (a "
                                                    "control-vector .gguf or .safetensors: tfcli steer fit, llama.cpp, "
                                                    "repeng; or SAE#N, an SAE's feature N, or a transcoder's) times "
                                                    "STRENGTH (default 1) "
                                                    "to each of its blocks' output, at every position; several add "
                                                    "up. A feature's STRENGTH is in its activation units (SAE#N:30: "
                                                    "as if it were 30 more active); the view says how active it is on "
                                                    "the prompt and what share of the block's norm that adds.")] = None,
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
    import functools

    from tfcli.analysis.tuned_lens import check_lens, read_lens
    from tfcli.commands.generate import core
    from tfcli.model.decoding import Sampling
    from tfcli.commands.generate import render
    from tfcli.sources import resolve_source

    do_sample = any(option is not None for option in (temperature, top_k, top_p))
    if greedy and do_sample:
        raise usage_error("--greedy cannot be combined with --temperature, --top-k or --top-p",
                          "leave out --greedy to sample")
    out = output_console(run.width, run.color)
    prompts, tuned = lens_value(lens, prompts)
    prompts_in = inputs(prompts, file)
    if run.report is not None:
        check_report_path(run.report, run.force, prompts_in.count or 1)
    sampling = Sampling(do_sample, temperature if temperature is not None else 1.0, top_k, top_p, run.seed)
    source = resolve_source(run.model or core.DEFAULT_MODEL, run.revision)
    sampling.check(source.config.vocab_size)  # before the model is built
    if tuned is not None:
        check_lens(tuned, source.config)
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
                generation.lens_from = None if tuned is None else str(tuned)
                if live:
                    show_text("\n")
                yield generation

        scales: dict[tuple, list] = {}
        if vectors is not None:
            batches, scales = feature_scales(loaded, batches, steer)
        hooks = ablations
        if vectors is not None:
            from tfcli.model.sites import merged
            from tfcli.analysis.vectors import steering_hooks

            hooks = merged(ablations, steering_hooks(loaded, *vectors[:4]))
        changed = render.changes_record(None if vectors is None else (steer, vectors[4], steer_normalize),
                                        ablation and ablation.specs)
        if tuned is not None:  # the tuned lens's translators, then the logit lens's one product, every step
            read = read_lens(tuned, loaded, "--lens")
            lens = functools.partial(read.unembed, loaded, layers=list(range(read.layers + 1)))
        generations = core.run(loaded, tokenizer, batches, sampling, lens, show_text if live else None,
                               warn, hooks)
        emit(ended(generations),
             View(out, lambda result: render.record(result, tokenizer) | render.scaled(changed, scales, result),
                  lambda result, number: render.generation_lines(result, tokenizer, number,
                                                                 run.seed if do_sample else None,
                                                                 out.width, with_text=live is not sys.stdout,
                                                                 changed=render.scaled(changed, scales, result))),
             run.json_output, report=report_of(run.report, run.force, "generate", loaded, source, tokenizer))
