"""`tfcli graph`: attribution graphs through per-layer transcoders, against a hand computation on transformers' own
modules (autograd, attention patterns and norm divisors detached) and circuit-tracer's definitions of pruning and
scores; the transcoder reader's refusals; the CLI's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tfcli
from tfcli.analysis.transcoders import check_transcoders, read_transcoders
from tfcli.api import load_tokenizer_for
from tfcli.commands.graph import core, influence
from tfcli.commands.graph.transcoder_sets import read_set
from tfcli.sources import resolve_source

WORDS = ("the cat sat on mat and dog ran to a big red house in park saw bird flew over tree is was of "
         "it by with").split()
PROMPT = "the cat sat on the mat and the dog ran to"
FEATURES = 40
TIED = FEATURES - 1  # a feature whose pre-activation equals its JumpReLU threshold exactly everywhere


def write_tokenizer(path) -> None:
    """A word-level tokenizer.json (<unk> 0, <s> 1 special, </s> 2) and a tokenizer_config.json naming them."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken("<unk>", special=True), AddedToken("<s>", special=True),
                                AddedToken("</s>", special=True)])
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}))


def write_transcoders(path, hf, family: str, jumprelu: bool, skip: bool, hooks: tuple[str, str], seed: int = 1):
    """Random transcoders in circuit-tracer's format, scaled so that about a third of the features fire on the
    prompt's tokens; with `jumprelu`, feature TIED has W_enc 0 and b_enc = threshold = 0.5 (fires only if >=)."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    config = hf.config
    d, layers = config.hidden_size, config.num_hidden_layers
    path.mkdir()
    (path / "config.yaml").write_text(f"model_kind: transcoder_set\nfeature_input_hook: {hooks[0]}\n"
                                      f"feature_output_hook: {hooks[1]}\nscan: tiny-{family}\n")
    for layer in range(layers):
        w_enc = torch.randn(FEATURES, d, generator=generator) / d ** 0.5
        tensors = {"W_enc": w_enc, "b_enc": torch.randn(FEATURES, generator=generator) * 0.1 - 0.2,
                   "W_dec": torch.randn(FEATURES, d, generator=generator) * 0.3,
                   "b_dec": torch.randn(d, generator=generator) * 0.05}
        if jumprelu:
            tensors["activation_function.threshold"] = torch.rand(FEATURES, generator=generator) * 0.2
            tensors["W_enc"][TIED] = 0
            tensors["b_enc"][TIED] = 0.5
            tensors["activation_function.threshold"][TIED] = 0.5
        if skip:
            tensors["W_skip"] = torch.randn(d, d, generator=generator) * 0.05
        save_file(tensors, str(path / f"layer_{layer}.safetensors"))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory, save_hf_model):
    """A 3-block Llama (grouped-query attention, norms perturbed) with JumpReLU skip transcoders on the MLP's
    normalised input -> the MLP's output."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("graph-llama")
    config = LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    hf = save_hf_model(LlamaForCausalLM, config, path, perturb=True)
    write_tokenizer(path)
    transcoders = write_transcoders(path / "transcoders", hf, "llama", True, True, ("mlp.hook_in", "mlp.hook_out"))
    return path, hf, transcoders


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory, save_hf_model):
    """A 2-block Gemma 2 (sandwich norms, soft-capping, scaled embeddings) with ReLU transcoders on the MLP's
    normalised input -> what the MLP sublayer adds (the post-feedforward norm's output)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    path = tmp_path_factory.mktemp("graph-gemma2")
    config = Gemma2Config(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=4)
    hf = save_hf_model(Gemma2ForCausalLM, config, path, perturb=True)
    write_tokenizer(path)
    transcoders = write_transcoders(path / "transcoders", hf, "gemma2", False, False, ("mlp.hook_in", "hook_mlp_out"))
    return path, hf, transcoders


def modules_of(hf, output_hook: str):
    """transformers' modules: (each layer's feature-input module, output module, embedding, final norm)."""
    layers = hf.model.layers
    gemma = hasattr(layers[0], "pre_feedforward_layernorm")
    inputs = [layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm for layer in layers]
    outputs = [layer.post_feedforward_layernorm if gemma and output_hook == "hook_mlp_out" else layer.mlp
               for layer in layers]
    return inputs, outputs, hf.model.embed_tokens, hf.model.norm


def load_layers(folder):
    from safetensors.torch import load_file

    return [load_file(str(folder / f"layer_{i}.safetensors")) for i in range(len(list(folder.glob("layer_*"))))]


def encode(weights, x, at_least: bool = False):
    pre = x @ weights["W_enc"].T + weights["b_enc"]
    if "activation_function.threshold" not in weights:
        return torch.relu(pre)
    above = pre >= weights["activation_function.threshold"] if at_least else pre > weights["activation_function.threshold"]
    return pre * above


def hand_graph(hf, folder, output_hook: str, ids: list[int], freeze_attention: bool = True, freeze_norms: bool = True,
               demean: bool = True, at_least: bool = False):
    """circuit-tracer's adjacency computed on transformers' modules: forward hooks read the MLP inputs and outputs;
    a second pass with softmax and rsqrt detached (patched in torch for its duration), each MLP output replaced by
    skip + (output - skip).detach(), one autograd.grad per target. Returns (adjacency, features (n, 3), logit ids,
    probabilities). The flags plant the bugs the tests must catch."""
    inputs, outputs, embed, norm = modules_of(hf, output_hook)
    layers = load_layers(folder)
    prompt = torch.tensor([ids])
    seen = {}

    def saver(key):
        def hook(module, args, output):
            seen[key] = output
        return hook

    handles = [m.register_forward_hook(saver(("in", i))) for i, m in enumerate(inputs)]
    handles += [m.register_forward_hook(saver(("out", i))) for i, m in enumerate(outputs)]
    with torch.no_grad():
        logits = hf(prompt).logits[0, -1]
    for handle in handles:
        handle.remove()
    acts = []
    for layer, weights in enumerate(layers):
        act = encode(weights, seen["in", layer][0], at_least)
        act[0] = 0
        acts.append(act)
    stacked = torch.stack(acts)
    features = stacked.nonzero()
    values = stacked[features[:, 0], features[:, 1], features[:, 2]]
    errors = []
    for layer, weights in enumerate(layers):
        x = seen["in", layer][0]
        recon = acts[layer] @ weights["W_dec"] + weights["b_dec"] + (x @ weights["W_skip"].T if "W_skip" in weights else 0)
        error = seen["out", layer][0] - recon
        error[0] = 0
        errors.append(error)
    probabilities = torch.softmax(logits, -1)
    top, top_ids = torch.topk(probabilities, 10)
    chosen = top_ids[:int(torch.searchsorted(torch.cumsum(top, 0), 0.95)) + 1]
    unembed = hf.lm_head.weight.detach()
    vectors = unembed[chosen] - (unembed.mean(0) if demean else 0)

    live = {}

    def keep(key):
        def hook(module, args, output):
            live[key] = output
        return hook

    def frozen_output(layer):
        def hook(module, args, output):
            weights = layers[layer]
            skip = live["in", layer] @ weights["W_skip"].T if "W_skip" in weights else 0
            live["probe", layer] = torch.zeros_like(output, requires_grad=True)  # d target / d output, read here
            return skip + (output - skip).detach() + live["probe", layer]
        return hook

    def leaf_embedding(module, args, output):
        live["embed"] = output.detach().requires_grad_()
        return live["embed"]

    handles = [m.register_forward_hook(keep(("in", i))) for i, m in enumerate(inputs)]
    handles += [m.register_forward_hook(frozen_output(i)) for i, m in enumerate(outputs)]
    handles += [embed.register_forward_hook(leaf_embedding), norm.register_forward_hook(keep("final"))]
    softmax, rsqrt = torch.nn.functional.softmax, torch.rsqrt
    if freeze_attention:
        torch.nn.functional.softmax = lambda *a, **k: softmax(*a, **k).detach()
    if freeze_norms:
        torch.rsqrt = lambda *a, **k: rsqrt(*a, **k).detach()
    try:
        hf(prompt)
    finally:
        torch.nn.functional.softmax, torch.rsqrt = softmax, rsqrt
        for handle in handles:
            handle.remove()
    n, T, L = len(features), len(ids), len(layers)
    decoders = torch.stack([layers[l]["W_dec"][f] * v for (l, p, f), v in zip(features.tolist(), values)]) \
        if n else torch.zeros(0, hf.config.hidden_size)

    def row(value):
        grads = torch.autograd.grad(value, [*[live["probe", l] for l in range(L)], live["embed"]], retain_graph=True,
                                    allow_unused=True)
        grads = [torch.zeros(1, T, hf.config.hidden_size) if g is None else g for g in grads]
        feature_part = [grads[l][0, p] @ decoders[j] for j, (l, p, f) in enumerate(features.tolist())]
        error_part = [grads[l][0, p] @ errors[l][p] for l in range(L) for p in range(T)]
        token_part = [grads[L][0, p] @ live["embed"][0, p] for p in range(T)]
        return torch.stack([*feature_part, *error_part, *token_part]).detach()

    size = n + (L + 1) * T + len(chosen)
    adjacency = torch.zeros(size, size)
    for j, (l, p, f) in enumerate(features.tolist()):
        adjacency[j, :size - len(chosen)] = row(live["in", l][0, p] @ layers[l]["W_enc"][f])
    for k, vector in enumerate(vectors):
        adjacency[size - len(chosen) + k, :size - len(chosen)] = row(live["final"][0, -1] @ vector)
    return adjacency, features, chosen.tolist(), probabilities[chosen]


def tfcli_graph(path, transcoders, options=None, text=PROMPT):
    model = tfcli.load_model(str(path))
    source = resolve_source(str(path))
    tokenizer = load_tokenizer_for(source)
    read = read_set(transcoders)  # circuit-tracer's set, or SAELens's or sparsify's (test_transcoder_formats.py)
    check_transcoders(read, source.config)
    options = options or core.GraphOptions()
    ids = core.prompt_ids(source.config, tokenizer, text, lambda message: None)
    return core.attribute(model, tokenizer, read, text, ids, options)


def scaled_difference(ours, theirs) -> float:
    """max |ours - theirs| over the largest |theirs|."""
    return float((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max())


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_adjacency_equals_the_hand_computation(family, request):
    path, hf, transcoders = request.getfixturevalue(family)
    graph = tfcli_graph(path, transcoders)
    assert graph.ids[0] == 1 and len(graph.ids) == len(PROMPT.split()) + 1  # <s> put first
    hook = "mlp.hook_out" if family == "llama" else "hook_mlp_out"
    adjacency, features, logit_ids, probabilities = hand_graph(hf, transcoders, hook, graph.ids)
    assert 20 <= len(features) == len(graph.active_features)  # features fire, the same ones
    assert torch.equal(graph.active_features, features)
    assert graph.logit_ids == logit_ids and 1 <= len(logit_ids) <= 10
    assert torch.allclose(graph.logit_probabilities, probabilities, atol=1e-6)
    assert graph.adjacency.shape == adjacency.shape
    assert scaled_difference(graph.adjacency, adjacency) <= 1e-4


def hand_prune(adjacency, probabilities, n_features: int, n_tokens: int, node_threshold=0.8, edge_threshold=0.98):
    """circuit-tracer's pruning, written out in float64 numpy with the closed form of the influence,
    w ((I - Â)^-1 - I): (node influence, node mask, edge mask)."""
    a = adjacency.double().numpy()
    n_logits = len(probabilities)
    w = np.zeros(len(a))
    w[-n_logits:] = probabilities.double().numpy()

    def normal(m):
        m = np.abs(m)
        return m / np.maximum(m.sum(1, keepdims=True), 1e-10)

    def total(m):
        return w @ (np.linalg.inv(np.eye(len(m)) - m) - np.eye(len(m)))

    def cut(scores, fraction):
        ordered = np.sort(scores)[::-1]
        cumulative = np.cumsum(ordered) / ordered.sum()
        return ordered[min(int(np.searchsorted(cumulative, fraction)), len(ordered) - 1)]

    node = total(normal(a))
    keep = node >= cut(node, node_threshold)
    keep[-n_logits - n_tokens:] = True
    pruned = a * keep[:, None] * keep[None, :]
    edge_scores = normal(pruned) * (total(normal(pruned)) + w)[:, None]
    edges = edge_scores >= cut(edge_scores.ravel(), edge_threshold)
    inner = len(a) - n_logits - n_tokens
    while True:
        before = keep.copy()
        edges &= keep[:, None] & keep[None, :]
        keep[:inner] &= edges[:, :inner].any(0)
        keep[:n_features] &= edges[:n_features].any(1)
        if (keep == before).all():
            return node, keep, edges & keep[:, None] & keep[None, :]


def hand_scores(adjacency, probabilities, n_features, n_layers, n_tokens):
    a = np.abs(adjacency.double().numpy())
    a = a / np.maximum(a.sum(1, keepdims=True), 1e-10)
    w = np.zeros(len(a))
    w[-len(probabilities):] = probabilities.double().numpy()
    node = w @ (np.linalg.inv(np.eye(len(a)) - a) - np.eye(len(a)))
    errors = slice(n_features, n_features + n_layers * n_tokens)
    tokens = slice(errors.stop, errors.stop + n_tokens)
    replacement = node[tokens].sum() / (node[tokens].sum() + node[errors].sum())
    out = node + w
    return replacement, ((1 - a[:, errors].sum(1)) * out).sum() / out.sum()


def test_pruning_and_scores_equal_circuit_tracers_definitions(llama):
    path, _, transcoders = llama
    graph = tfcli_graph(path, transcoders)
    n, t = graph.n_features, graph.n_positions
    node, keep, edges = hand_prune(graph.adjacency, graph.logit_probabilities, n, t)
    assert np.abs(graph.pruned.node_influence.double().numpy() - node).max() <= 1e-5 * np.abs(node).max()
    assert torch.equal(graph.pruned.node_mask, torch.from_numpy(keep))
    kept_edges = graph.pruned.edge_mask & graph.pruned.node_mask[:, None] & graph.pruned.node_mask[None, :]
    assert torch.equal(kept_edges, torch.from_numpy(edges))
    assert 0 < int(keep[:n].sum()) < n  # pruning keeps some features and drops others
    replacement, completeness = hand_scores(graph.adjacency, graph.logit_probabilities, n, graph.n_layers, t)
    assert abs(graph.replacement - replacement) <= 1e-5 and abs(graph.completeness - completeness) <= 1e-5
    assert 0 < graph.replacement < 1 and 0 < graph.completeness < 1


def test_max_feature_nodes_keeps_the_most_influential_rows(llama):
    """With --max-feature-nodes K the graph's features are K of the active ones, chosen by influence, and each kept
    feature's row is its row in the full graph (its columns restricted to the kept features)."""
    path, _, transcoders = llama
    full = tfcli_graph(path, transcoders)
    small = tfcli_graph(path, transcoders, core.GraphOptions(max_feature_nodes=30, batch_size=8))
    assert small.n_features == 30 and len(small.active_features) == len(full.active_features)
    n, rest = full.n_features, full.adjacency.shape[0] - full.n_features
    columns = torch.cat([small.selected, torch.arange(n, n + rest)])
    rows = torch.cat([small.selected, torch.arange(n + rest - len(full.logit_ids), n + rest)])
    expected = full.adjacency[rows][:, columns]
    keep = torch.cat([torch.arange(30), torch.arange(small.adjacency.shape[0] - len(full.logit_ids),
                                                     small.adjacency.shape[0])])
    assert scaled_difference(small.adjacency[keep], expected) <= 1e-5
    influence_full = influence.influence(influence.normalized(full.adjacency),
                                         influence.logit_weights(full.adjacency, full.logit_probabilities))[:n]
    assert influence_full[small.selected].mean() > influence_full.mean()  # the chosen ones matter more than most


RECORD_KEYS = {"text", "ids", "tokens", "targets", "replacement_score", "completeness_score", "active_features",
               "feature_nodes", "node_threshold", "edge_threshold", "transcoders", "nodes", "edges", "validation"}
NODE_KEYS = {"index", "kind", "layer", "position", "feature", "text", "activation", "probability", "influence",
             "contexts"}


def test_cli_json_graph_out_and_save(llama, cli, tmp_path):
    """--json has the documented keys and is the pruned graph; --graph-out is circuit-tracer's frontend JSON of the
    same nodes and edges (error ids that no feature id can be); --save holds the whole graph."""
    from safetensors.torch import load_file

    path, _, transcoders = llama
    out, saved = tmp_path / "graph.json", tmp_path / "graph.safetensors"
    result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--json", "--graph-out", str(out),
                 "--save", str(saved), PROMPT)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert set(record) == RECORD_KEYS and all(set(node) == NODE_KEYS for node in record["nodes"])
    graph = tfcli_graph(path, transcoders)
    kept = graph.pruned.node_mask.nonzero()[:, 0].tolist()
    assert [node["index"] for node in record["nodes"]] == kept
    assert abs(record["replacement_score"] - graph.replacement) <= 1e-6
    front = json.loads(out.read_text())
    assert set(front) == {"metadata", "qParams", "nodes", "links"}
    assert front["metadata"]["prompt_tokens"] == graph.tokens and front["metadata"]["scan"] == "tiny-llama"
    ids = [node["node_id"] for node in front["nodes"]]
    assert len(ids) == len(set(ids))  # no error id clashes with a feature's
    assert {link["source"] for link in front["links"]} <= set(ids)
    assert len(front["links"]) == len(record["edges"])
    tensors = load_file(str(saved))
    assert torch.equal(tensors["adjacency"], graph.adjacency)
    assert torch.equal(tensors["active_features"], graph.active_features)
    assert tensors["input_tokens"].tolist() == graph.ids and tensors["logit_tokens"].tolist() == graph.logit_ids
    assert set(tensors) == {"adjacency", "active_features", "activation_values", "selected_features", "input_tokens",
                            "logit_tokens", "logit_probabilities"}


@pytest.mark.parametrize("width", [80, 120])
def test_view_keeps_every_token_and_number(llama, width):
    from tfcli.commands.graph import render
    from tfcli.render.layout import screen_text

    path, _, transcoders = llama
    graph = tfcli_graph(path, transcoders)
    lines = render.graph_lines(graph, width)
    assert all(line.cell_len <= width for line in lines)
    screen = " ".join(screen_text(lines, width).split())
    assert f"replacement score {graph.replacement:.3f}, completeness score {graph.completeness:.3f}" in screen
    for node in core.kept_nodes(graph):
        if node.kind == "feature":
            assert f"L{node.layer} f{node.feature}@{node.position} '{node.text}' influence {node.influence:.3g} " \
                   f"activation {node.activation:.3g}" in screen
    layers = [int(line.plain.split()[1]) for line in lines if line.plain.startswith("layer ")]
    headers = [line.plain for line in lines if line.plain in ("logits", "tokens") or line.plain.startswith("layer ")]
    assert layers == sorted(layers, reverse=True) and headers[0] == "logits" and headers[-1] == "tokens"


def test_target_and_foil_make_one_difference_node(llama):
    path, hf, transcoders = llama
    from tfcli.analysis.metric import Token

    options = core.GraphOptions(target=Token("dog", 9, "dog"), foil=Token("cat", 4, "cat"))
    graph = tfcli_graph(path, transcoders, options)
    assert graph.logit_ids == [9] and graph.logit_probabilities.tolist() == [1.0]
    full = tfcli_graph(path, transcoders, core.GraphOptions(target=Token("dog", 9, "dog")))
    other = tfcli_graph(path, transcoders, core.GraphOptions(target=Token("cat", 4, "cat")))
    difference = full.adjacency[-1] - other.adjacency[-1]  # demeaning cancels in a difference
    assert scaled_difference(graph.adjacency[-1], difference) <= 1e-5


def test_a_layer_of_the_set_reads_as_an_sae(llama):
    """`--sae DIR/layer_1.safetensors` (features, attribute --sae) reads one layer of the set as a transcoder."""
    from tfcli.analysis.sae import read_sae

    _, _, transcoders = llama
    sae = read_sae(transcoders / "layer_1.safetensors")
    assert sae.transcoder and sae.site == "blocks.1.mlp_norm.out" and sae.site_out == "blocks.1.mlp.out"
    x = torch.randn(5, sae.d_in)
    assert torch.allclose(sae.encode(x), read_transcoders(transcoders).encode(1, x))


def broken_sets(transcoders, tmp_path):
    """(name, folder, the error's words) for each bad set, made from a good one."""
    import shutil

    from safetensors.torch import load_file, save_file

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(transcoders, folder)
        return folder

    missing = copy("missing")
    (missing / "layer_1.safetensors").unlink()
    garbage = copy("garbage")
    (garbage / "config.yaml").write_text("model_kind: [transcoder_set\n  : :\n")
    hook = copy("hook")
    (hook / "config.yaml").write_text("model_kind: transcoder_set\nfeature_input_hook: hook_resid_pre\n"
                                      "feature_output_hook: hook_mlp_out\n")
    fewer = copy("fewer")
    (fewer / "layer_2.safetensors").unlink()
    narrow = copy("narrow")
    for file in narrow.glob("layer_*.safetensors"):
        narrowed = {"W_enc": lambda v: v[:, :16], "W_dec": lambda v: v[:, :16], "W_skip": lambda v: v[:16, :16],
                    "b_dec": lambda v: v[:16]}
        save_file({name: narrowed.get(name, lambda v: v)(value).contiguous()
                   for name, value in load_file(str(file)).items()}, str(file))
    return [("missing layer", missing, "layer_1.safetensors is missing"),
            ("garbage config", garbage, "is not readable YAML"),
            ("unmapped hook", hook, "hook_resid_pre maps to no tfcli site"),
            ("layer count", fewer, "2 layers of transcoders, but"),
            ("another width", narrow, "read 16 values per token, but llama is 32 wide"),
            ("no folder", tmp_path / "nowhere", "no such folder")]


def test_bad_input_is_one_error_line_before_any_model(llama, cli, tmp_path, no_model_built):
    path, _, transcoders = llama
    cases = [(name, ("--transcoders", str(folder), PROMPT), words)
             for name, folder, words in broken_sets(transcoders, tmp_path)]
    broken = {name for name, _, _ in cases}  # the transcoder folders' errors
    cases += [("empty prompt", ("--transcoders", str(transcoders), "  "), "text 1 is only whitespace"),
              ("negative validate", ("--transcoders", str(transcoders), "--validate", "-1", PROMPT),
               "--validate must be at least 0"),
              ("no transcoders", (PROMPT,), "--transcoders is required"),
              ("zero feature nodes", ("--transcoders", str(transcoders), "--max-feature-nodes", "0", PROMPT),
               "--max-feature-nodes must be at least 1"),
              ("threshold", ("--transcoders", str(transcoders), "--node-threshold", "1.5", PROMPT), "between 0 and 1"),
              ("foil alone", ("--transcoders", str(transcoders), "--foil", "cat", PROMPT), "--foil goes with --target")]
    for name, args, words in cases:
        result = cli("graph", "-m", str(path), *args)
        # docs/errors.md: a transcoder folder missing, malformed or not fitting the model is a file's error (1), an
        # option or argument typed wrong a usage error (2)
        assert result.exit_code == (1 if name in broken else 2), (name, result.stdout, result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and words in " ".join(result.stderr.split()), (name, result.stderr)
        assert "Traceback" not in result.stderr


def test_blank_texts_and_taken_files_are_one_error_line(llama, cli, tmp_path):
    """A --file of blank lines (exit 2), a numbered --graph-out file that exists (exit 1, as for one prompt's): one
    error line, no model built (none said on stderr; the lines are read after the transcoders are checked against
    the model's sites, a pass on the meta device that no_model_built would refuse)."""
    path, _, transcoders = llama
    blank, taken = tmp_path / "blank.txt", tmp_path / "g-2.json"
    blank.write_text("\n  \n")
    taken.write_text("{}")
    for args, code, words in ((("--file", str(blank)), 2, "holds only blank lines"),
                              (("--graph-out", str(tmp_path / "g.json"), PROMPT, PROMPT), 1, "g-2.json already exists")):
        result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), *args)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.exit_code == code and len(errors) == 1 and words in errors[0], result.stderr
        assert "model:" not in result.stderr and "Traceback" not in result.stderr


def test_an_encoder_is_refused_by_name(cli, tmp_path, llama, no_model_built):
    _, _, transcoders = llama
    result = cli("graph", "-m", "bert-base", "--transcoders", str(transcoders), PROMPT)
    assert result.exit_code == 2 and "attribution graphs are for decoders" in " ".join(result.stderr.split())


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_site_names_are_the_sites_site_shapes_lists(family, request):
    """core.site_names (one pass of the model on one token) lists the sites model.site_shapes() (a pass on the meta
    device) lists, in the same order: the transcoders' hooks are placed and the replacement model's patterns and norm
    scales frozen by these names."""
    path, _, _ = request.getfixturevalue(family)
    model = tfcli.load_model(str(path))
    names = core.site_names(model)
    assert names == list(model.site_shapes())
    assert any(name.endswith(".attn.pattern") for name in names) and any(name.endswith(".scale") for name in names)


def test_a_hook_the_blocks_lack_is_one_error_line(cli, tmp_path, save_hf_model):
    """hook_resid_mid on GPT-NeoX's parallel blocks, which have no resid_mid: refused by name once the model is built
    (the sites come from a pass of the model itself), one error line, exit 1 (the transcoders do not fit it)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, max_position_embeddings=64, use_parallel_residual=True,
                           bos_token_id=1, eos_token_id=2)
    hf = save_hf_model(GPTNeoXForCausalLM, config, tmp_path, perturb=True)
    write_tokenizer(tmp_path)
    transcoders = write_transcoders(tmp_path / "tc", hf, "neox", True, False, ("hook_resid_mid", "hook_mlp_out"))
    result = cli("graph", "-m", str(tmp_path), "--transcoders", str(transcoders), PROMPT)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.stderr
    assert "hook_resid_mid maps to resid_mid, which" in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("shared", [False, True])
def test_values_only_gradient_equals_the_whole_projections(llama, monkeypatch, shared):
    """core.values_only (attention's gradient through the values' rows of the fused projection alone) gives the rows
    the whole projection's gradient gives (values_only off), also where two layers share one block (its projection
    then hooked twice: each v site takes the input its own call put last)."""
    path, _, transcoders = llama
    model, source = tfcli.load_model(str(path)), resolve_source(str(path))
    if shared:
        model.output_stack.blocks[2] = model.output_stack.blocks[1]
    tokenizer, read = load_tokenizer_for(source), read_set(transcoders)
    check_transcoders(read, source.config)
    ids = core.prompt_ids(source.config, tokenizer, PROMPT, lambda message: None)
    options = core.GraphOptions(validate=0, batch_size=16)
    ours = core.attribute(model, tokenizer, read, PROMPT, ids, options).adjacency
    monkeypatch.setattr(core, "values_only", lambda model, hooks: [])
    whole = core.attribute(model, tokenizer, read, PROMPT, ids, options).adjacency
    assert ours.shape == whole.shape and ours.abs().max() > 0
    assert scaled_difference(ours, whole) <= 1e-5
