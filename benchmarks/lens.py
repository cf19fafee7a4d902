"""What the logit lens costs during generation: `generate --lens` against plain `generate`, 32 new tokens
(`--steps`), greedy, the bundled gpt2-small (random weights, no end-of-sequence token so that every run makes all 32).

Two measures: the generation itself, in one process (tfcli.model.decoding.stream with and without the
lens, runs in turns; per-run ratios), and the whole command (`python -m tfcli generate -n 32 [--lens]`,
start to exit, which adds the same start-up and load to both). Target (issue 40): <= 1.1x.

Run: python benchmarks/lens.py [--runs N] [--steps N] [--cpu-time]   (a minute or two on a quiet 2-core machine; on a busy
one, OMP_NUM_THREADS=1 ... --cpu-time gives steady figures: two threads wait for each other at every small
operation)
"""

from __future__ import annotations

import argparse
import sys
import time

from measure import compare, load_average, machine, ratios, spread

PROMPT = "time flies like an arrow and"
TARGET = 1.1


def in_process(runs: int, steps: int, clock) -> None:
    import torch

    import tfcli
    from tfcli.model.decoding import stream

    model = tfcli.load_model("gpt2-small")
    model.config.eos_token_id = None
    ids = torch.tensor([tfcli.load_tokenizer("gpt2-small").encode([PROMPT], add_special_tokens=False)[0].ids])

    def generate(lens: bool) -> float:
        start = clock()
        made = list(stream(model, ids, steps, lens=lens))
        assert len(made) == steps and (made[0].lens is not None) == lens
        return clock() - start

    generate(False), generate(True)  # warm up (and pack what is packed)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(runs):
        for lens in (False, True):
            seconds[lens].append(generate(lens))
    per_token = {lens: [s / steps * 1000 for s in values] for lens, values in seconds.items()}
    print(f"generation alone, {steps} steps, {torch.get_num_threads()} threads, "
          f"{'CPU' if clock is time.process_time else 'wall'} time: plain {spread(per_token[False], ' ms')}"
          f" per token, with the lens {spread(per_token[True], ' ms')}; ratio lens / plain "
          f"{spread(ratios(seconds[True], seconds[False]))} (target <= {TARGET})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32, help="new tokens per generation (issue 40 measured 191)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the generation by this process's CPU time: with OMP_NUM_THREADS=1, what other "
                        "processes on a busy machine do not disturb")
    args = parser.parse_args()
    print(machine(in_process=True))
    print(f"{load_average()} before")
    in_process(args.runs, args.steps, time.process_time if args.cpu_time else time.perf_counter)
    command = [sys.executable, "-m", "tfcli", "generate", "-n", str(args.steps), PROMPT]
    print("whole command:", " ".join(command[1:]), "[--lens]")
    # both make the same tokens (the lens only watches), so both do the same work
    compare({"tfcli generate --lens": [*command, "--lens"], "tfcli generate": command}, max(1, args.runs // 2),
            "tfcli generate", target_time=TARGET)


if __name__ == "__main__":
    main()
