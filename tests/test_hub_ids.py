"""Hub ids with and without an owner, found in a fake local Hugging Face cache without any network access;
--revision; and the one-line errors for a missing path or an id that is not cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tfcli.cli import app
from tfcli.errors import TfcliError
from tfcli.sources import resolve_source


@pytest.fixture
def cache_model(save_hf_model):
    """cache_model(cache, repo_id, commit, hidden_size=32, refs=("main",)): save a tiny BERT as the snapshot
    `commit` of `repo_id` in a hub cache laid out as huggingface_hub lays it out (models--owner--name/
    snapshots/COMMIT, refs/NAME holding the commit)."""

    def save(cache, repo_id: str, commit: str, hidden_size: int = 32, refs: tuple[str, ...] = ("main",)):
        from transformers import BertConfig, BertModel

        folder = cache / ("models--" + repo_id.replace("/", "--"))
        save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=hidden_size, num_hidden_layers=1,
                                            num_attention_heads=4, intermediate_size=64), folder / "snapshots" / commit)
        (folder / "refs").mkdir(exist_ok=True)
        for ref in refs:
            (folder / "refs" / ref).write_text(commit)

    return save


def tfcli_offline(cache, *args: str) -> subprocess.CompletedProcess:
    """`python -m tfcli ARGS` with HF_HUB_CACHE=cache and HF_HUB_OFFLINE=1 (read when huggingface_hub is imported,
    hence a subprocess)."""
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tfcli", *args], capture_output=True, text=True, env=env)


def assert_one_line_error(result, exit_code: int, *needles: str) -> str:
    assert result.returncode == exit_code, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    message = result.stderr.splitlines()[0]
    assert message.startswith("error: ") and "Error" not in result.stderr  # no exception class names
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return message


@pytest.fixture
def no_download(monkeypatch):
    """Any attempt to reach the hub fails the test."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("tfcli tried to download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache that huggingface_hub, already imported in this process, uses."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_ids_with_and_without_an_owner_come_from_the_cache_offline(tmp_path, cache_model):
    for repo_id, commit in (("gpt2", "a1"), ("bert-base-uncased", "b2"), ("openai-community/gpt2", "c3")):
        cache_model(tmp_path, repo_id, commit)
    for repo_id, commit in (("gpt2", "a1"), ("bert-base-uncased", "b2"), ("openai-community/gpt2", "c3")):
        result = tfcli_offline(tmp_path, "config", repo_id, "--json")
        assert result.returncode == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["source"] == f"hub model {repo_id} (config and weights)"
        assert record["weights"] == str(tmp_path / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
                                         / "model.safetensors")


def test_a_cached_id_runs_and_touches_no_network(hub_cache, no_download, cache_model):
    cache_model(hub_cache, "bert-base-uncased", "abc")
    source = resolve_source("bert-base-uncased")
    assert source.weights == hub_cache / "models--bert-base-uncased" / "snapshots" / "abc" / "model.safetensors"
    result = CliRunner().invoke(app, ["encode", "--model", "bert-base-uncased", "--json", "time flies"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["weights"] == "loaded" and f"loaded from {source.weights}" in result.stderr


def test_revision_picks_a_branch_or_commit(hub_cache, no_download, cache_model):
    cache_model(hub_cache, "someone/tiny", "1111", hidden_size=32)
    cache_model(hub_cache, "someone/tiny", "2222", hidden_size=64, refs=("v2",))
    assert resolve_source("someone/tiny").config.hidden_size == 32
    assert resolve_source("someone/tiny", revision="v2").config.hidden_size == 64
    assert resolve_source("someone/tiny", revision="2222").config.hidden_size == 64
    result = CliRunner().invoke(app, ["config", "someone/tiny", "--revision", "v2", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["source"] == "hub model someone/tiny at revision v2 (config and weights)"


def test_revision_of_something_that_is_not_a_hub_id_is_a_usage_error():
    result = CliRunner().invoke(app, ["encode", "--model", "tiny", "--revision", "v2", "hi"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --revision applies to Hugging Face hub ids only, and `tiny` is a "
                                    "bundled config")


def test_an_id_not_cached_offline_says_how_to_get_it(tmp_path, cache_model):
    cache_model(tmp_path, "someone/present", "abc")
    for repo_id in ("gpt2", "someone/absent"):
        assert_one_line_error(tfcli_offline(tmp_path, "encode", "--model", repo_id, "hi"), 1,
                              f"`{repo_id}` is not a path, a bundled config, or a model in the local cache",
                              "HF_HUB_OFFLINE=1", f"hint: download it with `hf download {repo_id}` where there is "
                              "a network", "bert-base")  # the hint lists the bundled configs
    missing_revision = tfcli_offline(tmp_path, "config", "someone/present", "--revision", "v9")
    assert_one_line_error(missing_revision, 1, "`someone/present` at revision v9 is not",
                          "hf download someone/present --revision v9")


@pytest.mark.parametrize("path", ["./no-such-dir", "../x", "/no/such/dir", "a/b/c", "model.yaml", "conf.json"])
def test_a_path_that_does_not_exist_says_so(path):
    result = CliRunner().invoke(app, ["config", path])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == f"error: no such file or directory: {path}"


def test_an_unreachable_hub_is_one_clear_line(hub_cache, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants, errors

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def unreachable(*args, **kwargs):
        raise errors.LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(TfcliError) as error:
        resolve_source("gpt2")
    assert "the Hugging Face hub cannot be reached" in error.value.message
    assert "hf download gpt2" in error.value.hint


def test_a_download_goes_into_the_cache_and_prefers_safetensors(hub_cache, monkeypatch, cache_model):
    """Online and not cached: one download of config, tokenizer files and safetensors weights (no .bin)."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def download(repo_id, revision=None, allow_patterns=None, **kwargs):
        calls.append(allow_patterns)
        cache_model(hub_cache, repo_id, "abc")
        return str(hub_cache / f"models--{repo_id}" / "snapshots" / "abc")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert resolve_source("gpt2").weights.name == "model.safetensors"
    assert len(calls) == 1 and "model*.safetensors" in calls[0] and not any("bin" in p for p in calls[0])
    assert "*.spm" in calls[0]  # Marian's source.spm and target.spm come with it
