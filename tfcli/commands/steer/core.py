"""`tfcli steer`: steering vectors. `fit` finds, for each chosen block, a direction in the residual stream that
separates the positive texts of contrast pairs from their negatives; `steering_hooks` (tfcli/analysis/vectors.py)
adds vectors to the blocks' outputs while the model runs.

The representation of a text at block L is its last token's `blocks.{L}.resid_post` (the block's output, before
any final norm; a decoder reads each text as `generate` reads a prompt). With P the positives' and N the negatives'
representations, pair by pair (float64 throughout):

- `pca-diff` (repeng 0.4 `read_representations(method="pca_diff")`): the first principal component of the
  differences P - N, centred as scikit-learn's PCA centres them (their mean subtracted), a unit vector;
- `pca-center` (repeng's `pca_center`): the first principal component of every representation less its pair's
  mean (P - (P + N) / 2 and N - (P + N) / 2), centred likewise, a unit vector;
- `mean-diff` (steering-vectors 0.12's `mean_aggregator`, contrastive activation addition): mean(P - N), not
  normalised.

A principal component's sign is chosen as repeng chooses it: flipped when more pairs have the positive projecting
below its negative than above (scikit-learn's own sign first, which makes the largest |entry| positive, stands on a
tie). mean-diff keeps its sign: the mean gap along it is |mean(P - N)| >= 0.

How well a direction v separates the pairs, per block: `separation`, the share of pairs whose positive projects
above its negative (P.v > N.v), and `gap`, the mean projection gap mean((P - N).v) / |v| in units of the standard
deviation of the projections of all 2n representations (n - 1); and `resid_norm`, the median norm of those
representations, against which a strength (times |v|) is small or large.

Shapes: n pairs, d the model width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.dataset import Line, LineSpec
from tfcli.analysis.indices import parse_indices
from tfcli.analysis.inputs import check_length, model_input, padded
from tfcli.analysis.names import block_site
from tfcli.analysis.vectors import check_model, steering_hooks
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.inputs import GenerationPrompt
    from tfcli.analysis.metric import Token
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

METHODS = ("pca-diff", "pca-center", "mean-diff")
BATCH_SIZE = 32  # texts per forward pass (repeng's default max_batch_size)
LEAST_PAIRS = 2
PAIR_LINE = LineSpec(("positive", "negative"), ())


@dataclass
class Pair:
    """One contrast pair, read: its line (a dataset's) and each text's ids as the model reads them."""

    positive: str
    negative: str
    positive_ids: list[int]
    negative_ids: list[int]
    line: int | None = None


@dataclass
class LayerFit:
    """One block's direction (d,) float64 and how well it separates the pairs."""

    layer: int
    direction: Tensor
    separation: float  # share of pairs whose positive projects above its negative
    gap: float  # mean projection gap positive - negative, in standard deviations of all projections
    resid_norm: float  # median norm of the texts' representations: what strength x |direction| compares with


@dataclass
class SteerFit:
    """A fit: the method, the model's type (the GGUF's model_hint) and width, one LayerFit per block."""

    method: str
    model_hint: str
    width: int
    pairs: int
    layers: list[LayerFit] = field(default_factory=list)
    output: str | None = None

    @property
    def directions(self) -> dict[int, Tensor]:
        return {fit.layer: fit.direction for fit in self.layers}


def check_method(method: str) -> str:
    if method not in METHODS:
        raise usage_error(f"--method must be one of {', '.join(METHODS)}, got `{method}`", parameter="method")
    return method


def chosen_layers(config: ModelConfig, spec: str | None) -> list[int]:
    """The blocks `--layers` picks (parse_indices' syntax). Default: every block but block 0, as repeng's
    `read_representations` reads them (range(-1, -n, -1)) and as llama.cpp applies them (never block 0); a model of
    one block: that block."""
    count = config.num_hidden_layers
    layers = parse_indices(spec, count, "layers", noun="blocks")
    if layers is None:
        layers = list(range(1, count)) or [0]
    return layers


def check_pair(config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
    """A pairs-file line checked before any model is built: two different texts, each within the model's
    positions."""
    positive, negative = line.fields["positive"], line.fields["negative"]
    if positive == negative:
        raise usage_error("the positive and negative texts are the same: a pair must differ in the behaviour to steer")
    ids = []
    for text in (positive, negative):
        read = model_input(config, tokenizer.encode([text])[0])
        check_length(config, len(read), "a text has")
        ids.append(read)
    return Pair(positive, negative, ids[0], ids[1], line.number)


def check_pairs(pairs: list[Pair]) -> None:
    if len(pairs) < LEAST_PAIRS:
        raise usage_error(f"{len(pairs)} pair: a direction needs at least {LEAST_PAIRS} pairs (the first principal "
                          "component of one difference is undefined once centred)",
                          "give one {\"positive\": ..., \"negative\": ...} object per line, for many pairs")


def representations(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair], layers: list[int],
                    batch_size: int = BATCH_SIZE,
                    progress: Callable[[int, int], None] | None = None) -> dict[int, Tensor]:
    """{block: (2n, d) float64}: the last token's `blocks.{L}.resid_post` of each text, in the order positive,
    negative, positive, ... (repeng's), read in right-padded batches of `batch_size` texts with only the chosen sites
    kept and no head (no logits: a fifth of SmolLM2's pass)."""
    import torch

    rows = [ids for pair in pairs for ids in (pair.positive_ids, pair.negative_ids)]
    names = [block_site(layer, "resid_post") for layer in layers]
    device = model.device
    kept: dict[int, list[Tensor]] = {layer: [] for layer in layers}
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            ids, mask = padded(rows[start:start + batch_size], tokenizer, device)
            _, cache = model.run_with_cache(ids, names, attention_mask=mask, logits_to_keep=0)
            last = mask.sum(1) - 1
            for layer, name in zip(layers, names):
                kept[layer].append(cache[name][torch.arange(len(ids), device=device), last].double().cpu())
            if progress is not None:
                progress(min(start + batch_size, len(rows)), len(rows))
    return {layer: torch.cat(values) for layer, values in kept.items()}


def first_component(train: Tensor) -> Tensor:
    """The first principal component (d,) of `train` (m, d), centred as scikit-learn's PCA centres, as a unit vector
    with scikit-learn's sign (svd_flip on the components: the largest |entry| positive)."""
    import torch

    centred = train - train.mean(0)
    _, _, vt = torch.linalg.svd(centred, full_matrices=False)
    component = vt[0]
    return component * torch.sign(component[component.abs().argmax()])


def direction(h: Tensor, method: str) -> Tensor:
    """The direction (d,) float64 of representations `h` (2n, d), positive, negative, ... (see the module's
    docstring)."""
    positive, negative = h[0::2], h[1::2]
    if method == "mean-diff":
        return (positive - negative).mean(0)
    if method == "pca-diff":
        train = positive - negative
    elif method == "pca-center":
        center = (positive + negative) / 2
        train = h - center.repeat_interleave(2, dim=0)
    else:
        raise ValueError(f"unknown method {method}")
    vector = first_component(train)
    above, below = separation_counts(h, vector)
    return -vector if below > above else vector


def separation_counts(h: Tensor, vector: Tensor) -> tuple[int, int]:
    """(pairs whose positive projects above its negative, pairs whose positive projects below)."""
    projected = h @ vector
    positive, negative = projected[0::2], projected[1::2]
    return int((positive > negative).sum()), int((positive < negative).sum())


def separation(h: Tensor, vector: Tensor) -> tuple[float, float]:
    """(share of pairs whose positive projects above its negative, mean gap positive - negative in standard
    deviations of all the projections)."""
    projected = h @ vector / vector.norm()
    positive, negative = projected[0::2], projected[1::2]
    share = float((positive > negative).double().mean())
    spread = float(projected.std())
    gap = float((positive - negative).mean())
    return share, gap / spread if spread > 0 else float("nan")


def fit(model: TransformerModel, tokenizer: Tokenizer, pairs: list[Pair], method: str, layers: list[int],
        batch_size: int = BATCH_SIZE, progress: Callable[[int, int], None] | None = None) -> SteerFit:
    """Fit one direction per block of `layers` on the pairs (see the module's docstring)."""
    config = model.config
    check_model(config)
    check_method(method)
    check_pairs(pairs)
    hidden = representations(model, tokenizer, pairs, layers, batch_size, progress)
    result = SteerFit(method, config.model_type, config.hidden_size, len(pairs))
    for layer in layers:
        vector = direction(hidden[layer], method)
        share, gap = separation(hidden[layer], vector)
        norm = float(hidden[layer].norm(dim=1).quantile(0.5))
        result.layers.append(LayerFit(layer, vector, share, gap, norm))
    return result


# ---------------------------------------------------------------- applying


# ---------------------------------------------------------------- steer sweep: what a vector does, strength by strength


@dataclass
class SweepStep:
    """One strength on one prompt: the greedy continuation, the effect and the cost."""

    strength: float
    ids: list[int]  # the new tokens
    text: str  # what they add to the prompt
    effect: float | None  # the target's logit (minus the foil's) at the prompt's last position; None without --target
    kl: float  # mean over the prompt's positions of KL(steered next-token distribution || unsteered), in nats


@dataclass
class Sweep:
    """A vector swept over strengths on one prompt."""

    prompt: str
    ids: list[int]
    vector: str  # the file, as given
    layers: list[int]  # the blocks steered
    normalize: bool
    target: Token | None
    foil: Token | None
    steps: list[SweepStep] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)


def parse_strengths(spec: str) -> list[float]:
    """`-4,-2,0,2,4` -> the strengths, in the order given; a usage error for one that is not a number."""
    strengths = []
    for part in spec.split(","):
        try:
            strengths.append(float(part))
        except ValueError:
            raise usage_error(f"--strengths: `{part.strip()}` is not a number",
                              "give numbers separated by commas, e.g. -4,-2,0,2,4") from None
    if len(set(strengths)) != len(strengths):
        raise usage_error(f"--strengths {spec}: a strength is given twice")
    return strengths


@dataclass(kw_only=True)
class SweepOptions:
    """What `steer sweep` sweeps: a vector (its directions by block, and its file's name as given), the strengths,
    the blocks steered, the logit (difference) whose change is the effect (None: no effect measured), and whether
    each position keeps its norm (--normalize)."""

    vector: dict[int, Tensor]
    name: str
    strengths: list[float]
    layers: list[int]
    target: Token | None = None
    foil: Token | None = None
    normalize: bool = False


def sweep(model: TransformerModel, tokenizer: Tokenizer, prompt: GenerationPrompt,
          options: SweepOptions) -> Sweep:
    """For each strength: the vector times it added to the chosen blocks' outputs (steering_hooks) on a whole pass
    of the prompt (T, V) (the effect at its last position; the cost: KL from the unsteered pass's distributions,
    averaged over its T positions) and on a greedy generation of the new tokens that fit (`prompt.budget`, stopping
    at the end of sequence). Strength 0 is the model unsteered."""
    import torch

    from tfcli.analysis.metric import Metric
    from tfcli.model.decoding import generate

    ids, new_tokens, target, foil = prompt.ids, prompt.budget, options.target, options.foil
    vector, layers, normalize = options.vector, options.layers, options.normalize
    device = model.device
    input_ids = torch.tensor([ids], device=device)
    metric = None if target is None else Metric(target.id, foil and foil.id, len(ids) - 1)
    result = Sweep(prompt.text, ids, options.name, layers, normalize, target, foil, token_texts=tokenizer.texts(ids))
    with torch.no_grad():
        plain = model(input_ids).logits.double().log_softmax(-1)[0]  # (T, V)
        for strength in options.strengths:
            hooks = steering_hooks(model, [vector], [strength], normalize, layers) if strength else None
            logits = model.run_with_hooks(input_ids, hooks) if hooks else model(input_ids).logits
            steered = logits.double().log_softmax(-1)[0]
            kl = float((steered.exp() * (steered - plain)).sum(-1).mean())
            effect = None if metric is None else float(metric(logits)[0])
            sequence = generate(model, input_ids, new_tokens, False, 1.0, None, None, None, True, None, hooks)
            new = sequence[0, len(ids):].tolist()
            ended = [i for i, token in enumerate(new) if token in model.config.eos_token_ids]
            new = new[:ended[0] + 1] if ended else new
            result.steps.append(SweepStep(strength, new, added_text(tokenizer, ids, new), effect, max(kl, 0.0)))
    return result


def added_text(tokenizer: Tokenizer, prompt: list[int], new: list[int]) -> str:
    """What the new tokens add to the prompt's text (decoded together: a SentencePiece word keeps its space)."""
    before, whole = tokenizer.decode(prompt), tokenizer.decode(prompt + new)
    return whole[len(before):] if whole.startswith(before) else tokenizer.decode(new)
