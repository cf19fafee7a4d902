"""Resolve --model SRC to a config, optional weights and optional tokenizer files.

Order (README, "Commands"): an existing path (YAML file, HF config.json, or a directory holding config.json),
then a bundled config name (configs/NAME.yaml), then a Hugging Face hub id (local cache first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.checkpoints import read_hf_config
from tfcli.config import ModelConfig, load_yaml
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

DEFAULT_MODEL = "bert-base"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


@dataclass
class Source:
    """What --model resolved to. weights is None for a config alone (random weights)."""

    config: ModelConfig
    weights: Path | None
    tokenizer_dir: Path | None
    description: str  # where it came from, for the output


def bundled_config_dir() -> Traversable:
    """The folder of bundled YAML configs: the installed package `tfcli.configs`, or, when tfcli runs from
    a source checkout (whose tfcli/ has no configs), the checkout's top-level configs/."""
    try:
        return resources.files("tfcli.configs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "configs"


def bundled_names() -> list[str]:
    return sorted(p.name[:-5] for p in bundled_config_dir().iterdir() if p.name.endswith(".yaml"))


def resolve_source(src: str | None) -> Source:
    """Turn a --model value into a Source; None means the bundled default."""
    src = src or DEFAULT_MODEL
    path = Path(src).expanduser()
    if path.exists():
        return _from_path(path)
    bundled = bundled_config_dir() / f"{src}.yaml"
    if bundled.is_file():
        with resources.as_file(bundled) as file:
            config = load_yaml(Path(file))
        return Source(config, None, None, f"bundled config `{src}`")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", src):
        return _from_path(_hub_snapshot(src), description=f"hub model {src}")
    if any(ch in src for ch in "/\\") or src.endswith((".yaml", ".yml", ".json")):
        raise TfcliError(f"no such file or directory: {src}", "check the path")
    raise TfcliError(f"unknown model `{src}`: not a path, a bundled config or a hub id",
                     f"bundled configs: {', '.join(bundled_names())}")


def _from_path(path: Path, description: str | None = None) -> Source:
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            yamls = sorted(path.glob("*.yaml"))
            raise TfcliError(f"{path} holds no config.json",
                             f"pass the YAML file itself: {yamls[0]}" if yamls else
                             "a model directory needs config.json (as save_pretrained writes it)")
        config = read_hf_config(config_file)
        weights = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
        tokenizer_dir = path if any((path / name).is_file() for name in TOKENIZER_FILES) else None
        what = "trained weights" if weights else "config only, no weights"
        return Source(config, weights, tokenizer_dir, description or f"{path} ({what})")
    if path.suffix in (".yaml", ".yml"):
        return Source(load_yaml(path), None, None, f"config file {path}")
    if path.suffix == ".json":
        return Source(read_hf_config(path), None, None, f"config file {path}")
    raise TfcliError(f"{path}: not a model source", "pass a YAML config, a config.json or a model directory")


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot of a hub model; downloads only when it is not cached and the network allows."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on it
        raise TfcliError(f"`{repo_id}` looks like a hub id, but huggingface_hub is not installed") from None
    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.bin"]
    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=patterns))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as exc:
        raise TfcliError(f"`{repo_id}` is not a path, a bundled config, or a hub model in the local cache, "
                         f"and it could not be downloaded ({type(exc).__name__})",
                         f"bundled configs: {', '.join(bundled_names())}") from None
