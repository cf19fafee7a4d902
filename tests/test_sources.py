"""--model resolution: every kind of source docs/commands.md ("Model resolution") lists, in its order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcli.cli import app
from tfcli.sources import bundled_names

ROOT = Path(__file__).resolve().parent.parent


def config_record(*args: str) -> dict:
    result = CliRunner().invoke(app, ["config", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def tiny_bert(save_hf_model):
    """tiny_bert(path): save a 1-layer BertModel checkpoint there."""
    from transformers import BertConfig, BertModel

    def save(path):
        save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                            num_attention_heads=4, intermediate_size=64), path)

    return save


@pytest.mark.slow
def test_hub_id_resolves_from_the_local_cache_offline(tmp_path, tiny_bert):
    snapshot = tmp_path / "hub" / "models--someone--tiny-bert" / "snapshots" / "abc123"
    tiny_bert(snapshot)
    (tmp_path / "hub" / "models--someone--tiny-bert" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--tiny-bert" / "refs" / "main").write_text("abc123")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    # a subprocess: huggingface_hub reads its cache location when it is first imported
    found, missing = (subprocess.run([sys.executable, "-m", "tfcli", "config", repo, "--json"], capture_output=True,
                                     text=True, env=env) for repo in ("someone/tiny-bert", "someone/absent"))
    record = json.loads(found.stdout)
    assert record["config"]["model_type"] == "bert" and record["weights"].endswith("model.safetensors")
    assert missing.returncode == 1 and "local cache" in missing.stderr and "Traceback" not in missing.stderr


def test_every_path_kind_resolves(tmp_path, tiny_bert):
    tiny_bert(tmp_path / "checkpoint")
    directory = config_record(str(tmp_path / "checkpoint"))
    assert directory["weights"] is not None and "(config and weights)" in directory["source"]
    config_file = config_record(str(tmp_path / "checkpoint" / "config.json"))
    assert config_file["weights"] is None and config_file["config"]["hidden_size"] == 32
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text("hidden_size: 16\nnum_attention_heads: 2\nnum_hidden_layers: 1\nintermediate_size: 32\n")
    assert config_record(str(yaml_file))["config"]["name"] == "mine"
    assert config_record("tiny")["source"] == "bundled config `tiny`"
    assert config_record()["config"]["name"] == "bert-base"  # the default


def test_an_existing_path_wins_over_a_bundled_name(tmp_path, monkeypatch, tiny_bert):
    (tmp_path / "tiny").mkdir()
    tiny_bert(tmp_path / "tiny")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["config", "tiny", "--json"])
    assert json.loads(result.stdout)["config"]["model_type"] == "bert"


def test_unknown_name_lists_the_bundled_configs():
    result = CliRunner().invoke(app, ["config", "no-such-model"])
    assert result.exit_code == 1 and "bert-base" in result.stderr and "tiny" in result.stderr


def test_bundled_configs_are_found_from_a_source_checkout(monkeypatch):
    # From a checkout, its tfcli/ shadows an installed tfcli and holds no `configs` package (that is the
    # top-level configs/); blocking the import stands in for that, whatever this environment installed.
    cli = ("import runpy, sys; sys.modules['tfcli.configs'] = None; "
           "sys.argv = ['tfcli', 'config', 'tiny', '--json']; runpy.run_module('tfcli', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", cli], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["source"] == "bundled config `tiny`"
    monkeypatch.setitem(sys.modules, "tfcli.configs", None)
    assert "tiny" in bundled_names()
