"""`tfcli graph` through circuit-tracer's cross-layer transcoders (config.yaml `model_kind: cross_layer_transcoder`,
`W_enc_{i}.safetensors` and `W_dec_{i}.safetensors`, layer i's features writing every layer from i on).

- Against circuit-tracer 0.5.0 itself (its `load_clt` and nnsight backend, offline on the CPU, as
  tests/test_graph_circuit_tracer.py runs it): random JumpReLU CLTs on the tiny Llama, `mlp.hook_in` ->
  `hook_mlp_out`, every decoder (the cross-layer ones too) random: the same graph, all features and the 30 most
  influential (batches of 8).
- A CLT whose cross-layer decoders are zero is the per-layer set of the same weights: the same graph, validation
  included (each feature's removal measured in the model at every layer it writes).
- Refusals: a missing W_dec file, a decoder of the wrong shape: one `error:` line, exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from test_graph import PROMPT, llama, scaled_difference, tfcli_graph  # noqa: F401 (fixtures)
from test_graph_circuit_tracer import CT, INSTALLED, assert_same
from test_transcoder_formats import assert_same_graph, write_circuit_tracer
from tfcli.commands.graph import core

FEATURES = 40
HOOKS = ("mlp.hook_in", "hook_mlp_out")


def write_clt(folder, d: int, layers: int, seed: int = 5, cross: bool = True, hooks=HOOKS):
    """A random JumpReLU CLT in circuit-tracer's files (CrossLayerTranscoder.to_safetensors), scaled as
    test_graph's per-layer sets so that about a third of the features fire; `cross` False: the decoders to later
    layers zero. Returns each layer's tensors as a per-layer set has them (W_dec: its own layer's rows)."""
    generator = torch.Generator().manual_seed(seed)
    folder.mkdir()
    (folder / "config.yaml").write_text(f"model_kind: cross_layer_transcoder\nfeature_input_hook: {hooks[0]}\n"
                                        f"feature_output_hook: {hooks[1]}\nscan: tiny-clt\n")
    own = []
    for i in range(layers):
        w_enc = torch.randn(FEATURES, d, generator=generator) / d ** 0.5
        b_enc = torch.randn(FEATURES, generator=generator) * 0.1 - 0.2
        b_dec = torch.randn(d, generator=generator) * 0.05
        threshold = torch.rand(FEATURES, generator=generator) * 0.2
        w_dec = torch.randn(FEATURES, layers - i, d, generator=generator) * 0.3 / (layers - i) ** 0.5
        if not cross:
            w_dec[:, 1:] = 0
        save_file({f"W_enc_{i}": w_enc, f"b_enc_{i}": b_enc, f"b_dec_{i}": b_dec, f"threshold_{i}": threshold},
                  str(folder / f"W_enc_{i}.safetensors"))
        save_file({f"W_dec_{i}": w_dec}, str(folder / f"W_dec_{i}.safetensors"))
        own.append({"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec[:, 0].contiguous(), "b_dec": b_dec,
                    "activation_function.threshold": threshold})
    return folder, own


def test_a_clt_without_cross_layer_decoders_is_the_per_layer_set(llama, tmp_path):
    path, hf, _ = llama
    clt, own = write_clt(tmp_path / "clt", hf.config.hidden_size, hf.config.num_hidden_layers, cross=False)
    per_layer = write_circuit_tracer(own, tmp_path / "set", HOOKS)
    options = core.GraphOptions(validate=5)
    ours = tfcli_graph(path, clt, options)
    assert ours.transcoders["cross_layer"] and ours.transcoders["activation"] == "jumprelu"
    assert_same_graph(ours, tfcli_graph(path, per_layer, options))


CLT_SCRIPT = r'''
import json, sys
import torch
from safetensors.torch import save_file
from circuit_tracer import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

out = []
for job in json.load(sys.stdin):
    cpu = torch.device("cpu")
    clt = load_clt(job["transcoders"], feature_input_hook=job["hooks"][0], feature_output_hook=job["hooks"][1],
                   scan="tiny-clt", device=cpu, dtype=torch.float32, lazy_decoder=False)
    model = NNSightReplacementModel.from_pretrained_and_transcoders(job["model"], clt, device=cpu)
    graph = attribute(torch.tensor(job["prompt"]), model, batch_size=job["batch_size"],
                      max_feature_nodes=job["max_feature_nodes"])
    pruned = prune_graph(graph, 0.8, 0.98)
    replacement, completeness = compute_graph_scores(graph)
    save_file({"adjacency": graph.adjacency_matrix.float().contiguous(),
               "active_features": graph.active_features.contiguous(),
               "selected_features": graph.selected_features.contiguous(),
               "activation_values": graph.activation_values.float().contiguous(),
               "logit_probabilities": graph.logit_probabilities.float().contiguous(),
               "input_tokens": graph.input_tokens.contiguous(), "node_mask": pruned.node_mask.contiguous(),
               "edge_mask": pruned.edge_mask.contiguous(),
               "cumulative": pruned.cumulative_scores.float().contiguous()}, job["out"])
    out.append({"replacement": replacement, "completeness": completeness,
                "logit_ids": [int(target.vocab_idx) for target in graph.logit_targets]})
print(json.dumps(out))
'''


@INSTALLED
def test_a_clts_graph_is_circuit_tracers(llama, tmp_path):
    path, hf, _ = llama
    clt, _ = write_clt(tmp_path / "clt", hf.config.hidden_size, hf.config.num_hidden_layers)
    jobs, ours = [], []
    for top, batch in ((None, 64), (30, 8)):
        graph = tfcli_graph(path, clt, core.GraphOptions(max_feature_nodes=top, batch_size=batch, validate=0))
        ours.append(graph)
        jobs.append({"model": str(path), "transcoders": str(clt), "hooks": list(HOOKS), "prompt": graph.ids,
                     "max_feature_nodes": top, "batch_size": batch, "out": str(tmp_path / f"ct-{top}.safetensors")})
    env = {**os.environ, "PYTHONPATH": str(CT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CLT_SCRIPT], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    for graph, scores, job in zip(ours, theirs, jobs):
        assert_same(graph, scores, job["out"])


def test_a_broken_clt_is_one_error_line(llama, cli, tmp_path, no_model_built):
    path, hf, _ = llama
    d, layers = hf.config.hidden_size, hf.config.num_hidden_layers
    missing, _ = write_clt(tmp_path / "missing", d, layers)
    (missing / "W_dec_1.safetensors").unlink()
    wrong, _ = write_clt(tmp_path / "wrong", d, layers)
    save_file({"W_dec_1": torch.zeros(FEATURES, layers, d)}, str(wrong / "W_dec_1.safetensors"))
    for folder, words in ((missing, "the cross-layer transcoder's W_dec_1.safetensors is missing"),
                          (wrong, f"layer 1's tensors do not fit: W_dec ({FEATURES}, {layers}, {d}) (expected "
                                  f"({FEATURES}, {layers - 1}, {d}))")):
        result = cli("graph", "-m", str(path), "--transcoders", str(folder), PROMPT)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.exit_code == 1 and len(errors) == 1, result.stderr
        assert words in " ".join(result.stderr.split()) and "Traceback" not in result.stderr


def test_a_clt_features_removal_is_measured_at_every_layer_it_writes(llama, tmp_path):
    """validation's measured effect of removing a CLT feature (layer i, position p, activation a): transformers' own
    pass with each MLP j >= i lowered at p by a W_dec_i[feature, j - i] (forward hooks), the change of the final
    norm's output at the last position read along the first target's demeaned unembedding row."""
    from safetensors.torch import load_file

    path, hf, _ = llama
    clt, _ = write_clt(tmp_path / "clt", hf.config.hidden_size, hf.config.num_hidden_layers)
    graph = tfcli_graph(path, clt, core.GraphOptions(validate=4))
    unembed = hf.lm_head.weight.detach()
    vector = unembed[graph.logit_ids[0]] - unembed.mean(0)
    prompt = torch.tensor([graph.ids])

    def readout(hooks):
        seen = {}
        handles = [hf.model.norm.register_forward_hook(lambda m, a, out: seen.setdefault("x", out.detach()))]
        handles += [hf.model.layers[j].mlp.register_forward_hook(hook) for j, hook in hooks]
        try:
            with torch.no_grad():
                hf(prompt)
        finally:
            for handle in handles:
                handle.remove()
        return float(seen["x"][0, -1] @ vector)

    clean = readout([])
    assert len(graph.validation.nodes) == 4
    for node, measured in zip(graph.validation.nodes, graph.validation.measured):
        layer, position, feature = graph.active_features[int(graph.selected[node])].tolist()
        value = float(graph.activation_values[int(graph.selected[node])])
        w_dec = load_file(str(clt / f"W_dec_{layer}.safetensors"))[f"W_dec_{layer}"][feature]

        def lowered(j, row=None):
            def hook(module, args, output):
                output = output.clone()
                output[0, position] -= value * w_dec[j - layer]
                return output
            return hook
        hand = readout([(j, lowered(j)) for j in range(layer, hf.config.num_hidden_layers)]) - clean
        assert measured == pytest.approx(hand, rel=1e-4, abs=1e-6)
    assert any(layer < hf.config.num_hidden_layers - 1 for layer, _, _ in
               graph.active_features[graph.selected[graph.validation.nodes]].tolist())  # a cross-layer write counts
