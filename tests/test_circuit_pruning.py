"""`tfcli circuit --method edge-pruning` and several methods compared on the same pairs, against computations by hand:
the masked forward on transformers' own modules (test_circuit.py's `Hand`: a receiver's own input gains what the mask
takes away, iterated layer by layer until every sender's output in the masked run is its own), a training run on a
tiny task, and the paired bootstrap interval of two methods' difference recomputed with numpy from the same draws."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_circuit import Hand, batch, checkpoints, dataset, hand_counter, ungrouped  # noqa: F401 (fixtures)

import tfcli
from tfcli.commands.circuit import edges as core
from tfcli.commands.circuit import pruning


def hand_masked(hand, b, weights):
    """The clean run's logits (B, T, V) with receiver r reading weights[s, r] of sender s's output and 1 - weights[s,
    r] of its corrupt output, by hand: eps[r] = sum_s (1 - w[s, r]) (corrupt_s - output_s), the outputs those of the
    run itself, found by running again until they stop changing (each run makes a layer's heads or its MLP exact)."""
    graph = hand.graph
    _, corrupt, _ = hand_counter(hand, b)
    outputs = None
    with torch.no_grad():
        for _ in range(2 * graph.layers + 2):  # each run makes one more node exact: a layer's heads, then its MLP
            if outputs is None:
                eps = {}
            else:
                differences = corrupt - outputs  # (B, T, S, d)
                taken = (1 - weights) * graph.mask  # (S, R)
                eps = {r: torch.einsum("btsd,s->btd", differences, taken[:, r]) for r in range(len(graph.receivers))}
            logits, outputs, _ = hand.run(b.clean, eps)
    return logits


def at_positions(logits, b):
    return logits[torch.arange(len(b.positions)), b.positions]


@pytest.mark.parametrize("name", ["gpt2", "llama", "gptj"])
def test_a_zero_one_mask_is_the_circuits_patched_run_by_hand(name, checkpoints):
    """Every edge outside the circuit reads its sender's corrupt output: the masked forward's logits are the hand
    run's, and its metric is patched_metrics' for the same circuit."""
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, ungrouped(hf) if name == "llama" else hf, graph)  # a key/value input per query head
    generator = torch.Generator().manual_seed(1)
    circuit = (torch.rand(graph.mask.shape, generator=generator) < 0.5) & graph.mask
    counter = core.counterfactuals(model, b, "corrupt")[3]
    with torch.no_grad():
        mine = pruning.at_metric(b, pruning.masked_logits(model, b, counter, circuit.float()))
    by_hand = at_positions(hand_masked(hand, b, circuit.float()), b)
    clean = at_positions(hf(input_ids=b.clean).logits, b).detach()
    scale = by_hand.abs().max()
    assert (by_hand - clean).abs().max() > 1e-2 * scale  # the patching matters
    assert torch.allclose(mine, by_hand, atol=1e-5 * scale)
    patched = core.patched_metrics(model, b, counter, [circuit])[:, 0]
    difference = (mine.gather(1, b.targets[:, None]) - mine.gather(1, b.foils[:, None]))[:, 0].double()
    assert torch.allclose(difference, patched, atol=1e-5 * scale)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_fractional_mask_is_the_hand_interpolation(name, checkpoints):
    """Masks in (0, 1) (and a sampled hard-concrete draw): each receiver reads w of the sender's output and 1 - w of
    its corrupt output, by hand; and the gradient of the KL at the masks flows (nonzero on the graph's edges)."""
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    _, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    hand = Hand(name, ungrouped(hf) if name == "llama" else hf, graph)  # a key/value input per query head
    generator = torch.Generator().manual_seed(2)
    fractional = torch.rand(graph.mask.shape, generator=generator)
    drawn = pruning.sample(torch.randn(graph.mask.shape, generator=generator), generator)
    assert ((drawn == 0) | (drawn == 1)).any() and ((drawn > 0) & (drawn < 1)).any()  # the hard concrete's clamp
    counter = core.counterfactuals(model, b, "corrupt")[3]
    for weights in (fractional, drawn):
        with torch.no_grad():
            mine = pruning.at_metric(b, pruning.masked_logits(model, b, counter, weights))
        by_hand = at_positions(hand_masked(hand, b, weights), b)
        assert torch.allclose(mine, by_hand, atol=1e-5 * by_hand.abs().max())
    weights = fractional.clone().requires_grad_()
    full = pruning.at_metric(b, model(b.clean).logits)
    with torch.enable_grad():
        loss = pruning.kl_loss(full, pruning.at_metric(b, pruning.masked_logits(model, b, counter, weights)))
        (grad,) = torch.autograd.grad(loss, weights)
    assert (grad[~graph.mask] == 0).all() and (grad[graph.mask] != 0).float().mean() > 0.9


def test_the_hard_concrete_is_the_papers():
    """P(z > 0) is the share of draws above 0 (the stretched concrete's cdf at 0), and the draws lie in [0, 1]."""
    log_alpha = torch.tensor([-2.0, 0.0, 1.5])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([pruning.sample(log_alpha, generator) for _ in range(20000)])
    assert draws.min() >= 0 and draws.max() <= 1
    # the stretched concrete: s = sigmoid((logit(u) + log alpha) / T) > -l / (r - l) <=> u above a bound, by hand
    bound = np.log(0.1 / 1.1) * (2 / 3) - log_alpha.numpy()  # logit(u) > T log(-l / r) - log alpha
    expected = 1 - 1 / (1 + np.exp(-bound))
    assert np.allclose((draws > 0).float().mean(0).numpy(), expected, atol=0.015)
    assert np.allclose(pruning.keep_probability(log_alpha).numpy(), expected, atol=1e-6)


def test_training_on_a_tiny_task_finds_a_sparse_faithful_circuit(checkpoints):
    """A short training run: the KL of the found circuit (its 0/1 mask) is below that of random circuits of its size
    and of the empty circuit, the expected kept edges reach the target, the found circuit has about that many edges
    and the KL in the last steps is below the KL halfway through the warmup."""
    path, _ = checkpoints("gpt2")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    pairs, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    options = pruning.PruningOptions(steps=120, target_edges=20, batch=2, learning_rate=0.3)
    seen = []
    pruned = pruning.train(model, tokenizer, pairs, "corrupt", options, lambda *args: seen.append(args))
    assert [args[0] for args in seen] == list(range(1, 121)) and pruned.steps == 120 and not pruned.interrupted
    assert abs(pruned.kept[-1] - 20) <= 4
    found = core.circuit_of(graph, pruned.circuit(graph))
    assert abs(int(found.sum()) - 20) <= 4

    counter = core.counterfactuals(model, b, "corrupt")[3]
    full = pruning.at_metric(b, model(b.clean).logits)

    def kl(circuit):
        with torch.no_grad():
            return float(pruning.kl_loss(full, pruning.at_metric(b, pruning.masked_logits(model, b, counter,
                                                                                           circuit.float()))))
    generator = torch.Generator().manual_seed(0)
    edges = graph.mask.nonzero()
    randoms = []
    for _ in range(10):
        picked = edges[torch.randperm(len(edges), generator=generator)[:int(found.sum())]]
        randoms.append(kl(core.circuit_of(graph, picked.tolist())))
    mine = kl(found)
    assert mine < min(randoms) and mine < kl(torch.zeros_like(graph.mask))
    assert np.mean(pruned.kl[-10:]) < np.mean(pruned.kl[45:55])
    scores = pruned.scores(graph)
    assert (scores[~graph.mask] == 0).all() and bool((scores[found] >= scores[graph.mask & ~found].max()).all())


def test_ctrl_c_keeps_the_masks_so_far(checkpoints):
    path, _ = checkpoints("gpt2")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    pairs, _ = batch(model, tokenizer)

    def progress(done, total, note):
        if done == 3:
            raise KeyboardInterrupt
    pruned = pruning.train(model, tokenizer, pairs, "corrupt", pruning.PruningOptions(steps=50, batch=2), progress)
    assert pruned.interrupted and pruned.steps == 3 and len(pruned.kl) == 3
    assert (pruned.log_alpha != pruning.START).any()  # three steps taken
