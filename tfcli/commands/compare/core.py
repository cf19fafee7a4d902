"""`tfcli compare`: run transformers' own model on the same checkpoint and input, and measure, tensor
by tensor, how far tfcli's numbers are from it. `load` builds both models once, in one dtype; `run_all` compares
a stream of tokenized batches text by text (`run`); nothing here prints.

Two correct implementations differ by the rounding of every operation, which grows with the size of the values: a
tensor's scale is its largest absolute value in transformers' result (at least 1). In float32 a tensor matches when
its max abs difference is at most the tolerance (default 1e-4) or, where that is more, FLOAT32_SCALED (1e-5) of its
scale: one float32 step is 6e-8 of a value, and a model whose residual stream reaches 2.7e4 (SmolLM2's first
position) rounds in steps of 2e-3 there, so a correct pass differs by a few of them (1e-5 is about 170 steps). A
real error is far larger: a weight off by 1e-4 of itself moves the outputs it feeds by about that share of their
size. In bfloat16 and float16 (a bfloat16 number near 300 is only known to within 1) the tolerance is relative: a
tensor matches when the difference is at most tolerance x scale (`DEFAULT_TOLERANCE`, by dtype).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.analysis.names import block_site
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.model import TransformerModel
    from tfcli.sources import Source
    from tfcli.tokenizer import Encoding, Tokenizer


DEFAULT_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.01}  # see the module's docstring
FLOAT32_SCALED = 1e-5  # in float32, the share of a tensor's scale allowed where it is more than the tolerance


def default_tolerance(dtype: str | None) -> float:
    return DEFAULT_TOLERANCE.get(dtype or "float32", DEFAULT_TOLERANCE["float32"])


@dataclass
class Difference:
    name: str
    shape: list[int]
    max_abs_diff: float
    scale: float = 1.0  # largest absolute value of transformers' tensor, at least 1: what a relative tolerance scales


@dataclass
class Comparison:
    """tfcli against transformers on one checkpoint and text."""

    source: str  # as the user gave it
    encoding: Encoding
    tolerance: float
    differences: list[Difference]
    dtype: str = "float32"  # both models ran in it; other than float32, the tolerance is relative (`allowed`)

    @property
    def text(self) -> str:
        return self.encoding.text

    @property
    def ids(self) -> list[int]:
        return self.encoding.ids

    @property
    def relative(self) -> bool:
        """Whether the tolerance is relative to each tensor's scale (bfloat16, float16) rather than absolute."""
        return self.dtype != "float32"

    def allowed(self, difference: Difference) -> float:
        """The largest max abs difference that counts as a match for this tensor (see the module's docstring)."""
        if self.relative:
            return self.tolerance * difference.scale
        return max(self.tolerance, FLOAT32_SCALED * difference.scale)

    @property
    def scaled(self) -> list[Difference]:
        """The float32 tensors whose allowed difference is their scale's share, more than the tolerance."""
        return [d for d in self.differences if not self.relative and self.allowed(d) > self.tolerance]

    @property
    def failing(self) -> list[Difference]:
        return [d for d in self.differences if not self.within(d)]

    def within(self, difference: Difference) -> bool:
        return difference.max_abs_diff <= self.allowed(difference)

    @property
    def worst(self) -> float:
        return max(d.max_abs_diff for d in self.differences)

    @property
    def worst_failure(self) -> float:
        """The largest difference among the tensors that do not match, over the tensor's scale where the tolerance
        is relative (bfloat16, float16); 0 when all match."""
        return max((d.max_abs_diff / d.scale if self.relative else d.max_abs_diff for d in self.failing), default=0.0)

    @property
    def matches(self) -> bool:
        return all(self.within(d) for d in self.differences)


@dataclass
class Models:
    """tfcli's model and transformers' own, built once from one checkpoint, and its tokenizer."""

    source: str  # as the user gave it
    resolved: Source
    ours: TransformerModel
    theirs: Any
    tokenizer: Tokenizer
    dtype: str = "float32"


def load(source: str, device: str = "cpu", revision: str | None = None, dtype: str | None = None) -> Models:
    """Build tfcli's model and transformers' from the checkpoint `source` (one with weights; `revision` of a hub
    model), both in `dtype` (default float32)."""
    from tfcli.api import build_model, load_tokenizer_for, resolve_dtype
    from tfcli.sources import resolve_source

    dtype = str(resolve_dtype(dtype)).removeprefix("torch.")  # an unknown name is a usage error, before loading
    resolved = resolve_source(source, revision)
    _require_weights(resolved)
    tokenizer = load_tokenizer_for(resolved)
    model = build_model(resolved, device=device, dtype=dtype)
    return Models(source, resolved, model, transformers_model(resolved, model), tokenizer, dtype)


def run(models: Models, encoding: Encoding, tolerance: float | None = None) -> Comparison:
    """Run both models on one tokenized text and measure, tensor by tensor (tolerance None: the default of the
    models' dtype, `DEFAULT_TOLERANCE`)."""
    import torch

    if tolerance is None:
        tolerance = default_tolerance(models.dtype)
    input_ids = torch.tensor([encoding.ids], device=models.ours.device)
    return Comparison(models.source, encoding, tolerance, compare_with(models.ours, models.theirs, input_ids),
                      models.dtype)


def run_all(models: Models, chunks: Iterable[list[Encoding]], tolerance: float | None = None) -> Iterator[Comparison]:
    """Compare tokenized texts, chunk by chunk (a stream's batches, see `tfcli.texts.tokenized`), yielding each
    text's comparison in order."""
    for encodings in chunks:
        for encoding in encodings:
            yield run(models, encoding, tolerance)


def _require_weights(source: Source) -> None:
    if source.weights is None:
        raise TfcliError(f"compare needs a checkpoint with weights; {source.description} has none",
                         "pass a directory written by save_pretrained (config.json + model.safetensors)")


def transformers_model(source: "Source", like: "TransformerModel"):
    """transformers' class named in config.json `architectures` (eager attention, so it returns weights), on the
    device and in the dtype of tfcli's model `like`."""
    import transformers

    transformers.logging.disable_progress_bar()
    _require_weights(source)
    dtype = like.embed_tokens.weight.dtype
    # read straight into tfcli's dtype (bfloat16 weights are not rounded twice, nor float32 ones held twice)
    options = {"attn_implementation": "eager", "dtype": dtype}
    if source.gguf:  # transformers' own GGUF loading (it needs the gguf package, as tfcli does, and accelerate)
        cls, options["gguf_file"] = transformers.AutoModelForCausalLM, source.weights.name
    else:
        values = json.loads((source.weights.parent / "config.json").read_text(encoding="utf-8"))
        names = values.get("architectures") or ["AutoModel"]
        cls = getattr(transformers, names[0], None)
        if cls is None:
            raise TfcliError(f"transformers has no class `{names[0]}`", "compare supports transformers' own models only")
    reference = cls.from_pretrained(str(source.weights.parent), **options).eval()
    return reference.to(device=like.device, dtype=dtype)


def compare(model: "TransformerModel", source: Source, input_ids: "Tensor") -> list[Difference]:
    """`compare_with` transformers' own model of the checkpoint `source`, built for this one comparison."""
    return compare_with(model, transformers_model(source, model), input_ids)


def compare_with(model: "TransformerModel", reference: Any, input_ids: "Tensor") -> list[Difference]:
    """Max abs difference per tensor: hidden.{i} (the last after any final norm, as transformers
    reports it), attention.{i}, cross_attention.{i} and logits. An encoder-decoder's decoder reads its
    start token followed by the input's own tokens (as many as its positions allow), so that every
    decoder position, causal mask and relative position is compared, not just the first."""
    import torch

    from tfcli.model.sites import Sites, name_filter

    encoder_decoder = model.config.architecture == "encoder-decoder"
    decoder = {}
    if encoder_decoder:
        start = model.start_tokens(input_ids.shape[0], input_ids.device)
        decoder["decoder_input_ids"] = torch.cat([start, input_ids], 1)[:, :model.config.max_position_embeddings]
    sites = Sites(keep=name_filter(["*blocks.0.resid_pre", "*.resid_post", "*attn.pattern"]))
    with torch.no_grad():
        ours = model(input_ids, sites=sites, **decoder)
        theirs = reference(input_ids=input_ids, output_hidden_states=True, output_attentions=True, **decoder)
    pairs: list[tuple[str, Tensor, Tensor]] = []
    if encoder_decoder:
        pairs += _stack_pairs("encoder.", sites.cache, ours.encoder, theirs.encoder_hidden_states,
                              theirs.encoder_attentions)
        pairs += _stack_pairs("decoder.", sites.cache, ours, theirs.decoder_hidden_states, theirs.decoder_attentions)
        pairs += [(f"decoder.cross_attention.{i}", sites.cache[block_site(i, "cross_attn.pattern", "decoder.")], t)
                  for i, t in enumerate(theirs.cross_attentions)]
    else:
        pairs += _stack_pairs("", sites.cache, ours, theirs.hidden_states, theirs.attentions)
    if ours.logits is not None and getattr(theirs, "logits", None) is not None:
        pairs.append(("logits", ours.logits, theirs.logits))
    return [Difference(name, list(a.shape), _diff(name, a, b), max(b.double().abs().max().item(), 1.0))
            for name, a, b in pairs]


def _stack_pairs(prefix: str, cache: dict[str, "Tensor"], ours, hidden_states,
                 attentions) -> list[tuple[str, "Tensor", "Tensor"]]:
    """hidden.{i} and attention.{i} of one stack (`prefix`: of its sites and of the names): the last hidden state is
    the stack's output, as transformers reports it (after any final norm)."""
    from tfcli.model.sites import hidden_site

    last = len(hidden_states) - 1
    pairs = [(f"{prefix}hidden.{i}", ours.last_hidden_state if i == last else cache[prefix + hidden_site(i)], t)
             for i, t in enumerate(hidden_states)]
    return pairs + [(f"{prefix}attention.{i}", cache[block_site(i, "attn.pattern", prefix)], t)
                    for i, t in enumerate(attentions)]


def _diff(name: str, ours: "Tensor", theirs: "Tensor") -> float:
    if ours.shape != theirs.shape:
        raise TfcliError(f"{name}: tfcli's shape {tuple(ours.shape)} differs from transformers' {tuple(theirs.shape)}")
    return (ours.double() - theirs.double()).abs().max().item()
