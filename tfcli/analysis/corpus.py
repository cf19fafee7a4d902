"""A corpus read as a decoder reads it in training (`sae train`, `lens fit`): the texts tokenized and joined, each
after a separator (the model's BOS, else its EOS, unless the text starts with a special token), cut into windows
of a fixed number of tokens, each with the positions a training keeps (not the first, whose norm is the attention
sink's, and no special token); a SHA-256 of every window read, so that a resumed run can tell that it reads the same
corpus, and `skip`, the windows of a run read again without running the model. And the run's folder: `check_out`,
a new `--out` (never one that holds files), and its checkpoint (`training.pt`), written whole or not at all and read
back for `--resume`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tfcli.analysis.inputs import model_input
from tfcli.errors import file_error, usage_error

if TYPE_CHECKING:
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

CHECKPOINT = "training.pt"


class Windows:
    """The corpus as windows of `context` token ids, each with the positions kept (not the first, not a special
    token); `digest` hashes every window read."""

    def __init__(self, texts: Iterable[list[str]], tokenizer: Tokenizer, model: TransformerModel, context: int):
        config = model.config
        self.separator = config.bos_token_id if config.bos_token_id is not None else \
            (config.eos_token_ids[0] if config.eos_token_ids else None)
        self.specials = {i for i in (config.bos_token_id, config.pad_token_id, *config.eos_token_ids)
                         if i is not None}
        self.texts, self.tokenizer, self.config, self.context = iter(texts), tokenizer, config, context
        self.ids: list[int] = []
        self.special: list[bool] = []
        self.read = 0  # windows read
        self.digest = hashlib.sha256()

    def next(self) -> tuple[list[int], list[bool]] | None:
        """The next window's ids and which positions are kept; None at the corpus's end."""
        while len(self.ids) < self.context:
            batch = next(self.texts, None)
            if batch is None:
                return None
            for encoding in self.tokenizer.encode(batch):
                ids = model_input(self.config, encoding)
                special = [s is None or i in self.specials for s, i in zip(encoding.sequence_ids, ids)]
                if self.separator is not None and not (special and special[0]):
                    ids, special = [self.separator, *ids], [True, *special]
                self.ids += ids
                self.special += special
        window, special = self.ids[:self.context], self.special[:self.context]
        del self.ids[:self.context], self.special[:self.context]
        self.read += 1
        self.digest.update(torch.tensor(window, dtype=torch.int64).numpy().tobytes())
        return window, [False] + [not s for s in special[1:]]


def skip(windows: Windows, count: int) -> None:
    """Read `count` windows without running them (a resumed run catching up); the corpus must have them."""
    for _ in range(count):
        if windows.next() is None:
            raise usage_error("--resume: the corpus is shorter than the one the run trained on",
                              "give the same --file as the interrupted run")


def check_out(out: Path, what: str) -> None:
    """A training's --out: a new or empty folder, never one that holds files (nothing overwritten: exit 1, as an
    existing output file). `what`: the run it would continue ("its fit")."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise file_error(f"--out {out}: not an empty folder", f"give a new folder (or --resume it, to continue {what})")


def write_checkpoint(out: Path, data: dict[str, Any]) -> None:
    """`data` (tensors, numbers and strings only: read with weights_only) as out/training.pt, whole or not at all."""
    partial = out / (CHECKPOINT + ".partial")
    torch.save(data, partial)
    partial.replace(out / CHECKPOINT)


def read_checkpoint(folder: Path, form: str, command: str) -> dict[str, Any]:
    """folder/training.pt as `command` (`tfcli sae train`, ...) wrote it (its "format" is `form`); missing, damaged or
    another run's: one error (exit 1)."""
    path = folder / CHECKPOINT
    if not path.is_file():
        raise file_error(f"--resume {folder}: no checkpoint there ({CHECKPOINT})",
                         f"give the --out folder of an interrupted `{command}`")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001  (a damaged file: pickle, zip or torch errors)
        raise file_error(f"--resume {folder}: {CHECKPOINT} is not readable: {str(error).splitlines()[0][:160]}") \
            from None
    if not isinstance(data, dict) or data.get("format") != form:
        raise file_error(f"--resume {folder}: {CHECKPOINT} is not a {command} checkpoint")
    return data
