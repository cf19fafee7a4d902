"""docs/graph.md's run is real output: its per-layer table of the transcoders `sae train --transcoder` trained on
SmolLM2-135M is the stored record's (docs/results/transcoders-smollm2.json, the run's `--json` line), and its graph's
scores, targets and validation table are the stored graph's (docs/results/graph-paris.json, `tfcli graph --json`).
The runs take half an hour and minutes of a CPU, and the transcoders are 300 MB: CI cannot rerun them, so this checks
that the page says what they gave."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGE = (ROOT / "docs" / "graph.md").read_text(encoding="utf-8")


def table_rows(heading: str) -> list[list[str]]:
    """The cells of the Markdown table that follows `heading` in docs/graph.md (header and rule left out)."""
    after = PAGE[PAGE.index(heading):]
    lines = [line for line in after.splitlines()[1:] if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_layer_table_is_the_stored_training_record():
    record = json.loads((RESULTS / "transcoders-smollm2.json").read_text(encoding="utf-8"))
    rows = table_rows("### Each layer on the held-out tokens")
    assert len(rows) == record["layers"] == len(record["figures"]) == 30
    for row, figures in zip(rows, record["figures"]):
        assert row == [str(figures["layer"]), f"{figures['explained']:.3f}", f"{figures['explained_topk']:.3f}",
                       f"{figures['l0']:.1f}", str(figures["dead"])]
    assert f"{record['tokens']:,} training tokens" in PAGE and f"{record['held_out']:,} held-out tokens" in PAGE
    assert record["latents"] == 1024 and record["skip"]


def test_the_graph_is_the_stored_graph():
    graph = json.loads((RESULTS / "graph-paris.json").read_text(encoding="utf-8"))
    assert graph["targets"][0]["text"] == " Paris"
    assert f"replacement score {graph['replacement_score']:.3f}, completeness score " \
           f"{graph['completeness_score']:.3f}" in PAGE
    validation = graph["validation"]
    assert f"correlation {validation['correlation']:+.3f}" in PAGE
    rows = table_rows("### Validation")
    assert len(rows) == len(validation["nodes"]) >= 3
    for row, node in zip(rows, validation["nodes"]):
        assert row[0] == f"L{node['layer']} f{node['feature']}@{node['position']}"
        assert [float(cell) for cell in row[2:5]] == [round(node[key], 4) for key in ("predicted", "direct",
                                                                                       "measured")]
    listed = re.findall(r"`L(\d+) f(\d+)@(\d+)`", PAGE[PAGE.index("### The features on the path"):
                                                        PAGE.index("### Validation")])
    kept = {(str(n["layer"]), str(n["feature"]), str(n["position"])) for n in graph["nodes"] if n["kind"] == "feature"}
    assert listed and set(listed) <= kept
