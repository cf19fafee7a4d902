"""`tfcli circuit --dataset` on what the runner gives every dataset command: --ray (a local Ray cluster started here, 2
workers, the scores and the faithfulness runs on it) gives the one-process scores, circuit and faithfulness; Ctrl-C
while the edges are scored keeps the pairs finished (their aggregate is a run over those pairs alone), and Ctrl-C
while the faithfulness is measured keeps the pairs measured (the faithfulness of the same circuit over those pairs
alone)."""

from __future__ import annotations

import json

import pytest

from tfcli.commands.circuit import core as circuit

NAMES = ["mary", "john", "anna", "tom", "paul", "sarah", "james", "emma", "david", "lisa", "mark", "kate"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory, save_hf_model):
    """A Llama with grouped-query attention (4 query heads, 2 key/value heads), 2 blocks, on the BERT vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=30522, bos_token_id=101, eos_token_id=102, pad_token_id=0, hidden_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                         max_position_embeddings=64, initializer_range=0.3)
    path = tmp_path_factory.mktemp("llama")
    save_hf_model(LlamaForCausalLM, config, path, perturb=True)
    return path


def pairs_file(path, count):
    import random

    rng = random.Random(0)
    lines = []
    for _ in range(count):
        a, b = rng.sample(NAMES, 2)
        lines.append({"clean": f"when {a} and {b} went to the store {b} gave a drink to",
                      "corrupt": f"when {b} and {a} went to the store {a} gave a drink to", "target": a, "foil": b})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 name-swap pairs (two batches of the command's 8)."""
    return pairs_file(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", 12)


def records(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def scores(record) -> dict[str, float]:
    return {f"{e['sender']}->{e['receiver']}": e["score"] for e in record["edges"]}


def assert_same_run(one, other, tolerance=1e-6, ratio_tolerance=None):
    """The same edges' scores, circuit, curve and faithfulness (to `ratio_tolerance`, default `tolerance`)."""
    a, b = scores(one), scores(other)
    scale = max(abs(v) for v in a.values())
    assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) <= tolerance * scale
    assert [e["in_circuit"] for e in one["edges"]] == [e["in_circuit"] for e in other["edges"]]
    for p, q in zip(one["curve"] + [one["circuit"]], other["curve"] + [other["circuit"]]):
        assert (p["edges"], p["nodes"]) == (q["edges"], q["nodes"])
        assert p["faithfulness"] == pytest.approx(q["faithfulness"], abs=ratio_tolerance or tolerance)
    assert one["n"] == other["n"]


def test_a_dataset_on_the_cluster_equals_one_process(cli, llama, dataset, monkeypatch):
    """The scores, the curve and each step of --faithful's bisection run on one pool of Ray workers."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install \"tfcli[ray]\"")
    from tfcli import cluster

    args = ["circuit", "-m", str(llama), "--dataset", str(dataset), "--faithful", "0.5", "--sizes", "5,50",
            "--per-item", "--json"]
    one = cli(*args)
    assert one.exit_code == 0, one.stderr
    started, mapped = [], []
    enter, map_on = cluster.Cluster.__enter__, cluster.Cluster.map
    monkeypatch.setattr(cluster.Cluster, "__enter__", lambda pool: started.append(pool) or enter(pool))
    monkeypatch.setattr(cluster.Cluster, "map", lambda pool, work, items, options, *rest: mapped.append(
        (pool, type(options).__name__)) or map_on(pool, work, items, options, *rest))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error", configure_logging=False)
    try:
        spread = cli(*args, "--ray", "local", "--ray-workers", "2")
    finally:
        ray.shutdown()
    assert spread.exit_code == 0, spread.stderr
    assert spread.stderr.count("ray: 2 workers at local") == len(started) == 1, spread.stderr
    kinds = [kind for _, kind in mapped]
    assert kinds[0] == "CircuitScores" and kinds[1:] == ["CircuitFaithfulness"] * (len(kinds) - 1) and len(kinds) > 3
    assert all(pool is started[0] for pool, _ in mapped)
    one, spread = records(one), records(spread)
    assert len(one) == len(spread) == 13
    for a, b in zip(one[:-1], spread[:-1]):  # each pair's record, in the dataset's order
        assert a["line"] == b["line"] and [e["sender"] + e["receiver"] for e in a["top_edges"]] == \
            [e["sender"] + e["receiver"] for e in b["top_edges"]]
        assert all(abs(x["score"] - y["score"]) <= 1e-6 * abs(a["top_edges"][0]["score"])
                   for x, y in zip(a["top_edges"], b["top_edges"]))
    # a worker's block of 8 pairs is padded and batched unlike the one process's batches: the faithfulness, a ratio of
    # float32 logit differences, moved by 1.03e-6 on this machine (1.1609352 against 1.1609363)
    assert_same_run(one[-1], spread[-1], ratio_tolerance=1e-5)


def test_ctrl_c_while_scoring_keeps_the_pairs_finished(cli, llama, dataset, tmp_path, monkeypatch):
    results, seen = circuit.CircuitScores.results, []

    def interrupted(self, model, tokenizer, items, progress):
        for result in results(self, model, tokenizer, items, progress):
            seen.append(result.line)
            if len(seen) == 4:
                raise KeyboardInterrupt
            yield result
    args = ["--top", "15", "--sizes", "5,40", "--json"]
    first = pairs_file(tmp_path / "first.jsonl", 3)  # the dataset's first three lines (the same seed)
    alone = cli("circuit", "-m", str(llama), "--dataset", str(first), *args)
    assert alone.exit_code == 0, alone.stderr
    monkeypatch.setattr(circuit.CircuitScores, "results", interrupted)
    result = cli("circuit", "-m", str(llama), "--dataset", str(dataset), *args)
    assert result.exit_code == 130 and "interrupted: 3 pairs finished; the aggregate is theirs" in result.stderr
    [record] = records(result)
    assert record["interrupted"] and record["n"] == 3 and record["pairs"] == 12
    assert_same_run(record, records(alone)[0], 1e-9)


def test_ctrl_c_while_measuring_keeps_the_pairs_measured(cli, llama, dataset, tmp_path, monkeypatch):
    results, seen = circuit.CircuitFaithfulness.results, []

    def interrupted(self, model, tokenizer, items, progress):
        for result in results(self, model, tokenizer, items, progress):
            seen.append(1)
            if len(seen) == 6:
                raise KeyboardInterrupt
            yield result
    edges = tmp_path / "edges.txt"
    edges.write_text("L1.mlp -> logits\nL1H2 -> logits\nL0H1 -> L1H2.v\ninput -> L0H1.q\ninput -> logits\n")
    args = ["--edges", str(edges), "--sizes", "5,40", "--json"]
    first = pairs_file(tmp_path / "first.jsonl", 5)
    alone = records(cli("circuit", "-m", str(llama), "--dataset", str(first), *args))[0]
    monkeypatch.setattr(circuit.CircuitFaithfulness, "results", interrupted)
    result = cli("circuit", "-m", str(llama), "--dataset", str(dataset), *args)
    assert result.exit_code == 130 and "interrupted" in result.stderr, result.stderr
    [record] = records(result)
    assert record["interrupted"] and record["n"] == 12 and record["circuit"]["pairs"] == 5
    assert record["circuit"]["edges"] == 5 and alone["circuit"]["pairs"] == 5
    assert record["circuit"]["faithfulness"] == pytest.approx(alone["circuit"]["faithfulness"], abs=1e-9)
    assert [p["faithfulness"] for p in record["curve"]] != [p["faithfulness"] for p in alone["curve"]]  # other scores


def test_ctrl_c_in_a_faithful_bisection_step_does_not_decide_the_circuit(cli, llama, dataset, monkeypatch):
    """--faithful: Ctrl-C in a bisection step (the second faithfulness run) leaves that step's few pairs out of the
    decision: the circuit is the curve's smallest reaching F, with the faithfulness the curve measured over every
    pair, not the cut step's (which would be labelled with the full pair count)."""
    results, calls = circuit.CircuitFaithfulness.results, []

    def interrupted(self, model, tokenizer, items, progress):
        calls.append(0)
        for result in results(self, model, tokenizer, items, progress):
            calls[-1] += 1
            if len(calls) == 2 and calls[-1] == 3:
                raise KeyboardInterrupt
            yield result
    monkeypatch.setattr(circuit.CircuitFaithfulness, "results", interrupted)
    result = cli("circuit", "-m", str(llama), "--dataset", str(dataset), "--faithful", "0.5", "--sizes", "1,200",
                 "--json")
    assert result.exit_code == 130 and len(calls) == 2, (calls, result.stderr)  # a step was under way
    [record] = records(result)
    found, curve = record["circuit"], {p["edges"]: p for p in record["curve"]}
    assert record["interrupted"] and found["pairs"] == record["n"] == 12 and found["picked"] == "faithful"
    assert found["edges"] in curve and found["faithfulness"] == curve[found["edges"]]["faithfulness"] >= 0.5
    assert not any(line.startswith("--faithful 0.5: ") for line in result.stderr.splitlines())
