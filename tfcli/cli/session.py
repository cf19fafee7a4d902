"""What a command that builds a model shares: its input texts, its tokenizer and model (said on stderr as they are
made), its session (tfcli/runner.py: one tokenizer, model, Ray pool, progress display per stage and Ctrl-C rule for
every stage of the command), and `run_dataset`, an analysis over a dataset or texts shown as the command shows
it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from tfcli.cli.console import note, say, say_lines, stderr_width, warn
from tfcli.cli.output import View, emit, report_of
from tfcli.cli.progress import count_bar, with_progress
from tfcli.texts import Inputs

if TYPE_CHECKING:
    from tfcli.cli.options import DatasetOptions, RunOptions
    from tfcli.model import TransformerModel
    from tfcli.runner import Session
    from tfcli.analysis.dataset import Envelope
    from tfcli.sources import Source
    from tfcli.tokenizer import Tokenizer

T = TypeVar("T")


def inputs(texts: list[str] | None, file: Path | None, keep_blank: bool = False) -> Inputs:
    return Inputs(texts, file, keep_blank, warn)

def noted(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer, after saying on stderr what a person should know about it (the bundled one standing in
    for a model directory that has none)."""
    if tokenizer.note:
        warn(tokenizer.note)
    return tokenizer

def tokenizer_of(source: Source) -> Tokenizer:
    from tfcli.api import load_tokenizer_for

    return noted(load_tokenizer_for(source))

def started(items: Iterator[T]) -> Iterator[T]:
    """The same items, the first one read now: before a model is built, so that a bad or empty input
    fails early."""
    first = next(items)
    return chain([first], items)

def build(source: Source, run: RunOptions, random_means: str | None = None) -> TransformerModel:
    """The model of a resolved source, built on --device in --dtype (--seed: its random weights, where it has no
    weights); says on stderr where its weights came from, and with `random_means` (what the results say nothing
    about), warns when they are random."""
    from tfcli.api import build_model

    model = build_model(source, device=run.device, dtype=run.dtype, seed=run.seed)
    paths = [str(source.weights)] if source.weights is not None else []
    say(f"model: {model.config.name} ({model.config.architecture}); weights: {model.weights_description}",
        whole=paths + [source.description])
    if random_means is not None and not model.trained:
        warn(f"random weights: {random_means}")
    return model

def pair_ids(source: Source, tokenizer: Tokenizer, clean: str, corrupt: str) -> tuple[list[int], list[int]]:
    """The clean and corrupt texts' ids for the source's model (analysis.pairs.pair_inputs); when their lengths
    differ, the two tokenizations aligned on stderr before the error (its hint says how to reword)."""
    from tfcli.analysis.pairs import LengthMismatch, pair_inputs
    from tfcli.render.pairs import alignment_lines

    try:
        return pair_inputs(source.config, tokenizer, clean, corrupt)
    except LengthMismatch as mismatch:
        say_lines(alignment_lines(mismatch.rows, stderr_width(80)))
        raise

def ablation_of(specs: list[str] | None, config, generating: bool = False):
    """--ablate checked against the model's config before it is built (tfcli.analysis.ablation), and said on stderr;
    None without it."""
    from tfcli.analysis.ablation import ablation

    result = ablation(specs, config, generating)
    if result is not None:
        note(f"ablating: {result.label()}")
    return result

def warn_spacing(tokenizer: Tokenizer, target: str | None, foil: str | None) -> None:
    """A --target or --foil given without the leading space its word has after a space (" Mary"): said on stderr."""
    from tfcli.analysis.metric import spacing_hint

    for option, spec in (("--target", target), ("--foil", foil)):
        hint = spacing_hint(tokenizer, spec, option)
        if hint is not None:
            warn(hint)

@contextlib.contextmanager
def session_of(source: Source, run: RunOptions, ray: Any = None, random_means: str | None = None,
               unfinished: str | None = None) -> Iterator[Session]:
    """The command's session (tfcli.runner.Session) on the resolved `source`: its tokenizer, loaded when first asked
    for (`tokenizer_of`), its model, built when first asked for (`build`, with `random_means`), a progress display per
    stage (`count_bar`), and with `ray` (checked settings, or None) the Ray workers, started by the first run. A
    Ctrl-C that no stage kept anything of (a KeyboardInterrupt out of the session), with `unfinished` (what is then
    lost), is said and exits 130."""
    from tfcli import runner

    cluster = None if ray is None else runner.Cluster(ray, run.spec(), note)
    try:
        with runner.Session(source.config, lambda: tokenizer_of(source), lambda: build(source, run, random_means),
                            runner.Display(count_bar, with_progress, warn, note), cluster) as session:
            yield session
    except KeyboardInterrupt:
        if unfinished is None:
            raise
        warn(f"interrupted {unfinished}")
        raise typer.Exit(130) from None


def run_dataset(analysis, source: Source, given: DatasetOptions, run: RunOptions, views: tuple[View, View | None],
                random_means: str, after: Callable[[Session, Envelope], None] | None = None) -> None:
    """An analysis over a dataset or texts (tfcli/runner.py) in the command's session: every line read and checked
    before the model is built (a stream's first batch), then `analyse`."""
    from tfcli.runner import CHUNK

    with session_of(source, run, given.ray, random_means) as session:
        if given.texts is not None:
            batches = ([(item.text, item.where) for item in batch]
                       for batch in given.texts.batches(CHUNK if analysis.streams else None))
            dataset = session.read(analysis, None, batches, bootstrap=given.bootstrap)
            dataset.expected = given.texts.expected  # a file's lines: the progress counts against them
        else:
            dataset = session.read(analysis, given.path, skip_bad=given.skip_bad, bootstrap=given.bootstrap)
        analyse(session, analysis, dataset, source, run, views, given.per_item, after)


def analyse(session: Session, analysis, dataset, source: Source, run: RunOptions, views: tuple[View, View | None],
            per_item: bool = False, after: Callable[[Session, Envelope], None] | None = None) -> None:
    """The analysis's first stage over `dataset` in `session` (the model built first), each item's result shown as a
    single run shows it (--per-item: `views[0]`); `after(session, first stage's Envelope)`, the command's later
    stages on the same session (each over the items the first finished: `Envelope.dataset()`); then the aggregate
    (`views[1]`), its JSON or view and --report; without an aggregate view (None: one text given alone), the one
    item's result, shown as a single run shows it. Ctrl-C in a stage ends that stage with what finished; the
    aggregate is shown and the command exits 130 (nothing finished in the first: nothing to show)."""
    session.model  # built before the run: its line on stderr comes before the run's
    item_view, view = views
    shown = 0
    results: list = []  # without an aggregate view: the one item's result

    def each(result) -> None:
        nonlocal shown
        shown += 1
        if item_view.spaced and shown > 1 and not run.json_output:
            item_view.out.print()
        emit([result], item_view, run.json_output, first=shown)
    done = session.run(analysis, dataset, each if per_item else results.append if view is None else None)
    if done.value is None:
        warn(f"interrupted before any of the {analysis.unit} finished: nothing to show")
        raise typer.Exit(130)
    if after is not None:
        after(session, done)
    session.close()  # the stages are done: the workers go before the results are shown
    done.interrupted = session.interrupted  # any stage cut short
    report = report_of(run.report, run.force, analysis.command, session.model, source)
    if view is None:
        emit(results, item_view, run.json_output, report=report)
    else:
        emit([done if view.of_run else done.value], view, run.json_output, report=report)
    if session.interrupted:
        warn(f"interrupted: {done.n} {analysis.unit} finished; the aggregate is theirs")
        raise typer.Exit(130)
