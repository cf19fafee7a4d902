"""`tfcli patch --dataset` and `tfcli attribute --dataset` through the command line: the aggregate's JSON record
and its keys, --per-item, the aggregate as the ratio of the items' means, the bootstrap, the alignment of pairs of
different lengths, the views at 80 and 120 columns, Ctrl-C, and every kind of bad dataset refused naming its line
before any model is built. That the aggregate equals patching by hand on transformers' modules is
tests/test_datasets.py."""

from __future__ import annotations

import json
import re

import pytest
import torch

from tfcli.commands.patch import core as patch

NAMES = ["mary", "john", "tom", "james", "anna", "sarah", "david", "paul", "mark", "kate"]
PLACES = ["store", "park", "school", "office"]


@pytest.fixture(scope="module")
def peaked(peaked_gpt2):
    """A tiny GPT-2 on the bundled BERT vocabulary that predicts with conviction (tests/conftest.py)."""
    return peaked_gpt2[0]


def ioi(count: int, lengths_differ: bool = False) -> list[dict]:
    """IOI-like pairs on the BERT vocabulary: names swapped in the corrupt text; every other pair one word longer
    when `lengths_differ`."""
    pairs = []
    for i in range(count):
        a, b = NAMES[i % len(NAMES)], NAMES[(i + 3) % len(NAMES)]
        place = PLACES[i % len(PLACES)]
        extra = "big " if lengths_differ and i % 2 else ""
        pairs.append({"clean": f"when {a} and {b} went to the {extra}{place} {b} gave a drink to",
                      "corrupt": f"when {b} and {a} went to the {extra}{place} {a} gave a drink to",
                      "target": a, "foil": b})
    return pairs


def write(tmp_path, items, name="data.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items))
    return str(path)


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


AGGREGATE_KEYS = ["dataset", "n", "pairs", "skipped", "equal", "small_gaps", "interrupted", "align", "columns",
                  "tokens_clean", "varying", "corrupted", "position", "target", "foil", "clean_value",
                  "corrupt_value", "small_gap", "method", "positions", "grids", "bootstrap", "intervals",
                  "restored_share"]


def test_the_aggregate_is_the_ratio_of_the_pairs_means_with_each_pair_first(cli, peaked, tmp_path):
    data = write(tmp_path, ioi(12))
    items = records(cli("patch", "-m", str(peaked), "--dataset", data, "--per-item", "--json", "--bootstrap", "200"))
    assert len(items) == 13
    *pairs, aggregate = items
    assert list(aggregate) == AGGREGATE_KEYS
    assert all(list(p)[:2] == ["clean", "corrupt"] and "grids" in p for p in pairs)  # a single run's record each
    assert aggregate["n"] == aggregate["pairs"] == 12 and aggregate["skipped"] == 0 and aggregate["align"] == "start"
    assert aggregate["target"] is None and aggregate["foil"] is None  # the lines have different ones
    gaps = [p["clean_value"] - p["corrupt_value"] for p in pairs]
    assert aggregate["clean_value"] == pytest.approx(sum(p["clean_value"] for p in pairs) / 12, abs=1e-9)
    checked = 0
    for site in ("resid", "attn", "mlp", "heads"):
        for layer, row in enumerate(aggregate["grids"][site]):
            for k, value in enumerate(row):
                each = [p["grids"][site][layer][k] for p in pairs]
                expected = sum(s * g for s, g in zip(each, gaps)) / sum(gaps)
                assert value == pytest.approx(expected, abs=1e-9), (site, layer, k)
                low, high = aggregate["intervals"][site][layer][k]
                assert low - 1e-9 <= value <= high + 1e-9
                share = aggregate["restored_share"][site][layer][k]
                assert share == pytest.approx(sum(s >= 0.5 for s in each) / 12)
                checked += abs(value) > 0.05
    assert checked > 5  # not all 0: the comparison could fail
    assert aggregate["columns"] == [str(i) for i in range(len(pairs[0]["ids_clean"]))]
    assert set(aggregate["corrupted"]) == {i for p in pairs for i, (a, b) in
                                           enumerate(zip(p["ids_clean"], p["ids_corrupt"])) if a != b}
    assert aggregate["varying"] == [2, 4, 8, 9]  # the names and places vary ([CLS] 0, "when" 1 do not)


def test_the_bootstrap_is_seeded_and_0_leaves_it_out(cli, peaked, tmp_path):
    data = write(tmp_path, ioi(10))
    args = ("patch", "-m", str(peaked), "--dataset", data, "--sites", "heads", "--json")
    first, second = records(cli(*args))[-1], records(cli(*args))[-1]
    assert first["bootstrap"] == 1000 and first["intervals"] == second["intervals"]
    none = records(cli(*args, "--bootstrap", "0"))[-1]
    assert none["bootstrap"] == 0 and none["intervals"] is None and none["grids"] == first["grids"]
    widths = [high - low for row in first["intervals"]["heads"] for low, high in row]
    assert max(widths) > 0  # pairs differ: the interval has a width


def test_pairs_of_different_lengths_need_align_end_for_the_kinds_by_position(cli, peaked, tmp_path, no_model_built):
    data = write(tmp_path, ioi(4, lengths_differ=True))
    refused = cli("patch", "-m", str(peaked), "--dataset", data)
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "different lengths (14, 15 tokens)" in refused.stderr and "--align end" in refused.stderr


def test_align_end_counts_back_from_the_metric_and_heads_need_no_alignment(cli, peaked, tmp_path):
    data = write(tmp_path, ioi(4, lengths_differ=True))
    aligned = records(cli("patch", "-m", str(peaked), "--dataset", data, "--align", "end", "--sites", "resid",
                          "--per-item", "--json", "--bootstrap", "0"))
    *pairs, aggregate = aligned
    assert aggregate["align"] == "end" and aggregate["columns"][-1] == "-1" and len(aggregate["columns"]) == 14
    gaps = [p["clean_value"] - p["corrupt_value"] for p in pairs]
    for back in (1, 2, 5):
        each = [p["grids"]["resid"][1][len(p["ids_clean"]) - back] for p in pairs]
        expected = sum(s * g for s, g in zip(each, gaps)) / sum(gaps)
        assert aggregate["grids"]["resid"][1][-back] == pytest.approx(expected, abs=1e-9)
    heads = records(cli("patch", "-m", str(peaked), "--dataset", data, "--sites", "heads", "--json"))[-1]
    assert heads["align"] is None and heads["columns"] is None and len(heads["grids"]["heads"][0]) == 4


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("colour", [False, True])
def test_the_views_fit_and_say_what_the_numbers_are(cli, peaked, tmp_path, width, colour):
    data = write(tmp_path, ioi(10))
    for command in (("patch", "--sites", "resid,heads"), ("attribute", "--by", "head")):
        result = cli(*command, "-m", str(peaked), "--dataset", data, "--width", str(width),
                     "--color" if colour else "--no-color")
        assert result.exit_code == 0, result.stderr
        assert ("\x1b[" in result.stdout) == colour
        plain = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout)
        lines = plain.splitlines()
        assert all(len(line) <= width for line in lines), max(lines, key=len)
        flat = " ".join(plain.split())
        # a path longer than the width is broken across lines (pytest-xdist's temporary paths pass 80 columns)
        assert f"dataset{data}:10" in "".join(plain.split()) and "95% bootstrap interval" in flat
        if command[0] == "patch":
            assert "mean patched - mean corrupt" in flat and "restored" in flat and "95% interval" in flat
        else:
            assert "mean std 95% interval" in flat and "differ by at most" in flat


def test_attribute_over_a_dataset_gives_each_components_mean_and_spread(cli, peaked, tmp_path):
    data = write(tmp_path, ioi(10))  # a patch dataset: attribute reads each line's clean text
    *prompts, aggregate = records(cli("attribute", "-m", str(peaked), "--dataset", data, "--by", "head",
                                      "--per-item", "--json"))
    assert len(prompts) == 10 and all(p["text"].startswith("when ") for p in prompts)
    assert list(aggregate) == ["dataset", "n", "prompts", "skipped", "bootstrap", "interrupted", "position",
                               "target", "foil", "logit", "total", "worst", "components"]
    assert list(aggregate["components"][0]) == ["name", "layer", "head", "neuron", "mean", "std", "low", "high"]
    for j, component in enumerate(aggregate["components"]):
        values = torch.tensor([p["components"][j]["value"] for p in prompts], dtype=torch.float64)
        assert component["name"] == prompts[0]["components"][j]["name"]
        assert component["mean"] == pytest.approx(float(values.mean()), abs=1e-9)
        assert component["std"] == pytest.approx(float(values.std()), abs=1e-9)
        assert component["low"] <= component["mean"] <= component["high"]
    assert aggregate["logit"] == pytest.approx(sum(p["logit"] for p in prompts) / 10, abs=1e-9)
    assert aggregate["worst"] == pytest.approx(max(abs(p["total"] - p["logit"]) for p in prompts), abs=1e-12)
    assert aggregate["worst"] < 1e-4


def test_attribute_by_neuron_over_a_dataset_keeps_the_largest_means_and_sums(cli, peaked, tmp_path):
    data = write(tmp_path, ioi(10))
    aggregate = records(cli("attribute", "-m", str(peaked), "--dataset", data, "--by", "neuron", "--top", "3",
                            "--json"))[-1]
    neurons = [c for c in aggregate["components"] if c["neuron"] is not None]
    assert len(neurons) == 3
    assert sum(c["mean"] for c in aggregate["components"]) == pytest.approx(aggregate["logit"], abs=1e-4)


def test_ctrl_c_shows_the_aggregate_of_the_pairs_finished(cli, peaked, tmp_path, monkeypatch):
    data = write(tmp_path, ioi(6))
    original, calls = patch.run_pairs, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(patch, "PAIRS", 1)  # a pair per batch: the fourth is interrupted
    monkeypatch.setattr(patch, "run_pairs", interrupted)
    result = cli("patch", "-m", str(peaked), "--dataset", data, "--json", "--bootstrap", "0")
    assert result.exit_code == 130
    (aggregate,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert aggregate["n"] == 3 and aggregate["pairs"] == 6 and aggregate["interrupted"] is True
    assert "3 pairs finished" in result.stderr


def bad_lines(tmp_path) -> dict[str, tuple[str, str]]:
    good = ioi(60)
    two_tokens = [dict(p) for p in good]
    two_tokens[56]["target"] = "mary ann"
    longer = [dict(p) for p in good[:12]]
    longer[4]["corrupt"] += " now"
    no_clean = [dict(p) for p in good[:12]]
    del no_clean[2]["clean"]
    return {
        "empty": (write(tmp_path, [], "empty.jsonl"), "is empty"),
        "not json": (write(tmp_path, [json.dumps(good[0]), "{clean: 1}"], "bad.jsonl"), "line 2: not JSON"),
        "no clean": (write(tmp_path, no_clean, "noclean.jsonl"), "line 3: no `clean`"),
        "two tokens": (write(tmp_path, two_tokens, "two.jsonl"), "line 57: target 'mary ann' is not one token"),
        "lengths": (write(tmp_path, longer, "longer.jsonl"), "line 5: the clean and corrupt texts tokenize to "
                                                             "different lengths (14 and 15 tokens)"),
        "unknown key": (write(tmp_path, [{**good[0], "targte": "x"}], "key.jsonl"), "line 1: unknown key `targte`"),
        "mixed foils": (write(tmp_path, [good[0], {k: v for k, v in good[1].items() if k != "foil"}], "mixed.jsonl"),
                        "line 2 gives no `foil` where line 1 does"),
    }


@pytest.mark.parametrize("case", ["empty", "not json", "no clean", "two tokens", "lengths", "unknown key",
                                  "mixed foils"])
def test_a_bad_dataset_is_one_error_naming_its_line_before_any_model_work(cli, peaked, tmp_path, no_model_built,
                                                                         case):
    path, message = bad_lines(tmp_path)[case]
    result = cli("patch", "-m", str(peaked), "--dataset", path)
    assert result.exit_code == 2 and result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_skip_bad_skips_and_counts_the_bad_lines(cli, peaked, tmp_path):
    items = ioi(12)
    items[3]["target"] = "mary ann"
    aggregate = records(cli("patch", "-m", str(peaked), "--dataset", write(tmp_path, items), "--skip-bad",
                            "--sites", "heads", "--json"))[-1]
    assert aggregate["n"] == 11 and aggregate["skipped"] == 1


def test_a_bootstrap_over_too_few_pairs_is_refused_when_asked_and_left_out_otherwise(cli, peaked, tmp_path,
                                                                                     monkeypatch):
    data = write(tmp_path, ioi(2))
    asked = cli("patch", "-m", str(peaked), "--dataset", data, "--bootstrap", "100")
    assert asked.exit_code == 2 and "over 2 items is not meaningful" in asked.stderr
    default = cli("patch", "-m", str(peaked), "--dataset", data, "--sites", "heads", "--json")
    assert default.exit_code == 0 and json.loads(default.stdout)["intervals"] is None
    assert "2 pairs are too few" in default.stderr


@pytest.mark.parametrize("args, message", [
    (["CLEAN", "CORRUPT"], "give CLEAN CORRUPT or --dataset, not both"),
    (["--target", "mary"], "--target is read from each line of the dataset"),
])
def test_options_a_dataset_gives_per_line_are_refused(cli, peaked, tmp_path, no_model_built, args, message):
    result = cli("patch", "-m", str(peaked), "--dataset", write(tmp_path, ioi(2)), *args)
    assert result.exit_code == 2 and message in result.stderr


def test_dataset_options_without_a_dataset_are_refused(cli, peaked, no_model_built):
    result = cli("patch", "a b", "a c", "-m", str(peaked), "--target", "b", "--per-item")
    assert result.exit_code == 2 and "--per-item is for a --dataset" in result.stderr
    result = cli("attribute", "a b", "-m", str(peaked), "--bootstrap", "10")
    assert result.exit_code == 2 and "--bootstrap is for a --dataset" in result.stderr


def test_a_dataset_is_read_from_stdin(cli, peaked, tmp_path):
    text = "".join(json.dumps(p) + "\n" for p in ioi(3))
    result = cli("attribute", "-m", str(peaked), "--dataset", "-", "--json", input=text)
    assert records(result)[-1]["n"] == 3


def test_skip_bad_skips_lines_that_cannot_be_read_too(cli, peaked, tmp_path):
    items = [json.dumps(p) for p in ioi(11)] + ["{not json", json.dumps({**ioi(1)[0], "targte": "x"})]
    result = cli("patch", "-m", str(peaked), "--dataset", write(tmp_path, items), "--skip-bad", "--sites", "heads",
                 "--json")
    assert records(result)[-1]["skipped"] == 2 and records(result)[-1]["n"] == 11
    assert "skipped line 12: not JSON" in result.stderr and "skipped line 13: unknown key `targte`" in result.stderr


def test_an_end_aligned_view_names_its_columns_as_they_are_labelled(cli, peaked, tmp_path):
    """--align end: the columns are -14 ... -1, and what the compact view leaves out is named so (not 0-based)."""
    data = write(tmp_path, ioi(4, lengths_differ=True))
    result = cli("patch", "-m", str(peaked), "--dataset", data, "--align", "end", "--sites", "resid", "--width", "120")
    assert result.exit_code == 0, result.stderr
    note = next(line for line in result.stdout.splitlines() if line.startswith("resid: left out"))
    assert "positions -14" in note and "of 14)" in note  # [CLS]: the first column, never restores anything
    assert "positions 0" not in note
