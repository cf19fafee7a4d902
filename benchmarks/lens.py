"""What the logit lens costs during generation: `generate --lens` against plain `generate`, 32 new tokens
(`--steps`), greedy, the bundled gpt2-small (random weights, no end-of-sequence token so that every run makes all 32).

Two measures: the generation itself, in one process (tfcli.model.decoding.stream with and without the
lens, runs in turns; per-run ratios), and the whole command (`python -m tfcli generate -n 32 [--lens]`,
start to exit, which adds the same start-up and load to both). Target (issue 40): <= 1.1x.

`--floor` times what the lens adds to a step alone: the head's product of L + 1 rows against the plain step's one row
(both on the packed copy a step uses), the softmax and argmax over L + 1 rows, and the rate of the 13-row product
against this core's rate on a large product (the most its multiply-adds run at): the ratio the lens cannot go under.

Run: python benchmarks/lens.py [--runs N] [--steps N] [--cpu-time] [--floor]   (a minute or two on a quiet 2-core machine; on a busy
one, OMP_NUM_THREADS=1 ... --cpu-time gives steady figures: two threads wait for each other at every small
operation)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from measure import compare, in_turns, load_average, machine, ratios, spread

PROMPT = "time flies like an arrow and"
TARGET = 1.1
CALLS = 30  # per timing of the lens's own work


def in_process(runs: int, steps: int, clock) -> float:
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
    return statistics.median(per_token[False])


def floor(plain_ms: float, repeats: int) -> None:
    """What the lens adds to a step of `plain_ms`, alone: the extra rows of the head's product and their softmax."""
    import torch

    import tfcli
    from tfcli.model.linear import pack

    head = tfcli.load_model("gpt2-small").lm_head.unembed.weight.detach()  # (V, hidden), tied to the embeddings
    states = len(tfcli.load_model("gpt2-small").output_stack.blocks) + 1
    packed = pack(head, states)  # the copy decoding with the lens packs (and the plain step's: 16 rows and fewer alike)
    rows = {n: torch.randn(n, head.shape[1]) for n in (1, states, 256)}
    scores = torch.randn(states, head.shape[0])
    times = in_turns({n: lambda x=x: [torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                                       for _ in range(CALLS)] for n, x in rows.items()}
                     | {"softmax": lambda: [scores.softmax(-1).max(-1) for _ in range(CALLS)],
                        "one softmax": lambda: [scores[-1:].softmax(-1).max(-1) for _ in range(CALLS)]},
                     max(repeats, 5))
    ms = {name: min(values) * 1000 / CALLS for name, values in times.items()}  # per call, best timing

    def rate(n: int) -> float:  # GFLOP/s of an n-row product
        return 2 * n * head.numel() / ms[n] / 1e6

    added = ms[states] - ms[1] + ms["softmax"] - ms["one softmax"]
    print(f"the lens's own work, {torch.get_num_threads()} threads, best of {max(repeats, 5)} timings of {CALLS} "
          f"calls: the head's product "
          f"{ms[states]:.2f} ms for {states} rows ({rate(states):.0f} GFLOP/s) against {ms[1]:.2f} ms for one "
          f"({head.numel() * 4 / ms[1] / 1e6:.0f} GB/s of weights read); "
          f"256 rows {rate(256):.0f} GFLOP/s (these cores' rate); softmax and argmax over {states} rows "
          f"{ms['softmax']:.2f} ms against {ms['one softmax']:.2f} ms for one; added {added:.2f} ms to a "
          f"{plain_ms:.2f} ms step: floor {1 + added / plain_ms:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32, help="new tokens per generation (issue 40 measured 191)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the generation by this process's CPU time: with OMP_NUM_THREADS=1, what other "
                        "processes on a busy machine do not disturb")
    parser.add_argument("--floor", action="store_true", help="also time what the lens adds to a step, alone")
    args = parser.parse_args()
    print(machine(in_process=True))
    print(f"{load_average()} before")
    plain_ms = in_process(args.runs, args.steps, time.process_time if args.cpu_time else time.perf_counter)
    if args.floor:
        floor(plain_ms, args.runs)
    command = [sys.executable, "-m", "tfcli", "generate", "-n", str(args.steps), PROMPT]
    print("whole command:", " ".join(command[1:]), "[--lens]")
    # both make the same tokens (the lens only watches), so both do the same work
    compare({"tfcli generate --lens": [*command, "--lens"], "tfcli generate": command}, max(1, args.runs // 2),
            "tfcli generate", target_time=TARGET)


if __name__ == "__main__":
    main()
