"""Whether a change made the analyses or the plain pass slower: the same measurements on two checkouts of tfcli,
each in its own process, in turns.

    python benchmarks/before_after.py OLD_CHECKOUT [--rounds N]

OLD_CHECKOUT is a directory holding another tfcli tree (for example `git worktree add /tmp/old 6ff61f6`); the
current tree is this script's. Each round runs the measurements once with OLD_CHECKOUT first on PYTHONPATH (its
`tfcli` is imported) and once with this tree's, one after the other, so that load from other processes hits both
alike. Measured, with the public Python API both trees have:
- `attribute --by head` on the bundled gpt2-small and the 45-token text of benchmarks/attribute.py (median of 10);
- `patch`'s fast sweep, resid + attn + mlp and heads, on the SmolLM2-135M-shaped random Llama of
  benchmarks/patch.py and its indirect-object pair (median of 3 each);
- `patch --dataset --sites heads` and `attribute --dataset --by head` through the command line, on 8 copies of
  that pair (median of 3, the model built and the bootstrap included);
- `heads` over 300 synthetic lines of benchmarks/heads.py on the bundled bert-base (texts per second, median of 3);
- the plain pass: `generate` 64 tokens on gpt2-small (median of 5) and a bert-base forward of 8 x 128 tokens
  (median of 10).
Printed: each figure's min-max (median) over the rounds for each tree, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from measure import load_average, machine, spread

HERE = os.path.dirname(os.path.abspath(__file__))

MEASURE = r"""
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])  # this script's folder: the other benchmarks' texts and builders
import torch
import tfcli
try:  # a command's core, in either layout (tfcli/commands/<name>/core.py since 5b99a16; tfcli/<name>.py before)
    from tfcli.commands.attribute import core as attribute
    from tfcli.commands.heads import core as heads
    from tfcli.commands.patch import core as patch
except ImportError:
    from tfcli import attribute, heads, patch
from attribute import TEXT
from heads import corpus
from patch import CLEAN, CORRUPT, build


def median_of(runs, fn):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


out = {}
model, tokenizer = tfcli.load_model("gpt2-small"), tfcli.load_tokenizer("gpt2-small")
encodings, options = tokenizer.encode([TEXT]), attribute.AttributeOptions(by="head")
run = lambda: list(attribute.run(model, tokenizer, [encodings], options))
run(), run()
out["attribute --by head (ms)"] = median_of(10, run) * 1e3
ids = torch.randint(0, 30000, (1, 8), generator=torch.Generator().manual_seed(0))
model.generate(ids, max_new_tokens=8)
out["generate 64 tokens (s)"] = median_of(5, lambda: model.generate(ids, max_new_tokens=64))

path = sys.argv[2]
if not os.path.exists(os.path.join(path, "config.json")):
    build("smollm2", None, path)
model, tokenizer = tfcli.load_model(path), tfcli.load_tokenizer(path)
clean, corrupt = patch.pair_inputs(model.config, tokenizer, CLEAN, CORRUPT)
target, foil = tokenizer.token_to_id("mary"), tokenizer.token_to_id("john")
sweep = lambda kinds: patch.run_ids(model, tokenizer, clean, corrupt,
                                    patch.PatchOptions(target=f"#{target}", foil=f"#{foil}", sites=kinds))
sweep(("heads",))
for kinds in (("resid", "attn", "mlp"), ("heads",)):
    out[f"patch {'+'.join(kinds)} (s)"] = median_of(3, lambda: sweep(kinds))
# the dataset commands whole, through the command line (what both trees have): 8 pairs, heads; the same lines
# attributed by head; model built and bootstrap included
from typer.testing import CliRunner
from tfcli.cli import app
lines = os.path.join(path, "pairs.jsonl")
with open(lines, "w") as file:
    file.write((json.dumps({"clean": CLEAN, "corrupt": CORRUPT, "target": "mary", "foil": "john"}) + "\n") * 8)
for command, extra in (("patch", ["--sites", "heads"]), ("attribute", ["--by", "head"])):
    invoke = lambda: CliRunner().invoke(app, [command, "-m", path, "--dataset", lines, "--json", *extra])
    assert invoke().exit_code == 0
    out[f"{command} --dataset, 8 pairs, whole command (s)"] = median_of(3, invoke)

model, tokenizer = tfcli.load_model("bert-base"), tfcli.load_tokenizer("bert-base")
texts = corpus(300)
chunks = [tokenizer.encode(texts[i:i + 256]) for i in range(0, len(texts), 256)]  # as the runner streams them
list(heads.run(model, tokenizer, chunks[:1], heads.HeadsOptions()))
out["heads, 300 texts (texts/s)"] = 300 / median_of(3, lambda: list(heads.run(model, tokenizer, chunks,
                                                                               heads.HeadsOptions())))
batch = torch.randint(0, 30000, (8, 128), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    for _ in range(3):
        model(batch)
    out["bert-base forward 8 x 128 (ms)"] = median_of(10, lambda: model(batch)) * 1e3
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="a directory holding another tfcli tree")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(args.old, "tfcli")):
        sys.exit(f"error: {args.old} holds no tfcli/ folder")
    trees = {"old": os.path.abspath(args.old), "new": os.path.dirname(HERE)}
    print(machine())
    before = load_average()
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as model_path:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                env = dict(os.environ, PYTHONPATH=tree)
                result = subprocess.run([sys.executable, "-c", MEASURE, HERE, model_path], env=env, cwd=tree,
                                        capture_output=True, text=True, check=True)
                for key, value in json.loads(result.stdout.splitlines()[-1]).items():
                    figures[name].setdefault(key, []).append(value)
    for key in figures["new"]:
        print(f"{key}: old {spread(figures['old'][key])}, new {spread(figures['new'][key])}")
    print(f"before: {before}; after: {load_average()}")


if __name__ == "__main__":
    main()
