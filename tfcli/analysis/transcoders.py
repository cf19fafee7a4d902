"""Per-layer transcoders as circuit-tracer writes them, and what they compute.

A set is a folder with `config.yaml` (`model_kind: transcoder_set`, `feature_input_hook`, `feature_output_hook`,
`scan`; optionally `transcoders:`, a list of layer files) and one file per layer, `layer_{i}.safetensors`, holding
`W_enc` (F, d), `b_enc` (F,), `W_dec` (F, d), `b_dec` (d,), optionally `activation_function.threshold` (F,) (JumpReLU:
pre * (pre > threshold)) and `W_skip` (d, d) (skip = x @ W_skip.T); without a threshold the activation is a ReLU.
These are circuit-tracer 0.5.0's `SingleLayerTranscoder.encode`/`decode` (transcoder/single_layer_transcoder.py).

The hooks are TransformerLens names, mapped onto tfcli's sites as circuit-tracer maps them onto transformers'
modules (utils/tl_nnsight_mapping.py): the input `mlp.hook_in` is the MLP's normalised input (`mlp_norm.out`),
`hook_resid_mid` the residual stream before the MLP's norm (`resid_mid`); the output `hook_mlp_out` is what the MLP
sublayer adds to the residual stream (`mlp_output_norm.out` where a sandwich block normalises it, else `mlp.out`),
`mlp.hook_out` the MLP's own output (`mlp.out`). Other hooks are refused by name (`ln2.hook_normalized` among them:
circuit-tracer reads it as the norm's output before its weight, which tfcli has no site for).

A cross-layer transcoder (config.yaml's `model_kind: cross_layer_transcoder`, `W_enc_{i}` / `W_dec_{i}` files,
cross_layer_tensors) is read into the same `Transcoders`, `cross_layer`, each layer's W_dec (F, L - i, d); the
graph's commands/graph/cross_layer.py runs it. SAELens's and sparsify's sets (a folder per layer) are read by
commands/graph/transcoder_sets.py into a `Transcoders` of circuit-tracer's tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.errors import file_error, usage_error

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch import Tensor

    from tfcli.config import ModelConfig

INPUT_HOOKS = {"mlp.hook_in": ("mlp_norm.out",), "hook_resid_mid": ("resid_mid",), "hook_mlp_in": ("resid_mid",)}
OUTPUT_HOOKS = {"hook_mlp_out": ("mlp_output_norm.out", "mlp.out"), "mlp.hook_out": ("mlp.out",)}
THRESHOLD = "activation_function.threshold"
OPTION = "--transcoders"
SET_FORMATS = "circuit-tracer's (config.yaml and layer_0.safetensors, layer_1.safetensors, ...), or a folder per " \
              "layer of SAELens's (cfg.json + sae_weights.safetensors) or sparsify's (layers.L.mlp/cfg.json + " \
              "sae.safetensors)"


@dataclass
class Transcoders:
    """One transcoder per layer: layer l's features read `input_site(l)` and write `output_site(l)`."""

    path: str
    scan: str | list[str] | None
    input_hook: str
    output_hook: str
    layers: list[dict[str, Tensor]]  # W_enc (F, d), b_enc (F,), W_dec (F, d), b_dec (d,); threshold (F,), W_skip (d, d)
    input_leaf: str = ""  # set by place_transcoders: the leaf under blocks.{l}. that the model has
    output_leaf: str = ""
    format: str = "circuit-tracer"  # circuit-tracer | saelens | sparsify
    cross_layer: bool = False  # circuit-tracer's CLT: layer i's W_dec (F, L - i, d) writes layers i, i + 1, ...
    k: int | None = None  # sparsify: top-k of relu(pre) (or, with groupmax, the largest of each of k groups)
    groupmax: bool = False

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.layers[0]["W_enc"].shape[1])

    @property
    def d_transcoder(self) -> int:
        return int(self.layers[0]["W_enc"].shape[0])

    @property
    def skip(self) -> bool:
        return "W_skip" in self.layers[0]

    @property
    def jumprelu(self) -> bool:
        return THRESHOLD in self.layers[0]

    def input_site(self, layer: int) -> str:
        return f"blocks.{layer}.{self.input_leaf}"

    def output_site(self, layer: int) -> str:
        return f"blocks.{layer}.{self.output_leaf}"

    @property
    def activation(self) -> str:
        if self.k is not None:
            return f"{'groupmax' if self.groupmax else 'topk'} (k {self.k})"
        return "jumprelu" if self.jumprelu else "relu"

    def reconstructions(self, acts: list[Tensor], xs: list[Tensor]) -> list[Tensor]:
        """Every layer's reconstruction (T, d) from every layer's activations (T, F) and inputs (T, d): a per-layer
        set's decode; a cross-layer transcoder's b_dec[j] + sum over i <= j of acts[i] @ W_dec_i[:, j - i]."""
        if not self.cross_layer:
            return [self.decode(layer, act, x) for layer, (act, x) in enumerate(zip(acts, xs))]
        return [self.layers[j]["b_dec"] + sum(acts[i] @ self.layers[i]["W_dec"][:, j - i] for i in range(j + 1))
                for j in range(self.n_layers)]

    def described(self) -> dict:
        return {"path": self.path, "format": self.format, "cross_layer": self.cross_layer, "scan": self.scan,
                "layers": self.n_layers, "d_model": self.d_model, "d_transcoder": self.d_transcoder,
                "activation": self.activation,
                "skip": self.skip, "feature_input_hook": self.input_hook, "feature_output_hook": self.output_hook,
                "input_site": self.input_site(0).replace(".0.", ".L."),
                "output_site": self.output_site(0).replace(".0.", ".L.")}

    def preactivations(self, layer: int, x: Tensor) -> Tensor:
        """x (..., d) -> the encoder's pre-activations (..., F), float32."""
        w = self.layers[layer]
        return x.float() @ w["W_enc"].T + w["b_enc"]

    def encode(self, layer: int, x: Tensor) -> Tensor:
        """x (..., d) -> activations (..., F): JumpReLU pre * (pre > threshold), ReLU, or sparsify's top-k of
        relu(pre) (groupmax: the largest of each of k groups)."""
        import torch

        pre = self.preactivations(layer, x)
        if THRESHOLD in self.layers[layer]:
            return pre * (pre > self.layers[layer][THRESHOLD]).to(pre.dtype)
        if self.k is None:
            return torch.relu(pre)
        positive = torch.relu(pre)
        if self.groupmax:
            values, indices = positive.unflatten(-1, (self.k, -1)).max(dim=-1)
            indices = indices + torch.arange(0, pre.shape[-1], pre.shape[-1] // self.k, device=pre.device)
        else:
            values, indices = torch.topk(positive, self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values)

    def skip_of(self, layer: int, x: Tensor) -> Tensor | None:
        """The skip connection's output x @ W_skip.T (..., d), or None without one."""
        w = self.layers[layer]
        return x @ w["W_skip"].T.to(x.dtype) if "W_skip" in w else None

    def decode(self, layer: int, acts: Tensor, x: Tensor) -> Tensor:
        """acts (..., F), the input x (..., d) -> the reconstruction (..., d): acts @ W_dec + b_dec (+ skip)."""
        w = self.layers[layer]
        out = acts @ w["W_dec"] + w["b_dec"]
        skip = self.skip_of(layer, x.float())
        return out if skip is None else out + skip


# ------------------------------------------------------------------------------------------ reading the files


def read_transcoders(path: str | Path) -> Transcoders:
    """The set in folder `path`; one TfcliError naming what is wrong: no folder, no or unreadable config.yaml,
    another model kind, a hook with no site, a missing layer file, tensors missing or of disagreeing shapes."""
    folder = Path(path)
    if not folder.is_dir():
        raise file_error(f"{OPTION} {path}: no such folder", f"give a transcoder set's folder: {SET_FORMATS}")
    config = read_config(folder / "config.yaml")
    kind = config.get("model_kind")
    if kind not in ("transcoder_set", "cross_layer_transcoder"):
        raise file_error(f"{OPTION} {path}: config.yaml's model_kind is {kind!r}, not 'transcoder_set' or "
                         "'cross_layer_transcoder'")
    hooks = []
    for key, known in (("feature_input_hook", INPUT_HOOKS), ("feature_output_hook", OUTPUT_HOOKS)):
        hook = config.get(key)
        if not isinstance(hook, str) or not hook:
            raise file_error(f"{OPTION} {path}: config.yaml has no {key}")
        if hook not in known:
            raise file_error(f"{OPTION} {path}: the {key} {hook} maps to no tfcli site",
                              f"hooks tfcli reads: {', '.join(known)}")
        hooks.append(hook)
    if kind == "cross_layer_transcoder":
        return Transcoders(str(folder), config.get("scan"), hooks[0], hooks[1], cross_layer_tensors(folder),
                           cross_layer=True)
    files = layer_files(folder, config)
    layers = [layer_tensors(file) for file in files]
    check_layers(str(folder), layers)
    return Transcoders(str(folder), config.get("scan"), hooks[0], hooks[1], layers)


def cross_layer_tensors(folder: Path) -> list[dict[str, Tensor]]:
    """circuit-tracer's cross-layer transcoder (CrossLayerTranscoder.to_safetensors, load_clt): per layer i,
    `W_enc_{i}.safetensors` (W_enc_{i} (F, d), b_enc_{i} (F,), b_dec_{i} (d,), optionally threshold_{i} (F,)) and
    `W_dec_{i}.safetensors` (W_dec_{i} (F, L - i, d): layer i's features write every layer from i on) -> each
    layer's W_enc, b_enc, b_dec, threshold and W_dec (F, L - i, d)."""
    numbers = [int(found.group(1)) for child in folder.iterdir()
               if (found := re.fullmatch(r"W_enc_(\d+)\.safetensors", child.name))]
    if not numbers:
        raise file_error(f"{OPTION} {folder}: a cross-layer transcoder with no W_enc_0.safetensors there")
    count = max(numbers) + 1
    layers = []
    for i in range(count):
        weights = {}
        for stem in ("W_enc", "W_dec"):
            file = folder / f"{stem}_{i}.safetensors"
            if not file.is_file():
                raise file_error(f"{OPTION} {folder}: the cross-layer transcoder's {file.name} is missing",
                                 "it has W_enc_{i} and W_dec_{i} files for every layer, from 0")
            weights |= layer_tensors(file, ())
        names = {f"W_enc_{i}": "W_enc", f"b_enc_{i}": "b_enc", f"b_dec_{i}": "b_dec", f"W_dec_{i}": "W_dec",
                 f"threshold_{i}": THRESHOLD}
        missing = [name for name in names if name not in weights and not name.startswith("threshold")]
        if missing:
            raise file_error(f"{OPTION} {folder}: layer {i}'s files lack {', '.join(missing)}")
        layers.append({names[name]: value for name, value in weights.items() if name in names})
    features, width = (int(size) for size in layers[0]["W_enc"].shape) if layers[0]["W_enc"].dim() == 2 else (0, 0)
    for i, weights in enumerate(layers):
        shapes = {"W_enc": (features, width), "b_enc": (features,), "b_dec": (width,), THRESHOLD: (features,),
                  "W_dec": (features, count - i, width)}
        wrong = [f"{name} {tuple(weights[name].shape)} (expected {shape})" for name, shape in shapes.items()
                 if name in weights and tuple(weights[name].shape) != shape]
        if wrong or not features or (THRESHOLD in weights) != (THRESHOLD in layers[0]):
            raise file_error(f"{OPTION} {folder}: layer {i}'s tensors do not fit: {'; '.join(wrong) or 'threshold'}")
    return layers


def read_config(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise file_error(f"{OPTION} {path.parent}: no config.yaml there, nor a folder per layer with cfg.json",
                          f"a transcoder set is {SET_FORMATS}")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise file_error(f"{OPTION}: {path} is not readable YAML: {first}") from None
    if not isinstance(config, dict):
        raise file_error(f"{OPTION}: {path} holds no YAML mapping (model_kind, feature_input_hook, ...)")
    return config


def layer_files(folder: Path, config: dict) -> list[Path]:
    """The layer files in order: config.yaml's `transcoders:` list (paths relative to the folder), else
    layer_0.safetensors, layer_1.safetensors, ... up to the highest present (a gap is a missing file)."""
    listed = config.get("transcoders")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(item, str) for item in listed):
            raise file_error(f"{OPTION} {folder}: config.yaml's transcoders is not a list of paths")
        if any(item.startswith("hf://") for item in listed):
            raise file_error(f"{OPTION} {folder}: config.yaml names hf:// files, which tfcli does not download",
                              "download them and list local paths")
        files = [folder / item for item in listed]
    else:
        numbers = [int(found.group(1)) for child in folder.iterdir()
                   if (found := re.fullmatch(r"layer_(\d+)\.safetensors", child.name))]
        if not numbers:
            raise file_error(f"{OPTION} {folder}: no layer_0.safetensors there")
        files = [folder / f"layer_{i}.safetensors" for i in range(max(numbers) + 1)]
    for file in files:
        if not file.is_file():
            raise file_error(f"{OPTION} {folder}: the layer file {file.name} is missing",
                              "a transcoder set has one file per layer, from layer_0")
    return files


def layer_tensors(file: Path, needed: tuple[str, ...] = ("W_enc", "b_enc", "W_dec", "b_dec")) -> dict[str, Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = {name: value.float() for name, value in load_file(str(file)).items()}
    except (SafetensorError, OSError) as error:
        raise file_error(f"{OPTION}: {file} is not a readable safetensors file: {error}") from None
    missing = [name for name in needed if name not in weights]
    if missing:
        raise file_error(f"{OPTION}: {file} lacks {', '.join(missing)}",
                          f"it holds {', '.join(sorted(weights)) or 'no tensors'}")
    return weights


def check_layers(path: str, layers: list[dict[str, Tensor]]) -> None:
    """Every layer's tensors of the shapes layer 0's W_enc (F, d) implies."""
    features, width = (int(size) for size in layers[0]["W_enc"].shape) if layers[0]["W_enc"].dim() == 2 else (0, 0)
    if not features or not width:
        raise file_error(f"{OPTION} {path}: layer 0's W_enc is {tuple(layers[0]['W_enc'].shape)}, not (features, d)")
    shapes = {"W_enc": (features, width), "b_enc": (features,), "W_dec": (features, width), "b_dec": (width,),
              THRESHOLD: (features,), "W_skip": (width, width)}
    for layer, weights in enumerate(layers):
        wrong = [f"{name} {tuple(weights[name].shape)} (expected {shape})" for name, shape in shapes.items()
                 if name in weights and tuple(weights[name].shape) != shape]
        if wrong:
            raise file_error(f"{OPTION} {path}: layer {layer}'s tensors do not fit: {'; '.join(wrong)}")
        if (THRESHOLD in weights) != (THRESHOLD in layers[0]) or ("W_skip" in weights) != ("W_skip" in layers[0]):
            raise file_error(f"{OPTION} {path}: layer {layer} differs from layer 0 in its activation or skip")


def check_transcoders(transcoders: Transcoders, config: ModelConfig) -> None:
    """The set against the model's config, before the model is built: a decoder, one transcoder per layer, as wide as
    the model. Where its hooks are in the model's blocks is `place_transcoders`' work, once the model is built."""
    if config.architecture != "decoder":
        raise usage_error(f"{OPTION}: {config.name} is an {config.architecture}; attribution graphs are for decoders",
                          "use a decoder-only model")
    if transcoders.n_layers != config.num_hidden_layers:
        raise file_error(f"{OPTION} {transcoders.path}: {transcoders.n_layers} layers of transcoders, but "
                          f"{config.name} has {config.num_hidden_layers} blocks", "transcoders trained on this model")
    if transcoders.d_model != config.hidden_size:
        raise file_error(f"{OPTION} {transcoders.path}: the transcoders read {transcoders.d_model} values per token, "
                          f"but {config.name} is {config.hidden_size} wide", "transcoders trained on this model")


def place_transcoders(transcoders: Transcoders, config: ModelConfig, names: Iterable[str]) -> None:
    """Sets the sites' leaves: each hook's first leaf that every block of the model has, `names` being the model's
    site names (found by a pass of the model itself: a pass on the meta device before it is built costs a second of
    imports)."""
    names = set(names)
    for attribute, hook, leaves in (("input_leaf", transcoders.input_hook, INPUT_HOOKS[transcoders.input_hook]),
                                    ("output_leaf", transcoders.output_hook, OUTPUT_HOOKS[transcoders.output_hook])):
        found = next((leaf for leaf in leaves if all(f"blocks.{layer}.{leaf}" in names
                                                       for layer in range(config.num_hidden_layers))), None)
        if found is None:
            raise file_error(f"{OPTION} {transcoders.path}: {hook} maps to {' or '.join(leaves)}, which "
                              f"{config.name}'s blocks do not have", "tfcli config --sites lists the model's sites")
        setattr(transcoders, attribute, found)


def layer_sae_fields(file: Path) -> dict:
    """One layer of a set (`layer_{i}.safetensors` beside config.yaml) as the fields of an `analysis.sae.SAE`, which
    `features` and `attribute --sae` read: a (jumprelu_, skip_)transcoder from the input hook's site to the MLP's
    output."""
    found = re.fullmatch(r"layer_(\d+)\.safetensors", file.name)
    if not found:
        raise file_error(f"--sae {file}: a circuit-tracer transcoder set; give one layer's file, layer_N.safetensors")
    config = read_config(file.parent / "config.yaml")
    weights = layer_tensors(file)
    layer = int(found.group(1))
    saes = {"W_enc": weights["W_enc"].T.contiguous(), "b_enc": weights["b_enc"], "W_dec": weights["W_dec"],
            "b_dec": weights["b_dec"]}
    if THRESHOLD in weights:
        saes["threshold"] = weights[THRESHOLD]
    if "W_skip" in weights:
        saes["W_skip"] = weights["W_skip"]
    architecture = ("jumprelu_" if "threshold" in saes else "") + ("skip_" if "W_skip" in saes else "") + "transcoder"
    hook_in, hook_out = (str(config.get(key)) for key in ("feature_input_hook", "feature_output_hook"))
    return {"path": str(file), "format": "circuit-tracer", "architecture": architecture,
            "hook": f"blocks.{layer}.{hook_in}", "weights": saes, "hook_out": f"blocks.{layer}.{hook_out}",
            "apply_b_dec_to_input": False}
