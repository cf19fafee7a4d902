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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.attribute import Token, model_input, parse_token, position_of
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.model.transformer import Stack
    from tfcli.tokenizer import Tokenizer

KINDS = ("resid", "attn", "mlp", "heads", "heads-by-position", "q", "k", "v", "pattern")
DEFAULT_SITES = ("resid", "attn", "mlp", "heads")
METHODS = ("activation", "attribution", "both")
SITE = {"resid": "resid_pre", "attn": "attn.out", "mlp": "mlp.out", "heads": "attn.z", "heads-by-position": "attn.z",
        "q": "attn.q", "k": "attn.k", "v": "attn.v", "pattern": "attn.pattern"}
BY_POSITION = ("resid", "attn", "mlp")  # layer x position
BY_HEAD = ("heads", "q", "k", "v", "pattern")  # layer x head, every position
KV_KINDS = ("k", "v")  # per key/value head
BATCH_MB = 256  # the most memory one batch of patched runs may hold (activations, roughly)


@dataclass
class PatchOptions:
    target: str  # a token (" Mary", #ID) or, for a classifier, a label (name or #index)
    foil: str | None = None
    position: int | None = None  # None: the last token (a masked-LM encoder: its [MASK])
    sites: tuple[str, ...] = DEFAULT_SITES
    method: str = "activation"
    fast: bool = True  # False: the naive sweep, one whole forward pass per site (benchmarks and tests)
    batch_mb: float = BATCH_MB


@dataclass(frozen=True)
class Patch:
    """One patched site: a kind at a layer (of a stack: "", "encoder." or "decoder."), at one position and/or head."""

    kind: str
    layer: int
    position: int | None = None  # None: every position
    head: int | None = None  # None: every head
    stack: str = ""

    @property
    def name(self) -> str:
        return f"{self.stack}blocks.{self.layer}.{SITE[self.kind]}"

    @property
    def grid(self) -> str:
        return self.stack + self.kind


@dataclass
class Patching:
    """The result of one clean/corrupt pair. `grids[site]` is a list per layer of the scores per position (resid,
    attn, mlp), per head (heads, q, k, v, pattern) or per head of the scores per position (heads-by-position);
    None where the sweep was interrupted before it."""

    clean: str
    corrupt: str
    tokens_clean: list[str]
    tokens_corrupt: list[str]
    ids_clean: list[int]
    ids_corrupt: list[int]
    position: int | None  # None: a classifier's labels have no position
    target: Token
    foil: Token | None
    clean_value: float
    corrupt_value: float
    method: str
    grids: dict[str, list]
    attribution_grids: dict[str, list] | None = None
    done: int = 0  # sites computed (activation patching)
    total: int = 0
    interrupted: bool = False
    decoder_tokens: list[str] | None = None  # an encoder-decoder's decoder input, where its grids' positions are
    label_metric: bool = False  # the target and foil are a classifier's labels

    @property
    def differing(self) -> list[int]:
        """The positions where the two prompts' tokens differ."""
        return [i for i, (a, b) in enumerate(zip(self.ids_clean, self.ids_corrupt)) if a != b]


class LengthMismatch(TfcliError):
    """The clean and corrupt texts tokenize to different lengths; `rows` align them: (clean index, clean token,
    corrupt index, corrupt token, mark) with None where one side has no token, mark `=`, `≠`, `+` or `-`."""

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
    if config.head == "classifier":
        if options.position is not None:
            raise usage_error("--position is for a token's logit: a classifier's labels are read from the whole text")
        target = parse_label(config, options.target, "--target")
        foil = parse_label(config, options.foil, "--foil") if options.foil is not None else None
    else:
        target = parse_token(tokenizer, options.target, "--target", config.vocab_size)
        foil = parse_token(tokenizer, options.foil, "--foil", config.vocab_size) if options.foil is not None else None
    if foil is not None and foil.id == target.id:
        raise usage_error(f"--target and --foil are the same ({target.token!r}): their difference is always 0")
    return target, foil


def parse_sites(spec: str | None) -> tuple[str, ...]:
    """`resid,attn` -> ("resid", "attn"); None: the default kinds."""
    if spec is None:
        return DEFAULT_SITES
    return tuple(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))


def parse_label(config: ModelConfig, spec: str, option: str) -> Token:
    """A classifier's label: its name or #index."""
    names = config.label_names
    if spec.startswith("#") and spec[1:].isdigit() and int(spec[1:]) < len(names):
        return Token(names[int(spec[1:])], int(spec[1:]))
    if spec in names:
        return Token(spec, names.index(spec))
    raise usage_error(f"{option} {spec!r} is not a label of {config.name}", f"its labels: {', '.join(names)} "
                      f"(or #0 to #{len(names) - 1})")


def pair_inputs(config: ModelConfig, tokenizer: Tokenizer, clean: str, corrupt: str) -> tuple[list[int], list[int]]:
    """The ids the model reads for the two texts (a decoder: as a prompt, without an appended end token); a
    LengthMismatch when their lengths differ, with the two tokenizations aligned."""
    encodings = tokenizer.encode([clean, corrupt])
    ids = [model_input(config, e) for e in encodings]
    limit = config.max_position_embeddings
    for text, row in zip(("clean", "corrupt"), ids):
        if limit and len(row) > limit and config.position == "learned":
            raise usage_error(f"the {text} text has {len(row)} tokens: the model has {limit} positions")
    if len(ids[0]) != len(ids[1]):
        tokens = [tokenizer.tokens(row) for row in ids]
        raise LengthMismatch(
            f"the clean and corrupt texts tokenize to different lengths ({len(ids[0])} and {len(ids[1])} tokens): "
            "patching puts back position for position", "reword one so that both have the same number of tokens "
            "(swap words that are one token each)", align(*tokens))
    return ids[0], ids[1]


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


def stacks(model: TransformerModel) -> list[tuple[str, Stack]]:
    """The stacks whose sites are patched, with their site prefixes."""
    if model.encoder is not None and model.decoder is not None:
        return [("encoder.", model.encoder), ("decoder.", model.decoder)]
    return [("", model.output_stack)]


def patches(model: TransformerModel, kinds: tuple[str, ...], lengths: dict[str, int]) -> list[Patch]:
    """Every site of the sweep, kind by kind, layer by layer; `lengths` by stack prefix."""
    config = model.config
    out: list[Patch] = []
    for prefix, stack in stacks(model):
        layers, length = len(stack.blocks), lengths[prefix]
        for kind in kinds:
            heads = config.kv_heads if kind in KV_KINDS else config.num_attention_heads
            for layer in range(layers):
                if kind in BY_POSITION:
                    out += [Patch(kind, layer, position=p, stack=prefix) for p in range(length)]
                elif kind in BY_HEAD:
                    out += [Patch(kind, layer, head=h, stack=prefix) for h in range(heads)]
                else:
                    out += [Patch(kind, layer, position=p, head=h, stack=prefix)
                            for h in range(heads) for p in range(length)]
    return out


def empty_grid(model: TransformerModel, kind: str, stack: Stack, length: int) -> list:
    config = model.config
    heads = config.kv_heads if kind in KV_KINDS else config.num_attention_heads
    layers = len(stack.blocks)
    if kind in BY_POSITION:
        return [[None] * length for _ in range(layers)]
    if kind in BY_HEAD:
        return [[None] * heads for _ in range(layers)]
    return [[[None] * length for _ in range(heads)] for _ in range(layers)]


def put(grids: dict[str, list], patch: Patch, value: float) -> None:
    row = grids[patch.grid][patch.layer]
    if patch.kind in BY_POSITION:
        row[patch.position] = value
    elif patch.kind in BY_HEAD:
        row[patch.head] = value
    else:
        row[patch.head][patch.position] = value


# ---------------------------------------------------------------- the metric


class Metric:
    """The logit (difference) target - foil, at `position` of a token head's logits or of a classifier's labels."""

    def __init__(self, target: int, foil: int | None, position: int | None):
        self.target, self.foil, self.position = target, foil, position

    def of_row(self, logits: Tensor) -> Tensor:
        """(B, V) or (B, labels) -> (B,) in float64."""
        logits = logits.double()
        value = logits[:, self.target]
        return value - logits[:, self.foil] if self.foil is not None else value

    def __call__(self, logits: Tensor) -> Tensor:
        """A model's logits, (B, T, V) or (B, labels) -> (B,)."""
        return self.of_row(logits[:, self.position] if self.position is not None else logits)


# ---------------------------------------------------------------- the run


def run(model: TransformerModel, tokenizer: Tokenizer, clean: str, corrupt: str, options: PatchOptions,
        progress: Callable[[int, int], None] | None = None) -> Patching:
    """Patch every site of `options.sites` from the clean run into the corrupt one; `progress(done, total)` is
    called as sites finish. Ctrl-C (KeyboardInterrupt) during the sweep returns what is finished
    (`interrupted`, the rest None)."""
    ids_clean, ids_corrupt = pair_inputs(model.config, tokenizer, clean, corrupt)
    return run_ids(model, tokenizer, ids_clean, ids_corrupt, options, progress, clean, corrupt)


def run_ids(model: TransformerModel, tokenizer: Tokenizer, ids_clean: list[int], ids_corrupt: list[int],
            options: PatchOptions, progress: Callable[[int, int], None] | None = None, clean: str = "",
            corrupt: str = "") -> Patching:
    """`run` on token ids of the same length (the texts only for the record)."""
    import torch

    from tfcli.model.transformer import LMHead

    config = model.config
    target, foil = check_options(config, tokenizer, options)
    if len(ids_clean) != len(ids_corrupt):
        raise usage_error(f"the clean and corrupt ids differ in length ({len(ids_clean)} and {len(ids_corrupt)})")
    device = model.embed_tokens.weight.device
    encoder_decoder = model.encoder is not None and model.decoder is not None
    inputs: dict[str, Any] = {}
    decoder_ids: list[int] | None = None
    if encoder_decoder:
        decoder_ids = [model.start_tokens(1, device)[0, 0].item()]
        inputs["decoder_input_ids"] = torch.tensor([decoder_ids], device=device)
    classifier = config.head == "classifier"
    read_ids = decoder_ids if encoder_decoder else ids_clean
    position = None if classifier else position_of(read_ids, tokenizer, config, options.position)
    metric = Metric(target.id, foil and foil.id, position)
    # the two runs compute an LM head's logits from the metric's position on only (what the backward pass of
    # attribution patching goes through too), and read them at their first
    kept, read = {}, metric
    if position is not None and isinstance(model.head, LMHead):
        kept, read = {"logits_to_keep": len(read_ids) - position}, Metric(target.id, foil and foil.id, 0)
    lengths = {"": len(ids_clean), "encoder.": len(ids_clean), "decoder.": len(decoder_ids or [])}
    sweep = patches(model, options.sites, lengths)
    names = sorted({p.name for p in sweep})
    clean_t = torch.tensor([ids_clean], device=device)
    corrupt_t = torch.tensor([ids_corrupt], device=device)
    kv = [f"{prefix}blocks.{i}.attn.{w}" for prefix, stack in stacks(model) for i in range(len(stack.blocks))
          for w in ("k", "v") if stack.causal]
    resid = [f"{prefix}blocks.{i}.resid_pre" for prefix, stack in stacks(model) for i in range(len(stack.blocks))]
    estimate = options.method != "activation"  # the corrupt run keeps its graph, for one backward pass
    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean_t, names, **inputs, **kept)
    corrupt_names = names if options.method == "attribution" else sorted(set(names + kv + resid))
    corrupt_logits, corrupt_cache = model.run_with_cache(corrupt_t, corrupt_names, grad=estimate, **inputs, **kept)
    clean_value, corrupt_value = float(read(clean_logits)[0]), float(read(corrupt_logits.detach())[0])
    if abs(clean_value - corrupt_value) < 1e-6 * max(1.0, abs(clean_value)):
        what = "logit difference" if foil is not None else "logit"
        raise TfcliError(f"nothing to restore: the clean and corrupt texts give the same {what} "
                         f"({clean_value:+.6f} and {corrupt_value:+.6f})",
                         "choose a corrupt text (or a target and foil) on which the model behaves differently")

    def new_grids() -> dict[str, list]:
        return {f"{prefix}{kind}": empty_grid(model, kind, stack, lengths[prefix])
                for prefix, stack in stacks(model) for kind in options.sites}

    result = Patching(clean, corrupt, tokenizer.tokens(ids_clean),
                      tokenizer.tokens(ids_corrupt), ids_clean, ids_corrupt, position,
                      target, foil, clean_value, corrupt_value, options.method, new_grids(), total=len(sweep),
                      label_metric=classifier)
    if decoder_ids is not None:
        result.decoder_tokens = tokenizer.tokens(decoder_ids)
    scale = clean_value - corrupt_value
    if options.method in ("attribution", "both"):
        estimates = attribution(corrupt_logits, corrupt_cache, clean_cache, read, sweep, names)
        corrupt_cache = {name: value.detach() for name, value in corrupt_cache.items()}
        del corrupt_logits
        attributed = new_grids()
        for patch, value in zip(sweep, estimates):
            put(attributed, patch, value / scale)
        if options.method == "attribution":
            result.grids, result.done = attributed, len(sweep)
            return result
        result.attribution_grids = attributed
    sweeper = fast_sweep(model, sweep, clean_cache, corrupt_cache, metric, inputs, position, corrupt_value,
                         options.batch_mb) \
        if options.fast else naive_sweep(model, sweep, clean_cache, corrupt_t, metric, inputs)
    try:
        for done_patches, values in sweeper:
            for patch, value in zip(done_patches, values):
                put(result.grids, patch, (value - corrupt_value) / scale)
            result.done += len(done_patches)
            if progress is not None:
                progress(result.done, result.total)
    except KeyboardInterrupt:
        result.interrupted = True
    return result


def attribution(logits: Tensor, cache: dict[str, Tensor], clean_cache: dict[str, Tensor], metric: Metric,
                sweep: list[Patch], names: list[str]) -> list[float]:
    """(clean - corrupt) . d metric / d site, the gradient on the corrupt run (its `logits` and `cache`, kept with
    their graph), for every patch of the sweep, from one backward pass."""
    import torch

    grads = dict(zip(names, torch.autograd.grad(metric(logits).sum(), [cache[n] for n in names], allow_unused=True)))
    kinds: dict[str, set[str]] = {}
    for patch in sweep:
        kinds.setdefault(patch.name, set()).add(patch.kind)
    sums: dict[tuple[str, str], list] = {}  # (site, kind) -> the products summed per position, head or both
    for name in names:
        grad = grads[name]
        if grad is None:  # the metric does not depend on it (a site after the metric's position)
            grad = torch.zeros_like(cache[name])
        product = ((clean_cache[name].double() - cache[name].detach().double()) * grad.double())[0]
        for kind in kinds[name]:
            if kind in BY_POSITION:  # (T, d)
                sums[name, kind] = product.sum(-1).tolist()
            elif kind == "pattern":  # (H, T, S)
                sums[name, kind] = product.sum((1, 2)).tolist()
            elif kind in BY_HEAD:  # (T, H, D)
                sums[name, kind] = product.sum((0, 2)).tolist()
            else:  # (T, H, D) -> [head][position]
                sums[name, kind] = product.sum(-1).T.tolist()
    out = []
    for patch in sweep:
        summed = sums[patch.name, patch.kind]
        if patch.kind in BY_POSITION:
            out.append(summed[patch.position])
        elif patch.kind in BY_HEAD:
            out.append(summed[patch.head])
        else:
            out.append(summed[patch.head][patch.position])
    return out


def naive_sweep(model: TransformerModel, sweep: list[Patch], clean_cache: dict[str, Tensor], corrupt: Tensor,
                metric: Metric, inputs: dict[str, Any]) -> Iterator[tuple[list[Patch], list[float]]]:
    """One whole forward pass of the corrupt text per site, the clean value put back with a hook (what
    TransformerLens's patching functions do)."""
    import torch

    from tfcli.model import sites

    for patch in sweep:
        positions = None if patch.position is None else [patch.position]
        heads = None if patch.head is None else [patch.head]
        hook = sites.replace(patch.name, clean_cache[patch.name], positions, heads)
        with torch.no_grad():
            logits = model.run_with_hooks(corrupt, {patch.name: hook}, **inputs)
        yield [patch], [float(metric(logits)[0])]


# ---------------------------------------------------------------- the fast sweep


class _PrefixCache:
    """Keys and values of the corrupt run before position `past` for every patched run of a batch: what attention
    reads of the positions a patch cannot change (a causal stack). Quacks like model.attention.KVCache."""

    def __init__(self, cache: dict[str, Tensor], prefix: str, past: int):
        self.cache, self.prefix, self.length = cache, prefix, past
        self.cross: dict[int, tuple[Tensor, Tensor]] = {}

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (B, G, T', D) of the positions past.. -> with the corrupt run's before them."""
        import torch

        if self.length == 0:
            return k, v
        out = []
        for new, which in ((k, "k"), (v, "v")):
            # the site is (1, T, G, D): the keys (values) after any rotation, as the cache holds them
            old = self.cache[f"{self.prefix}blocks.{layer}.attn.{which}"][:, :self.length].transpose(1, 2)
            out.append(torch.cat([old.expand(new.shape[0], -1, -1, -1).to(new.dtype), new], dim=2))
        return out[0], out[1]


@dataclass
class _Context:
    """What every block of a stack reads besides the residual stream, for queries at positions past .. past + T'
    (Stack.forward computes the same for a whole pass)."""

    mask: Any
    window_mask: Any
    rotary: Any
    local_rotary: Any
    relative: Any
    cross_mask: Any


def _context(stack: Stack, past: int, length: int, full: int, dtype, device, memory_length: int | None) -> _Context:
    import torch

    from tfcli.model.transformer import attention_mask_bias

    positions = torch.arange(full, device=device)[None]  # the whole text's, as a full pass computes them
    def turned(rotary):
        if rotary is None:
            return None
        cos, sin = rotary(positions, dtype)
        return cos[:, :, past:past + length], sin[:, :, past:past + length]

    rotary = turned(stack.rotary)
    local = turned(stack.local_rotary) if stack.local_rotary is not None else rotary
    mask = attention_mask_bias(None, length, stack.causal, dtype, device, past)
    window = attention_mask_bias(None, length, stack.causal, dtype, device, past, stack.window) \
        if any(stack.sliding) else None
    if stack.position_bias is not None:
        bias = stack.position_bias(length, past + length, past).to(dtype)
        mask = bias if mask is None else mask + bias
        window = None if window is None else window + bias
    relative = stack.relative_embeddings(length) if stack.relative_embeddings is not None else None
    cross = attention_mask_bias(None, length, False, dtype, device) if memory_length is not None else None
    return _Context(mask, window, rotary, local, relative, cross)


def _hook(placed: list[tuple[int, Patch]], source: Tensor, start: int) -> Callable[[Tensor], Tensor]:
    """A hook on one site for a batch of patched runs: row r of `placed` (row, patch) gets the clean run's value
    (`source`, the site of the whole text, batch 1) where its patch selects; positions counted from `start`."""
    import torch

    kind = placed[0][1].kind
    device = source.device
    rows = torch.tensor([r for r, _ in placed], device=device)
    heads = torch.tensor([p.head if p.head is not None else 0 for _, p in placed], device=device)
    positions = torch.tensor([p.position if p.position is not None else 0 for _, p in placed], device=device)

    def hook(value: Tensor) -> Tensor:
        value = value.clone()
        src = source[0].to(value.dtype)
        if kind in BY_POSITION:  # (B, T', d)
            value[rows, positions - start] = src[positions]
        elif kind == "pattern":  # (B, H, T', S)
            value[rows, heads] = src[heads, start:start + value.shape[2], :value.shape[3]]
        elif kind in BY_HEAD:  # (B, T', H, D)
            value[rows, :, heads] = src[start:start + value.shape[1]][:, heads].transpose(0, 1)
        else:  # one head at one position: (B, T', H, D)
            value[rows, positions - start, heads] = src[positions, heads]
        return value
    return hook


def _run_stack(stack: Stack, prefix: str, batch: list[Patch], first: int, x_of: Callable[[int], Tensor],
               clean_cache: dict[str, Tensor], corrupt_cache: dict[str, Tensor], start: int, stop: int,
               full: int, memory: Tensor | None = None) -> Tensor:
    """The patched runs of `batch` (sorted by layer) through `stack` from block `first`, over positions start ..
    stop - 1: each joins the batch at its layer, entering with the corrupt run's stream there (`x_of(layer)`, (1,
    T', d)). Returns the stack's output (B, T', d) after its final norm (and projection)."""
    import torch

    from tfcli.model import Sites

    entering = x_of(first)
    ctx = _context(stack, start, stop - start, full, entering.dtype, entering.device,
                   memory.shape[1] if memory is not None else None)
    cache = _PrefixCache(corrupt_cache, prefix, start) if stack.causal and start > 0 else None
    x = None if batch else entering  # no patch: the corrupt run itself, from block `first`
    joined = 0
    for layer in range(first, len(stack.blocks)):
        here = [p for p in batch if p.layer == layer]
        if here:
            new = x_of(layer).expand(len(here), -1, -1)
            x = new if x is None else torch.cat([x, new])
        by_site: dict[tuple[str, str], list[tuple[int, Patch]]] = {}  # heads and heads-by-position share attn.z
        for k, patch in enumerate(here):
            by_site.setdefault((patch.name, patch.kind), []).append((joined + k, patch))
        hooks: dict[str, Callable[[Tensor], Tensor]] = {}
        for (name, _), placed in by_site.items():
            hook = _hook(placed, clean_cache[name], start)
            earlier = hooks.get(name)
            hooks[name] = hook if earlier is None else (lambda value, a=earlier, b=hook: b(a(value)))
        joined += len(here)
        sites = Sites(hooks=hooks).scope(f"{prefix}blocks.{layer}") if hooks else None
        sliding = stack.sliding[layer]
        extra = {"sites": sites} if sites is not None else {}
        x = stack.blocks[layer](
            x, ctx.window_mask if sliding else ctx.mask, rotary=ctx.local_rotary if sliding else ctx.rotary,
            memory=None if memory is None else memory.expand(x.shape[0], -1, -1) if memory.shape[0] == 1 else memory,
            memory_mask=ctx.cross_mask, cache=cache, layer=layer, relative=ctx.relative, **extra)
    if stack.final_norm is not None:
        x = stack.final_norm(x)
    if stack.project_out is not None:
        x = stack.project_out(x)
    return x


def _head(model: TransformerModel, hidden: Tensor, metric: Metric, local: int | None) -> Tensor:
    """The metric of each row of a stack's output (B, T', d); `local`: the metric's position in it."""
    from tfcli.model.transformer import ClassificationHead

    if isinstance(model.head, ClassificationHead):
        return metric.of_row(model.head(hidden, None))
    return metric.of_row(model.head(hidden[:, local]))


def _chunks(batch: list[Patch], rows: int) -> Iterator[list[Patch]]:
    for k in range(0, len(batch), rows):
        yield batch[k:k + rows]


def fast_sweep(model: TransformerModel, sweep: list[Patch], clean_cache: dict[str, Tensor],
               corrupt_cache: dict[str, Tensor], metric: Metric, inputs: dict[str, Any], position: int | None,
               corrupt_value: float, batch_mb: float = BATCH_MB) -> Iterator[tuple[list[Patch], list[float]]]:
    """The same scores as naive_sweep, batch by batch (see the module docstring): yields (patches, metric values)."""
    import torch

    config = model.config
    encoder_decoder = model.encoder is not None and model.decoder is not None
    by_prefix = dict(stacks(model))
    groups: dict[tuple[str, int], list[Patch]] = {}
    skipped: list[Patch] = []
    for patch in sweep:
        stack = by_prefix[patch.stack]
        if stack.causal and patch.position is not None and position is not None:
            if patch.position > position:  # a causal stack: a patch after the metric's position changes nothing
                skipped.append(patch)
                continue
            start = patch.position
        else:
            start = 0
        groups.setdefault((patch.stack, start), []).append(patch)
    longest = max(t.shape[1] for t in corrupt_cache.values() if t.dim() >= 2)
    width = max(config.hidden_size, config.intermediate_size, config.num_attention_heads * longest)
    element = torch.finfo(model.embed_tokens.weight.dtype).bits // 8
    full = {prefix: (corrupt_cache[f"{prefix}blocks.0.resid_pre"].shape[1]) for prefix, _ in stacks(model)}
    corrupt_memory = None
    if encoder_decoder:
        with torch.no_grad():
            corrupt_memory = _encoder_output(model, corrupt_cache)
    for (prefix, start), group in groups.items():
        stack = by_prefix[prefix]
        stop = position + 1 if stack.causal and position is not None else full[prefix]
        length = stop - start
        rows = max(1, int(batch_mb * 2**20 // (length * width * element * 8)))
        group.sort(key=lambda p: p.layer)
        for chunk in _chunks(group, rows):
            first = chunk[0].layer

            def x_of(layer: int, prefix=prefix, start=start, stop=stop) -> Tensor:
                return corrupt_cache[f"{prefix}blocks.{layer}.resid_pre"][:, start:stop]

            with torch.no_grad():
                if prefix == "encoder.":  # the patched memory, then the whole decoder
                    memory = _run_stack(stack, prefix, chunk, first, x_of, clean_cache, corrupt_cache, 0,
                                        full[prefix], full[prefix])
                    decoder_ids = inputs["decoder_input_ids"]
                    hidden = model.decoder(model.embed(decoder_ids, model.decoder).expand(len(chunk), -1, -1),
                                           None, memory=memory)
                    values = _head(model, hidden, metric, position)
                else:
                    hidden = _run_stack(stack, prefix, chunk, first, x_of, clean_cache, corrupt_cache, start, stop,
                                        full[prefix], corrupt_memory)
                    local = None if position is None else position - start
                    values = _head(model, hidden, metric, local)
            yield chunk, [float(v) for v in values]
    if skipped:  # the metric is read before them: the corrupt run's value, unchanged
        yield skipped, [corrupt_value] * len(skipped)


def _encoder_output(model: TransformerModel, corrupt_cache: dict[str, Tensor]) -> Tensor:
    """The corrupt run's encoder output (the decoder's memory), from the stream entering its last block."""
    stack = model.encoder
    last = len(stack.blocks) - 1
    return _run_stack(stack, "encoder.", [], last, lambda layer: corrupt_cache[f"encoder.blocks.{layer}.resid_pre"],
                      {}, corrupt_cache, 0, corrupt_cache["encoder.blocks.0.resid_pre"].shape[1],
                      corrupt_cache["encoder.blocks.0.resid_pre"].shape[1])
