"""What `tfcli heads` costs over a corpus: its throughput against transformers' own batched forward pass with
`output_attentions=True` on the same batches, and its peak memory at two corpus sizes.

    python benchmarks/heads.py [--lines N] [--runs N] [--memory-lines SMALL LARGE]

Throughput: the bundled `bert-base` (random weights: the cost does not depend on them) and transformers' BertModel
with the same config (eager attention: the only one that returns the weights), on a synthetic corpus of `--lines`
sentences of 5-40 words; tfcli.commands.heads.core.run with every detector against transformers' forward on exactly the
padded batches tfcli runs (length-sorted, 32 texts), in turns, warmed up. Printed: texts per second of each, min-max
(median) over the runs, and the run-by-run ratio tfcli / transformers (target >= 0.8). Memory: `tfcli heads --file` as a
whole process on the first SMALL and LARGE lines (default 200 and 2,000): peak RSS of each (target: the same).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from measure import load_average, machine, ratios, run_once, spread

WORDS = ("the time flies like an arrow fruit banana cat sat on mat dog ran after ball because it was too tired and "
         "then they walked home together in rain while lights of town came on river bank money water").split()


def corpus(lines: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(lines)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory-lines", type=int, nargs=2, default=(200, 2000))
    args = parser.parse_args()

    import torch
    from transformers import BertConfig, BertModel

    import tfcli
    from tfcli.commands.heads import core as heads
    from tfcli.runner import CHUNK

    model, tokenizer = tfcli.load_model("bert-base"), tfcli.load_tokenizer("bert-base")
    c = model.config
    theirs = BertModel(BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                                  num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                                  intermediate_size=c.intermediate_size,
                                  max_position_embeddings=c.max_position_embeddings,
                                  attn_implementation="eager")).eval()
    texts = corpus(args.lines)
    chunks = [tokenizer.encode(texts[i:i + CHUNK]) for i in range(0, len(texts), CHUNK)]
    batches = []  # the padded batches tfcli runs: each chunk sorted by length, heads.BATCH_SIZE at a time
    for chunk in chunks:
        ordered = sorted(chunk, key=lambda e: len(e.ids))
        for start in range(0, len(ordered), heads.BATCH_SIZE):
            ids, mask, types = tokenizer.pad(ordered[start:start + heads.BATCH_SIZE])
            batches.append((torch.tensor(ids), torch.tensor(mask), torch.tensor(types)))

    def run_tfcli() -> float:
        start = time.perf_counter()
        (result,) = heads.run(model, tokenizer, chunks, heads.HeadsOptions())
        assert result.texts == len(texts)
        return time.perf_counter() - start

    def run_transformers() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            for ids, mask, types in batches:
                theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True)
        return time.perf_counter() - start

    run_tfcli(), run_transformers()  # warm-up (and the packed kernels)
    times: dict[str, list[float]] = {"tfcli heads": [], "transformers": []}
    for _ in range(args.runs):
        times["tfcli heads"].append(run_tfcli())
        times["transformers"].append(run_transformers())
    print(machine(in_process=True))
    print(f"bert-base, {len(texts)} texts, {len(batches)} batches; {load_average()}")
    for name, seconds in times.items():
        print(f"{name}: {spread([len(texts) / s for s in seconds], ' texts/s', 1, 1)}")
    print(f"throughput tfcli / transformers: {spread(ratios(times['transformers'], times['tfcli heads']))} "
          "(target >= 0.8)")

    with tempfile.TemporaryDirectory() as folder:
        peaks = {}
        for lines in args.memory_lines:
            path = Path(folder) / f"corpus{lines}.txt"
            path.write_text("\n".join(corpus(lines)) + "\n", encoding="utf-8")
            _, _, peak = run_once([sys.executable, "-m", "tfcli", "heads", "--file", str(path), "--json"])
            peaks[lines] = peak
            print(f"tfcli heads --file ({lines} lines): peak RSS {peak / 2**20:.0f} MB")
        small, large = args.memory_lines
        print(f"peak RSS {large} / {small} lines: {peaks[large] / peaks[small]:.2f} (target: about 1)")


if __name__ == "__main__":
    main()
