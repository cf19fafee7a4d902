"""What `tfcli patch` gives (core.py runs it): a pair's `Patching`, its grids of scores; and over a
dataset, how the pairs' positions line up in the grids' columns (`Columns`, `columns_of`), a pair's differences as
scores (`normalised`) and the aggregate of them all (`aggregate`, a `DatasetPatching`: TransformerLens's ratio of means,
with bootstrap intervals and the share of pairs each site restores).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcli.analysis.indices import parse_indices
from tfcli.analysis.metric import Token
from tfcli.analysis.names import KINDS, kind_of
from tfcli.analysis.pairs import Pair, same_value, small_gap
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Patching:
    """The result of one clean/corrupt pair. `grids[site]` is a list per layer of the scores per position (resid,
    attn, mlp), per head (heads, q, k, v, pattern) or per head of the scores per position (heads-by-position);
    None at a position not swept (`positions`) and where the sweep was interrupted before it. `total` counts the
    patched runs the sweep needs, `done` those finished (per grid: `runs`, `finished`); `unchanged` the sites that
    score exactly 0 without a run (before the first difference, or after the metric's position, on a causal
    stack)."""

    clean: str
    corrupt: str
    tokens_clean: list[str]
    tokens_corrupt: list[str]
    ids_clean: list[int]
    ids_corrupt: list[int]
    position: int | None  # None: a classifier's labels have no position
    target: Token | None  # None: a dataset's lines have different ones
    foil: Token | None
    clean_value: float
    corrupt_value: float
    method: str
    grids: dict[str, list]
    attribution_grids: dict[str, list] | None = None
    done: int = 0  # patched runs finished (activation patching)
    total: int = 0  # patched runs needed
    interrupted: bool = False
    decoder_tokens: list[str] | None = None  # an encoder-decoder's decoder input, where its grids' positions are
    label_metric: bool = False  # the target and foil are a classifier's labels
    positions: list[int] | None = None  # the positions of the texts swept by the kinds per position (None: all)
    unchanged: int = 0  # sites scored exactly 0 without a run
    before_first: bool = False  # the causal stack reading the texts: positions before `first_difference` unchanged
    runs: dict[str, int] = field(default_factory=dict)  # per grid: the patched runs it needs
    finished: dict[str, int] = field(default_factory=dict)  # per grid: those finished
    top: int = 5  # sites listed per kind: the run's --top (the terminal's and the page's lists)
    # the text each token stands for (Tokenizer.texts), what the views show; the tokens_* are vocabulary entries
    token_texts_clean: list[str] = field(default_factory=list)
    token_texts_corrupt: list[str] = field(default_factory=list)
    decoder_token_texts: list[str] | None = None
    ablated: list[str] | None = None  # --ablate, as given: every run ran without it
    line: int | None = None  # a dataset's pair: its line
    unablated: tuple[float, float] | None = None  # the clean and corrupt values with nothing ablated

    def column_label(self, column: int) -> str:
        """How a grid's column by position is named: its position."""
        return str(column)

    @property
    def differing(self) -> list[int]:
        """The positions where the two prompts' tokens differ."""
        return [i for i, (a, b) in enumerate(zip(self.ids_clean, self.ids_corrupt)) if a != b]

    @property
    def first_difference(self) -> int | None:
        return next(iter(self.differing), None)

    @property
    def small_gap(self) -> bool:
        """|clean - corrupt| is small against the metric's size (SMALL_GAP): the scores magnify noise."""
        return small_gap(self.clean_value, self.corrupt_value)


# ---------------------------------------------------------------- over a dataset

ALIGNS = ("start", "end")


@dataclass(frozen=True)
class Columns:
    """How the pairs' positions line up in the grids by position: `align` "start" (every pair the same length:
    column = position) or "end" (column k of `count`: `count - k` positions back from the pair's `end`, its
    metric's position); `swept` the columns the kinds by position patch."""

    align: str
    count: int
    swept: tuple[int, ...]

    def position(self, pair: Pair, column: int) -> int:
        return column if self.align == "start" else pair.end - (self.count - 1 - column)


def columns_of(pairs: list[Pair], kinds: tuple[str, ...], align: str | None, positions: str | None) -> Columns | None:
    """The columns of a dataset's grids by position (None: no kind by position). Pairs of different lengths need
    `align` "end"; without it they are refused, naming the lengths found."""
    if align is not None and align not in ALIGNS:
        raise usage_error(f"align must be one of {', '.join(ALIGNS)}, got `{align}`", parameter="align")
    if not any("position" in KINDS[kind].axes for kind in kinds):
        return None
    lengths = sorted({len(pair.ids_clean) for pair in pairs})
    if align != "end" and len(lengths) > 1:
        found = ", ".join(str(n) for n in lengths[:8]) + (", ..." if len(lengths) > 8 else "")
        raise usage_error(f"the pairs have different lengths ({found} tokens): the kinds by position "
                          f"({', '.join(k for k in kinds if 'position' in KINDS[k].axes)}) need their positions in "
                          "common", "give --align end (positions counted back from the metric's), or only kinds by "
                          "head (--sites heads,q,k,v,pattern)")
    count = lengths[0] if align != "end" else min(pair.end for pair in pairs) + 1
    swept = parse_indices(positions, count, "positions", has="the texts have")
    return Columns(align or "start", count, tuple(range(count) if swept is None else swept))


@dataclass
class DatasetPatching(Patching):
    """The aggregate over a dataset's pairs (how many, of what dataset, whether interrupted: the run's Envelope):
    `grids` the scores, (mean patched - mean corrupt) / (mean clean - mean corrupt) over the pairs used
    (TransformerLens's convention), `intervals` their 95% bootstrap intervals over pairs ([low, high] per cell; None
    with no resample), `restored_share` the share of pairs (those whose own clean and corrupt values differ: all but
    `equal`) in which the site restores at least half of its own difference. Positions are the `columns'`
    (tokens_clean: the first pair's tokens there; `varying`: the columns where the pairs' tokens differ).
    `target`/`foil` are None when the lines differ. A pair's sweep counts (`done`, `total`, `interrupted`) stay
    unset."""

    equal: int = 0
    intervals: dict[str, list] | None = None
    attribution_intervals: dict[str, list] | None = None
    restored_share: dict[str, list] | None = None
    align: str | None = None  # None: no kind by position
    foil_each: bool = True  # the lines give foils (the metric is a difference)
    varying: list[int] = field(default_factory=list)
    corrupted: list[int] = field(default_factory=list)  # the columns where some pair's clean and corrupt differ
    small_gaps: int = 0  # pairs whose own gap is small (SMALL_GAP)

    @property
    def differing(self) -> list[int]:
        return self.varying

    def column_label(self, column: int) -> str:
        return str(column) if self.align != "end" else str(column - len(self.tokens_clean))


def normalised(result: Patching) -> Patching:
    """A pair's result with its grids of differences (patched - corrupt) as scores, as a single run gives them
    (None everywhere when its clean and corrupt values are the same)."""
    import dataclasses

    equal = same_value(result.clean_value, result.corrupt_value)
    scale = result.clean_value - result.corrupt_value

    def scores(grid: Any) -> Any:
        if isinstance(grid, list):
            return [scores(item) for item in grid]
        return None if grid is None or equal else grid / scale + 0.0

    def each(grids: dict[str, list] | None) -> dict[str, list] | None:
        return None if grids is None else {site: scores(grid) for site, grid in grids.items()}

    return dataclasses.replace(result, grids=each(result.grids), attribution_grids=each(result.attribution_grids))


def aggregate(done: list[tuple[Pair, Patching]], columns: Columns | None, resamples: int,
              method: str) -> DatasetPatching:
    """The dataset's scores, intervals and shares from each pair's differences (see DatasetPatching), with
    `resamples` of the bootstrap."""
    import torch

    from tfcli.analysis.dataset import ratio_of_means, share_restored

    results = [r for _, r in done]
    first = results[0]
    gaps = torch.tensor([r.clean_value - r.corrupt_value for r in results], dtype=torch.float64)
    equal = torch.tensor([same_value(r.clean_value, r.corrupt_value) for r in results])
    if bool(equal.all()):
        raise TfcliError(f"nothing to restore: every pair's clean and corrupt texts give the same metric "
                         f"({len(done)} pair{'s' if len(done) > 1 else ''})",
                         "choose corrupt texts (or targets and foils) on which the model behaves differently")
    at = [[columns.position(pair, c) for c in range(columns.count)] for pair, _ in done] if columns else None
    out: dict[str, dict[str, list | None]] = {name: {} for name in ("grids", "intervals", "restored_share",
                                                                    "attribution_grids", "attribution_intervals")}
    for grids, intervals in (("grids", "intervals"), ("attribution_grids", "attribution_intervals")):
        if getattr(first, grids) is None:
            continue
        for site in first.grids:
            values = torch.stack([grid_tensor(getattr(r, grids)[site], site, at and at[i])
                                  for i, r in enumerate(results)])  # (N, layers, *axes)
            shape, flat = values.shape[1:], values.reshape(len(done), -1)
            score, low, high = ratio_of_means(flat, gaps, resamples)
            out[grids][site] = nested(score.reshape(shape))
            out[intervals][site] = None if low is None else nested(torch.stack([low, high], -1).reshape(*shape, 2))
            if grids == "grids":
                out["restored_share"][site] = nested(share_restored(flat, gaps, equal).reshape(shape))
    tokens, texts, varying, corrupted = first.tokens_clean, first.token_texts_clean, [], []
    if at is not None:
        tokens = [first.tokens_clean[p] for p in at[0]]
        texts = [first.token_texts_clean[p] for p in at[0]] if first.token_texts_clean else []
        for c in range(columns.count):
            clean = {r.ids_clean[a[c]] for r, a in zip(results, at)}
            varying += [c] if len(clean) > 1 else []
            corrupted += [c] if any(r.ids_clean[a[c]] != r.ids_corrupt[a[c]] for r, a in zip(results, at)) else []
    metric = {(r.target.id, r.foil and r.foil.id) for r in results}
    same_metric = len(metric) == 1
    positions = {r.position for r in results}
    count = columns.count if columns else len(first.ids_clean)
    return DatasetPatching(
        "", "", tokens, [], [], [], positions.pop() if len(positions) == 1 else None,
        first.target if same_metric else None, first.foil if same_metric else None,
        float(torch.tensor([r.clean_value for r in results], dtype=torch.float64).mean()),
        float(torch.tensor([r.corrupt_value for r in results], dtype=torch.float64).mean()), method, out["grids"],
        out["attribution_grids"] or None, decoder_tokens=first.decoder_tokens, decoder_token_texts=first.decoder_token_texts,
        label_metric=first.label_metric, token_texts_clean=texts,
        positions=None if columns is None or len(columns.swept) == count else list(columns.swept),
        equal=int(equal.sum()),
        intervals=out["intervals"] if resamples else None,
        attribution_intervals=(out["attribution_intervals"] or None) if resamples else None,
        restored_share=out["restored_share"], align=columns.align if columns else None,
        foil_each=first.foil is not None, varying=varying,
        corrupted=corrupted, small_gaps=sum(small_gap(r.clean_value, r.corrupt_value) for r in results),
        ablated=first.ablated, unablated=None if first.unablated is None else
        tuple(torch.tensor([r.unablated for r in results], dtype=torch.float64).mean(0).tolist()))


def grid_tensor(grid: list, site: str, at: list[int] | None) -> Tensor:
    """A pair's grid of one site kind as float64 (layers, *axes), NaN where not computed; along the positions of a
    stack that reads the texts, the columns' positions `at` (None: no kind by position)."""
    import torch

    stack, kind = kind_of(site)
    values = torch.tensor(none_to_nan(grid), dtype=torch.float64)
    if "position" in kind.axes and stack != "decoder." and at is not None:
        values = values.index_select(1 + kind.axes.index("position"), torch.tensor(at))
    return values


def none_to_nan(grid: Any) -> Any:
    return [none_to_nan(item) for item in grid] if isinstance(grid, list) else \
        float("nan") if grid is None else grid


def nested(values: Tensor) -> list:
    """A tensor as nested lists, NaN as None (JSON's null)."""
    return [nested(row) for row in values] if values.dim() > 1 else \
        [None if v != v else v + 0.0 for v in values.tolist()]
