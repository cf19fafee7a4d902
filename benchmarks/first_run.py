"""The first thing a user runs: the default `tfcli encode "..."` (bundled bert-base config, random weights)
against the same job written with transformers, whole process (start to exit), time and peak memory.

The transformers job: BertForMaskedLM(BertConfig()) (BERT-base shape, random weights drawn by
transformers), BERT's uncased tokenizer from the same vocab.txt (read by AutoTokenizer, as a downloaded
one is), one forward with attentions and hidden states (eager attention: sdpa returns no weights), and the
logit lens tfcli encode prints (every layer's output through the MLM head, top 3 tokens per position). Both
print their results (stdout goes to /dev/null here).

Targets (issue 12): time <= 0.5x and peak memory <= 0.6x transformers'.

Run: python benchmarks/first_run.py [--runs N]   (about a minute on a quiet 2-core machine)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from measure import compare, machine, save_bert_tokenizer

TEXT = "time flies like an arrow"

TRANSFORMERS_JOB = """
import sys, torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM
tokenizer_dir, text = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
torch.manual_seed(0)
model = BertForMaskedLM(BertConfig(attn_implementation="eager")).eval()
ids = tokenizer(text, return_tensors="pt").input_ids
with torch.no_grad():
    out = model(ids, output_attentions=True, output_hidden_states=True)
    for layer, hidden in enumerate(out.hidden_states[1:]):
        top = model.cls(hidden).softmax(-1).topk(3, dim=-1)
        print(layer, tokenizer.convert_ids_to_tokens(top.indices[0, :, 0].tolist()))
    for layer, weights in enumerate(out.attentions):
        print(layer, weights[0].mean(0).argmax(-1).tolist())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tokenizer_dir = Path(tempfile.mkdtemp())
    save_bert_tokenizer(tokenizer_dir)
    commands = {
        "tfcli": [sys.executable, "-m", "tfcli", "encode", TEXT],
        "transformers":
            [sys.executable, "-c", TRANSFORMERS_JOB, str(tokenizer_dir), TEXT],
    }
    print(machine())
    print("tfcli:", " ".join(commands["tfcli"][1:]))
    compare(commands, args.runs, "transformers", target_time=0.5, target_memory=0.6)
    shutil.rmtree(tokenizer_dir)


if __name__ == "__main__":
    main()
