"""`tfcli sae train`: a top-k sparse autoencoder trained on a decoder's activations at one site, after Gao et al.
2024, "Scaling and evaluating sparse autoencoders", written in SAELens's format (docs/sae.md).

The SAE: features f = ReLU(TopK(W_enc^T (x - b_dec) + b_enc)), reconstruction x^ = W_dec^T f + b_dec, with W_enc
(d, n), b_enc (n), W_dec (n, d) whose rows (the features' directions) have unit norm, b_dec (d). Trained on x / s,
s the first buffer's mean norm over sqrt(d) (SAELens's expected_average_only_in); the file holds the SAE on x itself
(b_enc and b_dec times s: the same features times s, the decoder's rows still of unit norm). Initialised as the
paper says: W_dec's rows random unit vectors, W_enc = W_dec^T, b_dec the geometric median of the first buffer.
The objective per batch X (N, d): L = |X - X^|^2 / |X - mean(X)|^2 (the fraction of variance unexplained, FVU)
plus 1/32 of AuxK: the k_aux (d / 2) largest pre-activations among the dead latents (not fired for `dead_after`
tokens), ReLU'd, decoded without b_dec (e^ = W_dec^T z), against the residual error e = X - X^ (held fixed):
min(dead / k_aux, 1) |e - e^|^2 / |X - mean(X)|^2 (as EleutherAI's sparsify scales it). Adam (betas 0.9, 0.999,
eps 6.25e-10), learning rate 2e-4 / sqrt(n / 2^14) unless given; before each step the gradient of each decoder row
loses its component along the row, and after it the rows are set back to unit norm.

Activations are streamed: the texts are tokenized, joined (each text after a separator, the model's BOS or else
EOS, unless it starts with a special token) and cut into windows of `context` tokens; passes of `pass_windows`
windows run the model only up to the site (a hook ends the pass there). Position 0 of every window and every
special token (the separators) are left out: their norms are outliers (the attention sink), as SAELens leaves
special tokens out; so is any token whose norm is over `outlier` (10) times the held-out tokens' median: a model
such as SmolLM2 gives a few tokens in ten thousand a norm 15-150 times the usual, which would dominate the squared
error (and the explained variance) of any batch that holds one. The first `held_out` tokens are kept aside to
evaluate on; the rest fill buffers of `buffer` tokens, each shuffled (a permutation seeded by the seed and the
buffer's number) and cut into batches.

Ctrl-C saves a checkpoint (training.pt: the parameters, Adam's state, the counters and where the stream is) and
the SAE so far; `--resume` reads the corpus again to that point (its token ids must hash the same), recomputes the
current buffer and continues to the same result as a run never interrupted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tfcli.analysis.corpus import Windows, skip, write_checkpoint
from tfcli.analysis.sae import TL_LEAVES
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

FORMAT = "tfcli sae train 1"  # training.pt's format (analysis.corpus.read_checkpoint)
AUXK_ALPHA = 1 / 32
ADAM = {"betas": (0.9, 0.999), "eps": 6.25e-10}
PAPER_DEAD_AFTER = 10_000_000  # tokens without firing before a latent is dead (Gao et al.), or a tenth of the run
LEAF_HOOKS = {leaf: tl for tl, leaf in reversed(TL_LEAVES.items())}  # tfcli's leaf -> SAELens's (first name wins)


class Schedule:
    """The learning rate and the dead latents' count of sae train's options and sae train --transcoder's (their `lr`,
    `latents`, `dead_after`, `tokens`)."""

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else 2e-4 / math.sqrt(self.latents / 2 ** 14)

    @property
    def dead_tokens(self) -> int:
        return self.dead_after if self.dead_after is not None else max(1, min(PAPER_DEAD_AFTER, self.tokens // 10))


@dataclass(kw_only=True)
class TrainOptions(Schedule):
    """What a run is (saved in its checkpoint; a resumed run keeps them, but may raise `tokens`)."""

    site: str
    latents: int
    k: int = 32
    tokens: int = 1_000_000  # training tokens (a whole number of batches)
    batch: int = 1024  # tokens per step
    lr: float | None = None  # None: 2e-4 / sqrt(latents / 2^14)
    context: int = 128  # tokens per window
    buffer: int = 32768  # tokens shuffled together
    held_out: int = 16384  # tokens kept aside to evaluate on
    dead_after: int | None = None  # None: min(10M, tokens / 10)
    outlier: float = 10.0  # tokens of norm over this many times the held-out's median are left out (0: none)
    seed: int = 0
    pass_windows: int = 8  # windows per forward pass


@dataclass
class Trained:
    """What a run gives: where the SAE is, what it trained on, and its error on the held-out tokens."""

    out: str
    site: str
    hook: str
    d_in: int
    latents: int
    k: int
    tokens: int  # trained on
    steps: int
    batch: int
    lr: float
    seconds: float  # this process's training (a resumed run: since it resumed)
    tokens_per_second: float
    held_out: int  # tokens
    explained: float  # 1 - |x - x^|^2 / |x - mean(x)|^2 over the held-out tokens
    l0: float  # features active per token, mean
    dead: int  # latents active on no held-out token
    dead_in_training: int  # latents not fired for dead_after tokens when training stopped
    fvu: float  # the last steps' training FVU
    outliers: int = 0  # training tokens left out (norm over `outlier` times the held-out's median)
    held_outliers: int = 0
    resumed_from: int | None = None  # tokens trained before this process resumed
    ran_out: bool = False  # the corpus ended before the budget
    interrupted: bool = False
    history: list[tuple[int, float]] = field(default_factory=list)  # (tokens, mean FVU of the steps since before)


def hook_name(site: str) -> str | None:
    """SAELens's (TransformerLens's) hook name of a tfcli site, the inverse of tfcli.analysis.sae.site_of:
    blocks.L.resid_post -> blocks.L.hook_resid_post, blocks.L.mlp_norm.out -> blocks.L.ln2.hook_normalized; None
    for a site it has no name for."""
    if site == "embed":
        return "hook_embed"
    parts = site.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in LEAF_HOOKS:
        return f"blocks.{parts[1]}.{LEAF_HOOKS[parts[2]]}"
    return None


def check_site(site: str, shapes: dict[str, tuple]) -> int:
    """The site's width d, refused by name unless the model has it and it is one vector per token with a SAELens
    hook name (resid_pre, resid_mid, resid_post, attn.out, mlp.out, the norms' outputs, mlp.pre/post)."""
    if site not in shapes:
        near = [name for name in shapes if name.endswith("." + site.split(".")[-1])][:4]
        raise usage_error(f"--site {site}: the model has no such site",
                          f"sites such as {', '.join(near)}" if near else "tfcli config --sites lists them",
                          parameter="site")
    shape = shapes[site]
    if hook_name(site) is None or len(shape) != 3 or shape[:2] != ("B", "T"):
        raise usage_error(f"--site {site}: sae train reads one vector per token at a site SAELens names "
                          f"(this one is {tuple(shape)})", "a residual site such as blocks.L.resid_post, or "
                          "attn.out, mlp.out, mlp.post", parameter="site")
    return int(shape[2])


def check_options(options: TrainOptions) -> None:
    """What the options must say of each other, before any model is built."""
    if not 0 < options.k <= options.latents:
        raise usage_error(f"--k {options.k}: it must be between 1 and the latents ({options.latents})",
                          parameter="k")
    if options.tokens < options.batch:
        raise usage_error(f"--tokens {options.tokens}: fewer than one batch ({options.batch})", parameter="tokens")
    if options.context < 2:
        raise usage_error(f"--context {options.context}: a window needs 2 tokens at least (its first is left out)",
                          parameter="context")


# ------------------------------------------------------------------------------------------ the SAE's objective


def init_params(d: int, n: int, first: Tensor, seed: int) -> dict[str, Tensor]:
    """W_dec's rows random unit vectors, W_enc their transpose, b_enc 0, b_dec the geometric median of `first`
    (N, d): float32 parameters."""
    generator = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(n, d, generator=generator)
    w_dec /= w_dec.norm(dim=-1, keepdim=True)
    params = {"W_enc": w_dec.T.clone(), "b_enc": torch.zeros(n), "W_dec": w_dec,
              "b_dec": geometric_median(first.cpu().double()).float()}
    return {name: value.to(first.device).requires_grad_() for name, value in params.items()}


def geometric_median(x: Tensor, steps: int = 50) -> Tensor:
    """The point (d,) of least summed distance to the rows of x (N, d): Weiszfeld's iterations from the mean."""
    median = x.mean(0)
    for _ in range(steps):
        weights = 1 / (x - median).norm(dim=-1).clamp_min(1e-8)
        moved = (weights[:, None] * x).sum(0) / weights.sum()
        if float((moved - median).norm()) < 1e-6 * float(median.norm() + 1e-12):
            return moved
        median = moved
    return median


def objective(params: dict[str, Tensor], x: Tensor, k: int, dead: Tensor) -> dict[str, Tensor]:
    """The loss of a batch x (N, d) and its parts: `fvu`, `auxk`, `loss` = fvu + auxk / 32, and the top-k latents
    `indices`, `values` (N, k). `dead` (n,) bool marks the dead latents."""
    pre = (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]  # (N, n)
    values, indices = pre.topk(k, dim=-1, sorted=False)
    values = torch.relu(values)
    recon = torch.nn.functional.embedding_bag(indices, params["W_dec"], per_sample_weights=values, mode="sum") \
        + params["b_dec"]
    error = x - recon
    variance = (x - x.mean(0)).pow(2).sum()
    fvu = error.pow(2).sum() / variance
    auxk = fvu.new_zeros(())
    count = int(dead.sum())
    if count:
        k_aux = x.shape[-1] // 2
        scale = min(count / k_aux, 1.0)
        aux_values, aux_indices = pre.masked_fill(~dead, -math.inf).topk(min(k_aux, count), dim=-1, sorted=False)
        guess = torch.nn.functional.embedding_bag(aux_indices, params["W_dec"],
                                                  per_sample_weights=torch.relu(aux_values), mode="sum")
        auxk = scale * (guess - error.detach()).pow(2).sum() / variance
    return {"loss": fvu + AUXK_ALPHA * auxk, "fvu": fvu, "auxk": auxk, "indices": indices, "values": values}


def unit_rows_step(optimizer: torch.optim.Optimizer, loss: Tensor, w_dec: Tensor) -> None:
    """Backward `loss`, take from each decoder row's gradient its component along the row, step, and put the rows
    (w_dec (..., n, d)) back to unit norm: the step of sae train and of its transcoders."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        w_dec.grad -= (w_dec.grad * w_dec).sum(-1, keepdim=True) * w_dec
        optimizer.step()
        w_dec /= w_dec.norm(dim=-1, keepdim=True)


def train_step(params: dict[str, Tensor], optimizer: torch.optim.Optimizer, since: Tensor, x: Tensor, k: int,
               dead_after: int) -> float:
    """One step on batch x (N, d): the objective, its gradient with each decoder row's component along the row
    removed, Adam, the rows back to unit norm; `since` (n,) counts the tokens since each latent last fired. The
    batch's FVU."""
    found = objective(params, x, k, since >= dead_after)
    unit_rows_step(optimizer, found["loss"], params["W_dec"])
    with torch.no_grad():
        fired = torch.zeros_like(since, dtype=torch.bool)
        fired[found["indices"][found["values"] > 0]] = True
        since += x.shape[0]
        since[fired] = 0
    return float(found["fvu"].detach())


def saved_tensors(params: dict[str, Tensor], scale: float) -> dict[str, Tensor]:
    """The SAE on raw activations (SAELens's names): b_enc and b_dec times the scale the training divided by."""
    return {"W_enc": params["W_enc"].detach().cpu().contiguous(), "b_enc": params["b_enc"].detach().cpu() * scale,
            "W_dec": params["W_dec"].detach().cpu().contiguous(), "b_dec": params["b_dec"].detach().cpu() * scale}


def evaluate(weights: dict[str, Tensor], k: int, x: Tensor) -> tuple[float, float, int]:
    """Explained variance, mean L0 and the latents never active, of the saved SAE `weights` on rows x (N, d)."""
    with torch.no_grad():
        pre = (x - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"]
        values, indices = pre.topk(k, dim=-1, sorted=False)
        values = torch.relu(values)
        recon = torch.nn.functional.embedding_bag(indices, weights["W_dec"], per_sample_weights=values,
                                                  mode="sum") + weights["b_dec"]
        x64 = x.double()
        explained = 1 - float((x64 - recon.double()).pow(2).sum()) / float((x64 - x64.mean(0)).pow(2).sum())
        active = torch.zeros(weights["W_enc"].shape[1], dtype=torch.bool, device=x.device)
        active[indices[values > 0]] = True
        return explained, float((values > 0).sum(-1).float().mean()), int((~active).sum())


# ------------------------------------------------------------------------------------------ the activations


class SiteReached(Exception):
    """Ends a pass at the site (its value read): the blocks after it are not run."""


def site_rows(model: TransformerModel, site: str, windows: list[tuple[list[int], list[bool]]]) -> Tensor:
    """The site's values (N, d), float32, at the kept positions of a pass over `windows`."""
    seen = {}

    def stop(value: Tensor) -> None:
        seen["value"] = value
        raise SiteReached

    ids = torch.tensor([w[0] for w in windows], device=model.device)
    keep = torch.tensor([w[1] for w in windows], device=model.device)
    with torch.no_grad():
        try:
            model.run_with_hooks(ids, {site: stop})
        except SiteReached:
            pass
    return seen["value"][keep].float()


def kept_rows(model: TransformerModel, site: str, windows: list[tuple[list[int], list[bool]]], limit: float
              ) -> tuple[Tensor, int]:
    """A pass's activations (site_rows) of norm at most `limit`, and how many were over it."""
    found = site_rows(model, site, windows)
    kept = found[found.norm(dim=-1) <= limit]
    return kept, found.shape[0] - kept.shape[0]


def fill(model: TransformerModel, site: str, windows: Windows, rows: int, pass_windows: int, limit: float = math.inf,
         progress: Callable[[int], None] | None = None) -> tuple[Tensor | None, int, int]:
    """At least `rows` activations of norm at most `limit` (fewer at the corpus's end: None for none), a pass of
    `pass_windows` windows at a time; the windows they took and the rows left out over the limit."""
    parts, count, start, dropped = [], 0, windows.read, 0
    while count < rows:
        batch = [w for w in (windows.next() for _ in range(pass_windows)) if w is not None]
        if not batch:
            break
        kept, over = kept_rows(model, site, batch, limit)
        parts.append(kept)
        count, dropped = count + kept.shape[0], dropped + over
        if progress is not None:
            progress(count)
    return (torch.cat(parts) if parts else None), windows.read - start, dropped


# ------------------------------------------------------------------------------------------ the run


@dataclass
class State:
    """Where a run is: its parameters, Adam, the latents' counters, and the stream's position (`current`: the
    buffer begun, (first window, windows, number, steps done), or None between buffers)."""

    params: dict[str, Tensor] | None = None
    optimizer: torch.optim.Adam | None = None
    since: Tensor | None = None
    scale: float = 1.0
    steps: int = 0
    held_windows: int = 0
    next_window: int = 0
    buffers: int = 0
    current: list[int] | None = None
    digest: str = ""  # the hash of every window the run had read when saved
    outliers: int = 0  # training tokens left out, their norm over the limit
    history: list[tuple[int, float]] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)  # the FVUs of the steps since the history's last entry


def train(model: TransformerModel, tokenizer: Tokenizer, texts: Iterable[list[str]], options: TrainOptions,
          out: Path, resume: dict[str, Any] | None = None,
          progress: Callable[..., None] | None = None) -> Trained:
    """Train (or, with `resume`, a checkpoint read by `analysis.corpus.read_checkpoint`, continue) the SAE on the texts (batches of
    strings), write it to `out` in SAELens's format with its checkpoint, and say how it does on the held-out
    tokens. Ctrl-C (KeyboardInterrupt) after the first step saves the checkpoint and gives the run so far."""
    d = check_site(options.site, model.site_shapes())
    total_steps = options.tokens // options.batch
    windows = Windows(texts, tokenizer, model, options.context)
    state = State() if resume is None else restored(resume, d, options, model)
    everything = options.held_out + total_steps * options.batch  # the progress: tokens through the model

    def tell(done: int) -> None:
        if progress is not None:
            progress(min(done, everything), everything, f"FVU {state.history[-1][1]:.3f}" if state.history else "")

    held, state.held_windows, _ = fill(model, options.site, windows, options.held_out, options.pass_windows,
                                       progress=lambda rows: tell(min(rows, options.held_out)))
    if held is None:
        raise usage_error("the corpus gave no tokens to train on", "give a longer --file")
    held = held[:options.held_out]
    norms = held.norm(dim=-1)
    limit = float(norms.median()) * options.outlier if options.outlier else math.inf
    held, held_outliers = held[norms <= limit], int((norms > limit).sum())
    started, start_steps = time.monotonic(), state.steps

    def step(buffer: Tensor, taken: Tensor) -> float:
        if state.params is None:
            begin(state, buffer, d, options)
        return train_step(state.params, state.optimizer, state.since, buffer[taken] / state.scale, options.k,
                          options.dead_tokens)

    _, ran_out, interrupted = train_buffers(
        state, options, windows, resume is not None,
        fill=lambda rows, told: fill(model, options.site, windows, rows, options.pass_windows, limit, told),
        again=lambda count: windows_rows(model, options, windows, count, limit),
        step=step, tell=tell)
    seconds = time.monotonic() - started
    weights = saved_tensors(state.params, state.scale)
    hook = hook_name(options.site)
    write_sae(out, weights, options, hook, d, model.config.name)
    save_checkpoint(out, state, options, d, model.config.name)
    explained, l0, dead = evaluate(weights, options.k, held.cpu())
    trained = state.steps * options.batch
    before = resume["steps"] * options.batch if resume else None
    return Trained(str(out), options.site, hook, d, options.latents, options.k, trained, state.steps, options.batch,
                   options.learning_rate, seconds, (state.steps - start_steps) * options.batch / max(seconds, 1e-9),
                   int(held.shape[0]), explained, l0, dead, int((state.since >= options.dead_tokens).sum()),
                   (state.history[-1][1] if state.history else math.nan) if not state.pending
                   else sum(state.pending) / len(state.pending),
                   state.outliers, held_outliers, before,
                   ran_out, interrupted, list(state.history))


def train_buffers(state, options, windows: Windows, resumed: bool,
                  fill: Callable[[int, Callable[[int], None]], tuple[Tensor | None, int, int]],
                  again: Callable[[int], Tensor], step: Callable[[Tensor, Tensor], float],
                  tell: Callable[[int], None]) -> tuple[Tensor | None, bool, bool]:
    """The training loop of `sae train` and of `sae train --transcoder` (their `State`, `options` and `windows`):
    buffers of activations, each shuffled by a permutation seeded by the seed and its number and cut into batches,
    until `options.tokens` (a resumed run first reads the corpus again up to where `state` is, and makes the buffer it
    was in again). `fill(rows, progress)`: the next buffer (..., N, d), the windows taken and the tokens left out
    (None at the corpus's end); `again(windows)`: the buffer begun, made again; `step(buffer, token indices)`: one
    step on a batch (the first makes the parameters from the buffer), its FVU; `tell(tokens through the model)`.
    Returns the last buffer trained on, whether the corpus ran out, and whether Ctrl-C stopped the run (after a
    step; before one it passes on). A corpus too short for one batch is a usage error."""
    total_steps = options.tokens // options.batch
    buffer = last = None
    ran_out = interrupted = False
    fvus = state.pending
    try:
        if state.current is not None:  # resumed inside a buffer: read the corpus up to it, and run it again
            skip(windows, state.current[0] - windows.read)
            buffer = again(state.current[1])
        elif resumed:
            skip(windows, state.next_window - windows.read)
        if resumed and windows.digest.hexdigest() != state.digest:
            raise usage_error("--resume: the corpus differs from the one the run trained on",
                              "give the same --file as the interrupted run")
        while state.steps < total_steps:
            if state.current is None:
                wanted = min(options.buffer, (total_steps - state.steps) * options.batch)
                first = windows.read
                base = options.held_out + state.steps * options.batch
                buffer, taken, dropped = fill(wanted, lambda rows: tell(base + rows))
                if buffer is None or buffer.shape[-2] < options.batch:
                    ran_out = True
                    break
                state.current = [first, taken, state.buffers, 0]
                state.outliers += dropped
                state.buffers += 1
                state.digest = windows.digest.hexdigest()  # of every window read up to the buffer's end
            first, taken, number, done = state.current
            last = buffer
            order = torch.randperm(buffer.shape[-2], generator=torch.Generator().manual_seed(
                options.seed * 1_000_003 + number)).to(buffer.device)
            steps = min(buffer.shape[-2] // options.batch, total_steps - state.steps + done)
            for index in range(done, steps):
                fvus.append(step(buffer, order[index * options.batch:(index + 1) * options.batch]))
                state.steps += 1
                state.current[3] = index + 1
                if len(fvus) == 20:
                    state.history.append((state.steps * options.batch, sum(fvus) / len(fvus)))
                    fvus.clear()
                tell(options.held_out + (state.steps - state.current[3]) * options.batch + buffer.shape[-2])
            state.current, state.next_window = None, first + taken
    except KeyboardInterrupt:
        if state.params is None:
            raise
        interrupted = True
    if state.params is None:
        raise usage_error(f"the corpus has too few tokens after the held-out ones for one batch ({options.batch})",
                          "give a longer --file, or a smaller --held-out or --batch")
    if fvus and not interrupted:
        state.history.append((state.steps * options.batch, sum(fvus) / len(fvus)))
        fvus.clear()
    return last, ran_out, interrupted


def windows_rows(model: TransformerModel, options: TrainOptions, windows: Windows, count: int, limit: float
                 ) -> Tensor:
    """The activations of the next `count` windows (those of norm at most `limit`), in passes as the run first made
    them."""
    parts = []
    for start in range(0, count, options.pass_windows):
        batch = [windows.next() for _ in range(min(options.pass_windows, count - start))]
        if any(w is None for w in batch):
            raise usage_error("--resume: the corpus is shorter than the one the run trained on",
                              "give the same --file as the interrupted run")
        parts.append(kept_rows(model, options.site, batch, limit)[0])
    return torch.cat(parts)


def begin(state: State, first: Tensor, d: int, options: TrainOptions) -> None:
    """The parameters, Adam and the counters, from the first buffer (N, d): its scale and geometric median."""
    state.scale = float(first.norm(dim=-1).mean()) / math.sqrt(d)
    state.params = init_params(d, options.latents, first / state.scale, options.seed)
    state.optimizer = torch.optim.Adam(list(state.params.values()), lr=options.learning_rate, **ADAM)
    state.since = torch.zeros(options.latents, dtype=torch.int64, device=first.device)


# ------------------------------------------------------------------------------------------ files


def write_sae(out: Path, weights: dict[str, Tensor], options: TrainOptions, hook: str, d: int, model: str) -> None:
    """cfg.json + sae_weights.safetensors as sae-lens 6.54's TopKSAE saves them."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {"d_in": d, "d_sae": options.latents, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
              "normalize_activations": "none", "reshape_activations": "none",
              "metadata": {"hook_name": hook, "model_name": model, "context_size": options.context,
                           "prepend_bos": True, "exclude_special_tokens": True, "trained_with": "tfcli sae train",
                           "training_tokens": options.tokens},
              "k": options.k, "rescale_acts_by_decoder_norm": False, "architecture": "topk"}
    save_file(weights, str(out / "sae_weights.safetensors"))
    (out / "cfg.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def save_checkpoint(out: Path, state: State, options: TrainOptions, d: int, model: str) -> None:
    """training.pt: everything `--resume` needs (tensors, numbers and strings only: read with weights_only)."""
    data = {"format": FORMAT, "options": asdict(options), "d_in": d, "model": model,
            "params": {name: value.detach().cpu() for name, value in state.params.items()},
            "optimizer": state.optimizer.state_dict(), "since": state.since.cpu(), "scale": state.scale,
            "steps": state.steps, "held_windows": state.held_windows, "next_window": state.next_window,
            "buffers": state.buffers, "current": state.current, "digest": state.digest, "history": state.history,
            "outliers": state.outliers, "pending": state.pending}
    write_checkpoint(out, data)


def restored(data: dict[str, Any], d: int, options: TrainOptions, model: TransformerModel) -> State:
    """The State a checkpoint holds, on the model's device."""
    if data["d_in"] != d or data["model"] != model.config.name:
        raise usage_error(f"--resume: the checkpoint is of {data['model']} ({data['d_in']} wide), not of "
                          f"{model.config.name}", "give the model the run trained", parameter="resume")
    device = model.device
    params = {name: value.to(device).requires_grad_() for name, value in data["params"].items()}
    optimizer = torch.optim.Adam(list(params.values()), lr=options.learning_rate, **ADAM)
    optimizer.load_state_dict(data["optimizer"])
    return State(params, optimizer, data["since"].to(device), data["scale"], data["steps"], data["held_windows"],
                 data["next_window"], data["buffers"], data["current"], data["digest"], data["outliers"],
                 [tuple(entry) for entry in data["history"]], list(data["pending"]))


def options_of(data: dict[str, Any]) -> TrainOptions:
    return TrainOptions(**data["options"])
