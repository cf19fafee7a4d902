"""The tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens"), as
the `tuned-lens` package 0.2 defines it: one affine translator per block input, h -> h + A_l h + b_l, before the
final norm and the unembedding; `lens fit` trains it, `lens eval`, `encode` and `generate` read it (docs/lens.md).

Layer l (0 <= l < L, L the blocks) is the residual stream entering block l, `blocks.{l}.resid_pre` (`--save`'s
`hidden.{l}`; transformers' `hidden_states[l]`): 0 is the embeddings' output, l the output of block l - 1. The last
block's output is the model's own prediction and has no translator, as in `tuned-lens`.

The files: `tuned-lens`'s folder, as `TunedLens.save` writes it: `config.json` (`base_model_name_or_path`,
`d_model`, `num_hidden_layers`, `bias`, `base_model_revision`, `unembed_hash`, `lens_type`) and `params.pt`, the
state dict of its `layer_translators` (`{l}.weight` (d, d), `{l}.bias` (d): torch.nn.Linear's, weight[out, in]),
read with `torch.load(weights_only=True)` only. `unembed_hash` is `tuned-lens`'s hash of the unembedding matrix
(`utils.tensor_hash`: SHA-256 of numpy's summary of it at one decimal), checked against the model's.

The training is `tuned-lens`'s trainer's default (scripts/train_loop.py, scripts/ingredients.py): translators
initialised to zero (the identity lens), the loss the sum over layers of the mean KL(final || lens) over the
step's tokens, the gradient clipped to norm 1 over every translator together, SGD with Nesterov momentum 0.9,
learning rate 1.0 x (1 - 0.9) and weight decay 1e-3, decayed linearly to 0 over the run without warm-up. Not
theirs: float32 throughout (theirs autocasts to bfloat16), and the positions a training leaves out
(`analysis/corpus.py`: each window's first, the attention sink, and special tokens) are left out here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from tfcli.errors import TfcliError, usage_error
from tfcli.model.sites import hidden_site

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel

CONFIG, PARAMS = "config.json", "params.pt"
LENS_TYPE = "linear_tuned_lens"
MOMENTUM, WEIGHT_DECAY, LR_SCALE, CLIP = 0.9, 1e-3, 1.0, 1.0  # tuned-lens's Optimizer defaults, and its clip
LENS_VALUES = 2 ** 23  # most scores (rows x vocabulary) one lens product makes: 32 MB in float32


# ------------------------------------------------------------------------------------------ the lens


class Translators(nn.Module):
    """The L translators, stacked: translator l maps h (..., d) to h + h W_l^T + b_l (W (L, d, d), b (L, d) or
    None without bias). Zero: the identity, where the logit lens is."""

    def __init__(self, layers: int, d: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(layers, d, d))
        self.bias = nn.Parameter(torch.zeros(layers, d)) if bias else None

    def forward(self, hidden: Tensor, layer: int) -> Tensor:
        """Layer `layer`'s hidden states (..., d), translated, in float32."""
        h = hidden.float()
        out = h + h @ self.weight[layer].T
        return out + self.bias[layer] if self.bias is not None else out

    def state(self) -> dict[str, Tensor]:
        """tuned-lens's state dict of its layer_translators: {l}.weight, {l}.bias."""
        found = {}
        for layer in range(self.weight.shape[0]):
            found[f"{layer}.weight"] = self.weight[layer].detach().cpu().clone()
            if self.bias is not None:
                found[f"{layer}.bias"] = self.bias[layer].detach().cpu().clone()
        return found


@dataclass
class Lens:
    """A tuned lens as its folder holds it: the translators and tuned-lens's config (its keys)."""

    translators: Translators
    config: dict[str, Any]
    folder: str = ""

    @property
    def layers(self) -> int:
        return self.translators.weight.shape[0]

    def logits(self, model: TransformerModel, hidden: Tensor, layer: int) -> Tensor:
        """What layer `layer`'s hidden states (..., d) predict through the lens: translated, then through the final
        norm and the unembedding (model.unembed), (..., V); the last block's output (layer L) as it is."""
        if layer == self.layers:
            return model.unembed(hidden)
        weight = model.lm_head.unembed.weight
        return model.unembed(self.translators(hidden, layer).to(weight.dtype))

    def translated(self, hidden: list[Tensor], row: int, length: int) -> list[Tensor]:
        """Row `row`'s first `length` positions of each hidden state (hidden[l] (B, T, d), l = 0..L), translated
        (hidden[L] as it is), each (1, length, d) in its dtype: what the logit lens then reads as the tuned lens."""
        return [(self.translators(h[row:row + 1, :length], l).to(h.dtype) if l < self.layers else
                 h[row:row + 1, :length]) for l, h in enumerate(hidden)]

    def unembed(self, model: TransformerModel, hidden: Tensor, layers: list[int]) -> Tensor:
        """The logit lens's `model.unembed` of stacked hidden states (n, ..., d), row i of layer `layers[i]`, each
        translated first (layer L, the last block's output, as it is): one product with the unembedding, (n, ..., V).
        What encode's and generate's lens tables read with `--lens tuned:DIR`."""
        weight = model.lm_head.unembed.weight
        rows = [self.translators(h, layer).to(weight.dtype) if layer < self.layers else h
                for h, layer in zip(hidden, layers)]
        return model.unembed(torch.stack(rows))


def lens_folder(value: str, option: str = "--lens") -> Path | None:
    """--lens's value: `logit` (None: the logit lens) or `tuned:DIR` (the folder); anything else a usage error."""
    if value == "logit":
        return None
    if value.startswith("tuned:") and value[len("tuned:"):]:
        return Path(value[len("tuned:"):])
    raise usage_error(f"{option} {value}: give `logit` or `tuned:DIR` (a tuned lens's folder)",
                      "tfcli lens fit writes one; tuned-lens's folders are read too")


def check_lens(folder: Path, config: ModelConfig, option: str = "--lens") -> None:
    """Before the model is built: the model can take a lens, and the folder's config.json is a lens for it."""
    check_model(config, f"{option} tuned:{folder}")
    check_config(read_config(folder, option), config, folder, option)


def check_model(config: ModelConfig, what: str) -> None:
    """A tuned lens reads a decoder's LM head: anything else is refused by name, before any model is built."""
    if config.architecture != "decoder" or config.head != "lm":
        kind = f"an {config.architecture}" if config.architecture[0] == "e" else f"a {config.architecture}"
        head = {"lm": "an LM head", "mlm": "a masked-LM head", "none": "no head", "classifier": "a classifier head",
                "discriminator": "a discriminator head"}.get(config.head, f"a {config.head} head")
        raise usage_error(f"{what}: {config.name} is {kind} with {head}; a tuned lens reads a decoder's "
                          "predictions of the next token through its LM head", "give a decoder with an LM head (-m)")


def unembed_hash(model: TransformerModel) -> str:
    """tuned-lens's hash of the unembedding (utils.tensor_hash of Unembed.unembedding's weight, in float32)."""
    import numpy as np

    weight = model.lm_head.unembed.weight.detach().cpu().float().numpy()
    return hashlib.sha256(str.encode(np.array_str(weight, precision=1))).hexdigest()


def new_lens(model: TransformerModel, name: str, bias: bool = True) -> Lens:
    """The identity lens for `model` (tuned-lens's TunedLens.from_model), named `name`."""
    config = model.config
    layers, d = config.num_hidden_layers, config.hidden_size
    return Lens(Translators(layers, d, bias).to(model.device),
                {"base_model_name_or_path": name, "d_model": d, "num_hidden_layers": layers, "bias": bias,
                 "base_model_revision": None, "unembed_hash": unembed_hash(model), "lens_type": LENS_TYPE})


def write_lens(folder: Path, lens: Lens) -> None:
    """config.json and params.pt as tuned-lens's TunedLens.save writes them, each written whole then renamed."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / (PARAMS + ".partial")
    torch.save(lens.translators.state(), partial)
    partial.replace(folder / PARAMS)
    text = folder / (CONFIG + ".partial")
    text.write_text(json.dumps(lens.config), encoding="utf-8")
    text.replace(folder / CONFIG)


def read_config(folder: Path, option: str = "lens") -> dict[str, Any]:
    """A lens folder's config.json, checked: one error line for a missing folder or file, JSON that is not an
    object, and a key of the wrong kind or missing."""
    path = folder / CONFIG
    if not folder.is_dir():
        raise TfcliError(f"{option} {folder}: no such folder", "give a folder `tfcli lens fit` or tuned-lens wrote "
                         f"({CONFIG} and {PARAMS})")
    if not path.is_file():
        raise TfcliError(f"{option} {folder}: no {CONFIG} there", f"a tuned lens folder holds {CONFIG} and {PARAMS}, "
                         "as `tfcli lens fit` and tuned-lens write them")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise TfcliError(f"{path}: not JSON ({str(error).splitlines()[0][:120]})",
                         "a tuned lens's config.json, as tuned-lens writes it") from None
    if not isinstance(config, dict):
        raise TfcliError(f"{path}: not a tuned lens's config (a JSON object with d_model and num_hidden_layers)")
    for key in ("d_model", "num_hidden_layers"):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            said = "is missing" if key not in config else f"is {json.dumps(value)[:40]}, not a positive whole number"
            raise TfcliError(f"{path}: `{key}` {said}", "a tuned lens's config.json, as tuned-lens writes it")
    if not isinstance(config.get("bias", True), bool):
        raise TfcliError(f"{path}: `bias` is {json.dumps(config['bias'])[:40]}, not true or false")
    if config.get("lens_type", LENS_TYPE) != LENS_TYPE:
        raise TfcliError(f"{path}: lens_type {config['lens_type']!r}: tfcli reads {LENS_TYPE!r} lenses")
    return config


def check_config(config: dict[str, Any], model: ModelConfig, folder: Path, option: str = "lens") -> None:
    """The lens's width and layer count against the model's, before the model is built."""
    for key, theirs, what in (("d_model", model.hidden_size, "wide"), ("num_hidden_layers",
                                                                       model.num_hidden_layers, "blocks")):
        if config[key] != theirs:
            raise TfcliError(f"{option} {folder}: the lens is for a model of {config[key]} {what}; {model.name} has "
                             f"{theirs} ({key} differs)", "fit a lens for this model: tfcli lens fit")


def read_lens(folder: Path, model: TransformerModel, option: str = "lens") -> Lens:
    """The lens in `folder` (config.json, params.pt) for `model`: its width, layers and unembedding (tuned-lens's
    hash) checked, params.pt read as tensors only."""
    import pickle
    import warnings

    config = read_config(folder, option)
    check_config(config, model.config, folder, option)
    wanted = config.get("unembed_hash")
    if wanted and wanted != unembed_hash(model):
        raise TfcliError(f"{option} {folder}: the lens was fitted to another unembedding (its unembed_hash differs "
                         f"from {model.config.name}'s)", "fit a lens for this model: tfcli lens fit")
    path = folder / PARAMS
    if not path.is_file():
        raise TfcliError(f"{option} {folder}: no {PARAMS} there", f"a tuned lens folder holds {CONFIG} and {PARAMS}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise TfcliError(f"{path}: refused to load: it holds Python objects other than tensors; nothing in it was "
                         "run", "a tuned lens's params.pt holds its translators' tensors only") from None
    except Exception as error:  # noqa: BLE001  (a damaged file: zip or torch errors)
        raise TfcliError(f"{path}: cannot read it ({type(error).__name__}: {str(error).splitlines()[0][:120]})",
                         "the file is truncated or corrupted: fit or copy the lens again") from None
    layers, d, bias = config["num_hidden_layers"], config["d_model"], config.get("bias", True)
    expected = {f"{l}.{part}": shape for l in range(layers)
                for part, shape in (("weight", (d, d)), *((("bias", (d,)),) if bias else ()))}
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise TfcliError(f"{path}: does not hold a dictionary of tensors", "a tuned lens's params.pt, as "
                         "TunedLens.save writes it")
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k} {tuple(state[k].shape)}" for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    if missing or extra or wrong:
        said = "; ".join(part for part in (f"missing {', '.join(missing[:3])}" if missing else "",
                                           f"unexpected {', '.join(map(str, extra[:3]))}" if extra else "",
                                           f"of the wrong shape {', '.join(wrong[:3])}" if wrong else "") if part)
        raise TfcliError(f"{path}: not the translators of a lens of {layers} layers {d} wide ({said})")
    translators = Translators(layers, d, bias)
    with torch.no_grad():
        translators.weight.copy_(torch.stack([state[f"{l}.weight"].float() for l in range(layers)]))
        if bias:
            translators.bias.copy_(torch.stack([state[f"{l}.bias"].float() for l in range(layers)]))
    return Lens(translators.to(model.device).requires_grad_(False), config, str(folder))


# ------------------------------------------------------------------------------------------ the objective


def passes_hidden(model: TransformerModel, windows: list[tuple[list[int], list[bool]]]) -> tuple[Tensor, Tensor]:
    """One pass over `windows`: the hidden states entering each block (L, N, d) and the model's logits (N, V) at
    the kept positions (N of them)."""
    layers = model.config.num_hidden_layers
    ids = torch.tensor([w[0] for w in windows], device=model.device)
    keep = torch.tensor([w[1] for w in windows], device=model.device)
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names=[hidden_site(l) for l in range(layers)])
    return torch.stack([cache[hidden_site(l)][keep] for l in range(layers)]), logits[keep]


def chunks(rows: int, vocab: int) -> Iterator[slice]:
    step = max(1, LENS_VALUES // max(vocab, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


class Final:
    """The model's final distribution over some rows, what KL(final || lens) needs of it: log p (N, V), p, and
    sum p log p (N,)."""

    def __init__(self, logits: Tensor):
        self.logp = logits.float().log_softmax(-1)
        self.p = self.logp.exp()
        self.negentropy = (self.p * self.logp).sum(-1)

    def kl(self, part: slice, logits: Tensor) -> Tensor:
        """KL(final || softmax(logits)) of the rows `part`, in nats: sum p log p - sum p z + logsumexp z (sum p
        = 1), which needs neither log q nor q made whole (its gradient in z is q - p)."""
        z = logits.float()
        return self.negentropy[part] - (self.p[part] * z).sum(-1) + z.logsumexp(-1)


def accumulate(model: TransformerModel, lens: Lens, hidden: Tensor, logits: Tensor, rows: int) -> list[float]:
    """The gradient of sum over layers of KL(final || lens) summed over this pass's rows and divided by `rows` (the
    step's), added to the translators' .grad; each layer's summed KL (without the division)."""
    final = Final(logits)
    sums = []
    for layer in range(lens.layers):
        total = 0.0
        for part in chunks(hidden.shape[1], logits.shape[-1]):
            loss = final.kl(part, lens.logits(model, hidden[layer, part], layer)).sum()
            (loss / rows).backward()
            total += float(loss.detach())
        sums.append(total)
    return sums


def learning_rate(step: int, steps: int) -> float:
    """Step `step`'s (from 0) learning rate: tuned-lens's SGD default, LR_SCALE x (1 - momentum), decayed linearly
    to 0 over `steps` (transformers' get_linear_schedule_with_warmup without warm-up)."""
    return LR_SCALE * (1 - MOMENTUM) * max(0.0, (steps - step) / steps)


def optimizer_of(lens: Lens) -> torch.optim.SGD:
    return torch.optim.SGD([p for p in lens.translators.parameters()], lr=LR_SCALE * (1 - MOMENTUM),
                           momentum=MOMENTUM, nesterov=True, weight_decay=WEIGHT_DECAY)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C waits until the block ends (an update is made whole or not at all), then comes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: came.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


def update(lens: Lens, optimizer: torch.optim.SGD, lr: float) -> None:
    """The step after the gradients: clipped to norm CLIP over every translator, then SGD at `lr`."""
    with uninterrupted():
        torch.nn.utils.clip_grad_norm_(list(lens.translators.parameters()), CLIP)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)


# ------------------------------------------------------------------------------------------ evaluation


@dataclass
class Evaluation:
    """Per layer l (0 <= l < L, the residual stream entering block l) on held-out tokens: the mean KL in nats of
    the final distribution from the logit lens's and from the tuned lens's, and how often each lens's top token is
    the model's own."""

    tokens: int = 0
    kl_logit: list[float] = field(default_factory=list)
    kl_tuned: list[float] = field(default_factory=list)
    top1_logit: list[float] = field(default_factory=list)
    top1_tuned: list[float] = field(default_factory=list)


def evaluate(model: TransformerModel, lens: Lens, windows: list[tuple[list[int], list[bool]]], pass_windows: int = 8,
             progress: Callable[[int], None] | None = None) -> Evaluation:
    """The lens and the logit lens against the model's final distribution, over the kept tokens of `windows`."""
    layers = lens.layers
    sums = torch.zeros(4, layers, dtype=torch.float64)
    count = 0
    with torch.no_grad():
        for start in range(0, len(windows), pass_windows):
            hidden, logits = passes_hidden(model, windows[start:start + pass_windows])
            count += hidden.shape[1]
            final = Final(logits)
            for part in chunks(hidden.shape[1], logits.shape[-1]):
                top = final.logp[part].argmax(-1)
                for layer in range(layers):
                    for column, lensed in ((0, model.unembed(hidden[layer, part])),
                                           (1, lens.logits(model, hidden[layer, part], layer))):
                        sums[column, layer] += float(final.kl(part, lensed).double().sum())
                        sums[2 + column, layer] += float((lensed.argmax(-1) == top).sum())
            if progress is not None:
                progress(min(start + pass_windows, len(windows)))
    means = (sums / max(count, 1)).tolist()
    return Evaluation(count, *means)
