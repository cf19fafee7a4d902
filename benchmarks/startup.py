"""Start-up time of the CLI against `python -c "import torch"`, whole process, several runs in turns.

Targets: `tfcli --help` and `tfcli tokenize` under a quarter of `import torch` (they import no torch);
`tfcli config bert-base` <= 1.2x (issue 12: it needs no weights, so it imports no torch either).

Run: python benchmarks/startup.py [RUNS]   (under a minute)
"""

import sys

from measure import compare, machine

TFCLI = [sys.executable, "-m", "tfcli"]
COMMANDS = {
    "tfcli --help": [*TFCLI, "--help"],
    "tfcli tokenize TEXT": [*TFCLI, "tokenize", "time flies like an arrow"],
    "tfcli tokenize --json TEXT": [*TFCLI, "tokenize", "--json", "time flies like an arrow"],
    "tfcli config bert-base": [*TFCLI, "config", "bert-base"],
    "import torch": [sys.executable, "-c", "import torch"],
}


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    print(machine())
    compare(COMMANDS, runs, "import torch")


if __name__ == "__main__":
    main()
