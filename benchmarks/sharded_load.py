"""A 0.31 B-parameter Llama-shaped checkpoint in bfloat16, three safetensors shards: `tfcli encode --dtype
bfloat16` against the same job written with transformers, whole process (start to exit), time and peak memory.

The checkpoint (hidden 1024, 19 layers, 16 heads, intermediate 2816, vocabulary 32000, untied head: 310 M
parameters, 620 MB) is made by transformers itself (random weights, saved in bfloat16 with
max_shard_size so that it lands in three shards), with BERT's uncased WordPiece tokenizer (tfcli's bundled
vocab.txt), which both read: the same tokens. The transformers job: `from_pretrained(dtype=bfloat16)`,
one forward with attentions and hidden states (eager attention: sdpa returns no weights), and the logit
lens that tfcli encode prints (every layer through the final norm and the head, top 3 per position).

Targets (issue 12, tightened by issue 40 and issue 51): time <= 0.6x and peak memory <= 1.0x transformers'.

Run: python benchmarks/sharded_load.py [--runs N] [--dir DIR] [--device cuda] [--tree DIR ...]   (a few minutes on
a 2-core machine; --tree: also tfcli from another source tree, e.g. an earlier commit's; --dir keeps the
checkpoint there and reuses it on the next run)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from measure import compare, machine, save_bert_tokenizer, trees

TEXT = "The quick brown fox jumps over the lazy dog because it was too tired to go around"

TRANSFORMERS_JOB = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, text, device = sys.argv[1], sys.argv[2], sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="eager",
                                             device_map=device).eval()
ids = tokenizer(text, return_tensors="pt").input_ids.to(device)
with torch.no_grad():
    out = model(ids, output_attentions=True, output_hidden_states=True)
    for layer, hidden in enumerate(out.hidden_states[1:]):
        top = model.lm_head(model.model.norm(hidden)).float().softmax(-1).topk(3, dim=-1)
        print(layer, tokenizer.convert_ids_to_tokens(top.indices[0, :, 0].tolist()))
    print([tuple(a.shape) for a in out.attentions][:1], out.logits.shape)
"""


def make_checkpoint(directory: Path) -> None:
    """Save the Llama-shaped model (bfloat16, three shards) and a tokenizer into `directory`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, num_hidden_layers=19, num_attention_heads=16, num_key_value_heads=16,
                         intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=101, eos_token_id=102)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(directory, max_shard_size=f"{int(size / 3 * 1.02 / 1e6)}MB")
    save_bert_tokenizer(directory)
    shards = sorted(p.name for p in directory.glob("*.safetensors"))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    print(f"checkpoint: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters, "
          f"{index['metadata']['total_size'] / 1e6:.0f} MB in bfloat16, {len(shards)} shards ({', '.join(shards)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="keep the checkpoint here (made when missing)")
    parser.add_argument("--device", default="cpu", help="cpu (the issue's targets) or cuda (both load onto the GPU)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="also time tfcli from this source tree (`git archive` of an earlier commit), in turns")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = (args.dir or Path(temporary) / "llama-310m-bf16").resolve()
        if not (directory / "model.safetensors.index.json").is_file():
            make_checkpoint(directory)
        tfcli = [sys.executable, "-m", "tfcli", "encode", "--model", str(directory), "--dtype", "bfloat16",
                 "--device", args.device, TEXT]
        print(machine())
        print("tfcli:", " ".join(tfcli[1:]))
        commands = {"tfcli": tfcli, **trees(args.tree, tfcli),
                    "transformers": [sys.executable, "-c", TRANSFORMERS_JOB, str(directory), TEXT, args.device]}
        compare(commands, args.runs, "transformers", target_time=0.6, target_memory=1.0)


if __name__ == "__main__":
    main()
