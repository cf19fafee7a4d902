"""Transcoder sets in SAELens's and sparsify's formats (a folder per layer), read by `tfcli graph --transcoders`.

- The graph: a set written in each format from a circuit-tracer set's weights gives that set's graph (which
  tests/test_graph_circuit_tracer.py holds equal to circuit-tracer 0.5.0 and tests/test_graph.py to a hand
  computation): SAELens's JumpReLU skip transcoders (`mlp.hook_in` -> `hook_mlp_out`) on the tiny Llama and ReLU
  ones on the tiny Gemma 2 (`hook_mlp_out`: the post-feedforward norm's output); sparsify's skip transcoders (k = F:
  top-k of every feature is the ReLU) on the Llama. sparsify's `layers.L.mlp` on Gemma 2 writes the MLP module's own
  output, before the norm that follows it, which circuit-tracer's nnsight backend maps no hook to: that graph is held
  to test_graph's hand computation on transformers' modules instead.
- The formats' own forward passes, written out here from their sources (sae_lens/saes/transcoder.py's
  JumpReLUSkipTranscoder; sparsify's fused_encoder.py top-k and SparseCoder.decode + the skip term), against tfcli's
  encode and decode, with a top-k smaller than the width and negative JumpReLU thresholds; and the files written here
  read by the libraries themselves (where installed), which compute the same.
- Refusals: a hook with no site, a missing layer, another width, a garbage cfg.json, an SAE that is no transcoder:
  one `error:` line, exit 1, before any model is built.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_graph import PROMPT, gemma2, hand_graph, llama, scaled_difference, tfcli_graph  # noqa: F401 (fixtures)
from tfcli.commands.graph.transcoder_sets import read_set
from tfcli.commands.graph import core

THRESHOLD = "activation_function.threshold"


def circuit_tracer_layers(folder) -> list[dict]:
    return [load_file(str(folder / f"layer_{i}.safetensors")) for i in range(len(list(folder.glob("layer_*"))))]


def write_circuit_tracer(layers: list[dict], folder, hooks: tuple[str, str]):
    folder.mkdir()
    (folder / "config.yaml").write_text(f"model_kind: transcoder_set\nfeature_input_hook: {hooks[0]}\n"
                                        f"feature_output_hook: {hooks[1]}\n")
    for i, tensors in enumerate(layers):
        save_file({name: value.contiguous() for name, value in tensors.items()}, str(folder / f"layer_{i}.safetensors"))
    return folder


def write_saelens(layers: list[dict], folder, hooks: tuple[str, str]):
    """A folder per layer as sae-lens 6.54's save_model writes it: cfg.json (the hooks in `metadata`) and
    sae_weights.safetensors with W_enc (d, F), b_enc, W_dec (F, d), b_dec, threshold, W_skip (d, d)."""
    folder.mkdir()
    for i, tensors in enumerate(layers):
        features, d = tensors["W_enc"].shape
        jumprelu, skip = THRESHOLD in tensors, "W_skip" in tensors
        architecture = ("jumprelu_" if jumprelu else "") + ("skip_" if skip else "") + "transcoder"
        layer = folder / f"layer_{i}"  # the folder's name is not read: the hook names the layer
        layer.mkdir()
        (layer / "cfg.json").write_text(json.dumps({
            "d_in": d, "d_sae": features, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": False,
            "normalize_activations": "none", "reshape_activations": "none", "d_out": d, "architecture": architecture,
            "metadata": {"sae_lens_version": "6.54.0", "hook_name": f"blocks.{i}.{hooks[0]}",
                         "hook_name_out": f"blocks.{i}.{hooks[1]}"}}))
        weights = {"W_enc": tensors["W_enc"].T.contiguous(), "b_enc": tensors["b_enc"], "W_dec": tensors["W_dec"],
                   "b_dec": tensors["b_dec"]}
        if jumprelu:
            weights["threshold"] = tensors[THRESHOLD]
        if skip:
            weights["W_skip"] = tensors["W_skip"]
        save_file({name: value.contiguous() for name, value in weights.items()}, str(layer / "sae_weights.safetensors"))
    return folder


def write_sparsify(layers: list[dict], folder, k: int, hookpoint: str = "layers.{}.mlp", activation: str = "topk"):
    """A folder per hookpoint as sparsify's SparseCoder.save_to_disk writes it: cfg.json (its SparseCoderConfig and
    d_in) and sae.safetensors (encoder.weight (F, d), encoder.bias, W_dec (F, d), b_dec, W_skip (d, d))."""
    folder.mkdir()
    for i, tensors in enumerate(layers):
        features, d = tensors["W_enc"].shape
        skip = "W_skip" in tensors
        layer = folder / hookpoint.format(i)
        layer.mkdir()
        (layer / "cfg.json").write_text(json.dumps({
            "activation": activation, "expansion_factor": 32, "normalize_decoder": True, "num_latents": features, "k": k,
            "multi_topk": False, "skip_connection": skip, "transcode": True, "d_in": d}))
        weights = {"encoder.weight": tensors["W_enc"], "encoder.bias": tensors["b_enc"], "W_dec": tensors["W_dec"],
                   "b_dec": tensors["b_dec"]}
        if skip:
            weights["W_skip"] = tensors["W_skip"]
        save_file({name: value.contiguous() for name, value in weights.items()}, str(layer / "sae.safetensors"))
    return folder


OPTIONS = dict(validate=3)


def assert_same_graph(ours, theirs) -> None:
    assert len(ours.active_features) >= 20 and torch.equal(ours.active_features, theirs.active_features)
    assert torch.allclose(ours.activation_values, theirs.activation_values, rtol=1e-6, atol=1e-7)
    assert ours.logit_ids == theirs.logit_ids
    assert scaled_difference(ours.adjacency, theirs.adjacency) <= 1e-6
    assert torch.equal(ours.pruned.node_mask, theirs.pruned.node_mask)
    assert torch.equal(ours.pruned.edge_mask, theirs.pruned.edge_mask)
    assert abs(ours.replacement - theirs.replacement) <= 1e-6
    assert abs(ours.completeness - theirs.completeness) <= 1e-6
    assert ours.validation.measured == pytest.approx(theirs.validation.measured, rel=1e-4, abs=1e-6)


def test_a_saelens_set_gives_the_circuit_tracer_sets_graph(llama, tmp_path):
    """JumpReLU skip transcoders, `blocks.L.mlp.hook_in` -> `blocks.L.hook_mlp_out` (on Llama the MLP's output)."""
    path, _, transcoders = llama
    layers = circuit_tracer_layers(transcoders)
    folder = write_saelens(layers, tmp_path / "saelens", ("mlp.hook_in", "hook_mlp_out"))
    read = read_set(folder)
    assert (read.format, read.activation, read.skip, read.n_layers) == ("saelens", "jumprelu", True, len(layers))
    options = core.GraphOptions(**OPTIONS)
    assert_same_graph(tfcli_graph(path, folder, options), tfcli_graph(path, transcoders, options))


def test_a_sparsify_set_gives_the_circuit_tracer_sets_graph(llama, tmp_path):
    """sparsify's skip transcoders on `layers.L.mlp` with k the width (its top-k then keeps every positive
    pre-activation): circuit-tracer's ReLU set of the same weights."""
    path, _, transcoders = llama
    layers = [{name: value for name, value in tensors.items() if name != THRESHOLD}
              for tensors in circuit_tracer_layers(transcoders)]
    relu = write_circuit_tracer(layers, tmp_path / "relu", ("mlp.hook_in", "mlp.hook_out"))
    folder = write_sparsify(layers, tmp_path / "sparsify", k=layers[0]["W_enc"].shape[0])
    read = read_set(folder)
    assert (read.format, read.input_hook, read.output_hook) == ("sparsify", "mlp.hook_in", "mlp.hook_out")
    options = core.GraphOptions(**OPTIONS)
    assert_same_graph(tfcli_graph(path, folder, options), tfcli_graph(path, relu, options))


def test_on_gemma_2_the_output_hooks_land_either_side_of_the_norm(gemma2, tmp_path):
    """SAELens's `hook_mlp_out` is what the sublayer adds to the residual stream (the post-feedforward norm's output),
    the circuit-tracer set's hook; sparsify's `model.layers.L.mlp` is the MLP module's output, before that norm: its
    graph is test_graph's hand computation with the module's output replaced."""
    path, hf, transcoders = gemma2
    layers = circuit_tracer_layers(transcoders)
    options = core.GraphOptions(**OPTIONS)
    saelens = write_saelens(layers, tmp_path / "saelens", ("mlp.hook_in", "hook_mlp_out"))
    assert_same_graph(tfcli_graph(path, saelens, options), tfcli_graph(path, transcoders, options))
    sparsify = write_sparsify(layers, tmp_path / "sparsify", k=layers[0]["W_enc"].shape[0],
                              hookpoint="model.layers.{}.mlp")
    module_output = write_circuit_tracer(layers, tmp_path / "module", ("mlp.hook_in", "mlp.hook_out"))
    ours = tfcli_graph(path, sparsify, core.GraphOptions(validate=0))
    adjacency, features, logit_ids, _ = hand_graph(hf, module_output, "mlp.hook_out", ours.ids)
    assert len(features) >= 20 and torch.equal(ours.active_features, features) and ours.logit_ids == logit_ids
    assert scaled_difference(ours.adjacency, adjacency) <= 1e-4
    post_norm = tfcli_graph(path, transcoders, core.GraphOptions(validate=0))
    assert scaled_difference(ours.adjacency, post_norm.adjacency) > 1e-2  # the two sites give two graphs


# ------------------------------------------------------------------------------------------ the formats' forwards


def random_layer(d: int = 16, features: int = 48, seed: int = 3) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"W_enc": torch.randn(features, d, generator=generator) / d ** 0.5,
            "b_enc": torch.randn(features, generator=generator) * 0.3,
            "W_dec": torch.randn(features, d, generator=generator),
            "b_dec": torch.randn(d, generator=generator) * 0.1,
            THRESHOLD: torch.randn(features, generator=generator) * 0.3,  # some negative
            "W_skip": torch.randn(d, d, generator=generator) * 0.1}


def saelens_forward(weights: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sae_lens/saes/transcoder.py, JumpReLUSkipTranscoder: process_sae_in leaves x as it is (no b_dec for a
    transcoder), hidden_pre = x @ W_enc + b_enc, acts = relu(hidden_pre) * (hidden_pre > threshold),
    out = acts @ W_dec + b_dec + x @ W_skip.T."""
    pre = x @ weights["W_enc"] + weights["b_enc"]
    acts = torch.relu(pre) * (pre > weights["threshold"]).float()
    return acts, acts @ weights["W_dec"] + weights["b_dec"] + x @ weights["W_skip"].T


def sparsify_forward(weights: dict, x: torch.Tensor, k: int, groupmax: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """sparsify's SparseCoder: encode (transcode: no b_dec subtracted) = fused_encoder's relu(linear(x)) and its
    top k (groupmax: the largest of each of k groups, its index offset by the group's start); decode = the k rows of
    W_dec by their activations + b_dec; forward adds x @ W_skip.mT."""
    pre = torch.relu(x @ weights["encoder.weight"].T + weights["encoder.bias"])
    if groupmax:
        values, indices = pre.unflatten(-1, (k, -1)).max(dim=-1)
        indices = indices + torch.arange(0, pre.shape[-1], pre.shape[-1] // k)
    else:
        values, indices = pre.topk(k, dim=-1, sorted=False)
    out = (values[..., None] * weights["W_dec"][indices]).sum(-2) + weights["b_dec"]
    acts = torch.zeros_like(pre).scatter_(-1, indices, values)
    return acts, out + x @ weights["W_skip"].mT


def test_the_formats_own_forwards_equal_tfclis_encode_and_decode(tmp_path):
    layer = random_layer()
    x = torch.randn(50, 16, generator=torch.Generator().manual_seed(4))
    saelens = read_set(write_saelens([layer], tmp_path / "saelens", ("mlp.hook_in", "hook_mlp_out")))
    weights = load_file(str(tmp_path / "saelens" / "layer_0" / "sae_weights.safetensors"))
    acts, out = saelens_forward(weights, x)
    pre = x @ weights["W_enc"] + weights["b_enc"]
    assert int(((pre > weights["threshold"]) & (pre <= 0)).sum()) > 0  # a negative threshold the ReLU overrules
    assert 0 < int((acts > 0).sum()) < acts.numel()
    assert torch.allclose(saelens.encode(0, x), acts, atol=1e-6)
    assert torch.allclose(saelens.decode(0, saelens.encode(0, x), x), out, atol=1e-5)

    k = 5
    sparsify = read_set(write_sparsify([layer], tmp_path / "sparsify", k=k))
    weights = load_file(str(tmp_path / "sparsify" / "layers.0.mlp" / "sae.safetensors"))
    acts, out = sparsify_forward(weights, x, k)
    assert int((acts > 0).sum(-1).max()) == k < int((x @ weights["encoder.weight"].T + weights["encoder.bias"] > 0)
                                                   .sum(-1).min())  # the top-k drops positive pre-activations
    assert torch.allclose(sparsify.encode(0, x), acts, atol=1e-6)
    assert torch.allclose(sparsify.decode(0, sparsify.encode(0, x), x), out, atol=1e-5)

    groupmax = read_set(write_sparsify([layer], tmp_path / "groupmax", k=6, activation="groupmax"))
    acts, out = sparsify_forward(weights, x, 6, groupmax=True)
    assert groupmax.activation == "groupmax (k 6)" and not torch.equal(acts, sparsify_forward(weights, x, 6)[0])
    assert torch.allclose(groupmax.encode(0, x), acts, atol=1e-6)
    assert torch.allclose(groupmax.decode(0, groupmax.encode(0, x), x), out, atol=1e-5)


def test_the_libraries_read_these_files_as_written(tmp_path):
    """The files written above are the formats: sae-lens's SAE.load_from_disk and sparsify's
    SparseCoder.load_from_disk read them and compute what the hand-written forwards compute."""
    layer = random_layer()
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(5))
    saelens = write_saelens([layer], tmp_path / "saelens", ("mlp.hook_in", "hook_mlp_out")) / "layer_0"
    sparsify = write_sparsify([layer], tmp_path / "sparsify", k=5) / "layers.0.mlp"
    try:
        from sae_lens import SAE
    except ImportError:
        SAE = None
    if SAE is not None:
        library = SAE.load_from_disk(str(saelens), device="cpu")
        acts, out = saelens_forward(load_file(str(saelens / "sae_weights.safetensors")), x)
        with torch.no_grad():
            assert torch.allclose(library.encode(x), acts, atol=1e-6)
            assert torch.allclose(library(x), out, atol=1e-5)
    sparse_coder = pytest.importorskip("sparsify", reason="eai-sparsify reads sparsify's files").SparseCoder
    library = sparse_coder.load_from_disk(sparsify)
    acts, out = sparsify_forward(load_file(str(sparsify / "sae.safetensors")), x, 5)
    with torch.no_grad():
        assert torch.allclose(library(x).sae_out, out, atol=1e-5)


# ------------------------------------------------------------------------------------------ refusals


def broken_sets(transcoders, tmp_path) -> list[tuple[str, object, str]]:
    """(name, folder, the error's words) for each bad set, made from the Llama's."""
    layers = circuit_tracer_layers(transcoders)
    good = write_saelens(layers, tmp_path / "good", ("mlp.hook_in", "hook_mlp_out"))

    def copy(name):
        return shutil.copytree(good, tmp_path / name)

    missing = copy("missing")
    shutil.rmtree(missing / "layer_1")
    garbage = copy("garbage")
    (garbage / "layer_2" / "cfg.json").write_text("{\"d_in\": 32, ")
    unmapped = copy("unmapped")
    config = json.loads((unmapped / "layer_0" / "cfg.json").read_text())
    config["metadata"]["hook_name"] = "blocks.0.ln2.hook_normalized"
    (unmapped / "layer_0" / "cfg.json").write_text(json.dumps(config))
    narrow = write_saelens([{name: (value[:16] if name in ("b_dec",) else value[:, :16] if name in ("W_enc", "W_dec")
                                    else value[:16, :16] if name == "W_skip" else value)
                             for name, value in tensors.items()} for tensors in layers],
                           tmp_path / "narrow", ("mlp.hook_in", "hook_mlp_out"))
    block = write_sparsify([{n: v for n, v in t.items() if n != THRESHOLD} for t in layers], tmp_path / "block", k=4,
                           hookpoint="layers.{}")
    sae = copy("sae")
    config = json.loads((sae / "layer_0" / "cfg.json").read_text())
    (sae / "layer_0" / "cfg.json").write_text(json.dumps({**config, "architecture": "jumprelu"}))
    return [("missing layer", missing, "no transcoder for layer 1 (the folders hold layers 0, 2)"),
            ("garbage cfg.json", garbage, "layer_2/cfg.json is not readable JSON"),
            ("unmapped hook", unmapped, "its hook_name blocks.0.ln2.hook_normalized maps to no tfcli site"),
            ("another width", narrow, "read 16 values per token, but llama is 32 wide"),
            ("a block's hookpoint", block, "the hookpoint layers.0 maps to no tfcli site"),
            ("no transcoder", sae, "layer_0 is a jumprelu SAE, not a transcoder")]


def test_bad_sets_are_one_error_line_before_any_model(llama, cli, tmp_path, no_model_built):
    path, _, transcoders = llama
    for name, folder, words in broken_sets(transcoders, tmp_path):
        result = cli("graph", "-m", str(path), "--transcoders", str(folder), PROMPT)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.exit_code == 1 and len(errors) == 1, (name, result.stderr)
        assert words in " ".join(result.stderr.split()), (name, result.stderr)
        assert "Traceback" not in result.stderr
