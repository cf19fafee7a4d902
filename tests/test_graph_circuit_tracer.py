"""`tfcli graph` against circuit-tracer 0.5.0 itself (its nnsight backend, offline on the CPU): the same tiny models
and transcoders, given to circuit-tracer as local directories, give the same graph.

circuit-tracer pins transformers 4.57 (this venv has 5.x), so it is installed apart,
`pip install --no-deps --target .references/ct -r tests/circuit-tracer.txt` (the README's test command does it), and
run in a subprocess with that folder first on the path, against this venv's torch; without it the test skips.

The families, the ones circuit-tracer's nnsight backend maps (utils/tl_nnsight_mapping.py) whose hooks tfcli reads:
- Llama, JumpReLU transcoders with a skip matrix, `mlp.hook_in` (the MLP's normalised input) -> `mlp.hook_out`; the
  token ids given (a special token first), then the text, tokenised by each, with `--max-feature-nodes 30` and batches
  of 8 (the influence-ranked feature rows).
- Gemma 2 (sandwich norms, soft-capping, a sliding window shorter than the prompt), JumpReLU transcoders,
  `hook_resid_mid` -> `hook_mlp_out` (circuit-tracer maps no `mlp.hook_in` for Gemma 2: its `ln2.hook_normalized` is
  the norm's output before its weight, which tfcli has no site for).
- SmolLM2-135M (slow: the real GGUF file, loaded by transformers and saved as a folder both read), random JumpReLU
  skip transcoders, "The capital of France is" (-> " Paris"), the 64 most influential features.
Compared: the adjacency to 1e-4 of its largest |entry|, the active and selected features, the input tokens, the logit
targets and their probabilities, prune_graph's node and edge masks and cumulative scores, compute_graph_scores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_graph import PROMPT, WORDS, scaled_difference, tfcli_graph, write_tokenizer, write_transcoders
from tfcli.commands.graph import core

CT = Path(__file__).resolve().parents[1] / ".references" / "ct"

SCRIPT = r'''
import json, sys
import torch, yaml
from safetensors.torch import save_file
from circuit_tracer import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
from circuit_tracer.utils.hf_utils import load_transcoders

out = []
for job in json.load(sys.stdin):
    folder = job["transcoders"]
    config = yaml.safe_load(open(f"{folder}/config.yaml"))
    config["transcoders"] = [f"{folder}/layer_{i}.safetensors" for i in range(job["layers"])]  # local: no hub
    cpu = torch.device("cpu")
    transcoders = load_transcoders(config, device=cpu, lazy_encoder=False, lazy_decoder=False)
    model = NNSightReplacementModel.from_pretrained_and_transcoders(job["model"], transcoders, device=cpu)
    prompt = job["prompt"] if isinstance(job["prompt"], str) else torch.tensor(job["prompt"])
    graph = attribute(prompt, model, batch_size=job["batch_size"], max_feature_nodes=job["max_feature_nodes"])
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


def tiny(family: str):
    """A tiny model of the family: (its config, its class, whether its transcoders have a skip matrix, their hooks)."""
    import transformers

    vocab = len(WORDS) + 3
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
        model_class, skip, hooks = transformers.LlamaForCausalLM, True, ("mlp.hook_in", "mlp.hook_out")
    else:
        config = transformers.Gemma2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                           max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                           sliding_window=4)
        model_class, skip, hooks = transformers.Gemma2ForCausalLM, False, ("hook_resid_mid", "hook_mlp_out")
    return config, model_class, skip, hooks


# (name, family, prompt: "ids" or "text", max feature nodes, batch size)
CASES = [("llama", "llama", "ids", None, 64), ("llama-top30", "llama", "text", 30, 8),
         ("gemma2", "gemma2", "text", None, 64)]


@pytest.fixture(scope="module")
def circuit_tracer(tmp_path_factory, save_hf_model):
    """Each case's model folder and circuit-tracer's graph of it (one subprocess for all)."""
    models = {}
    for family in ("llama", "gemma2"):
        path = tmp_path_factory.mktemp(f"ct-{family}")
        config, model_class, skip, hooks = tiny(family)
        hf = save_hf_model(model_class, config, path, perturb=True)
        write_tokenizer(path)
        write_transcoders(path / "transcoders", hf, family, True, skip, hooks)
        models[family] = (path, config.num_hidden_layers)
    out = tmp_path_factory.mktemp("ct-out")
    jobs, graphs = [], {}
    for name, family, prompt, top, batch in CASES:
        path, layers = models[family]
        options = core.GraphOptions(max_feature_nodes=top, batch_size=batch, validate=0)
        graphs[name] = tfcli_graph(path, path / "transcoders", options)
        jobs.append({"model": str(path), "transcoders": str(path / "transcoders"), "layers": layers,
                     "prompt": graphs[name].ids if prompt == "ids" else PROMPT, "max_feature_nodes": top,
                     "batch_size": batch, "out": str(out / f"{name}.safetensors")})
    theirs = run_circuit_tracer(jobs)
    return {name: (graphs[name], theirs[i], job["out"]) for i, ((name, *_), job) in enumerate(zip(CASES, jobs))}


def run_circuit_tracer(jobs: list[dict]) -> list[dict]:
    """SCRIPT in a subprocess with .references/ct first on the path, offline: each job's scores (its graph in its
    `out` file)."""
    env = {**os.environ, "PYTHONPATH": str(CT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(jobs), capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


INSTALLED = pytest.mark.skipif(not CT.is_dir(), reason=f"circuit-tracer 0.5.0 is not installed apart in {CT} (the "
                               "README's test command: pip install --no-deps --target .references/ct -r "
                               "tests/circuit-tracer.txt)")


@INSTALLED
@pytest.mark.parametrize("case", [case[0] for case in CASES])
def test_the_graph_is_circuit_tracers(circuit_tracer, case):
    assert_same(*circuit_tracer[case])


def assert_same(ours, scores: dict, file: str, features_kept: bool = True) -> None:
    """ours (a core.Graph) against circuit-tracer's `file` and `scores`; `features_kept`: pruning keeps some feature
    nodes and drops others (random transcoders on SmolLM2 leave its errors carrying nearly everything: none kept)."""
    from safetensors.torch import load_file

    theirs = load_file(file)
    assert theirs["input_tokens"].tolist() == ours.ids  # the same token convention (a special token first)
    assert len(ours.active_features) >= 20 and torch.equal(ours.active_features, theirs["active_features"])
    assert torch.equal(ours.selected, theirs["selected_features"])
    assert torch.allclose(ours.activation_values, theirs["activation_values"], rtol=1e-5, atol=1e-6)
    assert ours.logit_ids == scores["logit_ids"]
    assert torch.allclose(ours.logit_probabilities, theirs["logit_probabilities"], atol=1e-6)
    assert ours.adjacency.shape == theirs["adjacency"].shape
    assert scaled_difference(ours.adjacency, theirs["adjacency"]) <= 1e-4
    assert torch.equal(ours.pruned.node_mask, theirs["node_mask"])
    assert torch.equal(ours.pruned.edge_mask, theirs["edge_mask"])
    kept = int(ours.pruned.node_mask[:ours.n_features].sum())
    assert 0 < kept < ours.n_features if features_kept else kept < ours.n_features
    assert torch.allclose(ours.pruned.cumulative, theirs["cumulative"], atol=1e-5)
    assert abs(ours.replacement - scores["replacement"]) <= 1e-5
    assert abs(ours.completeness - scores["completeness"]) <= 1e-5


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory, smollm2_gguf):
    """SmolLM2-135M (transformers' float32 load of the GGUF file) saved as a transformers folder, which both read, with
    random JumpReLU skip transcoders on every layer. transformers 5 writes `rope_parameters` and a tokenizer class of
    its own; transformers 4.57 reads `rope_theta` (else 10,000, not SmolLM2's 100,000) and the fast tokenizer's class:
    both written as 4.57 reads them."""
    import transformers

    _, hf, tokenizer = smollm2_gguf
    path = tmp_path_factory.mktemp("ct-smollm2")
    config = transformers.LlamaConfig.from_dict(hf.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF load is marked quantized: not serializable
    plain = transformers.LlamaForCausalLM(config).eval()
    plain.load_state_dict(hf.state_dict())
    plain.save_pretrained(path)
    tokenizer.save_pretrained(path)
    saved = json.loads((path / "config.json").read_text())
    saved["rope_theta"] = saved["rope_parameters"]["rope_theta"]
    (path / "config.json").write_text(json.dumps(saved))
    tokens = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**tokens, "tokenizer_class": "PreTrainedTokenizerFast"}))
    write_transcoders(path / "transcoders", hf, "smollm2", True, True, ("mlp.hook_in", "mlp.hook_out"))
    return path, config.num_hidden_layers


@INSTALLED
@pytest.mark.slow
def test_smollm2s_graph_is_circuit_tracers(smollm2_folder, tmp_path):
    """The trained SmolLM2-135M (30 layers) on "The capital of France is", the 64 most influential features."""
    path, layers = smollm2_folder
    text, options = "The capital of France is", core.GraphOptions(max_feature_nodes=64, batch_size=16, validate=0)
    ours = tfcli_graph(path, path / "transcoders", options, text=text)
    assert ours.logit_labels[0] == " Paris"
    job = {"model": str(path), "transcoders": str(path / "transcoders"), "layers": layers, "prompt": text,
           "max_feature_nodes": 64, "batch_size": 16, "out": str(tmp_path / "smollm2.safetensors")}
    [scores] = run_circuit_tracer([job])
    assert_same(ours, scores, job["out"], features_kept=False)


PRUNE_SCRIPT = r'''
import json, sys, types
import torch
from safetensors.torch import load_file, save_file
from circuit_tracer.graph import find_threshold, prune_graph

job = json.loads(sys.argv[1])
cases = load_file(job["in"])
out = {}
for name in job["thresholds"]:
    for fraction in job["fractions"]:
        out[f"{name}@{fraction}"] = find_threshold(cases[name], fraction).reshape(1)
for graph in job["graphs"]:
    adjacency = cases[graph["name"]]
    shaped = types.SimpleNamespace(adjacency_matrix=adjacency, input_tokens=torch.zeros(graph["tokens"]),
                                   logit_targets=[None] * graph["logits"],
                                   selected_features=torch.zeros(graph["features"]),
                                   logit_probabilities=cases[graph["name"] + ".p"])
    pruned = prune_graph(shaped, 0.8, 0.98)
    out[graph["name"] + ".node_mask"] = pruned.node_mask
    out[graph["name"] + ".edge_mask"] = pruned.edge_mask
    out[graph["name"] + ".cumulative"] = pruned.cumulative_scores.float()
save_file(out, job["out"])
'''


def sparse_dag(generator, features: int, errors: int, tokens: int, logits: int, density: float):
    """A random adjacency in circuit-tracer's node order (features, errors, tokens, logits; rows targets): each feature
    and logit reads some earlier features and errors and any token (a DAG: a feature reads only features before it),
    `density` of the possible edges nonzero, some of them equal (ties)."""
    n = features + errors + tokens + logits
    adjacency = torch.zeros(n, n)
    readers = [*range(features), *range(n - logits, n)]
    for row in readers:
        sources = torch.cat([torch.arange(min(row, features)), torch.arange(features, n - logits)])
        chosen = sources[torch.rand(len(sources), generator=generator) < density]
        weights = torch.randn(len(chosen), generator=generator)
        weights[::7] = 0.25  # ties
        adjacency[row, chosen] = weights
    probabilities = torch.softmax(torch.randn(logits, generator=generator), 0)
    return adjacency, probabilities


@INSTALLED
def test_pruning_and_its_thresholds_are_circuit_tracers_on_sparse_graphs(tmp_path):
    """influence.threshold_of (which sorts only the positive scores) against circuit-tracer's find_threshold (which
    sorts them all) on scores mostly zero, with ties, negatives, -0.0, none zero or all zero, at fractions up to 1.0
    (the threshold then a zero); and influence.prune against prune_graph on sparse random DAGs: the same masks."""
    from safetensors.torch import load_file, save_file

    from tfcli.commands.graph import influence

    generator = torch.Generator().manual_seed(0)
    mostly_zero = torch.zeros(20000)
    mostly_zero[torch.randperm(20000, generator=generator)[:300]] = torch.rand(300, generator=generator)
    tied = torch.zeros(5000)
    tied[:400] = torch.tensor([0.5, 0.25, 0.125, 0.125]).repeat(100)
    signed = torch.randn(3000, generator=generator) * (torch.rand(3000, generator=generator) < 0.1)
    negative_zero = torch.zeros(1000)
    negative_zero[:500] = -0.0
    negative_zero[600:650] = torch.rand(50, generator=generator)
    cases = {"mostly_zero": mostly_zero, "tied": tied, "signed": signed, "negative_zero": negative_zero,
             "none_zero": torch.rand(2000, generator=generator) + 0.1, "all_zero": torch.zeros(100),
             "one": torch.tensor([0.7])}
    thresholds = list(cases)
    graphs = []
    for name, (features, errors, tokens, logits, density) in {"dense": (60, 20, 5, 3, 0.5),
                                                               "sparse": (400, 90, 9, 6, 0.02)}.items():
        adjacency, probabilities = sparse_dag(generator, features, errors, tokens, logits, density)
        cases[name], cases[name + ".p"] = adjacency, probabilities
        graphs.append({"name": name, "features": features, "tokens": tokens, "logits": logits})
    fractions = [0.0, 0.5, 0.8, 0.98, 0.999999, 1.0]
    save_file(cases, str(tmp_path / "in.safetensors"))
    job = {"in": str(tmp_path / "in.safetensors"), "out": str(tmp_path / "out.safetensors"),
           "thresholds": thresholds, "fractions": fractions, "graphs": graphs}
    env = {**os.environ, "PYTHONPATH": str(CT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", PRUNE_SCRIPT, json.dumps(job)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = load_file(job["out"])
    for name in thresholds:
        for fraction in fractions:
            ours = influence.threshold_of(cases[name], fraction)
            assert ours.item() == theirs[f"{name}@{fraction}"].item(), (name, fraction)
    for graph in graphs:
        name = graph["name"]
        ours = influence.prune(cases[name], cases[name + ".p"], graph["features"], graph["tokens"])
        assert torch.equal(ours.node_mask, theirs[name + ".node_mask"]), name
        assert torch.equal(ours.edge_mask, theirs[name + ".edge_mask"]), name
        kept = int(ours.node_mask[:graph["features"]].sum())
        assert 0 < kept < graph["features"], (name, kept)
        assert torch.allclose(ours.cumulative, theirs[name + ".cumulative"], atol=1e-6), name
