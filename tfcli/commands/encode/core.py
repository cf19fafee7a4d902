"""`tfcli encode`: one forward pass with capture per batch of texts, and the report of each text: tokens,
every stage's shape and statistics, attention maps of the selected layers and heads, and the logit
lens (top tokens per layer).

`options` checks what can be checked against the config before a model is built; `run` yields plain
report objects (and the --save tensors) batch by batch; nothing here prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.analysis.indices import counted, parse_indices
from tfcli.analysis.names import block_site
from tfcli.errors import TfcliError, check_writable_folder, replace_atomically, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.ablation import Ablation
    from tfcli.analysis.tuned_lens import Lens
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.model.transformer import Stack
    from tfcli.tokenizer import Encoding, Tokenizer

DEFAULT_TOP_K = 3  # logit lens tokens per layer and position
MAX_BATCH = 32  # texts per forward pass, at most


@dataclass(kw_only=True)
class EncodeOptions:
    layers: list[int] | None = None  # blocks to show (attention, lens); None = all
    heads: list[int] | None = None  # heads to show; None = the mean over all heads
    top_k: int = DEFAULT_TOP_K  # 0: no logit lens
    keep_heads: bool = False  # with the mean, also keep each head's map (for --report's head selector)
    sites: list[str] = field(default_factory=list)  # --sites: more sites to keep (names, `*` patterns)
    ablation: "Ablation | None" = None  # --ablate: components removed on the pass
    tuned: "Lens | None" = None  # --lens tuned:DIR: each layer read through its translator first


def check_options(config: "ModelConfig", layers: str | None, heads: str | None, top_k: int,
                  sites: list[str] | None = None) -> EncodeOptions:
    """Options checked against a config, before any model is built. `layers` and `heads` are specs such
    as '0,-1' or 'all'; without `heads`, the report shows the mean over heads. `sites`: --sites patterns, checked
    against the model's sites when the model runs."""
    if top_k < 0:
        raise usage_error(f"top_k must be >= 0, got {top_k}", parameter="top_k")
    if top_k > config.vocab_size:
        raise usage_error(f"top_k {top_k} is larger than the vocabulary ({config.vocab_size})", parameter="top_k")
    head_count = config.num_attention_heads
    selected_heads = None  # None: show the mean over heads
    if heads is not None:
        selected_heads = parse_indices(heads, head_count, "heads") or list(range(head_count))
    return EncodeOptions(layers=parse_indices(layers, config.output_layers, "layers"), heads=selected_heads,
                         top_k=top_k, sites=list(sites or []))


@dataclass
class DecoderInput:
    """What an encoder-decoder's decoder reads: the start token, then the target's tokens."""

    ids: list[int]
    tokens: list[str]
    texts: list[str] = field(default_factory=list)  # the text each token stands for (Tokenizer.texts)


def decoder_input(config: "ModelConfig", tokenizer: "Tokenizer", target: str | None) -> DecoderInput | None:
    """An encoder-decoder's decoder input: its start token, then `target`'s tokens; None for other stacks."""
    if config.architecture != "encoder-decoder":
        if target is not None:
            raise usage_error("target is for encoder-decoder models", f"{config.name} is an {config.architecture}",
                              parameter="target")
        return None
    from tfcli.model.transformer import start_token_id

    ids = [start_token_id(config)]
    if target:
        ids += tokenizer.target_ids(target)
    return DecoderInput(ids, tokenizer.tokens(ids), tokenizer.texts(ids))


@dataclass
class StageRow:
    name: str  # the site whose value the row describes
    shape: list[int]
    dtype: str
    parameters: int
    mean: float
    std: float
    norm: float
    block: int | None = None  # the block a sublayer's row belongs to (None: embeddings, a block output, ...)


@dataclass
class AttentionMap:
    kind: str  # "self" (encoder or decoder-only), "encoder", "decoder" or "cross"
    layer: int
    head: int | str  # a head index, or "mean"
    weights: "Tensor"  # (queries, keys)
    query_tokens: list[str]
    key_tokens: list[str]
    heads: "Tensor | None" = None  # (heads, queries, keys) behind a mean map, when options.keep_heads
    query_texts: list[str] | None = None  # the text each token stands for (Tokenizer.texts); None: the tokens
    key_texts: list[str] | None = None

    def top(self, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """Per query, the k keys it attends to most (most first) and their weights: ([q][k] keys, [q][k] weights).
        The one ranking behind the terminal's "attends most to" and the JSON's max_key."""
        values, keys = self.weights.topk(min(k, self.weights.shape[-1]), dim=-1)
        return keys.tolist(), values.tolist()


@dataclass
class LensRow:
    layer: int  # block index; its output goes through the final norm / head
    top: list[list[tuple[str, int, float]]]  # per position: top-k (token, id, probability)
    texts: list[list[str]] | None = None  # per position: the text each top token stands for; None: the tokens


@dataclass
class TextReport:
    text: str
    tokens: list[str]
    ids: list[int]
    pair: str | None = None  # the second segment (--pair), when given
    target_tokens: list[str] | None = None  # encoder-decoder: the decoder's input
    target_ids: list[int] | None = None
    token_texts: list[str] | None = None  # the text each token stands for (Tokenizer.texts); None: the tokens
    target_token_texts: list[str] | None = None
    stages: list[StageRow] = field(default_factory=list)
    attention: list[AttentionMap] = field(default_factory=list)
    lens: list[LensRow] = field(default_factory=list)
    sites: dict[str, "Tensor"] = field(default_factory=dict)  # --sites: each site's value for this text alone
    # truncated to the model's positions (or --max-length): what the model read of the text (and of the pair), up
    # to its last read token's end, and how many tokens the whole input had; None when all of it was read
    read_text: str | None = None
    read_pair: str | None = None
    untruncated_length: int | None = None
    lens_through: str = ""  # what the lens reads each layer through: "the final norm and the LM head", ...
    lens_predicts: bool = True  # False: through the input token embeddings (no LM head), so not a prediction
    lens_from: str | None = None  # --lens tuned:DIR: the tuned lens's folder (None: the logit lens)
    ablated: list[str] | None = None  # --ablate: what the pass ran without, as given (L23H3, L5.mlp:mean)

    @property
    def shown_text(self) -> str:
        """The text as the model read it: all of it, or the start that truncation kept."""
        return self.text if self.read_text is None else self.read_text

    @property
    def shown_pair(self) -> str | None:
        return self.pair if self.read_pair is None else self.read_pair


def lens_through(model: "TransformerModel") -> tuple[str, bool]:
    """What the logit lens (`TransformerModel.unembed`) reads a hidden state through, as people say it, and whether
    that is a prediction head (False: the input token embeddings of a model without an LM head)."""
    stack = model.output_stack
    parts = ["the final norm"] if stack.final_norm is not None else []
    if stack.project_out is not None:
        parts.append("the output projection")
    head = model.lm_head is not None
    if head:
        parts.append("the MLM head" if model.lm_head.transform else "the LM head")
    else:
        parts.append("the input token embeddings")
    return (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]), head


def stage_row(name: str, tensor: "Tensor", parameters: int, block: int | None = None) -> StageRow:
    import torch

    values = tensor.detach().float()
    var, mean = torch.var_mean(values, correction=0)  # one call: the head's (T, V) logits make this hot
    mean_value, var_value = mean.item(), var.item()
    norm = math.sqrt(values.numel() * (var_value + mean_value * mean_value))
    return StageRow(name, list(tensor.shape), str(tensor.dtype).removeprefix("torch."), parameters,
                    mean_value, math.sqrt(var_value), norm, block)


@dataclass
class StageSite:
    name: str
    parameters: int  # of the module that produced it (a sublayer with its norms, a block, the embeddings)
    block: int | None = None  # a sublayer's block (the table shows sublayers of the blocks in detail only)


def stage_sites(model: "TransformerModel") -> list[StageSite]:
    """The stages table's sites, in forward order: each stack's embeddings output (`blocks.0.resid_pre`), each
    block's sublayers and output (`resid_post`), its final norm; then the head's `logits`."""
    from tfcli.model.sites import hidden_site
    from tfcli.model.transformer import count_parameters

    rows = []
    for prefix, stack in model.stacks():
        rows.append(StageSite(prefix + hidden_site(0),
                              count_parameters(model.token_embedding(stack), stack.embeddings, stack.project_in)))
        for i, block in enumerate(stack.blocks):
            for name, parts in block.sublayers().items():  # the sublayer and the norms that go with it
                rows.append(StageSite(block_site(i, block.output_site(name), prefix), count_parameters(*parts), i))
            rows.append(StageSite(block_site(i, "resid_post", prefix), count_parameters(block)))
        if stack.final_norm is not None:
            rows.append(StageSite(prefix + "final_norm.out", count_parameters(stack.final_norm)))
    if model.head is not None:
        rows.append(StageSite("logits", count_parameters(model.head)))
    return rows


def hidden_names(model: "TransformerModel", prefix: str, stack: "Stack") -> list[str]:
    """`--save`'s hidden.{i} of a stack as sites: its embeddings' output, then each block's output."""
    from tfcli.model.sites import hidden_site

    return [prefix + hidden_site(i) for i in range(len(stack.blocks) + 1)]


def pattern_name(prefix: str, layer: int, cross: bool = False) -> str:
    return block_site(layer, "cross_attn.pattern" if cross else "attn.pattern", prefix)


@dataclass
class Captured:
    """What one encode pass kept of a padded batch: the values of the stages' sites, the hidden states and --sites'
    by site name; the attention patterns of the selected layers (only the selected heads, in their order, with
    --heads); the logits."""

    values: dict[str, "Tensor"]
    patterns: dict[str, "Tensor"]
    logits: "Tensor | None"
    extra: list[str]  # the --sites names, in the order the pass reached them


def encode_batch(model: "TransformerModel", tokenizer: "Tokenizer", encodings: list["Encoding"],
                 target: DecoderInput | None, options: EncodeOptions) -> tuple[Captured, dict[str, "Tensor"]]:
    """One padded forward pass; returns what it kept (see Captured) and its inputs (input_ids, masks)."""
    import torch

    from tfcli.model.sites import Sites, check_names, merged, name_filter

    device = model.device
    ids, mask, type_ids = tokenizer.pad(encodings)
    inputs = {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(mask, device=device)}
    if model.reads_segments:
        inputs["token_type_ids"] = torch.tensor(type_ids, device=device)
    if target is not None:
        inputs["decoder_input_ids"] = torch.tensor([target.ids] * len(encodings), device=device)
    kept = {site.name for site in stage_sites(model)}
    patterns = []
    for prefix, stack in model.stacks():
        kept.update(hidden_names(model, prefix, stack))
        layers = [i for i in (options.layers or range(len(stack.blocks))) if i < len(stack.blocks)]
        patterns += [pattern_name(prefix, i, cross) for i in layers
                     for cross in ((False, True) if prefix == "decoder." else (False,))]
    selected: dict[str, "Tensor"] = {}
    if options.heads is None:
        kept.update(patterns)
        hooks = {}
    else:  # only the selected heads are kept: a hook takes them, and the pass goes on with the whole pattern
        hooks = {name: _keep_heads(selected, name, options.heads) for name in patterns}
    if options.ablation is not None:  # removed first: what is kept and shown is the ablated model's
        hooks = merged(options.ablation.hooks, hooks)
    asked = name_filter(options.sites) if options.sites else (lambda name: False)
    sites = Sites(keep=lambda name: name in kept or asked(name), hooks=hooks)
    with torch.no_grad():
        out = model(**inputs, sites=sites)
    check_names(options.sites, sites.reached)
    if options.heads is None:
        selected = {name: sites.cache[name] for name in patterns if name in sites.cache}
    return Captured(sites.cache, selected, out.logits, [name for name in sites.cache if asked(name)]), inputs


def _keep_heads(selected: dict[str, "Tensor"], name: str, heads: list[int]):
    """A hook that keeps the selected heads of an attention pattern (B, H, T, S) in `selected` and changes nothing."""
    def keep(weights: "Tensor") -> None:
        selected[name] = weights[:, heads].detach()

    return keep


def _maps(kind: str, captured: Captured, names: list[str], row: int, options: EncodeOptions,
          queries: tuple[int, list[str], list[str]], keys: tuple[int, list[str], list[str]]) -> list[AttentionMap]:
    """The attention maps of one text from the batch's patterns (`names`: one per layer of the stack); `queries` and
    `keys` (length, tokens, the text each token stands for) label the maps' rows and columns."""
    (q_len, query_tokens, query_texts), (k_len, key_tokens, key_texts) = queries, keys
    maps = []
    for layer, name in enumerate(names):
        if name not in captured.patterns:
            continue
        weights = captured.patterns[name][row, :, :q_len, :k_len].float()
        if options.heads is None:
            # the capture holds every head for the mean anyway: keeping them costs no extra capture
            every_head = weights.clone() if options.keep_heads else None  # a copy: frees the batch's tensor
            maps.append(AttentionMap(kind, layer, "mean", weights.mean(0), query_tokens, key_tokens, every_head,
                                     query_texts, key_texts))
        else:
            # the capture kept only options.heads, in that order
            maps += [AttentionMap(kind, layer, h, weights[i], query_tokens, key_tokens, None, query_texts, key_texts)
                     for i, h in enumerate(options.heads)]
    return maps


LENS_VALUES = 2**21  # most scores (layers x tokens x vocabulary) one lens product makes: 8 MB in float32


def lens_rows(model: "TransformerModel", hidden_states: list["Tensor"], row: int, length: int,
              layers: list[int] | None, top_k: int, tokenizer: "Tokenizer",
              logits: "Tensor | None" = None) -> list[LensRow]:
    """Logit lens: each selected block's output (hidden_states[i + 1]) through the final norm and head, as
    few products with the unembedding as LENS_VALUES allows (one for a sentence: it streams the weight
    once). `logits`, the model's own (B, T, V) LM logits, stand in for the last block's: they are the same."""
    import torch

    from tfcli.model.linear import kept_plain

    last = len(hidden_states) - 2
    blocks = list(range(last + 1)) if layers is None else layers
    own = logits is not None and model.lm_head is not None
    per_product = max(1, LENS_VALUES // (length * model.config.vocab_size))
    rows = []
    for start in range(0, len(blocks), per_product):
        chunk = blocks[start:start + per_product]
        unembedded = [layer for layer in chunk if not (own and layer == last)]
        with torch.no_grad(), kept_plain(model.lm_head.unembed if model.lm_head is not None else None):
            stacked = torch.stack([hidden_states[layer + 1][row, :length] for layer in unembedded]) if unembedded \
                else None  # (layers, T, hidden)
            computed = iter(model.unembed(stacked) if stacked is not None else ())  # (layers, T, V)
        for layer in chunk:
            scores = logits[row, :length] if own and layer == last else next(computed)
            # a fused kernel: faster on CPU than topk + logsumexp; float32 a layer at a time, not a float copy of the
            # whole product (8 MB of a bfloat16 model's peak)
            probs = scores.softmax(dim=-1, dtype=torch.float32)
            values, ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            # one tolist per layer, not one per position: this runs for every record of a stream
            # a model's vocabulary may be larger than its tokenizer's (padded for speed): such ids show as <id>
            ids_list = ids.tolist()
            rows.append(LensRow(layer, [[(tokenizer.id_to_token(i) or f"<{i}>", i, p) for i, p in zip(pos_ids, pos_vals)]
                                        for pos_ids, pos_vals in zip(ids_list, values.tolist())],
                                [tokenizer.texts(pos_ids) for pos_ids in ids_list]))
    return rows


def text_slice(name: str, value: "Tensor", row: int, length: int, source_length: int) -> "Tensor":
    """Site `name`'s value (a padded batch) for one text: row `row`, its `length` real positions (queries), keys
    of a cross-attention pattern up to the encoder's `source_length`."""
    from tfcli.model.sites import PATTERN_SITES

    value = value[row]
    if name.rsplit(".", 1)[-1] in PATTERN_SITES:  # (H, T, S)
        keys = source_length if ".cross_attn." in name else length
        return value[:, :length, :keys]
    return value[:length]


def text_report(model: "TransformerModel", captured: Captured, row: int, encoding: "Encoding",
                target: DecoderInput | None, options: EncodeOptions, tokenizer: "Tokenizer") -> TextReport:
    """The report of one text (row `row` of a padded batch), sliced to its real tokens."""
    n = len(encoding.ids)
    report = TextReport(encoding.text, encoding.tokens, encoding.ids, encoding.pair,
                        token_texts=tokenizer.texts(encoding.ids),
                        ablated=None if options.ablation is None else options.ablation.specs)
    if encoding.truncated:
        report.read_text, report.read_pair = encoding.read_part(0), encoding.read_part(1)
        report.untruncated_length = encoding.untruncated_length
    t_tokens, t_len = encoding.tokens, n  # the output stack's tokens: the decoder's input in an encoder-decoder
    t_texts = report.token_texts
    if target is not None:
        report.target_tokens, report.target_ids = target.tokens, target.ids
        report.target_token_texts = target.texts or tokenizer.texts(target.ids)
        t_tokens, t_len, t_texts = target.tokens, len(target.ids), report.target_token_texts

    def text_value(name: str) -> "Tensor":
        if name == "logits" and model.config.head == "classifier":  # (B, labels): no positions
            return captured.values[name][row]
        decoder = name.startswith("decoder.") or (name == "logits" and target is not None)
        return text_slice(name, captured.values[name], row, t_len if decoder else n, n)

    report.stages = [stage_row(site.name, text_value(site.name), site.parameters, site.block)
                     for site in stage_sites(model) if site.name in captured.values]
    for prefix, stack in model.stacks():
        kind = {"": "self", "encoder.": "encoder", "decoder.": "decoder"}[prefix]
        tokens, texts, length = (t_tokens, t_texts, t_len) if prefix == "decoder." else \
            (encoding.tokens, report.token_texts, n)
        blocks = range(len(stack.blocks))
        report.attention += _maps(kind, captured, [pattern_name(prefix, i) for i in blocks], row, options,
                                  (length, tokens, texts), (length, tokens, texts))
        if prefix == "decoder.":
            report.attention += _maps("cross", captured, [pattern_name(prefix, i, cross=True) for i in blocks],
                                      row, options, (t_len, t_tokens, t_texts), (n, encoding.tokens,
                                                                                  report.token_texts))
    if options.top_k and model.has_lens:  # no lens for narrower embeddings without an MLM head (ELECTRA, ALBERT)
        prefix, stack = model.stacks()[-1]
        hidden = [captured.values[name] for name in hidden_names(model, prefix, stack)]
        logits, at = captured.logits, row
        if options.tuned is not None:  # the tuned lens: this text's hidden states translated, then the logit lens
            hidden, at, report.lens_from = options.tuned.translated(hidden, row, t_len), 0, options.tuned.folder
            logits = None if logits is None else logits[row:row + 1]
        report.lens = lens_rows(model, hidden, at, t_len, options.layers, options.top_k, tokenizer, logits)
        report.lens_through, report.lens_predicts = lens_through(model)
        if report.lens_from is not None:
            report.lens_through = f"its translator, {report.lens_through}"
    report.sites = {name: text_value(name).clone() for name in captured.extra}
    return report


def saved_tensors(model: "TransformerModel", captured: Captured, inputs: dict[str, "Tensor"]) -> dict[str, "Tensor"]:
    """The --save names (docs/commands.md, "encode"): input_ids, attention_mask, hidden.{i}, attention.{i}, logits;
    encoder-decoders prefix encoder./decoder. and add decoder.cross_attention.{i} and decoder.input_ids; the --sites
    ones under their site names."""
    tensors = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    for prefix, stack in model.stacks():  # the save names take the stack's prefix as the site names do
        tensors |= {f"{prefix}hidden.{i}": captured.values[name]
                    for i, name in enumerate(hidden_names(model, prefix, stack))}
        for cross, label in ((False, "attention"), (True, "cross_attention")):
            tensors |= {f"{prefix}{label}.{i}": captured.patterns[pattern_name(prefix, i, cross)]
                        for i in range(len(stack.blocks)) if pattern_name(prefix, i, cross) in captured.patterns}
    if "decoder_input_ids" in inputs:
        tensors["decoder.input_ids"] = inputs["decoder_input_ids"]
    if captured.logits is not None:
        tensors["logits"] = captured.logits
    tensors |= {name: captured.values[name] for name in captured.extra if name not in tensors}
    return {name: t.detach().contiguous().cpu() for name, t in tensors.items()}


@dataclass
class CaptureCost:
    """What an encode forward pass keeps for ONE text of a given length, in bytes."""

    attention: int  # softmax weights of the selected layers and heads: heads x L^2 x layers
    other: int  # hidden states, sublayer outputs and the head's logits
    heads: int
    maps: str  # the attention maps each head holds, as people read them: "512^2 positions x 12 layers"
    sites: int = 0  # the sites --sites adds

    @property
    def total(self) -> int:
        return self.attention + self.other + self.sites


def capture_cost(model: "TransformerModel", options: EncodeOptions, length: int, target_length: int | None = None) -> CaptureCost:
    """Estimate, before running, what capturing one text of `length` tokens holds (batch of 1): attention
    weights (heads x queries x keys per captured block), plus hidden states, stage outputs and logits, plus the
    sites --sites asks for (their shapes from `model.site_shapes()`). For an encoder-decoder, `target_length` is
    the decoder's input length."""
    c = model.config
    size = model.embed_tokens.weight.element_size()
    heads = len(options.heads) if options.heads is not None else c.num_attention_heads
    passes = []  # per stack: (blocks, query length, self-attention key length, cross-attention key length)
    if model.decoder is None or model.encoder is None:
        passes.append((len(model.output_stack.blocks), length, length, 0))
    else:
        passes.append((len(model.encoder.blocks), length, length, 0))
        passes.append((len(model.decoder.blocks), target_length or 1, target_length or 1, length))
    attention = other = 0
    maps = []
    for blocks, queries, keys, cross_keys in passes:
        kept = blocks if options.layers is None else len([i for i in options.layers if i < blocks])
        attention += kept * heads * queries * (keys + cross_keys) * size
        other += (4 * blocks + 2) * queries * c.hidden_size * size  # hidden states + stage outputs
        positions = f"{queries}^2" if not cross_keys else f"{queries} x ({keys} + {cross_keys})"  # self (+ cross)
        maps.append(f"{positions} positions x {kept} layer{'s' if kept != 1 else ''}")
    if c.head in ("mlm", "lm"):
        other += passes[-1][1] * c.vocab_size * size * 2  # logits, and the lens's softmax of one block
    if len(maps) == 2:
        maps = [f"{maps[0]} in the encoder", f"{maps[1]} in the decoder"]
    sites = 0
    if options.sites:
        from tfcli.model.sites import name_filter

        sizes = {"B": 1, "T": (target_length or 1) if len(passes) == 2 else length, "S": length}
        asked = name_filter(options.sites)
        sites = sum(math.prod(sizes.get(d, d) for d in shape) * size
                    for name, shape in model.site_shapes().items() if asked(name))
    return CaptureCost(attention, other, heads, ", ".join(maps), sites)


def human_size(n: float) -> str:
    """Bytes as people read them: 512 bytes, 1.5 MB."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""  # unreachable


def capture_batch_size(model: "TransformerModel", options: EncodeOptions, encodings: list["Encoding"],
                       decoder_input: DecoderInput | None, limit_mb: float, save: bool) -> tuple[int, str | None]:
    """How many texts one forward pass may capture at once within --max-capture-mb: estimated before
    running, from the longest text. Refuses when one text's attention (and --sites) alone would not fit (or, with
    --save, that of all texts): that is what --layers, --heads and narrower --sites reduce. Hidden states and
    logits (linear in the length) count towards the batch size only. Returns the batch size and, when it had to
    shrink, a note saying why."""
    limit = limit_mb * 2**20
    length = max(len(e.ids) for e in encodings)
    cost = capture_cost(model, options, length, len(decoder_input.ids) if decoder_input else None)
    mb = human_size
    what = f"{mb(cost.attention)} of attention ({counted(cost.heads, 'heads')} x {cost.maps})"
    if cost.sites:
        what += f" and {mb(cost.sites)} of --sites"
    hint = ("capture fewer layers with --layers (e.g. --layers -1) or heads with --heads, "
            "use shorter texts, or raise --max-capture-mb")
    needed = cost.attention + cost.sites
    if needed > limit:
        raise TfcliError(f"one text of {length} tokens would capture {what}: more than --max-capture-mb {limit_mb:g}",
                         hint)
    if save:
        if needed * len(encodings) > limit:
            kind = "attention and --sites" if cost.sites else "attention"
            raise TfcliError(f"--save keeps all {len(encodings)} texts in one batch: "
                             f"{mb(needed * len(encodings))} of {kind} to capture, more than "
                             f"--max-capture-mb {limit_mb:g}", "save fewer texts per run, or " + hint)
        return len(encodings), None
    fits = max(1, min(MAX_BATCH, int(limit // cost.total)))
    note = None
    if fits < min(MAX_BATCH, len(encodings)):
        note = (f"capturing {len(encodings)} texts at once would hold {mb(cost.total * len(encodings))} "
                f"(per text: {what}, {mb(cost.other)} of hidden states and logits); running {fits} at a time "
                f"to stay under --max-capture-mb {limit_mb:g}")
    return fits, note


@dataclass
class SaveTo:
    """Where --save writes, and what its header says besides the texts: tfcli_version, model, weights."""

    path: Path
    overwrite: bool
    metadata: dict[str, str]


def run(model: "TransformerModel", tokenizer: "Tokenizer", chunks: Iterable[list["Encoding"]], options: EncodeOptions,
        target: DecoderInput | None, max_capture_mb: float, save: SaveTo | None = None,
        warn: Callable[[str], None] | None = None) -> Iterator[TextReport]:
    """Encode tokenized texts, chunk by chunk (a stream's batches), each chunk in as many forward passes as
    --max-capture-mb allows (see capture_batch_size; `warn` hears once when a batch had to shrink), yielding each
    text's report in order. With `save` every text must be in one chunk: its tensors are written to save.path."""
    warned = False
    if options.top_k and model.has_lens and warn is not None:
        through, predicts = lens_through(model)
        if not predicts:  # once: what the lens shows is easy to take for a prediction
            warn(f"{model.config.name} has no LM head: the logit lens reads each layer's output through {through}, "
                 "so it mostly shows the input token itself, not a prediction")
    for encodings in chunks:
        batch_size, note = capture_batch_size(model, options, encodings, target, max_capture_mb, save is not None)
        if note and warn is not None and not warned:  # once: every batch of a stream would say the same
            warn(note)
            warned = True
        for start in range(0, len(encodings), batch_size):
            batch = encodings[start:start + batch_size]
            captured, inputs = encode_batch(model, tokenizer, batch, target, options)
            reports = [text_report(model, captured, row, encoding, target, options, tokenizer)
                       for row, encoding in enumerate(batch)]
            if save is not None:
                save_tensors(save.path, saved_tensors(model, captured, inputs), save.overwrite,
                             save.metadata | save_metadata(reports))
            yield from reports


def check_save_path(path: Path, overwrite: bool) -> None:
    """A --save path must end in .safetensors (else a usage error), sit in an existing folder, and replace a
    file only with --force."""
    if path.suffix != ".safetensors":
        raise usage_error(f"--save {path}: the file name must end in .safetensors",
                          f"for example --save {path.with_suffix('.safetensors').name}")
    if path.exists() and not overwrite:
        raise TfcliError(f"{path} already exists", "pass --force to overwrite it, or choose another name")
    if not path.parent.is_dir():
        raise TfcliError(f"--save {path}: the folder {path.parent} does not exist")
    check_writable_folder("--save", path)


def save_metadata(reports: list[TextReport]) -> dict[str, str]:
    """The --save header's entries about the texts (docs/commands.md, "encode"): texts, tokens, pairs, target_tokens.
    safetensors metadata values are strings: lists are JSON."""
    metadata = {"texts": json.dumps([r.text for r in reports], ensure_ascii=False),
                "tokens": json.dumps([r.tokens for r in reports], ensure_ascii=False)}
    if any(r.pair is not None for r in reports):
        metadata["pairs"] = json.dumps([r.pair for r in reports], ensure_ascii=False)
    if reports and reports[0].target_tokens is not None:
        metadata["target_tokens"] = json.dumps(reports[0].target_tokens, ensure_ascii=False)
    return metadata


def save_tensors(path: Path, tensors: dict[str, "Tensor"], overwrite: bool, metadata: dict[str, str] | None = None) -> None:
    """Write --save FILE.safetensors (checked again: the file may have appeared while the model ran): into a temporary
    file beside it, then renamed, so that a full disk or an interrupted run keeps the file there before (and leaves
    no half-written one); a failed write is one line saying what happened (`replace_atomically`)."""
    from safetensors.torch import save_file

    check_save_path(path, overwrite)
    replace_atomically(path, lambda temporary: save_file(tensors, temporary, metadata=metadata))
