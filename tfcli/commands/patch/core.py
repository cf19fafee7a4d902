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

Activation patching is fast and exact: the patched runs are the patching engine's (patching.py: the
naive sweep, one whole forward pass per site, with `fast=False`; by default the fast sweep, which computes the same
numbers with far less). Over a dataset (`PatchDataset`), the runner (tfcli/runner.py) reads the pairs and runs them
here or on Ray; the pairs of one length go through the sweep together (`run_pairs`). What a run gives, a pair's
`Patching` and a dataset's aggregate `DatasetPatching` with the grids' columns, is in results.py.

Attribution patching is the first-order estimate: (clean - corrupt activation) . d metric / d activation, the
gradient taken on the corrupt run, for every site from one backward pass (TransformerLens's attribution patching).

Shapes: T tokens, d the model width, H heads, G key/value heads, D head size, L layers.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Dataset, Done
from tfcli.analysis.indices import parse_indices
from tfcli.analysis.metric import Token, check_head, parse_metric, position_of
from tfcli.analysis.names import KINDS, block_site, every_block
from tfcli.analysis.pairs import OverPairs, Pair, pair_inputs, same_value
from tfcli.commands.patch.patching import (BATCH_MB, Patch, PairMetric, PairRuns, attribution, corrupt_run,
                                     count_patches, empty_grid, fast_sweep, naive_sweep, patches, put, unchanged)
from tfcli.errors import TfcliError, usage_error
from tfcli.commands.patch.results import Columns, DatasetPatching, Patching, aggregate, columns_of, normalised

if TYPE_CHECKING:
    from tfcli.analysis.ablation import Ablation
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

DEFAULT_SITES = ("resid", "attn", "mlp", "heads")
METHODS = ("activation", "attribution", "both")


@dataclass(kw_only=True)
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


@dataclass
class PatchDataset(OverPairs):
    """`patch --dataset` as the runner runs it (tfcli/runner.py): an item is a line's Pair (OverPairs), its result the
    pair's Patching of differences (patched - corrupt, pair_results), the aggregate a DatasetPatching. `align` and
    `positions` (--align, --positions) give the grids' columns, set from the pairs by check_items."""

    options: PatchOptions
    align: str | None = None
    positions: str | None = None
    top: int = 5  # the aggregate's sites listed per kind (its page lists as many as the terminal)
    columns: Columns | None = None
    command = "patch"

    def check_items(self, pairs: list[Pair]) -> None:
        super().check_items(pairs)
        self.columns = columns_of(pairs, self.options.sites, self.align, self.positions)

    def results(self, model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                progress: Callable[[float], None] | None) -> Iterator[Patching]:
        return pair_results(model, tokenizer, pairs, self.options, self.columns, progress)

    def shown(self, result: Patching) -> Patching:
        return normalised(result)

    def aggregate(self, done: Done, dataset: Dataset) -> DatasetPatching:
        pairs = list(done)
        result = aggregate(pairs, self.columns, dataset.resamples, self.options.method)
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
