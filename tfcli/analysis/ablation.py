"""Removing a component from the shell: `--ablate SITE[:zero|mean]`. SITE is a head (`L23H3`: that head's slice of
`blocks.23.attn.z`), a sublayer's output (`L5.mlp`, `L5.attn`: `blocks.5.mlp.out`, `blocks.5.attn.out`) or any
site name, `*` wildcards allowed (`blocks.*.mlp.out`). `zero` (the default) zeroes it; `mean` replaces it by its
mean over the text's positions (one pass over a whole text: not while generating). `SAE#N` zeroes feature N of the
SAE (or transcoder) in folder SAE, `SAE#N=V` clamps it to V, the SAE's error term kept (`edit_hooks`, here: the
SAE itself is tfcli/analysis/sae.py). The hooks are the model's site hooks, the ones steering uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.errors import TfcliError, named_for, usage_error
from tfcli.model.sites import block_site

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.sae import SAE
    from tfcli.config import ModelConfig
    from tfcli.model.sites import Hook

HOW = ("zero", "mean")
HEAD = re.compile(r"L(\d+)H(\d+)")
SUBLAYER = re.compile(r"L(\d+)\.(mlp|attn)")


def parse_ablation(spec: str, config: ModelConfig, known: list[str]) -> tuple[list[str], int | None, str]:
    """`L23H3`, `L5.mlp:mean`, `blocks.*.mlp.out:zero` -> (the site names, the head or None, zero or mean); a usage
    error naming what is wrong (an unknown site, a head or layer the model lacks, another mode)."""
    from tfcli.model.sites import check_names, name_filter

    target, _, how = spec.partition(":")
    how = how or "zero"
    if how not in HOW:
        raise usage_error(f"--ablate {spec}: `{how}` is not a way to ablate", f"give {' or '.join(HOW)} after the "
                          "colon (default zero)")
    head = None
    match = HEAD.fullmatch(target) or SUBLAYER.fullmatch(target)
    if match and int(match[1]) >= config.num_hidden_layers:
        raise usage_error(f"--ablate {spec}: {config.name} has {config.num_hidden_layers} blocks "
                          f"(L0 to L{config.num_hidden_layers - 1})")
    if match := HEAD.fullmatch(target):
        layer, head = int(match[1]), int(match[2])
        if head >= config.num_attention_heads:
            raise usage_error(f"--ablate {spec}: {config.name} has {config.num_attention_heads} heads per layer "
                              f"(H0 to H{config.num_attention_heads - 1})")
        target = block_site(layer, "attn.z")
    elif match := SUBLAYER.fullmatch(target):
        target = block_site(int(match[1]), f"{match[2]}.out")
    try:
        check_names([target], known)
    except TfcliError as exc:
        raise usage_error(f"--ablate {spec}: {exc.message}", exc.hint) from None
    return [name for name in known if name_filter([target])(name)], head, how


@dataclass
class Ablation:
    """What `--ablate` removes: the specs as given, their hooks by site, and whether any replaces a value by its mean
    over the text's positions (a pass over the whole text is then needed: patch's fast sweep runs only part of it).
    It travels (to a Ray worker) as its specs and config, and is made again there: hooks do not travel."""

    specs: list[str]
    hooks: dict[str, Hook]
    by_mean: bool
    config: ModelConfig

    def label(self) -> str:
        return ablated_label(self.specs)

    def __reduce__(self):
        return ablation, (self.specs, self.config)


def ablated_label(specs: list[str]) -> str:
    """`L23H3 (zeroed), L5.mlp (mean), sae#12 (clamped to 2.5)`: what the views say was ablated."""
    def label(spec: str) -> str:
        if "#" in spec:
            target, _, value = spec.partition("=")
            return f"{target} ({'clamped to ' + value if value else 'zeroed'})"
        return f"{spec.partition(':')[0]} ({'mean' if spec.endswith(':mean') else 'zeroed'})"
    return ", ".join(map(label, specs))


def feature_ablation(spec: str, shapes: dict) -> dict[str, Hook]:
    """`SAE#N` (zero) or `SAE#N=V` (clamp): the hooks that edit the SAE's feature N with its error term kept."""
    from tfcli.analysis.sae import check_fit, read_sae

    path, _, rest = spec.rpartition("#")
    number, _, value = rest.partition("=")
    try:
        edit = FeatureEdit(int(number), value=float(value) if value else 0.0)
    except ValueError:
        raise usage_error(f"--ablate {spec}: give SAE#N (zero feature N) or SAE#N=V (clamp it to V)") from None
    with named_for(f"--ablate {spec}"):
        sae = read_sae(path)
        check_fit(sae, shapes)
    return edit_hooks(sae, [edit])


@dataclass
class FeatureEdit:
    """A change to one feature at the SAE's site: clamp it to `value` (0: ablate it), or add `strength` times its
    decoder row (steer)."""

    feature: int
    value: float | None = None
    strength: float | None = None


def edit_hooks(sae: SAE, edits: list[FeatureEdit]) -> dict[str, Hook]:
    """Site hooks (run_with_hooks) that make `edits` with the error term kept: what the SAE stands for becomes
    t + decode(f') - decode(f), f the features of the pass and f' those edited, plus each steer's strength x
    W_dec[feature]; so that only the edited features' change reaches the rest of the pass. An SAE's hook is on its
    site; a transcoder's reads its input site and changes its output site."""
    import torch

    from tfcli.analysis.sae import put_rows, site_rows

    bad = [edit.feature for edit in edits if not 0 <= edit.feature < sae.d_sae]
    if bad:
        raise usage_error(f"feature {bad[0]}: the SAE {sae.path} has features 0 to {sae.d_sae - 1}")
    clamps = [edit for edit in edits if edit.value is not None]
    steer = sum((edit.strength * sae.weights["W_dec"][edit.feature] for edit in edits if edit.strength is not None),
                torch.zeros(sae.d_out))
    seen: dict[str, Tensor] = {}

    def change(x: Tensor) -> Tensor:
        """The change to what the SAE stands for, (B, T, d_out), from its input rows x (B, T, d_in)."""
        delta = steer.to(x.device).expand(*x.shape[:-1], -1)
        if clamps:
            features = sae.encode(x)
            edited = features.clone()
            for edit in clamps:
                edited[..., edit.feature] = edit.value
            delta = delta + sae.decode(edited, x) - sae.decode(features, x)
        return delta

    if not sae.site_out:
        return {sae.site: lambda value: put_rows(sae, value, (site_rows(sae, value).float()
                                                              + change(site_rows(sae, value).float())))}

    def read(value: Tensor) -> None:
        seen["x"] = site_rows(sae, value).float()

    def write(value: Tensor) -> Tensor:
        return (value.flatten(2).float() + change(seen.pop("x"))).reshape(value.shape).to(value.dtype)

    return {sae.site: read, sae.site_out: write}


def ablation(specs: list[str] | None, config: ModelConfig, generating: bool = False) -> Ablation | None:
    """Every --ablate of a command, checked against the config before the model is built (None without any); two on
    one site compose. `generating`: mean-ablation is refused (each step of a cached generation sees only its new
    token: there is no text's mean to put there)."""
    from tfcli.model import sites
    from tfcli.model.transformer import site_shapes

    if not specs:
        return None
    shapes = site_shapes(config)
    known = list(shapes)
    groups, by_mean = [], False
    for spec in specs:
        if "#" in spec:
            groups.append(feature_ablation(spec, shapes))
            continue
        names, head, how = parse_ablation(spec, config, known)
        if how == "mean" and generating:
            raise usage_error(f"--ablate {spec}: generate ablates by zeroing only", "each step after the prompt runs "
                              "on its new token alone, so a mean over the text's positions is not defined there")
        by_mean = by_mean or how == "mean"
        heads = None if head is None else [head]
        groups += [{name: (sites.zero if how == "zero" else sites.mean)(name, heads=heads)} for name in names]
    return Ablation(list(specs), sites.merged(*groups) or {}, by_mean, config)
