"""A dataset of prompts for an analysis over a task (`patch --dataset`, `attribute --dataset`): JSON Lines, one
object per line, read whole (from a file or `-`, stdin) and checked line by line before any model work; and the
spread of a statistic over its items (a seeded bootstrap).

A line's keys are the command's (`LineSpec`): required ones, optional ones, and those read as another (a patch
line's `clean` is an attribute line's `text`). A key not known, a value of the wrong type, a line that is not a
JSON object: a `BadLine` naming the line. A command checks what a single run would (one token each, the pair's
lengths) through `checked`, which names the line in the error or, with --skip-bad, skips it and counts it.

Shapes: N items, B bootstrap resamples, C cells (a statistic's values, flattened).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

T = TypeVar("T")
BOOTSTRAP = 1000  # resamples of the default interval
LEAST_FOR_BOOTSTRAP = 10  # fewer items than this: an interval over them means nothing
SEED = 0  # the bootstrap's seed: the same dataset gives the same interval


@dataclass(frozen=True)
class LineSpec:
    """The keys of a command's dataset line: `required` (strings), `optional` (a string or null, `position` an
    integer or null), `aliases` (key -> the key it stands for when that one is absent)."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    aliases: dict[str, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()  # keys allowed and not read (a patch line's `corrupt`, read by attribute)
    raw: tuple[str, ...] = ()  # keys kept as their JSON value (or None), checked by the command that reads them

    @property
    def known(self) -> tuple[str, ...]:
        return self.required + self.optional + tuple(self.aliases) + self.ignored + self.raw


@dataclass
class Dataset:
    """A dataset read and checked (tfcli/runner.py): its `path` (`-`: stdin), its items (what the analysis made of
    each line), the lines skipped (--skip-bad) and the bootstrap's resamples (0: none). A stream (`batches`, an
    analysis that `streams`) has its items in batches, each checked as it is read, instead of `items`."""

    path: str
    items: list
    skipped: int
    resamples: int
    batches: Iterator[list] | None = None
    expected: int | None = None  # a stream's items, where known before it is read (a file's lines): for progress

    @property
    def total(self) -> int | None:
        """The items it holds (None: a stream, read as it runs)."""
        return None if self.batches is not None else len(self.items)


class Done:
    """(item, result) of each item of a dataset as it finishes (iterated once, by an analysis's aggregate), each
    result handed to `each` first; Ctrl-C (KeyboardInterrupt) ends the iteration, and `interrupted` says so; `count`
    the items iterated, and with `keep` (not for a stream, which runs in flat memory) `items`, those items."""

    def __init__(self, results: Iterable[tuple[Any, Any]], each: Callable[[Any], None] | None = None,
                 keep: bool = False):
        self.results, self.each = results, each
        self.interrupted = False
        self.count = 0  # the items iterated
        self.items: list | None = [] if keep else None  # with `keep`, the items iterated (a later stage runs them)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        try:
            for item, result in self.results:
                if self.each is not None:
                    self.each(result)
                self.count += 1
                if self.items is not None:
                    self.items.append(item)
                yield item, result
        except KeyboardInterrupt:
            self.interrupted = True


@dataclass
class Envelope:
    """What a run of an analysis gives (tfcli/runner.py), for a text and a dataset alike: the aggregate (`value`;
    None when Ctrl-C came before any item finished), the items it aggregates (`n`; `finished`, those items; `total`,
    the dataset's), the lines skipped (--skip-bad), the bootstrap's resamples, whether Ctrl-C ended it early (or,
    once the command's stages are done, any of them), and where the items came from (`source`: the dataset's path,
    "" for texts). An aggregate holds none of these: its views read them here."""

    value: Any
    n: int
    skipped: int
    resamples: int
    interrupted: bool
    source: str
    total: int | None = None  # the items the dataset holds (None: a stream, its length not known)
    finished: list | None = None  # the items aggregated, in order (None for a stream): what a later stage runs

    @classmethod
    def of(cls, value: Any, done: Done, dataset: Dataset) -> Envelope:
        """The Envelope of `value`, the aggregate of `dataset`'s items that `done` iterated."""
        return cls(value, done.count, dataset.skipped, dataset.resamples, done.interrupted, dataset.path,
                   dataset.total, done.items)

    def dataset(self) -> Dataset:
        """The items this run finished as a dataset of their own, for the command's next stage (a stream's items
        are not kept: its analysis has no later stage)."""
        if self.finished is None:
            raise TfcliError("a stream's items are not kept for a later stage: this is a bug in tfcli")
        return Dataset(self.source, self.finished, self.skipped, self.resamples)


@dataclass
class Line:
    """One line of a dataset: its number (from 1), its fields (aliases resolved; absent optional keys None) and
    where it came from, in words (`line 3`; a text's `text 2`, `line 5 of corpus.txt`)."""

    number: int
    fields: dict[str, Any]
    where: str = ""


class BadLine(TfcliError):
    """A dataset line that cannot be used, naming its line (exit 2)."""

    def __init__(self, number: int, message: str, hint: str | None = None):
        super().__init__(f"line {number}: {message}", hint, exit_code=2)
        self.number = number


def read_lines(path: str) -> list[tuple[int, str]]:
    """The lines of a JSON Lines file (`-`: stdin) with their numbers, blank lines left out; `parse_line` reads
    each. A missing or unreadable file exits 1, an empty one 2 (no input)."""
    if path == "-":
        data = sys.stdin.buffer.read()
        name = "stdin"
    else:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise TfcliError(f"dataset {path}: no such file", parameter="dataset") from None
        except IsADirectoryError:
            raise TfcliError(f"dataset {path} is a folder, not a file", parameter="dataset") from None
        except OSError as exc:
            raise TfcliError(f"dataset {path}: {exc.strerror or exc}", parameter="dataset") from None
        name = path
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        number = data[:exc.start].count(b"\n") + 1
        raise BadLine(number, f"not UTF-8 text (byte {exc.start} of {name})") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise usage_error(f"dataset {name} is empty: it has no line", "give one JSON object per line",
                          parameter="dataset")
    return lines


def parse_line(number: int, line: str, spec: LineSpec) -> Line:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadLine(number, f"not JSON ({exc.msg} at column {exc.colno})",
                      f"each line is one JSON object with {', '.join(spec.required)}") from None
    return line_of(number, value, spec)


def lines_of(items: list[Any], spec: LineSpec) -> list[Line]:
    """A dataset given as Python objects (the lines' dicts), checked as read_lines checks a file's lines."""
    return [line_of(number, item, spec) for number, item in enumerate(items, 1)]


def line_of(number: int, value: Any, spec: LineSpec) -> Line:
    """One line's JSON value checked against `spec`."""
    if not isinstance(value, dict):
        raise BadLine(number, f"a JSON {type(value).__name__.replace('dict', 'object')}, not an object",
                      f"each line is one JSON object with {', '.join(spec.required)}")
    unknown = [key for key in value if key not in spec.known]
    if unknown:
        optional = f" and optionally {', '.join(spec.optional)}" if spec.optional else ""
        raise BadLine(number, f"unknown key {', '.join(f'`{k}`' for k in unknown)}",
                      f"a line has {', '.join(spec.required)}{optional}")
    value = dict(value)
    for alias, key in spec.aliases.items():
        if key not in value and alias in value:
            value[key] = value[alias]
    fields: dict[str, Any] = {}
    for key in spec.required + spec.optional:
        item = value.get(key)
        if item is None:
            if key in spec.required:
                raise BadLine(number, f"no `{key}`", f"a line has {', '.join(spec.required)}")
        elif key == "position":
            if not isinstance(item, int) or isinstance(item, bool):
                raise BadLine(number, f"`position` must be an integer, got {json.dumps(item)}")
        elif not isinstance(item, str):
            raise BadLine(number, f"`{key}` must be a string, got {json.dumps(item)}")
        elif key in spec.required and not item.strip():
            raise BadLine(number, f"`{key}` is empty")
        fields[key] = item
    fields.update({key: value.get(key) for key in spec.raw})
    return Line(number, fields, f"line {number}")


def checked(lines: list[tuple[int, str]], spec: LineSpec, check: Callable[[Line], T], skip_bad: bool,
            skipped: Callable[[str], None]) -> list[T]:
    """What `check` makes of each line (numbered text, read against `spec`). A line that cannot be read or whose
    check fails (a TfcliError) stops everything, its error naming the line; with `skip_bad` it is left out and
    `skipped(message)` told why. No line left: an error."""
    kept: list[T] = []
    for number, text in lines:
        try:
            kept.append(check(parse_line(number, text, spec)))
        except TfcliError as exc:
            error = exc if isinstance(exc, BadLine) else BadLine(number, exc.message, exc.hint)
            if not skip_bad:
                raise error from None
            skipped(error.message)
    if not kept:
        raise usage_error(f"every line of the dataset is bad ({len(lines)} skipped)", "see the lines named above")
    return kept


def check_one_metric(items: list[Any]) -> None:
    """Every line gives a foil, or none does (`items`: the checked lines, each with its `line` number and its `foil`,
    None where it gives none): the metric is of one kind over a dataset."""
    foils = [(item.line, item.foil is not None) for item in items]
    first_line, first = foils[0]
    odd = next((line for line, given in foils if given != first), None)
    if odd is not None:
        raise usage_error(f"line {odd} {'gives no' if first else 'gives'} `foil` where line {first_line} "
                          f"{'does' if first else 'does not'}: the metric must be of one kind over the dataset (a "
                          "logit difference, or a logit)")


def check_bootstrap(resamples: int, items: int, given: bool) -> int:
    """The resamples to draw for `items` items: 0 when there are too few for an interval to mean anything (an
    error when --bootstrap was `given`)."""
    if resamples < 0:
        raise usage_error(f"--bootstrap must be 0 or more, got {resamples}", parameter="bootstrap")
    if resamples and items < LEAST_FOR_BOOTSTRAP:
        if given:
            raise usage_error(f"--bootstrap {resamples}: a bootstrap interval over {items} item"
                              f"{'' if items == 1 else 's'} is not meaningful",
                              f"give at least {LEAST_FOR_BOOTSTRAP} items, or --bootstrap 0", parameter="bootstrap")
        return 0
    return resamples


def resample_counts(items: int, resamples: int, seed: int = SEED) -> Tensor:
    """(B, N) float64: how often each item is drawn in each of `resamples` draws of `items` items with
    replacement (a seeded generator: the same every run)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(items, (resamples, items), generator=generator)
    return torch.zeros(resamples, items, dtype=torch.float64).scatter_add_(
        1, drawn, torch.ones(resamples, items, dtype=torch.float64))


def interval(statistics: Tensor) -> tuple[Tensor, Tensor]:
    """(B, C) resampled statistics -> the 95% interval per cell, (C,) low and (C,) high (the 2.5th and 97.5th
    percentiles; a cell undefined in a resample, NaN there, is left out of that cell's)."""
    import torch

    low = torch.nanquantile(statistics, 0.025, dim=0)
    high = torch.nanquantile(statistics, 0.975, dim=0)
    return low, high


def ratio_of_means(differences: Tensor, gaps: Tensor, resamples: int) -> tuple[Tensor, Tensor | None,
                                                                                  Tensor | None]:
    """TransformerLens's dataset convention for patching scores: (mean patched - mean corrupt) / (mean clean - mean
    corrupt) = sum(patched - corrupt) / sum(clean - corrupt) over the items. `differences` (N, C) patched -
    corrupt per item and cell (NaN: not computed), `gaps` (N,) clean - corrupt per item. Returns the score (C,)
    and its 95% bootstrap interval over items, (C,) low and high (None without `resamples`)."""
    score = differences.sum(0) / gaps.sum()
    if not resamples:
        return score, None, None
    counts = resample_counts(len(gaps), resamples)
    resampled = (counts @ differences.nan_to_num(0.0)) / (counts @ gaps)[:, None]
    resampled[:, score.isnan()] = float("nan")  # a cell not computed has no interval
    low, high = interval(resampled)
    return score, low, high


def share_restored(differences: Tensor, gaps: Tensor, equal: Tensor, at_least: float = 0.5) -> Tensor:
    """(C,): the share of items (those whose gap is not `equal` (N,) bool, to 0) in which a cell restores at least
    `at_least` of that item's own gap clean - corrupt: (patched - corrupt) / (clean - corrupt) >= at_least."""
    kept = ~equal
    restored = (differences[kept] / gaps[kept, None]) >= at_least
    share = restored.double().mean(0)
    return share.where(~differences.isnan().any(0), float("nan"))


def mean_spread(values: Tensor, resamples: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """(N, C) values per item -> (C,) mean, standard deviation (over items, n - 1; 0 for one item) and the 95%
    bootstrap interval of the mean (None without `resamples`)."""
    mean = values.mean(0)
    std = values.std(0) if len(values) > 1 else values.new_zeros(values.shape[1:])
    if not resamples:
        return mean, std, None, None
    counts = resample_counts(len(values), resamples)
    low, high = interval(counts @ values / len(values))
    return mean, std, low, high
