"""Lean loading: a load and a forward pass hold the weights once (no float32 detour, no packed second copy),
running out of memory is a clear error, and the commands import nothing heavy they do not need. (The memory
check at its boundary: tests/test_encode_numbers.py.)"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tfcli.config import load_yaml, parameter_count

PEAK = """
import sys, torch, tfcli

def rss(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) * 1024

before = rss("VmRSS")
model = tfcli.load_model(sys.argv[1], dtype=sys.argv[2])
weights = sum(p.numel() * p.element_size() for p in model.parameters())
_, cache = model.run_with_cache(torch.randint(0, 1000, (1, 16)), ["blocks.*.resid_post"])
with torch.no_grad():
    model.unembed(torch.stack(list(cache.values())[:-1])[:, 0])  # the logit lens, as encode runs it
print(weights, rss("VmHWM") - before)
"""


@pytest.fixture(scope="module")
def wide_checkpoint(tmp_path_factory):
    """A bfloat16 Llama checkpoint of 57 MB (28 M parameters), mostly linear weights (8 layers, 512 wide), saved by transformers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("wide")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                         intermediate_size=1536, max_position_embeddings=64, tie_word_embeddings=False)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_load_a_forward_pass_and_its_lens_hold_the_weights_once(wide_checkpoint, dtype):
    """The peak memory of loading a checkpoint, one forward pass and its logit lens is the weights in the
    requested dtype plus a little: no float32 copy on the way to bfloat16, no packed copy of the weights (nor
    of the unembedding, used twice) for a single pass."""
    result = subprocess.run([sys.executable, "-c", PEAK, str(wide_checkpoint), dtype], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    weights, peak = map(int, result.stdout.split())
    assert peak < 1.25 * weights + 24 * 2**20, f"peak {peak / 2**20:.0f} MB for {weights / 2**20:.0f} MB of weights"


@pytest.mark.slow
def test_running_out_of_memory_while_loading_is_a_clear_error(tmp_path, tiny_config):
    """Weights that pass the check (they fit this machine) but not the memory the process may use."""
    path = tmp_path / "big.yaml"
    path.write_text(tiny_config.read_text().replace("hidden_size: 32", "hidden_size: 1024")
                    + "vocab_size: 2000000\n")  # 8 GB of token embeddings

    # the address space that starting the command takes (a CUDA build of torch reserves gigabytes), plus 4 GB
    started = subprocess.run([sys.executable, "-c", "import torch, tfcli.api; print(open('/proc/self/status').read())"],
                             capture_output=True, text=True, check=True).stdout
    limit = int(next(line for line in started.splitlines() if line.startswith("VmPeak")).split()[1]) * 1024 + 4 * 2**30

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "tfcli", "encode", "--model", str(path), "hi"],
                            capture_output=True, text=True, preexec_fn=limit_memory)
    if parameter_count(load_yaml(path)) * 4 > os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
        pytest.skip("this machine has less than 8 GB: the memory check refuses the config first")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == ["error: big does not fit in the free memory of cpu in float32",
                                          "hint: close other programs, or try --dtype bfloat16 or another device"]


IMPORTS = """
import json, sys
from typer.testing import CliRunner
from tfcli.cli import app

HEAVY = ("torch._dynamo", "torch._inductor", "transformers", "huggingface_hub", "sympy",
         "matplotlib", "scipy")
found = {}
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.stderr)
    heavy = HEAVY + (("torch",) if args[0] == "config" else ())
    found[" ".join(args)] = [name for name in heavy if name in sys.modules]
print(json.dumps(found))
"""


@pytest.mark.slow
def test_commands_import_nothing_heavy(tmp_path, save_hf_model, tiny_config):
    """config imports no torch at all; encode, classify and generate (with --lens, in bfloat16, from a
    checkpoint) import neither torch._dynamo nor transformers, huggingface_hub or the like."""
    from transformers import GPT2Config, GPT2LMHeadModel

    checkpoint = str(tmp_path / "gpt2")
    save_hf_model(GPT2LMHeadModel, GPT2Config(vocab_size=30522, n_embd=32, n_layer=1, n_head=2, n_positions=64),
                  checkpoint)
    classifier = tmp_path / "classifier.yaml"
    classifier.write_text(tiny_config.read_text().replace("head: mlm", "head: classifier"))
    commands = [["config", "bert-base", "--json"], ["config", checkpoint],  # first: before anything imports torch
                ["encode", "--model", "tiny", "hi"], ["classify", "--model", str(classifier), "hi"],
                ["encode", "--model", checkpoint, "--dtype", "bfloat16", "hi"],
                ["generate", "--model", checkpoint, "-n", "3", "--lens", "--dtype", "bfloat16", "hi"]]
    result = subprocess.run([sys.executable, "-c", IMPORTS, json.dumps(commands)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert list(found) == [" ".join(args) for args in commands]
    assert all(modules == [] for modules in found.values()), found
