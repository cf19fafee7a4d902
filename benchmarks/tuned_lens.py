"""The tuned lens's cost on SmolLM2-135M (issue 61), each measure its contenders in turns:

- `lens fit`'s step against the forward passes that make its hidden states (the same windows, `passes_hidden`);
- `encode --lens tuned:DIR` against `encode`'s logit lens (the same texts, the lens table of every layer), the lens
  fitted here for a few steps (its values do not change the cost).

    python benchmarks/tuned_lens.py [--windows N] [--repeats R]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataset_patch import smollm2_path  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TEXTS = ["Return a new list containing all items from the iterable in ascending order.",
         "The capital of France is Paris, and the capital of Germany is Berlin.",
         "Open the file and return a stream; raise OSError upon failure."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=4, help="windows of 128 tokens per fit step")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch

    import tfcli
    from tfcli.analysis import tuned_lens as tl
    from tfcli.analysis.corpus import Windows
    from tfcli.commands.encode import core as encode
    from tfcli.commands.lens import core

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    texts = [line for line in (Path(__file__).resolve().parent.parent / "docs").joinpath("lens.md").read_text(
        encoding="utf-8").splitlines() if len(line) > 60]
    windows = Windows(iter([texts * 20]), tokenizer, model, 128)
    batch = [windows.next() for _ in range(args.windows)]
    options = core.FitOptions(tokens=10 ** 6, batch=128 * args.windows, context=128)
    state = core.new_state(model)

    def forward():
        for start in range(0, len(batch), options.pass_windows):
            tl.passes_hidden(model, batch[start:start + options.pass_windows])

    def fit_step():
        core.step(model, state, batch, options, lambda done: None)

    times = in_turns({"forward": forward, "fit step": fit_step}, args.repeats, warmups=1)
    print(f"SmolLM2-135M: a step of {args.windows} windows of 128 tokens; torch threads {torch.get_num_threads()}")
    print(f"  forward (hidden states)  {spread(times['forward'], ' s')}")
    print(f"  fit step                 {spread(times['fit step'], ' s')}")
    print(f"  fit / forward: {spread(ratios(times['fit step'], times['forward']), 'x')}")
    with tempfile.TemporaryDirectory() as folder:
        tl.write_lens(Path(folder), state.lens)
        lens = tl.read_lens(Path(folder), model)
    encodings = tokenizer.encode(TEXTS)
    logit = encode.EncodeOptions(top_k=3)
    tuned = encode.EncodeOptions(top_k=3, tuned=lens)

    def encoded(options):
        return lambda: list(encode.run(model, tokenizer, [encodings], options, None, 1024))

    times = in_turns({"logit": encoded(logit), "tuned": encoded(tuned)}, args.repeats * 3)
    print(f"encode of {len(TEXTS)} texts, the lens of every layer (top 3)")
    print(f"  encode, logit lens       {spread(times['logit'], ' s')}")
    print(f"  encode --lens tuned:DIR  {spread(times['tuned'], ' s')}")
    print(f"  tuned / logit: {spread(ratios(times['tuned'], times['logit']), 'x')} (target <= 1.1)")
    print(f"before: {before}")
    print(f"after:  {load_average()}")


if __name__ == "__main__":
    main()
