"""One way to run any analysis over many items, on this process or on a Ray cluster (docs/adding-an-analysis.md).

An analysis declares only what is its own (`Analysis`): what one item is (a dataset line, or a text of the
arguments, stdin or --file read as the line {"text": TEXT}; checked before any model is built), each item's result
on a model (a batch of items at a time), how one item's result shows alone, and the aggregate over the items. The
runner does the rest, the same for every analysis: the lines read and checked (a bad one named by its number, or
skipped and counted with --skip-bad), the bootstrap's resamples, the items run here or in blocks on Ray workers
(tfcli/cluster.py: the same per-item results travel back and are aggregated by the same code, in dataset order),
each item's result handed on as it comes (--per-item), the progress, and Ctrl-C, which keeps what finished. What a
person sees (the bar, the views, JSON, --report) is the command line's (tfcli/cli/common.py, `run_dataset`).

Nothing here imports torch, Ray or a command's core module.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tfcli.analysis.dataset import (BOOTSTRAP, Dataset, Done, Line, LineSpec, check_bootstrap, checked, line_of,
                                    read_lines)
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
        iteration, `done.interrupted` says whether Ctrl-C ended it before the dataset's end. It carries `n` (items
        aggregated) and `interrupted`."""


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


def run(analysis: Analysis, model: TransformerModel, tokenizer: Tokenizer, dataset: Dataset,
        each: Callable[[Any], None] | None = None, progress: Progress | None = None,
        cluster: Cluster | None = None) -> Any:
    """The analysis over every item of `dataset`, then its aggregate. `each(result)` gets each item's result as a
    single run shows it, in order; `progress(items done, items)`. With `cluster`, the items run in blocks on its
    workers instead of on `model`. Ctrl-C (KeyboardInterrupt) aggregates the items finished (a KeyboardInterrupt
    again when none had)."""
    if cluster is None and dataset.batches is not None:
        results = streamed(analysis, model, tokenizer, dataset.batches, progress)
    elif cluster is None:
        items = dataset.items
        told = None if progress is None else (lambda done: progress(done, len(items)))
        # the results first: the analysis's generator runs to its end (a last progress call) before zip stops
        results = ((item, result) for result, item in zip(analysis.results(model, tokenizer, items, told), items))
    else:
        items = dataset.items if dataset.batches is None else [item for batch in dataset.batches for item in batch]
        results = on_cluster(analysis, items, cluster, progress)
    results = iter(results)
    first = next(results, None)  # a KeyboardInterrupt here (none finished) passes on: nothing to aggregate
    if first is None:
        raise TfcliError(f"{analysis.command}: the dataset gave no result: this is a bug in tfcli")
    shown = None if each is None else (lambda result: each(analysis.shown(result)))
    return analysis.aggregate(Done(itertools.chain([first], results), shown), dataset)


def streamed(analysis: Analysis, model: TransformerModel, tokenizer: Tokenizer, batches: Iterable[list],
             progress: Progress | None = None) -> Iterator[tuple[Any, Any]]:
    """(item, result) of each item of a stream, run a batch at a time as the batches come; `progress(items done,
    None)`: the stream's length is not known."""
    done = 0
    for batch in batches:
        told = None if progress is None else (lambda part, start=done: progress(start + part, None))
        yield from ((item, result) for result, item in zip(analysis.results(model, tokenizer, batch, told), batch))
        done += len(batch)


def on_cluster(analysis: Analysis, items: list, cluster: Cluster, progress: Progress | None = None
               ) -> Iterator[tuple[Any, Any]]:
    """(item, result) of each item, run in blocks on the workers of `cluster`, in the order of the items; after a
    Ctrl-C, those of the blocks finished, with gaps."""
    for start, block in blocks_on(cluster, block_results, items, analysis, progress, analysis.block):
        if len(block) != len(items[start:start + len(block)]):
            raise TfcliError(f"a Ray worker gave {len(block)} results for a block of "
                             f"{len(items[start:start + len(block)])} items: this is a bug in tfcli")
        yield from zip(items[start:start + len(block)], block)


def blocks_on(cluster: Cluster, work: Callable[..., list], items: list, options: Any,
              progress: Progress | None = None, block: int | None = None) -> Iterator[tuple[int, list]]:
    """work(model, tokenizer, a block of items, options) on the workers of `cluster` (each builds the model as the
    driver did), in blocks of at most `block` items (None: tfcli.cluster's BLOCK): (the block's first index, its
    list), in the order of the items (Cluster.map). On the pool `kept` holds open for the cluster, else on a pool
    of its own, started when the first block is asked for and ended with the iteration."""
    from tfcli.cluster import BLOCK

    pool = next((workers for held, workers in _KEPT if (held.settings, held.spec) == (cluster.settings, cluster.spec)),
                None)
    if pool is None:
        with kept(cluster):
            yield from blocks_on(cluster, work, items, options, progress, block)
        return
    count = len(pool.workers)
    told = None if progress is None else \
        (lambda done, total, alive: progress(done, total, f"{alive} of {count} workers alive"))
    yield from pool.map(work, items, options, told, block or BLOCK)


_KEPT: list[tuple[Cluster, Any]] = []  # the pools of workers `kept` holds open: (their cluster, its workers)


@contextlib.contextmanager
def kept(cluster: Cluster | None) -> Iterator[None]:
    """One pool of workers, started here (said through `cluster.note`), for every run inside the block on
    `cluster` or on a Cluster of the same settings and model: a command that runs several (circuit measures its
    faithfulness after the scores, once per bisection step) loads the model on the workers once. None: nothing."""
    if cluster is None:
        yield
        return
    from tfcli.cluster import Cluster as Workers

    with Workers(cluster.settings, cluster.spec) as workers:
        cluster.note(f"ray: {len(workers.workers)} workers at {cluster.settings.address}")
        _KEPT.append((cluster, workers))
        try:
            yield
        finally:
            _KEPT.pop()


def block_results(model: TransformerModel, tokenizer: Tokenizer, items: list, analysis: Analysis) -> list:
    """A block of items on a Ray worker: each item's result, as this process would make it."""
    return list(analysis.results(model, tokenizer, items, None))
