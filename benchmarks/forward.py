"""BERT-base forward passes, a model used again and again: tfcli vs transformers, same weights, float32.

    python benchmarks/forward.py [--repeats N] [--memory-runs N] [--threads N]

Time: one process holds tfcli's model and transformers' BertModel twice (sdpa and eager attention), all
warmed up, and calls them in turns (so that load from other processes hits all alike), `--repeats` rounds
at 1 x 16 and 8 x 128 tokens. tfcli's linear layers pack their weights for oneDNN by themselves from their
second product on, so this is the speed of repeated use (a loop of calls, a sweep, a stream of batches).
Printed: each one's time and the ratio tfcli / transformers, min-max (median) over the rounds (targets:
<= 0.5 at 1 x 16, <= 0.85 at 8 x 128), then the cost of keeping every site (`run_with_cache`: every hidden
state, attention map and stage output) against a plain tfcli forward (target <= 1.3).

Memory: each variant runs in a fresh process (a child of its own: this one's peak does not count) that loads
the model and calls it `--calls` times at 1 x 16 or 8 x 128 tokens; its peak resident set is compared with the
same run of tfcli's model kept plain (every linear layer on PyTorch's plain kernel, `packable` off, as a tied
LM head is), min-max (median) over `--memory-runs` rounds in turns (target: packed / plain <= 1.1);
transformers' (sdpa) for scale.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from measure import compare_processes, load_average, machine, ratios, spread

SHAPES = ((1, 16), (8, 128))


def inputs(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1000, 30000, (batch, length), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


def load(path: str, which: str):
    """The model `which` names (tfcli, tfcli-plain, sdpa, eager), in eval mode, from the checkpoint at `path`."""
    if which in ("sdpa", "eager"):
        from transformers import BertModel

        return BertModel.from_pretrained(path, attn_implementation=which, add_pooling_layer=False).eval()
    import tfcli
    from tfcli.model.linear import Linear

    model = tfcli.load_model(path)
    for module in model.modules():
        if isinstance(module, Linear):
            module.packable = which != "tfcli-plain"
    return model


def call(model, ids: torch.Tensor, mask: torch.Tensor, **options):
    return model(input_ids=ids, attention_mask=mask, **options)


def child(path: str, which: str, shape: str, calls: int) -> None:
    """Load `which` and call it `calls` times at `shape` tokens ("8x128"): a memory run, whose peak RSS the
    parent reads."""
    torch.set_num_threads(int(os.environ.get("FORWARD_THREADS", torch.get_num_threads())))
    model = load(path, which)
    ids, mask = inputs(*map(int, shape.split("x")))
    with torch.no_grad():
        for _ in range(calls):
            call(model, ids, mask)


def timed_in_turns(fns: dict[str, object], repeats: int) -> dict[str, list[float]]:
    """Seconds of `repeats` calls of each function, taking turns, after 3 warm-up calls of each."""
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--memory-runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="forward passes of each memory run")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--child", nargs=3, metavar=("PATH", "WHICH", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args.calls)
    from transformers import BertConfig, BertModel

    from tfcli.model.linear import Linear, PackedWeight

    torch.set_num_threads(args.threads)
    print(machine(in_process=True))
    print(f"torch {torch.__version__}, {args.threads} threads, {args.repeats} rounds in turns, float32; "
          f"{load_average()}")
    with tempfile.TemporaryDirectory() as path:
        torch.manual_seed(0)
        BertModel(BertConfig(), add_pooling_layer=False).save_pretrained(path)
        models = {which: load(path, which) for which in ("tfcli", "sdpa", "eager")}
        ours = models["tfcli"]
        for batch, length in SHAPES:
            ids, mask = inputs(batch, length)
            fns = {which: (lambda model=model: call(model, ids, mask)) for which, model in models.items()}
            fns["capture"] = lambda: ours.run_with_cache(ids, attention_mask=mask)  # every site kept
            seconds = timed_in_turns(fns, args.repeats)
            target = 0.5 if length == 16 else 0.85
            print(f"{batch} x {length}: tfcli {spread(seconds['tfcli'], ' ms', 1e3)}, transformers sdpa "
                  f"{spread(seconds['sdpa'], ' ms', 1e3)}, eager {spread(seconds['eager'], ' ms', 1e3)}")
            for which in ("sdpa", "eager"):
                print(f"  tfcli / transformers {which}: {spread(ratios(seconds['tfcli'], seconds[which]))}"
                      f" (target <= {target})")
            print(f"  every site kept / plain tfcli forward: {spread(ratios(seconds['capture'], seconds['tfcli']))}"
                  f" (target <= 1.3)")
        layers = [module for module in ours.modules() if isinstance(module, Linear)]
        packed = sum(type(layer.weight) is PackedWeight for layer in layers)
        print(f"tfcli's linear layers with packed weights after these calls: {packed} of {len(layers)}")
        print(load_average())
        if not args.memory_runs:
            return
        commands = {(which, f"{b}x{t}"): [sys.executable, __file__, "--child", path, which, f"{b}x{t}",
                                          "--calls", str(args.calls)]
                    for b, t in SHAPES for which in ("tfcli", "tfcli-plain", "sdpa")}
        env = {**os.environ, "FORWARD_THREADS": str(args.threads)}
        runs = compare_processes(commands, args.memory_runs, env)
    print(f"peak memory of a process that loads bert-base and calls it {args.calls} times, {args.memory_runs} runs "
          f"in turns; {load_average()}")
    for b, t in SHAPES:
        peak = {which: [value / 1e9 for value in runs[which, f"{b}x{t}"].peak_bytes] for which, _ in commands}
        print(f"{b} x {t}: tfcli (packed) {spread(peak['tfcli'], ' GB')}, tfcli kept plain "
              f"{spread(peak['tfcli-plain'], ' GB')}, transformers sdpa {spread(peak['sdpa'], ' GB')}")
        print(f"  tfcli packed / kept plain: {spread(ratios(peak['tfcli'], peak['tfcli-plain']))} (target <= 1.1); "
              f"tfcli packed / transformers: {spread(ratios(peak['tfcli'], peak['sdpa']))}")

if __name__ == "__main__":
    main()
