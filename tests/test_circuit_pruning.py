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
def test_a_zero_one_mask_is_the_circuits_patched_run_by_hand(name, checkpoints, monkeypatch):
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
    by_hand = at_positions(hand_masked(hand, b, circuit.float()), b)
    clean = at_positions(hf(input_ids=b.clean).logits, b).detach()
    scale = by_hand.abs().max()
    assert (by_hand - clean).abs().max() > 1e-2 * scale  # the patching matters
    for merge in (pruning.MERGE, 2):  # 2: blocks of senders joined (in GPT-J, one holding heads its MLP does not read)
        monkeypatch.setattr(pruning, "MERGE", merge)
        with torch.no_grad():
            mine = pruning.at_metric(b, pruning.masked_logits(model, b, counter, circuit.float()))
        assert torch.allclose(mine, by_hand, atol=1e-5 * scale), merge
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


def test_scores_order_the_kept_edges_by_log_alpha(checkpoints):
    """An edge's score is -ln P(z = 0), by hand from the cdf above: edges kept surely enough that P(z > 0) is 1.0 in
    float64 (log alpha 40, 50, 60) still score apart, so the greedy curve takes the most surely kept first."""
    path, _ = checkpoints("gpt2")
    graph = core.graph_of(tfcli.load_model(str(path)).config)
    edges = graph.mask.nonzero()[:5]
    log_alpha = torch.zeros(graph.mask.shape)
    log_alpha[edges[:, 0], edges[:, 1]] = torch.tensor([60.0, 40.0, 50.0, -3.0, 0.5])
    scores = pruning.Pruned(log_alpha, 1).scores(graph)
    picked = scores[edges[:, 0], edges[:, 1]].numpy()
    bound = np.log(0.1 / 1.1) * (2 / 3) - np.array([60.0, 40.0, 50.0, -3.0, 0.5])
    assert np.allclose(picked, -np.log(1 / (1 + np.exp(-bound))), rtol=1e-9)  # -ln(1 - P(z > 0))
    assert (pruning.keep_probability(log_alpha[edges[:3, 0], edges[:3, 1]].double()) == 1).all()
    assert list(np.argsort(-picked)) == [0, 2, 1, 4, 3]
    assert (scores[~graph.mask] == 0).all() and bool((scores[graph.mask] > 0).all())


def test_training_on_a_tiny_task_finds_a_sparse_faithful_circuit(checkpoints):
    """A short training run (the paper's optimiser and schedule): the expected kept edges come within 30% of the
    target, the found circuit has that many edges, and its KL (its 0/1 mask) is below that of every one of ten random
    circuits of its size and of the empty circuit: the training lowers the loss below what the sparsity alone gives."""
    path, _ = checkpoints("gpt2")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    pairs, b = batch(model, tokenizer)
    graph = core.graph_of(model.config)
    options = pruning.PruningOptions(steps=400, target_edges=20, batch=2)
    seen = []
    pruned = pruning.train(model, tokenizer, pairs, "corrupt", options, lambda *args: seen.append(args))
    assert [args[0] for args in seen] == list(range(1, 401)) and pruned.steps == 400 and not pruned.interrupted
    assert abs(pruned.kept[-1] - 20) <= 6 and pruned.kept[0] > 100
    found = core.circuit_of(graph, pruned.circuit(graph))
    assert int(found.sum()) == round(pruned.kept[-1])

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
    scores = pruned.scores(graph)
    assert (scores[~graph.mask] == 0).all() and bool((scores[found] >= scores[graph.mask & ~found].max()).all())


def test_the_learning_rate_follows_transformers_linear_schedule():
    """The paper's code steps its AdamW with transformers' get_linear_schedule_with_warmup (200 of 3,000 steps of
    warm-up, then down to 0): the factors, step by step, are that function's."""
    import transformers

    for steps in (3000, 750, 5):
        warmup = max(1, round(steps / 15))
        optimiser = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1.0)
        schedule = transformers.get_linear_schedule_with_warmup(optimiser, warmup, steps)
        theirs = []
        for _ in range(steps + 2):
            theirs.append(optimiser.param_groups[0]["lr"])
            optimiser.step()
            schedule.step()
        assert [pruning.learning_rate_scale(step, steps) for step in range(steps + 2)] == pytest.approx(theirs, abs=1e-12)


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


# ---------------------------------------------------------------- several methods: the paired bootstrap


def test_the_paired_interval_is_the_hand_bootstrap_of_the_same_draws():
    """The difference of two circuits' faithfulness over the same pairs, and its interval: each of the seeded draws
    (tfcli's seed, torch's generator) resamples the same pairs for both circuits; the ratio and its 2.5th and 97.5th
    percentiles recomputed with numpy. The per-circuit values are those CircuitFaithfulness gives."""
    from types import SimpleNamespace

    from tfcli.analysis.dataset import SEED, Dataset, Done
    from tfcli.commands.circuit import compare
    from tfcli.commands.circuit.core import CircuitFaithfulness

    rng = np.random.default_rng(3)
    n, resamples = 17, 1000
    clean, empty = rng.normal(4, 1, n), rng.normal(0.5, 0.5, n)
    first = empty + rng.uniform(0, 1, n) * (clean - empty)
    second = first + rng.normal(0.1, 0.1, n) * (clean - empty)  # two circuits' values go together, pair by pair
    pairs = [SimpleNamespace(line=k + 1) for k in range(n)]
    a, b = torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.bool)
    a[0, 0], b[1, 2] = True, True
    table = {compare.Faithfulness.key(a): first, compare.Faithfulness.key(b): second}

    def rows(circuits, ends, over):
        values = torch.tensor(np.stack([table[compare.Faithfulness.key(c)] for c in circuits], 1))
        return compare.Rows([p.line for p in pairs], torch.tensor(clean), torch.tensor(empty), values, False, over)
    runs = compare.Faithfulness(rows, Dataset("", pairs, 0, resamples))
    measured = runs([a, b])
    value, low, high = runs.difference(b, a)

    drawn = torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(SEED)).numpy()
    gaps = clean - empty
    ratios = np.array([(second[d] - first[d]).sum() / gaps[d].sum() for d in drawn])
    assert value == pytest.approx((second - first).sum() / gaps.sum(), abs=1e-12)
    assert [low, high] == pytest.approx(list(np.percentile(ratios, [2.5, 97.5])), abs=1e-12)
    assert value == pytest.approx(measured.values[1] - measured.values[0], abs=1e-12)
    # an interval from independent draws for each circuit is another, wider: the pairing matters
    other = torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(SEED + 1)).numpy()
    unpaired = np.array([(second[d].sum() - empty[d].sum()) / gaps[d].sum() - (first[e].sum() - empty[e].sum())
                         / gaps[e].sum() for d, e in zip(drawn, other)])
    assert np.percentile(unpaired, 97.5) - np.percentile(unpaired, 2.5) > 2 * (high - low)
    single = CircuitFaithfulness([a, b]).aggregate(
        Done(zip(pairs, [(c, e, [x, y]) for c, e, x, y in zip(clean, empty, first, second)])),
        Dataset("", pairs, 0, resamples))
    assert single.values == pytest.approx(measured.values, abs=1e-12)
    assert single.lows == pytest.approx(measured.lows, abs=1e-12)
    assert single.highs == pytest.approx(measured.highs, abs=1e-12)


# ---------------------------------------------------------------- the command

from test_circuit import KEYS, one_error  # noqa: E402
from test_report_browser import browser  # noqa: E402, F401 (a fixture)


@pytest.fixture(scope="module")
def compared(checkpoints, dataset):
    """The three-method run on the tiny GPT-2 (arguments, its JSON record and its stderr), run once."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    path, _ = checkpoints("gpt2")
    args = ["circuit", "-m", str(path), "--dataset", str(dataset), "--method", "eap,eap-ig-inputs,edge-pruning",
            "--steps", "40", "--target-edges", "20", "--sizes", "5,20,1000"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return args, json.loads(result.stdout), result.stderr


def test_several_methods_json_has_each_methods_record_and_the_differences(compared, checkpoints, dataset):
    args, record, stderr = compared
    assert list(record) == ["methods", "differences", "measured_pairs"]
    for method in ("eap", "eap-ig-inputs", "edge-pruning"):  # the progress names whose circuits it measures
        assert f"{method} faithfulness: done" in stderr, stderr
    assert [m["method"] for m in record["methods"]] == ["eap", "eap-ig-inputs", "edge-pruning"]
    for method in record["methods"]:
        assert list(method) == KEYS and method["n"] == 12 and [p["edges"] for p in method["curve"]] == [5, 20, 110]
    pruned = record["methods"][2]
    assert list(pruned["pruning"]) == ["steps", "steps_run", "target_edges", "expected_edges", "kl", "interrupted",
                                       "kl_by_step", "expected_edges_by_step"]
    assert pruned["pruning"]["steps_run"] == 40 and pruned["circuit"]["picked"] == "pruned"
    assert len(pruned["pruning"]["kl_by_step"]) == len(pruned["pruning"]["expected_edges_by_step"]) == 40
    assert sum(e["in_circuit"] for e in pruned["edges"]) == pruned["circuit"]["edges"]
    assert record["methods"][0]["pruning"] is None
    assert list(record["differences"][0]) == ["method", "minus", "edges", "difference", "interval"]
    assert [(d["method"], d["minus"]) for d in record["differences"][::3]] == [
        ("eap-ig-inputs", "eap"), ("edge-pruning", "eap"), ("edge-pruning", "eap-ig-inputs")]
    curves = {m["method"]: {p["edges"]: p["faithfulness"] for p in m["curve"]} for m in record["methods"]}
    for d in record["differences"]:
        assert d["difference"] == pytest.approx(curves[d["method"]][d["edges"]] - curves[d["minus"]][d["edges"]],
                                                abs=1e-9)
        if d["edges"] == 110:  # the whole graph for both
            assert d["interval"] == pytest.approx([0, 0], abs=1e-9)
        else:
            assert d["interval"][0] <= d["difference"] <= d["interval"][1]
    # the found circuit measured as any other: the same faithfulness as --edges with its edges
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{e['sender']} -> {e['receiver']}\n" for e in pruned["edges"] if e["in_circuit"]))
    path, _ = checkpoints("gpt2")
    from typer.testing import CliRunner

    from tfcli.cli import app

    again = json.loads(CliRunner().invoke(app, ["circuit", "-m", str(path), "--dataset", str(dataset), "--edges",
                                                f.name, "--sizes", "5", "--json"]).stdout)
    assert again["circuit"]["faithfulness"] == pytest.approx(pruned["circuit"]["faithfulness"], abs=1e-9)
    assert again["circuit"]["interval"] == pytest.approx(pruned["circuit"]["interval"], abs=1e-9)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("colour", [True, False])
def test_the_comparison_view_fits_the_width_and_keeps_every_number(cli, compared, width, colour):
    import re

    args, record, _ = compared
    result = cli(*args, "--width", str(width), "--color" if colour else "--no-color",
                 env={"NO_COLOR": "1"} if not colour else None)
    assert result.exit_code == 0, result.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    assert ("\x1b[" in result.stdout) == colour
    assert max(len(line) for line in text.splitlines()) <= width
    flat = " ".join(text.split())
    for method in record["methods"]:
        for p in method["curve"] + [method["circuit"]]:
            assert f"{p['faithfulness']:.3f}" in flat
            if p["interval"]:
                assert f"[{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]" in flat
    for d in record["differences"]:
        assert f"{d['difference']:+.3f} [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]" in flat
    assert "edge-pruning - eap-ig-inputs" in flat and "40 training steps towards 20 edges" in flat


def test_the_comparison_report_page_and_figure(cli, compared, tmp_path, browser):
    """The page drawn in Chromium: a curve per method, the curves' and the differences' tables with every number;
    the figure: both panels."""
    from test_report_browser import open_page

    args, record, _ = compared
    page_path, figure = tmp_path / "compare.html", tmp_path / "compare.svg"
    for report in (page_path, figure):
        result = cli(*args, "--report", str(report))
        assert result.exit_code == 0, result.stderr
    svg = figure.read_text()
    assert "edge-pruning - eap-ig-inputs" in svg and "difference of faithfulness" in svg
    page = open_page(browser, page_path)
    assert page.errors == []
    assert page.locator("polyline").count() == 3
    text = " ".join(page.text_content("body").split())
    for d in record["differences"]:
        assert f"{d['difference']:+.3f} [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]" in text
    for method in record["methods"]:
        for p in method["curve"]:
            assert f"{p['faithfulness']:.3f} [{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]" in text


def test_edge_pruning_alone_is_one_methods_run(cli, checkpoints, dataset):
    path, _ = checkpoints("gpt2")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--method", "edge-pruning", "--steps", "5",
                 "--target-edges", "30", "--top", "12", "--sizes", "5,20", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert list(record) == KEYS and record["method"] == "edge-pruning" and record["circuit"]["picked"] == "top"
    assert record["circuit"]["edges"] == 12 and record["pruning"]["steps"] == 5
    scores = [e["score"] for e in record["edges"]]
    assert all(0 < 1 - np.exp(-s) < 1 for s in scores)  # -ln P(z = 0): each edge's P(z > 0) in (0, 1)
    view = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--method", "edge-pruning", "--steps", "5",
               "--target-edges", "30", "--sizes", "5")
    assert view.exit_code == 0 and "the edges Edge Pruning's masks keep, trained towards 30" in " ".join(
        view.stdout.split()), view.stdout


@pytest.mark.parametrize("args,message", [
    (["--method", "eap,magic"], "method must be one of eap, eap-ig-inputs, eap-ig-activations, exact, edge-pruning"),
    (["--method", "eap,eap"], "names a method twice"),
    (["--method", "edge-pruning", "--steps", "0"], "--steps must be 1 or more"),
    (["--method", "edge-pruning", "--target-edges", "0"], "--target-edges must be 1 to the graph's 110 edges"),
    (["--method", "edge-pruning", "--target-edges", "111"], "--target-edges must be 1 to the graph's 110 edges"),
    (["--method", "edge-pruning", "--per-item"], "--per-item shows one method's scores"),
    (["--method", "eap,exact", "--graph-out", "g.json"], "--graph-out writes one method's graph"),
])
def test_bad_options_are_one_error_line_before_any_model(cli, checkpoints, dataset, no_model_built, args, message):
    path, _ = checkpoints("gpt2")
    result = cli("circuit", "-m", str(path), "--dataset", str(dataset), *args)
    assert one_error(result) and message in result.stderr, result.stderr
