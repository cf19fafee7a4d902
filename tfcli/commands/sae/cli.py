"""`tfcli sae`: sparse autoencoders. `sae train` trains a top-k SAE (Gao et al. 2024) on a decoder's activations
at one site, streamed from a corpus, and writes it in SAELens's format, which `tfcli features --sae` and sae-lens
read (the core is core.py beside it; docs/sae.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import command_group
from tfcli.cli.console import output_console, warn
from tfcli.cli.output import View, emit
from tfcli.cli.session import inputs, session_of
from tfcli.cli.options import AT_LEAST_ONE, NOT_NEGATIVE, POSITIVE, RunOptions, shared_options
from tfcli.errors import usage_error

sae_app = command_group("sae", "Sparse autoencoders: train a top-k SAE on a model's activations, in SAELens's format "
                              "(read them with `tfcli features --sae`).")


@sae_app.command()
@shared_options(without=("report", "force"), default_model="gpt2-small",
                model="The decoder whose activations the SAE reads (default: the bundled `gpt2-small`, random "
                      "weights).",
                seed="The SAE's seed (its initial decoder, the buffers' shuffles), and a random model's.",
                json_output="Print the run as one JSON line.")
def train(
    site: Annotated[str | None, typer.Option(metavar="SITE", help="The site the SAE reads: one vector per token "
                                             "(blocks.L.resid_post; tfcli config --sites lists them).")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False, help="The corpus, "
                                              "one text per line (`-`: stdin).")] = None,
    out: Annotated[Path | None, typer.Option(metavar="DIR", help="Where the SAE goes (cfg.json, "
                                             "sae_weights.safetensors) with its checkpoint (training.pt).")] = None,
    expansion: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Latents: N times the "
                                                  "site's width (default 8).")] = None,
    latents: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Latents, instead of "
                                                "--expansion.")] = None,
    k: Annotated[int | None, typer.Option("--k", metavar="K", callback=AT_LEAST_ONE, help="Latents active per "
                                          "token (top k; default 32).")] = None,
    tokens: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Training tokens, held-out "
                                               "ones not counted (default 1,000,000); --resume may raise "
                                               "them.")] = None,
    batch: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens per step (default "
                                              "1024).")] = None,
    lr: Annotated[float | None, typer.Option(metavar="LR", callback=POSITIVE, help="Adam's learning rate "
                                             "(default: 2e-4 / sqrt(latents / 2^14), Gao et al.).")] = None,
    context: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens per window the "
                                                "model reads, its first position and special tokens left out "
                                                "(default 128).")] = None,
    buffer: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens of activations "
                                               "shuffled together (default 32768).")] = None,
    held_out: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="The corpus's first N "
                                                 "tokens, kept aside to report explained variance, L0 and dead "
                                                 "latents on (default 16384).")] = None,
    dead_after: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens without "
                                                   "firing before a latent is dead (AuxK revives it; default: "
                                                   "10M or a tenth of --tokens, the smaller).")] = None,
    outlier: Annotated[float | None, typer.Option(metavar="X", callback=NOT_NEGATIVE, help="Leave out tokens whose "
                                                  "norm is over X times the held-out's median (default 10; 0 keeps "
                                                  "every token).")] = None,
    resume: Annotated[Path | None, typer.Option(metavar="DIR", help="Continue the run whose checkpoint is in DIR "
                                                "(its options kept), on the same model and corpus.")] = None,
    transcoder: Annotated[bool, typer.Option("--transcoder", help="Train a transcoder per layer instead, every "
                                             "layer in one pass: the MLP's normalised input -> its output, written "
                                             "in circuit-tracer's format (config.yaml, layer_L.safetensors; `tfcli "
                                             "graph --transcoders` reads it) and SAELens's (saelens/layer_L/); no "
                                             "--site. Defaults then: --buffer 8192, --held-out 4096.")] = False,
    skip: Annotated[bool, typer.Option("--skip", help="With --transcoder: a skip matrix per layer too "
                                       "(y^ += W_skip x).")] = False,
    *,
    run: RunOptions,
) -> None:
    """Train a top-k sparse autoencoder on a decoder's activations at one site, streamed from a corpus, and write
    it in SAELens's format. Ctrl-C saves a checkpoint that --resume continues.

    \b
    Examples:
      tfcli sae train -m SmolLM2.gguf --site blocks.15.resid_post \\
          --file corpus.txt --tokens 500000 --out smollm2-sae
      tfcli sae train -m SmolLM2.gguf --transcoder --latents 1024 \\
          --file corpus.txt --tokens 200000 --out smollm2-transcoders
      tfcli graph "The capital of France is" -m SmolLM2.gguf --transcoders smollm2-transcoders
      tfcli sae train -m SmolLM2.gguf --file corpus.txt --resume smollm2-sae
      tfcli features -m SmolLM2.gguf --sae smollm2-sae --feature 7 --file corpus.txt
    """
    from tfcli.analysis.corpus import check_out, read_checkpoint
    from tfcli.commands.sae import core, render
    from tfcli.model.transformer import site_shapes
    from tfcli.sources import resolve_source

    screen = output_console(run.width, run.color)
    if file is None:
        raise usage_error("--file is required: the corpus, one text per line", "--file corpus.txt (`-`: stdin)")
    given = {"site": site, "k": k, "tokens": tokens, "batch": batch, "lr": lr, "context": context,
             "buffer": buffer, "held_out": held_out, "dead_after": dead_after, "outlier": outlier,
             "seed": run.seed or None}
    if transcoder or skip or (resume is not None and (resume / "config.yaml").is_file()):
        if site is not None:
            raise usage_error(f"--site {site}: --transcoder trains every layer's MLP (its input -> its output); "
                              "leave --site out", parameter="site")
        if skip and not transcoder and resume is None:
            raise usage_error("--skip is a transcoder's skip matrix: give --transcoder too", parameter="skip")
        train_transcoders(screen, file, out, expansion, latents, {**given, "skip": skip or None}, resume, run)
        return
    checkpoint = None
    if resume is not None:
        if expansion is not None or latents is not None:
            raise usage_error("--resume keeps the run's latents: leave --expansion and --latents out")
        checkpoint = read_checkpoint(resume, core.FORMAT, "tfcli sae train")
        options = resumed_options(resume, core.options_of(checkpoint), given)
        out = out or resume
    else:
        if site is None:
            raise usage_error("--site is required: the site the SAE reads", "--site blocks.L.resid_post (tfcli "
                              "config --sites lists them)")
        if out is None:
            raise usage_error("--out is required: the folder the SAE goes to", "--out my-sae")
        check_out(out, "its training")
        if expansion is not None and latents is not None:
            raise usage_error("give --expansion or --latents, not both")
    source = resolve_source(run.model, run.revision)
    if source.config.architecture != "decoder":
        raise usage_error(f"sae train reads a decoder's activations: {source.config.name} is an "
                          f"{source.config.architecture}", "give a decoder (-m)")
    d = core.check_site(options.site if checkpoint is not None else site, site_shapes(source.config))
    if checkpoint is None:
        options = core.TrainOptions(site=site, latents=latents or (expansion or 8) * d, seed=run.seed,
                                    **{name: value for name, value in given.items()
                                       if value is not None and name not in ("site", "seed")})
    core.check_options(options)
    options.tokens -= options.tokens % options.batch  # whole batches
    limit = source.config.max_position_embeddings
    if limit and options.context > limit:
        raise usage_error(f"--context {options.context}: the model has {limit} positions", parameter="context")
    stdin = str(file) == "-"  # --file - reads the texts of stdin, as a command's `-` argument does
    texts = ([item.text for item in chunk] for chunk in inputs(["-"] if stdin else None, None if stdin else file)
             .batches(64))
    with session_of(source, run, None, "the SAE learns a random model's activations",
                    unfinished="before the first step: nothing saved") as session:
        with session.progress("sae train", "tokens") as progress:
            result = core.train(session.model, session.tokenizer, texts, options, out, checkpoint, progress)
    if result.ran_out:
        warn(f"the corpus ran out after {result.tokens:,} training tokens, before --tokens {options.tokens:,}")
    from rich.text import Text

    emit([result], View(screen, render.record, lambda r, number: [Text(line) for line in render.summary(r)]),
         run.json_output)
    if result.interrupted:
        warn(f"interrupted: the checkpoint is in {out}; continue with --resume {out} (the same -m and --file)")
        raise typer.Exit(130)


def train_transcoders(screen, file: Path, out: Path | None, expansion: int | None, latents: int | None, given: dict,
                      resume: Path | None, run: RunOptions) -> None:
    """`sae train --transcoder`: the options read as sae train reads its own (`given`: those on the command line,
    None where left out, `skip` among them), then transcoder.train."""
    from tfcli.analysis.corpus import check_out, read_checkpoint
    from tfcli.commands.sae import render, transcoder
    from tfcli.sources import resolve_source

    given = {name: value for name, value in given.items() if name != "site"}
    checkpoint = None
    if resume is not None:
        if expansion is not None or latents is not None:
            raise usage_error("--resume keeps the run's latents: leave --expansion and --latents out")
        checkpoint = read_checkpoint(resume, transcoder.FORMAT, "tfcli sae train --transcoder")
        options = resumed_options(resume, transcoder.options_of(checkpoint), given)
        out = out or resume
    else:
        if out is None:
            raise usage_error("--out is required: the folder the transcoders go to", "--out my-transcoders")
        check_out(out, "its training")
        if expansion is not None and latents is not None:
            raise usage_error("give --expansion or --latents, not both")
    source = resolve_source(run.model, run.revision)
    if source.config.architecture != "decoder":
        raise usage_error(f"sae train --transcoder reads a decoder's MLPs: {source.config.name} is an "
                          f"{source.config.architecture}", "give a decoder (-m)")
    if checkpoint is None:
        options = transcoder.TranscoderOptions(
            latents=latents or (expansion or 8) * source.config.hidden_size, seed=run.seed,
            **{name: value for name, value in given.items() if value is not None and name != "seed"})
    from tfcli.commands.sae.core import check_options

    check_options(options)
    options.tokens -= options.tokens % options.batch
    limit = source.config.max_position_embeddings
    if limit and options.context > limit:
        raise usage_error(f"--context {options.context}: the model has {limit} positions", parameter="context")
    stdin = str(file) == "-"
    texts = ([item.text for item in chunk] for chunk in inputs(["-"] if stdin else None, None if stdin else file)
             .batches(64))
    with session_of(source, run, None, "the transcoders learn a random model's MLPs",
                    unfinished="before the first step: nothing saved") as session:
        transcoder.transcoder_sites(session.model)
        with session.progress("sae train --transcoder", "tokens") as progress:
            result = transcoder.train(session.model, session.tokenizer, texts, options, out, checkpoint, progress)
    if result.ran_out:
        warn(f"the corpus ran out after {result.tokens:,} training tokens, before --tokens {options.tokens:,}")
    emit([result], View(screen, render.transcoder_record, lambda r, number: render.transcoder_view(r, screen.width)),
         run.json_output)
    if result.interrupted:
        warn(f"interrupted: the checkpoint is in {out}; continue with --resume {out} (the same -m and --file)")
        raise typer.Exit(130)


def resumed_options(resume: Path, options, given: dict):
    """A checkpoint's options (an SAE's or transcoders'), refusing any option given that differs from them;
    `--tokens` may raise the run's tokens (to a whole number of batches)."""
    conflicts = [f"--{name.replace('_', '-')} {value}" for name, value in given.items()
                 if value is not None and name != "tokens" and value != getattr(options, name)]
    if conflicts:
        raise usage_error(f"--resume {resume}: {', '.join(conflicts)} "
                          f"{'differs' if len(conflicts) == 1 else 'differ'} from the run's options",
                          "a resumed run keeps its options: leave them out (--tokens may be raised)")
    tokens = given["tokens"]
    if tokens is not None and tokens < options.tokens:
        raise usage_error(f"--tokens {tokens}: the run trains on {options.tokens:,}; --resume may raise it only",
                          parameter="tokens")
    options.tokens = max(options.tokens, (tokens or 0) - (tokens or 0) % options.batch)
    return options
