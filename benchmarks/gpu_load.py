"""Loading onto a CUDA GPU, in one process, tfcli and transformers in turns: the 0.31 B-parameter bfloat16 sharded
Llama-shaped checkpoint of sharded_load.py, loaded with `--device cuda --dtype bfloat16`, then one forward pass
with attention weights and hidden states and the logit lens (top 3 per position of every layer), as `tfcli encode`
runs it. Per run: load seconds, the GPU's peak allocated memory during the load and during the forward pass, and
how much the process's anonymous (non-file) CPU memory grew during the load: loading straight onto the GPU means
no CPU copy of the weights (the safetensors shards are memory-mapped, their pages belong to the page cache).

Run: python benchmarks/gpu_load.py [--runs N] [--dir DIR]   (needs a CUDA GPU; under a minute on an H100)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402
from sharded_load import TEXT, make_checkpoint  # noqa: E402


def anonymous_rss() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("RssAnon")).split()[1]) * 1024


class CpuPeak:
    """The peak growth of anonymous resident memory while the block runs, sampled every 2 ms."""

    def __enter__(self):
        self.start, self.peak, self.running = anonymous_rss(), anonymous_rss(), True
        self.thread = threading.Thread(target=self.sample)
        self.thread.start()
        return self

    def sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, anonymous_rss())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.growth = self.peak - self.start


def tfcli_job(directory: Path, ids: torch.Tensor):
    import tfcli
    from tfcli.model import Capture

    model = tfcli.load_model(str(directory), device="cuda", dtype="bfloat16")
    torch.cuda.synchronize()
    yield model
    with torch.no_grad():
        out = model(ids, capture=Capture())
        model.unembed(torch.stack(out.hidden_states[1:-1])[:, 0]).float().softmax(-1).topk(3, dim=-1)


def transformers_job(directory: Path, ids: torch.Tensor):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16, attn_implementation="eager",
                                                 device_map="cuda").eval()
    torch.cuda.synchronize()
    yield model
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
        for hidden in out.hidden_states[1:]:
            model.lm_head(model.model.norm(hidden)).float().softmax(-1).topk(3, dim=-1)


def measure(job, directory: Path, ids: torch.Tensor) -> dict[str, float]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with CpuPeak() as cpu:
        start = time.perf_counter()
        steps = job(directory, ids)
        model = next(steps)
        load = time.perf_counter() - start
    load_peak = torch.cuda.max_memory_allocated() - base
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    start = time.perf_counter()
    next(steps, None)
    torch.cuda.synchronize()
    forward = time.perf_counter() - start
    figures = dict(load_s=load, forward_s=forward, load_gpu_peak_gb=load_peak / 1e9,
                   run_gpu_peak_gb=(torch.cuda.max_memory_allocated() - base) / 1e9, weights_gb=weights / 1e9,
                   cpu_growth_gb=cpu.growth / 1e9)
    del model, steps
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="keep the checkpoint here (made when missing)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as temporary:
        directory = args.dir or Path(temporary) / "llama-310m-bf16"
        if not (directory / "model.safetensors.index.json").is_file():
            make_checkpoint(directory)
        ids = AutoTokenizer.from_pretrained(directory)(TEXT, return_tensors="pt").input_ids.to("cuda")
        torch.zeros(1, device="cuda")  # the CUDA context is no one's load
        jobs = {"tfcli": tfcli_job, "transformers": transformers_job}
        for job in jobs.values():  # warm the file cache and the kernels
            measure(job, directory, ids)
        results = {name: [] for name in jobs}
        for _ in range(args.runs):
            for name, job in jobs.items():
                results[name].append(measure(job, directory, ids))
    print(machine(in_process=True))
    print(f"{torch.cuda.get_device_name()}, {args.runs} runs each in turns, after one warm-up each")
    for name, runs in results.items():
        print(name)
        for key in runs[0]:
            values = [run[key] for run in runs]
            print(f"    {key:18} {min(values):.3f}-{max(values):.3f} (median {statistics.median(values):.3f})")
    for key in ("load_s", "forward_s", "load_gpu_peak_gb", "run_gpu_peak_gb"):
        ratio = [a[key] / b[key] for a, b in zip(results["tfcli"], results["transformers"])]
        print(f"ratio tfcli / transformers, {key}: {min(ratio):.2f}-{max(ratio):.2f}")


if __name__ == "__main__":
    main()
