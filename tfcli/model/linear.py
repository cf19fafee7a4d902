"""A linear layer that multiplies by a oneDNN-packed copy of its weight where that pays.

On the CPU, PyTorch's kernels rearrange ("pack") the weight into the blocked layout the matrix kernels read on
every call. oneDNN can pack it once and reuse the packed copy: float32 products of several rows (a sentence, a
batch) run about 1.2-1.5x faster, and bfloat16 products about 1.2-1.7x faster at any number of rows, a single
row included (decoding steps), on a CPU with AVX-512 BF16 or AMX (measured on a 2-core Xeon with AVX-512 BF16;
`benchmarks/generate.py --floor` times the packed products). The packed copy costs memory equal to the weight
and the time of one reordering, so it pays only for a model that runs again and again: the code that runs it so
(generation, streams of batches) calls `pack_for_repeated_use(model)` first. A single forward pass, and the
logit lens after it, stay on the plain kernels and never hold two copies of a weight. A changed weight drops its
packed copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _packable_dtypes() -> set[torch.dtype]:
    """The dtypes whose products oneDNN can run on packed weights on this CPU: float32 wherever PyTorch has
    oneDNN, bfloat16 where the CPU has native bfloat16 instructions (AVX-512 BF16, AMX), else none."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return set()
    return {torch.float32} | ({torch.bfloat16} if torch.ops.mkldnn._is_mkldnn_bf16_supported() else set())


PACKABLE: set[torch.dtype] = _packable_dtypes()


def pack(weight: Tensor, rows: int) -> Tensor:
    """weight (out, in) in oneDNN's blocked layout for products of about `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def pack_for_repeated_use(model: nn.Module) -> None:
    """Let the model's linear layers multiply by packed copies of their weights from now on (each packed on
    its first product that gains from it): for a model about to run many times. Costs up to the memory of
    the weights again."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.repeated = True


class Linear(nn.Linear):
    """nn.Linear; once `repeated` (see pack_for_repeated_use), in inference (no grad) on the CPU, multiplies
    by a oneDNN-packed copy of its weight: float32 with more than one row, bfloat16 with any (see the
    module note). Training, other devices and dtypes, and float32 single rows (decoding steps, as fast
    plain) take the plain path. Same results to the dtype's rounding."""

    repeated: bool = False
    _packed: Tensor | None = None
    _packed_for: tuple[int, int] | None = None  # the weight's (storage address, version) when packed

    def forward(self, x: Tensor) -> Tensor:
        """(..., in_features) -> (..., out_features)."""
        # one call per layer and token in generation: each attribute of a module read here costs time
        weight, bias, dtype = self.weight, self.bias, x.dtype
        # float32 single rows first: they are the hot path of float32 generation, as fast plain
        if ((dtype is torch.float32 and x.numel() == x.shape[-1]) or not self.repeated or dtype not in PACKABLE
                or not x.is_cpu or torch.is_grad_enabled() or weight.dtype is not dtype):
            return F.linear(x, weight, bias)
        state = (weight.data_ptr(), weight._version)
        if self._packed_for != state:
            try:
                self._packed = pack(weight.detach(), max(1, x.numel() // x.shape[-1]))
            except RuntimeError:  # oneDNN cannot pack this dtype after all: plain products from now on
                PACKABLE.discard(dtype)
                return F.linear(x, weight, bias)
            self._packed_for = state
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")
