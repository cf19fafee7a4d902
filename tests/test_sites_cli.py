"""Named sites through the commands and the Python API's edges: `encode --sites` (table, JSON, --save, the memory
check), `config --sites`, the hooks that edit a site (positions, heads), and the mistakes a user can make with them.
Parity of every site with transformers, per family, is tests/test_sites.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import tfcli
from tfcli.errors import TfcliError
from tfcli.model import sites

DECODER = "architecture: decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n" \
          "intermediate_size: 64\nnorm_position: pre\nfinal_norm: true\nhead: lm\ntype_vocab_size: 0\n" \
          "embedding_norm: false\nmax_position_embeddings: 64\n"
TEXTS = ["time flies like an arrow", "hello"]


@pytest.fixture
def decoder_yaml(tmp_path):
    path = tmp_path / "decoder.yaml"
    path.write_text(DECODER, encoding="utf-8")
    return str(path)


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_encode_sites_are_in_the_json_the_saved_file_and_the_api(cli, decoder_yaml, tmp_path):
    saved = tmp_path / "run.safetensors"
    reports = records(cli("encode", *TEXTS, "--model", decoder_yaml, "--json", "--sites", "blocks.*.attn.z",
                          "--sites", "final_norm.scale", "--save", str(saved)))
    tensors = load_file(str(saved))
    model = tfcli.load_model(decoder_yaml)
    for row, record in enumerate(reports):
        assert list(record["sites"]) == ["blocks.0.attn.z", "blocks.1.attn.z", "final_norm.scale"]
        _, cache = model.run_with_cache(torch.tensor([record["ids"]]), ["blocks.*.attn.z", "final_norm.scale"])
        n = len(record["ids"])
        for name, values in record["sites"].items():
            shown = torch.tensor(values, dtype=torch.float64)
            assert shown.shape == cache[name][0].shape  # this text's own tokens: (T, H, D) or (T, 1)
            assert (shown - cache[name][0].double()).abs().max() <= 5e-7 + 1e-6, name  # rounded to 6 decimals
            assert (tensors[name][row, :n].double() - cache[name][0].double()).abs().max() <= 1e-5, name
    assert tensors["blocks.0.attn.z"].shape == (2, 7, 4, 8)  # the padded batch, as the other saved tensors


def test_encode_sites_table_shows_each_kept_site(cli, decoder_yaml):
    result = cli("encode", TEXTS[0], "--model", decoder_yaml, "--width", "100", "--no-color",
                 "--sites", "blocks.1.mlp.post", "--sites", "blocks.0.attn.pattern")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("sites (--sites; their values: --json, --save)")
    rows = [line.split() for line in lines[start + 3:start + 5]]
    # in the order the pass reaches them, with this text's shape (7 tokens)
    assert [row[0] for row in rows] == ["blocks.0.attn.pattern", "blocks.1.mlp.post"]
    assert rows[0][1:5] == ["(4,", "7,", "7)", "+0.1429"]  # a pattern's mean: 1 / 7 per query row on average
    assert rows[1][1:3] == ["(7,", "64)"]


def test_a_site_pattern_the_model_lacks_is_a_usage_error_and_nothing_is_written(cli, tmp_path):
    saved = tmp_path / "run.safetensors"
    result = cli("encode", "hi", "--model", "tiny", "--sites", "final_norm.*", "--save", str(saved))
    assert result.exit_code == 2
    assert "error: the model has no site `final_norm.*`" in result.stderr  # a post-norm BERT: no final norm
    assert result.stdout == "" and not saved.exists()
    result = cli("encode", "hi", "--model", "tiny", "--sites", "blocks.0.atn.z")
    assert result.exit_code == 2 and "did you mean blocks.0.attn.z" in result.stderr


def test_encode_sites_count_towards_the_capture_limit(cli, decoder_yaml):
    """Every pattern of every layer through --sites, with --layers keeping a single map: the sites are what
    would not fit."""
    text = " ".join(["word"] * 60)  # 62 tokens: 2 layers x 4 heads x 62^2 x 4 bytes = 120.1 KB of patterns
    args = ("encode", text, "--model", decoder_yaml, "--layers", "0", "--heads", "0", "--max-capture-mb", "0.1")
    assert cli(*args).exit_code == 0  # one map: 15.0 KB
    result = cli(*args, "--sites", "blocks.*.attn.pattern")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2] == (
        "error: one text of 62 tokens would capture 15.0 KB of attention (1 head x 62^2 positions x 1 layer) "
        "and 120.1 KB of --sites: more than --max-capture-mb 0.1")


def test_config_sites_lists_what_a_forward_pass_names(cli, decoder_yaml):
    (record,) = records(cli("config", decoder_yaml, "--sites", "--json"))
    model = tfcli.load_model(decoder_yaml)
    ids = torch.tensor([[101, 2051, 10029]])
    _, cache = model.run_with_cache(ids)
    assert list(record["sites"]) == list(cache)
    sizes = {"B": 1, "T": 3}
    for name, shape in record["sites"].items():
        assert [sizes.get(d, d) for d in shape] == list(cache[name].shape), name
    table = cli("config", decoder_yaml, "--sites", "--width", "80", "--no-color")
    assert table.exit_code == 0, table.stderr
    rows = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:] if line.strip()}
    assert rows["blocks.*.attn.pattern"] == ["0-1", "(B,", "4,", "T,", "T)"]
    assert rows["logits"] == ["(B,", "T,", "30522)"]


# ---------------------------------------------------------------- the hooks that edit a site


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("sites") / "decoder.yaml"
    path.write_text(DECODER, encoding="utf-8")
    return tfcli.load_model(str(path))


IDS = torch.tensor([[101, 2051, 10029, 2066, 2019]])
OTHER = torch.tensor([[101, 2051, 10029, 2066, 8612]])


def test_patching_every_position_of_a_residual_site_gives_the_other_runs_logits(model):
    clean_logits, clean = model.run_with_cache(IDS, ["blocks.1.resid_pre"])
    name = "blocks.1.resid_pre"
    patched = model.run_with_hooks(OTHER, {name: sites.replace(name, clean[name])})
    assert torch.allclose(patched, clean_logits, atol=1e-6, rtol=0)  # the last block reads only the stream
    # the texts differ in their last token only: patching that position restores the clean prediction there, and
    # the positions before it (causal: they cannot read it) keep the corrupt run's
    corrupt = model.run_with_hooks(OTHER, {})
    one = model.run_with_hooks(OTHER, {name: sites.replace(name, clean[name], positions=[4])})
    assert torch.allclose(one[0, :4], corrupt[0, :4], atol=1e-6, rtol=0)
    assert torch.allclose(one[0, 4], clean_logits[0, 4], atol=1e-6, rtol=0)
    assert (one[0, 4] - corrupt[0, 4]).abs().max() > 1e-3


def test_zero_mean_and_add_change_only_what_they_select(model):
    z, pattern = "blocks.0.attn.z", "blocks.0.attn.pattern"
    _, cache = model.run_with_cache(IDS, [z, pattern, "blocks.0.resid_post"])
    _, zeroed = model.run_with_cache(IDS, [z], hooks={z: sites.zero(z, positions=[1, -1], heads=[2])})
    expected = cache[z].clone()
    expected[:, [1, 4], 2] = 0  # positions 1 and the last, head 2: the cache holds what the pass went on with
    assert torch.equal(zeroed[z][:, [1, 4], 2], expected[:, [1, 4], 2])
    assert torch.allclose(zeroed[z], expected, atol=1e-6, rtol=0)  # the rest as it was (fused or explicit softmax)

    mean = sites.mean(pattern, heads=[0])(cache[pattern])  # the query rows of head 0 replaced by their mean
    assert torch.equal(mean[:, 1:], cache[pattern][:, 1:])
    assert torch.allclose(mean[0, 0], cache[pattern][0, 0].mean(0, keepdim=True).expand(5, 5))

    vector = torch.arange(32, dtype=torch.float32)
    added = sites.add("blocks.0.resid_post", vector, positions=[0])(cache["blocks.0.resid_post"])
    assert torch.equal(added[0, 0], cache["blocks.0.resid_post"][0, 0] + vector)
    assert torch.equal(added[0, 1:], cache["blocks.0.resid_post"][0, 1:])


def test_hook_mistakes_are_usage_errors(model):
    with pytest.raises(TfcliError, match="no site `blocks.0.attn.zz`") as error:
        model.run_with_hooks(IDS, {"blocks.0.attn.zz": lambda v: None})
    assert error.value.exit_code == 2 and "blocks.0.attn.z" in error.value.hint
    with pytest.raises(TfcliError, match=r"returned \(1, 5\), not a tensor of the site's shape \(1, 5, 32\)"):
        model.run_with_hooks(IDS, {"blocks.0.resid_post": lambda v: v[..., 0]})
    with pytest.raises(TfcliError, match="heads \\[4\\] out of range for blocks.0.attn.z: it has 4"):
        model.run_with_hooks(IDS, {"blocks.0.attn.z": sites.zero("blocks.0.attn.z", heads=[4])})
    with pytest.raises(TfcliError, match="blocks.0.resid_post has no heads axis"):
        model.run_with_hooks(IDS, {"blocks.0.resid_post": sites.zero("blocks.0.resid_post", heads=[0])})
