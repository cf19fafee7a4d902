"""Float32 products of one row (a decoding step's) and of a few rows: PyTorch's plain product (MKL) against oneDNN's
on a weight packed once, the two kernels tfcli's linear layers choose between (tfcli/model/linear.py). On a CPU that is
not Intel's, MKL takes its generic code path (`MKL_VERBOSE=1` says which), and the packed product wins from about a
million weights up; on Intel CPUs single rows were no faster packed.

Run: python benchmarks/single_rows.py [--repeats N]   (about a minute; GPT-2's and SmolLM2's weight shapes)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402

SHAPES = [(50257, 768), (3072, 768), (2304, 768), (768, 3072), (768, 768), (49152, 576), (1536, 576), (576, 1536),
          (576, 576), (192, 576)]


def best_ms(fn, calls: int, repeats: int) -> float:
    """The best of `repeats` averages of `calls` calls, in milliseconds."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 13])
    args = parser.parse_args()
    print(machine())
    print(f"load average {os.getloadavg()[0]:.1f}; ms per product, best of {args.repeats}")
    torch.manual_seed(0)
    with torch.no_grad():
        for out_features, in_features in SHAPES:
            weight = torch.randn(out_features, in_features)
            calls = max(5, int(2e8 // weight.numel()) // 10)
            cells = []
            for rows in args.rows:
                x = torch.randn(rows, in_features)
                packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
                plain = best_ms(lambda: F.linear(x, weight), calls, args.repeats)
                fast = best_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), calls,
                               args.repeats)
                cells.append(f"{rows} row(s): plain {plain:.3f}, packed {fast:.3f} ({fast / plain:.2f})")
            print(f"{out_features:>6} x {in_features:<5} ({weight.numel() / 2**20:5.2f} x 2^20)  " + "; ".join(cells))


if __name__ == "__main__":
    main()
