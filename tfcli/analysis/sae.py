"""Sparse dictionaries (SAEs and transcoders) read from the files people publish, and what they compute.

`read_sae(path)` sniffs a folder (or a file in it) and reads one of:

- SAELens: `cfg.json` + `sae_weights.safetensors` (`W_enc` (d_in, d_sae), `W_dec` (d_sae, d_out), `b_enc`, `b_dec`;
  `threshold` for jumprelu; `b_gate`, `r_mag`, `b_mag` for gated; `W_skip` (d_out, d_in) for skip transcoders),
  architectures standard, topk, batchtopk, jumprelu, gated, transcoder, skip_transcoder and the jumprelu
  transcoders; `apply_b_dec_to_input`, `normalize_activations`, `rescale_acts_by_decoder_norm`, `hook_name`,
  `hook_name_out` and `hook_head_index` honoured (a pre-6.0 config's names too);
- Gemma Scope: `params.npz` (jumprelu; the hook from the path: `layer_N` and the release's `res`/`mlp`/`att`);
  Gemma Scope 2: `params.safetensors` + `config.json` (`hf_hook_point_in`/`_out`, `affine_connection`);
- Llama Scope: `hyperparams.json` + `checkpoints/final.safetensors` (a scalar jumprelu threshold; the dataset's
  average input norm folded in as sae-lens 6.54's loader folds it: W_enc * s, W_dec / s, b_dec / s, threshold * s,
  s = sqrt(d_model) / norm_in);
- EleutherAI sparsify: `cfg.json` + `sae.safetensors` in a `layers.N` folder (`encoder.weight` (d_sae, d_in),
  `encoder.bias`, `W_dec` (d_sae, d_in), `b_dec`, `W_skip`; top-k or groupmax, `transcode`).

Every format becomes one `SAE`, whose `encode` and `decode` are sae-lens's (and sparsify's) formulas. The hook the
file names is mapped onto a tfcli site (`site_of`). Shapes: N rows (tokens), d_in, d_sae features, d_out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.errors import check_fields, file_error, usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig

ARCHITECTURES = ("standard", "topk", "batchtopk", "jumprelu", "gated", "transcoder", "skip_transcoder",
                 "jumprelu_transcoder", "jumprelu_skip_transcoder")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
FORMATS = "SAELens (cfg.json + sae_weights.safetensors), Gemma Scope (params.npz, or params.safetensors + " \
          "config.json), Llama Scope (hyperparams.json + checkpoints/final.safetensors) or sparsify (cfg.json + " \
          "sae.safetensors)"


@dataclass
class SAE:
    """A sparse dictionary: features = encode(x) (N, d_in) -> (N, d_sae), decode(features, x) -> (N, d_out). A
    transcoder reads one site (`site`) and stands for another (`site_out`); an SAE reconstructs its own."""

    path: str
    format: str  # saelens | gemmascope | gemmascope2 | llamascope | sparsify
    architecture: str  # one of ARCHITECTURES
    hook: str  # the input's name as the file gives it (blocks.3.hook_resid_post, model.layers.3.output, layers.3)
    weights: dict[str, Tensor]  # W_enc (d_in, d_sae), b_enc, W_dec (d_sae, d_out), b_dec (d_out), and the rest
    hook_out: str | None = None
    head: int | None = None  # hook_head_index: the SAE reads one head of attn.z
    k: int | None = None  # topk
    groupmax: bool = False  # sparsify's groupmax activation (k groups, the largest of each)
    apply_b_dec_to_input: bool = True
    normalize: str = "none"
    rescale_by_decoder_norm: bool = False
    model_name: str | None = None
    site: str = ""  # tfcli's site (site_of), set by read_sae or --site
    site_out: str = ""

    @property
    def d_in(self) -> int:
        return int(self.weights["W_enc"].shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.weights["W_enc"].shape[1])

    @property
    def d_out(self) -> int:
        return int(self.weights["W_dec"].shape[1])

    @property
    def transcoder(self) -> bool:
        return "transcoder" in self.architecture

    def described(self) -> dict[str, Any]:
        """What the views and records say about the dictionary."""
        return {"path": self.path, "format": self.format, "architecture": self.architecture, "hook": self.hook,
                "site": self.site, "hook_out": self.hook_out, "site_out": self.site_out or None, "head": self.head,
                "d_in": self.d_in, "d_sae": self.d_sae, "k": self.k}

    def encode(self, x: Tensor) -> Tensor:
        """Feature activations (N, d_sae) of inputs x (N, d_in), float32, as sae-lens's `encode` (sparsify's)."""
        import torch

        w = self.weights
        x = x.float()
        if self.transcoder:
            x = self.normalized(x)
        else:
            x = self.normalized(x) - (w["b_dec"] if self.apply_b_dec_to_input else 0)
        if self.architecture == "gated":
            active = (x @ w["W_enc"] + w["b_gate"]) > 0
            return active.to(x.dtype) * torch.relu(x @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"])
        pre = x @ w["W_enc"] + w["b_enc"]
        if "threshold" in w:  # jumprelu (and batchtopk as saved for inference)
            return torch.relu(pre) * (pre > w["threshold"]).to(pre.dtype)
        if self.k is None:
            return torch.relu(pre)
        if self.rescale_by_decoder_norm:
            pre = pre * w["W_dec"].norm(dim=-1)
        if self.groupmax:
            values, indices = torch.relu(pre).unflatten(-1, (self.k, -1)).max(dim=-1)
            indices = indices + torch.arange(0, pre.shape[-1], pre.shape[-1] // self.k, device=pre.device)
        else:
            values, indices = torch.topk(pre, self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, torch.relu(values))

    def decode(self, features: Tensor, x: Tensor) -> Tensor:
        """The reconstruction (N, d_out) from features (N, d_sae); x (N, d_in), the input, for the skip term and
        the normalisation's inverse."""
        w = self.weights
        if self.rescale_by_decoder_norm:
            features = features / w["W_dec"].norm(dim=-1)
        out = features @ w["W_dec"] + w["b_dec"]
        if "W_skip" in w:
            out = out + x.float() @ w["W_skip"].T
        return out if self.transcoder else self.denormalized(out, x.float())

    def normalized(self, x: Tensor) -> Tensor:
        """sae-lens's run-time normalisation of the input (`normalize_activations`)."""
        if self.normalize == "constant_norm_rescale":
            return x * (self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
        if self.normalize == "layer_norm":
            centred = x - x.mean(dim=-1, keepdim=True)
            return centred / (centred.std(dim=-1, keepdim=True) + 1e-5)
        return x

    def denormalized(self, out: Tensor, x: Tensor) -> Tensor:
        if self.normalize == "constant_norm_rescale":
            return out / ((self.d_in ** 0.5) / x.norm(dim=-1, keepdim=True))
        if self.normalize == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            return out * (x - mu).std(dim=-1, keepdim=True) + mu
        return out


# ------------------------------------------------------------------------------------------ reading the files


def read_sae(path: str | Path, site: str | None = None) -> SAE:
    """The dictionary at `path` (a folder, or a file in one), its hook mapped onto a tfcli site (`site` given
    overrides it). One TfcliError (exit 2) naming what does not fit: no such path, a folder of no known format, a
    missing weights file, an unknown architecture, a tensor missing or of the wrong shape, a hook with no site."""
    given = Path(path)
    if not given.exists():
        raise file_error(f"--sae {path}: no such file or folder", "give an SAE's folder: " + FORMATS)
    folder = given if given.is_dir() else given.parent
    files = {child.name for child in folder.iterdir()}
    if "config.yaml" in files and any(name.startswith("layer_") for name in files):  # circuit-tracer's set
        from tfcli.analysis.transcoders import layer_sae_fields

        sae = SAE(**layer_sae_fields(given))
    elif "hyperparams.json" in files:
        sae = llama_scope(folder)
    elif "params.npz" in files:
        sae = gemma_scope(folder)
    elif "params.safetensors" in files:
        sae = gemma_scope_2(folder)
    elif "cfg.json" in files:
        config = read_json(folder / "cfg.json")
        if "sae_weights.safetensors" in files or "architecture" in config or "d_sae" in config:
            sae = saelens(folder, config)
        else:
            sae = sparsify(folder, config)
    else:
        layers = sorted(child.name for child in folder.iterdir() if (child / "cfg.json").is_file())
        hint = f"give one of its layers' folders: {', '.join(layers[:6])}" if layers else "give an SAE's folder: " \
            + FORMATS
        raise file_error(f"--sae {path}: no SAE there (no cfg.json, params.npz, params.safetensors or "
                         "hyperparams.json)", hint)
    check_shapes(sae)
    if site is not None:
        sae.site, sae.site_out = site, (sae.site_out and site_out_of(site, sae))
    else:
        sae.site = site_of(sae.hook, sae)
        sae.site_out = site_of(sae.hook_out, sae, output=True) if sae.hook_out else ""
    return sae


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise file_error(f"--sae: {path} is not readable JSON: {error}") from None
    if not isinstance(data, dict):
        raise file_error(f"--sae: {path} holds no JSON object")
    return data


def tensors(path: Path, what: str) -> dict[str, Tensor]:
    """The tensors of a safetensors file (through the safetensors library), float32."""
    if not path.is_file():
        raise file_error(f"--sae: the weights file {path} is missing", f"a {what} SAE keeps its weights there")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return {name: value.float() for name, value in load_file(str(path)).items()}
    except (SafetensorError, OSError) as error:
        raise file_error(f"--sae: {path} is not a readable safetensors file: {error}") from None


def required(weights: dict, names: tuple[str, ...], path: Path) -> None:
    missing = [name for name in names if name not in weights]
    if missing:
        raise file_error(f"--sae: {path} lacks {', '.join(missing)}",
                         f"it holds {', '.join(sorted(weights)) or 'no tensors'}")


def saelens(folder: Path, config: dict) -> SAE:
    """SAELens's format (6.x, and the names of configs before 6.0)."""
    check_fields(config, {"architecture": str, "k": int, "activation_fn": str, "activation_fn_str": str,
                         "activation_fn_kwargs": dict, "normalize_activations": (str, bool), "hook_name": str,
                         "hook_point": str, "hook_name_out": str, "hook_head_index": int, "hook_point_head_index": int,
                         "apply_b_dec_to_input": bool, "rescale_acts_by_decoder_norm": bool, "model_name": str,
                         "d_in": int, "d_sae": int}, f"--sae {folder}", "cfg.json")
    metadata = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
    setting = lambda *names, default=None: next(  # noqa: E731
        (source[name] for name in names for source in (config, metadata) if source.get(name) is not None), default)
    architecture = config.get("architecture", "standard")
    k = setting("k")
    if setting("activation_fn", "activation_fn_str") == "topk" and architecture == "standard":
        architecture, k = "topk", (config.get("activation_fn_kwargs") or {}).get("k")
    if architecture not in ARCHITECTURES:
        raise file_error(f"--sae {folder}: unknown architecture {architecture!r}",
                         f"known: {', '.join(ARCHITECTURES)}")
    normalize = setting("normalize_activations", default="none")
    normalize = {True: "expected_average_only_in", False: "none"}.get(normalize, normalize)
    if normalize not in NORMALIZATIONS:
        raise file_error(f"--sae {folder}: normalize_activations {normalize!r} is not supported",
                         f"supported: {', '.join(NORMALIZATIONS)}")
    weights = tensors(folder / "sae_weights.safetensors", "SAELens")
    if "log_threshold" in weights:
        weights["threshold"] = weights.pop("log_threshold").exp()
    scaling = weights.pop("scaling_factor", weights.pop("finetuning_scaling_factor", None))
    if scaling is not None and not bool((scaling == 1).all()):
        raise file_error(f"--sae {folder}: a finetuning scaling factor other than 1 is not supported")
    if architecture == "batchtopk" and "threshold" not in weights:
        if "topk_threshold" not in weights:
            raise file_error(f"--sae {folder}: a batchtopk SAE needs `threshold` or `topk_threshold`")
        weights["threshold"] = weights.pop("topk_threshold").expand(weights["b_enc"].shape).clone()
    needs = {"gated": ("W_enc", "W_dec", "b_dec", "b_gate", "r_mag", "b_mag")}.get(
        architecture, ("W_enc", "W_dec", "b_enc", "b_dec"))
    needs += ("threshold",) if architecture.startswith("jumprelu") or architecture == "batchtopk" else ()
    needs += ("W_skip",) if architecture.endswith("skip_transcoder") else ()
    required(weights, needs, folder / "sae_weights.safetensors")
    for name, size, what in (("d_in", weights["W_enc"].shape[0], "read"), ("d_sae", weights["W_enc"].shape[1], "have")):
        if setting(name) not in (None, size):
            raise file_error(f"--sae {folder}: cfg.json gives {name} {setting(name)}, but its weights {what} {size} "
                             f"{'values' if name == 'd_in' else 'features'}", "a cfg.json of another SAE?")
    if architecture == "topk" and not isinstance(k, int):
        raise file_error(f"--sae {folder}: a topk SAE's cfg.json gives no k")
    hook = setting("hook_name", "hook_point")
    if not isinstance(hook, str):
        raise file_error(f"--sae {folder}: cfg.json names no hook (hook_name)", "give the site: --site SITE")
    return SAE(str(folder), "saelens", architecture, hook, weights, setting("hook_name_out"),
               setting("hook_head_index", "hook_point_head_index"), k if architecture == "topk" else None,
               apply_b_dec_to_input=bool(config.get("apply_b_dec_to_input", True)), normalize=normalize,
               rescale_by_decoder_norm=bool(config.get("rescale_acts_by_decoder_norm", False)),
               model_name=setting("model_name"))


def gemma_scope(folder: Path) -> SAE:
    """Gemma Scope's params.npz (read with allow_pickle=False): a jumprelu SAE whose hook the path says."""
    import numpy
    import torch

    try:
        with numpy.load(folder / "params.npz", allow_pickle=False) as data:
            weights = {("W_" + name[2:] if name.startswith("w_") else name): torch.tensor(data[name]).float()
                       for name in data.files}
    except (OSError, ValueError) as error:
        raise file_error(f"--sae: {folder / 'params.npz'} is not a readable npz file: {error}") from None
    required(weights, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), folder / "params.npz")
    text = "/".join(folder.resolve().parts[-4:])  # release/layer_N/width_W/average_l0_K, as Gemma Scope lays it out
    layer = re.search(r"layer_(\d+)", text)
    if "embedding" in text:  # sae-lens: the embedding SAEs were trained on embeddings over sqrt(d_model)
        d = weights["W_enc"].shape[0]
        weights["W_enc"], weights["W_dec"] = weights["W_enc"] / math.sqrt(d), weights["W_dec"] * math.sqrt(d)
        hook = "hook_embed"
    elif layer is None:
        hook = ""
    elif re.search(r"-res\b", text):
        hook = f"blocks.{layer.group(1)}.hook_resid_post"
    elif re.search(r"-mlp\b", text):
        hook = f"blocks.{layer.group(1)}.hook_mlp_out"
    elif re.search(r"-att\b", text):
        hook = f"blocks.{layer.group(1)}.attn.hook_z"
    else:
        hook = ""
    return SAE(str(folder), "gemmascope", "jumprelu", hook, weights, apply_b_dec_to_input=False)


GEMMA_HF_HOOKS = (  # Gemma Scope 2's transformers module names -> the tfcli leaf of block L
    (r"model\.layers\.(\d+)\.output", "resid_post"),
    (r"model\.layers\.(\d+)\.self_attn\.o_proj\.input", "attn.z"),
    (r"model\.layers\.(\d+)\.post_feedforward_layernorm\.output", "mlp_output_norm.out"),
    (r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.output", "mlp_norm.out"),
    (r"model\.layers\.(\d+)\.post_attention_layernorm\.output", "attn_output_norm.out"),
)


def gemma_scope_2(folder: Path) -> SAE:
    """Gemma Scope 2: params.safetensors (w_enc, w_dec, b_enc, b_dec, threshold, affine_skip_connection) and its
    config.json (architecture jump_relu, hf_hook_point_in, hf_hook_point_out for transcoders)."""
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    check_fields(config, {"architecture": str, "hf_hook_point_in": str, "hf_hook_point_out": str, "model_name": str},
                f"--sae {folder}", "config.json")
    if config.get("architecture", "jump_relu") != "jump_relu":
        raise file_error(f"--sae {folder}: unknown architecture {config.get('architecture')!r} in config.json",
                         "Gemma Scope 2's SAEs are jump_relu")
    raw = tensors(folder / "params.safetensors", "Gemma Scope 2")
    required(raw, ("w_enc", "w_dec", "b_enc", "b_dec", "threshold"), folder / "params.safetensors")
    weights = {"W_enc": raw["w_enc"], "W_dec": raw["w_dec"], "b_enc": raw["b_enc"], "b_dec": raw["b_dec"],
               "threshold": raw["threshold"]}
    if "affine_skip_connection" in raw:
        weights["W_skip"] = raw["affine_skip_connection"]
    hook_out = config.get("hf_hook_point_out")
    architecture = ("jumprelu_skip_transcoder" if "W_skip" in weights else "jumprelu_transcoder") if hook_out \
        else "jumprelu"
    return SAE(str(folder), "gemmascope2", architecture, str(config.get("hf_hook_point_in", "")), weights, hook_out,
               apply_b_dec_to_input=False, model_name=config.get("model_name"))


def llama_scope(folder: Path) -> SAE:
    """Llama Scope (OpenMOSS): hyperparams.json and checkpoints/final.safetensors (encoder.weight (d_sae, d),
    decoder.weight (d, d_sae)), a scalar jumprelu threshold, the dataset's average norms folded in."""
    import torch

    config = read_json(folder / "hyperparams.json")
    check_fields(config, {"act_fn": str, "d_model": int, "top_k": int, "jump_relu_threshold": float,
                         "dataset_average_activation_norm": dict, "hook_point_in": str, "hook_point_out": str},
                f"--sae {folder}", "hyperparams.json")
    check_fields(config.get("dataset_average_activation_norm") or {}, {"in": float, "out": float},
                f"--sae {folder}", "hyperparams.json")
    raw = tensors(folder / "checkpoints" / "final.safetensors", "Llama Scope")
    required(raw, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias"),
             folder / "checkpoints" / "final.safetensors")
    act = config.get("act_fn", "jumprelu")
    if act not in ("jumprelu", "relu", "topk"):
        raise file_error(f"--sae {folder}: unknown act_fn {act!r} in hyperparams.json", "known: jumprelu, relu, topk")
    norms = config.get("dataset_average_activation_norm") or {}
    d = int(config.get("d_model", raw["encoder.weight"].shape[1]))
    scale_in = math.sqrt(d) / norms["in"] if "in" in norms else 1.0
    scale_out = math.sqrt(d) / norms["out"] if "out" in norms else scale_in
    weights = {"W_enc": raw["encoder.weight"].T * scale_in, "b_enc": raw["encoder.bias"],
               "W_dec": raw["decoder.weight"].T / scale_out, "b_dec": raw["decoder.bias"] / scale_out}
    if act == "jumprelu":
        weights["threshold"] = torch.full_like(raw["encoder.bias"], float(config.get("jump_relu_threshold", 0.0))
                                               * scale_in)
    hook, hook_out = config.get("hook_point_in", ""), config.get("hook_point_out")
    transcoder = hook_out is not None and hook_out != hook
    architecture = ("jumprelu_transcoder" if act == "jumprelu" else "transcoder") if transcoder else \
        ("jumprelu" if act == "jumprelu" else "topk" if act == "topk" else "standard")
    return SAE(str(folder), "llamascope", architecture, hook, weights, hook_out if transcoder else None,
               k=int(config.get("top_k", 0)) if act == "topk" else None, apply_b_dec_to_input=False)


def sparsify(folder: Path, config: dict) -> SAE:
    """EleutherAI sparsify: a `layers.N` folder (or `h.N`, `layers.N.mlp`) with cfg.json and sae.safetensors."""
    check_fields(config, {"activation": str, "k": int, "transcode": bool}, f"--sae {folder}", "cfg.json")
    activation = config.get("activation", "topk")
    if activation not in ("topk", "groupmax"):
        raise file_error(f"--sae {folder}: unknown activation {activation!r} in cfg.json", "known: topk, groupmax")
    if not isinstance(config.get("k"), int):
        raise file_error(f"--sae {folder}: cfg.json gives no k", "a sparsify SAE keeps its top k latents")
    raw = tensors(folder / "sae.safetensors", "sparsify")
    required(raw, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), folder / "sae.safetensors")
    weights = {"W_enc": raw["encoder.weight"].T, "b_enc": raw["encoder.bias"], "W_dec": raw["W_dec"],
               "b_dec": raw["b_dec"]}
    transcode = bool(config.get("transcode", False))
    if "W_skip" in raw:
        weights["W_skip"] = raw["W_skip"]
    architecture = ("skip_transcoder" if "W_skip" in weights else "transcoder") if transcode else "topk"
    if "W_skip" in weights and not transcode:
        raise file_error(f"--sae {folder}: a skip connection without `transcode` is not supported")
    hook = folder.name
    return SAE(str(folder), "sparsify", architecture, hook, weights, hook if transcode else None, k=config["k"],
               groupmax=activation == "groupmax", apply_b_dec_to_input=not transcode)


def check_shapes(sae: SAE) -> None:
    """Every tensor of the shape the others imply (a file whose tensors disagree is refused, naming them)."""
    w, d_in, d_sae, d_out = sae.weights, sae.d_in, sae.d_sae, sae.d_out
    shapes = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_enc": (d_sae,), "b_dec": (d_out,),
              "threshold": (d_sae,), "b_gate": (d_sae,), "r_mag": (d_sae,), "b_mag": (d_sae,),
              "W_skip": (d_out, d_in)}
    wrong = [f"{name} {tuple(w[name].shape)} (expected {shape})" for name, shape in shapes.items()
             if name in w and tuple(w[name].shape) != shape]
    if wrong:
        raise file_error(f"--sae {sae.path}: tensors of the wrong shape: {'; '.join(wrong)}")
    if sae.groupmax and d_sae % (sae.k or 1):
        raise file_error(f"--sae {sae.path}: groupmax needs d_sae ({d_sae}) divisible by k ({sae.k})")
    if sae.k is not None and not 0 < sae.k <= d_sae:
        raise file_error(f"--sae {sae.path}: k = {sae.k} is not between 1 and d_sae = {d_sae}")


# ------------------------------------------------------------------------------------------ hook names -> sites

TL_LEAVES = {  # TransformerLens hook names under blocks.L -> tfcli's leaf
    "hook_resid_pre": "resid_pre", "hook_resid_mid": "resid_mid", "hook_resid_post": "resid_post",
    "hook_attn_out": "attn.out", "hook_mlp_out": "mlp.out", "hook_mlp_in": "resid_mid",
    "attn.hook_z": "attn.z", "attn.hook_q": "attn.q", "attn.hook_k": "attn.k", "attn.hook_v": "attn.v",
    "mlp.hook_pre": "mlp.pre", "mlp.hook_post": "mlp.post",
    "ln1.hook_normalized": "attn_norm.out", "ln2.hook_normalized": "mlp_norm.out",
    "mlp.hook_in": "mlp_norm.out", "mlp.hook_out": "mlp.out",  # circuit-tracer's: the MLP module's input and output
}
SUBLAYER_OUTPUTS = {"hook_mlp_out": ("mlp.out", "mlp_output_norm.out"),
                    "hook_attn_out": ("attn.out", "attn_output_norm.out")}


def site_of(hook: str | None, sae: SAE, output: bool = False) -> str:
    """tfcli's site for a hook name as SAE files write it: TransformerLens's (`blocks.L.hook_resid_post` ->
    `blocks.L.resid_post`, `blocks.L.attn.hook_z` -> `blocks.L.attn.z`, read flattened over heads,
    `blocks.L.ln2.hook_normalized` -> `blocks.L.mlp_norm.out`, `hook_embed` -> `embed`), Gemma Scope 2's
    transformers modules (`model.layers.L.output` -> `blocks.L.resid_post`, the post-MLP norm's output ->
    `blocks.L.mlp_output_norm.out`) and sparsify's (`layers.L` -> `blocks.L.resid_post`, the block's output;
    `layers.L.mlp` -> the MLP's output, or its normed input for a transcoder's input)."""
    hook = hook or ""
    if hook in ("hook_embed", "embed_tokens", "embed"):
        return "embed"
    found = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook)
    if found and found.group(2) in TL_LEAVES:
        return f"blocks.{found.group(1)}.{TL_LEAVES[found.group(2)]}"
    for pattern, leaf in GEMMA_HF_HOOKS:
        found = re.fullmatch(pattern, hook)
        if found:
            return f"blocks.{found.group(1)}.{leaf}"
    found = re.fullmatch(r"(?:model\.)?(?:layers|h|transformer\.h|gpt_neox\.layers)\.(\d+)(\.mlp)?", hook)
    if found and sae.format == "sparsify":
        if not found.group(2):
            return f"blocks.{found.group(1)}.resid_post"
        into = sae.transcoder and not output
        return f"blocks.{found.group(1)}.{'mlp_norm.out' if into else 'mlp.out'}"
    if not hook:
        raise file_error(f"--sae {sae.path}: the file does not say which activation the SAE reads",
                         "give the site: --site blocks.L.resid_post (tfcli config --sites lists them)")
    raise file_error(f"--sae {sae.path}: the hook {hook} has no tfcli site",
                     "give the site: --site SITE (tfcli config --sites lists them; docs/sites.md)")


def site_out_of(site: str, sae: SAE) -> str:
    """A transcoder given --site: it stands for the MLP's output of the same block."""
    found = re.fullmatch(r"((?:\w+\.)?blocks\.\d+)\..+", site)
    if not found:
        raise usage_error(f"--site {site}: a transcoder's input is a block's site (blocks.L.mlp_norm.out)")
    return f"{found.group(1)}.mlp.out"


def check_fit(sae: SAE, shapes: dict[str, tuple]) -> None:
    """The SAE's sites are the model's and as wide as it reads (`shapes`: model.site_shapes(), trailing sizes of
    each site after B and T); refused by name otherwise, before any model is built. TransformerLens's `hook_mlp_out`
    (`hook_attn_out`) is what the sublayer adds to the residual stream: in a block that normalises the sublayer's
    output (Gemma 2's sandwich) the output norm's site, `mlp_output_norm.out`, which the SAE's site becomes."""
    for attribute, hook in (("site", sae.hook), ("site_out", sae.hook_out)):
        leaf = (hook or "").rpartition(".")[2]
        site = getattr(sae, attribute)
        if leaf in SUBLAYER_OUTPUTS and site.endswith("." + SUBLAYER_OUTPUTS[leaf][0]):
            normed = site[:-len(SUBLAYER_OUTPUTS[leaf][0])] + SUBLAYER_OUTPUTS[leaf][1]
            if normed in shapes:
                setattr(sae, attribute, normed)
    for site, width, what in ((sae.site, sae.d_in, "reads"), (sae.site_out, sae.d_out, "writes")):
        if not site:
            continue
        if site not in shapes:
            near = [name for name in shapes if name.endswith(site.split(".")[-1])][:4]
            raise file_error(f"--sae {sae.path}: the model has no site {site} (the SAE's hook {sae.hook})",
                             f"sites such as {', '.join(near)}" if near else "tfcli config --sites lists them")
        trailing = [int(size) for size in shapes[site][2:]]
        if sae.head is not None and what == "reads":
            if not (len(trailing) == 2 and 0 <= sae.head < trailing[0]):
                raise file_error(f"--sae {sae.path}: hook_head_index {sae.head} does not fit {site} "
                                 f"{tuple(shapes[site])}")
            have = trailing[1]
        else:
            have = math.prod(trailing)
        if have != width:
            raise file_error(f"--sae {sae.path}: the SAE {what} {width} values per token, but {site} has {have}",
                             "an SAE trained on another model, or another site (--site)")


def site_rows(sae: SAE, value: Tensor) -> Tensor:
    """The SAE's input from a site's value (B, T, ...): (B, T, d_in), flattened over heads (or one head's)."""
    if sae.head is not None:
        value = value[:, :, sae.head]
    return value.flatten(2)


def put_rows(sae: SAE, value: Tensor, rows: Tensor) -> Tensor:
    """The site's value (B, T, ...) with the SAE's part replaced by rows (B, T, d_in)."""
    if sae.head is None:
        return rows.reshape(value.shape).to(value.dtype)
    out = value.clone()
    out[:, :, sae.head] = rows.to(value.dtype)
    return out


@dataclass
class Fitted:
    """The SAE's view of one batch at its site: x (B, T, d_in), features (B, T, d_sae), reconstruction (B, T,
    d_out) and, for a transcoder, target (B, T, d_out): what it stands for (the output site's value)."""

    x: Tensor
    features: Tensor
    reconstruction: Tensor
    target: Tensor
    extra: dict = field(default_factory=dict)


def fit(sae: SAE, cache: dict[str, Tensor]) -> Fitted:
    """Encode and decode a pass's cached sites (run_with_cache with `sae_sites(sae)`)."""
    x = site_rows(sae, cache[sae.site]).float()
    features = sae.encode(x)
    recon = sae.decode(features, x)
    target = cache[sae.site_out].flatten(2).float() if sae.site_out else x
    return Fitted(x, features, recon, target)


def sae_sites(sae: SAE) -> list[str]:
    return [sae.site] + ([sae.site_out] if sae.site_out else [])


# ------------------------------------------------------------------------------------------ interventions


# ------------------------------------------------------------------------------------------ direct effects

RESIDUAL_LEAVES = ("resid_pre", "resid_mid", "resid_post", "attn.out", "mlp.out", "attn_output_norm.out",
                   "mlp_output_norm.out")  # sites whose values live in the residual stream's basis


def check_direct(sae: SAE, what: str = "--target with --sae") -> None:
    """Refuse direct effects where a feature's decoder row is not a vector of the residual stream: an SAE that
    writes elsewhere (attn.z, the MLP's neurons, a norm's input) or whose reconstruction is not linear in its
    features (a run-time normalisation). `what`: the option asking, as the message names it."""
    writes = sae.site_out or sae.site
    if not (writes == "embed" or any(writes.endswith("." + leaf) for leaf in RESIDUAL_LEAVES)) or sae.head is not None:
        raise usage_error(f"{what} {sae.path}: its features write to {writes}, not to the residual "
                          "stream", "direct effects read an SAE on a residual site or a sublayer's output")
    if sae.normalize in ("layer_norm", "constant_norm_rescale"):
        raise usage_error(f"{what} {sae.path}: its reconstruction is normalised at run time "
                          f"({sae.normalize}), not a sum of its features' decoder rows")


def check_saes(saes: list[SAE] | tuple[SAE, ...], config: ModelConfig, direct: str | None = None,
               components: bool = False) -> None:
    """The SAEs a command reads checked against the model's config, one after another, before the model is built:
    with `direct` (the option that asks for direct effects, as the messages name it), one whose features write to the
    residual stream (check_direct); its sites the model's, as wide as it reads (check_fit); with `components` (its
    features split what a layer writes: `attribute --sae`), not a sublayer's output that a sandwich (or
    sublayer_output) block normalises before adding it to the residual stream."""
    from tfcli.model.transformer import site_shapes

    shapes = None  # found once there is an SAE to check (a pass on the meta device)
    for sae in saes:
        if direct is not None:
            check_direct(sae, direct)
        if shapes is None:
            shapes = site_shapes(config)
        check_fit(sae, shapes)
        if components and config.norm_position in ("sandwich", "sublayer_output") and \
                (sae.site_out or sae.site).endswith(("attn.out", "mlp.out")):
            raise usage_error(f"--sae {sae.path}: {config.name} normalises each sublayer's output before adding it "
                              f"to the residual stream, so {sae.site_out or sae.site} is not what the layer writes",
                              "an SAE on the output norm's site (mlp_output_norm.out) or a residual site")


def direct_effects(sae: SAE, fitted: Fitted, where: tuple[int, int], direction: Tensor) -> dict[str, Tensor | float]:
    """Each feature's direct effect on a logit (difference) at `where` (row, position): its activation times its
    decoder row read along `direction` (d,), float64, the final norm's divisor there folded in (the readout's, as
    `attribute` reads a head's output); and the same for the rest of the reconstruction (b_dec, a skip term) and the
    error term. They sum to what the site itself adds (`site`)."""
    row, position = where
    w_dec = fitted_rows(sae)
    read = w_dec @ direction  # (d_sae,)
    features = fitted.features[row, position].double()
    effects = features * read
    target = fitted.target[row, position].double() @ direction
    recon = fitted.reconstruction[row, position].double() @ direction
    return {"effects": effects, "rest": float(recon - effects.sum()), "error": float(target - recon),
            "site": float(target)}


def fitted_rows(sae: SAE) -> Tensor:
    """The decoder rows as a feature's activation scales them (divided by their norm where the SAE rescales its
    activations by it), float64 (d_sae, d_out)."""
    w_dec = sae.weights["W_dec"].double()
    return w_dec / w_dec.norm(dim=-1, keepdim=True) if sae.rescale_by_decoder_norm else w_dec
