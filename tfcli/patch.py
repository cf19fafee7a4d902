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

Activation patching is fast and exact. The naive sweep (`fast=False`, what TransformerLens's patching.py does) runs
one whole forward pass per site. The fast sweep computes the same numbers with far less: a patched run at layer l
starts from the corrupt run's residual stream entering block l (nothing below l changes); on a causal stack a patch
at position p changes nothing before p, so the run covers only positions p .. the metric's position and reads the
corrupt run's keys and values before p; and the patched runs are batched, a batch growing as it goes down the
layers (a run patched at layer l joins the batch at block l). Every score equals the naive sweep's to float
precision (tests/test_patch.py checks 1e-4).

Attribution patching is the first-order estimate: (clean - corrupt activation) . d metric / d activation, the
gradient taken on the corrupt run, for every site from one backward pass (TransformerLens's attribution patching).

Shapes: T tokens, d the model width, H heads, G key/value heads, D head size, L layers.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcli.analysis.indices import parse_indices
from tfcli.analysis.inputs import model_input
from tfcli.analysis.metric import Token, parse_label, parse_token, position_of
from tfcli.analysis.dataset import Line, LineSpec
from tfcli.analysis.names import KINDS, Kind, block_site, every_block, kind_of
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.ablation import Ablation
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.model.sites import Hook
    from tfcli.model.transformer import BlockInputs, Stack
    from tfcli.tokenizer import Tokenizer

DEFAULT_SITES = ("resid", "attn", "mlp", "heads")
METHODS = ("activation", "attribution", "both")
BATCH_MB = 256  # the most memory one batch of patched runs may hold (activations, roughly)
# |clean - corrupt| under this fraction of max(|clean|, |corrupt|, 1) is a small gap: the scores, divided by it, read
# ordinary changes of the metric as large ones (docs/commands.md#patch says why)
SMALL_GAP = 0.1


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


@dataclass(frozen=True)
class Patch:
    """One patched site: a kind (analysis.names.KINDS) at a layer (of a stack: "", "encoder." or "decoder."), at one
    position and/or head, as the kind's axes say."""

    kind: str
    layer: int
    position: int | None = None  # None: every position
    head: int | None = None  # None: every head
    stack: str = ""
    pair: int = 0  # a batch of pairs (run_pairs): the pair it is patched in

    @property
    def name(self) -> str:
        return block_site(self.layer, KINDS[self.kind].leaf, self.stack)

    @property
    def grid(self) -> str:
        return self.stack + self.kind

    @property
    def cell(self) -> tuple[int, ...]:
        """Where the patch's score goes in its layer's row of the grid: its index along each of the kind's axes."""
        return tuple(getattr(self, axis) for axis in KINDS[self.kind].axes)


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


def same_value(clean: float, corrupt: float) -> bool:
    """The clean and corrupt values are equal (to 1e-6 of their size): no score can be normalised by their gap."""
    return abs(clean - corrupt) < 1e-6 * max(1.0, abs(clean))


def small_gap(clean: float, corrupt: float) -> bool:
    """|clean - corrupt| < SMALL_GAP x max(|clean|, |corrupt|, 1)."""
    return abs(clean - corrupt) < SMALL_GAP * max(abs(clean), abs(corrupt), 1.0)


class LengthMismatch(TfcliError):
    """The clean and corrupt texts tokenize to different lengths; `rows` align them: (clean index, clean token's
    text, corrupt index, corrupt token's text, mark) with None where one side has no token, mark `=`, `≠`, `+` or `-`."""

    def __init__(self, message: str, hint: str, rows: list[tuple[int | None, str | None, int | None, str | None, str]]):
        super().__init__(message, hint, exit_code=2)
        self.rows = rows


# ---------------------------------------------------------------- checks and inputs


def check_model(config: ModelConfig) -> None:
    """Refuse, before a model is built, one whose output gives no metric to patch."""
    if config.head not in ("lm", "mlm", "classifier"):
        has = "no head" if config.head == "none" else f"a `{config.head}` head"
        raise usage_error(f"{config.name} has {has}: patch reads the logit (difference) of tokens or of a "
                          "classifier's labels", "use a model with an LM, masked-LM or classifier head")


def check_options(config: ModelConfig, tokenizer: Tokenizer, options: PatchOptions) -> tuple[Token, Token | None]:
    """Everything checked before a model is built: the model, the method, the sites and the target and foil
    (tokens, or labels for a classifier)."""
    check_model(config)
    if options.method not in METHODS:
        raise usage_error(f"method must be one of {', '.join(METHODS)}, got `{options.method}`", parameter="method")
    unknown = [s for s in options.sites if s not in KINDS]
    if unknown or not options.sites:
        raise usage_error(f"sites: unknown `{','.join(unknown)}`" if unknown else "sites: none given",
                          f"choose from {', '.join(KINDS)} (default {','.join(DEFAULT_SITES)})", parameter="sites")
    return check_metric(config, tokenizer, options.target, options.foil, options.position)


def check_metric(config: ModelConfig, tokenizer: Tokenizer, target_spec: str, foil_spec: str | None,
                 position: int | None, prefix: str = "--") -> tuple[Token, Token | None]:
    """The target and foil (tokens, or labels for a classifier), as options (`prefix` "--") or a dataset line's
    keys (prefix "")."""
    if config.head == "classifier":
        if position is not None:
            raise usage_error(f"{prefix}position is for a token's logit: a classifier's labels are read from the "
                              "whole text")
        target = parse_label(config, target_spec, f"{prefix}target")
        foil = parse_label(config, foil_spec, f"{prefix}foil") if foil_spec is not None else None
    else:
        target = parse_token(tokenizer, target_spec, f"{prefix}target", config.vocab_size)
        foil = parse_token(tokenizer, foil_spec, f"{prefix}foil", config.vocab_size) if foil_spec is not None else None
    if foil is not None and foil.id == target.id:
        raise usage_error(f"{prefix}target and {prefix}foil are the same ({target.text!r}): their difference is "
                          "always 0")
    return target, foil


def parse_sites(spec: str | None) -> tuple[str, ...]:
    """`resid,attn` -> ("resid", "attn"); None: the default kinds."""
    if spec is None:
        return DEFAULT_SITES
    return tuple(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))


def pair_inputs(config: ModelConfig, tokenizer: Tokenizer, clean: str, corrupt: str) -> tuple[list[int], list[int]]:
    """The ids the model reads for the two texts (a decoder: as a prompt, without an appended end token); a
    LengthMismatch when their lengths differ, with the two tokenizations aligned."""
    encodings = tokenizer.encode([clean, corrupt])
    ids = [model_input(config, e) for e in encodings]
    # a text that gives no token of its own (nothing, or only the special tokens the tokenizer adds) is empty
    empty = [name for name, encoding in zip(("clean", "corrupt"), encodings)
             if all(sequence is None for sequence in encoding.sequence_ids)]
    if len(empty) == 2:
        raise usage_error("the clean and corrupt texts are both empty: they give no token of their own",
                          "give two texts of the same number of tokens that differ where the model should notice")
    limit = config.max_position_embeddings
    for text, row in zip(("clean", "corrupt"), ids):
        if limit and len(row) > limit and config.position == "learned":
            raise usage_error(f"the {text} text has {len(row)} tokens: the model has {limit} positions")
    if len(ids[0]) != len(ids[1]) or empty:
        tokens = [tokenizer.texts(row) for row in ids]  # as people read them: ' Mary', not 'ĠMary'
        hint = "reword one so that both have the same number of tokens (swap words that are one token each)"
        if empty:
            other = ("corrupt", "clean")[("clean", "corrupt").index(empty[0])]
            hint = f"the {empty[0]} text is empty (no token of its own): give it a text of as many tokens as the " \
                   f"{other} one"
        raise LengthMismatch(
            f"the clean and corrupt texts tokenize to different lengths ({len(ids[0])} and {len(ids[1])} tokens): "
            "patching puts back position for position", hint, align(*tokens))
    return ids[0], ids[1]


def parse_positions(spec: str | None, length: int) -> list[int] | None:
    """`--positions` as `--layers` reads it (`10-`, `-5-`, `3,7`; negative counting from the end), against the
    texts' `length` tokens; None or 'all': every position."""
    return parse_indices(spec, length, "positions", has="the texts have")


def align(clean: list[str], corrupt: list[str]) -> list[tuple[int | None, str | None, int | None, str | None, str]]:
    """The two token lists aligned (difflib): equal runs side by side, replaced runs row by row (`≠`), the rest
    with a blank on the side that lacks them (`-`: only in clean, `+`: only in corrupt)."""
    import difflib

    rows: list[tuple[int | None, str | None, int | None, str | None, str]] = []
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, clean, corrupt, autojunk=False).get_opcodes():
        for k in range(max(a1 - a0, b1 - b0)):
            i, j = a0 + k, b0 + k
            left = (i, clean[i]) if i < a1 else (None, None)
            right = (j, corrupt[j]) if j < b1 else (None, None)
            mark = "=" if op == "equal" else "≠" if left[0] is not None and right[0] is not None else \
                "-" if right[0] is None else "+"
            rows.append((*left, *right, mark))
    return rows


# ---------------------------------------------------------------- the sites of a sweep


def patches(model: TransformerModel, kinds: tuple[str, ...], lengths: dict[str, int],
            positions: list[int] | None = None) -> list[Patch]:
    """Every site of the sweep, kind by kind, layer by layer, then along the kind's axes; `lengths` by stack;
    `positions`: only those positions of a stack that reads the texts (not an encoder-decoder's decoder)."""
    out: list[Patch] = []
    for prefix, stack in model.stacks():
        for name in kinds:
            kind = KINDS[name]
            sizes = {"position": range(lengths[prefix]), "head": range(kind.heads(model.config))}
            if positions is not None and prefix != "decoder.":
                sizes["position"] = [p for p in positions if p < lengths[prefix]]
            for layer in range(len(stack.blocks)):
                out += [Patch(name, layer, stack=prefix, **dict(zip(kind.axes, cell)))
                        for cell in itertools.product(*(sizes[axis] for axis in kind.axes))]
    return out


def unchanged(patch: Patch, stacks: dict[str, Stack], first: int | None, position: int | None) -> bool:
    """Whether a patch changes nothing, on a causal stack: before the `first` position where the texts differ (the
    stack that reads the texts: every activation there is the same in both runs), or after the metric's
    `position` (it cannot reach it)."""
    if patch.position is None or not stacks[patch.stack].causal:
        return False
    if patch.stack == "" and first is not None and patch.position < first:
        return True
    return position is not None and patch.position > position


def empty_grid(kind: Kind, layers: int, heads: int, length: int) -> list:
    """A layer's row per layer, nested along the kind's axes, every score None."""
    sizes = [{"position": length, "head": heads}[axis] for axis in kind.axes]

    def nested(sizes: list[int]) -> list:
        return [None] * sizes[0] if len(sizes) == 1 else [nested(sizes[1:]) for _ in range(sizes[0])]

    return [nested(sizes) for _ in range(layers)]


def put(grids: dict[str, list], patch: Patch, value: float) -> None:
    row = grids[patch.grid][patch.layer]
    for index in patch.cell[:-1]:
        row = row[index]
    row[patch.cell[-1]] = value


def run(model: TransformerModel, tokenizer: Tokenizer, clean: str, corrupt: str, options: PatchOptions,
        progress: Callable[[int, int], None] | None = None) -> Patching:
    """Patch every site of `options.sites` from the clean run into the corrupt one; `progress(done, total)` is
    called as patched runs finish (total: the runs needed). Ctrl-C (KeyboardInterrupt) during the sweep returns
    what is finished (`interrupted`, the rest None)."""
    ids_clean, ids_corrupt = pair_inputs(model.config, tokenizer, clean, corrupt)
    return run_ids(model, tokenizer, ids_clean, ids_corrupt, options, progress, clean, corrupt)


def run_ids(model: TransformerModel, tokenizer: Tokenizer, ids_clean: list[int], ids_corrupt: list[int],
            options: PatchOptions, progress: Callable[[int, int], None] | None = None, clean: str = "",
            corrupt: str = "", differences: bool = False) -> Patching:
    """`run` on token ids of the same length (the texts only for the record). `differences`: the grids hold
    patched - corrupt, not normalised, and texts with the same metric are not refused (a dataset's pairs, whose
    scores are normalised over the whole dataset)."""
    pair = Pair(None, clean, corrupt, ids_clean, ids_corrupt, options.target, options.foil, options.position,
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
    device = model.embed_tokens.weight.device
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
    every = patches(model, options.sites, lengths, positions)
    stacks = dict(model.stacks())
    firsts = [next((i for i, (a, b) in enumerate(zip(pair.ids_clean, pair.ids_corrupt)) if a != b), None)
              for pair in pairs]
    fixed: list[list[Patch]] = [[] for _ in pairs]  # 0 without a run
    sweep: list[Patch] = []
    causal = options.ablation is None or not options.ablation.by_mean  # a mean over the positions reads them all
    for row, first in enumerate(firsts):
        for patch in every:
            if causal and unchanged(patch, stacks, first, position):
                fixed[row].append(patch)
            else:
                sweep.append(dataclasses.replace(patch, pair=row))
    names = sorted({p.name for p in every})
    clean_t = torch.tensor([pair.ids_clean for pair in pairs], device=device)
    corrupt_t = torch.tensor([pair.ids_corrupt for pair in pairs], device=device)
    kv = every_block(model, "attn.k", causal=True) + every_block(model, "attn.v", causal=True)
    resid = every_block(model, "resid_pre")
    estimate = options.method != "activation"  # the corrupt run keeps its graph, for one backward pass
    ablation = options.ablation
    removed = ablation and ablation.hooks
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean_t, names, removed, **inputs, **kept)
        unablated = None if ablation is None else \
            list(zip(*(read(model(ids, **inputs, **kept).logits).tolist() for ids in (clean_t, corrupt_t))))
    corrupt_names = names if options.method == "attribution" else sorted(set(names + kv + resid))
    corrupt_logits, corrupt_cache = model.run_with_cache(corrupt_t, corrupt_names, removed, grad=estimate, **inputs,
                                                         **kept)
    clean_values, corrupt_values = read(clean_logits).tolist(), read(corrupt_logits.detach()).tolist()
    if not differences:
        for clean_value, corrupt_value in zip(clean_values, corrupt_values):
            if same_value(clean_value, corrupt_value):
                what = "logit difference" if foils is not None else "logit"
                raise TfcliError(f"nothing to restore: the clean and corrupt texts give the same {what} "
                                 f"({clean_value:+.6f} and {corrupt_value:+.6f})",
                                 "choose a corrupt text (or a target and foil) on which the model behaves differently")

    def new_grids() -> dict[str, list]:
        return {f"{prefix}{kind}": empty_grid(KINDS[kind], len(stack.blocks), KINDS[kind].heads(config),
                                              lengths[prefix])
                for prefix, stack in model.stacks() for kind in options.sites}

    runs = collections.Counter((patch.pair, patch.grid) for patch in sweep)
    results = []
    for row, pair in enumerate(pairs):
        ids_clean, ids_corrupt = pair.ids_clean, pair.ids_corrupt
        result = Patching(pair.clean, pair.corrupt, tokenizer.tokens(ids_clean), tokenizer.tokens(ids_corrupt),
                          ids_clean, ids_corrupt, position, *metrics[row], clean_values[row], corrupt_values[row],
                          options.method, new_grids(), total=len(every) - len(fixed[row]), label_metric=classifier,
                          positions=positions, unchanged=len(fixed[row]),
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
        for patch in fixed[row]:
            put(result.grids, patch, 0.0)
        results.append(result)
    scales = [1.0 if differences else clean - corrupt for clean, corrupt in zip(clean_values, corrupt_values)]
    if options.method in ("attribution", "both"):
        estimates = attribution(corrupt_logits, corrupt_cache, clean_cache, read, sweep, names) if sweep else []
        corrupt_cache = {name: value.detach() for name, value in corrupt_cache.items()}
        del corrupt_logits
        attributed = [new_grids() for _ in pairs]
        for patch, value in zip(sweep, estimates):
            put(attributed[patch.pair], patch, value / scales[patch.pair] + 0.0)  # + 0.0: no -0.0 ("-0.0000")
        for row, result in enumerate(results):
            for patch in fixed[row]:
                put(attributed[row], patch, 0.0)
            if options.method == "attribution":
                result.grids, result.done, result.finished = attributed[row], result.total, dict(result.runs)
            else:
                result.attribution_grids = attributed[row]
        if options.method == "attribution":
            return results
    # a mean-ablation needs whole passes (the fast sweep runs part of the text); an encoder-decoder's fast sweep
    # runs its encoder's last block and the decoder outside the patched stack's hooks
    fast = options.fast and (ablation is None or not (ablation.by_mean or encoder_decoder))
    first = min((f for f in firsts if f is not None), default=None)
    sweeper = fast_sweep(model, sweep, clean_cache, corrupt_cache, metric, inputs, position, options.batch_mb,
                         first, removed) \
        if fast else naive_sweep(model, sweep, clean_cache, corrupt_t, metric, inputs, removed)
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


class PairMetric:
    """The metric of a batch of pairs, each with its own target and foil (`targets`, `foils`: (P,) ids; foils None:
    the target's logit alone): target - foil at `position` of a token head's logits, or of a classifier's labels
    (position None)."""

    def __init__(self, targets: Tensor, foils: Tensor | None, position: int | None):
        self.targets, self.foils, self.position = targets, foils, position

    def of_rows(self, logits: Tensor, pairs: Tensor) -> Tensor:
        """(R, V) logits of rows patched in `pairs` (R,) -> (R,) in float64."""
        logits = logits.double()
        value = logits.gather(1, self.targets[pairs, None])[:, 0]
        return value - logits.gather(1, self.foils[pairs, None])[:, 0] if self.foils is not None else value

    def __call__(self, logits: Tensor) -> Tensor:
        """The pairs' logits, (P, T, V) or (P, labels) -> (P,)."""
        import torch

        rows = logits[:, self.position] if self.position is not None else logits
        return self.of_rows(rows, torch.arange(rows.shape[0], device=rows.device))


def attribution(logits: Tensor, cache: dict[str, Tensor], clean_cache: dict[str, Tensor], metric: PairMetric,
                sweep: list[Patch], names: list[str]) -> list[float]:
    """(clean - corrupt) . d metric / d site, the gradient on the corrupt runs (their `logits` and `cache`, kept with
    their graph), for every patch of the sweep, from one backward pass (the pairs' runs are independent rows): the
    products summed over every axis of the site but those the patch's kind selects along."""
    import torch

    from tfcli.model import sites

    grads = dict(zip(names, torch.autograd.grad(metric(logits).sum(), [cache[n] for n in names], allow_unused=True)))
    sums: dict[tuple[str, str], Tensor] = {}  # (site, kind) -> the products summed, (P, *the kind's axes)
    for patch in sweep:
        if (patch.name, patch.kind) in sums:
            continue
        grad = grads[patch.name]
        if grad is None:  # the metric does not depend on it (a site after the metric's position)
            grad = torch.zeros_like(cache[patch.name])
        clean, corrupt = clean_cache[patch.name].double(), cache[patch.name].detach().double()
        product = (clean - corrupt) * grad.double()
        position_axis, head_axis = sites.axes(patch.name)
        kept = [{"position": position_axis, "head": head_axis}[axis] for axis in KINDS[patch.kind].axes]
        summed = product.sum([d for d in range(1, product.dim()) if d not in kept])  # its axes in increasing order
        sums[patch.name, patch.kind] = summed.permute([0] + [1 + sorted(kept).index(d) for d in kept])
    return [float(sums[patch.name, patch.kind][(patch.pair, *patch.cell)]) for patch in sweep]


def naive_sweep(model: TransformerModel, sweep: list[Patch], clean_cache: dict[str, Tensor], corrupt: Tensor,
                metric: PairMetric, inputs: dict[str, Any], removed: dict[str, Hook] | None = None
                ) -> Iterator[tuple[list[Patch], list[float]]]:
    """One whole forward pass of the corrupt texts per site, the pairs it is patched in as one batch, the clean
    value put back with a hook (what TransformerLens's patching functions do); `removed`: the hooks of --ablate,
    first on every pass."""
    import torch

    from tfcli.model import sites

    by_site: dict[Patch, list[Patch]] = {}
    for patch in sweep:
        by_site.setdefault(dataclasses.replace(patch, pair=0), []).append(patch)
    for site, patched in by_site.items():
        rows = torch.tensor([p.pair for p in patched], device=corrupt.device)
        positions = None if site.position is None else [site.position]
        heads = None if site.head is None else [site.head]
        hook = sites.replace(site.name, clean_cache[site.name][rows], positions, heads)
        with torch.no_grad():
            logits = model.run_with_hooks(corrupt[rows], sites.merged(removed, {site.name: hook}),
                                          **{name: value[rows] for name, value in inputs.items()})
        rows_read = logits[:, metric.position] if metric.position is not None else logits
        yield patched, metric.of_rows(rows_read, rows).tolist()



# ---------------------------------------------------------------- the fast sweep


def _hook(placed: list[tuple[int, Patch]], source: Tensor, start: int) -> Callable[[Tensor], Tensor]:
    """A hook on one site for a batch of patched runs: row r of `placed` (row, patch) gets its pair's clean run's
    value (`source`, the site of the pairs' whole texts, (P, ...)) where its patch selects; the batch covers the
    positions from `start` (a pattern: the queries, its keys from 0)."""
    import torch

    from tfcli.model import sites

    name, axes = placed[0][1].name, KINDS[placed[0][1].kind].axes
    position_axis, head_axis = sites.axes(name)
    order = (position_axis,) if head_axis is None else (position_axis, head_axis)
    device = source.device
    rows = torch.tensor([r for r, _ in placed], device=device)
    pairs = torch.tensor([p.pair for _, p in placed], device=device)
    heads = torch.tensor([p.head if p.head is not None else 0 for _, p in placed], device=device)
    positions = torch.tensor([p.position - start if p.position is not None else 0 for _, p in placed],
                             device=device)
    clean = source.movedim(order, list(range(1, len(order) + 1)))  # (P, T, [H,] ...): positions, then heads

    def hook(value: Tensor) -> Tensor:
        value = value.clone()
        patched = value.movedim(order, list(range(1, len(order) + 1)))  # a view: (B, T', [H,] ...)
        src = clean[:, start:start + patched.shape[1]][..., :patched.shape[-1]].to(value.dtype)
        if axes == ("position",):
            patched[rows, positions] = src[pairs, positions]
        elif axes == ("head",):  # every position
            patched[rows, :, heads] = src[pairs, :, heads]
        else:  # one head at one position
            patched[rows, positions, heads] = src[pairs, positions, heads]
        return value
    return hook


def _hooks(chunk: list[Patch], clean_cache: dict[str, Tensor], start: int) -> dict[str, Callable[[Tensor], Tensor]]:
    """The hooks of a batch of patched runs (row r: chunk[r]), by site; two kinds on one site (heads and
    heads-by-position share attn.z) compose."""
    from tfcli.model.sites import merged

    by_site: dict[tuple[str, str], list[tuple[int, Patch]]] = {}
    for row, patch in enumerate(chunk):
        by_site.setdefault((patch.name, patch.kind), []).append((row, patch))
    return merged(*({name: _hook(placed, clean_cache[name], start)} for (name, _), placed in by_site.items())) or {}


def _patched_runs(stack: Stack, prefix: str, chunk: list[Patch], resid: Callable[[int], Tensor],
                  clean_cache: dict[str, Tensor], inputs: BlockInputs, start: int, cache: Any,
                  removed: dict[str, Hook] | None = None) -> Tensor:
    """The patched runs of `chunk` (sorted by layer) through `stack`, over the positions `inputs` cover from
    `start`: each joins the batch at its layer, entering with its pair's corrupt run's stream there (`resid(layer)`,
    (P, T', d)), and reads that run's keys and values before `start` (`cache`). Returns the stack's output (B, T', d)
    after its final norm (and projection)."""
    import torch

    from tfcli.model import Sites
    from tfcli.model.sites import NO_SITES, merged

    joining = {layer: [p.pair for p in group] for layer, group in itertools.groupby(chunk, key=lambda p: p.layer)}

    def entering(layer: int) -> Tensor | None:
        if layer not in joining:
            return None
        x = resid(layer)
        return x[torch.tensor(joining[layer], device=x.device)]

    hooks = merged(removed, _hooks(chunk, clean_cache, start))
    sites = NO_SITES if not hooks else Sites(hooks=hooks).scope(prefix[:-1]) if prefix else Sites(hooks=hooks)
    return stack.run_blocks(None, inputs, chunk[0].layer, cache, sites, entering)


def _rows(batch: list[Patch], rows: int) -> Iterator[list[Patch]]:
    for k in range(0, len(batch), rows):
        yield batch[k:k + rows]


def fast_sweep(model: TransformerModel, sweep: list[Patch], clean_cache: dict[str, Tensor],
               corrupt_cache: dict[str, Tensor], metric: PairMetric, inputs: dict[str, Any], position: int | None,
               batch_mb: float = BATCH_MB, first: int | None = None, removed: dict[str, Hook] | None = None
               ) -> Iterator[tuple[list[Patch], list[float]]]:
    """The same scores as naive_sweep, batch by batch (see the module docstring): yields (patches, metric values).
    The sweep holds no patch that cannot change the metric (`unchanged`: run_pairs scores those 0 without a run).
    A patch of every position (a head, q, k, v, pattern) on the causal stack that reads the texts runs from the
    `first` position where some pair's texts differ: before it the clean and corrupt values are the same. The
    pairs' patched runs share the batches, each row reading its own pair's runs."""
    import torch

    from tfcli.model.attention import PrefixKV
    from tfcli.model.transformer import ModelOutput

    config = model.config
    by_prefix = dict(model.stacks())
    groups: dict[tuple[str, int], list[Patch]] = {}
    for patch in sweep:  # a causal stack: the run covers the positions from the patched one (or the first) on
        causal = by_prefix[patch.stack].causal and position is not None
        start = 0 if not causal else patch.position if patch.position is not None else \
            first if patch.stack == "" and first is not None else 0
        groups.setdefault((patch.stack, start), []).append(patch)
    longest = max(t.shape[1] for t in corrupt_cache.values() if t.dim() >= 2)
    width = max(config.hidden_size, config.intermediate_size, config.num_attention_heads * longest)
    element = torch.finfo(model.embed_tokens.weight.dtype).bits // 8

    def resid_of(prefix: str, start: int, stop: int) -> Callable[[int], Tensor]:
        return lambda layer: corrupt_cache[block_site(layer, "resid_pre", prefix)][:, start:stop]

    entering = {prefix: corrupt_cache[block_site(0, "resid_pre", prefix)] for prefix in by_prefix}
    full = {prefix: x.shape[1] for prefix, x in entering.items()}
    device = model.embed_tokens.weight.device
    with torch.no_grad():
        memory = None
        if "encoder." in by_prefix:  # the corrupt run's memory, from the stream entering the encoder's last block
            encoder, x = by_prefix["encoder."], entering["encoder."]
            last = len(encoder.blocks) - 1
            memory = encoder.run_blocks(resid_of("encoder.", 0, full["encoder."])(last),
                                        _whole_pass(encoder, x), last)
        whole = {prefix: _whole_pass(stack, entering[prefix], memory if prefix == "decoder." else None)
                 for prefix, stack in by_prefix.items()}
    for (prefix, start), group in groups.items():
        stack = by_prefix[prefix]
        stop = position + 1 if stack.causal and position is not None else full[prefix]
        rows = max(1, int(batch_mb * 2**20 // ((stop - start) * width * element * 8)))
        group.sort(key=lambda p: p.layer)
        given = None  # a causal stack's keys and values before `start`: the corrupt runs', (P, G, T, D) per layer
        if stack.causal and start > 0:
            given = [{i: corrupt_cache[block_site(i, f"attn.{which}", prefix)].transpose(1, 2)
                      for i in range(len(stack.blocks))} for which in "kv"]
        for chunk in _rows(group, rows):
            pairs = torch.tensor([p.pair for p in chunk], device=device)  # the batch's rows: joining in this order
            cache = PrefixKV(*given, start, pairs) if given is not None else None  # its cross-attention's per batch
            with torch.no_grad():
                hidden = _patched_runs(stack, prefix, chunk, resid_of(prefix, start, stop), clean_cache,
                                       whole[prefix].rows(start, stop), start, cache, removed)
                if prefix == "encoder.":  # the patched memory, then the whole decoder (one pair: run_pairs)
                    decoder_ids = inputs["decoder_input_ids"][:1].expand(len(chunk), -1)
                    logits = model(decoder_ids, decoder_input_ids=decoder_ids,
                                   encoder_output=ModelOutput(hidden)).logits
                    values = metric.of_rows(logits[:, metric.position], pairs)
                elif position is None:  # a classifier: the labels of the whole text
                    values = metric.of_rows(model.head_logits(hidden), pairs)
                else:
                    values = metric.of_rows(model.head_logits(hidden[:, position - start]), pairs)
            yield chunk, values.tolist()


def _whole_pass(stack: Stack, x: Tensor, memory: Tensor | None = None) -> BlockInputs:
    """What a stack's blocks read in a whole pass over the tokens of x (1, T, d) (no padding), the memory given."""
    import torch

    positions = torch.arange(x.shape[1], device=x.device)[None]
    return stack.block_inputs(positions, None, x.dtype, memory=memory)


# ---------------------------------------------------------------- over a dataset

PATCH_LINE = LineSpec(("clean", "corrupt", "target"), ("foil", "position"))
ALIGNS = ("start", "end")


@dataclass
class Pair:
    """A clean/corrupt pair to patch: a checked line of a patch dataset, or a single run's texts (run_ids)."""

    line: int | None  # None: a single run's texts
    clean: str
    corrupt: str
    ids_clean: list[int]
    ids_corrupt: list[int]
    target: str  # as the line gives them
    foil: str | None
    position: int | None
    end: int  # where `--align end` counts back from: the metric's position (a stack that reads the texts), else the
    # last token


def check_pair(config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
    """A dataset line checked as a single run's texts and options are (one token each, the pair's lengths, the
    position in range), before any model is built."""
    fields = line.fields
    check_metric(config, tokenizer, fields["target"], fields["foil"], fields["position"], prefix="")
    try:
        ids_clean, ids_corrupt = pair_inputs(config, tokenizer, fields["clean"], fields["corrupt"])
    except LengthMismatch as mismatch:
        raise usage_error(mismatch.message.split(":")[0]) from None
    end = len(ids_clean) - 1
    if config.head != "classifier" and config.architecture != "encoder-decoder":
        end = position_of(ids_clean, tokenizer, config, fields["position"])
    elif fields["position"] is not None and config.head != "classifier":
        position_of([0], tokenizer, config, fields["position"])  # an encoder-decoder's metric: the decoder's first
    return Pair(line.number, fields["clean"], fields["corrupt"], ids_clean, ids_corrupt, fields["target"],
                fields["foil"], fields["position"], end)


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


def run_dataset(model: TransformerModel | None, tokenizer: Tokenizer, pairs: list[Pair], options: PatchOptions,
                columns: Columns | None, resamples: int, dataset: str = "", skipped: int = 0,
                each: Callable[[Patching], None] | None = None,
                progress: Callable[[float, int], None] | None = None,
                results: Iterable[Patching] | None = None) -> DatasetPatching:
    """Patch every pair (`columns`: the positions swept in each), then aggregate. `each(result)` gets each pair's
    result as a single run gives it, in order; `progress(pairs done, pairs)`, in fractions of a pair while a batch
    of them runs. `results`: the pairs' results made
    elsewhere (a Ray cluster: tfcli/cluster.py), in order, instead of `model`'s. Ctrl-C (KeyboardInterrupt)
    aggregates the pairs finished (`interrupted`)."""
    done: list[tuple[Pair, Patching]] = []
    interrupted = False
    local = results is None  # the sweep's runs advance the progress, not only the pairs as they come
    if local:
        results = pair_results(model, tokenizer, pairs, options, columns,
                               None if progress is None else lambda finished: progress(finished, len(pairs)))
    by_line = {pair.line: pair for pair in pairs}
    try:
        for result in results:
            done.append((by_line[result.line], result))
            if each is not None:
                each(normalised(result))
            if progress is not None and not local:
                progress(len(done), len(pairs))
    except KeyboardInterrupt:
        interrupted = True
    return aggregate(done, columns, resamples, options.method, dataset, len(pairs), skipped, interrupted)


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


def patch_block(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair],
                settings: tuple[PatchOptions, Columns | None, list[str] | None]) -> list[Patching]:
    """A block of pairs on a Ray worker (tfcli/cluster.py): pair_results, the --ablate specs made into hooks here
    (hooks do not travel)."""
    from tfcli.analysis.ablation import ablation

    options, columns, ablate = settings
    options = dataclasses.replace(options, ablation=ablation(ablate, model.config))
    return list(pair_results(model, tokenizer, pairs, options, columns))


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


def aggregate(done: list[tuple[Pair, Patching]], columns: Columns | None, resamples: int, method: str,
              dataset: str, pairs: int, skipped: int, interrupted: bool) -> DatasetPatching:
    """The dataset's scores, intervals and shares from each pair's differences (see DatasetPatching)."""
    import torch

    from tfcli.analysis.dataset import ratio_of_means, share_restored

    if not done:
        raise KeyboardInterrupt  # interrupted before a pair finished: nothing to aggregate
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
        out["attribution_grids"] or None, done=len(done), total=pairs, interrupted=interrupted,
        decoder_tokens=first.decoder_tokens, decoder_token_texts=first.decoder_token_texts,
        label_metric=first.label_metric, token_texts_clean=texts,
        positions=None if columns is None or len(columns.swept) == count else list(columns.swept),
        dataset=dataset, n=len(done), pairs=pairs, skipped=skipped, equal=int(equal.sum()), resamples=resamples,
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
