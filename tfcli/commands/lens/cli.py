"""`tfcli lens`: the tuned lens. `lens fit` trains one on a corpus and writes it in tuned-lens's format; `lens eval`
says how a lens (tfcli's or tuned-lens's) reads a model's layers against the logit lens (core: core.py and
tfcli/analysis/tuned_lens.py; docs/lens.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import command_group
from tfcli.cli.console import output_console, warn
from tfcli.cli.options import AT_LEAST_ONE, RunOptions, shared_options
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.session import inputs, session_of
from tfcli.errors import usage_error

lens_app = command_group("lens", "The tuned lens: fit one on a corpus (tuned-lens's format), and measure it against "
                                 "the logit lens.")

FIGURES = (".svg", ".png", ".pdf")
CorpusOption = Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False,
                                                   help="The corpus, one text per line (`-`: stdin).")]
ContextOption = Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens per window the "
                                                   "model reads, its first position and special tokens left out "
                                                   "(default 128).")]
HeldOutOption = Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="The corpus's first N "
                                                   "tokens (whole windows), never trained on, that the lenses are "
                                                   "measured on (default 16384).")]


def corpus(file: Path | None):
    """The corpus's texts in batches of 64 (`-`: stdin)."""
    if file is None:
        raise usage_error("--file is required: the corpus, one text per line", "--file corpus.txt (`-`: stdin)")
    stdin = str(file) == "-"
    return ([item.text for item in chunk] for chunk in inputs(["-"] if stdin else None, None if stdin else file)
            .batches(64))


def check_figure(run: RunOptions) -> None:
    if run.report is not None:
        from tfcli.render.report_file import check_report_path

        if run.report.suffix.lower() not in FIGURES:
            raise usage_error(f"--report {run.report}: lens writes a figure: .svg, .png or .pdf")
        check_report_path(run.report, run.force, 1)


def decoder_source(run: RunOptions, what: str):
    from tfcli.analysis.tuned_lens import check_model
    from tfcli.sources import resolve_source

    source = resolve_source(run.model, run.revision)
    check_model(source.config, what)
    return source


@lens_app.command()
@shared_options(default_model="gpt2-small",
                model="The decoder the lens reads (default: the bundled `gpt2-small`, random weights).",
                json_output="Print the run as one JSON line.",
                report="Also write the held-out figure to PATH (.svg, .png, .pdf).")
def fit(
    file: CorpusOption = None,
    out: Annotated[Path | None, typer.Option(metavar="DIR", help="Where the lens goes (config.json, params.pt: "
                                             "tuned-lens's format) with its checkpoint (training.pt).")] = None,
    tokens: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Training tokens, held-out "
                                               "ones not counted (default 1,000,000).")] = None,
    batch: Annotated[int | None, typer.Option(metavar="N", callback=AT_LEAST_ONE, help="Tokens per step, whole "
                                              "windows (default 4096).")] = None,
    context: ContextOption = None,
    held_out: HeldOutOption = None,
    resume: Annotated[Path | None, typer.Option(metavar="DIR", help="Continue the run whose checkpoint is in DIR "
                                                "(its options kept), on the same model and corpus.")] = None,
    *,
    run: RunOptions,
) -> None:
    """Fit a tuned lens (an affine translator per layer, trained so that each layer's reading matches the model's
    final distribution) on a corpus, in tuned-lens's format; it ends with the held-out KL per layer, logit lens
    against tuned lens. Ctrl-C saves a checkpoint that --resume continues.

    \b
    Examples:
      tfcli lens fit -m SmolLM2.gguf --file corpus.txt --tokens 200000 \\
          --out smollm2-lens
      tfcli lens fit -m SmolLM2.gguf --file corpus.txt --resume smollm2-lens
      tfcli generate -m SmolLM2.gguf --lens tuned:smollm2-lens "Paris is in"
    """
    from tfcli.analysis.corpus import check_out, read_checkpoint
    from tfcli.commands.lens import core, render

    screen = output_console(run.width, run.color)
    texts = corpus(file)
    given = {"tokens": tokens, "batch": batch, "context": context, "held_out": held_out}
    checkpoint = None
    if resume is not None:
        checkpoint = read_checkpoint(resume, core.FORMAT, "tfcli lens fit")
        options = core.options_of(checkpoint)
        conflicts = [f"--{name.replace('_', '-')} {value}" for name, value in given.items()
                     if value is not None and value != getattr(options, name)]
        if conflicts:
            raise usage_error(f"--resume {resume}: {', '.join(conflicts)} "
                              f"{'differs' if len(conflicts) == 1 else 'differ'} from the run's options",
                              "a resumed run keeps its options: leave them out")
        out = out or resume
    else:
        if out is None:
            raise usage_error("--out is required: the folder the lens goes to", "--out my-lens")
        check_out(out, "its fit")
        options = core.FitOptions(**{name: value for name, value in given.items() if value is not None})
    core.check_options(options)
    check_figure(run)
    source = decoder_source(run, "lens fit")
    limit = source.config.max_position_embeddings
    if limit and options.context > limit:
        raise usage_error(f"--context {options.context}: the model has {limit} positions", parameter="context")
    with session_of(source, run, None, "the lens reads a random model", unfinished="before the first step: nothing "
                    "saved") as session:
        with session.progress("lens fit", "tokens") as progress:
            result, lens, held = core.fit(session.model, session.tokenizer, texts, options, out, checkpoint,
                                          progress)
        try:
            with session.progress("lens eval", "tokens") as progress:
                result.evaluated = core.evaluate(session.model, lens, held, str(out), options.pass_windows,
                                                 progress)
        except KeyboardInterrupt:
            warn(f"interrupted while measuring the lens on the held-out tokens: the lens is in {out}")
            raise typer.Exit(130) from None
        report = report_of(run.report, run.force, "lens", session.model, source)
    if result.ran_out:
        warn(f"the corpus ran out after {result.tokens:,} training tokens, before --tokens {options.tokens:,}")
    emit([result], View(screen, render.fit_record, lambda r, number: render.fit_lines(r, screen.width),
                        report=(render.page_section, render.figure)), run.json_output, report=report)
    if result.interrupted:
        warn(f"interrupted: the checkpoint is in {out}; continue with --resume {out} (the same -m and --file)")
        raise typer.Exit(130)


@lens_app.command("eval")
@shared_options(default_model="gpt2-small",
                model="The decoder the lens was fitted to (default: the bundled `gpt2-small`, random weights).",
                json_output="Print the evaluation as one JSON line.",
                report="Also write the figure to PATH (.svg, .png, .pdf).")
def evaluate(
    lens: Annotated[Path, typer.Argument(metavar="DIR", help="A tuned lens's folder (config.json, params.pt), "
                                         "tfcli's or tuned-lens's.", show_default=False)],
    file: CorpusOption = None,
    context: ContextOption = None,
    held_out: HeldOutOption = None,
    *,
    run: RunOptions,
) -> None:
    """Measure a tuned lens against the logit lens on a corpus's first tokens: per layer, the KL of the model's final
    distribution from each lens's, and how often each lens's top token is the model's.

    \b
    Examples:
      tfcli lens eval smollm2-lens -m SmolLM2.gguf --file corpus.txt
      tfcli lens eval smollm2-lens -m SmolLM2.gguf --file corpus.txt \\
          --report lens.svg
    """
    from tfcli.analysis import tuned_lens as tl
    from tfcli.commands.lens import core, render

    screen = output_console(run.width, run.color)
    texts = corpus(file)
    options = core.FitOptions(**{name: value for name, value in (("context", context), ("held_out", held_out))
                                 if value is not None})
    core.check_options(options)
    check_figure(run)
    source = decoder_source(run, "lens eval")
    tl.check_config(tl.read_config(lens, "lens eval"), source.config, lens, "lens eval")
    with session_of(source, run, None, "the lens reads a random model") as session:
        read = tl.read_lens(lens, session.model, "lens eval")
        held = core.held_out_of(session.tokenizer, session.model, texts, options)
        with session.progress("lens eval", "tokens") as progress:
            result = core.evaluate(session.model, read, held, str(lens), options.pass_windows, progress)
        report = report_of(run.report, run.force, "lens", session.model, source)
    emit([result], View(screen, render.record, lambda r, number: render.eval_lines(r, screen.width),
                        report=(render.page_section, render.figure)), run.json_output, report=report)
