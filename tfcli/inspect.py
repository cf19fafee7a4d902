"""What an `encode` run captures and the report it builds: tokens, stage shapes and statistics,
attention maps of the selected layers and heads, and the logit lens (top tokens per layer).

The report holds plain Python values and small tensors, ready for the table, JSON and safetensors
renderers; nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.model import ModelOutput, TransformerModel
    from tfcli.tokenizer import Encoding, Tokenizer


def parse_indices(spec: str | None, count: int, what: str) -> list[int] | None:
    """'0,2,-1' -> sorted non-negative indices into `count` items; None or 'all' -> None (all of them)."""
    if spec is None or spec.strip() == "all":
        return None
    indices = []
    for part in spec.split(","):
        try:
            index = int(part)
        except ValueError:
            raise usage_error(f"--{what}: `{part}` is not a number", f"for example --{what} 0,-1 or --{what} all") from None
        if not -count <= index < count:
            raise usage_error(f"--{what}: {index} is out of range: the model has {count} {what}",
                              f"use 0 to {count - 1}, or -1 for the last")
        indices.append(index % count)
    return sorted(set(indices))


@dataclass
class EncodeOptions:
    layers: list[int] | None = None  # blocks to show (attention, lens); None = all
    heads: list[int] | None = None  # heads to show; None = the mean over all heads
    top_k: int = 3


@dataclass
class DecoderInput:
    """What an encoder-decoder's decoder reads: the start token, then --target's tokens."""

    ids: list[int]
    tokens: list[str]


@dataclass
class StageRow:
    name: str
    shape: list[int]
    dtype: str
    parameters: int
    mean: float
    std: float
    norm: float


@dataclass
class AttentionMap:
    kind: str  # "self" (encoder or decoder-only), "encoder", "decoder" or "cross"
    layer: int
    head: int | str  # a head index, or "mean"
    weights: "Tensor"  # (queries, keys)
    query_tokens: list[str]
    key_tokens: list[str]


@dataclass
class LensRow:
    layer: int  # block index; its output goes through the final norm / head
    top: list[list[tuple[str, int, float]]]  # per position: top-k (token, id, probability)


@dataclass
class TextReport:
    text: str
    tokens: list[str]
    ids: list[int]
    target_tokens: list[str] | None = None  # encoder-decoder: the decoder's input
    target_ids: list[int] | None = None
    stages: list[StageRow] = field(default_factory=list)
    attention: list[AttentionMap] = field(default_factory=list)
    lens: list[LensRow] = field(default_factory=list)


def stage_row(name: str, tensor: "Tensor", parameters: int) -> StageRow:
    values = tensor.detach().float()
    return StageRow(name, list(tensor.shape), str(tensor.dtype).removeprefix("torch."), parameters,
                    values.mean().item(), values.std(unbiased=False).item(), values.norm().item())


def block_count(model: "TransformerModel") -> int:
    """Blocks of the stack the options index (the output stack: the decoder when there is one)."""
    return len(model.output_stack.blocks)


def capture_for(options: EncodeOptions):
    from tfcli.model import Capture

    return Capture(hidden_states=True, attention=True, layers=options.layers, stages=True)


def _maps(kind: str, attentions: dict[int, "Tensor"], row: int, q_len: int, k_len: int, options: EncodeOptions,
          query_tokens: list[str], key_tokens: list[str]) -> list[AttentionMap]:
    maps = []
    for layer, weights in sorted(attentions.items()):
        weights = weights[row, :, :q_len, :k_len].float()
        if options.heads is None:
            maps.append(AttentionMap(kind, layer, "mean", weights.mean(0), query_tokens, key_tokens))
        else:
            maps += [AttentionMap(kind, layer, h, weights[h], query_tokens, key_tokens) for h in options.heads]
    return maps


def lens_rows(model: "TransformerModel", hidden_states: list["Tensor"], row: int, length: int,
              layers: list[int] | None, top_k: int, tokenizer: "Tokenizer") -> list[LensRow]:
    """Logit lens: each selected block's output (hidden_states[i + 1]) through the final norm and head."""
    import torch

    rows = []
    blocks = range(len(hidden_states) - 1) if layers is None else layers
    for layer in blocks:
        probs = torch.softmax(model.unembed(hidden_states[layer + 1][row:row + 1, :length]).float(), dim=-1)[0]
        values, ids = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        rows.append(LensRow(layer, [[(tokenizer.id_to_token(i), i, p) for i, p in zip(pos_ids.tolist(), pos_vals.tolist())]
                                    for pos_ids, pos_vals in zip(ids, values)]))
    return rows


def text_report(model: "TransformerModel", out: "ModelOutput", row: int, encoding: "Encoding",
                target: DecoderInput | None, options: EncodeOptions, tokenizer: "Tokenizer") -> TextReport:
    """The report of one text (row `row` of a padded batch), sliced to its real tokens."""
    n = len(encoding.ids)
    report = TextReport(encoding.text, encoding.tokens, encoding.ids)
    if out.encoder is None:  # encoder-only or decoder-only: one stack
        kind = "self"
        t_tokens, t_len = encoding.tokens, n
        stacks = [("", out)]
    else:
        report.target_tokens, report.target_ids = target.tokens, target.ids
        t_tokens, t_len = target.tokens, len(target.ids)
        stacks = [("encoder ", out.encoder), ("decoder ", out)]
        report.attention += _maps("encoder", out.encoder.attentions, row, n, n, options, encoding.tokens, encoding.tokens)
        kind = "decoder"
    for prefix, stack_out in stacks:
        length = t_len if stack_out is out else n
        for stage in stack_out.stages:
            # classifier logits are (B, labels); everything else is (B, T, ...)
            tensor = stage.tensor[row] if stage.tensor.dim() == 2 else stage.tensor[row, :length]
            report.stages.append(stage_row(prefix + stage.name, tensor, stage.parameters))
    report.attention += _maps(kind, out.attentions, row, t_len, t_len, options, t_tokens, t_tokens)
    if out.encoder is not None:
        report.attention += _maps("cross", out.cross_attentions, row, t_len, n, options, t_tokens, encoding.tokens)
    report.lens = lens_rows(model, out.hidden_states, row, t_len, options.layers, options.top_k, tokenizer)
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
    """The --save names of DESIGN.md: input_ids, hidden.{i}, attention.{i}, logits; encoder-decoders
    prefix encoder./decoder. and add decoder.cross_attention.{i}."""
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
