"""`tfcli circuit --compare A.json B.json`: curves of runs made apart over the same pairs (position-blind and
--positions spans: one run cannot hold both), with the paired bootstrap interval of each difference. Checked against
numpy from the records' own per-pair metrics and the same seeded draws; the per-pair metrics themselves against
each pair run alone (a single pair's faithfulness gives back its m(C)); and the bad inputs."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from test_circuit import checkpoints, one_error  # noqa: F401 (a fixture)
from test_circuit_spans import char_spans

NAMES = ["mary", "john", "anna", "tom", "paul", "sarah", "james", "emma", "david", "lisa", "mark", "kate"]


@pytest.fixture(scope="module")
def span_dataset(tmp_path_factory):
    """Twelve name-swap pairs of one length with their spans (io, s1, s2, end), so that a position-blind run and a
    --positions spans run go over the same pairs."""
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("compare") / "pairs.jsonl"
    rows = []
    for _ in range(12):
        a, b = rng.sample(NAMES, 2)
        clean = f"when {a} and {b} went to the store {b} gave a drink to"
        corrupt = f"when {b} and {a} went to the store {a} gave a drink to"
        rows.append({"clean": clean, "corrupt": corrupt, "target": a, "foil": b,
                     "spans": {"clean": char_spans(clean), "corrupt": char_spans(corrupt)}})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def runs(checkpoints, span_dataset, tmp_path_factory):
    """Three records on the tiny GPT-2 over the same pairs: eap and eap-ig-inputs in one run, eap-ig-inputs with
    --positions spans, and eap-ig-inputs alone (as a file: path, record)."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    path, _ = checkpoints("gpt2")
    folder = tmp_path_factory.mktemp("records")
    made = {}
    for name, extra in (("both", ["--method", "eap,eap-ig-inputs"]),
                        ("spans", ["--method", "eap-ig-inputs", "--positions", "spans"]),
                        ("alone", ["--method", "eap-ig-inputs"])):
        result = CliRunner().invoke(app, ["circuit", "-m", str(path), "--dataset", str(span_dataset), "--sizes",
                                          "5,20,60", "--faithful", "0.5", *extra, "--json"])
        assert result.exit_code == 0, result.output
        file = folder / f"{name}.json"
        file.write_text(result.stdout)
        made[name] = (file, json.loads(result.stdout))
    return made


def hand_paired(later, earlier, clean, empty, resamples=1000):
    """The difference of two circuits' faithfulness over the same pairs and its 95% interval, by numpy, over the
    draws tfcli's seed makes (torch's generator)."""
    from tfcli.analysis.dataset import SEED

    later, earlier, gaps = np.array(later), np.array(earlier), np.array(clean) - np.array(empty)
    drawn = torch.randint(len(gaps), (resamples, len(gaps)), generator=torch.Generator().manual_seed(SEED)).numpy()
    ratios = np.array([(later[d] - earlier[d]).sum() / gaps[d].sum() for d in drawn])
    return (later - earlier).sum() / gaps.sum(), *np.percentile(ratios, [2.5, 97.5])


def test_each_points_metrics_give_back_its_faithfulness(runs):
    """sum(m(C) - m(empty)) / sum(m(full) - m(empty)) of a curve point's (and the picked circuit's) per-pair metrics
    is the faithfulness the record states."""
    for _, record in runs.values():
        for method in record.get("methods", [record]):
            ends = method["pair_ends"]
            assert ends["lines"] == list(range(1, 13))
            clean, empty = np.array(ends["clean"]), np.array(ends["empty"])
            for p in method["curve"] + [method["circuit"]]:
                assert len(p["metrics"]) == 12
                assert (np.array(p["metrics"]) - empty).sum() / (clean - empty).sum() == pytest.approx(
                    p["faithfulness"], abs=1e-9)


def test_a_pairs_metric_is_that_pair_run_alone(cli, checkpoints, span_dataset, tmp_path):
    """A fixed circuit (--edges) over the dataset: each pair's stored m(C) is what the pair run alone gives, m(empty) +
    faithfulness (m(full) - m(empty)) of its single-pair run."""
    path, _ = checkpoints("gpt2")
    edges = tmp_path / "edges.txt"
    edges.write_text("input -> L0H1.v\nL0H1 -> L1.mlp\nL1.mlp -> logits\ninput -> L0.mlp\nL0.mlp -> logits\n")
    whole = cli("circuit", "-m", str(path), "--dataset", str(span_dataset), "--edges", str(edges), "--sizes", "5",
                "--json")
    assert whole.exit_code == 0, whole.stderr
    record = json.loads(whole.stdout)
    rows = [json.loads(line) for line in span_dataset.read_text().splitlines()]
    for k in (0, 5, 11):
        row = rows[k]
        one = json.loads(cli("circuit", "-m", str(path), "--edges", str(edges), "--sizes", "5", "--target",
                             row["target"], "--foil", row["foil"], row["clean"], row["corrupt"], "--json").stdout)
        full, empty = one["clean_value"], one["corrupt_value"]
        assert record["pair_ends"]["clean"][k] == pytest.approx(full, abs=1e-5)
        assert record["pair_ends"]["empty"][k] == pytest.approx(empty, abs=1e-5)
        alone = empty + one["circuit"]["faithfulness"] * (full - empty)
        assert record["circuit"]["metrics"][k] == pytest.approx(alone, abs=1e-5)


def test_compare_is_the_hand_paired_bootstrap(cli, runs):
    """--compare of the two-method record and the --positions spans one: three curves; every difference (at each
    common size, and of the picked circuits) is numpy's paired bootstrap of the records' per-pair metrics."""
    (both, both_record), (spans, spans_record) = runs["both"], runs["spans"]
    result = cli("circuit", "--compare", str(both), "--compare", str(spans), "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert list(record) == ["pairs", "curves", "differences"] and record["pairs"] == 12
    assert [c["label"] for c in record["curves"]] == ["eap", "eap-ig-inputs", "eap-ig-inputs (spans)"]
    assert [c["size_unit"] for c in record["curves"]] == ["edge", "edge", "edge-span"]
    methods = both_record["methods"] + [spans_record]
    by_label = dict(zip(["eap", "eap-ig-inputs", "eap-ig-inputs (spans)"], methods))
    ends = both_record["methods"][0]["pair_ends"]
    # the spans run's m(full) and m(empty) are the position-blind run's
    assert spans_record["pair_ends"]["clean"] == pytest.approx(ends["clean"], abs=1e-5)
    assert spans_record["pair_ends"]["empty"] == pytest.approx(ends["empty"], abs=1e-5)
    seen = set()
    for d in record["differences"]:
        later, earlier = by_label[d["method"]], by_label[d["minus"]]
        if d["circuit"]:
            a, b = earlier["circuit"]["metrics"], later["circuit"]["metrics"]
        else:
            a, b = ({p["edges"]: p["metrics"] for p in m["curve"]}[d["edges"]] for m in (earlier, later))
        value, low, high = hand_paired(b, a, ends["clean"], ends["empty"])
        assert d["difference"] == pytest.approx(value, abs=1e-9)
        assert d["interval"] == pytest.approx([low, high], abs=1e-9)
        seen.add((d["method"], d["minus"], d["edges"], d["circuit"]))
    assert ("eap-ig-inputs (spans)", "eap-ig-inputs", 20, False) in seen
    assert ("eap-ig-inputs (spans)", "eap", None, True) in seen
    # the stored curves are shown as the records have them
    assert record["curves"][2]["curve"][1]["faithfulness"] == spans_record["curve"][1]["faithfulness"]


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("colour", [True, False])
def test_the_compare_view_fits_the_width_and_keeps_every_number(cli, runs, width, colour):
    both, spans = runs["both"][0], runs["spans"][0]
    args = ["circuit", "--compare", str(both), "--compare", str(spans)]
    record = json.loads(cli(*args, "--json").stdout)
    result = cli(*args, "--width", str(width), "--color" if colour else "--no-color",
                 env={"NO_COLOR": "1"} if not colour else None)
    assert result.exit_code == 0, result.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
    assert max(len(line) for line in text.splitlines()) <= width
    flat = " ".join(text.split())
    for curve in record["curves"]:
        for p in curve["curve"] + [curve["circuit"]]:
            assert f"{p['faithfulness']:.3f} [{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]" in flat
        assert f"{curve['circuit']['edges']:,}:" in flat
    for d in record["differences"]:
        assert f"{d['difference']:+.3f} [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]" in flat
    assert "eap-ig-inputs (spans): sizes in (edge, span) pairs" in flat


def test_bad_compare_inputs_are_one_error_line(cli, runs, tmp_path, span_dataset, checkpoints):
    both, record = runs["both"]
    alone = runs["alone"][0]
    missing = cli("circuit", "--compare", str(tmp_path / "none.json"), "--compare", str(both))
    assert one_error(missing, 1) and "none.json" in missing.stderr
    old = tmp_path / "old.json"  # a record written before the per-pair metrics
    first = dict(record["methods"][0])
    first.pop("pair_ends")
    old.write_text(json.dumps(first))
    result = cli("circuit", "--compare", str(old), "--compare", str(alone))
    assert one_error(result, 1) and "no per-pair metrics" in result.stderr
    other = tmp_path / "other.json"  # over other pairs
    moved = json.loads(alone.read_text())
    moved["pair_ends"]["lines"] = moved["pair_ends"]["lines"][::-1]
    other.write_text(json.dumps(moved))
    result = cli("circuit", "--compare", str(other), "--compare", str(alone))
    assert one_error(result, 1) and "other pairs" in result.stderr
    shifted = tmp_path / "shifted.json"  # another model or counterfactual: the pairs' ends differ
    moved = json.loads(alone.read_text())
    moved["pair_ends"]["empty"] = [x + 0.5 for x in moved["pair_ends"]["empty"]]
    shifted.write_text(json.dumps(moved))
    result = cli("circuit", "--compare", str(shifted), "--compare", str(alone))
    assert one_error(result, 1) and "clean or corrupt metrics differ" in result.stderr
    nameless = tmp_path / "nameless.json"  # JSON, but not a whole record
    broken = json.loads(alone.read_text())
    broken.pop("method")
    nameless.write_text(json.dumps(broken))
    result = cli("circuit", "--compare", str(nameless), "--compare", str(alone))
    assert one_error(result, 1) and "not a circuit --json record" in result.stderr  # said, not an unexpected error
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json\n")
    result = cli("circuit", "--compare", str(garbage), "--compare", str(alone))
    assert one_error(result, 1) and "cannot read it as a circuit --json record" in result.stderr
    assert one_error(cli("circuit", "--compare", str(alone)), 2)  # one curve
    assert one_error(cli("circuit", "--compare", str(alone), "--compare", str(both), "--dataset", str(span_dataset)),
                     2)
