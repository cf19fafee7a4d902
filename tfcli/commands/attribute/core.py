"""`tfcli attribute`: direct logit attribution. Which components write the prediction at one position: the
logit of a target token (or its difference from a foil's) split into the direct contribution of everything that
writes to the residual stream, read through the model's sites.

The definition is TransformerLens's (`ActivationCache.apply_ln_to_stack` with `stack_head_results` /
`decompose_resid`): the final residual stream at the position is the sum of what each component wrote there (the
embeddings, each head's output through its slice of the output projection, each output projection's bias, each
MLP's output); each is centred when the final norm is a LayerNorm, divided by the final norm's scale at that
position (frozen: the real residual's), times the norm's weight (Gemma's 1 + weight), and dotted with
W_U[target] - W_U[foil]. The final norm's bias and the unembedding's bias are components of their own. The
components sum to the model's own logit (difference): every report carries both. The algebra is the analysis
layer's (residual.py beside it, the model's `readout`); this module reads the texts and makes the reports.

Shapes: T tokens, d the model width, H heads, D head size, F MLP width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.analysis.dataset import Dataset, Done, Line, LineSpec, check_one_metric, mean_spread
from tfcli.analysis.inputs import Prompt, check_length, model_input, padded
from tfcli.analysis.metric import Metric, Token, check_head, parse_metric, position_of, token_of
from tfcli.commands.attribute.residual import (BY, Component, before_cap, decompose, direction_at, final_state,
                                               kept_neurons, writer_sites)
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.ablation import Ablation
    from tfcli.analysis.sae import SAE, Fitted
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.model.transformer import Readout
    from tfcli.tokenizer import Encoding, Tokenizer

DEFAULT_TOP = 10
BATCH_SIZE = 16


@dataclass
class Attribution:
    """The attribution of one text."""

    text: str
    ids: list[int]
    tokens: list[str]
    position: int
    target: Token
    foil: Token | None
    logit: float  # the model's own logit (difference) at the position; before a final soft cap, where there is one
    components: list[Component]
    by: str
    layers: int  # the model's
    heads: int
    softcap: float | None = None  # the final logit soft cap the decomposition stops before
    notes: list[str] = field(default_factory=list)
    top: int = DEFAULT_TOP  # components listed: the run's --top (the terminal's and the page's lists)
    read_text: str | None = None  # a truncated text: what the model read of it (None: all of it)
    untruncated_length: int | None = None  # and how many tokens the whole text has
    token_texts: list[str] = field(default_factory=list)  # the text each token stands for (Tokenizer.texts): shown
    ablated: list[str] | None = None  # --ablate: what the model ran without (the components are the ablated model's)
    unablated: float | None = None  # and its value with nothing ablated
    saes: list[dict] = field(default_factory=list)  # --sae: each one's path, site, label and active features here

    @property
    def total(self) -> float:
        """The sum of the components: the model's logit (difference) again, to the float precision."""
        return sum(c.value for c in self.components)


@dataclass(kw_only=True)
class AttributeOptions:
    target: str | None = None  # a token (as it reads: " Mary"), `#ID`, or None: the model's own top prediction
    foil: str | None = None
    position: int | None = None  # None: the last token (a masked-LM encoder: its [MASK], when the text has one)
    by: str = "component"
    layers: list[int] | None = None  # layers broken into heads or neurons; None: every layer
    top: int = DEFAULT_TOP  # rows of the table; with --by neuron, the neurons kept one by one
    ablation: Ablation | None = None  # --ablate: components removed on every pass
    saes: tuple[SAE, ...] = ()  # --sae: what each one's site adds, split into its features (split_by_sae)


def check_model(config: ModelConfig, by: str) -> None:
    """Refuse, before any model is built, a model whose logit the components cannot sum to, naming why."""
    if by not in BY:
        raise usage_error(f"by must be one of {', '.join(BY)}, got `{by}`", parameter="by")
    name = config.name
    check_head(config, ("lm", "mlm"), "attribute splits the logit of a token, which needs an LM head",
               "use a decoder (or a masked-LM encoder) with its head")
    if config.architecture == "encoder-decoder":
        raise usage_error(f"{name} is an encoder-decoder: attribute splits a decoder-only or encoder stack's "
                          "residual stream, not one that cross-attention also writes to",
                          "use a decoder-only model; `tfcli patch` works on encoder-decoders")
    if config.norm_position == "post":
        raise usage_error(f"{name} has post-norm blocks: each block normalises the residual stream, so no component "
                          "adds straight to the final one", "attribute works on pre-norm models (GPT-2, Llama, ...)")
    if config.head == "mlm":
        raise usage_error(f"{name}'s masked-LM head transforms the hidden state (dense, activation, norm) before "
                          "the unembedding: the logit is not linear in the residual stream",
                          "attribute needs a model whose head is a linear unembedding (a decoder's LM head)")
    if config.word_embed_proj_dim:
        raise usage_error(f"{name} projects its hidden state out before the unembedding (word_embed_proj_dim): "
                          "attribute does not fold that projection in", "use a model without it")
    if by != "component" and config.norm_position in ("sandwich", "sublayer_output"):
        raise usage_error(f"{name} normalises each sublayer's output before adding it to the residual stream: "
                          f"per-{by} terms are not additive there, per layer they are",
                          "use --by component (the attention and MLP of each layer)")


def check_options(config: ModelConfig, tokenizer: Tokenizer, options: AttributeOptions) -> tuple[Token | None,
                                                                                                 Token | None]:
    """Everything that can be checked before a model is built: the model (check_model), the options that go
    together, and the target and foil tokens, returned as (target or None for the model's own top prediction,
    foil or None)."""
    check_model(config, options.by)
    if options.layers is not None and options.by == "component":
        raise usage_error("--layers picks the layers broken into heads or neurons: give --by head or --by neuron")
    return parse_metric(config, tokenizer, options.target, options.foil)


def run(model: TransformerModel, tokenizer: Tokenizer, chunks: Iterable[list[Encoding]], options: AttributeOptions,
        batch_size: int = BATCH_SIZE) -> Iterator[Attribution]:
    """Attribute tokenized texts, chunk by chunk (a stream's batches), in padded batches of `batch_size`; yields one
    Attribution per text, in order. A text gives the same numbers alone or in any batch (right padding, causal
    or masked attention)."""
    config = model.config
    target, foil = check_options(config, tokenizer, options)
    for encodings in chunks:
        prompts = []
        for encoding in encodings:
            ids = model_input(config, encoding)
            prompts.append(Prompt(encoding.text, ids, target, foil, position_of(ids, tokenizer, config,
                                                                                options.position), encoding=encoding))
        yield from run_prompts(model, tokenizer, prompts, options, batch_size)


def run_prompts(model: TransformerModel, tokenizer: Tokenizer, prompts: list[Prompt], options: AttributeOptions,
                batch_size: int = BATCH_SIZE, neurons: int | None = None,
                every_feature: bool = False) -> Iterator[Attribution]:
    """Attribute prompts, each with its own target, foil and position, in padded batches of `batch_size`; yields
    one Attribution per prompt, in order. `neurons`: with --by neuron, the neurons kept one by one (default: the
    options' top); `every_feature`: with --sae, every feature a component (split_by_sae)."""
    import torch

    from tfcli.analysis.sae import fit, sae_sites

    config = model.config
    device = model.device
    names = writer_sites(model, options.by)
    names += [site for sae in options.saes for site in sae_sites(sae) if site not in names]
    layers = len(model.output_stack.blocks)
    ablation = options.ablation
    converted: dict = {}  # the float64 weights the decomposition reads, converted once for all the prompts

    def run(ids: Tensor, mask: Tensor, names: list[str], at: Tensor, hooks=None) -> tuple[Tensor, dict[str, Tensor]]:
        """A batch's pass: the head's logits at each prompt's position `at` only, (B, V), and the cache."""
        _, cache = model.run_with_cache(ids, names, attention_mask=mask, hooks=hooks, logits_to_keep=0)
        return model.head_logits(final_state(model, cache)[torch.arange(len(at), device=device), at]), cache

    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        ids, mask = padded([prompt.ids for prompt in batch], tokenizer, device)
        at = torch.tensor([prompt.position for prompt in batch], device=device)
        logits, cache = run(ids, mask, names, at, ablation and ablation.hooks)
        fitted = [fit(sae, cache) for sae in options.saes]
        if ablation is not None:  # the same prompts with nothing removed, for the model's value without
            plain = run(ids, mask, names[-2:] if model.has_final_norm else names[-1:], at)
        for row, prompt in enumerate(batch):
            position, foil = prompt.position, prompt.foil
            target = prompt.target or token_of(tokenizer, int(logits[row].double().argmax()))
            readout = model.readout(target.id, foil and foil.id)
            metric = Metric(target.id, foil and foil.id, position)
            value = value_at(model, logits, cache, readout, metric, row)
            unablated = None if ablation is None else value_at(model, *plain, readout, metric, row)
            encoding = prompt.encoding
            components = decompose(model, cache, (row, position), readout, options.by, options.layers,
                                   options.top if neurons is None else neurons, converted)
            saes = []
            for sae, its in zip(options.saes, fitted):
                components = split_by_sae(sae, its, (row, position), direction_at(readout, cache, row, position),
                                          components, readout, every_feature)
                saes.append({"path": sae.path, "site": sae.site_out or sae.site, "label": sae_label(sae),
                             "active": int(its.features[row, position].count_nonzero())})
            yield Attribution(
                prompt.text, prompt.ids, tokenizer.tokens(prompt.ids), position, target, foil, value, components,
                options.by, layers, config.num_attention_heads, model.final_softcap, top=options.top,
                read_text=encoding.read_part(0) if encoding is not None else None,
                untruncated_length=encoding.untruncated_length if encoding is not None and encoding.truncated
                else None, token_texts=tokenizer.texts(prompt.ids), ablated=ablation and ablation.specs,
                unablated=unablated, saes=saes)


def site_parts(sae: SAE) -> tuple[int | None, str, str]:
    """The layer of the SAE's (output) site, its leaf (mlp.out, resid_post, ...) and the sublayer or stream point it
    stands for (attn, mlp, resid_pre, resid_mid, resid_post, embed)."""
    site = sae.site_out or sae.site
    layer, leaf = (None, site) if site == "embed" else (int(site.split(".")[1]), site.split(".", 2)[2])
    return layer, leaf, leaf.split(".")[0].split("_output_norm")[0]


def sae_label(sae: SAE) -> str:
    """How the SAE's features are named among the components: L5.mlp, L5.attn, L5.resid_post, embed."""
    layer, leaf, sublayer = site_parts(sae)
    return leaf if layer is None else f"L{layer}.{sublayer}"


def split_by_sae(sae: SAE, fitted: Fitted, where: tuple[int, int], direction: Tensor, components: list[Component],
                 readout: Readout, every: bool = False) -> list[Component]:
    """The components with those that the SAE's (output) site holds replaced by its active features' direct effects
    (`{label}#{feature}`), the rest of its reconstruction (`{label}.sae_rest`: b_dec, a skip term) and its error
    (`{label}.sae_error`), which sum to what they replace; `label` the site's (L5.mlp, L5.attn, L5.resid_post).
    A sublayer's features count in its layer; a residual site's, which hold several layers' writes, in none.
    `every`: every feature, the inactive ones' 0 (a dataset's prompts then have the same components)."""
    from tfcli.analysis.sae import direct_effects

    layer, leaf, sublayer = site_parts(sae)

    def held(c: Component) -> bool:
        attention, embedding = c.layer is not None and not c.in_mlp, c.layer is None and c.name not in readout.constants
        if leaf == "embed":
            return c.name == "embed"
        if sublayer in ("attn", "mlp"):
            return c.layer == layer and (c.in_mlp if sublayer == "mlp" else attention)
        earlier = embedding or (c.layer is not None and c.layer < layer)
        return earlier or c.layer == layer and (leaf == "resid_post" or leaf == "resid_mid" and attention)

    replaced = [c for c in components if held(c)]
    label, site = sae_label(sae), sae.site_out or sae.site
    if any("#" in c.name or ".sae_" in c.name for c in replaced):
        raise usage_error(f"--sae {sae.path}: its site {site} holds another --sae's features",
                          "give SAEs whose sites hold different components (a residual site holds every layer's "
                          "writes before it)")
    found = direct_effects(sae, fitted, where, direction.to(fitted.features.device))
    features = fitted.features[where].double()
    own = layer if sublayer in ("attn", "mlp") else None
    added = [Component(f"{label}#{int(i)}", float(found["effects"][i]), layer=own)
             for i in (range(sae.d_sae) if every else features.nonzero().flatten())]
    added += [Component(f"{label}.sae_rest", found["rest"], layer=own),
              Component(f"{label}.sae_error", found["error"], layer=own)]
    at = components.index(replaced[-1]) + 1 if replaced else len(components)
    return [c for c in components[:at] if not held(c)] + added + [c for c in components[at:] if not held(c)]


def value_at(model: TransformerModel, logits: Tensor, cache: dict[str, Tensor], readout: Readout, metric: Metric,
             row: int) -> float:
    """The model's logit (difference) at `metric`'s position of one row of a pass (its logits at each row's position
    (B, V) and the cache of its final state): before the final soft cap, where the model has one, as the components
    sum."""
    if model.final_softcap is not None:
        return before_cap(readout, final_state(model, cache)[row, metric.position])
    return float(metric.of_row(logits[row].double()[None])[0])


# ---------------------------------------------------------------- over a dataset

ATTRIBUTE_LINE = LineSpec(("text",), ("target", "foil", "position"), aliases={"clean": "text"},
                          ignored=("corrupt", "spans"))


def check_prompt(config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Prompt:
    """A dataset line checked as a single run's text and options are (one token each, the position in range),
    before any model is built. A patch dataset's line reads as its clean text."""
    fields = line.fields
    target, foil = parse_metric(config, tokenizer, fields["target"], fields["foil"], prefix="")
    encoding = tokenizer.encode([fields["text"]])[0]
    ids = model_input(config, encoding)
    check_length(config, len(ids))
    return Prompt(fields["text"], ids, target, foil, position_of(ids, tokenizer, config, fields["position"]),
                  line=line.number)


@dataclass
class DatasetAttribution(Attribution):
    """The aggregate over a dataset's prompts (how many, and of what dataset, is the run's Envelope): each
    component's `value` its mean over the prompts (each with its own target and foil), `spread[name]` its (standard
    deviation, 95% bootstrap low, high; None without resamples); `logit` the mean of the model's values, `worst` the
    largest |sum of the components - model's value| of any prompt. `target`/`foil`/`position` are None where the
    lines differ."""

    spread: dict[str, tuple[float, float | None, float | None]] = field(default_factory=dict)
    worst: float = 0.0
    layer_std: tuple[list[float], list[float]] = ([], [])  # each layer's attention and MLP: std over the prompts
    foil_each: bool = False


@dataclass
class AttributeDataset:
    """`attribute --dataset` as the runner runs it (tfcli/runner.py): an item is a line's Prompt, its result the
    prompt's Attribution (with --by neuron, every neuron kept), the aggregate a DatasetAttribution."""

    options: AttributeOptions
    command, unit, line, block, streams = "attribute", "prompts", ATTRIBUTE_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Prompt:
        return check_prompt(config, tokenizer, line)

    def check_items(self, prompts: list[Prompt]) -> None:
        check_one_metric(prompts)

    def results(self, model: TransformerModel, tokenizer: Tokenizer, prompts: list[Prompt],
                progress: Callable[[float], None] | None) -> Iterator[Attribution]:
        every = 10**9 if self.options.by == "neuron" else None
        for done, result in enumerate(run_prompts(model, tokenizer, prompts, self.options, neurons=every,
                                                  every_feature=True), 1):
            yield result
            if progress is not None:
                progress(done)

    def shown(self, result: Attribution) -> Attribution:
        """An item as a single run shows it: its active features only, its neurons kept (--by neuron)."""
        components = [c for c in result.components if "#" not in c.name or c.value != 0.0]  # inactive: exactly 0
        if self.options.by == "neuron":
            components = kept_neurons(components, self.options.top)
        return dataclasses.replace(result, components=components)

    def aggregate(self, done: Done, dataset: Dataset) -> DatasetAttribution:
        results = [result for _, result in done]
        return aggregate(results, self.options, dataset.resamples)


def aggregate(results: list[Attribution], options: AttributeOptions, resamples: int) -> DatasetAttribution:
    """Each component's mean over the prompts' results, with its spread (see DatasetAttribution). With --by neuron
    every neuron is kept per prompt and the `top` largest |mean| are listed."""
    import torch

    every = options.by == "neuron"
    first = results[0]
    if any([c.name for c in result.components] != [c.name for c in first.components] for result in results):
        raise TfcliError("the prompts' components differ: this is a bug in tfcli")
    rows = [[c.value for c in result.components] for result in results]
    logits = [result.logit for result in results]
    unablated = [result.unablated for result in results]
    worst = max(abs(result.total - result.logit) for result in results)
    metrics = {(result.target.id, result.foil and result.foil.id) for result in results}
    positions = {result.position for result in results}
    values = torch.tensor(rows, dtype=torch.float64)  # (N, components)
    names = [c.name for c in first.components]
    components = [dataclasses.replace(c, value=v) for c, v in zip(first.components, values.mean(0).tolist())]
    if every:  # the neurons of the largest |mean|, the rest folded into their layer's rest, per prompt too
        kept = kept_neurons(components, options.top)
        index = {name: i for i, name in enumerate(names)}
        fold = torch.zeros(len(names), len(kept), dtype=torch.float64)
        rest = {c.layer: j for j, c in enumerate(kept) if c.name.endswith(".mlp_rest")}
        for j, c in enumerate(kept):
            fold[index[c.name], j] = 1.0
        kept_names = {c.name for c in kept}
        for c in first.components:
            if c.neuron is not None and c.name not in kept_names:
                fold[index[c.name], rest[c.layer]] = 1.0
        values, components = values @ fold, kept
    layers = first.layers
    per_layer = torch.zeros(len(components), 2 * layers, dtype=torch.float64)  # component -> its layer's side
    for j, c in enumerate(components):
        if c.layer is not None:
            per_layer[j, c.layer + layers * c.in_mlp] = 1.0
    sums = values @ per_layer  # (N, 2 L): each prompt's attention and MLP per layer
    layer_std = sums.std(0) if len(sums) > 1 else torch.zeros(2 * layers, dtype=torch.float64)
    mean, std, low, high = mean_spread(values, resamples)
    components = [dataclasses.replace(c, value=v) for c, v in zip(components, mean.tolist())]
    spread = {c.name: (float(std[j]), None if low is None else float(low[j]), None if high is None else
                       float(high[j])) for j, c in enumerate(components)}
    same = len(metrics) == 1
    return DatasetAttribution(
        "", [], [], first.position if len(positions) == 1 else None, first.target if same else None,
        first.foil if same else None, sum(logits) / len(logits), components, options.by, first.layers, first.heads,
        first.softcap, top=options.top, spread=spread, worst=worst,
        layer_std=(layer_std[:layers].tolist(), layer_std[layers:].tolist()),
        foil_each=first.foil is not None, ablated=first.ablated,
        unablated=None if first.ablated is None else sum(unablated) / len(unablated),
        saes=[dict(sae, active=sum(result.saes[i]["active"] for result in results) / len(results))
              for i, sae in enumerate(first.saes)])
