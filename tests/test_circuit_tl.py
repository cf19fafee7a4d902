"""`tfcli circuit` against TransformerLens 4.3's own edge attribution patching and `faithfulness()`
(transformer_lens.tools.analysis.attribution_patching) on a tiny random GPT-2 that transformers saves here, booted
offline by TransformerLens's TransformerBridge from the transformers model object.

TransformerLens 4.3 cannot share the venv with sae-lens (which pins TransformerLens 3.9), so it is installed apart,
`pip install --no-deps --target .references/tl4 transformer-lens==4.3.0` (the README's test command does it), and
run in a subprocess with it first on the path, against this venv's torch and transformers; without it the test skips.

What is compared, and how the two define their quantities (docs/commands.md#circuit says the same):
- TransformerLens's edges are per position (a writer at position t into a reader at t); tfcli's sum them over the
  positions. Its nodes map onto tfcli's: embed -> input, attn_head_out L,h -> L{l}H{h}, mlp_out -> L{l}.mlp; readers
  q_input/k_input/v_input -> L{l}H{h}.q/.k/.v, mlp_in -> L{l}.mlp, logits -> logits.
- Its attribution_patch is the denoising form, (a_clean - a_corrupt) . the gradient on the corrupt run; tfcli's (the
  EAP-IG reference's) the noising form, (a_corrupt - a_clean) . the gradient on the clean run. So tfcli's score for
  the pair CLEAN, CORRUPT is TransformerLens's for the pair given the other way round (clean=CORRUPT,
  corrupt=CLEAN): that is what is compared, edge by edge, to 1e-5 of the largest score.
- Its faithfulness() keeps the circuit on the clean run and replaces every other edge's writer by its corrupt
  contribution, (m - m(corrupt)) / (m(clean) - m(corrupt)) for one pair: tfcli's over several pairs is the ratio of
  the sums, made here from TransformerLens's per-pair numbers. The same definition: compared to 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tfcli

TL4 = Path(__file__).resolve().parents[1] / ".references" / "tl4"
VOCAB = 30522  # the bundled BERT vocabulary: the command reads texts
PAIRS = [("when mary and john went to the store john gave a drink to",
          "when john and mary went to the store mary gave a drink to", "mary", "john"),
         ("then anna and tom went to the park tom gave a ball to",
          "then tom and anna went to the park anna gave a ball to", "anna", "tom"),
         ("after paul and kate went to the shop paul gave a book to",
          "after kate and paul went to the shop kate gave a book to", "kate", "paul")]

SCRIPT = r'''
import json, sys
import torch, transformers
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import (EdgeAttributionConfig, Node, attribution_patch,
                                                                  faithfulness)

job = json.load(sys.stdin)
hf = transformers.GPT2LMHeadModel.from_pretrained(job["path"], attn_implementation="eager").eval()
tokenizer = transformers.BertTokenizerFast(vocab_file=job["vocab"])
bridge = TransformerBridge.boot_transformers(job["path"], hf_model=hf, tokenizer=tokenizer, device="cpu")
bridge.eval()

def name(node):
    if node.kind in ("embed",):
        return "input"
    if node.kind == "attn_head_out":
        return f"L{node.layer}H{node.head}"
    if node.kind in ("mlp_out", "mlp_in"):
        return f"L{node.layer}.mlp"
    if node.kind == "logits":
        return "logits"
    return f"L{node.layer}H{node.head}.{node.kind[0]}"

out = []
for pair in job["pairs"]:
    clean, corrupt = torch.tensor([pair["clean"]]), torch.tensor([pair["corrupt"]])
    at, target, foil = pair["end"], pair["target"], pair["foil"]
    metric = lambda logits: logits[0, at, target] - logits[0, at, foil]
    swapped = attribution_patch(bridge, corrupt, clean, metric, EdgeAttributionConfig(granularity="edge"))
    scores = {}
    for (writer, reader), score in swapped.edge_scores.items():
        key = f"{name(writer)}->{name(reader)}"
        scores[key] = scores.get(key, 0.0) + score
    wanted = set(job["circuit"])
    kept = [edge for edge in swapped.edge_scores if f"{name(edge[0])}->{name(edge[1])}" in wanted]
    result = faithfulness(bridge, clean, corrupt, metric, kept)
    out.append({"scores": scores, "recovered": result.recovered, "clean": result.full_metric,
                "corrupt": result.corrupt_metric, "kept": len(kept), "total": result.total_edges})
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    import transformers

    config = transformers.AutoConfig.for_model("gpt2", vocab_size=VOCAB, bos_token_id=101, eos_token_id=102,
                                               pad_token_id=0, initializer_range=0.3, n_embd=32, n_layer=2, n_head=4,
                                               n_positions=64)
    path = tmp_path_factory.mktemp("gpt2-tl")
    save_hf_model(transformers.GPT2LMHeadModel, config, path, perturb=True)
    return path


@pytest.mark.skipif(not TL4.is_dir(), reason=f"TransformerLens 4.3 is not installed apart in {TL4} (the README's "
                    "test command: pip install --no-deps --target .references/tl4 transformer-lens==4.3.0)")
def test_scores_and_faithfulness_are_transformerlens_4_3s(cli, gpt2, tmp_path):
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.metric import parse_metric
    from tfcli.analysis.pairs import PAIR_LINE, check_pair

    lines = [{"clean": c, "corrupt": k, "target": t, "foil": f} for c, k, t, f in PAIRS]
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = cli("circuit", "-m", str(gpt2), "--dataset", str(dataset), "--method", "eap", "--top", "30", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    circuit = [f"{e['sender']}->{e['receiver']}" for e in record["edges"] if e["in_circuit"]]
    assert len(circuit) == 30

    model, tokenizer = tfcli.load_model(str(gpt2)), tfcli.load_tokenizer(str(gpt2))
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(lines, PAIR_LINE)]
    assert len({len(p.ids_clean) for p in pairs}) == 1  # one length: no pads on either side
    job = {"path": str(gpt2), "vocab": str(Path(tfcli.__file__).parent / "data" / "vocab.txt"), "circuit": circuit,
           "pairs": [{"clean": p.ids_clean, "corrupt": p.ids_corrupt, "end": p.end, "target": target.id,
                      "foil": foil.id} for p, (target, foil) in
                     zip(pairs, [parse_metric(model.config, tokenizer, p.target, p.foil, None, prefix="")
                                 for p in pairs])]}
    env = {**os.environ, "PYTHONPATH": str(TL4), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(job), capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])

    # every edge's score: theirs per position, summed, averaged over the pairs (given the other way round)
    ours = {f"{e['sender']}->{e['receiver']}": e["score"] for e in record["edges"]}
    assert set(theirs[0]["scores"]) == set(ours) and len(ours) == 110
    mean = {key: sum(pair["scores"][key] for pair in theirs) / len(theirs) for key in ours}
    scale = max(abs(value) for value in mean.values())
    assert scale > 1e-3
    worst = max(abs(ours[key] - mean[key]) for key in ours)
    assert worst <= 1e-5 * scale, f"largest difference {worst:.3g} of a largest score {scale:.3g}"
    assert sum(abs(value) > 1e-3 * scale for value in mean.values()) > 90  # nearly every edge carries something

    # the circuit's faithfulness: the ratio of the sums of theirs per pair
    assert all(pair["kept"] == 30 * len(pairs[0].ids_clean) for pair in theirs)
    gaps = [pair["clean"] - pair["corrupt"] for pair in theirs]
    recovered = sum(pair["recovered"] * gap for pair, gap in zip(theirs, gaps)) / sum(gaps)
    assert record["circuit"]["faithfulness"] == pytest.approx(recovered, abs=1e-5)
    assert 0.05 < abs(recovered) and abs(recovered - 1) > 0.05  # neither the empty graph's nor the full one's
    assert record["clean_value"] == pytest.approx(sum(p["clean"] for p in theirs) / 3, abs=1e-4)
    assert record["corrupt_value"] == pytest.approx(sum(p["corrupt"] for p in theirs) / 3, abs=1e-4)
