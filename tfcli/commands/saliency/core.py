"""`tfcli saliency`: which input tokens a prediction rests on, and whether that answer is faithful.

Each method gives every token of a text one number, its attribution to a metric of the model's output: a token's
logit (or log-probability) at the position read (default: the model's top prediction), a target - foil difference,
a classifier's label or, for an encoder without a head, the norm of its mean-pooled output. The gradient methods
differentiate at a site (`embed`, the token embeddings, by default; `blocks.L.resid_pre` and the like), through
`run_with_cache` with a hook that puts the rows of the pass in the site's place: `gradient` (the L2 norm of d metric /
d site, Simonyan et al.), `input-x-gradient` (Captum's InputXGradient, LayerGradientXActivation at a site),
`integrated-gradients` ((x - x') x the integral of the gradient from the baseline x' to x, Captum's
LayerIntegratedGradients with its `n_steps` and `method`, with the completeness delta sum(attributions) - (f(x) -
f(x'))); `occlusion` (f(x) - f(x with a token's site value the baseline's), Captum's FeatureAblation) and
`attention-rollout` (Abnar and Zuidema 2020: per layer the heads' mean attention plus the identity, rows
renormalised, multiplied over the layers; the row of the position read, or the mean where the head pools).

The baseline x' is the site's value on the baseline text: the tokens that are not special ones replaced by the pad
token (the end-of-text token without one) or the mask token, zero embeddings there, or another text of as many
tokens. `--faithfulness`: the metric as the most attributed tokens are deleted (replaced by the baseline's) or
inserted first, against random orders, with the areas under the curves. A continuation gives a matrix (as Inseq's):
for each of its tokens, the attributions of its logit at the position before it to the tokens before it.
docs/commands.md#saliency says it all at length. A text is read and checked here as a `Prompt` (tfcli/analysis/
inputs.py); the passes over it that the methods run, integrated gradients' quadrature, attention rollout and the
faithfulness curves are in passes.py.

Shapes: N texts, T tokens, d the site's width (its trailing dimensions, flattened), S steps, R rows of a pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tfcli.analysis.dataset import Dataset, Done, Line, LineSpec, check_one_metric, mean_spread
from tfcli.commands.saliency.faithfulness import Curves
from tfcli.analysis.inputs import Prompt, check_length, model_input
from tfcli.analysis.metric import Token, check_head, parse_metric, position_of, token_of
from tfcli.errors import usage_error
from tfcli.commands.saliency.passes import TOKENS_PER_PASS, Passes, faithfulness, first_pass, quadrature, rollout

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

METHODS = ("integrated-gradients", "gradient", "input-x-gradient", "occlusion", "attention-rollout")
GRADIENT_METHODS = METHODS[:3]
INTEGRATIONS = {"gausslegendre": "gausslegendre", "riemann": "riemann_trapezoid"}  # ours -> Captum's `method`
DEFAULT_STEPS = 32
BASELINES = ("pad", "zero", "mask")  # or a text of as many tokens
SITE_LEAVES = ("resid_pre", "resid_mid", "resid_post", "attn.out", "mlp.out")  # --site blocks.L.<leaf>
BATCH_TEXTS = 64  # a dataset's texts are read this many at a time, those of one length and position batched
ROWS_PER_BATCH = 8 * TOKENS_PER_PASS  # the integration points (rows x tokens) a batch of texts holds at most


@dataclass(kw_only=True)
class SaliencyOptions:
    """The run's options: the method and its settings, the metric of texts given as arguments (a dataset's lines
    carry their own), whether to measure faithfulness, and the seed of its random orders."""

    method: str = "integrated-gradients"
    baseline: str | None = None  # pad (else the end-of-text token) | zero | mask | a text of as many tokens; None:
    # a dataset line's own (`baseline`, or a patch line's `corrupt`), else pad
    steps: int = DEFAULT_STEPS
    integration: str = "gausslegendre"
    site: str = "embed"
    target: str | None = None
    foil: str | None = None
    position: int | None = None
    faithfulness: bool = False
    seed: int = 0
    metric: str = "logit"  # logit | logprob (the log-softmax of the head's output)
    continuation: str | None = None  # a text that follows: each of its tokens is a metric (a decoder's)
    generate: int | None = None  # the continuation is the model's own greedy one of this many tokens at most


@dataclass
class Saliency:
    """One text's attributions, one per token, with what they are of: `value` f(x) and `baseline_value` f(x'), the
    metric on the text and on the baseline; `delta` the completeness delta of integrated gradients (None for the
    other methods)."""

    text: str
    ids: list[int]
    tokens: list[str]  # vocabulary entries
    token_texts: list[str]  # what each stands for (' Mary')
    spans: list[list[int] | None]  # (start, end) in the text; None for a special token
    special: list[bool]
    method: str
    options: SaliencyOptions
    target: Token | None
    foil: Token | None
    position: int | None  # None: a classifier's label, or a pooled output
    metric: str  # "logit", "logprob", "label logit", "label logprob", "pooled norm"
    value: float
    baseline_value: float
    attributions: list[float]
    delta: float | None = None
    curves: Curves | None = None
    line: int | None = None
    delta_advice: str | None = None  # when |delta| is large: why, and what converges (delta_advice)

    @property
    def total(self) -> float:
        return math.fsum(self.attributions)

    @property
    def shares(self) -> list[float]:
        """Each attribution over the sum of their absolute values (0 where all are 0)."""
        scale = math.fsum(abs(a) for a in self.attributions)
        return [a / scale if scale else 0.0 for a in self.attributions]


@dataclass
class PositionShare:
    """One aligned position of a dataset's texts: `offset` from the position read (0 is it, -1 the token before),
    the token's text where every text has the same one there (else None), the mean share over the texts with its
    standard deviation and 95% bootstrap interval (None without resamples)."""

    offset: int
    token: str | None
    mean: float
    std: float
    low: float | None
    high: float | None
    tokens: list[tuple[str, int]] = field(default_factory=list)  # the tokens there, each with its texts, most first


TOKEN_KINDS = ("target", "foil", "read", "special", "other")


def token_kinds(result: Saliency) -> list[str]:
    """Each token's kind: `read` (the position read), `special` (one the tokenizer adds), `target` and `foil` (the
    metric's target or foil token, where the metric is a token's: IOI's indirect object and subject), or `other`."""
    tokens = result.metric in ("logit", "logprob")
    target, foil = (t.id if t is not None and tokens else None for t in (result.target, result.foil))
    return ["read" if p == result.position else "special" if special else "target" if i == target else
            "foil" if i == foil else "other" for p, (i, special) in enumerate(zip(result.ids, result.special))]


@dataclass
class KindShare:
    """One kind of token over a dataset's texts: each text's shares of its tokens of that kind summed (0 in a text
    without one), their mean with its standard deviation and 95% bootstrap interval (None without resamples), and
    how many texts have a token of that kind."""

    kind: str
    texts: int
    mean: float
    std: float
    low: float | None
    high: float | None


@dataclass
class DatasetSaliency:
    """The aggregate over a dataset's (or several texts') attributions: the mean share of each aligned position (the
    positions every text has, counted back from the one read), the mean metric, the integrated gradients' mean and
    largest |delta|, and with --faithfulness each area's mean (std, low, high) and how many texts' deletion area is
    below the random one's. How many texts, of what dataset, and whether interrupted: the run's Envelope."""

    options: SaliencyOptions
    metric: str
    target: Token | None  # where every text has the same (else None)
    foil: Token | None
    value: float
    columns: list[PositionShare]
    kinds: list[KindShare] = field(default_factory=list)  # the kinds some text has, in TOKEN_KINDS' order
    delta_mean: float | None = None  # mean |delta|
    delta_worst: float | None = None
    areas: dict[str, tuple[float, float, float | None, float | None]] | None = None
    deletion_beats_random: int | None = None


@dataclass
class ContinuationSaliency:
    """A text and its continuation: a row of attributions (a Saliency) per token of the continuation, of its metric at
    the position before it, over the tokens before it (`ids[:start + k]` for the k-th)."""

    text: str
    continuation: str
    ids: list[int]
    tokens: list[str]
    token_texts: list[str]
    start: int  # the continuation's first position in `ids`
    options: SaliencyOptions
    rows: list[Saliency]
    metric: str


# ---------------------------------------------------------------- checks before the model is built


def check_options(config: ModelConfig, options: SaliencyOptions) -> None:
    """Everything about the options that can be checked before a model is built (each text's checks, its baseline
    among them, follow in check_prompt): the method, the integration and its steps, the site, the model's head."""
    if options.metric not in ("logit", "logprob"):
        raise usage_error(f"--metric must be logit or logprob, got `{options.metric}`")
    if options.method not in METHODS:
        raise usage_error(f"--method must be one of {', '.join(METHODS)}, got `{options.method}`")
    if options.integration not in INTEGRATIONS:
        raise usage_error(f"--integration must be one of {', '.join(INTEGRATIONS)}, got `{options.integration}`")
    least = 2 if options.integration == "riemann" else 1
    if options.steps < least:
        raise usage_error(f"--steps must be at least {least}" + (" with --integration riemann" if least == 2 else "")
                          + f", got {options.steps}")
    check_site(config, options.site)
    if options.method == "attention-rollout" and options.site != "embed":
        raise usage_error("attention rollout reads the attention of every layer: --site is for the gradient methods "
                          "and occlusion")
    if config.architecture == "encoder-decoder":
        raise usage_error(f"{config.name} is an encoder-decoder: saliency attributes to the tokens of one stack",
                          "use a decoder-only model or an encoder")
    check_head(config, ("lm", "mlm", "classifier", "none"), "saliency reads a token's logit, a label's or, without a "
               "head, the pooled output", "use a model with an LM or classifier head, or an encoder without one")
    if options.continuation is not None or options.generate is not None:
        check_continuation(config, options)
    if config.head == "none":
        for name, value in (("target", options.target), ("foil", options.foil), ("position", options.position),
                            ("metric logprob", options.metric == "logprob" or None)):
            if value is not None:
                raise usage_error(f"--{name}: {config.name} has no head, and the metric is the norm of its "
                                  "mean-pooled output", "leave it out, or use a model with a head")


def check_continuation(config: ModelConfig, options: SaliencyOptions) -> None:
    """--continuation or --generate: a decoder with an LM head, each token its own target (no --target, --foil,
    --position); --generate: at least one token, from a baseline that is not a text (its length is not known before
    the model has generated)."""
    given = "--continuation" if options.continuation is not None else "--generate"
    if options.continuation is not None and options.generate is not None:
        raise usage_error("give --continuation or --generate, not both", "--generate N attributes the model's own "
                          "continuation of N tokens; --continuation TEXT the one you give")
    if options.generate is not None and options.generate < 1:
        raise usage_error(f"--generate must be at least 1, got {options.generate}")
    if options.generate is not None and options.baseline not in (None, *BASELINES):
        raise usage_error("--baseline TEXT is not for --generate: the continuation's length is known only once the "
                          "model has generated it", "give --baseline pad, zero or mask")
    if config.architecture != "decoder" or config.head != "lm":
        raise usage_error(f"{given}: {config.name} is not a decoder with an LM head: nothing continues a text",
                          "use a decoder (GPT-2, Llama, ...)")
    for name, value in (("target", options.target), ("foil", options.foil), ("position", options.position),
                        ("faithfulness", options.faithfulness or None)):
        if value is not None:
            raise usage_error(f"--{name} is not for {given}: each token of the continuation is its own target "
                              "at the position before it")


def check_site(config: ModelConfig, site: str) -> None:
    """`embed` or `blocks.L.<leaf>` with L one of the model's layers and a leaf of SITE_LEAVES (whether this kind
    of block has it, resid_mid in a parallel block, is the model's to say when it runs)."""
    if site == "embed":
        return
    parts = site.split(".", 2)
    layers = config.num_hidden_layers
    if len(parts) != 3 or parts[0] != "blocks" or not parts[1].isdigit() or parts[2] not in SITE_LEAVES:
        raise usage_error(f"--site {site}: not a site saliency attributes at",
                          f"give embed or blocks.L.LEAF, LEAF one of {', '.join(SITE_LEAVES)}")
    if int(parts[1]) >= layers:
        raise usage_error(f"--site {site}: the model has no block {parts[1]}: it has {layers} (0 to {layers - 1})")


# a patch dataset's line (`tfcli task`) reads as its clean text, from its corrupt text as the baseline
SALIENCY_LINE = LineSpec(("text",), ("target", "foil", "position", "baseline"),
                         aliases={"clean": "text", "corrupt": "baseline"})


def check_prompt(config: ModelConfig, tokenizer: Tokenizer, line: Line, options: SaliencyOptions) -> Prompt:
    """A text (a dataset's line, or a text of the arguments read as {"text": TEXT} with the options' metric) read as
    the model reads it and checked: its length, its metric, its baseline of as many tokens."""
    fields = line.fields
    target, foil, position = (fields.get(key) if fields.get(key) is not None else getattr(options, key)
                              for key in ("target", "foil", "position"))
    prefix = "" if line.fields.get("target") is not None or line.fields.get("foil") is not None else "--"
    encoding = tokenizer.encode([fields["text"]])[0]
    ids = model_input(config, encoding)
    check_length(config, len(ids))
    special = [sequence is None for sequence in encoding.sequence_ids[:len(ids)]]
    if all(special):
        raise usage_error("the text has no token to attribute to (only special tokens)", "give some text")
    spans = [None if s else list(offset) for s, offset in zip(special, encoding.offsets)]
    start = None if options.continuation is None and options.generate is None else len(ids)
    if options.continuation is not None:  # its tokens read on their own, no special token: ' Paris' has its space
        following = tokenizer.encode([options.continuation], add_special_tokens=False)[0].ids
        if not following:
            raise usage_error("the continuation has no token", "give the text that follows, e.g. \" Paris\"")
        ids, special, spans = ids + following, special + [False] * len(following), spans + [None] * len(following)
    if start is not None:  # and --generate's tokens, generated once the model is built
        check_length(config, len(ids) + (options.generate or 0), "the text and its continuation have")
    if config.head in ("classifier", "none"):
        target, foil = parse_metric(config, tokenizer, target, foil, position, prefix) if config.head != "none" \
            else (None, None)
        at = None
    else:
        target, foil = parse_metric(config, tokenizer, target, foil, prefix=prefix)
        at = position_of(ids, tokenizer, config, position)
    baseline = options.baseline or fields.get("baseline") or "pad"
    return Prompt(fields["text"], ids, target, foil, at, line=line.number, special=special, spans=spans,
                  baseline=baseline_ids(config, tokenizer, baseline, ids, special), continuation=start,
                  baseline_spec=baseline)


def baseline_ids(config: ModelConfig, tokenizer: Tokenizer, baseline: str, ids: list[int],
                 special: list[bool]) -> list[int] | None:
    """The baseline's ids: the special tokens kept, the others the pad or mask token; a text's own ids (as many);
    None for zero embeddings."""
    if baseline == "zero":
        return None
    if baseline in ("pad", "mask"):
        token = tokenizer.mask_token_id if baseline == "mask" else tokenizer.pad_token_id \
            if tokenizer.pad_token_id is not None else tokenizer.eos_token_id  # GPT-2's: its end of text
        if token is None:
            raise usage_error(f"--baseline {baseline}: {tokenizer.name} has no {baseline} token",
                              "use --baseline zero (zero token embeddings) or a text of as many tokens")
        return [i if s else token for i, s in zip(ids, special)]
    other = model_input(config, tokenizer.encode([baseline])[0])
    if len(other) != len(ids):
        raise usage_error(f"the baseline text has {len(other)} tokens and the text {len(ids)}: they must have as "
                          "many", "`tfcli tokenize` shows how each tokenizes")
    return other


# ---------------------------------------------------------------- the attributions of one text


def attribute(passes: Passes, method: str, x: Tensor, baseline: Tensor, options: SaliencyOptions
              ) -> tuple[Tensor, Tensor | None]:
    """(N, T) float64 attributions of `method` from the site's values on the texts `x` and their baselines (N, T,
    ...), and integrated gradients' sums of the gradients' contributions (N,) (for the delta; None for the
    others). Occlusion and rollout take one text."""
    import torch

    n, device = len(x), x.device
    if method in ("gradient", "input-x-gradient"):
        grads = passes.gradients(x, torch.arange(n, device=device)).double()
        return (grads.flatten(2).norm(dim=-1) if method == "gradient" else (x.double() * grads).flatten(2).sum(-1)), \
            None
    if method == "integrated-gradients":
        points, weights = quadrature(options.steps, options.integration)
        shape = (1, -1, *[1] * (x.dim() - 1))  # (1, S, 1, ...): along the steps
        alphas = torch.tensor(points, dtype=torch.float32, device=device).view(shape)
        start, difference = baseline.float()[:, None], (x.float() - baseline.float())[:, None]
        rows = (start + alphas * difference).to(x.dtype).flatten(0, 1)  # (N * S, T, ...), a text's steps together
        grads = passes.gradients(rows, torch.arange(n, device=device).repeat_interleave(len(points)))
        w = torch.tensor(weights, dtype=torch.float64, device=device).view(shape)
        total = (grads.double().view(n, len(points), *x.shape[1:]) * w).sum(1)
        attributions = (difference[:, 0].double() * total).flatten(2).sum(-1)
        return attributions, attributions.sum(-1)
    if method == "occlusion":
        positions = [p for p, s in enumerate(passes.prompt.special) if not s]
        rows = x.repeat(1 + len(positions), *[1] * (x.dim() - 1))  # the text itself first, as FeatureAblation
        for row, p in enumerate(positions, 1):
            rows[row, p] = baseline[0, p]
        values = passes.values(rows)
        out = torch.zeros(1, x.shape[1], dtype=torch.float64, device=device)
        out[0, positions] = values[0] - values[1:]
        return out, None
    return rollout(passes)[None], None


def run_prompt(model: TransformerModel, tokenizer: Tokenizer, prompt: Prompt,
               options: SaliencyOptions) -> Saliency | ContinuationSaliency:
    """One text's attributions (and, with options.faithfulness, its curves); with a continuation, its matrix."""
    if options.generate is not None:
        prompt = generated(model, tokenizer, prompt, options)
        options = replace(options, generate=None, continuation=tokenizer.decode(prompt.ids[prompt.continuation:],
                                                                                skip_special_tokens=False))
    if prompt.continuation is not None:
        return run_continuation(model, tokenizer, prompt, replace(options, baseline=prompt.baseline_spec))
    return run_prompts(model, tokenizer, [prompt], options)[0]


def run_prompts(model: TransformerModel, tokenizer: Tokenizer, prompts: list[Prompt],
                options: SaliencyOptions) -> list[Saliency]:
    """The attributions of texts of one length read at one position (several only for the gradient methods), their
    passes shared: each text's rows are its own, so that each result equals its text's alone."""
    passes = Passes(model, prompts, options.site, options.metric == "logprob")
    x, baseline, values, baseline_values, targets = first_pass(passes, tokenizer)
    attributions, totals = attribute(passes, options.method, x, baseline, options)
    head = model.config.head
    metric = "pooled norm" if head == "none" else ("label " if head == "classifier" else "") + options.metric
    results = []
    for i, prompt in enumerate(prompts):
        value, baseline_value = float(values[i]), float(baseline_values[i])
        delta = None if totals is None else float(totals[i]) - (value - baseline_value)
        results.append(Saliency(
            prompt.text, prompt.ids, tokenizer.tokens(prompt.ids), tokenizer.texts(prompt.ids), prompt.spans,
            prompt.special, options.method, replace(options, baseline=prompt.baseline_spec), targets[i], prompt.foil,
            prompt.position, metric, value, baseline_value, attributions[i].tolist(), delta,
            faithfulness(passes.one(i), x[i], baseline[i], attributions[i], options.seed) if options.faithfulness
            else None,
            prompt.line, delta_advice(delta, value - baseline_value, options)))
    return results


DELTA_LARGE = 0.05  # a completeness delta over this share of |f(text) - f(baseline)| is said to be large


def delta_advice(delta: float | None, gap: float, options: SaliencyOptions) -> str | None:
    """Why a large completeness delta (|delta| over DELTA_LARGE of |f(x) - f(x')|), and what to do; None when it is
    small (or not integrated gradients). From zero embeddings the path cannot converge in a few dozen steps: a model
    that normalises its blocks' inputs (LayerNorm, RMSNorm) is scale invariant away from 0, so its output barely
    moves along the path until the last steps near the baseline, where the whole gradient sits."""
    if delta is None or abs(delta) <= DELTA_LARGE * max(abs(gap), 1e-9):
        return None
    share = f"|delta| is {abs(delta) / max(abs(gap), 1e-9):.0%} of f(text) - f(baseline)"
    if options.baseline == "zero":
        return (f"{share}: from zero embeddings the model, whose norms make it scale invariant away from 0, barely "
                "moves along the path until its last steps near 0, where the gradient sits and few steps fall; a "
                "baseline of tokens converges: --baseline pad (or mask, or a text of as many tokens)")
    return (f"{share}: the gradient changes along the path faster than {options.steps} steps sample it; give more "
            "--steps (Gauss-Legendre's converge fastest), or a baseline nearer the text (a text of as many tokens)")


def generated(model: TransformerModel, tokenizer: Tokenizer, prompt: Prompt, options: SaliencyOptions) -> Prompt:
    """The prompt and the model's greedy continuation (options.generate tokens, or fewer to its end token)."""
    import torch

    ids = model.generate(torch.tensor([prompt.ids], device=model.device), max_new_tokens=options.generate)[0].tolist()
    new = len(ids) - len(prompt.ids)
    special = prompt.special + [False] * new
    return replace(prompt, ids=ids, special=special, spans=prompt.spans + [None] * new,
                   baseline=baseline_ids(model.config, tokenizer, prompt.baseline_spec, ids, special))


def run_continuation(model: TransformerModel, tokenizer: Tokenizer, prompt: Prompt,
                     options: SaliencyOptions) -> ContinuationSaliency:
    """A row of attributions per token of the continuation: its metric at the position before it, over the tokens
    before it (the text's, then the continuation's), each row run as a text of its own."""
    start, ids = prompt.continuation, prompt.ids
    rows = []
    for end in range(start, len(ids)):
        cut = replace(prompt, ids=ids[:end], special=prompt.special[:end], spans=prompt.spans[:end],
                                  baseline=None if prompt.baseline is None else prompt.baseline[:end],
                                  target=token_of(tokenizer, ids[end]), foil=None, position=end - 1,
                                  continuation=None)
        rows.append(run_prompt(model, tokenizer, cut, options))
    return ContinuationSaliency(prompt.text, options.continuation, ids, tokenizer.tokens(ids), tokenizer.texts(ids),
                                start, options, rows, rows[0].metric)


# ---------------------------------------------------------------- the analysis the runner runs


@dataclass
class SaliencyAnalysis:
    """`saliency` as the runner runs it (tfcli/runner.py): an item is a text's Prompt, its result the text's
    Saliency, the aggregate a DatasetSaliency (one text given alone is shown as its result: the command line's)."""

    options: SaliencyOptions
    command, unit, line, block, streams = "saliency", "texts", SALIENCY_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Prompt:
        return check_prompt(config, tokenizer, line, self.options)

    def check_items(self, prompts: list[Prompt]) -> None:
        check_one_metric(prompts)
        if (self.options.continuation is not None or self.options.generate is not None) and len(prompts) > 1:
            raise usage_error(f"--{'continuation' if self.options.generate is None else 'generate'} is for one text: "
                              "its matrix has no mean over several")

    def results(self, model: TransformerModel, tokenizer: Tokenizer, prompts: list[Prompt],
                progress: Callable[[float], None] | None) -> Iterator[Saliency]:
        """The texts' results in order, BATCH_TEXTS texts read at a time; a gradient method's texts of one length
        and position share their passes, at most ROWS_PER_BATCH rows x tokens of integration points a batch."""
        alone = self.options.method not in GRADIENT_METHODS or self.options.continuation is not None or \
            self.options.generate is not None
        rows = self.options.steps if self.options.method == "integrated-gradients" else 1
        done = 0
        for chunk in (prompts[k:k + BATCH_TEXTS] for k in range(0, len(prompts), BATCH_TEXTS)):
            groups: dict[tuple | int, list[int]] = {}
            for i, prompt in enumerate(chunk):
                groups.setdefault(i if alone else (len(prompt.ids), prompt.position), []).append(i)
            found: dict[int, Saliency] = {}
            for members in groups.values():
                most = max(1, ROWS_PER_BATCH // (rows * len(chunk[members[0]].ids)))
                for batch in (members[k:k + most] for k in range(0, len(members), most)):
                    found.update(zip(batch, [run_prompt(model, tokenizer, chunk[batch[0]], self.options)] if alone
                                     else run_prompts(model, tokenizer, [chunk[i] for i in batch], self.options)))
                    done += len(batch)
                    if progress is not None:
                        progress(done)
            yield from (found[i] for i in range(len(chunk)))

    def shown(self, result: Saliency) -> Saliency:
        return result

    def aggregate(self, done: Done, dataset: Dataset) -> DatasetSaliency:
        results = [result for _, result in done]
        return aggregate(results, self.options, dataset.resamples)


class ContinuationAnalysis(SaliencyAnalysis):
    """`saliency --continuation` or `--generate`: one text (check_items refuses more), its result and its aggregate
    the same ContinuationSaliency, the matrix of the continuation's tokens by the tokens read."""

    def aggregate(self, done: Done, dataset: Dataset) -> ContinuationSaliency:
        return next(result for _, result in done)


def spreads(rows: list[list[float]], resamples: int) -> list[tuple[float, float, float | None, float | None]]:
    """Each column's mean over the rows, standard deviation and 95% bootstrap interval (None without resamples)."""
    import torch

    mean, std, low, high = mean_spread(torch.tensor(rows, dtype=torch.float64), resamples)
    return [(float(mean[j]), float(std[j]), None if low is None else float(low[j]),
             None if high is None else float(high[j])) for j in range(len(mean))]


def aggregate(results: list[Saliency], options: SaliencyOptions, resamples: int) -> DatasetSaliency:
    """The texts' shares at the positions every text has, counted back from the position read (the last token
    for a label or a pooled output), with their spread; the same per kind of token (token_kinds), which lines up
    texts of any length; the mean metric, |delta| and faithfulness areas."""
    first = results[0]
    baselines = {r.options.baseline for r in results}
    options = replace(options, baseline=baselines.pop() if len(baselines) == 1 else None)
    read = [r.position if r.position is not None else len(r.ids) - 1 for r in results]
    width = min(read) + 1
    tokens = [Counter(r.token_texts[at - width + 1 + j] for r, at in zip(results, read)) for j in range(width)]
    columns = [PositionShare(j - width + 1, next(iter(texts)) if len(texts) == 1 else None, *spread,
                             tokens=sorted(texts.items(), key=lambda t: (-t[1], t[0])))
               for j, (texts, spread) in enumerate(zip(tokens, spreads([r.shares[at - width + 1:at + 1] for r, at
                                                                         in zip(results, read)], resamples)))]
    kinds = [token_kinds(r) for r in results]
    by_kind = spreads([[math.fsum(share for share, k in zip(r.shares, of) if k == kind) for kind in TOKEN_KINDS]
                       for r, of in zip(results, kinds)], resamples)
    kind_shares = [KindShare(kind, sum(kind in of for of in kinds), *spread)
                   for kind, spread in zip(TOKEN_KINDS, by_kind) if any(kind in of for of in kinds)]
    same = len({(r.target.id if r.target else None, r.foil.id if r.foil else None) for r in results}) == 1
    deltas = [abs(r.delta) for r in results if r.delta is not None]
    areas, beats = None, None
    if options.faithfulness:
        names = ("deletion", "insertion", "random_deletion", "random_insertion")
        table = [[r.curves.areas[name] for name in names] for r in results]
        areas = dict(zip(names, spreads(table, resamples)))
        beats = sum(row[0] < row[2] for row in table)
    return DatasetSaliency(options=options, metric=first.metric, target=first.target if same else None,
                           foil=first.foil if same else None, value=sum(r.value for r in results) / len(results),
                           columns=columns, kinds=kind_shares, delta_mean=sum(deltas) / len(deltas) if deltas else None,
                           delta_worst=max(deltas) if deltas else None, areas=areas, deletion_beats_random=beats)
