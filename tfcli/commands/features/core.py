"""`tfcli features`: what a sparse autoencoder (or transcoder) sees in a text, and what it costs the model.

The SAE (tfcli/analysis/sae.py: SAELens, Gemma Scope, Llama Scope and sparsify files) reads its site of one pass
(`run_with_cache`): x (T, d_in) per text. For each token: the top active features f = encode(x) with their
activations; the reconstruction r = decode(f) against what it stands for, t (x for an SAE, the output site for a
transcoder): the squared error's mean over the d values (MSE), the explained variance 1 - |t - r|^2 / |t - mean(t)|^2
(the mean over the text's tokens, as sae-lens's legacy explained variance takes it over a batch), the cosine of r
and t, and L0 (the features active). Then the model's next-token loss (a decoder's mean cross-entropy over the
positions that have a next token) on three more passes whose site is replaced (`run_with_hooks`): by r (spliced),
by r + (t - r) (the error term kept: the clean loss again, up to rounding), and by zeros (the ablation SAE papers
compare with), with the KL divergence of the clean next-token distribution to the spliced one at every position,
and the share of the loss recovered: (zero - spliced) / (zero - clean).

What is measured, by default, is what `tfcli sae train` trains on and measures: every token but position 0, the
model's special tokens (BOS, EOS, padding) and the outliers, tokens whose norm at the SAE's site is over OUTLIER (10)
times the median of the text's other tokens (the attention sink: SmolLM2's position 0 has a norm of about 21,900
where the others' are about 177; one such token sets a text's MSE and explained variance alone, and splicing its
reconstruction wrecks the loss). The splices replace the kept positions only (the others keep their own values), the
losses and KL are means over the kept positions that predict a next token, and the error's means, the feature's
density and contexts are over the kept tokens; each text says which it left out and why. `every_token` (the CLI's
`--all-tokens`) measures and splices every position.

With a feature (`--feature N`) the analysis is one pass per batch: feature N's activation on every token, and over
a corpus its top activating contexts, streamed (only the best contexts and sums are kept). Shapes: B texts, T
tokens (padded), d_sae features.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfcli.analysis.contexts import Context, TopContexts
from tfcli.analysis.dataset import Done, Line, LineSpec
from tfcli.analysis.inputs import check_length, model_input, padded
from tfcli.analysis.metric import Token
from tfcli.analysis.sae import direct_effects, fit, put_rows, sae_sites
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.dataset import Dataset
    from tfcli.analysis.sae import SAE
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

BATCH_SIZE = 16  # texts per forward pass
OUTLIER = 10.0  # a token whose norm at the site is over this many times its text's median is left out (sae train's)


@dataclass(kw_only=True)
class FeaturesOptions:
    """The run's options: features listed per token, the feature followed (None: every feature), its contexts."""

    top: int = 5
    feature: int | None = None
    contexts: int = 10
    target: Token | None = None  # with a target: each feature's direct effect on its logit (minus the foil's)
    foil: Token | None = None
    every_token: bool = False  # measure position 0, special tokens and outliers too (--all-tokens)


@dataclass
class Text:
    """One text as the model reads it."""

    number: int
    text: str
    ids: list[int]


@dataclass
class Losses:
    """A decoder's mean next-token loss over a text's predicted positions (nats) on the clean pass and with the
    site spliced (reconstruction; reconstruction + error; zeros), and the mean KL(clean || spliced) per position."""

    clean: float
    spliced: float
    with_error: float
    zero: float
    kl: float
    kl_with_error: float
    count: int  # positions predicted

    @property
    def recovered(self) -> float | None:
        """(zero - spliced) / (zero - clean): 1 when the reconstruction costs nothing, 0 when it is as bad as zeros."""
        gap = self.zero - self.clean
        return None if abs(gap) < 1e-12 else (self.zero - self.spliced) / gap


@dataclass
class TextFeatures:
    """One text's features: per token the top features [(index, activation)], the SAE's error (MSE, explained
    variance, cosine, L0) and, for a decoder, the losses; with a feature followed, its activation per token."""

    text: str
    ids: list[int]
    tokens: list[str]  # what each token stands for
    sae: dict[str, Any]
    top: list[list[tuple[int, float]]]
    mse: list[float]
    explained: list[float | None]
    cosine: list[float | None]
    l0: list[int]
    explained_text: float | None  # over the text's tokens together
    losses: Losses | None  # None: not a decoder, or a feature followed
    kl: list[float] | None  # per position, spliced
    feature: int | None = None
    activations: list[float] | None = None
    direct: Direct | None = None  # with a target
    left_out: dict[int, str] = field(default_factory=dict)  # position -> why (first, special, outlier): not measured
    every_token: bool = False

    @property
    def measured(self) -> list[int]:
        """The positions measured: the means, the losses and a feature's density are over these."""
        return [p for p in range(len(self.ids)) if p not in self.left_out]


@dataclass
class Direct:
    """The direct effects on the logit (difference) at the text's last position: each active feature's
    (feature, activation, effect), the largest |effect| first; the rest of the reconstruction's and the error
    term's; they sum to `site`, what the SAE's (output) site adds there; `logit` is the model's own."""

    position: int
    target: Token
    foil: Token | None
    logit: float
    site: float
    rest: float
    error: float
    features: list[tuple[int, float, float]]


@dataclass
class CorpusFeatures:
    """The aggregate over texts: the SAE's mean error per token, the losses' means over predicted positions; with
    a feature followed, its density and top activating contexts."""

    sae: dict[str, Any]
    tokens: int
    mse: float
    explained: float | None  # the mean of the texts' explained variance (over their tokens together)
    cosine: float | None
    l0: float
    losses: Losses | None
    feature: int | None = None
    active: int = 0  # tokens where the feature is active
    max_activation: float = 0.0
    mean_activation: float = 0.0  # over every token
    contexts: list[Context] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)  # why -> tokens left out (first, special, outlier)
    every_token: bool = False
    measured: int = 0  # tokens measured (tokens - those left out): the means' own


FEATURES_LINE = LineSpec(("text",), ())


def check_options(sae: SAE, options: FeaturesOptions) -> None:
    """What can be refused before the model is built."""
    if options.feature is not None and not 0 <= options.feature < sae.d_sae:
        raise usage_error(f"--feature {options.feature}: the SAE has features 0 to {sae.d_sae - 1}",
                          parameter="feature")


def check_text(config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Text:
    text = line.fields["text"]
    if not isinstance(text, str) or not text.strip():
        raise usage_error("the text is empty", "give some text")
    ids = model_input(config, tokenizer.encode([text])[0])
    check_length(config, len(ids))
    return Text(line.number, text, ids)


def kept_positions(x: Tensor, ids: Tensor, mask: Tensor, specials: set[int], every_token: bool
                   ) -> tuple[Tensor, list[dict[int, str]]]:
    """The positions measured (B, T) bool, and per text the positions left out with why: position 0 (`first`), a
    special token (`special`), a norm of x (B, T, d) over OUTLIER times the median of the text's other tokens
    (`outlier`); none with `every_token`. Padding is never measured."""
    import torch

    keep = mask.bool().clone()
    why: list[dict[int, str]] = [{} for _ in range(ids.shape[0])]
    if every_token:
        return keep, why
    special = torch.zeros_like(keep)
    for token in specials:
        special |= ids == token
    norms = x.float().norm(dim=-1)
    for b in range(ids.shape[0]):
        for p in range(int(mask[b].sum())):
            if p == 0 or special[b, p]:
                why[b][p] = "first" if p == 0 else "special"
        rest = keep[b] & ~special[b]
        rest[0] = False
        limit = OUTLIER * float(norms[b][rest].median()) if bool(rest.any()) else math.inf
        for p in (rest & (norms[b] > limit)).nonzero().flatten().tolist():
            why[b][p] = "outlier"
        for p in why[b]:
            keep[b, p] = False
    return keep, why


def next_token_losses(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """-log p(next token) at each position that has a next real token (B, T - 1), 0 elsewhere."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    loss = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    return loss * mask[:, 1:]


def run_batch(model: TransformerModel, tokenizer: Tokenizer, saes: list[SAE], texts: list[Text],
              options: FeaturesOptions) -> list[list[TextFeatures]]:
    """The features of a batch of texts (padded; each text's numbers are those of its own tokens), per text one
    TextFeatures per SAE: one clean pass keeps every SAE's sites, and each SAE's losses splice it alone."""
    import torch

    ids, mask = padded([t.ids for t in texts], tokenizer, model.device)
    decoder = model.config.architecture == "decoder" and model.config.head == "lm"
    names = list(dict.fromkeys(name for sae in saes for name in sae_sites(sae)))
    if options.target is not None and model.has_final_norm:
        names.append("final_norm.scale")
    out: list[list[TextFeatures]] = [[] for _ in texts]
    config = model.config
    specials = {i for i in (config.bos_token_id, config.pad_token_id, *config.eos_token_ids) if i is not None}
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names=names, attention_mask=mask)
        for sae in saes:
            fitted = fit(sae, cache)
            keep, why = kept_positions(fitted.x, ids, mask, specials, options.every_token)
            losses = kl = None
            if decoder and options.feature is None:
                losses, kl = spliced_losses(model, sae, (ids, mask, keep), logits, fitted)
            for b, text in enumerate(texts):
                out[b].append(text_features(tokenizer, sae, text, fitted, (b, keep[b], why[b]), options))
                if losses is not None:
                    out[b][-1].losses, out[b][-1].kl = losses[b], kl[b][:len(text.ids)]
                if options.target is not None:
                    out[b][-1].direct = direct_of(model, sae, fitted, (logits, cache), (b, len(text.ids) - 1),
                                                  options)
    return out


def direct_of(model: TransformerModel, sae: SAE, fitted, run: tuple[Tensor, dict], where: tuple[int, int],
              options: FeaturesOptions) -> Direct:
    """The direct effects at `where` (row, position) on the target's logit (minus the foil's): the readout's
    direction through the final norm, its divisor frozen at the position (as `attribute` reads a component)."""
    logits, cache = run
    row, position = where
    foil = options.foil.id if options.foil is not None else None
    readout = model.readout(options.target.id, foil)
    direction = readout.direction / cache["final_norm.scale"][row, position, 0].double() if readout.normed \
        else readout.direction
    found = direct_effects(sae, fitted, where, direction.to(fitted.features.device))
    value = logits[row, position, options.target.id] - (0 if foil is None else logits[row, position, foil])
    active = [(int(i), float(fitted.features[row, position, i]), float(found["effects"][i]))
              for i in fitted.features[row, position].nonzero().flatten()]
    return Direct(position, options.target, options.foil, float(value), found["site"], found["rest"],
                  found["error"], sorted(active, key=lambda f: -abs(f[2])))


def text_features(tokenizer: Tokenizer, sae: SAE, text: Text, fitted, row: tuple[int, Tensor, dict[int, str]],
                  options: FeaturesOptions) -> TextFeatures:
    """Text b of a batch's features and the SAE's error per token (its own tokens, not the padding); `row` is (b,
    the positions kept (T,), those left out with why). The explained variance is against the mean of the kept
    tokens, and over them together."""
    import torch

    b, keep, why = row
    n = len(text.ids)
    keep = keep[:n]
    features = fitted.features[b, :n]
    target, recon = fitted.target[b, :n].double(), fitted.reconstruction[b, :n].double()
    error = (target - recon).pow(2).sum(-1)
    spread = (target - (target[keep].mean(0) if bool(keep.any()) else target.mean(0))).pow(2).sum(-1)
    explained = [None if float(s) < 1e-12 else 1 - float(e) / float(s) for e, s in zip(error, spread)]
    norms = target.norm(dim=-1) * recon.norm(dim=-1)
    cosine = [None if float(m) == 0 else float(c) for c, m in
              zip(torch.nn.functional.cosine_similarity(target, recon, dim=-1), norms)]
    values, indices = features.topk(min(options.top, features.shape[-1]), dim=-1)
    top = [[(int(i), float(v)) for v, i in zip(vs, ix) if float(v) > 0] for vs, ix in zip(values, indices)]
    total = float(spread[keep].sum())
    result = TextFeatures(text.text, text.ids, tokenizer.texts(text.ids), sae.described(), top,
                          (error / target.shape[-1]).tolist(), explained, cosine, (features > 0).sum(-1).tolist(),
                          None if total < 1e-12 else 1 - float(error[keep].sum()) / total, None, None,
                          left_out=dict(why), every_token=options.every_token)
    if options.feature is not None:
        result.feature, result.activations = options.feature, features[:, options.feature].tolist()
    return result


def spliced_losses(model: TransformerModel, sae: SAE, inputs: tuple[Tensor, Tensor, Tensor], logits: Tensor,
                   fitted) -> tuple[list[Losses], list[list[float]]]:
    """Each text's Losses and its KL(clean || spliced) per position, from three passes with the SAE's output site
    replaced at the kept positions (`inputs`: ids, mask, kept (B, T)): by the reconstruction, by reconstruction +
    error, by zeros; the means over the kept positions that predict a next token."""
    import torch

    ids, mask, keep = inputs
    site = sae.site_out or sae.site
    recon = fitted.reconstruction
    kept = recon + (fitted.target - recon)
    runs = {}
    for name, rows in (("spliced", recon), ("with_error", kept), ("zero", torch.zeros_like(recon))):
        rows = torch.where(keep[..., None], rows, fitted.target)  # what the site holds elsewhere: its own value
        hook = (lambda value, rows=rows: put_rows(sae, value, rows)) if not sae.site_out \
            else (lambda value, rows=rows: rows.reshape(value.shape).to(value.dtype))
        runs[name] = model.run_with_hooks(ids, {site: hook}, attention_mask=mask)
    clean_logp = torch.log_softmax(logits.float(), dim=-1)

    def kl_of(other: Tensor) -> Tensor:  # (B, T)
        return (clean_logp.exp() * (clean_logp - torch.log_softmax(other.float(), dim=-1))).sum(-1) * mask

    predicts = (keep & mask.bool()).to(mask.dtype)  # a kept position that has a next real token: the means' own
    predicts[:, :-1] *= mask[:, 1:]
    predicts[:, -1] = 0
    counts = predicts.sum(-1)
    shifted = torch.cat([torch.zeros_like(predicts[:, :1]), predicts[:, :-1]], 1)  # next_token_losses reads [:, 1:]
    loss = {name: next_token_losses(value, ids, shifted).sum(-1) for name, value in
            (("clean", logits), *runs.items())}
    kl, kl_kept = kl_of(runs["spliced"]), kl_of(runs["with_error"])
    out = []
    for b in range(ids.shape[0]):
        count = int(counts[b])

        def mean(values: Tensor, b: int = b, count: int = count) -> float:
            return float(values[b]) / count if count else math.nan

        out.append(Losses(mean(loss["clean"]), mean(loss["spliced"]), mean(loss["with_error"]), mean(loss["zero"]),
                          mean((kl * predicts).sum(-1)), mean((kl_kept * predicts).sum(-1)), count))
    return out, kl.tolist()


@dataclass
class Several:
    """Several SAEs' results (`--sae` repeated): one TextFeatures or CorpusFeatures per SAE, in the order given."""

    parts: list


@dataclass
class FeaturesAnalysis:
    """`features` as the runner runs it: an item is a text, its result the text's TextFeatures (a Several of them,
    one per SAE, with several SAEs), the aggregate a CorpusFeatures (a Several of them; one text given alone is
    shown as its result: the command line's). Texts stream: only sums and the best contexts are kept."""

    saes: list[SAE]
    options: FeaturesOptions
    command, unit, line, block, streams = "features", "texts", FEATURES_LINE, BATCH_SIZE, True

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Text:
        return check_text(config, tokenizer, line)

    def check_items(self, items: list[Text]) -> None:
        pass

    def results(self, model: TransformerModel, tokenizer: Tokenizer, items: list[Text],
                progress: Callable[[float], None] | None) -> Iterator[TextFeatures | Several]:
        for start in range(0, len(items), BATCH_SIZE):
            for parts in run_batch(model, tokenizer, self.saes, items[start:start + BATCH_SIZE], self.options):
                yield parts[0] if len(parts) == 1 else Several(parts)
            if progress is not None:
                progress(min(start + BATCH_SIZE, len(items)))

    def shown(self, result: TextFeatures | Several) -> TextFeatures | Several:
        return result

    def aggregate(self, done: Done, dataset: Dataset) -> CorpusFeatures | Several:
        totals = [Totals(self.options) for _ in self.saes]
        first = None
        for item, result in done:
            first = first or result
            for total, part in zip(totals, result.parts if isinstance(result, Several) else [result]):
                total.add(item, part)
        parts = first.parts if isinstance(first, Several) else [first]
        results = [total.result(part.sae) for total, part in zip(totals, parts)]
        return results[0] if len(results) == 1 else Several(results)


class Totals:
    """Sums over texts (flat memory): tokens, errors, losses weighted by positions, and a heap of the best
    contexts of the feature followed."""

    def __init__(self, options: FeaturesOptions):
        self.options = options
        self.n = self.tokens = self.measured = self.predicted = self.active = 0
        self.left_out: dict[str, int] = {}
        self.sums: dict[str, float] = dict.fromkeys(("mse", "cosine", "l0", "clean", "spliced", "with_error", "zero",
                                                     "kl", "kl_with_error", "activation"), 0.0)
        self.explained: list[float] = []
        self.cosines = 0
        self.losses = False
        self.max_activation = 0.0
        self.top = TopContexts(options.contexts)

    def add(self, item: Text, result: TextFeatures) -> None:
        self.n += 1
        self.tokens += len(result.ids)
        measured = result.measured
        self.measured += len(measured)
        for why in result.left_out.values():
            self.left_out[why] = self.left_out.get(why, 0) + 1
        self.sums["mse"] += sum(result.mse[p] for p in measured)
        self.sums["l0"] += sum(result.l0[p] for p in measured)
        cosines = [result.cosine[p] for p in measured if result.cosine[p] is not None]
        self.sums["cosine"] += sum(cosines)
        self.cosines += len(cosines)
        if result.explained_text is not None:
            self.explained.append(result.explained_text)
        losses = result.losses
        if losses is not None and losses.count:
            self.losses = True
            for name in ("clean", "spliced", "with_error", "zero"):
                self.sums[name] += getattr(losses, name) * losses.count
            self.predicted += losses.count
            self.sums["kl"] += losses.kl * losses.count
            self.sums["kl_with_error"] += losses.kl_with_error * losses.count
        if result.activations is not None:
            self.add_contexts(item, result, measured)

    def add_contexts(self, item: Text, result: TextFeatures, measured: list[int]) -> None:
        acts = result.activations
        self.sums["activation"] += sum(acts[p] for p in measured)
        self.active += sum(1 for p in measured if acts[p] > 0)
        self.max_activation = max([self.max_activation, *(acts[p] for p in measured)])
        for p in sorted(measured, key=lambda p: -acts[p])[:self.options.contexts]:
            self.top.add(acts[p], item.number, p, result.tokens)

    def result(self, sae: dict) -> CorpusFeatures:
        tokens = max(self.measured, 1)
        losses = None
        if self.losses:
            mean = {name: self.sums[name] / self.predicted for name in ("clean", "spliced", "with_error", "zero",
                                                                         "kl", "kl_with_error")}
            losses = Losses(mean["clean"], mean["spliced"], mean["with_error"], mean["zero"], mean["kl"],
                            mean["kl_with_error"], self.predicted)
        contexts = self.top.best()
        return CorpusFeatures(sae, self.tokens, self.sums["mse"] / tokens,
                              sum(self.explained) / len(self.explained) if self.explained else None,
                              self.sums["cosine"] / self.cosines if self.cosines else None, self.sums["l0"] / tokens,
                              losses, self.options.feature, self.active, self.max_activation,
                              self.sums["activation"] / tokens, contexts, dict(self.left_out),
                              self.options.every_token, self.measured)
