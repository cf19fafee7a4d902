"""`tfcli lens fit` and `tfcli lens eval`: the pipelines (the lens itself, its files, its objective and its
evaluation are `tfcli/analysis/tuned_lens.py`, which encode and generate read too; docs/lens.md).

`fit` reads the corpus as `sae train` does (`analysis/corpus.py`: windows of `context` tokens, each text after a
separator, the first position and special tokens left out), keeps its first `held_out` tokens (whole windows) apart,
and trains on the windows after them, `batch` tokens (whole windows) a step, in passes of `pass_windows` windows
whose gradients add up; the lens is written after the run (or Ctrl-C) with its checkpoint (training.pt: the
translators, SGD's momentum, the step, a SHA-256 of every window read), from which `resume` goes on to the lens a run
never interrupted gives, bit for bit. Both end with `evaluate` on the held-out windows: per layer, the KL of the final
distribution from the logit lens's and the tuned lens's, and their top-1 agreement with the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tfcli.analysis import tuned_lens as tl
from tfcli.analysis.corpus import Windows, skip, write_checkpoint
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

FORMAT = "tfcli lens fit 1"
HISTORY_EVERY = 10  # steps per entry of the loss's history


@dataclass(kw_only=True)
class FitOptions:
    """What a run is (saved in its checkpoint; a resumed run keeps them)."""

    tokens: int = 1_000_000  # training tokens, as windows of `context` (whole steps)
    batch: int = 4096  # tokens per step (whole windows)
    context: int = 128  # tokens per window
    held_out: int = 16384  # the corpus's first tokens (whole windows), never trained on
    pass_windows: int = 8  # windows per forward pass

    @property
    def step_windows(self) -> int:
        return max(1, self.batch // self.context)

    @property
    def steps(self) -> int:
        return self.tokens // (self.step_windows * self.context)

    @property
    def held_windows(self) -> int:
        return max(1, math.ceil(self.held_out / self.context))


def check_options(options: FitOptions) -> None:
    """What the options must say of each other, before any model is built."""
    if options.context < 2:
        raise usage_error(f"--context {options.context}: a window needs 2 tokens at least (its first is left out)",
                          parameter="context")
    if options.steps < 1:
        raise usage_error(f"--tokens {options.tokens}: fewer than one step ({options.step_windows * options.context} "
                          f"tokens: --batch in whole windows of --context {options.context})", parameter="tokens")


@dataclass
class Evaluated:
    """A lens on held-out tokens (`lens eval`, and the end of `lens fit`)."""

    lens: str
    model: str
    layers: int
    d: int
    held_out: tl.Evaluation


@dataclass
class Fitted:
    """What a run gives: where the lens is, what it trained on, its loss, and how it does on the held-out tokens."""

    out: str
    model: str
    layers: int
    d: int
    tokens: int  # trained on (window tokens; the first position of each window and special tokens not counted in
    steps: int  # the loss)
    batch: int
    lr: float  # the first step's; it decays linearly to 0
    seconds: float  # this process's training
    tokens_per_second: float
    loss: float  # the last step's: the sum over layers of the mean KL (nats)
    history: list[tuple[int, float]] = field(default_factory=list)  # (tokens, mean loss of the steps since before)
    resumed_from: int | None = None
    ran_out: bool = False
    interrupted: bool = False
    evaluated: Evaluated | None = None


@dataclass
class State:
    """Where a run is: the lens, SGD, the steps done, each step's loss and the hash of every window read."""

    lens: tl.Lens
    optimizer: torch.optim.SGD
    step: int = 0
    digest: str = ""
    losses: list[float] = field(default_factory=list)


def read_held_out(windows: Windows, options: FitOptions) -> list[tuple[list[int], list[bool]]]:
    """The corpus's first windows, `held_out` tokens; a corpus shorter than that is refused."""
    held = [w for w in (windows.next() for _ in range(options.held_windows)) if w is not None]
    if not held:
        raise usage_error(f"the corpus gave fewer than {options.context} tokens (one window of --context)",
                          "give a longer --file, or a smaller --context")
    if len(held) < options.held_windows:
        raise usage_error(f"the corpus gave {len(held) * options.context:,} tokens, fewer than --held-out "
                          f"{options.held_out:,} and a step after them", "give a longer --file, or a smaller "
                          "--held-out")
    return held


def fit(model: TransformerModel, tokenizer: Tokenizer, texts: Iterable[list[str]], options: FitOptions, out: Path,
        resume: dict[str, Any] | None = None, progress: Callable[..., None] | None = None
        ) -> tuple[Fitted, tl.Lens, list[tuple[list[int], list[bool]]]]:
    """Fit (or, with `resume`, a checkpoint read by `analysis.corpus.read_checkpoint`, continue) the tuned lens on the texts (batches
    of strings), and write it to `out` with its checkpoint. Returns the run, the lens and the held-out windows (for
    `evaluate`). Ctrl-C (KeyboardInterrupt) after the first step saves the lens so far."""
    name = model.config.name
    windows = Windows(texts, tokenizer, model, options.context)
    held = read_held_out(windows, options)
    state = new_state(model) if resume is None else restored(resume, model)
    total = options.steps * options.step_windows * options.context
    done_before, started = state.step, time.monotonic()
    if resume is not None:
        skip(windows, state.step * options.step_windows)
        if windows.digest.hexdigest() != state.digest:
            raise usage_error("--resume: the corpus differs from the one the run trained on",
                              "give the same --file as the interrupted run")
    ran_out = interrupted = False
    try:
        while state.step < options.steps:
            batch = [w for w in (windows.next() for _ in range(options.step_windows)) if w is not None]
            if len(batch) < options.step_windows:
                ran_out = True
                break
            state.losses.append(step(model, state, batch, options, progress_of(progress, state, options, total)))
            state.digest = windows.digest.hexdigest()
    except KeyboardInterrupt:
        if state.step == 0:
            raise
        interrupted = True
    if state.step == 0:
        raise usage_error(f"the corpus gave {len(held) * options.context:,} held-out tokens and too few after them "
                          f"for one step ({options.step_windows * options.context:,})",
                          "give a longer --file, or a smaller --held-out or --batch")
    seconds = time.monotonic() - started
    tl.write_lens(out, state.lens)
    save_checkpoint(out, state, options, model)
    steps = state.step
    history = [(min(end, steps) * options.step_windows * options.context,
                sum(state.losses[start:end]) / len(state.losses[start:end]))
               for start, end in ((s, s + HISTORY_EVERY) for s in range(0, steps, HISTORY_EVERY))]
    result = Fitted(str(out), name, state.lens.layers, model.config.hidden_size,
                    steps * options.step_windows * options.context, steps, options.step_windows * options.context,
                    tl.learning_rate(0, options.steps), seconds,
                    (steps - done_before) * options.step_windows * options.context / max(seconds, 1e-9),
                    state.losses[-1], history, done_before * options.step_windows * options.context if resume else None,
                    ran_out, interrupted)
    return result, state.lens, held


def progress_of(progress: Callable[..., None] | None, state: State, options: FitOptions, total: int
                ) -> Callable[[int], None]:
    """The progress of a step's passes: window tokens through the model, with the last step's loss."""
    base = state.step * options.step_windows * options.context

    def tell(windows_done: int) -> None:
        if progress is not None:
            note = f"loss {state.losses[-1]:.3f}" if state.losses else ""
            progress(min(base + windows_done * options.context, total), total, note)
    return tell


def step(model: TransformerModel, state: State, batch: list[tuple[list[int], list[bool]]], options: FitOptions,
         tell: Callable[[int], None]) -> float:
    """One step on `batch` (windows): its passes' gradients added up, then the update; the step's loss (the sum over
    layers of the mean KL over the step's kept tokens)."""
    rows = sum(sum(kept) for _, kept in batch)
    total = 0.0
    for start in range(0, len(batch), options.pass_windows):
        hidden, logits = tl.passes_hidden(model, batch[start:start + options.pass_windows])
        total += sum(tl.accumulate(model, state.lens, hidden, logits, rows))
        tell(min(start + options.pass_windows, len(batch)))
    tl.update(state.lens, state.optimizer, tl.learning_rate(state.step, options.steps))
    state.step += 1
    return total / rows


def evaluate(model: TransformerModel, lens: tl.Lens, held: list[tuple[list[int], list[bool]]], folder: str,
             pass_windows: int = 8, progress: Callable[..., None] | None = None) -> Evaluated:
    """The lens and the logit lens on the held-out windows."""
    tokens = len(held) * len(held[0][0])
    tell = None if progress is None else (lambda done: progress(done * len(held[0][0]), tokens))
    evaluation = tl.evaluate(model, lens, held, pass_windows, tell)
    return Evaluated(folder, model.config.name, lens.layers, model.config.hidden_size, evaluation)


def held_out_of(tokenizer: Tokenizer, model: TransformerModel, texts: Iterable[list[str]], options: FitOptions
                ) -> list[tuple[list[int], list[bool]]]:
    """`lens eval`'s tokens: the corpus's first `held_out` tokens, as `lens fit` kept them apart (the same windows
    for the same --context and --held-out)."""
    windows = Windows(texts, tokenizer, model, options.context)
    held = [w for w in (windows.next() for _ in range(options.held_windows)) if w is not None]
    if not held:
        raise usage_error(f"the corpus gave fewer than {options.context} tokens (one window of --context)",
                          "give a longer --file, or a smaller --context")
    return held


# ------------------------------------------------------------------------------------------ the checkpoint


def new_state(model: TransformerModel) -> State:
    lens = tl.new_lens(model, model.config.name)
    return State(lens, tl.optimizer_of(lens))


def save_checkpoint(out: Path, state: State, options: FitOptions, model: TransformerModel) -> None:
    """training.pt: everything `--resume` needs (tensors, numbers and strings only: read with weights_only)."""
    translators = state.lens.translators
    data = {"format": FORMAT, "options": asdict(options), "model": model.config.name, "d": model.config.hidden_size,
            "layers": state.lens.layers, "weight": translators.weight.detach().cpu(),
            "bias": translators.bias.detach().cpu() if translators.bias is not None else None,
            "config": state.lens.config, "optimizer": state.optimizer.state_dict(), "step": state.step,
            "digest": state.digest, "losses": state.losses}
    write_checkpoint(out, data)


def options_of(data: dict[str, Any]) -> FitOptions:
    return FitOptions(**data["options"])


def restored(data: dict[str, Any], model: TransformerModel) -> State:
    """The State a checkpoint holds, on the model's device."""
    config = model.config
    if (data["model"], data["d"], data["layers"]) != (config.name, config.hidden_size, config.num_hidden_layers):
        raise usage_error(f"--resume: the checkpoint is of {data['model']} ({data['layers']} blocks, {data['d']} "
                          f"wide), not of {config.name}", "give the model the run fitted", parameter="resume")
    translators = tl.Translators(data["layers"], data["d"], data["bias"] is not None)
    with torch.no_grad():
        translators.weight.copy_(data["weight"])
        if data["bias"] is not None:
            translators.bias.copy_(data["bias"])
    lens = tl.Lens(translators.to(model.device), dict(data["config"]))
    optimizer = tl.optimizer_of(lens)
    optimizer.load_state_dict(data["optimizer"])
    return State(lens, optimizer, data["step"], data["digest"], list(data["losses"]))
