"""`tfcli sae train --transcoder`: one transcoder per layer, every layer in one pass over the corpus, each mapping its
layer's MLP input (the normalised residual stream the MLP reads, site `blocks.L.mlp_norm.out`, circuit-tracer's
`mlp.hook_in`) to the MLP sublayer's output (`blocks.L.mlp.out`, or `mlp_output_norm.out` where a sandwich block
normalises it: `hook_mlp_out`), written in circuit-tracer's transcoder-set format and SAELens's (docs/sae.md).

Training is sae train's top-k (Gao et al. 2024; core.py) with the target the MLP's output: features f = TopK_k(ReLU(
x W_enc + b_enc)), prediction y^ = f W_dec + b_dec (+ x W_skip^T with `skip`), loss per layer the fraction of the
output's variance unexplained, |Y - Y^|^2 / |Y - mean(Y)|^2, plus 1/32 of AuxK over the dead latents; the decoder's
rows kept at unit norm, Adam (torch's fused kernel: 10 times faster
on a CPU than its loop over the 46 M parameters of SmolLM2's 30 layers). x and y are divided by their layer's scale (the first buffer's mean norm over sqrt(d)).
All layers train at once as stacked tensors (L, ...): the layers share no parameter, and Adam is elementwise, so this
is L independent trainings.

circuit-tracer 0.5.0 reads a ReLU or a JumpReLU (pre * (pre > threshold)) from a layer file, no top-k. The files
therefore hold a JumpReLU: each feature's threshold the one that best reproduces top-k's choice of that feature on the
last training buffer (the fewest tokens where "pre > threshold" and "in the top k" disagree), at least 0. circuit-tracer,
`tfcli graph` and SAELens's jumprelu_transcoder read these files alike; the figures reported are theirs (explained
variance of the MLP output, L0, dead features, on the held-out tokens), with the top-k's own explained variance beside.

The stream is sae train's: the corpus's windows, position 0 and special tokens left out, a token left out when its
norm at any of the sites is over `outlier` times that site's held-out median; the first `held_out` tokens kept aside
(their windows run again at the end, to evaluate); buffers of `buffer` tokens shuffled by a seeded permutation. Ctrl-C
saves training.pt and the transcoders so far; `--resume` continues to the same result as an uninterrupted run.
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

from tfcli.analysis.corpus import Windows, write_checkpoint
from tfcli.analysis.transcoders import INPUT_HOOKS, OUTPUT_HOOKS, THRESHOLD
from tfcli.commands.sae.core import ADAM, AUXK_ALPHA, Schedule, hook_name, train_buffers, unit_rows_step
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

FORMAT = "tfcli sae train --transcoder 1"
INPUT_HOOK, OUTPUT_HOOK = "mlp.hook_in", "hook_mlp_out"


@dataclass(kw_only=True)
class TranscoderOptions(Schedule):
    """What a run is (saved in its checkpoint; a resumed run keeps them, but may raise `tokens`)."""

    latents: int  # features per layer
    k: int = 32
    tokens: int = 1_000_000
    batch: int = 1024
    lr: float | None = None  # None: 2e-4 / sqrt(latents / 2^14)
    context: int = 128
    buffer: int = 8192  # tokens shuffled together (every layer's input and output: 2 L d floats a token)
    held_out: int = 4096
    dead_after: int | None = None
    outlier: float = 10.0
    seed: int = 0
    pass_windows: int = 8
    skip: bool = False


@dataclass
class LayerFigures:
    """One layer's transcoder on the held-out tokens."""

    layer: int
    explained: float  # of the MLP output, the file's JumpReLU: 1 - |y - y^|^2 / |y - mean(y)|^2
    explained_topk: float  # the same with the top-k the training used
    l0: float  # features active per token (the file's JumpReLU), mean
    dead: int  # features active on no held-out token (the file's JumpReLU)
    dead_in_training: int  # not in the top k for dead_after tokens when training stopped


@dataclass
class TranscodersTrained:
    """What a run gives: where the transcoders are, what they trained on, and each layer's figures."""

    out: str
    input_site: str  # blocks.L.<leaf>
    output_site: str
    feature_input_hook: str
    feature_output_hook: str
    layers: int
    d_model: int
    latents: int
    k: int
    skip: bool
    tokens: int
    steps: int
    batch: int
    lr: float
    seconds: float
    tokens_per_second: float
    held_out: int
    fvu: float  # the last steps' training FVU, mean over layers
    figures: list[LayerFigures] = field(default_factory=list)
    outliers: int = 0
    held_outliers: int = 0
    resumed_from: int | None = None
    ran_out: bool = False
    interrupted: bool = False
    history: list[tuple[int, float]] = field(default_factory=list)  # (tokens, mean over layers of the steps' FVU)


def transcoder_sites(model: TransformerModel) -> tuple[str, str]:
    """The leaves (under blocks.L.) of the MLP's input and output that the model's blocks have, as
    analysis.transcoders maps circuit-tracer's `mlp.hook_in` and `hook_mlp_out`; a model without them is refused."""
    shapes = model.site_shapes()
    layers = model.config.num_hidden_layers
    found = []
    for leaves in (INPUT_HOOKS[INPUT_HOOK], OUTPUT_HOOKS[OUTPUT_HOOK]):
        leaf = next((leaf for leaf in leaves if all(f"blocks.{i}.{leaf}" in shapes for i in range(layers))), None)
        if leaf is None:
            raise usage_error(f"sae train --transcoder: {model.config.name}'s blocks have no {' or '.join(leaves)} "
                              "site (the MLP's input and output a transcoder maps)",
                              "tfcli config --sites lists the model's sites")
        found.append(leaf)
    return found[0], found[1]


# ------------------------------------------------------------------------------------------ the objective


def init_params(d: int, n: int, layers: int, first_y: Tensor, seed: int, with_skip: bool) -> dict[str, Tensor]:
    """Per layer: W_dec's rows random unit vectors (L, n, d), W_enc their transpose (L, d, n), b_enc 0, b_dec the mean
    of the first buffer's outputs `first_y` (L, N, d), W_skip (L, d, d) 0."""
    generator = torch.Generator().manual_seed(seed)
    w_dec = torch.randn(layers, n, d, generator=generator)
    w_dec /= w_dec.norm(dim=-1, keepdim=True)
    params = {"W_enc": w_dec.transpose(1, 2).contiguous(), "b_enc": torch.zeros(layers, n), "W_dec": w_dec,
              "b_dec": first_y.mean(1).cpu()}
    if with_skip:
        params["W_skip"] = torch.zeros(layers, d, d)
    return {name: value.to(first_y.device).requires_grad_() for name, value in params.items()}


def decode(w_dec: Tensor, indices: Tensor, values: Tensor) -> Tensor:
    """Sum over each token's (L, N, k) chosen features of value times decoder row: (L, N, d)."""
    layers, tokens, k = indices.shape
    n, d = w_dec.shape[1:]
    flat = (indices + (torch.arange(layers, device=indices.device) * n)[:, None, None]).reshape(-1, k)
    out = torch.nn.functional.embedding_bag(flat, w_dec.reshape(-1, d), per_sample_weights=values.reshape(-1, k),
                                            mode="sum")
    return out.reshape(layers, tokens, d)


def objective(params: dict[str, Tensor], x: Tensor, y: Tensor, k: int, dead: Tensor) -> dict[str, Tensor]:
    """The loss of a batch (inputs x, outputs y: (L, N, d)) and its parts per layer: `fvu` (L,), `auxk` (L,), `loss` =
    sum over layers of fvu + auxk / 32; the top-k `indices`, `values` (L, N, k). `dead` (L, n) marks dead latents."""
    pre = torch.baddbmm(params["b_enc"][:, None, :], x, params["W_enc"])  # (L, N, n)
    values, indices = pre.topk(k, dim=-1, sorted=False)
    values = torch.relu(values)
    recon = decode(params["W_dec"], indices, values) + params["b_dec"][:, None, :]
    if "W_skip" in params:
        recon = recon + torch.bmm(x, params["W_skip"].transpose(1, 2))
    error = y - recon
    variance = (y - y.mean(1, keepdim=True)).pow(2).sum((1, 2))
    fvu = error.pow(2).sum((1, 2)) / variance
    auxk = torch.zeros_like(fvu)
    counts = dead.sum(-1)
    most = int(counts.max())
    if most:
        k_aux = x.shape[-1] // 2
        scale = (counts.float() / k_aux).clamp(max=1.0)
        aux_values, aux_indices = pre.masked_fill(~dead[:, None, :], -math.inf).topk(min(k_aux, most), dim=-1,
                                                                                   sorted=False)
        guess = decode(params["W_dec"], aux_indices, torch.relu(aux_values))
        auxk = scale * (guess - error.detach()).pow(2).sum((1, 2)) / variance
    return {"loss": (fvu + AUXK_ALPHA * auxk).sum(), "fvu": fvu, "auxk": auxk, "indices": indices, "values": values}


def train_step(params: dict[str, Tensor], optimizer: torch.optim.Optimizer, since: Tensor, x: Tensor, y: Tensor,
               k: int, dead_after: int) -> float:
    """One step on a batch (x, y: (L, N, d)): the objective, each decoder row's gradient along the row removed, Adam,
    the rows back to unit norm; `since` (L, n) counts tokens since each latent last fired. The mean FVU over layers."""
    found = objective(params, x, y, k, since >= dead_after)
    unit_rows_step(optimizer, found["loss"], params["W_dec"])
    with torch.no_grad():
        fired = torch.zeros_like(since, dtype=torch.bool)
        layer = torch.arange(since.shape[0], device=since.device)[:, None, None].expand_as(found["indices"])
        chosen = found["values"] > 0
        fired[layer[chosen], found["indices"][chosen]] = True
        since += x.shape[1]
        since[fired] = 0
    return float(found["fvu"].detach().mean())


# ------------------------------------------------------------------------------------------ the written files


def saved_layers(params: dict[str, Tensor], scale_in: Tensor, scale_out: Tensor) -> list[dict[str, Tensor]]:
    """Each layer's transcoder on raw activations, in circuit-tracer's orientation: W_enc (n, d) and b_enc times
    s_out / s_in and s_out (the features in the output's units), W_dec (n, d) as trained (unit rows), b_dec times
    s_out, W_skip (d, d) times s_out / s_in. Top-k's choice is unchanged by the positive factor."""
    layers = []
    for i in range(params["W_enc"].shape[0]):
        ratio = float(scale_out[i] / scale_in[i])
        layer = {"W_enc": (params["W_enc"][i].detach().T * ratio).contiguous().cpu(),
                 "b_enc": (params["b_enc"][i].detach() * scale_out[i]).cpu(),
                 "W_dec": params["W_dec"][i].detach().contiguous().cpu(),
                 "b_dec": (params["b_dec"][i].detach() * scale_out[i]).cpu()}
        if "W_skip" in params:
            layer["W_skip"] = (params["W_skip"][i].detach() * ratio).contiguous().cpu()
        layers.append(layer)
    return layers


def thresholds(pre: Tensor, k: int) -> Tensor:
    """Per feature, the JumpReLU threshold (n,) that best reproduces top-k on pre-activations `pre` (N, n): the
    fewest tokens where `pre > threshold` and "among the token's k largest, and positive" disagree; halfway between
    the two pre-activations it separates (no token sits on it), at least 0."""
    values, indices = pre.topk(k, dim=-1)
    chosen = torch.zeros_like(pre, dtype=torch.bool).scatter_(-1, indices, values > 0)
    ordered, order = pre.T.contiguous().sort(-1)  # (n, N): a feature's tokens in a row (sorting rows is faster)
    chosen_sorted = chosen.T.contiguous().gather(-1, order).long()
    count = pre.shape[0]
    below = torch.cat([chosen_sorted.new_zeros(pre.shape[1], 1), chosen_sorted.cumsum(-1)], -1)  # chosen in first j
    above_unchosen = (count - torch.arange(count + 1, device=pre.device))[None] - (below[:, -1:] - below)
    first = (below + above_unchosen).argmin(-1)  # fire on sorted positions >= first
    under = ordered.gather(-1, (first - 1).clamp(min=0)[:, None])[:, 0]
    over = ordered.gather(-1, first.clamp(max=count - 1)[:, None])[:, 0]
    middle = torch.where(first == count, 2 * under, (under + over) / 2)  # none fires: twice the largest
    return torch.where(first > 0, middle, torch.zeros_like(middle)).clamp(min=0)


def write_transcoders(out: Path, layers: list[dict[str, Tensor]], options: TranscoderOptions, input_leaf: str,
                      model: str) -> None:
    """circuit-tracer's set (config.yaml, layer_{i}.safetensors) and, in saelens/layer_{i}/, SAELens's
    jumprelu_(skip_)transcoder (cfg.json, sae_weights.safetensors)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(f"model_kind: transcoder_set\nfeature_input_hook: {INPUT_HOOK}\n"
                                     f"feature_output_hook: {OUTPUT_HOOK}\nscan: tfcli-{slug(model)}\n",
                                     encoding="utf-8")
    architecture = "jumprelu_skip_transcoder" if options.skip else "jumprelu_transcoder"
    for i, layer in enumerate(layers):
        save_file(layer, str(out / f"layer_{i}.safetensors"))
        folder = out / "saelens" / f"layer_{i}"
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {"W_enc": layer["W_enc"].T.contiguous(), "b_enc": layer["b_enc"], "W_dec": layer["W_dec"],
                   "b_dec": layer["b_dec"], "threshold": layer[THRESHOLD]}
        if "W_skip" in layer:
            tensors["W_skip"] = layer["W_skip"]
        save_file(tensors, str(folder / "sae_weights.safetensors"))
        d, n = tensors["W_enc"].shape
        config = {"d_in": d, "d_sae": n, "d_out": int(layer["b_dec"].shape[0]), "dtype": "float32", "device": "cpu",
                  "apply_b_dec_to_input": False, "normalize_activations": "none", "reshape_activations": "none",
                  "metadata": {"hook_name": hook_name(f"blocks.{i}.{input_leaf}"),
                               "hook_name_out": f"blocks.{i}.{OUTPUT_HOOK}", "model_name": model,
                               "context_size": options.context, "prepend_bos": True, "exclude_special_tokens": True,
                               "trained_with": "tfcli sae train --transcoder", "training_tokens": options.tokens,
                               "trained_k": options.k},
                  "architecture": architecture}
        (folder / "cfg.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)


# ------------------------------------------------------------------------------------------ the activations


class LastSiteReached(Exception):
    """Ends a pass at the last layer's output (read): the final norm and the head are not run."""


def pass_rows(model: TransformerModel, sites: list[str], windows: list[tuple[list[int], list[bool]]]) -> Tensor:
    """The sites' values (len(sites), N, d), float32, at the kept positions of one pass over `windows`."""
    seen: dict[str, Tensor] = {}
    keep = torch.tensor([w[1] for w in windows], device=model.device)

    def reader(site: str) -> Callable[[Tensor], None]:
        def read(value: Tensor) -> None:
            seen[site] = value[keep].float()
            if site == sites[-1]:
                raise LastSiteReached
        return read

    ids = torch.tensor([w[0] for w in windows], device=model.device)
    with torch.no_grad():
        try:
            model.run_with_hooks(ids, {site: reader(site) for site in sites})
        except LastSiteReached:
            pass
    return torch.stack([seen[site] for site in sites])


def kept(rows: Tensor, limits: Tensor) -> tuple[Tensor, int]:
    """rows (S, N, d) of the tokens whose norm at every site s is at most limits[s]; how many were left out."""
    ok = (rows.norm(dim=-1) <= limits[:, None]).all(0)
    return rows[:, ok], int((~ok).sum())


@dataclass
class Stream:
    """The model and sites a run reads, and its windows."""

    model: TransformerModel
    sites: list[str]  # the L inputs, then the L outputs
    windows: Windows
    pass_windows: int

    def fill(self, rows: int, limits: Tensor, progress: Callable[[int], None] | None = None,
             remember: list | None = None) -> tuple[Tensor | None, int, int]:
        """At least `rows` tokens' values (S, N, d) within `limits` (None for none), the windows taken, the tokens
        left out; the windows read are added to `remember` where given."""
        parts, count, start, dropped = [], 0, self.windows.read, 0
        while count < rows:
            batch = [w for w in (self.windows.next() for _ in range(self.pass_windows)) if w is not None]
            if not batch:
                break
            if remember is not None:
                remember.extend(batch)
            found, over = kept(pass_rows(self.model, self.sites, batch), limits)
            parts.append(found)
            count, dropped = count + found.shape[1], dropped + over
            if progress is not None:
                progress(count)
        return (torch.cat(parts, 1) if parts else None), self.windows.read - start, dropped

    def again(self, count: int, limits: Tensor) -> Tensor:
        """The values of the next `count` windows, in passes as the run first made them (a resumed buffer)."""
        parts = []
        for start in range(0, count, self.pass_windows):
            batch = [self.windows.next() for _ in range(min(self.pass_windows, count - start))]
            if any(w is None for w in batch):
                raise usage_error("--resume: the corpus is shorter than the one the run trained on",
                                  "give the same --file as the interrupted run")
            parts.append(kept(pass_rows(self.model, self.sites, batch), limits)[0])
        return torch.cat(parts, 1)


# ------------------------------------------------------------------------------------------ the run


@dataclass
class State:
    """Where a run is (see core.State): parameters, Adam, counters, scales, and the stream's position."""

    params: dict[str, Tensor] | None = None
    optimizer: torch.optim.Adam | None = None
    since: Tensor | None = None
    scale_in: Tensor | None = None  # (L,)
    scale_out: Tensor | None = None
    threshold: Tensor | None = None  # (L, n), of the last buffer trained on
    steps: int = 0
    held_windows: int = 0
    next_window: int = 0
    buffers: int = 0
    current: list[int] | None = None
    digest: str = ""
    outliers: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)


def train(model: TransformerModel, tokenizer: Tokenizer, texts: Iterable[list[str]], options: TranscoderOptions,
          out: Path, resume: dict[str, Any] | None = None,
          progress: Callable[..., None] | None = None) -> TranscodersTrained:
    """Train (or continue from `resume`, a checkpoint) a transcoder per layer on the texts (batches of strings), write
    them to `out`, and give each layer's figures on the held-out tokens. Ctrl-C after the first step saves the
    checkpoint and gives the run so far."""
    input_leaf, output_leaf = transcoder_sites(model)
    n_layers, d = model.config.num_hidden_layers, model.config.hidden_size
    sites = [f"blocks.{i}.{input_leaf}" for i in range(n_layers)] + \
        [f"blocks.{i}.{output_leaf}" for i in range(n_layers)]
    total_steps = options.tokens // options.batch
    stream = Stream(model, sites, Windows(texts, tokenizer, model, options.context), options.pass_windows)
    state = State() if resume is None else restored(resume, d, n_layers, options, model)
    everything = 2 * options.held_out + total_steps * options.batch

    def tell(done: int) -> None:
        if progress is not None:
            progress(min(done, everything), everything, f"FVU {state.history[-1][1]:.3f}" if state.history else "")

    no_limit = torch.full((2 * n_layers,), math.inf, device=model.device)
    held_windows: list[tuple[list[int], list[bool]]] = []
    held, state.held_windows, _ = stream.fill(options.held_out, no_limit,
                                              lambda rows: tell(min(rows, options.held_out)), held_windows)
    if held is None:
        raise usage_error("the corpus gave no tokens to train on", "give a longer --file")
    norms = held[:, :options.held_out].norm(dim=-1)
    limits = norms.median(dim=1).values * options.outlier if options.outlier else no_limit
    del held, norms
    started, start_steps = time.monotonic(), state.steps

    def step(buffer: Tensor, taken: Tensor) -> float:
        if state.params is None:
            begin(state, buffer, d, n_layers, options)
        rows = buffer[:, taken]
        x, y = rows[:n_layers] / state.scale_in[:, None, None], rows[n_layers:] / state.scale_out[:, None, None]
        return train_step(state.params, state.optimizer, state.since, x, y, options.k, options.dead_tokens)

    last, ran_out, interrupted = train_buffers(
        state, options, stream.windows, resume is not None,
        fill=lambda rows, told: stream.fill(rows, limits, told), again=lambda count: stream.again(count, limits),
        step=step, tell=tell)
    seconds = time.monotonic() - started
    layers = saved_layers(state.params, state.scale_in, state.scale_out)
    if last is not None:  # thresholds from the last buffer trained on (a resumed run with no step left keeps its own)
        state.threshold = torch.stack([thresholds(last[i] @ layer["W_enc"].T.to(last.device) +
                                                  layer["b_enc"].to(last.device), options.k).cpu()
                                       for i, layer in enumerate(layers)])
    for i, layer in enumerate(layers):
        layer[THRESHOLD] = state.threshold[i].contiguous()
    del last
    write_transcoders(out, layers, options, input_leaf, model.config.name)
    save_checkpoint(out, state, options, d, n_layers, model.config.name)
    figures, held_count, held_outliers = evaluate(stream, held_windows, options.held_out, layers, options.k, limits,
                                                  lambda rows: tell(everything - options.held_out + rows))
    dead_training = (state.since >= options.dead_tokens).sum(-1).tolist()
    for figure, dead in zip(figures, dead_training):
        figure.dead_in_training = int(dead)
    before = resume["steps"] * options.batch if resume else None
    return TranscodersTrained(str(out), f"blocks.L.{input_leaf}", f"blocks.L.{output_leaf}", INPUT_HOOK, OUTPUT_HOOK,
                              n_layers, d, options.latents, options.k, options.skip, state.steps * options.batch,
                              state.steps, options.batch, options.learning_rate, seconds,
                              (state.steps - start_steps) * options.batch / max(seconds, 1e-9), held_count,
                              (state.history[-1][1] if state.history else math.nan) if not state.pending
                              else sum(state.pending) / len(state.pending), figures, state.outliers, held_outliers,
                              before, ran_out, interrupted, list(state.history))


def begin(state: State, first: Tensor, d: int, n_layers: int, options: TranscoderOptions) -> None:
    """Scales, parameters, Adam and counters from the first buffer (2L, N, d)."""
    scales = first.norm(dim=-1).mean(1) / math.sqrt(d)
    state.scale_in, state.scale_out = scales[:n_layers], scales[n_layers:]
    state.params = init_params(d, options.latents, n_layers, first[n_layers:] / state.scale_out[:, None, None],
                               options.seed, options.skip)
    state.optimizer = torch.optim.Adam(list(state.params.values()), lr=options.learning_rate, fused=True, **ADAM)
    state.since = torch.zeros(n_layers, options.latents, dtype=torch.int64, device=first.device)


def evaluate(stream: Stream, windows: list[tuple[list[int], list[bool]]], held_out: int,
             layers: list[dict[str, Tensor]], k: int, limits: Tensor, progress: Callable[[int], None]
             ) -> tuple[list[LayerFigures], int, int]:
    """Each layer's figures on the held-out tokens (the first `held_out` kept positions of `windows`, run again, those
    within `limits`): the written JumpReLU's explained variance of the MLP output, L0 and dead features, and top-k's
    explained variance; the tokens counted and those left out."""
    n_layers = len(layers)
    device = stream.model.device
    weights = [{name: value.to(device) for name, value in layer.items()} for layer in layers]
    n, d = layers[0]["W_dec"].shape
    sse = torch.zeros(n_layers, dtype=torch.float64)
    sse_topk = torch.zeros(n_layers, dtype=torch.float64)
    y_sum = torch.zeros(n_layers, d, dtype=torch.float64)
    y_square = torch.zeros(n_layers, dtype=torch.float64)
    l0 = torch.zeros(n_layers, dtype=torch.float64)
    active = torch.zeros(n_layers, n, dtype=torch.bool)
    seen = count = dropped = 0
    for start in range(0, len(windows), stream.pass_windows):
        if seen >= held_out:
            break
        rows = pass_rows(stream.model, stream.sites, windows[start:start + stream.pass_windows])
        rows = rows[:, :held_out - seen]
        seen += rows.shape[1]
        rows, over = kept(rows, limits)
        dropped += over
        count += rows.shape[1]
        for i, w in enumerate(weights):
            x, y = rows[i], rows[n_layers + i]
            pre = x @ w["W_enc"].T + w["b_enc"]
            acts = pre * (pre > w[THRESHOLD])
            skip_out = x @ w["W_skip"].T if "W_skip" in w else 0
            recon = acts @ w["W_dec"] + w["b_dec"] + skip_out
            values, indices = pre.topk(k, dim=-1)
            top = torch.zeros_like(pre).scatter_(-1, indices, torch.relu(values))
            recon_topk = top @ w["W_dec"] + w["b_dec"] + skip_out
            sse[i] += (y - recon).double().pow(2).sum().cpu()
            sse_topk[i] += (y - recon_topk).double().pow(2).sum().cpu()
            y_sum[i] += y.double().sum(0).cpu()
            y_square[i] += y.double().pow(2).sum().cpu()
            l0[i] += float((acts > 0).sum())
            active[i] |= (acts > 0).any(0).cpu()
        progress(seen)
    variance = y_square - y_sum.pow(2).sum(-1) / max(count, 1)
    figures = [LayerFigures(i, float(1 - sse[i] / variance[i]), float(1 - sse_topk[i] / variance[i]),
                            float(l0[i]) / max(count, 1), int((~active[i]).sum()), 0) for i in range(n_layers)]
    return figures, count, dropped


# ------------------------------------------------------------------------------------------ the checkpoint


def save_checkpoint(out: Path, state: State, options: TranscoderOptions, d: int, n_layers: int, model: str) -> None:
    """training.pt: everything `--resume` needs (tensors, numbers and strings only)."""
    data = {"format": FORMAT, "options": asdict(options), "d_in": d, "layers": n_layers, "model": model,
            "params": {name: value.detach().cpu() for name, value in state.params.items()},
            "optimizer": state.optimizer.state_dict(), "since": state.since.cpu(), "scale_in": state.scale_in.cpu(),
            "scale_out": state.scale_out.cpu(), "threshold": state.threshold.cpu(), "steps": state.steps,
            "held_windows": state.held_windows, "next_window": state.next_window, "buffers": state.buffers,
            "current": state.current, "digest": state.digest, "history": state.history, "outliers": state.outliers,
            "pending": state.pending}
    write_checkpoint(out, data)


def restored(data: dict[str, Any], d: int, n_layers: int, options: TranscoderOptions, model: TransformerModel
             ) -> State:
    """The State a checkpoint holds, on the model's device."""
    if data["d_in"] != d or data["layers"] != n_layers or data["model"] != model.config.name:
        raise usage_error(f"--resume: the checkpoint is of {data['model']} ({data['layers']} layers, {data['d_in']} "
                          f"wide), not of {model.config.name}", "give the model the run trained", parameter="resume")
    device = model.device
    params = {name: value.to(device).requires_grad_() for name, value in data["params"].items()}
    optimizer = torch.optim.Adam(list(params.values()), lr=options.learning_rate, fused=True, **ADAM)
    optimizer.load_state_dict(data["optimizer"])
    return State(params, optimizer, data["since"].to(device), data["scale_in"].to(device),
                 data["scale_out"].to(device), data["threshold"], data["steps"], data["held_windows"],
                 data["next_window"], data["buffers"], data["current"], data["digest"], data["outliers"],
                 [tuple(entry) for entry in data["history"]], list(data["pending"]))


def options_of(data: dict[str, Any]) -> TranscoderOptions:
    return TranscoderOptions(**data["options"])
