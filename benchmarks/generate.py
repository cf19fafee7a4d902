"""Greedy generation speed: tfcli against transformers' `generate`, same weights, same process.

A GPT-2-small-sized model (transformers' GPT2Config defaults: 12 layers, 768 wide, 50257 tokens) with
random weights is saved to a temporary directory and loaded by both. Reported: the median time to
generate 64 new tokens greedily (target: tfcli / transformers <= 0.8), and milliseconds per new token
at 64 and 256 new tokens (with a KV cache it stays flat as the output grows).

Run: python benchmarks/generate.py [--runs N] [--prompt-length T] [--device cpu|cuda] [--uncached]
(about a minute on a quiet 2-core machine; timings are the best of N runs, taken in turns).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def timed(fns: dict[str, object], runs: int) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Best seconds of `runs` calls of each function, the functions taking turns (so that load from
    other processes hits both alike); and each one's last result. The minimum is the least noisy
    estimate on a shared machine."""
    best = {name: float("inf") for name in fns}
    results = {}
    for _ in range(runs):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            results[name] = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--uncached", action="store_true", help="also time tfcli without its KV cache")
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    import tfcli

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
        hf = GPT2LMHeadModel.from_pretrained(directory).to(args.device).eval()
        ours = tfcli.load_model(directory, device=args.device)
    # no end-of-sequence token, so both always make every token asked for
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ours.config.eos_token_id = None
    prompt = torch.randint(0, 50257, (1, args.prompt_length), generator=torch.Generator().manual_seed(1)).to(args.device)
    mask = torch.ones_like(prompt)

    def theirs(n: int):
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=n, do_sample=False, num_beams=1)

    def mine(n: int):
        return ours.generate(prompt, max_new_tokens=n)

    print(f"GPT-2 small ({sum(p.numel() for p in ours.parameters()) / 1e6:.0f}M parameters, random weights), "
          f"prompt {args.prompt_length} tokens, greedy, {args.device}, torch threads: {torch.get_num_threads()}, "
          f"transformers attention: {hf.config._attn_implementation}")
    theirs(4), mine(4)  # warm up
    t64, ids = timed({"tfcli": lambda: mine(64), "transformers": lambda: theirs(64)}, args.runs)
    same = ids["tfcli"].tolist() == ids["transformers"].tolist()
    print(f"64 new tokens: tfcli {t64['tfcli']:.3f} s, transformers {t64['transformers']:.3f} s, "
          f"ratio tfcli / transformers = {t64['tfcli'] / t64['transformers']:.2f} (target <= 0.8); "
          f"same tokens: {same}")
    t256, _ = timed({"tfcli": lambda: mine(256), "transformers": lambda: theirs(256)}, max(1, args.runs - 1))
    for name in ("tfcli", "transformers"):
        short, long = t64[name] / 64 * 1000, t256[name] / 256 * 1000
        print(f"ms per new token, {name + ':':<13} {short:6.1f} at 64, {long:6.1f} at 256 (x{long / short:.2f})")
    print(f"ratio tfcli / transformers at 256 new tokens: {t256['tfcli'] / t256['transformers']:.2f}")
    if not args.uncached:
        return
    uncached, _ = timed({"tfcli": lambda: ours.generate(prompt, max_new_tokens=64, use_cache=False)}, 1)
    print(f"tfcli without the KV cache, 64 new tokens: {uncached['tfcli']:.3f} s "
          f"({uncached['tfcli'] / t64['tfcli']:.1f} x the cached time)")


if __name__ == "__main__":
    main()
