"""Start-up time of the CLI against `import torch` (median wall time of several subprocess runs).

Run: python benchmarks/startup.py [RUNS]. Target: every tfcli command under a quarter of `import torch`.
"""

import statistics
import subprocess
import sys
import time

TFCLI = [sys.executable, "-m", "tfcli"]
COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "tfcli --help": [*TFCLI, "--help"],
    "tfcli tokenize TEXT": [*TFCLI, "tokenize", "time flies like an arrow"],
    "tfcli tokenize --json TEXT": [*TFCLI, "tokenize", "--json", "time flies like an arrow"],
}


def median_seconds(command: list[str], runs: int) -> float:
    subprocess.run(command, check=True, capture_output=True)  # warm the file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    baseline = None
    for name, command in COMMANDS.items():
        seconds = median_seconds(command, runs)
        baseline = baseline or seconds
        print(f"{name:<28} {seconds * 1000:8.0f} ms   {seconds / baseline:5.2f} x import torch")


if __name__ == "__main__":
    main()
