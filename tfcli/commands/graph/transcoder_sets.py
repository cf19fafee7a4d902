"""Transcoder sets in SAELens's and sparsify's formats: a folder holding a folder per layer, each read by
analysis/sae.py's readers and turned into circuit-tracer's tensors (analysis/transcoders.py's `Transcoders`), which
the graph runs through as it runs through circuit-tracer's sets.

- SAELens (`cfg.json` + `sae_weights.safetensors`): architectures `transcoder`, `skip_transcoder`,
  `jumprelu_transcoder`, `jumprelu_skip_transcoder`; `hook_name` `blocks.L.<input hook>` and `hook_name_out`
  `blocks.L.<output hook>`, circuit-tracer's hooks (transcoders.INPUT_HOOKS, OUTPUT_HOOKS; `hook_mlp_in`,
  TransformerLens's copy of `hook_resid_mid`, too). W_enc (d, F) is transposed; its JumpReLU, relu(pre) * (pre >
  threshold), is circuit-tracer's with the threshold raised to 0 where it is negative (the same activations).
- sparsify (`cfg.json` with `transcode: true` + `sae.safetensors`, the folder named by its hookpoint `layers.L.mlp`,
  `model.layers.L.mlp`, `h.L.mlp`, ...): `encoder.weight` (F, d) is W_enc, `W_dec` (F, d), `W_skip` (d, d) (skip =
  x @ W_skip.T); the hookpoint's module input and output are circuit-tracer's `mlp.hook_in` -> `mlp.hook_out`; the
  activation top-k of relu(pre) (or groupmax), which circuit-tracer's format has no name for.
The folders' names are not read (sparsify's hookpoint aside): a transcoder's layer is its hook's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.analysis.transcoders import (INPUT_HOOKS, OPTION, OUTPUT_HOOKS, THRESHOLD, Transcoders, check_layers,
                                        read_transcoders)
from tfcli.errors import file_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.sae import SAE


def read_set(path: str | Path) -> Transcoders:
    """`--transcoders DIR`: circuit-tracer's set (config.yaml), or a folder holding SAELens's or sparsify's
    transcoders a folder per layer; one TfcliError (exit 1) naming what is wrong."""
    folder = Path(path)
    if folder.is_dir() and not (folder / "config.yaml").is_file():
        children = sorted(child for child in folder.iterdir() if (child / "cfg.json").is_file())
        if children:
            return read_layer_folders(folder, children)
        if (folder / "cfg.json").is_file():
            raise file_error(f"{OPTION} {path}: one transcoder (cfg.json), not a set",
                             "give the folder that holds one folder per layer")
    return read_transcoders(folder)


SET_ARCHITECTURES = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
SPARSIFY_MLP = re.compile(r"(?:model\.|transformer\.|gpt_neox\.)?(?:layers|h)\.(\d+)\.mlp")


def read_layer_folders(folder: Path, children: list[Path]) -> Transcoders:
    """A set of SAELens or sparsify transcoders, a folder each (`children`, each with cfg.json), read by
    analysis/sae.py's readers: one per layer from 0, all of one format, architecture, width and hooks; their tensors
    in circuit-tracer's orientation."""
    from tfcli.analysis.sae import check_shapes, read_json, saelens, sparsify
    from tfcli.errors import named_for

    found: dict[int, tuple[Path, SAE, str, str]] = {}
    for child in children:
        with named_for(f"{OPTION} {folder}"):
            config = read_json(child / "cfg.json")
            if (child / "sae_weights.safetensors").is_file() or "architecture" in config or "d_sae" in config:
                sae = saelens(child, config)
            else:
                sae = sparsify(child, config)
            check_shapes(sae)
        layer, input_hook, output_hook = set_hooks(folder, child, sae)
        if layer in found:
            raise file_error(f"{OPTION} {folder}: {found[layer][0].name} and {child.name} are both layer {layer}'s "
                             "transcoder", "a set has one transcoder per layer")
        found[layer] = (child, sae, input_hook, output_hook)
    missing = [layer for layer in range(max(found) + 1) if layer not in found]
    if missing:
        raise file_error(f"{OPTION} {folder}: no transcoder for layer {missing[0]} (the folders hold layers "
                         f"{', '.join(map(str, sorted(found)))})", "a transcoder set has one per layer, from layer 0")
    ordered = [found[layer] for layer in range(len(found))]
    first = ordered[0][1]
    for layer, (child, sae, *hooks) in enumerate(ordered):
        same = (sae.format, sae.architecture, sae.k, sae.groupmax, tuple(hooks)) == \
            (first.format, first.architecture, first.k, first.groupmax, tuple(ordered[0][2:]))
        if not same:
            raise file_error(f"{OPTION} {folder}: layer {layer}'s transcoder ({child.name}: {sae.format} "
                             f"{sae.architecture}, {' -> '.join(hooks)}) differs from layer 0's ({first.format} "
                             f"{first.architecture}, {' -> '.join(ordered[0][2:])})")
    layers = [circuit_tracer_tensors(sae) for _, sae, _, _ in ordered]
    check_layers(str(folder), layers)
    return Transcoders(str(folder), None, ordered[0][2], ordered[0][3], layers, format=first.format, k=first.k,
                       groupmax=first.groupmax)


def set_hooks(folder: Path, child: Path, sae: SAE) -> tuple[int, str, str]:
    """A layer folder's transcoder -> (its layer, its input and output hooks as circuit-tracer names them);
    refused by name where it is no transcoder, reads a site the graph has no use for or is normalised at run time."""
    where = f"{OPTION} {folder}: {child.name}"
    if not sae.transcoder:
        raise file_error(f"{where} is a {sae.architecture} SAE, not a transcoder",
                         f"a set holds transcoders ({', '.join(SET_ARCHITECTURES)}; sparsify's transcode: true)")
    if sae.format == "sparsify":
        match = SPARSIFY_MLP.fullmatch(sae.hook)
        if match is None:
            raise file_error(f"{where}: the hookpoint {sae.hook} maps to no tfcli site",
                             "sparsify transcoders tfcli reads are on an MLP: layers.L.mlp (model.layers.L.mlp, "
                             "h.L.mlp)")
        return int(match[1]), "mlp.hook_in", "mlp.hook_out"
    if sae.normalize != "none" or sae.rescale_by_decoder_norm or sae.head is not None:
        raise file_error(f"{where}: its input is normalised or rescaled at run time, or it reads one head "
                         "(normalize_activations, rescale_acts_by_decoder_norm, hook_head_index), which the graph's "
                         "linear replacement does not read")
    hooks = []
    for hook, known, key in ((sae.hook, INPUT_HOOKS, "hook_name"), (sae.hook_out, OUTPUT_HOOKS, "hook_name_out")):
        match = re.fullmatch(r"blocks\.(\d+)\.(.+)", hook or "")
        if match is None or match[2] not in known:
            why = " (circuit-tracer reads it as the norm's output before its weight: no tfcli site)" \
                if (hook or "").endswith("ln2.hook_normalized") else ""
            raise file_error(f"{where}: its {key} {hook} maps to no tfcli site{why}",
                             f"hooks tfcli reads: blocks.L.{', blocks.L.'.join(known)}")
        hooks.append((int(match[1]), match[2]))
    if hooks[0][0] != hooks[1][0]:
        raise file_error(f"{where}: it reads layer {hooks[0][0]} and writes layer {hooks[1][0]}",
                         "a per-layer transcoder reads and writes one block")
    return hooks[0][0], hooks[0][1], hooks[1][1]


def circuit_tracer_tensors(sae: SAE) -> dict[str, Tensor]:
    """An analysis.sae.SAE transcoder's tensors as circuit-tracer keeps them: W_enc (F, d), b_enc, W_dec (F, d),
    b_dec, the JumpReLU threshold raised to 0 (SAELens's relu(pre) * (pre > t) is pre * (pre > max(t, 0))), W_skip
    (d, d)."""
    w = sae.weights
    out = {"W_enc": w["W_enc"].T.contiguous(), "b_enc": w["b_enc"], "W_dec": w["W_dec"], "b_dec": w["b_dec"]}
    if "threshold" in w:
        out[THRESHOLD] = w["threshold"].clamp(min=0)
    if "W_skip" in w:
        out["W_skip"] = w["W_skip"]
    return out
