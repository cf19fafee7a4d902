"""BERT-base forward time: tfcli vs transformers (sdpa), same weights, same process.

    python benchmarks/forward.py [--repeats N] [--threads N]

Prints the median time of each and the ratio tfcli / transformers at batch 1 x 16 tokens and
8 x 128 tokens (targets: <= 0.8 and <= 1.0), then the cost of capturing every hidden state and
attention map (and stage outputs, as `tfcli encode` does) against a plain tfcli forward (target <= 1.3).
The tfcli model is marked for repeated use (oneDNN-packed weights), as a stream of batches runs it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import BertConfig, BertModel

import tfcli
from tfcli.model import Capture
from tfcli.model.linear import pack_for_repeated_use


def median_time(fn, repeats: int) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats} runs")
    with tempfile.TemporaryDirectory() as path:
        torch.manual_seed(0)
        BertModel(BertConfig(), add_pooling_layer=False).save_pretrained(path)
        theirs = BertModel.from_pretrained(path, attn_implementation="sdpa", add_pooling_layer=False).eval()
        ours = tfcli.load_model(path)
    pack_for_repeated_use(ours)
    generator = torch.Generator().manual_seed(0)
    everything = Capture(stages=True)
    for batch, length in ((1, 16), (8, 128)):
        ids = torch.randint(1000, 30000, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        t_theirs = median_time(lambda: theirs(input_ids=ids, attention_mask=mask), args.repeats)
        t_ours = median_time(lambda: ours(ids, attention_mask=mask), args.repeats)
        t_capture = median_time(lambda: ours(ids, attention_mask=mask, capture=everything), args.repeats)
        print(f"{batch} x {length}: transformers {t_theirs * 1e3:.2f} ms, tfcli {t_ours * 1e3:.2f} ms, "
              f"ratio {t_ours / t_theirs:.2f}; capture everything {t_capture * 1e3:.2f} ms, "
              f"{t_capture / t_ours:.2f}x a plain forward")


if __name__ == "__main__":
    main()
