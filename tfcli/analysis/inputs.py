"""What a model reads of the texts an analysis runs on: a decoder's text read as a prompt, and a batch of id lists
padded into ids and a mask."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.tokenizer import Encoding, Tokenizer


def model_input(config: ModelConfig, encoding: Encoding) -> list[int]:
    """What the model reads: a decoder reads the text as `generate` reads a prompt, without an end-of-sequence
    token the tokenizer appends (BERT's [SEP]), so that its last position predicts what comes next."""
    ids = list(encoding.ids)
    if config.architecture == "decoder" and len(ids) > 1 and ids[-1] in config.eos_token_ids:
        ids = ids[:-1]
    return ids


def padded(rows: list[list[int]], tokenizer: Tokenizer, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Id lists of any lengths -> ids (B, T) right-padded with the tokenizer's pad id (0 without one) and the mask
    of real tokens (B, T), on `device`."""
    import torch

    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=device)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=device)
    return ids, mask
