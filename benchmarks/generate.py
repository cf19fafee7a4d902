"""Greedy generation speed: tfcli against transformers' `generate`, same weights, same process.

A GPT-2-small-sized model (transformers' GPT2Config defaults: 12 layers, 768 wide, 50257 tokens) with
random weights is saved to a temporary directory (in --dtype) and loaded by both in --dtype. Reported: the
time to generate 64 new tokens greedily, best and worst of the runs, and their ratio (targets: float32 <= 0.8,
bfloat16 <= 0.6), whether both made the same tokens, and, in float16 or bfloat16, how far apart their logits
are on that sequence (in steps of the dtype's rounding at the logits' scale) and how far each is from the
float32 logits of the same weights; then milliseconds per new token at 64 and 256 new tokens (with a KV
cache it stays flat as the output grows).

Run: python benchmarks/generate.py [--dtype float32|bfloat16] [--runs N] [--prompt-length T] [--device cpu|cuda]
[--uncached] [--cpu-time] [--floor] [--tiny]   (about a minute on a quiet 2-core machine; the runs take turns). On a
busy machine, two threads wait for each other at every small operation; OMP_NUM_THREADS=1 ... --cpu-time gives
steady figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402


def timed(fns: dict[str, object], runs: int, clock=time.perf_counter) -> tuple[dict[str, list[float]],
                                                                              dict[str, torch.Tensor]]:
    """Seconds of each of `runs` calls of each function by `clock`, the functions taking turns (so that load
    from other processes hits both alike); and each one's last result."""
    seconds: dict[str, list[float]] = {name: [] for name in fns}
    results = {}
    for _ in range(runs):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = clock()
            results[name] = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            seconds[name].append(clock() - start)
    return seconds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--uncached", action="store_true", help="also time tfcli without its KV cache")
    parser.add_argument("--floor", action="store_true",
                        help="also time only the weight products of 64 steps (every linear layer and the head on one "
                        "row, as tfcli's decoding makes them): what no decoding loop with these kernels can go under; "
                        "and those products with the step's other operations in one flat loop, unfused and (bfloat16) "
                        "with oneDNN's fused post-ops (GPT-2 only)")
    parser.add_argument("--tiny", action="store_true",
                        help="GPT-2 small's 12 layers and 12 heads, but 96 wide with 1000 tokens: the products are "
                        "cheap, so what is timed is mostly the rest of the step, steady even on a busy machine")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by this process's CPU time: with OMP_NUM_THREADS=1, what other processes on a "
                        "busy machine do not disturb")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter

    from transformers import GPT2Config, GPT2LMHeadModel

    import tfcli

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        config = GPT2Config(n_embd=96, vocab_size=1000, bos_token_id=0, eos_token_id=0) if args.tiny else GPT2Config()
        GPT2LMHeadModel(config).to(dtype).save_pretrained(directory)
        hf = GPT2LMHeadModel.from_pretrained(directory, dtype=dtype).to(args.device).eval()
        ours = tfcli.load_model(directory, device=args.device, dtype=args.dtype)
    # no end-of-sequence token, so both always make every token asked for
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ours.config.eos_token_id = None
    prompt = torch.randint(0, hf.config.vocab_size, (1, args.prompt_length),
                           generator=torch.Generator().manual_seed(1)).to(args.device)
    mask = torch.ones_like(prompt)

    def theirs(n: int):
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=mask, max_new_tokens=n, do_sample=False, num_beams=1)

    def mine(n: int):
        return ours.generate(prompt, max_new_tokens=n)

    target = {"float32": 0.8, "bfloat16": 0.6}.get(args.dtype)
    print(machine(in_process=True))
    print(f"GPT-2 {'small, tiny widths' if args.tiny else 'small'} "
          f"({sum(p.numel() for p in ours.parameters()) / 1e6:.0f}M parameters, random weights), "
          f"{args.dtype}, prompt {args.prompt_length} tokens, greedy, {args.device}, torch threads: "
          f"{torch.get_num_threads()}, transformers attention: {hf.config._attn_implementation}, "
          f"{'CPU' if args.cpu_time else 'wall'} time, load average {os.getloadavg()[0]:.1f}")
    theirs(4), mine(4)  # warm up
    t64, ids = timed({"tfcli": lambda: mine(64), "transformers": lambda: theirs(64)}, args.runs, clock)
    ratios = [a / b for a, b in zip(t64["tfcli"], t64["transformers"])]
    same = ids["tfcli"].tolist() == ids["transformers"].tolist()
    print(f"64 new tokens: tfcli {min(t64['tfcli']):.3f}-{max(t64['tfcli']):.3f} s, transformers "
          f"{min(t64['transformers']):.3f}-{max(t64['transformers']):.3f} s, ratio tfcli / transformers "
          f"{min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f}; target <= {target}); "
          f"same tokens: {same}")
    if dtype != torch.float32:
        sequence = ids["tfcli"]
        exact = GPT2LMHeadModel(hf.config).to(args.device).eval()  # the same (rounded) weights in float32
        exact.load_state_dict({name: value.float() for name, value in hf.state_dict().items()})
        with torch.no_grad():
            our_logits, their_logits = ours(sequence).logits.float(), hf(sequence).logits.float()
            exact_logits = exact(sequence).logits
        step = torch.finfo(dtype).eps * float(exact_logits.abs().max())
        print(f"logits on that sequence (max abs diff, in {args.dtype} steps at their scale): tfcli vs transformers "
              f"{float((our_logits - their_logits).abs().max()) / step:.2f}; vs float32: tfcli "
              f"{float((our_logits - exact_logits).abs().max()) / step:.2f}, transformers "
              f"{float((their_logits - exact_logits).abs().max()) / step:.2f}")
    t256, _ = timed({"tfcli": lambda: mine(256), "transformers": lambda: theirs(256)}, max(1, args.runs - 1), clock)
    for name in ("tfcli", "transformers"):
        short, long = min(t64[name]) / 64 * 1000, min(t256[name]) / 256 * 1000
        print(f"ms per new token (best run), {name + ':':<13} {short:6.1f} at 64, {long:6.1f} at 256 "
              f"(x{long / short:.2f})")
    print(f"ratio tfcli / transformers at 256 new tokens (best runs): "
          f"{min(t256['tfcli']) / min(t256['transformers']):.2f}")
    if args.floor:
        floor(ours, prompt, ids["tfcli"], t64, clock, max(1, args.runs - 1))
    if not args.uncached:
        return
    uncached, _ = timed({"tfcli": lambda: ours.generate(prompt, max_new_tokens=64, use_cache=False)}, 1, clock)
    print(f"tfcli without the KV cache, 64 new tokens: {uncached['tfcli'][0]:.3f} s "
          f"({uncached['tfcli'][0] / min(t64['tfcli']):.1f} x the cached time)")


def floor(model, prompt: torch.Tensor, ids: torch.Tensor, t64: dict[str, list[float]], clock, runs: int) -> None:
    """Time the weight products alone: one single-row product per linear layer (the head included) per step,
    64 steps, with the kernels tfcli's decoding uses (packed where they are packed). Then the same products with
    every other operation of a GPT-2 decoding step (embeddings, norms, attention over a preallocated cache, GELU,
    residual adds, the greedy choice) in one flat loop, no modules between them: what is left of a step once
    tfcli's structure (modules, options, bookkeeping) is gone, the floor for these kernels unfused. Where the
    products are oneDNN-packed (bfloat16), also that loop with oneDNN's fused post-ops: GELU inside the first MLP
    product, the residual adds inside the output products, the greedy choice on the bfloat16 logits."""
    import torch.nn.functional as F

    from tfcli.model.attention import KVCache
    from tfcli.model.linear import Linear

    layers = [module for module in model.modules() if isinstance(module, Linear)]
    parameter = next(model.parameters())
    rows = {layer.in_features: torch.ones(1, 1, layer.in_features, dtype=parameter.dtype, device=parameter.device)
            for layer in layers}

    def products() -> None:
        with torch.inference_mode():
            for _ in range(64):
                for layer in layers:
                    layer(rows[layer.in_features])

    stack, heads, length = model.decoder, model.config.num_attention_heads, prompt.shape[1]

    def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)

    linear = torch.ops.mkldnn._linear_pointwise

    def flat(fused: bool = False) -> torch.Tensor:
        with torch.inference_mode():
            cache = KVCache(length + 64)
            tokens = [model(prompt, cache=cache, logits_to_keep=1).logits[:, -1].float().argmax(-1, keepdim=True)]
            for position in range(length, length + 63):
                x = model.embed_tokens(tokens[-1]) + stack.embeddings.positions(torch.tensor([[position]]))
                for i, block in enumerate(stack.blocks):
                    attention, feed_forward = block.attn, block.mlp
                    qkv = attention.qkv(layer_norm(x, block.attn_norm))
                    q, k, v = qkv.view(1, 1, 3 * heads, -1).transpose(1, 2).split(heads, dim=1)
                    cache.keys[i][:, :, position:position + 1].copy_(k)
                    cache.values[i][:, :, position:position + 1].copy_(v)
                    out = F.scaled_dot_product_attention(q, cache.keys[i][:, :, :position + 1],
                                                         cache.values[i][:, :, :position + 1])
                    out = out.transpose(1, 2).reshape(1, 1, -1)
                    fc1, fc2 = feed_forward.fc1, feed_forward.fc2
                    if fused:
                        x = linear.binary(out, x, attention.out._packed, attention.out.bias, "add")
                        h = linear(layer_norm(x, block.mlp_norm), fc1._packed, fc1.bias, "gelu", [], "tanh")
                        x = linear.binary(h, x, fc2._packed, fc2.bias, "add")
                    else:
                        x = x + attention.out(out)
                        x = x + fc2(F.gelu(fc1(layer_norm(x, block.mlp_norm)), approximate="tanh"))
                logits = model.head.unembed(layer_norm(x, stack.final_norm))
                tokens.append((logits[:, -1] if fused else logits[:, -1].float()).argmax(-1, keepdim=True))
            return torch.cat(tokens, dim=1)

    products()  # packs what is packed
    loops = {"products": products, "flat": flat}
    if all(layer._packed is not None for layer in layers):
        loops["fused"] = lambda: flat(fused=True)
    seconds, results = timed(loops, runs, clock)
    for name, what in (("products", f"weight products alone ({len(layers)} linear layers, head included)"),
                       ("flat", "a flat GPT-2 decoding loop with the same kernels"),
                       ("fused", "that loop with oneDNN's fused post-ops (GELU, residual adds)"))[:len(loops)]:
        best = min(seconds[name])
        print(f"{what}, 64 steps: {best:.3f} s (best run), {best / min(t64['tfcli']):.2f} of tfcli's generation, "
              f"{best / min(t64['transformers']):.2f} of transformers' (a floor for the ratio)")
    tiny = Linear(64, 64, dtype=parameter.dtype, device=parameter.device)
    tiny_row = torch.ones(1, 1, 64, dtype=parameter.dtype, device=parameter.device)
    with torch.inference_mode():
        tiny(tiny_row), tiny(tiny_row)  # packs on its second product, where it can
        call = min(timed({"tiny": lambda: [tiny(tiny_row) for _ in range(1000)]}, 3, clock)[0]["tiny"]) / 1000
    print(f"the fixed cost of one product call (a 64 x 64 weight, {'packed' if tiny._packed is not None else 'plain'}):"
          f" {call * 1e6:.0f} us; {len(layers)} calls a step, 64 steps: {call * len(layers) * 64 / min(t64['tfcli']):.2f}"
          f" of tfcli's generation")
    for name in list(loops)[1:]:
        print(f"the {name} loop made tfcli's tokens: {results[name].tolist() == ids[:, length:].tolist()}")


if __name__ == "__main__":
    main()
