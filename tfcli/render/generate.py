"""`tfcli generate` output: the step table (with the logit lens per layer) and the JSON Lines record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from tfcli.generate import token_text

if TYPE_CHECKING:
    from rich.console import Console

    from tfcli.generate import Generation
    from tfcli.tokenizer import Tokenizer


def _shown(tokenizer: Tokenizer, token_id: int) -> str:
    return repr(token_text(tokenizer, token_id))


def print_generation(console: Console, result: Generation, tokenizer: Tokenizer, number: int,
                     sampled_seed: int | None) -> None:
    """The text (prompt and continuation), then the step table; `sampled_seed` is None for greedy runs."""
    console.print(result.full_text, soft_wrap=True)
    ended = "stopped at end of sequence" if result.stopped_at_eos else f"{len(result.steps)} new tokens"
    mode = "greedy" if sampled_seed is None else f"sampled (seed {sampled_seed})"
    console.print(step_table(result, tokenizer, f"prompt {number}: {ended}, {mode}"))


def step_table(result: Generation, tokenizer: Tokenizer, title: str) -> Table:
    """One row per new token: its probability and the most probable alternatives; with the lens, what each
    hidden state (emb = the embeddings, then each block) would have predicted at that step."""
    table = Table(title=title, title_justify="left", caption_justify="left",
                  caption="probabilities are the model's (softmax of the logits, before temperature and filtering)"
                  + ("; lens: each layer's top token through the final norm and unembedding" if _has_lens(result)
                     else ""))
    for header, justify in (("step", "right"), ("token", "left"), ("id", "right"), ("prob", "right"),
                            ("top alternatives", "left")):
        table.add_column(header, justify=justify)
    if _has_lens(result):
        table.add_column("lens: top token by layer (emb = embeddings)", justify="left")
    for step in result.steps:
        alternatives = "  ".join(f"{_shown(tokenizer, i)} {p:.3g}" for i, p in step.top if i != step.token_id)
        lens = [lens_runs(step.lens, tokenizer)] if step.lens is not None else []
        token = _shown(tokenizer, step.token_id) + (" (end)" if step.eos else "")
        table.add_row(str(step.index), token, str(step.token_id), f"{step.prob:.3g}", alternatives, *lens)
    return table


def lens_runs(lens: list[tuple[int, float]], tokenizer: Tokenizer) -> str:
    """Each layer's top token, runs of layers that agree merged: "emb 'a' · 1-5 'b' · 6-12 'c'"."""
    runs: list[tuple[int, int, int]] = []  # (first layer, last layer, token id)
    for layer, (token_id, _) in enumerate(lens):
        if runs and runs[-1][2] == token_id:
            runs[-1] = (runs[-1][0], layer, token_id)
        else:
            runs.append((layer, layer, token_id))

    def name(layer: int) -> str:
        return "emb" if layer == 0 else str(layer)

    return " · ".join(f"{name(a)}{'' if a == b else '-' + name(b)} {_shown(tokenizer, t)}" for a, b, t in runs)


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
