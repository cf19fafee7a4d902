"""`tfcli generate` output: the step table (with the logit lens per layer) and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text

from tfcli.generate import token_text
from tfcli.render.layout import Column, layer_runs, table, words

if TYPE_CHECKING:
    from tfcli.generate import Generation
    from tfcli.tokenizer import Tokenizer


def _shown(tokenizer: Tokenizer, token_id: int) -> str:
    return repr(token_text(tokenizer, token_id))


def generation_lines(result: Generation, tokenizer: Tokenizer, number: int, sampled_seed: int | None, width: int,
                     with_text: bool = True) -> list[Text]:
    """The text (prompt and continuation; left out when it was already streamed to the same terminal), then
    the step table; `sampled_seed` is None for greedy runs. Lines of at most `width` cells."""
    lines = [line for paragraph in result.full_text.split("\n") for line in words(paragraph, width)] if with_text else []
    ended = "stopped at end of sequence" if result.stopped_at_eos else f"{len(result.steps)} new tokens"
    mode = "greedy" if sampled_seed is None else f"sampled (seed {sampled_seed})"
    return lines + step_lines(result, tokenizer, f"prompt {number}: {ended}, {mode}", width)


def step_lines(result: Generation, tokenizer: Tokenizer, title: str, width: int) -> list[Text]:
    """One row per new token: its probability and the most probable alternatives; with the lens, what each
    hidden state (emb = the embeddings, then each block) would have predicted at that step."""
    steps = result.steps
    columns = [Column.of("step", [str(s.index) for s in steps], right=True),
               Column.of("token", [_shown(tokenizer, s.token_id) + (" (end)" if s.eos else "") for s in steps]),
               Column.of("id", [str(s.token_id) for s in steps], right=True),
               Column.of("prob", [f"{s.prob:.3g}" for s in steps], right=True),
               Column("top alternatives", [[Text(f"{_shown(tokenizer, i)} {p:.3g}") for i, p in s.top if i != s.token_id]
                                           for s in steps])]
    if _has_lens(result):
        columns.append(Column("lens: top token by layer (emb = embeddings)",
                              [lens_runs(s.lens, tokenizer) for s in steps], sep=" · "))
    caption = "probabilities are the model's (softmax of the logits, before temperature and filtering)" + (
        "; lens: each layer's top token through the final norm and unembedding" if _has_lens(result) else "")
    return table(columns, width, keys=2, title=title) + words(caption, width, "dim")


def lens_runs(lens: list[tuple[int, float]], tokenizer: Tokenizer) -> list[Text]:
    """Each layer's top token, runs of layers that agree merged: ["emb 'a'", "1-5 'b'", "6-12 'c'"]."""

    def name(layer: int) -> str:
        return "emb" if layer == 0 else str(layer)

    runs = layer_runs([(layer, token_id) for layer, (token_id, _) in enumerate(lens)])
    return [Text(f"{name(a)}{'' if a == b else '-' + name(b)} {_shown(tokenizer, t)}") for a, b, t in runs]


def _has_lens(result: Generation) -> bool:
    return bool(result.steps) and result.steps[0].lens is not None


def record(result: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """The JSON Lines record of `generate`: prompt, ids (the input ids), prompt_ids, generated_ids, text, steps."""

    def token(i: int, p: float) -> dict[str, Any]:
        return {"id": i, "token": token_text(tokenizer, i), "prob": round(p, 6)}

    steps = []
    for step in result.steps:
        record = {"step": step.index, **token(step.token_id, step.prob), "eos": step.eos,
                  "top": [token(i, p) for i, p in step.top]}
        if step.lens is not None:
            record["lens"] = [{"layer": layer, **token(i, p)} for layer, (i, p) in enumerate(step.lens)]
        steps.append(record)
    return {"prompt": result.prompt, "ids": result.prompt_ids, "prompt_ids": result.prompt_ids,
            "generated_ids": result.generated_ids, "text": result.text, "steps": steps}
