"""bfloat16 on a CPU without bfloat16 instructions, emulated on one that has them: a bfloat16 gpt2-small forward with
PyTorch's own bfloat16 products against tfcli's cast to float32 (`BFLOAT16_CAST` in tfcli/model/linear.py), in turns,
and both against float32 on the same weights (max difference / standard deviation of the logits; the check asks
<= 0.1).

The emulation: oneDNN off (`torch.backends.mkldnn.enabled = False`), bfloat16 out of `PACKABLE`, and run it with
`ATEN_CPU_CAPABILITY=avx2`.

Run: ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 python benchmarks/bfloat16_cast.py   (about a minute)
"""

from __future__ import annotations

import time

import torch

from measure import load_average, machine, spread

SECONDS = 2.0  # of CPU time per timing


def main() -> None:
    torch.backends.mkldnn.enabled = False
    import tfcli
    from tfcli.model import linear

    linear.PACKABLE.discard(torch.bfloat16)
    print(machine(in_process=True))
    print(f"{load_average()} before; emulated: oneDNN off, bfloat16 not packable, "
          f"capability {torch.backends.cpu.get_cpu_capability()}")
    reference = tfcli.load_model("gpt2-small")
    model = tfcli.load_model("gpt2-small", dtype="bfloat16")
    torch.manual_seed(0)
    for tokens in (1, 16, 128):
        ids = torch.randint(1000, 2000, (1, tokens))
        ms: dict[bool, list[float]] = {False: [], True: []}
        off_float32 = {}
        with torch.no_grad():
            expected = reference(ids).logits
            for cast in (False, True) * 3:
                linear.BFLOAT16_CAST = cast
                logits = model(ids).logits.float()
                off_float32[cast] = float((logits - expected).abs().max() / expected.std())
                start, runs = time.process_time(), 0
                while time.process_time() - start < SECONDS:
                    model(ids)
                    runs += 1
                ms[cast].append((time.process_time() - start) / runs * 1000)
        print(f"{tokens} tokens, CPU time per forward: bfloat16 products {spread(ms[False], ' ms', digits=1)}, cast to "
              f"float32 {spread(ms[True], ' ms', digits=1)}; logits max diff / std against float32 "
              f"{off_float32[False]:.3f} and {off_float32[True]:.3f}")
    print(f"{load_average()} after")


if __name__ == "__main__":
    main()
