"""The documentation's promises: the README's Python example runs as written, CI runs its test command, and
the encode example in docs/commands.md is real output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMANDS = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")


def test_python_api_example_runs_as_written():
    section = README[README.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["out"].last_hidden_state.shape == (1, 7, 768)
    assert namespace["out"].logits.shape == (1, 7, 30522) and namespace["pattern"].shape == (1, 12, 7, 7)
    assert not torch.equal(namespace["ablated"], namespace["out"].logits)  # the ablation changed the prediction
    cache = namespace["cache"]
    assert list(cache) == [f"blocks.{i}.resid_post" for i in range(12)]
    assert cache["blocks.5.resid_post"].grad.shape == (1, 7, 768) and cache["blocks.5.resid_post"].grad.abs().sum() > 0
    prompt, greedy, sampled = namespace["prompt"], namespace["greedy"], namespace["sampled"]
    assert greedy.shape == (1, 16) and torch.equal(greedy[:, :6], prompt)
    # sampling stops early only at gpt2-small's end-of-sequence token ([SEP], 102)
    assert 6 < sampled.shape[1] <= 16 and torch.equal(sampled[:, :6], prompt)
    assert sampled.shape[1] == 16 or sampled[0, -1].item() == 102


def test_ci_runs_the_readme_test_command():
    quick_start = README[README.index("## Quick start"):README.index("## Commands")]
    test_line = next(line for line in quick_start.splitlines() if "pytest" in line)
    install = re.search(r"pip install [^&]+", test_line).group(0).strip()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert install in ci and "pytest -q" in ci


def test_encode_example_is_what_minilm_prints_at_80_columns(cli, minilm_dir):
    """docs/commands.md's encode example is real output: all-MiniLM-L6-v2 on its sentence, 80 columns wide."""
    section = COMMANDS[COMMANDS.index("### encode"):COMMANDS.index("### compare")]
    block = re.search(r"```console\n\$ (tfcli encode .*?)\n(.*?)```", section, re.S)
    command, shown = block.group(1), block.group(2)
    text = re.search(r'"(.*)"', command).group(1)
    result = cli("encode", "--model", str(minilm_dir), "--width", "80", text)
    assert result.exit_code == 0, result.stderr
    printed = result.stderr.replace(str(minilm_dir), "path/to/all-MiniLM-L6-v2") + result.stdout
    assert printed == shown
