"""Resolve --model SRC to a config, optional weights and optional tokenizer files.

Order (README, "Commands"): `ollama:NAME[:TAG]` (a model in Ollama's local store); an existing path
(YAML file, HF config.json, a .gguf file, a directory holding config.json, or else exactly one .gguf file); then a
bundled config name (configs/NAME.yaml), then a Hugging Face hub id, `name` or `owner/name`, found in the local
Hugging Face cache without touching the network, and downloaded only when it is not there.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.checkpoints import is_gguf, read_hf_config
from tfcli.config import ModelConfig, from_dict, load_yaml
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

DEFAULT_MODEL = "bert-base"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
HUB_ID = re.compile(r"(?:\w[\w.-]*/)?\w[\w.-]*")  # `name` or `owner/name`, as the hub spells them
OLLAMA_PREFIX = "ollama:"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"  # the manifest layer that names the GGUF blob


@dataclass
class Source:
    """What --model resolved to. weights is None for a config alone (random weights)."""

    config: ModelConfig
    weights: Path | None
    tokenizer_dir: Path | None  # a model directory (its tokenizer files, or a note that it has none), or a .gguf
    # file (its metadata holds the tokenizer); None: bundled
    description: str  # where it came from, for the output
    weights_note: str | None = None  # said after `loaded from WEIGHTS`: a GGUF file's `dequantized from Q4_1`
    gguf: bool = False  # weights (and tokenizer_dir) are one GGUF file, which holds the tokenizer too


def bundled_config_dir() -> Traversable:
    """The folder of bundled YAML configs: the installed package `tfcli.configs`, or, when tfcli runs from
    a source checkout (whose tfcli/ has no configs), the checkout's top-level configs/."""
    try:
        return resources.files("tfcli.configs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "configs"


def bundled_names() -> list[str]:
    return sorted(p.name[:-5] for p in bundled_config_dir().iterdir() if p.name.endswith(".yaml"))


def resolve_source(src: str | None, revision: str | None = None) -> Source:
    """Turn a --model value into a Source; None means the bundled default. `revision` (a branch, tag or
    commit) applies to hub ids only."""
    src = str(src or DEFAULT_MODEL)  # (a Path too: tokenizer.loading.load_tokenizer passes one)
    if src.startswith(OLLAMA_PREFIX):
        if revision is not None:
            raise usage_error(f"revision applies to Hugging Face hub ids only, and `{src}` is an Ollama model",
                              parameter="revision")
        return gguf_source(ollama_model(src[len(OLLAMA_PREFIX):]), name=src)
    path = Path(src).expanduser()
    bundled = bundled_config_dir() / f"{src}.yaml"
    if path.exists() or bundled.is_file():
        if revision is not None:
            raise usage_error(f"revision applies to Hugging Face hub ids only, and `{src}` is a "
                              f"{'path' if path.exists() else 'bundled config'}", parameter="revision")
        if path.exists():
            return _from_path(path)
        with resources.as_file(bundled) as file:
            config = load_yaml(Path(file))
        return Source(config, None, None, f"bundled config `{src}`")
    if _looks_like_path(src):
        raise TfcliError(f"no such file or directory: {src}", "check the path")
    if HUB_ID.fullmatch(src):
        return _from_path(_hub_snapshot(src, revision),
                          f"hub model {src}" + (f" at revision {revision}" if revision else ""))
    raise TfcliError(f"unknown model `{src}`: not a path, a bundled config or a hub id",
                     f"bundled configs: {', '.join(bundled_names())}")


def _looks_like_path(src: str) -> bool:
    """A path rather than a hub id (`owner/name` or `name`): ./x, ../x, /x, ~/x, a/b/c, C:\\x, x.yaml, x.json."""
    return (src.startswith((".", "/", "~")) or "\\" in src or src.count("/") > 1
            or src.endswith((".yaml", ".yml", ".json", ".safetensors", ".bin", ".gguf")))


def _from_path(path: Path, name: str | None = None) -> Source:
    """The source a path holds; `name` says where it came from (default: the path)."""
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            single = _single_gguf(path)
            if single is not None:
                return gguf_source(single, name)
            yamls = sorted(path.glob("*.yaml"))
            raise TfcliError(f"{path} holds no config.json",
                             f"pass the YAML file itself: {yamls[0]}" if yamls else
                             "a model directory needs config.json (as save_pretrained writes it) or one .gguf file")
        config = read_hf_config(config_file)
        weights = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
        what = "config and weights" if weights else "config only, no weights"
        return Source(config, weights, path, f"{name or path} ({what})")
    if path.suffix in (".yaml", ".yml"):
        return Source(load_yaml(path), None, None, f"config file {path}")
    if path.suffix == ".json":
        return Source(read_hf_config(path), None, None, f"config file {path}")
    if is_gguf(path):
        return gguf_source(path, name)
    raise TfcliError(f"{path}: not a model source",
                     "pass a YAML config, a config.json, a .gguf file or a model directory")


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    """The local snapshot of a hub model, found in the Hugging Face cache without any network access;
    downloaded only when it is not cached and the network (and HF_HUB_OFFLINE) allows."""
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        raise TfcliError(f"`{repo_id}` looks like a hub id, but huggingface_hub is not installed",
                         "pip install huggingface_hub") from None
    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cached, str):
        return Path(cached).parent
    at = f" at revision {revision}" if revision else ""
    not_cached = (f"`{repo_id}`{at} is not a path, a bundled config, or a model in the local cache of "
                  f"Hugging Face models ({constants.HF_HUB_CACHE})")
    where_to_get_it = (f"download it with `hf download {repo_id}"
                       f"{f' --revision {revision}' if revision else ''}` where there is a network; "
                       f"bundled configs: {', '.join(bundled_names())}")
    if constants.HF_HUB_OFFLINE:
        raise TfcliError(f"{not_cached}, and HF_HUB_OFFLINE=1 forbids downloading it", where_to_get_it)
    return _download(repo_id, revision, not_cached, where_to_get_it)


def _download(repo_id: str, revision: str | None, not_cached: str, where_to_get_it: str) -> Path:
    """Download config, tokenizer files and weights (safetensors, else .bin: never both) into the cache."""
    from huggingface_hub import errors, snapshot_download

    try:
        folder = Path(snapshot_download(repo_id, revision=revision,
                                        allow_patterns=["*.json", "*.txt", "*.model", "*.spm",
                                                        "model*.safetensors"]))
        if not any((folder / name).is_file() for name in WEIGHT_FILES):
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=["pytorch_model*.bin"]))
    except errors.GatedRepoError:
        raise TfcliError(f"{repo_id} is a gated model on the Hugging Face hub",
                         "accept its terms on the hub, then log in with `hf auth login`") from None
    except errors.RepositoryNotFoundError:
        raise TfcliError(f"{not_cached}, and the Hugging Face hub has no such model (or it is private)",
                         f"check the name; bundled configs: {', '.join(bundled_names())}") from None
    except errors.RevisionNotFoundError:
        raise TfcliError(f"{repo_id} has no revision `{revision}` on the Hugging Face hub",
                         "use a branch, a tag or a commit of that model") from None
    except errors.LocalEntryNotFoundError:  # what huggingface_hub raises when the hub cannot be reached
        raise TfcliError(f"{not_cached}, and the Hugging Face hub cannot be reached", where_to_get_it) from None
    except (errors.HFValidationError, ValueError) as exc:
        raise TfcliError(f"`{repo_id}` is not a valid hub id: {str(exc).splitlines()[0][:160]}",
                         f"a hub id is `name` or `owner/name`; bundled configs: {', '.join(bundled_names())}") from None
    except Exception as exc:
        raise TfcliError(f"{not_cached}, and downloading it failed: {str(exc).splitlines()[0][:160]}",
                         where_to_get_it) from None
    if not (folder / "config.json").is_file():
        raise TfcliError(f"hub model {repo_id} has no config.json", "tfcli loads transformers checkpoints")
    return folder


def gguf_source(path: Path, name: str | None = None) -> Source:
    """A GGUF file (tfcli.checkpoints.gguf, and gguf_hf for its Hugging Face config): the config its metadata gives,
    read by the family as a config.json is, and the file itself as weights and tokenizer; refused before anything is
    built when a tensor's type cannot be dequantized or a tensor has no place in the family's model."""
    from tfcli.checkpoints import gguf, gguf_hf, translate_hf_config

    header = gguf.read_header(path)
    origin = str(header.path)
    config = from_dict(translate_hf_config(gguf_hf.hf_config(header), origin), origin=origin)
    gguf_hf.check_loadable(header)
    return Source(config, header.path, header.path,
                  f"{name or path} (GGUF {header.architecture}, {header.type_summary()})",
                  weights_note=header.weights_note(), gguf=True)


def gguf_header(path: Path):
    """The parsed header of a GGUF file (its metadata holds the tokenizer: tfcli.tokenizer.gguf reads it through here)."""
    from tfcli.checkpoints import gguf

    return gguf.read_header(path)


def _single_gguf(directory: Path) -> Path | None:
    """The one .gguf file of a directory without config.json; None when it has none; several: a usage error."""
    found = sorted(p for p in directory.glob("*.gguf") if p.is_file())
    if len(found) > 1:
        raise usage_error(f"{directory} holds {len(found)} GGUF files: {', '.join(p.name for p in found)}",
                          f"pass the one you mean, e.g. --model {directory / found[0].name}", parameter="model")
    return found[0] if found else None


def ollama_model(reference: str) -> Path:
    """The GGUF blob of `NAME[:TAG]` (tag `latest` by default; `owner/NAME` outside Ollama's library) in Ollama's
    local store ($OLLAMA_MODELS, else ~/.ollama/models), found through its manifest without running Ollama."""
    store = Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()
    name, _, tag = reference.partition(":")
    tag = tag or "latest"
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+){0,2}", name) or not re.fullmatch(r"[\w.-]+", tag):
        raise usage_error(f"`{OLLAMA_PREFIX}{reference}` is not an Ollama model name",
                          "write ollama:NAME or ollama:NAME:TAG, e.g. ollama:llama3.2:1b", parameter="model")
    parts = name.split("/")
    where = {1: ["registry.ollama.ai", "library"], 2: ["registry.ollama.ai"], 3: []}[len(parts)] + parts
    manifest = store.joinpath("manifests", *where, tag)
    if not manifest.is_file():
        raise TfcliError(f"Ollama model `{name}:{tag}` not found: there is no {manifest}",
                         f"pull it with `ollama pull {name}:{tag}`, or set OLLAMA_MODELS to the folder Ollama keeps "
                         "its models in")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8"))["layers"]
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        raise TfcliError(f"{manifest}: not an Ollama manifest with a model layer ({OLLAMA_MODEL_LAYER})",
                         f"pull the model again with `ollama pull {name}:{tag}`") from None
    blob = store / "blobs" / str(digest).replace(":", "-")
    if not blob.is_file():
        raise TfcliError(f"Ollama model `{name}:{tag}`: its manifest names the blob {blob.name}, which is not in "
                         f"{blob.parent}", f"pull it again with `ollama pull {name}:{tag}`")
    return blob
