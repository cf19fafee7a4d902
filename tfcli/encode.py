"""`tfcli encode`: one forward pass with capture per batch of texts, and the report of each text: tokens,
every stage's shape and statistics, attention maps of the selected layers and heads, and the logit
lens (top tokens per layer).

`options` checks what can be checked against the config before a model is built; `run` yields plain
report objects (and the --save tensors) batch by batch; nothing here prints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.model import ModelOutput, TransformerModel
    from tfcli.model.transformer import Stack
    from tfcli.tokenizer import Encoding, Tokenizer

SUBLAYERS = ("attention", "cross_attention", "feed_forward")  # a block's sublayers, in forward order
DEFAULT_TOP_K = 3  # logit lens tokens per layer and position
MAX_BATCH = 32  # texts per forward pass, at most


def parse_indices(spec: str | None, count: int, what: str) -> list[int] | None:
    """A selection of `count` items as people type it -> sorted indices; None or 'all' -> None (all of them).
    Comma-separated parts, each an index or a range of them, negative counting from the end: '0,-1',
    '8-11', '-3-' (the last three), '2-' (from 2 on), '-4--2', 'all'."""
    if spec is None or spec.strip() == "all":
        return None
    hint = f"for example 0,-1 or 8-11 or -3- (the last three) or all; the model has {_counted(count, what)} " \
           f"(0 to {count - 1})"
    indices: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        match = RANGE.fullmatch(part)
        if not match or not any(character.isdigit() for character in part):
            raise usage_error(f"{what}: `{part}` is not an index or a range", hint, parameter=what)
        first, dash, last = match.groups()
        start = _index(first, 0, count, what, hint)
        stop = _index(last, count - 1, count, what, hint) if dash else start
        if stop < start:
            raise usage_error(f"{what}: the range `{part}` is empty ({start} comes after {stop})", hint, parameter=what)
        indices.update(range(start, stop + 1))
    return sorted(indices)


RANGE = re.compile(r"(-?\d+)?(?:(-)(-?\d+)?)?")  # 'a', 'a-', 'a-b', '-b' with negative numbers


def _index(text: str | None, default: int, count: int, what: str, hint: str) -> int:
    """One end of a selection: an index (negative counts from the end) checked against `count`."""
    if text is None:
        return default
    index = int(text)
    if not -count <= index < count:
        raise usage_error(f"{what}: {index} is out of range: the model has {_counted(count, what)}", hint,
                          parameter=what)
    return index % count


def _counted(count: int, what: str) -> str:
    """'12 layers', '1 layer'."""
    return f"{count} {what.removesuffix('s') if count == 1 else what}"


@dataclass
class EncodeOptions:
    layers: list[int] | None = None  # blocks to show (attention, lens); None = all
    heads: list[int] | None = None  # heads to show; None = the mean over all heads
    top_k: int = DEFAULT_TOP_K  # 0: no logit lens
    keep_heads: bool = False  # with the mean, also keep each head's map (for --report's head selector)


def block_count(config: "ModelConfig") -> int:
    """Blocks of the stack the options index (the output stack: the decoder when there is one)."""
    return config.decoder_layers if config.architecture == "encoder-decoder" else config.num_hidden_layers


def check_options(config: "ModelConfig", layers: str | None, heads: str | None, top_k: int) -> EncodeOptions:
    """Options checked against a config, before any model is built. `layers` and `heads` are specs such
    as '0,-1' or 'all'; without `heads`, the report shows the mean over heads."""
    if top_k < 0:
        raise usage_error(f"top_k must be >= 0, got {top_k}", parameter="top_k")
    if top_k > config.vocab_size:
        raise usage_error(f"top_k {top_k} is larger than the vocabulary ({config.vocab_size})", parameter="top_k")
    head_count = config.num_attention_heads
    selected_heads = None  # None: show the mean over heads
    if heads is not None:
        selected_heads = parse_indices(heads, head_count, "heads") or list(range(head_count))
    return EncodeOptions(parse_indices(layers, block_count(config), "layers"), selected_heads, top_k)


@dataclass
class DecoderInput:
    """What an encoder-decoder's decoder reads: the start token, then the target's tokens."""

    ids: list[int]
    tokens: list[str]


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
    return DecoderInput(ids, [tokenizer.id_to_token(i) or f"<{i}>" for i in ids])


@dataclass
class StageRow:
    name: str
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

    def top(self, k: int) -> tuple[list[list[int]], list[list[float]]]:
        """Per query, the k keys it attends to most (most first) and their weights: ([q][k] keys, [q][k] weights).
        The one ranking behind the terminal's "attends most to" and the JSON's max_key."""
        values, keys = self.weights.topk(min(k, self.weights.shape[-1]), dim=-1)
        return keys.tolist(), values.tolist()


@dataclass
class LensRow:
    layer: int  # block index; its output goes through the final norm / head
    top: list[list[tuple[str, int, float]]]  # per position: top-k (token, id, probability)


@dataclass
class TextReport:
    text: str
    tokens: list[str]
    ids: list[int]
    pair: str | None = None  # the second segment (--pair), when given
    target_tokens: list[str] | None = None  # encoder-decoder: the decoder's input
    target_ids: list[int] | None = None
    stages: list[StageRow] = field(default_factory=list)
    attention: list[AttentionMap] = field(default_factory=list)
    lens: list[LensRow] = field(default_factory=list)


def stage_row(name: str, tensor: "Tensor", parameters: int) -> StageRow:
    import torch

    values = tensor.detach().float()
    var, mean = torch.var_mean(values, correction=0)  # one call: the head's (T, V) logits make this hot
    mean_value, var_value = mean.item(), var.item()
    norm = math.sqrt(values.numel() * (var_value + mean_value * mean_value))
    return StageRow(name, list(tensor.shape), str(tensor.dtype).removeprefix("torch."), parameters,
                    mean_value, math.sqrt(var_value), norm)


@dataclass
class CaptureCost:
    """What an encode forward pass keeps for ONE text of a given length, in bytes."""

    attention: int  # softmax weights of the selected layers and heads: heads x L^2 x layers
    other: int  # hidden states, sublayer outputs and the head's logits
    heads: int
    maps: str  # the attention maps each head holds, as people read them: "512^2 positions x 12 layers"

    @property
    def total(self) -> int:
        return self.attention + self.other


def capture_cost(model: "TransformerModel", options: EncodeOptions, length: int, target_length: int | None = None) -> CaptureCost:
    """Estimate, before running, what capturing one text of `length` tokens holds (batch of 1): attention
    weights (heads x queries x keys per captured block), plus hidden states, stage outputs and logits.
    For an encoder-decoder, `target_length` is the decoder's input length."""
    c = model.config
    size = model.embed_tokens.weight.element_size()
    heads = len(options.heads) if options.heads is not None else c.num_attention_heads
    stacks = []  # (blocks, query length, self-attention key length, cross-attention key length)
    if model.decoder is None or model.encoder is None:
        stacks.append((len(model.output_stack.blocks), length, length, 0))
    else:
        stacks.append((len(model.encoder.blocks), length, length, 0))
        stacks.append((len(model.decoder.blocks), target_length or 1, target_length or 1, length))
    attention = other = 0
    maps = []
    for blocks, queries, keys, cross_keys in stacks:
        kept = blocks if options.layers is None else len([i for i in options.layers if i < blocks])
        attention += kept * heads * queries * (keys + cross_keys) * size
        other += (4 * blocks + 2) * queries * c.hidden_size * size  # hidden states + stage outputs
        positions = f"{queries}^2" if not cross_keys else f"{queries} x ({keys} + {cross_keys})"  # self (+ cross)
        maps.append(f"{positions} positions x {kept} layer{'s' if kept != 1 else ''}")
    if c.head in ("mlm", "lm"):
        other += stacks[-1][1] * c.vocab_size * size * 2  # logits, and the lens's softmax of one block
    if len(maps) == 2:
        maps = [f"{maps[0]} in the encoder", f"{maps[1]} in the decoder"]
    return CaptureCost(attention, other, heads, ", ".join(maps))


def capture_for(options: EncodeOptions):
    from tfcli.model import Capture

    # only the selected heads are kept; without --heads the mean needs them all
    return Capture(hidden_states=True, attention=True, layers=options.layers, heads=options.heads, stages=True)


def _maps(kind: str, attentions: dict[int, "Tensor"], row: int, q_len: int, k_len: int, options: EncodeOptions,
          query_tokens: list[str], key_tokens: list[str]) -> list[AttentionMap]:
    maps = []
    for layer, weights in sorted(attentions.items()):
        weights = weights[row, :, :q_len, :k_len].float()
        if options.heads is None:
            # the capture holds every head for the mean anyway: keeping them costs no extra capture
            every_head = weights.clone() if options.keep_heads else None  # a copy: frees the batch's tensor
            maps.append(AttentionMap(kind, layer, "mean", weights.mean(0), query_tokens, key_tokens, every_head))
        else:
            # the capture kept only options.heads, in that order
            maps += [AttentionMap(kind, layer, h, weights[i], query_tokens, key_tokens) for i, h in enumerate(options.heads)]
    return maps


LENS_VALUES = 2**21  # most scores (layers x tokens x vocabulary) one lens product makes: 8 MB in float32


def lens_rows(model: "TransformerModel", hidden_states: list["Tensor"], row: int, length: int,
              layers: list[int] | None, top_k: int, tokenizer: "Tokenizer",
              logits: "Tensor | None" = None) -> list[LensRow]:
    """Logit lens: each selected block's output (hidden_states[i + 1]) through the final norm and head, as
    few products with the unembedding as LENS_VALUES allows (one for a sentence: it streams the weight
    once). `logits`, the model's own (B, T, V) LM logits, stand in for the last block's: they are the same."""
    import torch

    from tfcli.model.transformer import LMHead

    last = len(hidden_states) - 2
    blocks = list(range(last + 1)) if layers is None else layers
    own = logits is not None and isinstance(model.head, LMHead)
    per_product = max(1, LENS_VALUES // (length * model.config.vocab_size))
    rows = []
    for start in range(0, len(blocks), per_product):
        chunk = blocks[start:start + per_product]
        unembedded = [layer for layer in chunk if not (own and layer == last)]
        with torch.no_grad():
            stacked = torch.stack([hidden_states[layer + 1][row, :length] for layer in unembedded]) if unembedded \
                else None  # (layers, T, hidden)
            computed = iter(model.unembed(stacked).float() if stacked is not None else ())  # (layers, T, V)
        for layer in chunk:
            scores = logits[row, :length].float() if own and layer == last else next(computed)
            probs = scores.softmax(dim=-1)  # a fused kernel: faster on CPU than topk + logsumexp
            values, ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            # one tolist per layer, not one per position: this runs for every record of a stream
            # a model's vocabulary may be larger than its tokenizer's (padded for speed): such ids show as <id>
            rows.append(LensRow(layer, [[(tokenizer.id_to_token(i) or f"<{i}>", i, p) for i, p in zip(pos_ids, pos_vals)]
                                        for pos_ids, pos_vals in zip(ids.tolist(), values.tolist())]))
    return rows


def stage_rows(model: "TransformerModel", stack: "Stack", out: "ModelOutput", row: int, length: int,
               prefix: str) -> list[StageRow]:
    """One stack's stages for row `row` of a batch: the embeddings, each block's sublayers and output,
    the final norm. Labels and parameter counts come from the module that produced each tensor."""
    from tfcli.model.transformer import count_parameters

    def stage(label: str, tensor: "Tensor", *modules, block: int | None = None) -> StageRow:
        stage = stage_row(prefix + label, tensor[row, :length], count_parameters(*modules))
        stage.block = block
        return stage

    rows = [stage("embeddings", out.hidden_states[0], model.token_embedding(stack), stack.embeddings, stack.project_in)]
    for i, block in enumerate(stack.blocks):
        for name in SUBLAYERS:
            path = f"blocks.{i}.{name}"
            if path in out.stages:  # the sublayer and the norms that go with it (before, after, or both)
                norms = [getattr(block, f"{name}{suffix}") for suffix in ("_norm", "_output_norm")
                         if hasattr(block, f"{name}{suffix}")]
                rows.append(stage(f"block {i} {name}", out.stages[path], stack.get_submodule(path), *norms,
                                  block=i))
        rows.append(stage(f"block {i} output", out.hidden_states[i + 1], block))
    if "final_norm" in out.stages:
        rows.append(stage("final norm", out.stages["final_norm"], stack.final_norm))
    return rows


def text_report(model: "TransformerModel", out: "ModelOutput", row: int, encoding: "Encoding",
                target: DecoderInput | None, options: EncodeOptions, tokenizer: "Tokenizer") -> TextReport:
    """The report of one text (row `row` of a padded batch), sliced to its real tokens."""
    from tfcli.model.transformer import count_parameters

    n = len(encoding.ids)
    report = TextReport(encoding.text, encoding.tokens, encoding.ids, encoding.pair)
    if out.encoder is None:  # encoder-only or decoder-only: one stack
        kind, prefix = "self", ""
        t_tokens, t_len = encoding.tokens, n
    else:
        kind, prefix = "decoder", "decoder "
        report.target_tokens, report.target_ids = target.tokens, target.ids
        t_tokens, t_len = target.tokens, len(target.ids)
        report.stages = stage_rows(model, model.encoder, out.encoder, row, n, "encoder ")
        report.attention += _maps("encoder", out.encoder.attentions, row, n, n, options, encoding.tokens, encoding.tokens)
    report.stages += stage_rows(model, model.output_stack, out, row, t_len, prefix)
    if out.logits is not None:  # classifier logits are (B, labels); discriminator (B, T); LM logits (B, T, V)
        logits = out.logits[row] if model.config.head == "classifier" else out.logits[row, :t_len]
        report.stages.append(stage_row(prefix + "head", logits, count_parameters(model.head)))
    report.attention += _maps(kind, out.attentions, row, t_len, t_len, options, t_tokens, t_tokens)
    if out.encoder is not None:
        report.attention += _maps("cross", out.cross_attentions, row, t_len, n, options, t_tokens, encoding.tokens)
    if options.top_k and model.has_lens:  # no lens for narrower embeddings without an MLM head (ELECTRA, ALBERT)
        report.lens = lens_rows(model, out.hidden_states, row, t_len, options.layers, options.top_k, tokenizer,
                                out.logits)
    return report


def encode_batch(model: "TransformerModel", tokenizer: "Tokenizer", encodings: list["Encoding"],
                 target: DecoderInput | None, options: EncodeOptions) -> tuple["ModelOutput", dict[str, "Tensor"]]:
    """One padded forward pass with capture; returns the output and its inputs (input_ids, masks)."""
    import torch

    device = model.embed_tokens.weight.device
    ids, mask, type_ids = tokenizer.pad(encodings)
    inputs = {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(mask, device=device)}
    if model.encoder is not None and model.encoder.embeddings.segments is not None:
        inputs["token_type_ids"] = torch.tensor(type_ids, device=device)
    if target is not None:
        inputs["decoder_input_ids"] = torch.tensor([target.ids] * len(encodings), device=device)
    with torch.no_grad():
        out = model(**inputs, capture=capture_for(options))
    return out, inputs


def saved_tensors(out: "ModelOutput", inputs: dict[str, "Tensor"]) -> dict[str, "Tensor"]:
    """The --save names (README, "encode"): input_ids, attention_mask, hidden.{i}, attention.{i}, logits;
    encoder-decoders prefix encoder./decoder. and add decoder.cross_attention.{i} and decoder.input_ids."""
    tensors = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    stacks = [("", out)] if out.encoder is None else [("encoder.", out.encoder), ("decoder.", out)]
    for prefix, stack_out in stacks:
        tensors |= {f"{prefix}hidden.{i}": h for i, h in enumerate(stack_out.hidden_states)}
        tensors |= {f"{prefix}attention.{i}": a for i, a in stack_out.attentions.items()}
        tensors |= {f"{prefix}cross_attention.{i}": a for i, a in stack_out.cross_attentions.items()}
    if "decoder_input_ids" in inputs:
        tensors["decoder.input_ids"] = inputs["decoder_input_ids"]
    if out.logits is not None:
        tensors["logits"] = out.logits
    return {name: t.detach().contiguous().cpu() for name, t in tensors.items()}


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
    running, from the longest text. Refuses when one text's attention alone would not fit (or, with --save,
    that of all texts): that is what --layers and --heads reduce. Hidden states and logits (linear in
    the length) count towards the batch size only. Returns the batch size and, when it had to shrink,
    a note saying why."""
    limit = limit_mb * 2**20
    length = max(len(e.ids) for e in encodings)
    cost = capture_cost(model, options, length, len(decoder_input.ids) if decoder_input else None)
    mb = human_size
    what = f"{mb(cost.attention)} of attention ({_counted(cost.heads, 'heads')} x {cost.maps})"
    hint = ("capture fewer layers with --layers (e.g. --layers -1) or heads with --heads, "
            "use shorter texts, or raise --max-capture-mb")
    if cost.attention > limit:
        raise TfcliError(f"one text of {length} tokens would capture {what}: more than --max-capture-mb {limit_mb:g}",
                         hint)
    if save:
        if cost.attention * len(encodings) > limit:
            raise TfcliError(f"--save keeps all {len(encodings)} texts in one batch: "
                             f"{mb(cost.attention * len(encodings))} of attention to capture, more than "
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
class EncodedBatch:
    """The reports of one batch of texts, and its --save tensors when they were asked for."""

    reports: list[TextReport]
    tensors: dict[str, "Tensor"] | None = None


def run(model: "TransformerModel", tokenizer: "Tokenizer", encodings: list["Encoding"], options: EncodeOptions,
        target: DecoderInput | None, batch_size: int, keep_tensors: bool = False) -> Iterator[EncodedBatch]:
    """Encode texts `batch_size` at a time (see capture_batch_size), yielding each batch's reports in order."""
    if len(encodings) > batch_size:  # a forward pass per batch: the weights are used again
        from tfcli.model.linear import pack_for_repeated_use

        pack_for_repeated_use(model)
    for start in range(0, len(encodings), batch_size):
        batch = encodings[start:start + batch_size]
        out, inputs = encode_batch(model, tokenizer, batch, target, options)
        reports = [text_report(model, out, row, encoding, target, options, tokenizer)
                   for row, encoding in enumerate(batch)]
        yield EncodedBatch(reports, saved_tensors(out, inputs) if keep_tensors else None)
