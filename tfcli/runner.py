"""One way to run any analysis over many items, on this process or on a Ray cluster (docs/adding-an-analysis.md).

An analysis declares only what is its own (`Analysis`): what one item is (a dataset line, or a text of the
arguments, stdin or --file read as the line {"text": TEXT}; checked before any model is built), each item's result
on a model (a batch of items at a time), how one item's result shows alone, and the aggregate over the items. The
runner does the rest, the same for every analysis: the lines read and checked (a bad one named by its number, or
skipped and counted with --skip-bad), the bootstrap's resamples, the items run here or in blocks on Ray workers
(tfcli/cluster.py: the same per-item results travel back and are aggregated by the same code, in dataset order),
each item's result handed on as it comes (--per-item), the progress, and Ctrl-C, which keeps what finished. A command's
stages share one `Session` (one tokenizer, model, pool of Ray workers, progress display per stage, interrupt rule),
each stage's run an `Envelope`. What a person sees (the bar, the views, JSON, --report) is the command line's
(tfcli/cli/session.py: `session_of`, `run_dataset`).

Nothing here imports torch, Ray or a command's core module.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tfcli.analysis.dataset import (BOOTSTRAP, Dataset, Done, Envelope, Line, LineSpec, check_bootstrap, checked,
                                    line_of, read_lines)
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from tfcli.cluster import ModelSpec, RaySettings
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

Item = TypeVar("Item")
Result = TypeVar("Result")
CHUNK = 256  # texts of a stream read and run at a time (a batch also ends where no further line is ready yet)
Progress = Callable[..., None]  # progress(items done, in fractions while a batch runs; items; note="")


class Analysis(Protocol[Item, Result]):
    """What an analysis declares; an instance holds the run's options (it travels to Ray workers: keep it
    picklable). `command` names it (its progress bar, its report), `unit` what its items are ("pairs"), `line` the
    keys of a dataset line, `block` the most items a Ray worker runs at a time (None: the cluster's default).
    `streams`: texts (not a dataset) are read, checked and run a batch at a time as they come (a corpus of any
    length, its first batch checked before the model is built), for an analysis that checks nothing across items
    and has no bootstrap; otherwise every item is read and checked before the model is built."""

    command: str
    unit: str
    line: LineSpec
    block: int | None
    streams: bool  # texts run as they are read, in flat memory: no check across items, no bootstrap

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Item:
        """One line read as an item, checked as a single run's input is, before any model is built (a TfcliError
        names what is wrong: the runner adds the line's number)."""

    def check_items(self, items: list[Item]) -> None:
        """What must hold across the items (e.g. one kind of metric), before any model is built."""

    def results(self, model: TransformerModel, tokenizer: Tokenizer, items: list[Item],
                progress: Callable[[float], None] | None) -> Iterator[Result]:
        """Each item's result, in order (batch them as suits the analysis); `progress(items done)`, in fractions of
        an item where a batch reports as it goes. Ctrl-C: KeyboardInterrupt after the results yielded."""

    def shown(self, result: Result) -> Result:
        """An item's result as a single run shows it (--per-item)."""

    def aggregate(self, done: Done, dataset: Dataset) -> Any:
        """The aggregate over the items' results as they come (`done`, (item, result) in dataset order: iterate it
        once, and keep only what the aggregate needs, so that a long corpus runs in flat memory). After the
        iteration, `done.interrupted` says whether Ctrl-C ended it before the dataset's end. The counts (items, lines
        skipped, resamples, interrupted, the dataset's path) are the run's Envelope's, not the aggregate's."""


def read_dataset(analysis: Analysis, config: ModelConfig, tokenizer: Tokenizer, path: str, skip_bad: bool,
                 bootstrap: int | None, warn: Callable[[str], None]) -> Dataset:
    """Every line of `path` read and checked before the model is built (a bad one refused naming its line, or
    skipped, said through `warn` and counted with `skip_bad`), what must hold across the items, and the bootstrap's
    resamples (`bootstrap` None: the default, 0 where the items are too few, said through `warn`)."""
    from tfcli.texts import CappedWarnings

    bad = CappedWarnings(warn, "bad lines skipped")
    items = checked(read_lines(path), analysis.line, lambda line: analysis.check(config, tokenizer, line), skip_bad,
                    lambda message: bad.add(f"skipped {message}"))
    bad.finish()
    return dataset_of(analysis, path, items, bad.count, bootstrap, warn)


def read_texts(analysis: Analysis, config: ModelConfig, tokenizer: Tokenizer,
               batches: Iterable[list[tuple[str, str]]], bootstrap: int | None, warn: Callable[[str], None]) -> Dataset:
    """Texts (from the arguments, stdin or --file: batches of (text, where it came from)) as a dataset whose lines
    are {"text": TEXT}, each checked as read_dataset checks a line (an error names where the text came from; one
    about an option, as it is). An analysis that `streams` gets them a batch at a time, as they are read (the
    first batch now); any other, all of them now."""
    def text_item(number: int, text: str, where: str):
        line = line_of(number, {"text": text}, analysis.line)
        line.where = where
        try:
            return analysis.check(config, tokenizer, line)
        except TfcliError as error:
            if error.parameter is not None:
                raise
            raise TfcliError(f"{where}: {error.message}", error.hint, exit_code=error.exit_code) from None

    def checked_batches() -> Iterator[list]:
        numbers = itertools.count(1)
        for batch in batches:
            yield [text_item(next(numbers), text, where) for text, where in batch]

    if analysis.streams:
        stream = checked_batches()
        first = next(stream, None)
        if first is None:
            raise TfcliError("no text to run", "give some text")
        return Dataset("", [], 0, 0, itertools.chain([first], stream))
    items = [item for batch in checked_batches() for item in batch]
    if not items:
        raise TfcliError("no text to run", "give some text")
    return dataset_of(analysis, "", items, 0, bootstrap, warn)


def dataset_of(analysis: Analysis, path: str, items: list, skipped: int, bootstrap: int | None,
               warn: Callable[[str], None]) -> Dataset:
    """The items checked across (check_items) with the bootstrap's resamples: a Dataset."""
    analysis.check_items(items)
    resamples = check_bootstrap(BOOTSTRAP if bootstrap is None else bootstrap, len(items), bootstrap is not None)
    if bootstrap is None and not resamples:
        unit = analysis.unit
        many = f"{len(items)} {unit} are" if len(items) > 1 else f"1 {unit.removesuffix('s')} is"
        warn(f"no bootstrap interval: {many} too few for one to mean anything")
    return Dataset(path, items, skipped, resamples)


@dataclass
class Cluster:
    """Where a dataset runs when not on this process: a Ray cluster's settings, the model every worker builds, and
    how to say what the cluster is (`note`, a line on stderr)."""

    settings: RaySettings
    spec: ModelSpec
    note: Callable[[str], None]


@dataclass
class Display:
    """How a session shows a person what runs (given by the command line; nothing here prints): `progress(stage,
    unit)`, a context manager yielding the callback `progress(done, total, note="")` of one named stage; `counted(
    batches, stage, count)`, the same batches counted as they pass (a stream of texts: count(batch) each); and the
    stderr lines `warn` and `note`."""

    progress: Callable[[str, str], contextlib.AbstractContextManager[Progress]]
    counted: Callable[[Iterable[Any], str, Callable[[Any], int]], Iterator[Any]]
    warn: Callable[[str], None]
    note: Callable[[str], None]


QUIET = Display(lambda stage, unit: contextlib.nullcontext(None), lambda batches, stage, count: iter(batches),
                lambda message: None, lambda message: None)


class Session:
    """One command's run of its analyses, every stage on the same: the tokenizer (loaded once, when first asked for),
    the model (built once), Ray's pool of workers (started by the first run on `cluster`, held to the session's end),
    the progress display (one per stage, named) and the interrupt rule: Ctrl-C ends a stage, which keeps and
    aggregates what finished (`Envelope.interrupted`; `interrupted` says a stage was cut short). Use it as a context
    manager (`with Session(...) as session:`): its end stops the workers."""

    def __init__(self, config: ModelConfig, tokenizer: Callable[[], Tokenizer], model: Callable[[], TransformerModel],
                 display: Display = QUIET, cluster: Cluster | None = None):
        self.config = config  # the model's, known before it is built: what an item is checked against
        self._load_tokenizer, self._build = tokenizer, model
        self._tokenizer: Tokenizer | None = None
        self._model: TransformerModel | None = None
        self._workers: Any = None
        self._held = contextlib.ExitStack()
        self.display, self.cluster = display, cluster
        self.interrupted = False

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (a later run starts them again): the stages are done."""
        self._held.close()
        self._workers = None

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    @property
    def model(self) -> TransformerModel:
        if self._model is None:
            self._model = self._build()
        return self._model

    def workers(self) -> Any:
        """The pool of Ray workers (tfcli.cluster.Cluster), started at the first call and said through the display;
        None for a session on this process."""
        if self.cluster is None:
            return None
        if self._workers is None:
            from tfcli.cluster import Cluster as Workers

            self._workers = self._held.enter_context(Workers(self.cluster.settings, self.cluster.spec))
            self.display.note(f"ray: {len(self._workers.workers)} workers at {self.cluster.settings.address}")
        return self._workers

    def read(self, analysis: Analysis, path: str | None, texts: Iterable[list[tuple[str, str]]] | None = None,
             skip_bad: bool = False, bootstrap: int | None = None) -> Dataset:
        """The items of a dataset file (`path`) or of `texts` (batches of (text, where it came from)), read and
        checked before the model is built (read_dataset, read_texts)."""
        if path is None:
            return read_texts(analysis, self.config, self.tokenizer, texts, bootstrap, self.display.warn)
        return read_dataset(analysis, self.config, self.tokenizer, path, skip_bad, bootstrap, self.display.warn)

    def progress(self, stage: str, unit: str) -> contextlib.AbstractContextManager[Progress]:
        """The progress display of a stage that is not a run of an analysis (a sweep, a training loop)."""
        return self.display.progress(stage, unit)

    def counted(self, batches: Iterable[Item], stage: str, count: Callable[[Item], int]) -> Iterator[Item]:
        """The batches of a stage that streams texts through a pipeline, counted as they pass (count(batch) each)."""
        return self.display.counted(batches, stage, count)

    def run(self, analysis: Analysis, dataset: Dataset, each: Callable[[Any], None] | None = None,
            stage: str | None = None) -> Envelope:
        """One stage: `analysis` over every item of `dataset` (on the session's workers where it has a cluster), with
        a progress display named `stage` (default: the analysis's command), each item's result handed to `each` as a
        single run shows it; its Envelope. Ctrl-C ends the stage with what finished (a later stage runs over those:
        `Envelope.dataset()`)."""
        model, pool = self.model, self.workers()
        with self.display.progress(stage or analysis.command, analysis.unit) as progress:
            progress(0, dataset.total if dataset.total is not None else dataset.expected)  # a log's first line at once
            try:
                done = aggregated(analysis, model, self.tokenizer, dataset, each, progress, pool)
            except KeyboardInterrupt:
                done = Envelope(None, 0, dataset.skipped, dataset.resamples, True, dataset.path, dataset.total)
        self.interrupted |= done.interrupted
        return done


def run(analysis: Analysis, model: TransformerModel, tokenizer: Tokenizer, dataset: Dataset,
        each: Callable[[Any], None] | None = None, progress: Progress | None = None,
        cluster: Cluster | None = None) -> Envelope:
    """The analysis over every item of `dataset`, then its aggregate, in an Envelope. `each(result)` gets each item's
    result as a single run shows it, in order; `progress(items done, items)`. With `cluster`, the items run in blocks
    on a pool of its workers started for this run instead of on `model` (a Session keeps one pool for several runs).
    Ctrl-C (KeyboardInterrupt) aggregates the items finished (a KeyboardInterrupt again when none had)."""
    with contextlib.ExitStack() as held:
        pool = None
        if cluster is not None:
            from tfcli.cluster import Cluster as Workers

            pool = held.enter_context(Workers(cluster.settings, cluster.spec))
            cluster.note(f"ray: {len(pool.workers)} workers at {cluster.settings.address}")
        return aggregated(analysis, model, tokenizer, dataset, each, progress, pool)


def aggregated(analysis: Analysis, model: TransformerModel | None, tokenizer: Tokenizer, dataset: Dataset,
               each: Callable[[Any], None] | None, progress: Progress | None, pool: Any) -> Envelope:
    """The aggregate of the analysis over the dataset's items, run on `model` or, with `pool` (a started
    tfcli.cluster.Cluster), in blocks on its workers, in its Envelope."""
    if pool is None and dataset.batches is not None:
        results = streamed(analysis, model, tokenizer, dataset.batches, progress, dataset.expected)
    elif pool is None:
        items = dataset.items
        told = None if progress is None else (lambda done: progress(done, len(items)))
        # the results first: the analysis's generator runs to its end (a last progress call) before zip stops
        results = ((item, result) for result, item in zip(analysis.results(model, tokenizer, items, told), items))
    else:
        items = dataset.items if dataset.batches is None else [item for batch in dataset.batches for item in batch]
        results = on_cluster(analysis, items, pool, progress)
    results = iter(results)
    first = next(results, None)  # a KeyboardInterrupt here (none finished) passes on: nothing to aggregate
    if first is None:
        raise TfcliError(f"{analysis.command}: the dataset gave no result: this is a bug in tfcli")
    shown = None if each is None else (lambda result: each(analysis.shown(result)))
    done = Done(itertools.chain([first], results), shown, keep=dataset.batches is None)
    return Envelope.of(analysis.aggregate(done, dataset), done, dataset)


def streamed(analysis: Analysis, model: TransformerModel, tokenizer: Tokenizer, batches: Iterable[list],
             progress: Progress | None = None, expected: int | None = None) -> Iterator[tuple[Any, Any]]:
    """(item, result) of each item of a stream, run a batch at a time as the batches come; `progress(items done,
    expected)`: the items a file's lines promise, None where the stream's length is not known (stdin)."""
    done = 0
    for batch in batches:
        told = None if progress is None else (lambda part, start=done: progress(start + part, expected))
        yield from ((item, result) for result, item in zip(analysis.results(model, tokenizer, batch, told), batch))
        done += len(batch)


def on_cluster(analysis: Analysis, items: list, pool: Any, progress: Progress | None = None
               ) -> Iterator[tuple[Any, Any]]:
    """(item, result) of each item, run in blocks on the workers of `pool` (a started tfcli.cluster.Cluster), in the
    order of the items; after a Ctrl-C, those of the blocks finished, with gaps."""
    from tfcli.cluster import BLOCK

    count = len(pool.workers)
    told = None if progress is None else \
        (lambda done, total, alive: progress(done, total, f"{alive} of {count} workers alive"))
    for start, block in pool.map(block_results, items, analysis, told, analysis.block or BLOCK):
        if len(block) != len(items[start:start + len(block)]):
            raise TfcliError(f"a Ray worker gave {len(block)} results for a block of "
                             f"{len(items[start:start + len(block)])} items: this is a bug in tfcli")
        yield from zip(items[start:start + len(block)], block)


def block_results(model: TransformerModel, tokenizer: Tokenizer, items: list, analysis: Analysis) -> list:
    """A block of items on a Ray worker: each item's result, as this process would make it."""
    return list(analysis.results(model, tokenizer, items, None))
