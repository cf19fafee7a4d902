"""`tfcli patch`: activation patching and attribution patching. Run a corrupted prompt, put back one activation
(a site, at one layer and position or head) from the clean prompt's run, and see how much of the clean behaviour
returns: the metric is the logit difference target - foil at one position (a classifier: of two labels), and every
score is normalised as TransformerLens does, (patched - corrupt) / (clean - corrupt): 1 = the clean value fully
restored, 0 = no effect.

Sites (the named sites of docs/sites.md): `resid` = blocks.{l}.resid_pre, `attn` = blocks.{l}.attn.out and `mlp` =
blocks.{l}.mlp.out, per layer x position; `heads` = blocks.{l}.attn.z of one head at every position, per layer x
head; `heads-by-position` = the same per layer x head x position; `q`, `k`, `v`, `pattern` = that site of one head
at every position, per layer x head (k and v per key/value head), as TransformerLens's
`get_act_patch_attn_head_*_all_pos`. An encoder-decoder has each kind in both stacks (`encoder.resid`,
`decoder.resid`, ...).

Some patches change nothing, and score exactly 0 without a run, in both sweeps: on a causal stack that reads the
texts, every activation at a position before the first one where the two texts differ is the same in both runs;
and a patch after the metric's position cannot reach it. `PatchOptions.positions` restricts the kinds swept per
position (resid, attn, mlp, heads-by-position) to some positions of the texts: the others stay None.

Activation patching is fast and exact: the patched runs are the patching engine's (tfcli/analysis/patching.py: the
naive sweep, one whole forward pass per site, with `fast=False`; by default the fast sweep, which computes the same
numbers with far less). Over a dataset (`PatchDataset`), the runner (tfcli/runner.py) reads the pairs and runs them
here or on Ray; the pairs of one length go through the sweep together (`run_pairs`).

Attribution patching is the first-order estimate: (clean - corrupt activation) . d metric / d activation, the
gradient taken on the corrupt run, for every site from one backward pass (TransformerLens's attribution patching).

Shapes: T tokens, d the model width, H heads, G key/value heads, D head size, L layers.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Dataset, Done, Line, check_one_metric
from tfcli.analysis.indices import parse_indices
from tfcli.analysis.metric import Token, check_head, parse_metric, position_of
from tfcli.analysis.names import KINDS, block_site, every_block, kind_of
from tfcli.analysis.pairs import PAIR_LINE, Pair, check_pair, pair_inputs, same_value, small_gap
from tfcli.analysis.patching import (BATCH_MB, Patch, PairMetric, PairRuns, attribution, corrupt_run,
                                     count_patches, empty_grid, fast_sweep, naive_sweep, patches, put, unchanged)
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.ablation import Ablation
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

DEFAULT_SITES = ("resid", "attn", "mlp", "heads")
METHODS = ("activation", "attribution", "both")


@dataclass
class PatchOptions:
    target: str  # a token (" Mary", #ID) or, for a classifier, a label (name or #index)
    foil: str | None = None
    position: int | None = None  # None: the last token (a masked-LM encoder: its [MASK])
    sites: tuple[str, ...] = DEFAULT_SITES
    method: str = "activation"
    fast: bool = True  # False: the naive sweep, one whole forward pass per site (benchmarks and tests)
    batch_mb: float = BATCH_MB
    positions: list[int] | None = None  # the positions of the texts the kinds per position sweep; None: every one
    ablation: Ablation | None = None  # --ablate: components removed on every pass, clean, corrupt and patched


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


# ---------------------------------------------------------------- checks and inputs


def check_sweep(config: ModelConfig, options: PatchOptions) -> None:
    """What is checked before a model is built, a single pair or a dataset: the model's head (a metric to read),
    the method and the sites."""
    check_head(config, ("lm", "mlm", "classifier"), "patch reads the logit (difference) of tokens or of a "
               "classifier's labels", "use a model with an LM, masked-LM or classifier head")
    if options.method not in METHODS:
        raise usage_error(f"method must be one of {', '.join(METHODS)}, got `{options.method}`", parameter="method")
    unknown = [s for s in options.sites if s not in KINDS]
    if unknown or not options.sites:
        raise usage_error(f"sites: unknown `{','.join(unknown)}`" if unknown else "sites: none given",
                          f"choose from {', '.join(KINDS)} (default {','.join(DEFAULT_SITES)})", parameter="sites")


def check_options(config: ModelConfig, tokenizer: Tokenizer, options: PatchOptions) -> tuple[Token, Token | None]:
    """Everything checked before a model is built: check_sweep, and the target and foil (tokens, or labels for a
    classifier)."""
    check_sweep(config, options)
    return parse_metric(config, tokenizer, options.target, options.foil, options.position)


def parse_sites(spec: str | None) -> tuple[str, ...]:
    """`resid,attn` -> ("resid", "attn"); None: the default kinds."""
    if spec is None:
        return DEFAULT_SITES
    return tuple(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))


def parse_positions(spec: str | None, length: int) -> list[int] | None:
    """`--positions` as `--layers` reads it (`10-`, `-5-`, `3,7`; negative counting from the end), against the
    texts' `length` tokens; None or 'all': every position."""
    return parse_indices(spec, length, "positions", has="the texts have")


def run(model: TransformerModel, tokenizer: Tokenizer, clean: str, corrupt: str, options: PatchOptions,
        progress: Callable[[int, int], None] | None = None) -> Patching:
    """Patch every site of `options.sites` from the clean run into the corrupt one; `progress(done, total)` is
    called as patched runs finish (total: the runs needed). Ctrl-C (KeyboardInterrupt) during the sweep returns
    what is finished (`interrupted`, the rest None)."""
    ids_clean, ids_corrupt = pair_inputs(model.config, tokenizer, clean, corrupt)
    return run_ids(model, tokenizer, ids_clean, ids_corrupt, options, progress, texts=(clean, corrupt))


def run_ids(model: TransformerModel, tokenizer: Tokenizer, ids_clean: list[int], ids_corrupt: list[int],
            options: PatchOptions, progress: Callable[[int, int], None] | None = None, differences: bool = False,
            texts: tuple[str, str] = ("", "")) -> Patching:
    """`run` on token ids of the same length (`texts`, clean and corrupt, only for the record). `differences`: the
    grids hold patched - corrupt, not normalised, and texts with the same metric are not refused (a dataset's pairs,
    whose scores are normalised over the whole dataset)."""
    pair = Pair(None, *texts, ids_clean, ids_corrupt, options.target, options.foil, options.position,
                len(ids_clean) - 1)
    return run_pairs(model, tokenizer, [pair], options, progress, differences)[0]


def run_pairs(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair], options: PatchOptions,
              progress: Callable[[int, int], None] | None = None, differences: bool = False) -> list[Patching]:
    """Patch pairs of one length and one metric position together (each with its own target, foil and position;
    the rest `options`'): their clean runs as one batch, their corrupt runs as another, and the patched runs of
    every pair in the same batches, a row per pair and site. Each result equals the pair's alone (run_ids) to float
    precision. `progress(done, total)` counts the patched runs of all the pairs; Ctrl-C (KeyboardInterrupt) during
    the sweep returns what is finished (every result `interrupted`)."""
    import torch

    config = model.config
    metrics = [check_options(config, tokenizer, dataclasses.replace(options, target=pair.target, foil=pair.foil,
                                                                     position=pair.position)) for pair in pairs]
    length = len(pairs[0].ids_clean)
    for pair in pairs:
        if len(pair.ids_clean) != len(pair.ids_corrupt):
            raise usage_error(f"the clean and corrupt ids differ in length ({len(pair.ids_clean)} and "
                              f"{len(pair.ids_corrupt)})")
    if not length:
        raise usage_error("the clean and corrupt ids are both empty")
    positions = None
    if options.positions is not None:
        outside = [p for p in options.positions if not -length <= p < length]
        if not options.positions:
            raise usage_error("positions: none given", parameter="positions")
        if outside:
            raise usage_error(f"positions: {outside[0]} is out of range: the texts have {length} positions "
                              f"(0 to {length - 1})", parameter="positions")
        positions = sorted({p % length for p in options.positions})
    device = model.device
    encoder_decoder = config.architecture == "encoder-decoder"
    inputs: dict[str, Any] = {}
    decoder_ids: list[int] | None = None
    if encoder_decoder:
        decoder_ids = [model.start_tokens(1, device)[0, 0].item()]
        inputs["decoder_input_ids"] = torch.tensor([decoder_ids] * len(pairs), device=device)
    classifier = config.head == "classifier"
    reads = [decoder_ids or [] for _ in pairs] if encoder_decoder else [pair.ids_clean for pair in pairs]
    at = {None if classifier else position_of(ids, tokenizer, config, pair.position)
          for ids, pair in zip(reads, pairs)}
    if len({len(pair.ids_clean) for pair in pairs}) > 1 or len(at) > 1:
        raise TfcliError("run_pairs was given pairs of different lengths or metric positions: this is a bug in tfcli")
    position = at.pop()
    targets = torch.tensor([target.id for target, _ in metrics], device=device)
    foils = None if metrics[0][1] is None else torch.tensor([foil.id for _, foil in metrics], device=device)
    metric = PairMetric(targets, foils, position)
    # the two runs compute an LM head's logits (a position: not a classifier) from the metric's position on only
    # (what the backward pass of attribution patching goes through too), and read them at their first
    kept, read = {}, metric
    if position is not None:
        kept, read = {"logits_to_keep": len(reads[0]) - position}, PairMetric(targets, foils, 0)
    lengths = {"": length, "encoder.": length, "decoder.": len(decoder_ids or [])}
    stacks = dict(model.stacks())
    requested = {prefix: range(lengths[prefix]) if positions is None or prefix == "decoder." else
                 [p for p in positions if p < lengths[prefix]] for prefix in stacks}
    every = count_patches(model, options.sites, requested)
    firsts = [next((i for i, (a, b) in enumerate(zip(pair.ids_clean, pair.ids_corrupt)) if a != b), None)
              for pair in pairs]
    causal = options.ablation is None or not options.ablation.by_mean  # a mean over the positions reads them all
    skipped: list[dict[str, set[int]]] = []  # by pair, then stack: the positions whose patches change nothing
    swept: list[int] = []  # by pair: how many patches it runs (the others score 0 without a run)
    sweep: list[Patch] = []
    for row, first in enumerate(firsts):
        skipped.append({prefix: {p for p in at if causal and unchanged(stacks[prefix], prefix, p, first, position)}
                        for prefix, at in requested.items()})
        patched = patches(model, options.sites, {prefix: [p for p in at if p not in skipped[row][prefix]]
                                                 for prefix, at in requested.items()}, row)
        swept.append(len(patched))
        sweep += patched
    names = sorted({block_site(layer, KINDS[kind].leaf, prefix) for prefix, stack in stacks.items()
                    for kind in options.sites for layer in range(len(stack.blocks))})
    clean_t = torch.tensor([pair.ids_clean for pair in pairs], device=device)
    corrupt_t = torch.tensor([pair.ids_corrupt for pair in pairs], device=device)
    kv = every_block(model, "attn.k", causal=True) + every_block(model, "attn.v", causal=True)
    resid = every_block(model, "resid_pre")
    estimate = options.method != "activation"  # the corrupt run keeps its graph, for one backward pass
    ablation = options.ablation
    removed = ablation and ablation.hooks
    # on the causal stack that reads the texts, the corrupt run starts at the first difference (a mean-ablation
    # reads every position; a classifier's head pools them)
    first = min((f for f in firsts if f is not None), default=None)
    start = first if "" in stacks and stacks[""].causal and causal and first and position is not None and \
        first <= position else 0
    # the corrupt run keeps what attribution differentiates (the patched sites) and what the sweep reads (every
    # block's stream entering it, keys and values)
    corrupt_names = sorted(set((names if estimate else []) + ([] if options.method == "attribution" else kv + resid)))
    # the clean run keeps the patched sites and, with a `start`, what the corrupt run has and reads before it
    clean_names = sorted(set(names + corrupt_names + kv)) if start else names
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean_t, clean_names, removed, **inputs, **kept)
        unablated = None if ablation is None else \
            list(zip(*(read(model(ids, **inputs, **kept).logits).tolist() for ids in (clean_t, corrupt_t))))
    corrupt_logits, ending, corrupt_cache = corrupt_run(model, corrupt_t, corrupt_names, clean_cache, start, removed,
                                                        estimate, **inputs, **kept)
    clean_values, corrupt_values = read(clean_logits).tolist(), read(corrupt_logits.detach()).tolist()
    if not differences:
        for clean_value, corrupt_value in zip(clean_values, corrupt_values):
            if same_value(clean_value, corrupt_value):
                what = "logit difference" if foils is not None else "logit"
                raise TfcliError(f"nothing to restore: the clean and corrupt texts give the same {what} "
                                 f"({clean_value:+.6f} and {corrupt_value:+.6f})",
                                 "choose a corrupt text (or a target and foil) on which the model behaves differently")

    def new_grids(row: int) -> dict[str, list]:
        return {f"{prefix}{kind}": empty_grid(KINDS[kind], len(stack.blocks), KINDS[kind].heads(config),
                                              lengths[prefix], skipped[row][prefix])
                for prefix, stack in model.stacks() for kind in options.sites}

    runs = collections.Counter((patch.pair, patch.grid) for patch in sweep)
    results = []
    for row, pair in enumerate(pairs):
        ids_clean, ids_corrupt = pair.ids_clean, pair.ids_corrupt
        result = Patching(pair.clean, pair.corrupt, tokenizer.tokens(ids_clean), tokenizer.tokens(ids_corrupt),
                          ids_clean, ids_corrupt, position, *metrics[row], clean_values[row], corrupt_values[row],
                          options.method, new_grids(row), total=swept[row], label_metric=classifier,
                          positions=positions, unchanged=every - swept[row],
                          before_first="" in stacks and stacks[""].causal,
                          token_texts_clean=tokenizer.texts(ids_clean),
                          token_texts_corrupt=tokenizer.texts(ids_corrupt),
                          ablated=ablation and ablation.specs, line=pair.line,
                          unablated=None if unablated is None else unablated[row])
        result.runs = {grid: runs[row, grid] for grid in result.grids}
        result.finished = dict.fromkeys(result.grids, 0)
        if decoder_ids is not None:
            result.decoder_tokens, result.decoder_token_texts = tokenizer.tokens(decoder_ids), \
                tokenizer.texts(decoder_ids)
        results.append(result)
    scales = [1.0 if differences else clean - corrupt for clean, corrupt in zip(clean_values, corrupt_values)]
    if options.method in ("attribution", "both"):
        estimates = attribution(corrupt_logits, ending, clean_cache, read, sweep, names, start) if sweep else []
        corrupt_cache = {name: value.detach() for name, value in corrupt_cache.items()}
        del corrupt_logits, ending
        attributed = [new_grids(row) for row in range(len(pairs))]
        for patch, value in zip(sweep, estimates):
            put(attributed[patch.pair], patch, value / scales[patch.pair] + 0.0)  # + 0.0: no -0.0 ("-0.0000")
        for row, result in enumerate(results):
            if options.method == "attribution":
                result.grids, result.done, result.finished = attributed[row], result.total, dict(result.runs)
            else:
                result.attribution_grids = attributed[row]
        if options.method == "attribution":
            return results
    # a mean-ablation needs whole passes (the fast sweep runs part of the text); an encoder-decoder's fast sweep
    # runs its encoder's last block and the decoder outside the patched stack's hooks
    fast = options.fast and (ablation is None or not (ablation.by_mean or encoder_decoder))
    runs = PairRuns(clean_cache, corrupt_cache, metric, inputs, removed, first)
    sweeper = fast_sweep(model, sweep, runs, options.batch_mb) if fast else naive_sweep(model, sweep, runs, corrupt_t)
    done = 0
    try:
        if progress is not None:
            progress(0, len(sweep))
        for done_patches, values in sweeper:
            for patch, value in zip(done_patches, values):
                result = results[patch.pair]
                put(result.grids, patch, (value - corrupt_values[patch.pair]) / scales[patch.pair] + 0.0)
                result.finished[patch.grid] += 1
                result.done += 1
            done += len(done_patches)
            if progress is not None:
                progress(done, len(sweep))
    except KeyboardInterrupt:
        for result in results:
            result.interrupted = True
    return results


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
    """The aggregate over a dataset's pairs: `grids` the scores, (mean patched - mean corrupt) / (mean clean - mean
    corrupt) over the `n` pairs used (TransformerLens's convention), `intervals` their 95% bootstrap intervals
    over pairs ([low, high] per cell; None with no resample), `restored_share` the share of pairs (those whose own
    clean and corrupt values differ: `n - equal`) in which the site restores at least half of its own difference.
    Positions are the `columns`' (tokens_clean: the first pair's tokens there; `varying`: the columns where the
    pairs' tokens differ). `target`/`foil` are None when the lines differ. `pairs`: the pairs to run (`n` fewer
    after an interruption)."""

    dataset: str = ""
    n: int = 0
    pairs: int = 0
    skipped: int = 0
    equal: int = 0
    resamples: int = 0
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


@dataclass
class PatchDataset:
    """`patch --dataset` as the runner runs it (tfcli/runner.py): an item is a line's Pair, its result the pair's
    Patching of differences (patched - corrupt, pair_results), the aggregate a DatasetPatching. `align` and
    `positions` (--align, --positions) give the grids' columns, set from the pairs by check_items."""

    options: PatchOptions
    align: str | None = None
    positions: str | None = None
    top: int = 5  # the aggregate's sites listed per kind (its page lists as many as the terminal)
    columns: Columns | None = None
    command, unit, line, block, streams = "patch", "pairs", PAIR_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
        return check_pair(config, tokenizer, line)

    def check_items(self, pairs: list[Pair]) -> None:
        check_one_metric([(pair.line, pair.foil is not None) for pair in pairs])
        self.columns = columns_of(pairs, self.options.sites, self.align, self.positions)

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[Patching]:
        return pair_results(model, tokenizer, pairs, self.options, self.columns, progress)

    def shown(self, result: Patching) -> Patching:
        return normalised(result)

    def aggregate(self, done: Done, dataset: Dataset) -> DatasetPatching:
        pairs = list(done)
        result = aggregate(pairs, self.columns, dataset, self.options.method, done.interrupted)
        result.top = self.top
        return result


def pair_results(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair], options: PatchOptions,
                 columns: Columns | None, progress: Callable[[float], None] | None = None) -> Iterator[Patching]:
    """Each pair patched as a single run patches it, its grids holding differences (patched - corrupt), in order
    (`columns`: the positions swept in each). The pairs go in batches (run_pairs): up to `batch_pairs` of them at a
    time, those of one length and metric position together. `progress(pairs)`: the pairs finished, in fractions of
    a pair as a batch's patched runs finish. Ctrl-C during a batch: KeyboardInterrupt after the batches done."""
    limit = batch_pairs(model, pairs, options.batch_mb)
    for start in range(0, len(pairs), limit):
        window = pairs[start:start + limit]
        batches: dict[tuple, list[Pair]] = {}
        for pair in window:
            positions = None if columns is None else tuple(columns.position(pair, c) for c in columns.swept)
            batches.setdefault((len(pair.ids_clean), pair.end, positions), []).append(pair)
        done: dict[int | None, Patching] = {}
        for (_, _, positions), batch in batches.items():
            swept = dataclasses.replace(options, positions=None if positions is None else list(positions))
            before = start + len(done)

            def runs(finished: int, total: int) -> None:  # the batch's patched runs, as a share of its pairs
                if progress is not None:
                    progress(before + len(batch) * finished / max(total, 1))

            for result in run_pairs(model, tokenizer, batch, swept, runs, differences=True):
                if result.interrupted:
                    raise KeyboardInterrupt
                done[result.line] = result
            if progress is not None:
                progress(start + len(done))
        yield from (done[pair.line] for pair in window)


PAIRS = 16  # the most pairs patched in one batch


def batch_pairs(model: TransformerModel, pairs: list[Pair], batch_mb: float) -> int:
    """How many pairs are patched together: PAIRS, fewer where their clean and corrupt caches (every block's
    sites, about 8 x hidden wide) would pass `batch_mb`; one on an encoder-decoder (its patched runs share one
    memory)."""
    config = model.config
    if config.architecture == "encoder-decoder" or not pairs:
        return 1
    longest = max(len(pair.ids_clean) for pair in pairs)
    blocks = sum(len(stack.blocks) for _, stack in model.stacks())
    element = model.embed_tokens.weight.element_size()
    return max(1, min(PAIRS, int(batch_mb * 2**20 // (2 * longest * blocks * 8 * config.hidden_size * element))))


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


def aggregate(done: list[tuple[Pair, Patching]], columns: Columns | None, dataset: Dataset, method: str,
              interrupted: bool) -> DatasetPatching:
    """The dataset's scores, intervals and shares from each pair's differences (see DatasetPatching)."""
    import torch

    from tfcli.analysis.dataset import ratio_of_means, share_restored

    resamples = dataset.resamples
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
        out["attribution_grids"] or None, done=len(done), total=len(dataset.items), interrupted=interrupted,
        decoder_tokens=first.decoder_tokens, decoder_token_texts=first.decoder_token_texts,
        label_metric=first.label_metric, token_texts_clean=texts,
        positions=None if columns is None or len(columns.swept) == count else list(columns.swept),
        dataset=dataset.path, n=len(done), pairs=len(dataset.items), skipped=dataset.skipped,
        equal=int(equal.sum()), resamples=resamples,
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
