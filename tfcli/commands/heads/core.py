"""`tfcli heads`: what every head does, measured over a text or a whole corpus.

Each head's attention pattern (the site `blocks.{l}.attn.pattern`, (B, H, T, S)) is scored against detection
patterns as TransformerLens's `detect_head` scores it with `error_measure="mul"`: sum(A * P) / sum(A) over the
head's query x key weights A of one text and a 0/1 pattern P:

- previous: the sub-diagonal (query q, key q - 1);
- duplicate: the keys before the query that hold the query's token (lower triangle, diagonal zeroed);
- induction: the duplicate pattern shifted one key to the right (the token after an earlier copy of the query's
  token), its first key column zeroed, lower triangle.

`exclude_first` / `exclude_self` zero A's first key column / its diagonal first (TransformerLens's `exclude_bos`,
`exclude_current_token`), in the sum below the line too. Besides these, summaries of each head: the mean over the
text's queries of the attention to the first token (`first`), to the text's own special tokens (`special`:
[CLS]/[SEP]/BOS, what the tokenizer added), to itself (`self`), and of the entropy of each query's attention in
bits (`entropy`). Padding never counts: a text's scores are those of its own n x n block of the pattern.

Over many texts each score is the mean of the texts' scores, with the count: a text that a pattern finds nothing
to look for in (fewer than two tokens for previous, no repeated token for duplicate and induction, no special token
for special, or only in key columns excluded) is left out of that detector's mean. Only sums are kept across
batches (one (layers, heads) float64 grid per detector), so a stream's memory stays flat however long it is.

Encoder-decoders: the self-attention of each stack, the encoder's layers first; the decoder reads the start token
and then the text's tokens (the text as its own target). Cross-attention is left out: its keys are the encoder's
tokens, and the patterns above are over one sequence. Shapes: B texts, H heads, T tokens (padded), R layer rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.dataset import Done, LineSpec
from tfcli.analysis.inputs import padded
from tfcli.analysis.names import block_site, every_block
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.dataset import Dataset, Line
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.texts import CappedWarnings
    from tfcli.tokenizer import Encoding, Tokenizer

DETECTORS = ("previous", "duplicate", "induction", "first", "special", "self", "entropy")
PATTERN_DETECTORS = ("previous", "duplicate", "induction")  # scored as detect_head does; the rest are means
LOWEST_FIRST = ("entropy",)  # a low entropy is what stands out (a focused head)
PROBES = ("induction",)
DEFAULT_TOP = 5
DEFAULT_PROBE_LENGTH = 50
BATCH_SIZE = 32  # texts per forward pass
CROSS_NOTE = ("cross-attention left out: its keys are the encoder's tokens, and the detectors' patterns are over "
              "one sequence")


@dataclass(kw_only=True)
class HeadsOptions:
    detectors: list[str] = field(default_factory=lambda: list(DETECTORS))
    exclude_first: bool = False
    exclude_self: bool = False
    per_text: bool = False
    keep_best: bool = False  # remember, per detector and head, the text where it scores highest (for the page)
    top: int = DEFAULT_TOP  # heads listed per detector (the terminal's and the page's lists)


@dataclass
class Sequence:
    """One text as a stack reads it: ids, tokens, and which positions are special tokens."""

    ids: list[int]
    tokens: list[str]
    special: list[bool]
    texts: list[str] | None = None  # the text each token stands for (Tokenizer.texts): shown; None: the tokens


@dataclass
class TextHeads:
    """One text's scores (--per-text): {detector: [[score per head] per layer row], or None when left out}."""

    text: str
    ids: list[int]
    scores: dict[str, list[list[float]] | None]
    layers: list[str] = field(default_factory=list)  # the name of each row (as Heads.layers)


@dataclass
class Best:
    """Where a head scores highest (lowest for entropy): the text and its attention map, for the page."""

    score: float
    text: int  # index into Heads.kept


@dataclass
class Heads:
    """The scores over every text: each the mean over the texts counted for its detector."""

    texts: int
    detectors: list[str]
    layers: list[str]  # the name of each row: L0, L1, ... or encoder.L0, ..., decoder.L0, ...
    heads: int
    scores: dict[str, list[list[float]]]  # {detector: [[mean score per head] per row]}; NaN where no text counted
    counts: dict[str, int]  # texts counted per detector
    exclude_first: bool = False
    exclude_self: bool = False
    notes: list[str] = field(default_factory=list)
    ids: list[int] | None = None  # the probe's
    probe: str | None = None  # "induction" for a probe run
    top: int = DEFAULT_TOP  # heads listed per detector: the run's --top, for the page
    # for the page (keep_best): per detector, [[Best per head] per row] and the texts they point to, each with
    # its sequences per stack and, once `attach_maps` ran, the maps {(row, head): (queries, keys) tensor}
    best: dict[str, list[list[Best | None]]] | None = None
    kept: dict[int, dict] = field(default_factory=dict)

    def label(self, row: int, head: int) -> str:
        """`L3H5`, or `decoder.L3H5` in an encoder-decoder."""
        return f"{self.layers[row]}H{head}"


# ---------------------------------------------------------------- checks, before a model is built


def parse_detectors(spec: str | None) -> list[str]:
    """`previous,induction` -> the detectors in DETECTORS order; None or `all` -> every one."""
    if spec is None or spec.strip() == "all":
        return list(DETECTORS)
    asked = [part.strip() for part in spec.split(",") if part.strip()]
    unknown = [name for name in asked if name not in DETECTORS]
    if unknown or not asked:
        got = ", ".join(f"`{name}`" for name in unknown) or "nothing"
        raise usage_error(f"detect: unknown detector {got}", f"choose from {', '.join(DETECTORS)} (or all)",
                          parameter="detect")
    return [name for name in DETECTORS if name in asked]


def check_probe(probe: str | None, length: int | None, has_texts: bool) -> None:
    """--probe's kind, and that it goes without texts; --probe-length only with --probe."""
    if probe is None:
        if length is not None:
            raise usage_error("--probe-length goes with --probe", "add --probe induction")
        return
    if probe not in PROBES:
        raise usage_error(f"--probe {probe}: unknown probe", f"the probes: {', '.join(PROBES)}")
    if has_texts:
        raise usage_error("--probe makes its own text: give texts or --probe, not both",
                          "leave out the texts (or --file) to run the probe")


def start_token(config: ModelConfig, tokenizer: Tokenizer) -> int | None:
    """The token a probe starts with: the model's BOS, else (an encoder) the tokenizer's [CLS]; None: none."""
    if config.bos_token_id is not None:
        return config.bos_token_id
    if config.architecture == "encoder":
        return tokenizer.cls_token_id
    return None


def probe_ids(config: ModelConfig, tokenizer: Tokenizer, length: int, seed: int) -> tuple[list[int], list[bool]]:
    """The induction probe: `length` distinct random tokens (no special token), seeded, repeated once, after the
    model's start token when it has one. Returns (ids, which are special)."""
    import torch

    if length < 1:
        raise usage_error(f"probe_length must be at least 1, got {length}", parameter="probe_length")
    start = start_token(config, tokenizer)
    total = 2 * length + (start is not None)
    if total > config.max_position_embeddings:
        raise usage_error(f"--probe-length {length}: the probe would be {total} tokens, more than the model's "
                          f"{config.max_position_embeddings} positions",
                          f"use at most {(config.max_position_embeddings - (start is not None)) // 2}")
    vocab = min(config.vocab_size, tokenizer.vocab_size)
    special = {i for i in (tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                           tokenizer.mask_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id,
                           config.pad_token_id, config.bos_token_id, config.decoder_start_token_id,
                           *config.eos_token_ids) if i is not None}
    special |= _added_special_ids(tokenizer)
    candidates = torch.tensor([i for i in range(vocab) if i not in special])
    if len(candidates) < length:
        raise usage_error(f"--probe-length {length}: the vocabulary has only {len(candidates)} ordinary tokens",
                          f"use at most {len(candidates)}")
    generator = torch.Generator().manual_seed(seed)
    drawn = candidates[torch.randperm(len(candidates), generator=generator)[:length]].tolist()
    ids = ([start] if start is not None else []) + drawn + drawn
    return ids, [start is not None and i == 0 for i in range(len(ids))]


def _added_special_ids(tokenizer: Tokenizer) -> set[int]:
    """The ids of the special tokens the tokenizer lists (added tokens marked special), where it lists them."""
    decoder = getattr(tokenizer.backend, "get_added_tokens_decoder", None)
    if decoder is None:
        return set()
    try:
        return {i for i, token in decoder().items() if getattr(token, "special", False)}
    except Exception:  # a backend without the listing
        return set()


# ---------------------------------------------------------------- the scores of a batch


def row_names(model: TransformerModel) -> list[str]:
    return [f"{prefix}L{i}" for prefix, stack in model.stacks() for i in range(len(stack.blocks))]


def sequences(config: ModelConfig, tokenizer: Tokenizer, encoding: Encoding) -> list[Sequence]:
    """What each stack reads of one text: the text's tokens; an encoder-decoder's decoder, the start token and
    then the same tokens."""
    from tfcli.model.transformer import start_token_id

    ids = list(encoding.ids)
    special = [s is None for s in encoding.sequence_ids]
    own = Sequence(ids, tokenizer.tokens(ids), special, tokenizer.texts(ids))
    if config.architecture != "encoder-decoder":
        return [own]
    start = start_token_id(config)
    decoder_ids = [start] + ids
    return [own, Sequence(decoder_ids, tokenizer.tokens(decoder_ids), [True] + special, tokenizer.texts(decoder_ids))]


def pattern_masks(rows: list[Sequence], width: int, exclude_first: bool, exclude_self: bool,
                  device) -> tuple[Tensor, Tensor, Tensor]:
    """The (B, T*T, 7) weights that one batched product turns a pattern (B, H, T*T) into the sums of each text
    (numerators of previous, duplicate, induction; their denominator sum(A) after the exclusions; the attention to
    the first token, to itself and to special tokens, summed over the queries), the (B, T) mask of real
    positions, and (B, 3) whether each pattern detector finds something to look for in each text."""
    import torch

    batch = len(rows)
    ids = torch.zeros(batch, width, dtype=torch.long)
    real = torch.zeros(batch, width, dtype=torch.bool)
    special = torch.zeros(batch, width, dtype=torch.bool)
    for b, row in enumerate(rows):
        n = len(row.ids)
        ids[b, :n] = torch.tensor(row.ids)
        real[b, :n] = True
        special[b, :n] = torch.tensor(row.special)
    valid = real[:, :, None] & real[:, None, :]  # (B, T, T): query and key both the text's
    lower = torch.ones(width, width, dtype=torch.bool).tril()
    eye = torch.eye(width, dtype=torch.bool)
    previous = torch.zeros(width, width, dtype=torch.bool)
    previous[1:, :-1] = torch.eye(width - 1, dtype=torch.bool)
    previous = previous & valid
    duplicate = (ids[:, :, None] == ids[:, None, :]) & valid & lower & ~eye
    induction = torch.zeros_like(duplicate)
    induction[:, :, 1:] = duplicate[:, :, :-1]  # key j marks key j - 1 holding the query's token; column 0 stays 0
    induction &= lower
    kept = valid.clone()
    if exclude_first:
        kept[:, :, 0] = False
    if exclude_self:
        kept &= ~eye
    first = torch.zeros_like(valid)
    first[:, :, 0] = real
    columns = [previous & kept, duplicate & kept, induction & kept, kept, first, eye & valid,
               valid & special[:, None, :]]
    weights = torch.stack([c.reshape(batch, width * width) for c in columns], dim=-1)  # (B, T*T, 7)
    found = weights[:, :, :3].any(dim=1)  # (B, 3)
    return weights.to(device), real.to(device), found


class Scorer:
    """The hook on one stack's patterns: each layer's (B, H, T, T) pattern -> (B, H) scores per detector."""

    def __init__(self, weights: Tensor, real: Tensor):
        self.weights = weights.float()  # (B, T*T, 7)
        self.real = real  # (B, T)
        self.lengths = real.sum(-1).clamp(min=1).float()  # (B,)
        self.out: dict[int, Tensor] = {}  # layer -> (B, H, 8)

    def hook(self, layer: int):
        def score(pattern: Tensor) -> None:
            import torch

            a = pattern.detach().float()  # (B, H, T, T)
            batch, heads, width, _ = a.shape
            sums = torch.bmm(a.reshape(batch, heads, width * width), self.weights)  # (B, H, 7)
            # entropy of each query's attention, in bits (0 log 0 = 0), over the text's queries
            logs = torch.where(a > 0, torch.log2(a.clamp(min=1e-30)), torch.zeros((), device=a.device))
            entropy = -(a * logs).sum(-1)  # (B, H, T)
            entropy = (entropy * self.real[:, None, :]).sum(-1)  # (B, H)
            self.out[layer] = torch.cat([sums, entropy[..., None]], dim=-1)
            return None

        return score

    def scores(self, layer: int) -> dict[str, Tensor]:
        """{detector: (B, H)} of one layer: the pattern detectors' ratios and the summaries' means."""
        import torch

        s = self.out.pop(layer).double()
        n = self.lengths.double()[:, None]
        below = s[..., 3]
        ratio = lambda k: torch.where(below > 0, s[..., k] / below.clamp(min=1e-300), torch.zeros_like(below))
        return {"previous": ratio(0), "duplicate": ratio(1), "induction": ratio(2), "first": s[..., 4] / n,
                "self": s[..., 5] / n, "special": s[..., 6] / n, "entropy": s[..., 7] / n}


def score_batch(model: TransformerModel, config: ModelConfig, tokenizer: Tokenizer, batch: list[list[Sequence]],
                options: HeadsOptions, type_ids: list[list[int]] | None = None) -> tuple[Tensor, Tensor]:
    """One padded forward pass over a batch of texts (each its sequences per stack): (B, R, H, D) scores per
    text, row, head and detector (DETECTORS order), and (B, D) whether each text counts for each detector."""
    import torch

    device = model.device
    stacks = model.stacks()
    hooks, scorers, found = {}, [], None
    inputs: dict[str, Tensor] = {}
    for s, (prefix, stack) in enumerate(stacks):
        rows = [texts[s] for texts in batch]
        ids, mask = padded([row.ids for row in rows], tokenizer, device)
        weights, real, stack_found = pattern_masks(rows, ids.shape[1], options.exclude_first, options.exclude_self,
                                                   device)
        if s == 0:
            inputs["input_ids"], inputs["attention_mask"] = ids, mask
            first = [row.special for row in rows]
            found = stack_found  # the text as the first stack reads it decides (the decoder reads the same tokens)
            has_special = torch.tensor([any(flags) for flags in first])
        else:
            inputs["decoder_input_ids"], inputs["decoder_attention_mask"] = ids, mask
        scorer = Scorer(weights, real)
        scorers.append(scorer)
        hooks.update({block_site(i, "attn.pattern", prefix): scorer.hook(i) for i in range(len(stack.blocks))})
    if type_ids is not None and model.reads_segments:
        width = inputs["input_ids"].shape[1]
        inputs["token_type_ids"] = torch.tensor([t + [0] * (width - len(t)) for t in type_ids], device=device)
    input_ids = inputs.pop("input_ids")
    with torch.no_grad():
        model.run_with_hooks(input_ids, hooks, logits_to_keep=0, **inputs)
    grids = []
    for scorer, (_, stack) in zip(scorers, stacks):
        for i in range(len(stack.blocks)):
            per = scorer.scores(i)
            grids.append(torch.stack([per[name] for name in DETECTORS], dim=-1).cpu())  # (B, H, D)
    scores = torch.stack(grids, dim=1)  # (B, R, H, D)
    always = torch.ones(len(batch), dtype=torch.bool)
    counted = {"previous": found[:, 0], "duplicate": found[:, 1], "induction": found[:, 2], "first": always,
               "special": has_special, "self": always, "entropy": always}
    return scores, torch.stack([counted[name] for name in DETECTORS], dim=-1)


# ---------------------------------------------------------------- the analysis (tfcli/runner.py)


@dataclass
class Text:
    """One text as the heads read it: the text, its sequences per stack, its segment ids (None: none)."""

    text: str
    sequences: list[Sequence]
    type_ids: list[int] | None = None


@dataclass
class TextScores:
    """One text's scores: (R, H, D) per layer row, head and detector (DETECTORS order) and (D,) whether the text
    counts for each detector; its text, ids and row names for its own view (--per-text)."""

    text: str
    ids: list[int]
    scores: Tensor
    counted: Tensor
    layers: list[str]


def text_of(config: ModelConfig, tokenizer: Tokenizer, encoding: Encoding) -> Text:
    return Text(encoding.text, sequences(config, tokenizer, encoding), encoding.type_ids)


def probe_text(config: ModelConfig, tokenizer: Tokenizer, length: int, seed: int) -> Text:
    """The induction probe (probe_ids) as a text: its sequences per stack."""
    ids, special = probe_ids(config, tokenizer, length, seed)
    stacks = [Sequence(ids, tokenizer.tokens(ids), special, tokenizer.texts(ids))]
    if config.architecture == "encoder-decoder":
        from tfcli.model.transformer import start_token_id

        decoder_ids = [start_token_id(config)] + ids
        stacks.append(Sequence(decoder_ids, tokenizer.tokens(decoder_ids), [True] + special,
                               tokenizer.texts(decoder_ids)))
    return Text(f"induction probe: {length} random tokens (seed {seed}), repeated", stacks)


@dataclass
class HeadsCorpus:
    """heads over texts, as the runner runs an analysis: a text is an item (truncated to `max_length`, or the
    model's positions, said through `truncated`), its scores the result, the means per detector the aggregate.
    The texts stream: a corpus of any length runs in flat memory (only sums are kept)."""

    options: HeadsOptions
    max_length: int | None = None
    truncated: CappedWarnings | None = None
    batch_size: int = BATCH_SIZE  # texts per forward pass
    command, unit, line, block, streams = "heads", "texts", LineSpec(("text",), ()), BATCH_SIZE, True

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Text:
        (encoding,) = tokenizer.encode_for_model([line.fields["text"]], config.max_position_embeddings, None,
                                                 self.max_length)
        if encoding.truncated and self.truncated is not None:
            self.truncated.add(f"{line.where} truncated from {encoding.untruncated_length} to {len(encoding.ids)} "
                               "tokens")
        return text_of(config, tokenizer, encoding)

    def check_items(self, items: list[Text]) -> None:
        pass

    def results(self, model: TransformerModel, tokenizer: Tokenizer, items: list[Text],
                progress: Callable[[float], None] | None) -> Iterator[TextScores]:
        """Each text's scores, in order, from padded batches of `batch_size` texts of similar lengths."""
        config, layers = model.config, row_names(model)
        order = sorted(range(len(items)), key=lambda i: len(items[i].sequences[0].ids))
        scored: dict[int, TextScores] = {}
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            type_ids = [items[i].type_ids for i in chosen]
            scores, counted = score_batch(model, config, tokenizer, [items[i].sequences for i in chosen],
                                          self.options, None if None in type_ids else type_ids)
            for b, i in enumerate(chosen):
                scored[i] = TextScores(items[i].text, items[i].sequences[0].ids, scores[b], counted[b], layers)
            if progress is not None:
                progress(start + len(chosen))
        return (scored[i] for i in range(len(items)))

    def shown(self, result: TextScores) -> TextHeads:
        return TextHeads(result.text, result.ids, {
            name: result.scores[:, :, d].tolist() if bool(result.counted[d]) else None
            for d, name in enumerate(DETECTORS) if name in self.options.detectors}, result.layers)

    def aggregate(self, done: Iterable[tuple[Text, TextScores]], dataset: Dataset | None) -> Heads:
        """Each detector's mean per head over the texts it counts, added BATCH_SIZE texts at a time."""
        import torch

        totals, batch, cross = None, [], False
        for item, result in itertools.chain(done, [(None, None)]):
            if item is not None:
                if totals is None:
                    totals = Totals(len(result.layers), result.scores.shape[1], self.options.keep_best)
                    layers = result.layers
                batch.append((item, result))
                cross = cross or len(item.sequences) > 1
            if batch and (item is None or len(batch) == BATCH_SIZE):
                totals.add(torch.stack([r.scores for _, r in batch]), torch.stack([r.counted for _, r in batch]),
                           [(i.text, i.sequences) for i, _ in batch])
                batch = []
        result = totals.result(self.options.detectors, layers, totals.sums.shape[2], self.options)
        if cross:
            result.notes.append(CROSS_NOTE)
        return result


class Totals:
    """Sums over texts, per detector: the scores (R, H) float64 and the texts counted; with `keep_best`, where each
    head scores highest (lowest for entropy) and those texts' sequences."""

    def __init__(self, rows: int, heads: int, keep_best: bool):
        import torch

        self.sums = torch.zeros(len(DETECTORS), rows, heads, dtype=torch.float64)
        self.counts = torch.zeros(len(DETECTORS), dtype=torch.long)
        self.texts = 0
        self.keep_best = keep_best
        self.best_score = torch.full((len(DETECTORS), rows, heads), float("nan"), dtype=torch.float64)
        self.best_text = torch.full((len(DETECTORS), rows, heads), -1, dtype=torch.long)
        self.kept: dict[int, dict] = {}

    def add(self, scores: Tensor, counted: Tensor, texts: list[tuple[str, list[Sequence]]]) -> None:
        """scores (B, R, H, D), counted (B, D)."""
        import torch

        by_detector = scores.permute(0, 3, 1, 2)  # (B, D, R, H)
        weight = counted.double()[:, :, None, None]
        self.sums += (by_detector * weight).sum(0)
        self.counts += counted.long().sum(0)
        if self.keep_best:
            sign = torch.tensor([-1.0 if name in LOWEST_FIRST else 1.0 for name in DETECTORS],
                                dtype=torch.float64)[None, :, None, None]
            ranked = torch.where(counted[:, :, None, None], by_detector * sign, torch.tensor(float("-inf"),
                                                                                         dtype=torch.float64))
            top, where = ranked.max(0)  # (D, R, H)
            current = torch.nan_to_num(self.best_score * sign[0], nan=float("-inf"))
            better = top > current
            self.best_score = torch.where(better, top * sign[0], self.best_score)
            self.best_text = torch.where(better, where + self.texts, self.best_text)
            for index in set(self.best_text.flatten().tolist()) - set(self.kept) - {-1}:
                text, stacks = texts[index - self.texts]
                self.kept[index] = {"text": text, "sequences": stacks}
            used = set(self.best_text.flatten().tolist())
            self.kept = {k: v for k, v in self.kept.items() if k in used}  # memory stays flat
        self.texts += len(texts)

    def result(self, detectors: list[str], layers: list[str], heads: int, options: HeadsOptions) -> Heads:
        means, counts, best = {}, {}, None
        for d, name in enumerate(DETECTORS):
            if name not in detectors:
                continue
            count = int(self.counts[d])
            grid = self.sums[d] / count if count else torch_nan(self.sums[d])
            means[name] = grid.tolist()
            counts[name] = count
        if self.keep_best:
            best = {name: [[Best(float(self.best_score[d, r, h]), int(self.best_text[d, r, h]))
                            if int(self.best_text[d, r, h]) >= 0 else None for h in range(heads)]
                           for r in range(len(layers))]
                    for d, name in enumerate(DETECTORS) if name in detectors}
        return Heads(self.texts, list(detectors), layers, heads, means, counts, options.exclude_first,
                     options.exclude_self, best=best, kept=dict(self.kept), top=options.top)


def torch_nan(like: Tensor) -> Tensor:
    return like * float("nan")


def run(model: TransformerModel, tokenizer: Tokenizer, chunks: Iterable[list[Encoding]], options: HeadsOptions,
        batch_size: int = BATCH_SIZE) -> Iterator[TextHeads | Heads]:
    """The Python API: tokenized texts (chunks of encodings) scored as `tfcli heads` scores them, in padded
    batches of `batch_size` texts of similar lengths; each text's TextHeads in order with `options.per_text`, then the Heads
    over all of them. A text's scores are the same alone or in any batch (its padding is masked out)."""
    corpus, shown = HeadsCorpus(options, batch_size=batch_size), []

    def done() -> Iterator[tuple[Text, TextScores]]:
        for encodings in chunks:
            texts = [text_of(model.config, tokenizer, encoding) for encoding in encodings]
            yield from zip(texts, corpus.results(model, tokenizer, texts, None))
    result = corpus.aggregate(Done(done(), shown.append if options.per_text else None), None)
    yield from (corpus.shown(scores) for scores in shown)
    yield result


def run_probe(model: TransformerModel, tokenizer: Tokenizer, options: HeadsOptions, length: int,
              seed: int) -> Iterator[TextHeads | Heads]:
    """The induction probe (probe_ids) scored as one text; its Heads carries its ids."""
    text = probe_text(model.config, tokenizer, length, seed)
    corpus = HeadsCorpus(options)
    (scores,) = corpus.results(model, tokenizer, [text], None)
    if options.per_text:
        yield corpus.shown(scores)
    result = corpus.aggregate([(text, scores)], None)
    result.ids, result.probe = text.sequences[0].ids, "induction"
    yield result


def attach_maps(model: TransformerModel, result: Heads) -> None:
    """For the page: run again the texts where heads score highest (one at a time) and keep, per text, the maps
    of the heads that point to it, in `result.kept[text]["maps"]` {(row, head): (T, T) tensor}."""
    import torch

    if not result.best:
        return
    wanted: dict[int, set[tuple[int, int]]] = {}
    for grid in result.best.values():
        for r, row in enumerate(grid):
            for h, best in enumerate(row):
                if best is not None:
                    wanted.setdefault(best.text, set()).add((r, h))
    device = model.device
    names = every_block(model, "attn.pattern")  # one per row, as row_names
    stack_of_row = [prefix for prefix, stack in model.stacks() for _ in stack.blocks]
    for index, cells in wanted.items():
        kept = result.kept[index]
        seqs = kept["sequences"]
        inputs = {}
        if len(seqs) > 1:
            inputs["decoder_input_ids"] = torch.tensor([seqs[1].ids], device=device)
        ids = torch.tensor([seqs[0].ids], device=device)
        with torch.no_grad():
            _, cache = model.run_with_cache(ids, names, logits_to_keep=0, **inputs)
        kept["maps"] = {(r, h): cache[names[r]][0, h].float().cpu() for r, h in sorted(cells)}
        kept["stack_of_row"] = {r: stack_of_row[r] for r, _ in cells}
