"""A single forward pass with no site asked for, against another checkout of tfcli: is it as fast as before?

    python benchmarks/plain_pass.py --before PATH [--rounds N] [--calls N]   (OMP_NUM_THREADS=1: steadier on a busy machine)

PATH is another checkout of this repository (e.g. `git worktree add /tmp/before <commit>`). Each round runs
this checkout's tfcli and PATH's in turns, each in a fresh process (PYTHONPATH picks the checkout), on the bundled
bert-base (random weights, seed 0) at 1 x 16 and 8 x 128 tokens: `--calls` warm calls of a plain `model(ids)`
with the kernels a single pass uses (plain, not the packed ones a model used again and again moves to). Printed:
each one's median time per call, min-max (median) over the rounds, and the ratio this / before, with the load
average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from measure import load_average, machine, spread

CHILD = """
import json, statistics, sys, time, torch
import tfcli
model = tfcli.load_model("bert-base")
from tfcli.model import linear
for module in model.modules():  # the plain kernels of a single pass (a checkout that packs by itself)
    if isinstance(module, linear.Linear):
        module.packable = False
times = {}
for batch, length in ((1, 16), (8, 128)):
    ids = torch.randint(1000, 30000, (batch, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(3):
            model(ids)
        seconds = []
        for _ in range(int(sys.argv[1])):
            start = time.perf_counter()
            model(ids)
            seconds.append(time.perf_counter() - start)
    times[f"{batch} x {length}"] = statistics.median(seconds)
print(json.dumps(times))
"""


def run(checkout: Path, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, "-c", CHILD, str(calls)], capture_output=True, text=True, env=env,
                            check=True, cwd=checkout)
    return json.loads(result.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout of tfcli")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    now: dict[str, list[float]] = {}
    before: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for checkout, into in ((args.before, before), (here, now)):
            for shape, seconds in run(checkout, args.calls).items():
                into.setdefault(shape, []).append(seconds)
    print(f"{machine()}\n{load_average()}")
    for shape in now:
        ratios = [a / b for a, b in zip(now[shape], before[shape])]
        print(f"{shape}: this checkout {spread([s * 1e3 for s in now[shape]])} ms, before "
              f"{spread([s * 1e3 for s in before[shape]])} ms, this / before {spread(ratios)} "
              f"(median of rounds {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
