"""What an activation-patching sweep costs: tfcli's fast sweep against the naive one-pass-per-site sweep, through
tfcli's own hooks and TransformerLens-style on transformers' own model (forward hooks on its modules, one whole
forward pass per patched site, what `get_act_patch_*` do), and attribution patching against a forward pass. One
process, same weights, same prompts.

    python benchmarks/patch.py [--shape smollm2|gpt2] [--layers N] [--runs N] [--device cpu|cuda] [--skip-naive]
                               [--attribution-only]

The model is random (the cost does not depend on the weights): a Llama of SmolLM2-135M's shape (30 layers, 576
wide, 9 heads, 3 key/value heads) or GPT-2 small's (12 layers, 768 wide, 12 heads), built by transformers and saved
with save_pretrained, which tfcli loads. The prompts: the indirect-object pair of the README, 15 tokens with
the bundled BERT WordPiece tokenizer (the model has none of its own): 15 positions, as SmolLM2's
tokenizer gives 14. Printed, per measurement, min-max (median) over the runs, each run timing every
contender in turn so that load from other processes hits them alike, and the load average before and after:
- sweep resid+attn+mlp: tfcli fast, tfcli naive, transformers + hooks (target: fast <= 0.3x transformers);
- sweep heads: the same (target <= 0.6x);
- attribution for resid, attn, mlp and heads together, in forward passes of tfcli's plain pass (target <= 5).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import load_average, machine, ratios, spread  # noqa: E402

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When John and Mary went to the store, Mary gave a drink to"


def build(shape: str, layers: int | None, path: str):
    import torch
    import transformers

    if shape == "gpt2":
        config = transformers.GPT2Config(n_layer=layers or 12, bos_token_id=101, eos_token_id=102, vocab_size=30522)
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(vocab_size=30522, hidden_size=576, intermediate_size=1536,
                                          num_hidden_layers=layers or 30, num_attention_heads=9,
                                          num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0,
                                          tie_word_embeddings=True, bos_token_id=101, eos_token_id=102)
        cls = transformers.LlamaForCausalLM
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(config).eval()
    model.save_pretrained(path)
    return model


def hf_sweep(hf, shape: str, clean: list[int], corrupt: list[int], kinds: tuple[str, ...], target: int, foil: int,
             device: str) -> list[float]:
    """TransformerLens-style: cache the clean run, then one whole forward pass of the corrupt run per site with a
    forward hook on transformers' module putting the clean value back."""
    import torch

    blocks = hf.transformer.h if shape == "gpt2" else hf.model.layers
    o_proj = (lambda b: b.attn.c_proj) if shape == "gpt2" else (lambda b: b.self_attn.o_proj)
    heads, positions = hf.config.num_attention_heads, len(clean)
    cache, handles = {}, []
    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: cache.__setitem__(("resid", i),
                                                           (args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True))
        handles.append(o_proj(block).register_forward_hook(
            lambda m, args, out, i=i: cache.update({("z", i): args[0].clone(), ("attn", i): out.clone()})))
        handles.append(block.mlp.register_forward_hook(
            lambda m, args, out, i=i: cache.__setitem__(("mlp", i), out.clone())))
    clean_ids = torch.tensor([clean], device=device)
    corrupt_ids = torch.tensor([corrupt], device=device)
    with torch.no_grad():
        hf(input_ids=clean_ids)
    for handle in handles:
        handle.remove()
    out = []
    for kind in kinds:
        for i, block in enumerate(blocks):
            for where in range(heads if kind == "heads" else positions):
                if kind == "resid":
                    def pre(m, args, kwargs, i=i, where=where):
                        x = (args[0] if args else kwargs["hidden_states"]).clone()
                        x[:, where] = cache[("resid", i)][:, where]
                        return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
                    handle = block.register_forward_pre_hook(pre, with_kwargs=True)
                elif kind == "heads":
                    def pre(m, args, i=i, where=where):
                        z = args[0].clone()
                        size = z.shape[-1] // heads
                        z[..., where * size:(where + 1) * size] = cache[("z", i)][..., where * size:(where + 1) * size]
                        return (z, *args[1:])
                    handle = o_proj(block).register_forward_pre_hook(pre)
                else:
                    def post(m, args, output, i=i, where=where, kind=kind):
                        output = output.clone()
                        output[:, where] = cache[(kind, i)][:, where]
                        return output
                    handle = (o_proj(block) if kind == "attn" else block.mlp).register_forward_hook(post)
                with torch.no_grad():
                    logits = hf(input_ids=corrupt_ids).logits
                handle.remove()
                out.append(float(logits[0, -1, target] - logits[0, -1, foil]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=["smollm2", "gpt2"])
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's, for a quick look")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-naive", action="store_true", help="leave out tfcli's own naive sweep")
    parser.add_argument("--attribution-only", action="store_true", help="measure attribution patching alone")
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli.commands.patch import core as patch

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    before = load_average()
    print(machine(in_process=True))
    with tempfile.TemporaryDirectory() as path:
        hf = build(args.shape, args.layers, path).to(args.device)
        model, tokenizer = tfcli.load_model(path, device=args.device), tfcli.load_tokenizer(path)
    clean, corrupt = patch.pair_inputs(model.config, tokenizer, CLEAN, CORRUPT)
    target, foil = tokenizer.token_to_id("mary"), tokenizer.token_to_id("john")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    print(f"{args.shape}-shaped, {layers} layers, {heads} heads, random weights; {len(clean)} positions; "
          f"device {args.device}; torch threads {torch.get_num_threads()}")

    def timed(function) -> tuple[float, object]:
        sync()
        start = time.perf_counter()
        value = function()
        sync()
        return time.perf_counter() - start, value

    def tfcli_sweep(kinds, fast=True, method="activation"):
        options = patch.PatchOptions(target=f"#{target}", foil=f"#{foil}", sites=kinds, method=method, fast=fast)
        return patch.run_ids(model, tokenizer, clean, corrupt, options)

    def plain_pass():
        with torch.no_grad():
            model(torch.tensor([corrupt], device=args.device))

    # warm-up, and a check that the three give the same numbers
    for kinds in (("resid", "attn", "mlp"), ("heads",)) if not args.attribution_only else ():
        ours = tfcli_sweep(kinds)
        theirs = hf_sweep(hf, args.shape, clean, corrupt, kinds, target, foil, args.device)
        scale = ours.clean_value - ours.corrupt_value
        flat = [v for k in kinds for row in ours.grids[k] for v in row]
        worst = max(abs(a - (b - ours.corrupt_value) / scale) for a, b in zip(flat, theirs))
        print(f"{'+'.join(kinds)}: {len(flat)} sites; tfcli fast vs transformers + hooks: max |difference| of the "
              f"normalised scores {worst:.1e}")
    for _ in range(3):
        plain_pass()
    contenders = {"fast": lambda k: tfcli_sweep(k), "transformers": lambda k: hf_sweep(
        hf, args.shape, clean, corrupt, k, target, foil, args.device)}
    if not args.skip_naive:
        contenders["tfcli naive"] = lambda k: tfcli_sweep(k, fast=False)
    for kinds, goal in ((("resid", "attn", "mlp"), 0.3), (("heads",), 0.6)) if not args.attribution_only else ():
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.runs):
            for name, run in contenders.items():
                times[name].append(timed(lambda: run(kinds))[0])
        print(f"\nsweep {'+'.join(kinds)}:")
        for name, seconds in times.items():
            print(f"  {name}: {spread(seconds, ' s')}")
        print(f"  fast / transformers: {spread(ratios(times['fast'], times['transformers']))} (target <= {goal})")
        if "tfcli naive" in times:
            print(f"  fast / tfcli naive: {spread(ratios(times['fast'], times['tfcli naive']))}")
    from tfcli.model.linear import Linear

    def plain_weights(packable: bool) -> None:
        for module in model.modules():
            if isinstance(module, Linear):
                module.unpack()
                module.packable = packable

    passes, single, attribution = [], [], []
    for _ in range(args.runs):
        passes.append(min(timed(plain_pass)[0] for _ in range(5)))  # repeated: on packed weights
        plain_weights(False)  # one command's single pass runs on the plain weights (a layer packs on its 2nd use)
        single.append(min(timed(plain_pass)[0] for _ in range(5)))
        plain_weights(True)
        attribution.append(timed(lambda: tfcli_sweep(("resid", "attn", "mlp", "heads"), method="attribution"))[0])
    print(f"\nattribution, resid+attn+mlp+heads: {spread(attribution, ' ms', 1e3, 1)}; one forward pass "
          f"{spread(passes, ' ms', 1e3, 1)} (packed, used again and again), {spread(single, ' ms', 1e3, 1)} (plain "
          f"weights, a single pass); in passes: {spread(ratios(attribution, passes))} of the packed, "
          f"{spread(ratios(attribution, single))} of the plain (target <= 5)")
    print(f"\nload average before: {before}; after: {load_average()}")


if __name__ == "__main__":
    main()
