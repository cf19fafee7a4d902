"""A transcoder's features where an SAE's work: `generate --ablate TC#N` (`=V`: clamped) and `--steer TC#N:S`, the
transcoder being one layer of a set (circuit-tracer's `layer_L.safetensors`, or a SAELens or sparsify layer folder).

The reference, on transformers' own modules with forward hooks: the MLP's output (Llama: the `mlp` module's; Gemma 2
with `hook_mlp_out`: the post-feedforward norm's) replaced by the transcoder's reconstruction from the MLP's
normalised input with feature N set to V (0: removed; steering: N's activation plus S) PLUS the transcoder's error
(the output minus the unedited reconstruction), written out here from circuit-tracer's formulas; then transformers'
greedy `generate` (its KV cache: each step's pass sees its new token alone, as tfcli's). tfcli's continuation and
each step's probability equal it. `features --sae` and `attribute --sae` read a layer folder of a SAELens set."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from test_graph import PROMPT, gemma2, llama  # noqa: F401 (fixtures)
from test_transcoder_formats import circuit_tracer_layers, write_saelens, write_sparsify

LAYER = 1
NEW = 4


def hand_encode(weights: dict, x: torch.Tensor) -> torch.Tensor:
    pre = x @ weights["W_enc"].T + weights["b_enc"]
    threshold = weights.get("activation_function.threshold")
    return torch.relu(pre) if threshold is None else pre * (pre > threshold)


def hand_decode(weights: dict, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    out = acts @ weights["W_dec"] + weights["b_dec"]
    return out + x @ weights["W_skip"].T if "W_skip" in weights else out


def sites(hf):
    """Block LAYER's transcoder input module (its output is the MLP's normalised input) and output module."""
    block = hf.model.layers[LAYER]
    if hasattr(block, "post_feedforward_layernorm"):  # Gemma 2, hook_mlp_out: what the sublayer adds
        return block.pre_feedforward_layernorm, block.post_feedforward_layernorm
    return block.post_attention_layernorm, block.mlp


def hand_generate(hf, weights: dict, ids: list[int], feature: int, value: float | None = None,
                  added: float | None = None) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation (NEW tokens) with the MLP's output t replaced by decode(f') + (t - decode(f)),
    f' = f with f_feature set to `value`, or raised by `added`: (the new ids, each step's probability of its token)."""
    read, write = sites(hf)
    seen = {}

    def keep(module, args, output):
        seen["x"] = output.detach()

    def replace(module, args, output):
        x = seen.pop("x")
        acts = hand_encode(weights, x)
        edited = acts.clone()
        edited[..., feature] = value if value is not None else acts[..., feature] + added
        error = output - hand_decode(weights, acts, x)
        return hand_decode(weights, edited, x) + error

    handles = [read.register_forward_hook(keep), write.register_forward_hook(replace)]
    try:
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=NEW, do_sample=False, num_beams=1, output_scores=True,
                              return_dict_in_generate=True, pad_token_id=0)
    finally:
        for handle in handles:
            handle.remove()
    new = out.sequences[0, len(ids):].tolist()
    return new, [float(torch.softmax(score[0].float(), -1)[token]) for score, token in zip(out.scores, new)]


def strongest_feature(hf, weights: dict, ids: list[int]) -> int:
    """The feature of block LAYER's transcoder with the largest activation x |decoder row| on the prompt (after its
    first token), and whose neighbours differ from it (a feature index off by one shows)."""
    read, _ = sites(hf)
    seen = {}
    handle = read.register_forward_hook(lambda module, args, output: seen.setdefault("x", output.detach()))
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        handle.remove()
    acts = hand_encode(weights, seen["x"][0])[1:]
    return int((acts.max(0).values * weights["W_dec"].norm(dim=-1)).argmax())


def generated(cli, path, *args) -> tuple[dict, list[float]]:
    result = cli("generate", "-m", str(path), PROMPT, "--max-new-tokens", str(NEW), "--json", *args)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    return record, [step["prob"] for step in record["steps"]]


EDITS = {"zero": ("--ablate", "#{n}", {"value": 0.0}), "clamp": ("--ablate", "#{n}=6", {"value": 6.0}),
         "steer": ("--steer", "#{n}:8", {"added": 8.0})}


@pytest.mark.parametrize("family", ["llama", "gemma2"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_generate_edits_a_transcoder_feature_with_its_error_kept(family, edit, request, cli):
    path, hf, transcoders = request.getfixturevalue(family)
    weights = load_file(str(transcoders / f"layer_{LAYER}.safetensors"))
    plain, plain_probs = generated(cli, path)
    ids = plain["prompt_ids"]
    n = strongest_feature(hf, weights, ids)
    option, suffix, change = EDITS[edit]
    spec = f"{transcoders / f'layer_{LAYER}.safetensors'}{suffix.format(n=n)}"
    ours, probs = generated(cli, path, option, spec)
    theirs, their_probs = hand_generate(hf, weights, ids, n, **change)
    assert ours["generated_ids"] == theirs
    assert probs == pytest.approx(their_probs, abs=2e-5)
    moved = max(abs(a - b) for a, b in zip(probs, plain_probs)) if ours["generated_ids"] == \
        plain["generated_ids"] else 1.0
    assert moved > 1e-3  # the edit changes the continuation's numbers


def test_a_feature_of_each_format_is_edited_alike(llama, cli, tmp_path):
    """The same transcoder as a SAELens layer folder and a sparsify one (k the width: its ReLU) edits alike."""
    path, hf, transcoders = llama
    layers = circuit_tracer_layers(transcoders)
    relu = [{name: value for name, value in tensors.items() if name != "activation_function.threshold"}
            for tensors in layers]
    saelens = write_saelens(layers, tmp_path / "saelens", ("mlp.hook_in", "hook_mlp_out")) / f"layer_{LAYER}"
    sparsify = write_sparsify(relu, tmp_path / "sparsify", k=relu[0]["W_enc"].shape[0]) / f"layers.{LAYER}.mlp"
    ids = generated(cli, path)[0]["prompt_ids"]
    for folder, weights in ((saelens, layers[LAYER]), (sparsify, relu[LAYER])):
        n = strongest_feature(hf, weights, ids)
        for option, spec, change in (("--ablate", f"{folder}#{n}=6", {"value": 6.0}),
                                     ("--steer", f"{folder}#{n}:8", {"added": 8.0})):
            ours, probs = generated(cli, path, option, spec)
            theirs, their_probs = hand_generate(hf, weights, ids, n, **change)
            assert ours["generated_ids"] == theirs and probs == pytest.approx(their_probs, abs=2e-5), spec


def test_steering_refuses_a_transcoder_whose_output_the_block_normalises(gemma2, cli, tmp_path):
    """sparsify's `model.layers.L.mlp` on Gemma 2 writes the MLP module's output, which the block normalises before
    adding it: a vector added to the block's output is not that feature made more active. One error line."""
    path, _, transcoders = gemma2
    folder = write_sparsify(circuit_tracer_layers(transcoders), tmp_path / "sparsify", k=8,
                            hookpoint="model.layers.{}.mlp") / "model.layers.1.mlp"
    result = cli("generate", "-m", str(path), PROMPT, "--steer", f"{folder}#3:4")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.stderr
    assert "writes blocks.1.mlp.out" in errors[0] and "Traceback" not in result.stderr


def test_features_and_attribute_read_a_layer_of_a_saelens_set(llama, cli, tmp_path):
    """`features --sae` and `attribute --sae` take a layer folder of a SAELens set: a transcoder from the MLP's
    normalised input to its output, its features the circuit-tracer layer's."""
    path, _, transcoders = llama
    folder = write_saelens(circuit_tracer_layers(transcoders), tmp_path / "saelens",
                           ("mlp.hook_in", "hook_mlp_out")) / f"layer_{LAYER}"
    result = cli("features", "-m", str(path), "--sae", str(folder), PROMPT, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["sae"]["site"] == f"blocks.{LAYER}.mlp_norm.out"
    assert record["sae"]["site_out"] == f"blocks.{LAYER}.mlp.out"
    result = cli("attribute", "-m", str(path), "--sae", str(folder), PROMPT, "--target", "dog", "--json")
    assert result.exit_code == 0, result.stderr


def test_a_transcoder_features_steering_scale_reads_its_block(llama, cli):
    """The record's steered.features for a transcoder: its activation from the MLP's normalised input (position 0
    left out), and the median norm of its block's output, where the vector goes (transformers' own values)."""
    path, hf, transcoders = llama
    weights = load_file(str(transcoders / f"layer_{LAYER}.safetensors"))
    record, _ = generated(cli, path)
    ids = record["prompt_ids"]
    n = strongest_feature(hf, weights, ids)
    record, _ = generated(cli, path, "--steer", f"{transcoders / f'layer_{LAYER}.safetensors'}#{n}:8")
    [scale] = record["steered"]["features"]
    read, _ = sites(hf)
    seen = {}
    handles = [read.register_forward_hook(lambda module, args, output: seen.setdefault("x", output.detach())),
               hf.model.layers[LAYER].register_forward_hook(
                   lambda module, args, output: seen.setdefault("block", (output[0] if isinstance(output, tuple)
                                                                          else output).detach()))]
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        for handle in handles:
            handle.remove()
    activation = float(hand_encode(weights, seen["x"][0])[1:, n].max())
    norm = float(seen["block"][0, 1:].norm(dim=-1).median())
    assert (scale["feature"], scale["block"]) == (n, LAYER)
    assert scale["activation"] == pytest.approx(activation, rel=1e-4)
    assert scale["site_norm"] == pytest.approx(norm, rel=1e-4)
    assert scale["share"] == pytest.approx(8 * float(weights["W_dec"][n].norm()) / norm, rel=1e-4)
