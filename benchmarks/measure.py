"""Shared by the benchmark scripts: time and peak memory of whole processes, taken in turns, and spreads.

Whole-process figures are what a user waits for and what the machine must hold: wall time from spawn to
exit, CPU time, and the peak resident set size (ru_maxrss of that child alone, via os.wait4). Runs of the commands
being compared alternate, so load from other processes hits them alike; every figure is reported as
min-max over the runs (and the median), with the load average when they were taken.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Runs:
    """Wall seconds, CPU seconds (user + system, all threads) and peak resident bytes of each run of one command."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    peak_bytes: list[int] = field(default_factory=list)


# Runs one command and prints its wall seconds, CPU seconds and peak RSS. A launcher of its own, because a child
# forked straight from the benchmark would inherit the benchmark's peak RSS (Linux carries the parent's
# high-water mark through fork and exec), which is large once the benchmark has loaded a model itself.
LAUNCHER = """
import json, os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), time.perf_counter() - start,
                  usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024]))  # Linux: ru_maxrss in kilobytes
"""


def run_once(command: list[str], env: dict[str, str] | None = None, cwd=None) -> tuple[float, float, int]:
    """Run `command` to completion (its output discarded, a failure raises), in folder `cwd` when given; its wall
    seconds, CPU seconds (user + system, all threads) and peak RSS bytes. The folder matters for `python -c`
    commands: Python puts it first on the path, before PYTHONPATH, so a tfcli tree there is the one imported."""
    result = subprocess.run([sys.executable, "-c", LAUNCHER, *command], capture_output=True, text=True, env=env,
                            cwd=cwd)
    if result.returncode != 0 or not result.stdout:
        raise RuntimeError(f"the launcher failed:\n{result.stderr}")
    code, seconds, cpu_seconds, peak = json.loads(result.stdout)
    if code != 0:
        raise RuntimeError(f"{' '.join(command)[:200]} failed ({code}):\n{result.stderr[-3000:]}")
    return seconds, cpu_seconds, peak


def compare_processes(commands: dict[str, list[str]], runs: int, env: dict[str, str] | None = None) -> dict[str, Runs]:
    """Each command once to warm the file cache, then `runs` rounds in which each runs once, in turns."""
    for command in commands.values():
        run_once(command, env)
    results = {name: Runs() for name in commands}
    for _ in range(runs):
        for name, command in commands.items():
            seconds, cpu_seconds, peak = run_once(command, env)
            results[name].seconds.append(seconds)
            results[name].cpu_seconds.append(cpu_seconds)
            results[name].peak_bytes.append(peak)
    return results


def in_turns(contenders: dict[str, Callable[[], object]], repeats: int, warmups: int = 2) -> dict[str, list[float]]:
    """Each function's wall seconds, `repeats` times, the contenders in turns (so that load hits them alike), after
    `warmups` untimed turns (the packed kernels, the allocator)."""
    import time

    for _ in range(warmups):
        for function in contenders.values():
            function()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, function in contenders.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return times


def spread(values: list[float], unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    """'min-max (median m)' of values, scaled."""
    low, high, mid = (v * scale for v in (min(values), max(values), statistics.median(values)))
    return f"{low:.{digits}f}-{high:.{digits}f}{unit} (median {mid:.{digits}f})"


def ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """Run-by-run ratios of two commands timed in turns (the same round's conditions for both)."""
    return [a / b for a, b in zip(ours, theirs)]


def save_bert_tokenizer(directory) -> None:
    """BERT's uncased WordPiece tokenizer as a model folder holds it (vocab.txt, tokenizer_config.json), from
    tfcli's bundled vocabulary: transformers' AutoTokenizer and tfcli both read it."""
    import shutil
    from pathlib import Path

    from tfcli.tokenizer.loading import BUNDLED_VOCAB

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(BUNDLED_VOCAB, directory / "vocab.txt")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                 "do_lower_case": True}))


def trees(directories, command: list[str]) -> dict[str, list[str]]:
    """`command` (a `python -m tfcli ...` line) once per source tree, run in that tree, so that it imports that
    tree's tfcli (e.g. `git archive` of an earlier commit, unpacked): {"tfcli (DIR)": command}."""
    return {f"tfcli ({directory})": ["/usr/bin/env", "-C", str(directory), *command] for directory in directories}


FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")  # the ones that matter


def machine(in_process: bool = False) -> str:
    """One line naming what the figures were measured on: the CPU model, its flags that matter, the core count, the
    torch version and the thread count: torch's own in this process (`in_process`: imports torch), else the
    OMP_NUM_THREADS that the timed processes inherit."""
    import importlib.metadata
    import shutil

    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    if not model:  # e.g. ARM, whose /proc/cpuinfo has no model name
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if shutil.which("lscpu") else ""
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")),
                     "unknown CPU")
    flag_text = ", ".join([flag for flag in FLAGS if flag in flags]
                          + [f"no {name}" for name, flag in (("AVX-512", "avx512f"), ("AMX", "amx_tile"))
                             if flag not in flags])
    if in_process:
        import torch

        count = torch.get_num_threads()
        threads = f"{count} torch thread{'s' if count != 1 else ''}"
    else:
        threads = (f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}" if os.environ.get("OMP_NUM_THREADS")
                   else "torch's default threads")
    return (f"machine: {model} ({flag_text}), {os.cpu_count()} cores; "
            f"torch {importlib.metadata.version('torch')}, {threads}")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f}, {five:.1f}, {fifteen:.1f} on {os.cpu_count()} cores"


def report(results: dict[str, Runs], baseline: str, target_time: float | None = None,
           target_memory: float | None = None) -> None:
    """Print each command's time and peak memory, and its run-by-run ratios to `baseline`."""
    base = results[baseline]
    for name, runs in results.items():
        line = (f"{name}\n    time {spread(runs.seconds, ' s')}, CPU time {spread(runs.cpu_seconds, ' s')}, "
                f"peak memory {spread(runs.peak_bytes, ' GB', 1 / 1e9)}")
        if name != baseline:
            line += (f"\n    ratio to {baseline}: time {spread(ratios(runs.seconds, base.seconds))}"
                     + (f" (target <= {target_time})" if target_time else "")
                     + f", CPU time {spread(ratios(runs.cpu_seconds, base.cpu_seconds))}"
                     + f", memory {spread(ratios(runs.peak_bytes, base.peak_bytes))}"
                     + (f" (target <= {target_memory})" if target_memory else ""))
        print(line)


def compare(commands: dict[str, list[str]], runs: int, baseline: str, target_time: float | None = None,
            target_memory: float | None = None) -> dict[str, Runs]:
    """compare_processes, then report, between the load averages before and after."""
    print(f"{runs} runs each, in turns; {load_average()} before")
    results = compare_processes(commands, runs)
    print(f"{load_average()} after")
    report(results, baseline, target_time, target_memory)
    return results
