"""`tfcli circuit` against the same quantities computed by hand on transformers' own modules: tiny checkpoints saved by
transformers inside the tests, GPT-2 (LayerNorm, biases perturbed), Llama with grouped-query attention (RMSNorm,
rotary; its key and value inputs taken per query head on the same model with its key/value heads repeated, as the
EAP-IG reference ungroups them) and, for EAP and faithfulness, GPT-J (attention and MLP in parallel on one norm: an
MLP does not read its own block's heads). A receiver's own input is made by hand: a zero `eps` added to the residual
stream as that receiver alone reads it (one head's query, key or value columns of the projection recomputed from the
norm of x + eps, or the MLP's norm's or the final norm's input), and the gradient of the metric at eps is the
receiver's; a sender's output is read from the modules (the embeddings block 0 reads, a head's slice of the output
projection's input times its rows of the weight, the MLP's output). Then: EAP-IG with one step is EAP; `exact` is
each edge patched by hand; faithfulness is 1 for the whole graph, 0 for none, and for the edges out of a set of nodes
equals patching the other nodes' outputs by hand; and the command: JSON keys, views, bad input, files."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

import tfcli
from tfcli.commands.circuit import core as circuit
from tfcli.commands.circuit import edges as core

VOCAB = 30522  # the bundled BERT vocabulary: the command reads texts
CLEAN_TEXT = "when mary and john went to the store john gave a drink to"
CORRUPT_TEXT = "when john and mary went to the store mary gave a drink to"
PAIRS = [(CLEAN_TEXT, CORRUPT_TEXT, "mary", "john"),
         ("then anna and tom went to the park tom gave a ball to",
          "then tom and anna went to the park anna gave a ball to", "anna", "tom")]
PARTS = {  # layers, attention norm, output projection, MLP norm, MLP, final norm
    "gpt2": ("transformer.h", "ln_1", "attn.c_proj", "ln_2", "mlp", "transformer.ln_f"),
    "llama": ("model.layers", "input_layernorm", "self_attn.o_proj", "post_attention_layernorm", "mlp", "model.norm"),
    "gptj": ("transformer.h", "ln_1", "attn.out_proj", "ln_1", "mlp", "transformer.ln_f"),  # parallel: one norm
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, save_hf_model):
    """name -> (path, transformers model): GPT-2, Llama with 4 query heads and 2 key/value heads, and GPT-J (attention
    and MLP in parallel on one norm), 2 layers, 32 wide, weights large enough that edges differ, on the bundled
    vocabulary."""
    import transformers

    made = {}
    configs = {
        "gpt2": ("GPT2LMHeadModel", dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        "llama": ("LlamaForCausalLM", dict(model_type="llama", hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                           max_position_embeddings=64)),
        "gptj": ("GPTJForCausalLM", dict(model_type="gptj", n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                         n_positions=64)),
    }

    def make(name):
        if name not in made:
            cls, settings = configs[name]
            settings = dict(settings)
            config = transformers.AutoConfig.for_model(settings.pop("model_type"), vocab_size=VOCAB, bos_token_id=101,
                                                       eos_token_id=102, pad_token_id=0, initializer_range=0.3,
                                                       **settings)
            path = tmp_path_factory.mktemp(name)
            made[name] = path, save_hf_model(getattr(transformers, cls), config, path, perturb=True)
        return made[name]

    return make


def ungrouped(hf):
    """The same Llama with a key/value head per query head (query head h reads key/value head h // repeats, as
    transformers' repeat_kv does): its logits are the grouped model's."""
    import transformers

    config = hf.config.__class__(**{**hf.config.to_dict(), "num_key_value_heads": hf.config.num_attention_heads})
    config._attn_implementation = "eager"
    wide = transformers.LlamaForCausalLM(config).eval()
    state = hf.state_dict()
    heads, groups = hf.config.num_attention_heads, hf.config.num_key_value_heads
    for key, value in list(state.items()):
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            state[key] = value.view(groups, -1, value.shape[-1]).repeat_interleave(heads // groups, 0).flatten(0, 1)
    wide.load_state_dict(state)
    return wide


def batch(model, tokenizer, pairs=PAIRS):
    lines = [{"clean": c, "corrupt": k, "target": t, "foil": f} for c, k, t, f in pairs]
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    checked = [check_pair(model.config, tokenizer, line) for line in lines_of(lines, PAIR_LINE)]
    return checked, core.batch_of(model, tokenizer, checked)


# ---------------------------------------------------------------- by hand, on transformers' modules


class Hand:
    """A transformers model run with each receiver's own input: `eps[r]` (B, T, d) added where receiver r alone reads
    the residual stream; the senders' outputs kept."""

    def __init__(self, name, hf, graph):
        self.name, self.hf, self.graph = name, hf, graph
        self.layers, self.norm, self.o_proj, self.mlp_norm, self.mlp, self.final = PARTS[name]

    def run(self, ids, eps, start=None, replace=None, shift=None):
        """Logits (B, T, V) and the senders' outputs (B, T, S, d); `start` replaces what block 0 reads; `replace`
        (sender -> (B, T, d) output or z slice) puts a node's output in place (the corrupt one); `shift` (a layer's
        first head or its MLP -> (B, T, d)) is added to the attention layer's output or the MLP's."""
        shift = shift or {}
        hf, graph, handles, outputs = self.hf, self.graph, [], {}
        heads = graph.heads
        layers = hf.get_submodule(self.layers)
        per = 3 * heads + 1

        def first(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            if start is not None:
                x = start
            if replace is not None and 0 in replace:
                x = replace[0]
            outputs[0] = x
            return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
        handles.append(layers[0].register_forward_pre_hook(first, with_kwargs=True))
        for layer, block in enumerate(layers):
            norm, seen = block.get_submodule(self.norm), {}
            handles.append(norm.register_forward_pre_hook(lambda m, args, seen=seen: seen.__setitem__("x", args[0])))
            attention = "attn" if self.name == "gptj" else "self_attn"
            projections = [("attn.c_attn", k, k) for k in range(3)] if self.name == "gpt2" else \
                [(f"{attention}.{p}_proj", k, 0) for k, p in enumerate("qkv")]
            for path, kind, column in projections:
                def projected(module, args, out, kind=kind, column=column, layer=layer, norm=norm, seen=seen):
                    out = out.clone()
                    size = out.shape[-1] // (3 if self.name == "gpt2" else 1) // heads
                    for h in range(heads):
                        r = layer * per + kind * heads + h
                        if r in eps:
                            cols = slice(column * heads * size + h * size, column * heads * size + (h + 1) * size)
                            out[..., cols] = module.forward(norm.forward(seen["x"] + eps[r]))[..., cols]  # no hooks
                    return out
                handles.append(block.get_submodule(path).register_forward_hook(projected))
            base = 1 + layer * (heads + 1)

            def z_hook(module, args, base=base):
                z = args[0]
                size = z.shape[-1] // heads
                if replace is not None:
                    z = z.clone()
                    for h in range(heads):
                        if base + h in replace:
                            z[..., h * size:(h + 1) * size] = replace[base + h]
                weight = module.weight.T if self.name == "gpt2" else module.weight  # (d, H x D)
                for h in range(heads):
                    outputs[base + h] = z[..., h * size:(h + 1) * size] @ weight[:, h * size:(h + 1) * size].T
                outputs[("z", base)] = z
                return (z, *args[1:])
            handles.append(block.get_submodule(self.o_proj).register_forward_pre_hook(z_hook))
            if base in shift:
                handles.append(block.get_submodule(self.o_proj).register_forward_hook(
                    lambda m, args, out, base=base: out + shift[base]))
            r_mlp = layer * per + 3 * heads
            parallel = self.mlp_norm == self.norm  # GPT-J: the MLP reads the attention's norm of the block's input
            if not parallel:
                handles.append(block.get_submodule(self.mlp_norm).register_forward_pre_hook(
                    lambda m, args, r=r_mlp: (args[0] + eps[r],) if r in eps else None))

            def mlp_hook(module, args, out, s=base + heads, r=r_mlp, parallel=parallel, norm=norm, seen=seen):
                if parallel and r in eps:
                    out = module.forward(norm.forward(seen["x"] + eps[r]))  # no hooks
                if replace is not None and s in replace:
                    out = replace[s]
                if s in shift:
                    out = out + shift[s]
                outputs[s] = out
                return out
            handles.append(block.get_submodule(self.mlp).register_forward_hook(mlp_hook))
        last = len(graph.receivers) - 1
        handles.append(hf.get_submodule(self.final).register_forward_pre_hook(
            lambda m, args: (args[0] + eps[last],) if last in eps else None))
        try:
            logits = hf(input_ids=ids).logits
        finally:
            for handle in handles:
                handle.remove()
        return logits, torch.stack([outputs[s] for s in range(len(graph.senders))], 2), outputs


def metric(logits, b):
    rows = logits[torch.arange(len(b.positions)), b.positions]
    return rows.gather(1, b.targets[:, None])[:, 0] - rows.gather(1, b.foils[:, None])[:, 0]


def hand_counter(hand, b, kind="corrupt"):
    """(clean outputs (B, T, S, d), counterfactual outputs (B, T, S, d), the counterfactual parts `Hand.run` returns
    (sender -> output, ("z", layer's first head) -> z)): the corrupt run's, or the clean run's means over the
    positions but the first, which keeps its own output (every pair here has the batch's length)."""
    with torch.no_grad():
        _, clean, clean_parts = hand.run(b.clean, {})
        _, corrupt, corrupt_parts = hand.run(b.corrupt, {})
    if kind == "corrupt":
        return clean, corrupt, corrupt_parts
    assert (b.lengths == b.clean.shape[1]).all()

    def mean(x):
        return torch.cat([x[:, :1], x[:, 1:].mean(1, keepdim=True).expand_as(x[:, 1:])], 1)
    return clean, mean(clean), {key: mean(value) for key, value in clean_parts.items()}


def receiver_grads(hand, b, start=None, shift=None):
    """{receiver: the gradient of the summed metric at its own input (B, T, d)} of one run."""
    graph = hand.graph
    eps = {r: torch.zeros(*b.clean.shape, hand.hf.config.hidden_size, requires_grad=True)
           for r in range(len(graph.receivers))}
    logits, _, _ = hand.run(b.clean, eps, start, shift=shift)
    return dict(zip(eps, torch.autograd.grad(metric(logits, b).sum(), list(eps.values()))))


def products(graph, differences, grads):
    """(B, S, R): differences (B, T, S, d) . grads {r: (B, T, d)}, summed over positions, on the graph's edges."""
    stacked = torch.stack([grads[r] for r in range(len(graph.receivers))], 2)
    return torch.einsum("btsd,btrd->bsr", differences.double(), stacked.double()) * graph.mask


def hand_eap(hand, b, steps=None, kind="corrupt"):
    """(B, S, R): (counterfactual - clean output) . the gradient at each receiver's own input, summed over positions;
    with `steps`, the gradient averaged over the inputs counterfactual + k / steps (clean - counterfactual), k = 1 ..
    steps."""
    clean, counter, _ = hand_counter(hand, b, kind)
    points = [None] if steps is None else \
        [counter[:, :, 0] + k / steps * (clean[:, :, 0] - counter[:, :, 0]) for k in range(1, steps + 1)]
    grads = {}
    for start in points:
        for r, g in receiver_grads(hand, b, start).items():
            grads[r] = grads.get(r, 0) + g / len(points)
    return products(hand.graph, counter - clean, grads)


def hand_ig_activations(hand, b, steps, kind="corrupt"):
    """(B, S, R): per group of senders (the input; a layer's heads; a layer's MLP), the run of the clean text with
    the group's summed output moved by (1 - k / steps) (counterfactual - clean), k = 1 .. steps; a sender's edges:
    its counterfactual - clean output . the receivers' gradients averaged over its group's runs."""
    graph, heads = hand.graph, hand.graph.heads
    clean, counter, _ = hand_counter(hand, b, kind)
    differences = counter - clean
    groups = [(0, 1)] + [(1 + layer * (heads + 1) + j * heads, heads if j == 0 else 1)
                         for layer in range(graph.layers) for j in (0, 1)]
    scores = 0
    for first, count in groups:
        grads = {}
        for k in range(1, steps + 1):
            moved = (1 - k / steps) * differences[:, :, first:first + count].sum(2)
            found = receiver_grads(hand, b, clean[:, :, 0] + moved, None) if first == 0 else \
                receiver_grads(hand, b, None, {first: moved})
            for r, g in found.items():
                grads[r] = grads.get(r, 0) + g / steps
        mine = torch.zeros_like(differences)
        mine[:, :, first:first + count] = differences[:, :, first:first + count]
        scores = scores + products(graph, mine, grads)
    return scores


@pytest.mark.parametrize("name", ["gpt2", "llama", "gptj"])
def test_eap_scores_are_the_hand_computation(name, checkpoints):
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    reference = ungrouped(hf) if name == "llama" else hf
    if name == "llama":
        with torch.no_grad():
            assert torch.allclose(reference(input_ids=b.clean).logits, hf(input_ids=b.clean).logits, atol=1e-5)
    expected = hand_eap(Hand(name, reference, graph), b)
    clean, corrupt, scores = core.scores_of(model, b, "eap", 1)
    scale = expected.abs().max()
    # edges that differ, nearly all nonzero (in GPT-J's parallel blocks L0.mlp, like the input, gives the same output
    # at the last token in both texts, and the last block's queries, its MLP and the logits read only there)
    share = 0.85 if name == "gptj" else 0.9
    assert scale > 1e-3 and (expected[0] != 0).sum() > graph.edge_count * share
    assert (scores - expected).abs().max() <= 1e-5 * scale
    with torch.no_grad():
        logits = hf(input_ids=b.clean).logits
    assert torch.allclose(clean, metric(logits, b).double(), atol=1e-4)
    ig = core.scores_of(model, b, "eap-ig-inputs", 1)[2]
    assert (ig - scores).abs().max() <= 1e-5 * scale  # one step of integrated gradients: at the clean input (float32)
    ig3 = core.scores_of(model, b, "eap-ig-inputs", 3)[2]
    assert (ig3 - hand_eap(Hand(name, reference, graph), b, steps=3)).abs().max() <= 1e-5 * scale
    assert (ig3 - scores).abs().max() > 1e-3 * scale  # three steps differ from one


def test_eap_scores_on_smollm2_are_the_hand_computation(smollm2_gguf):
    """The trained grouped-query model (SmolLM2-135M, 9 query heads on 3 key/value heads, 30 blocks): every edge's
    EAP score equals the hand computation on transformers' own loading of the same GGUF file, to 1e-5 of the scale."""
    path, hf, _ = smollm2_gguf
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer, [("When Mary and John went to the store, John gave a drink to",
                                     "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")])
    graph = core.graph_of(model.config)
    expected = hand_eap(Hand("llama", ungrouped(hf), graph), b)
    scores = core.scores_of(model, b, "eap", 1)[2]
    scale = expected.abs().max()
    assert scale > 1e-2 and (expected[0] != 0).sum() > graph.edge_count * 0.5
    assert (scores - expected).abs().max() <= 1e-5 * scale


def test_exact_scores_are_each_edge_patched_by_hand(checkpoints):
    name = "gpt2"
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, hf, graph)
    with torch.no_grad():
        _, corrupt, _ = hand.run(b.corrupt, {})
        logits, clean, _ = hand.run(b.clean, {})
        base = metric(logits, b)
        scores = core.scores_of(model, b, "exact", 1)[2]
        for s, r in graph.mask.nonzero().tolist():
            patched = metric(hand.run(b.clean, {r: corrupt[:, :, s] - clean[:, :, s]})[0], b)
            assert torch.allclose(scores[:, s, r], (patched - base).double(), atol=1e-5 * base.abs().max()), \
                graph.edge_name(s, r)


def replaced(graph, parts, kept=()):
    """Hand.run's `replace`: every sender outside `kept` gets its output (a head: its slice of the output projection's
    input) from `parts`."""
    heads, replace = graph.heads, {}
    for s, node in enumerate(graph.senders):
        if node in kept:
            continue
        if node.endswith(".mlp") or node == "input":
            replace[s] = parts[s]
        else:
            layer, h = divmod(s - 1, heads + 1)
            z = parts[("z", 1 + layer * (heads + 1))]
            size = z.shape[-1] // heads
            replace[s] = z[..., h * size:(h + 1) * size]
    return replace


@pytest.mark.parametrize("name,kind", [("gpt2", "corrupt"), ("llama", "corrupt"), ("gptj", "corrupt"), ("gpt2", "mean"),
                                       ("llama", "mean")])
def test_faithfulness_of_edges_out_of_nodes_is_patching_the_other_nodes(name, kind, checkpoints):
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, hf, graph)
    kept = {"input", "L0H1", "L0.mlp", "L1H2", "L1H3"}
    chosen = torch.tensor([name in kept for name in graph.senders])[:, None] & graph.mask
    full, empty = graph.mask.clone(), torch.zeros_like(graph.mask)
    clean_value, corrupt_value, values = core.circuit_metrics(model, b, [full, empty, chosen], kind)
    parts = hand_counter(hand, b, kind)[2]
    with torch.no_grad():
        patched = metric(hand.run(b.clean, {}, replace=replaced(graph, parts, kept))[0], b).double()
        clean = metric(hf(input_ids=b.clean).logits, b).double()
        corrupt_metric = metric(hf(input_ids=b.corrupt).logits, b).double() if kind == "corrupt" else \
            metric(hand.run(b.clean, {}, replace=replaced(graph, parts))[0], b).double()  # every sender's mean
    scale = clean.abs().max()
    assert torch.allclose(values[:, 0], clean, atol=1e-5 * scale) and torch.allclose(clean_value, clean, atol=1e-4)
    assert torch.allclose(values[:, 1], corrupt_metric, atol=1e-5 * scale)
    assert torch.allclose(corrupt_value, corrupt_metric, atol=1e-5 * scale)
    assert torch.allclose(values[:, 2], patched, atol=1e-5 * scale)
    assert (patched - clean).abs().min() > 1e-3 and (patched - corrupt_metric).abs().min() > 1e-3
    # the aggregate: (m(C) - m(empty)) / (m(full) - m(empty)), sums over the pairs
    from tfcli.analysis.dataset import Dataset, Done

    rows = [(float(a), float(c), v) for a, c, v in zip(clean, corrupt_metric, values.tolist())]
    pairs = [SimpleNamespace(line=number) for number in (1, 2)]
    measured = circuit.CircuitFaithfulness([full, empty, chosen]).aggregate(Done(zip(pairs, rows)),
                                                                            Dataset("", pairs, 0, 0))
    gap = (clean - corrupt_metric).sum()
    assert measured.values[0] == pytest.approx(1, abs=1e-5) and measured.values[1] == pytest.approx(0, abs=1e-5)
    assert measured.values[2] == pytest.approx(float((patched - corrupt_metric).sum() / gap), abs=1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_eap_ig_activations_is_the_hand_computation(name, checkpoints):
    """Each group of senders moved from its counterfactual to its clean output in steps, the rest computed: with one
    step it is EAP; with three, the hand computation, and neither EAP nor EAP-IG on the inputs."""
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, ungrouped(hf) if name == "llama" else hf, graph)
    eap = core.scores_of(model, b, "eap", 1)[2]
    scale = eap.abs().max()
    assert (core.scores_of(model, b, "eap-ig-activations", 1)[2] - eap).abs().max() <= 1e-5 * scale
    three = core.scores_of(model, b, "eap-ig-activations", 3)[2]
    assert (three - hand_ig_activations(hand, b, 3)).abs().max() <= 1e-5 * scale
    assert (three - eap).abs().max() > 1e-3 * scale
    assert (three - core.scores_of(model, b, "eap-ig-inputs", 3)[2]).abs().max() > 1e-3 * scale


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_mean_counterfactual_is_the_hand_computation(name, checkpoints):
    """--counterfactual mean: each sender's counterfactual output is its clean output's mean over the positions but
    the first (the attention sink, which keeps its own): EAP, both EAP-IGs and exact patching against the same by
    hand."""
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, ungrouped(hf) if name == "llama" else hf, graph)
    expected = hand_eap(hand, b, kind="mean")
    clean_value, empty, scores = core.scores_of(model, b, "eap", 1, "mean")
    scale = expected.abs().max()
    assert scale > 1e-3 and (scores - expected).abs().max() <= 1e-5 * scale
    assert (scores - core.scores_of(model, b, "eap", 1)[2]).abs().max() > 1e-2 * scale  # not the corrupt one's
    ig = core.scores_of(model, b, "eap-ig-inputs", 2, "mean")[2]
    assert (ig - hand_eap(hand, b, steps=2, kind="mean")).abs().max() <= 1e-5 * scale
    activations = core.scores_of(model, b, "eap-ig-activations", 2, "mean")[2]
    assert (activations - hand_ig_activations(hand, b, 2, kind="mean")).abs().max() <= 1e-5 * scale
    clean, counter, parts = hand_counter(hand, b, "mean")
    with torch.no_grad():
        base = metric(hand.run(b.clean, {})[0], b)
        assert torch.allclose(empty, metric(hand.run(b.clean, {}, replace=replaced(graph, parts))[0], b).double(),
                              atol=1e-5 * base.abs().max())
        exact = core.scores_of(model, b, "exact", 1, "mean")[2]
        for s, r in graph.mask.nonzero().tolist()[::7]:
            patched = metric(hand.run(b.clean, {r: counter[:, :, s] - clean[:, :, s]})[0], b)
            assert torch.allclose(exact[:, s, r], (patched - base).double(), atol=1e-5 * base.abs().max()), \
                graph.edge_name(s, r)


@pytest.mark.parametrize("kind", ["corrupt", "mean"])
def test_a_batch_equals_its_pairs_one_at_a_time(checkpoints, kind):
    """Pairs of different lengths run together right-padded: each pair's scores and faithfulness are its own alone
    (with the mean counterfactual, each pair's mean is over its own positions, not the pads)."""
    path, _ = checkpoints("gpt2")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    pairs = PAIRS + [("when mary and john went to the big store john gave a drink to",
                      "when john and mary went to the big store mary gave a drink to", "mary", "john")]
    _, both = batch(model, tokenizer, pairs)
    assert both.clean.shape[1] == 15 and both.positions.tolist() == [13, 13, 14]
    graph = core.graph_of(model.config)
    chosen = core.circuit_of(graph, core.greedy_order(graph, torch.ones(graph.mask.shape))[:30])
    method = "eap" if kind == "corrupt" else "eap-ig-activations"
    together = core.scores_of(model, both, method, 2, kind)[2]
    values = core.circuit_metrics(model, both, [chosen], kind)
    for i in range(3):
        _, alone = batch(model, tokenizer, pairs[i:i + 1])
        scores = core.scores_of(model, alone, method, 2, kind)[2]
        assert (scores[0] - together[i]).abs().max() <= 1e-5 * together.abs().max()
        for mine, all_of in zip(core.circuit_metrics(model, alone, [chosen], kind), values):
            assert torch.allclose(mine[0], all_of[i], atol=1e-5)


def test_greedy_circuits_are_connected_to_the_logits():
    graph = core.Graph(3, 2)
    scores = torch.randn(len(graph.senders), len(graph.receivers), generator=torch.Generator().manual_seed(0))
    order = core.greedy_order(graph, scores * graph.mask)
    assert len(order) == len(set(order)) == graph.edge_count
    for n in (1, 5, 20, 40):
        edges = order[:n]
        inside = {None} | {s for s, _ in edges}
        assert all(graph.node_of(r) in inside for _, r in edges)  # every edge feeds a node already reaching the logits
    assert order[0][1] == len(graph.receivers) - 1
    first = max(range(len(graph.senders)), key=lambda s: abs(float(scores[s, -1])))
    assert order[0][0] == first


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_split_inputs_change_nothing_until_hooked(name, checkpoints):
    """The model's split-input sites (q_input, k_input, v_input per query head, mlp_in): a pass that asks for them by
    name gives the plain pass's logits; a pass that keeps every site does not reach them (they are asked by name)."""
    path, _ = checkpoints(name)
    model = tfcli.load_model(str(path))
    ids = torch.tensor([[101, 2043, 5914, 1998, 2198, 2253, 2000]])
    names = [f"blocks.{l}.{leaf}" for l in range(2) for leaf in ("q_input", "k_input", "v_input", "mlp_in")]
    with torch.no_grad():
        plain = model(ids).logits
        logits, cache = model.run_with_cache(ids, names=names)
        _, everything = model.run_with_cache(ids)
    assert (logits - plain).abs().max() <= 1e-5 * plain.abs().max()
    assert cache["blocks.1.k_input"].shape == (1, 7, 4, 32) and cache["blocks.1.mlp_in"].shape == (1, 7, 32)
    assert not any(name.endswith(("_input", "mlp_in")) for name in everything)
    assert list(model.site_shapes()) == list(everything)


@pytest.mark.parametrize("kind", ["layer", "layer-no-bias", "layer-plain", "rms", "rms-plus-one"])
def test_a_split_pass_norms_untouched_copies_once_with_each_copys_gradient(kind):
    """A split pass norms and projects copies no hook changed once (norms.normed_heads): the same outputs and, for
    each copy, the same gradient as the norm and each head's projection applied to every copy apart."""
    from tfcli.model.norms import RMSNormPlusOne, normed_heads

    norm = {"layer": torch.nn.LayerNorm(16), "layer-no-bias": torch.nn.LayerNorm(16, bias=False),
            "layer-plain": torch.nn.LayerNorm(16, elementwise_affine=False), "rms": torch.nn.RMSNorm(16, eps=1e-5),
            "rms-plus-one": RMSNormPlusOne(16, eps=1e-6)}[kind]
    generator = torch.Generator().manual_seed(0)
    for p in norm.parameters():
        p.requires_grad_(False).copy_(torch.randn(p.shape, generator=generator))
    x = torch.randn(2, 5, 16, generator=generator) * 3 + 1
    weight = torch.randn(2, 3, 16, generator=generator).repeat_interleave(2, 0)  # 4 heads reading 2 heads' weights
    bias = torch.randn(2, 3, generator=generator).repeat_interleave(2, 0)
    upstream = torch.randn(2, 4, 5, 3, generator=generator)
    results = []
    for copies in (x[:, :, None].expand(2, 5, 4, 16), x[:, :, None].expand(2, 5, 4, 16).contiguous()):
        copies = copies.detach().requires_grad_()
        out = normed_heads(norm, copies, weight, bias)
        by_hand = torch.einsum("bthi,hdi->bhtd", norm(copies), weight) + bias[None, :, None]
        results.append((out, torch.autograd.grad((out * upstream).sum(), copies)[0]))
        assert (out - by_hand).abs().max() <= 1e-5
    (out, grad), (plain_out, plain_grad) = results
    assert (grad - plain_grad).abs().max() <= 1e-5 * plain_grad.abs().max()
    assert (grad[:, :, 0] - grad[:, :, 1]).abs().max() > 1e-3  # each copy's own gradient


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Twelve name-swap pairs of one length on the bundled vocabulary (enough for a bootstrap interval)."""
    import random

    names = ["mary", "john", "anna", "tom", "paul", "sarah", "james", "emma", "david", "lisa", "mark", "kate"]
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("circuit") / "pairs.jsonl"
    with open(path, "w") as f:
        for _ in range(12):
            a, b = rng.sample(names, 2)
            f.write(json.dumps({"clean": f"when {a} and {b} went to the store {b} gave a drink to",
                                "corrupt": f"when {b} and {a} went to the store {a} gave a drink to",
                                "target": a, "foil": b}) + "\n")
    return path


KEYS = ["method", "ig_steps", "pruning", "counterfactual", "target", "foil", "clean_value", "corrupt_value", "dataset", "n", "pairs", "skipped",
        "interrupted", "positions", "spans", "size_unit", "graph", "circuit", "nodes", "connected", "curve", "pair_ends", "edges"]


def one_error(result, code: int = 2):
    """One error line, no traceback, exit `code`: 2 for a bad option, 1 for a file that does not fit (an --edges
    file naming what the model lacks: docs/errors.md)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return len(errors) == 1 and "Traceback" not in result.stderr and result.exit_code == code


def test_json_record_has_exactly_the_documented_keys(cli, checkpoints, dataset):
    path, _ = checkpoints("gpt2")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--method", "eap", "--top", "15", "--sizes",
                 "5,20,1000", "--json")
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    record = json.loads(line)
    assert list(record) == KEYS
    assert list(record["graph"]) == ["layers", "heads", "parallel", "edges", "nodes", "model_edges"]
    assert (record["positions"], record["spans"], record["size_unit"]) == ("all", None, "edge")
    assert list(record["circuit"]) == ["picked", "wanted", "edges", "nodes", "faithfulness", "interval", "pairs",
                                       "metrics"]
    assert list(record["edges"][0]) == ["sender", "receiver", "span", "score", "in_circuit"]
    assert list(record["curve"][0]) == ["edges", "nodes", "faithfulness", "interval", "metrics"]
    assert list(record["pair_ends"]) == ["lines", "clean", "empty"]
    graph = core.Graph(2, 4)
    assert record["graph"]["edges"] == len(record["edges"]) == graph.edge_count == 110
    assert sum(e["in_circuit"] for e in record["edges"]) == record["circuit"]["edges"] == 15
    assert [p["edges"] for p in record["curve"]] == [5, 20, 110]
    whole = record["curve"][-1]
    assert whole["faithfulness"] == pytest.approx(1, abs=1e-4) and whole["interval"] == pytest.approx([1, 1], abs=1e-4)
    assert record["n"] == 12 and record["circuit"]["interval"][0] <= record["circuit"]["faithfulness"]
    # the scores are the mean of the pairs' own (the core's, checked by hand above)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    lines = [json.loads(text) for text in dataset.read_text().splitlines()]
    _, b = batch(model, tokenizer, [(x["clean"], x["corrupt"], x["target"], x["foil"]) for x in lines])
    mean = core.scores_of(model, b, "eap", 1)[2].mean(0)
    got = torch.zeros_like(mean)
    for e in record["edges"]:
        got[graph.senders.index(e["sender"]), graph.receivers.index(e["receiver"])] = e["score"]
    assert (got - mean).abs().max() <= 1e-5 * mean.abs().max()


@pytest.fixture(scope="module")
def view_args(checkpoints, dataset):
    """The Llama run the views show, and its JSON record (run once)."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    path, _ = checkpoints("llama")
    args = ["circuit", "-m", str(path), "--dataset", str(dataset), "--faithful", "0.5", "--show", "12"]
    return args, json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("colour", [True, False])
def test_views_fit_the_width_and_keep_every_number(cli, view_args, width, colour):
    import re

    args, record = view_args
    result = cli(*args, "--width", str(width), "--color" if colour else "--no-color",
                 env={"NO_COLOR": "1"} if not colour else None)
    assert result.exit_code == 0, result.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    assert ("\x1b[" in result.stdout) == colour
    assert max(len(line) for line in text.splitlines()) <= width
    flat = " ".join(text.split())
    top = sorted(record["edges"], key=lambda e: -abs(e["score"]))[:12]
    for e in top:
        shown = re.escape(e["sender"]) + r"\s+" + re.escape(e["receiver"]) + r"\s+" + re.escape(f"{e['score']:+.4g}")
        assert re.search(shown, text), e
    for p in record["curve"] + [record["circuit"]]:
        assert f"{p['faithfulness']:.3f}" in flat
        if p["interval"]:
            assert f"[{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]" in flat
    assert f"{record['circuit']['edges']} edges, {record['circuit']['nodes']} nodes" in flat
    assert record["circuit"]["faithfulness"] >= 0.5


@pytest.mark.parametrize("counterfactual", ["corrupt", "mean"])
def test_faithful_finds_the_smallest_greedy_circuit_reaching_it(cli, checkpoints, dataset, counterfactual):
    """--faithful's bisection reuses the first run's m(full) and m(empty) (no clean pass, no run with every edge
    patched): the circuit it finds measures the same in a run of its own (--top N), and one edge fewer falls short."""
    path, _ = checkpoints("llama")
    base = ["circuit", "-m", str(path), "--dataset", str(dataset), "--method", "eap", "--counterfactual",
            counterfactual, "--json"]
    run = cli(*base, "--faithful", "0.7", "--sizes", "3")
    found = json.loads(run.stdout)["circuit"]
    assert found["picked"] == "faithful" and 3 < found["edges"] < 100  # found by bisection, not on the curve
    steps = [line for line in run.stderr.splitlines() if line.startswith("--faithful 0.7: ")]  # each step said
    assert len(steps) >= 5 and steps[-1].endswith(f"the circuit has {found['edges']:,}-{found['edges']:,} edges")
    alone = json.loads(cli(*base, "--top", str(found["edges"])).stdout)["circuit"]
    assert alone["faithfulness"] == pytest.approx(found["faithfulness"], abs=1e-9) and found["faithfulness"] >= 0.7
    assert alone["interval"] == pytest.approx(found["interval"], abs=1e-9)
    short = json.loads(cli(*base, "--top", str(found["edges"] - 1)).stdout)["circuit"]
    assert short["faithfulness"] < 0.7


def test_a_single_pair_and_per_item_records(cli, checkpoints, dataset):
    path, _ = checkpoints("gpt2")
    single = cli("circuit", "-m", str(path), CLEAN_TEXT, CORRUPT_TEXT, "--target", "mary", "--foil", "john", "--json")
    assert single.exit_code == 0, single.stderr
    record = json.loads(single.stdout)
    assert record["n"] == 1 and record["circuit"]["interval"] is None and record["target"]["token"] == "mary"
    each = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--per-item", "--json", "--top", "5")
    lines = [json.loads(line) for line in each.stdout.splitlines()]
    assert len(lines) == 13 and list(lines[0]) == ["line", "clean_value", "corrupt_value", "top_edges"]
    assert [x["line"] for x in lines[:12]] == list(range(1, 13)) and list(lines[-1]) == KEYS


def test_the_default_method_is_eap_ig_inputs(cli, checkpoints, dataset):
    """Without --method: EAP-IG on the inputs with 5 steps, its scores the core's (checked by hand above) averaged
    over the pairs."""
    path, _ = checkpoints("gpt2")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--sizes", "5", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["method"] == "eap-ig-inputs" and record["ig_steps"] == 5
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    lines = [json.loads(text) for text in dataset.read_text().splitlines()]
    _, b = batch(model, tokenizer, [(x["clean"], x["corrupt"], x["target"], x["foil"]) for x in lines])
    mean = core.scores_of(model, b, "eap-ig-inputs", 5)[2].mean(0)
    graph = core.Graph(2, 4)
    got = torch.zeros_like(mean)
    for e in record["edges"]:
        got[graph.senders.index(e["sender"]), graph.receivers.index(e["receiver"])] = e["score"]
    assert (got - mean).abs().max() <= 1e-5 * mean.abs().max()


@pytest.mark.parametrize("args,message", [
    (["--faithful", "1.5"], "--faithful must be above 0 and at most 1"),
    (["--method", "acdc"], "method must be one of eap, eap-ig-inputs, eap-ig-activations, exact"),
    (["--top", "5", "--faithful", "0.5"], "give one of --top, --faithful"),
    (["--sizes", "10,x"], "--sizes: `10,x` is not a list"),
    (["--counterfactual", "zero"], "--counterfactual must be one of corrupt, mean, got `zero`"),
    (["--method", "eap-ig-activations", "--ig-steps", "0"], "--ig-steps must be 1 or more"),
])
def test_bad_options_are_one_error_line_before_any_model(cli, checkpoints, dataset, no_model_built, args, message):
    path, _ = checkpoints("gpt2")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), *args)
    assert one_error(result) and message in result.stderr, result.stderr


def test_bad_input_is_one_error_line(cli, checkpoints, dataset, tmp_path, tiny_config, no_model_built):
    path, _ = checkpoints("gpt2")
    edges = tmp_path / "edges.txt"
    edges.write_text("L0H1 -> L1H2.q\nL7H0 -> logits\n")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--edges", str(edges))
    assert one_error(result, 1) and "line 2: the model has no node `L7H0`" in result.stderr, result.stderr
    edges.write_text("L1H0 -> L0H2.k\n")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--edges", str(edges))
    assert one_error(result, 1) and "L0H2.k does not read L1H0" in result.stderr, result.stderr
    result = cli("circuit", "-m", str(tiny_config), "a b", "a c", "--target", "b")
    assert one_error(result) and "is an encoder-only model" in result.stderr, result.stderr
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--graph-out", str(tmp_path / "no" / "g.json"))
    # as --report's and steer fit --output's missing folder: exit 1 (the option is well formed; the disk is not)
    assert result.exit_code == 1 and "the folder" in result.stderr and "does not exist" in result.stderr, result.stderr
    lines = tmp_path / "no_target.jsonl"
    lines.write_text(json.dumps({"clean": CLEAN_TEXT, "corrupt": CORRUPT_TEXT}) + "\n")
    result = cli("circuit", "-m", str(path), "--dataset", str(lines))
    assert one_error(result) and "line 1: no `target`" in result.stderr, result.stderr
    result = cli("circuit", "-m", str(path), "When Mary and John went to", "When Mary went to", "--target", " John")
    assert one_error(result) and "tokenize to different lengths (7 and 5 tokens)" in result.stderr, result.stderr
    assert "hint: reword one" in result.stderr and re.search(r"3\s+'and'\s+-", result.stderr), result.stderr


def test_graph_out_is_the_reference_json_and_reads_back(cli, checkpoints, dataset, tmp_path):
    path, _ = checkpoints("gpt2")
    out = tmp_path / "graph.json"
    base = ["circuit", "-m", str(path), "--dataset", str(dataset)]
    record = json.loads(cli(*base, "--top", "12", "--graph-out", str(out), "--json").stdout)
    graph = json.loads(out.read_text())
    assert list(graph) == ["cfg", "nodes", "edges"]
    assert graph["cfg"] == {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 32}
    assert list(graph["nodes"])[:3] == ["input", "a0.h0", "a0.h1"] and "m1" in graph["nodes"]
    assert len(graph["edges"]) == 110 and "input->a0.h0<q>" in graph["edges"] and "m1->logits" in graph["edges"]
    by_name = {f"{e['sender']}->{e['receiver']}": e for e in record["edges"]}
    assert graph["edges"]["a0.h3->a1.h2<k>"]["score"] == by_name["L0H3->L1H2.k"]["score"]
    assert sum(e["in_graph"] for e in graph["edges"].values()) == 12
    again = json.loads(cli(*base, "--edges", str(out), "--json").stdout)
    assert again["circuit"]["faithfulness"] == pytest.approx(record["circuit"]["faithfulness"], abs=1e-9)
    assert again["circuit"]["picked"] == "edges"
    refused = cli(*base, "--graph-out", str(out))
    assert refused.exit_code != 0 and "already exists" in refused.stderr


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_report_files(cli, checkpoints, dataset, tmp_path, suffix):
    path, _ = checkpoints("gpt2")
    report = tmp_path / f"circuit{suffix}"
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--top", "10", "--report", str(report))
    assert result.exit_code == 0, result.stderr
    text = report.read_text()
    if suffix == ".html":
        assert 'circuit: async function' in text and '"layers":2' in text and '"curve":[' in text
        assert '"measured":{"edges":10,' in text  # the circuit, ringed on the curve
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    else:
        assert "<svg" in text and "faithfulness" in text and "circuit: 10" in text
        assert "mathdefault" not in text and ">100<" in text.replace(" ", "")  # the log axis in plain numbers


def test_the_picked_circuit_is_measured_once_where_the_curve_has_it():
    graph = core.Graph(2, 2)
    scores = torch.randn(len(graph.senders), len(graph.receivers), generator=torch.Generator().manual_seed(1))
    runs = []

    def run(circuits, ends):
        runs.append(len(circuits))
        return circuit.Measured([0.1 * (k + 1) for k in range(len(circuits))], None, None, 3, False)
    for top, expected in ((20, [2]), (12, [3])):
        runs.clear()
        result = circuit.Circuit(graph, "eap", 1, scores * graph.mask, 1.0, 0.0, None, None)
        circuit.measure(result, circuit.CircuitOptions(top=top, sizes=(5, 20)), run)
        assert runs == expected and result.measured.edges == top
        assert result.measured.faithfulness == pytest.approx(0.2 if top == 20 else 0.3)


def test_the_view_writes_counts_with_thousands_separators():
    """GPT-2 small's graph has 32,491 edges: the view writes counts as the stderr lines and the README do."""
    from tfcli.commands.circuit.render import circuit_lines
    from tfcli.analysis.dataset import Envelope

    graph = core.Graph(12, 12)
    scores = torch.randn(len(graph.senders), len(graph.receivers), generator=torch.Generator().manual_seed(1))
    result = circuit.Circuit(graph, "eap", 1, scores * graph.mask, 1.0, 0.0, None, None)
    circuit.measure(result, circuit.CircuitOptions(top=1500, sizes=(10, 2000)),
                    lambda circuits, ends: circuit.Measured([0.5] * len(circuits), None, None, 2, False))
    text = " ".join(" ".join(line.plain for line in circuit_lines(Envelope(result, 2, 0, 0, False, ""), 120, False)).split())
    assert graph.edge_count == 32491 and "graph: 32,491 edges between" in text
    assert f"circuit: 1,500 edges, {result.measured.nodes:,} nodes" in text
    assert re.search(r"\b2,000\s+\d", text) and "32491" not in text and "2000" not in text


def test_a_figures_log_axis_writes_plain_numbers_with_separators(tmp_path):
    import matplotlib
    from matplotlib.figure import Figure

    from tfcli.render.figure import STYLE, log_axis

    with matplotlib.rc_context(STYLE):  # as the renderers draw: a Figure of its own, no pyplot backend
        figure = Figure()
        ax = figure.subplots()
        ax.plot([10, 30000], [0.001, 1])
        log_axis(ax, "x"), log_axis(ax, "y")
        figure.savefig(tmp_path / "axis.svg")
    text = (tmp_path / "axis.svg").read_text()
    assert all(f">{tick}<" in text for tick in ("100", "1,000", "10,000", "0.01", "1")), text[-2000:]


def test_the_view_lists_the_nodes_and_warns_of_a_circuit_the_input_does_not_reach(cli, checkpoints, dataset, tmp_path):
    """A circuit without a path from the input has faithfulness 0 by construction (every path from the tokens is
    patched): the view says so, beside the circuit's nodes, and the JSON's `connected` is false; with one path from
    the input to the logits, no warning and `connected` true."""
    path, _ = checkpoints("gpt2")
    edges = tmp_path / "edges.txt"
    base = ["circuit", "-m", str(path), "--dataset", str(dataset), "--edges", str(edges), "--sizes", "5"]
    for lines, connected in (("L0H1 -> L1H2.q\nL1H2 -> logits\n", False),
                             ("input -> L0H1.v\nL0H1 -> L1.mlp\nL1.mlp -> logits\n", True)):
        edges.write_text(lines)
        record = json.loads(cli(*base, "--json").stdout)
        assert record["connected"] is connected
        assert record["nodes"] == (["input", "L0H1", "L1.mlp", "logits"] if connected else ["L0H1", "L1H2", "logits"])
        if not connected:
            assert record["circuit"]["faithfulness"] == pytest.approx(0.0, abs=1e-4)  # float32 rounding
        view = cli(*base, "--width", "80").stdout
        assert f"its nodes: {', '.join(record['nodes'])}" in " ".join(view.split())
        assert ("no path from the input to the logits" in " ".join(view.split())) is not connected
