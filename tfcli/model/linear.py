"""A linear layer that multiplies by a oneDNN-packed copy of its weight where that pays.

On the CPU, PyTorch's kernels rearrange ("pack") the weight into the blocked layout the matrix kernels read
on every call. oneDNN can pack it once and reuse the packed copy: float32 products of several rows (a
sentence, a batch) run about 1.2-1.5x faster, and bfloat16 products about 1.2-1.7x faster at any number of
rows, a single row included (decoding steps), on a CPU with AVX-512 BF16 or AMX (measured: README,
"Benchmarks"). The packed copy costs memory equal to the weight and the time of one reordering, so it pays
only for a weight used again and again: a layer packs its weight the third time it runs such a product
(generation steps, the batches of a stream). The first two run plain, so that one forward pass, and the
logit lens after it (a second product with the unembedding), never hold two copies of a weight. A changed
weight drops the packed copy.
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
PLAIN_USES = 2  # products of a weight that run plain before it is packed


def pack(weight: Tensor, rows: int) -> Tensor:
    """weight (out, in) in oneDNN's blocked layout for products of about `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


class Linear(nn.Linear):
    """nn.Linear; in inference (no grad) on the CPU, from the third product of the same weight on, multiplies
    by a oneDNN-packed copy of it: float32 with more than one row, bfloat16 with any (see the module note).
    Training, other devices and dtypes, float32 single rows (decoding steps, as fast plain) and the first
    PLAIN_USES products take the plain path. Same results to the dtype's rounding."""

    _packed: Tensor | None = None
    _weight_state: tuple[int, int] | None = None  # (storage address, version) of the weight being counted
    _uses: int = 0  # packable products with that weight so far

    def forward(self, x: Tensor) -> Tensor:
        """(..., in_features) -> (..., out_features)."""
        dtype = x.dtype
        # float32 single rows first: they are the hot path of float32 generation, one call per layer and token
        if ((dtype is torch.float32 and x.numel() == x.shape[-1]) or dtype not in PACKABLE or not x.is_cpu
                or torch.is_grad_enabled() or self.weight.dtype is not dtype):
            return F.linear(x, self.weight, self.bias)
        state = (self.weight.data_ptr(), self.weight._version)
        if state != self._weight_state:  # a new or changed weight: count its uses afresh
            self._weight_state, self._uses, self._packed = state, 0, None
        self._uses += 1
        if self._uses <= PLAIN_USES:
            return F.linear(x, self.weight, self.bias)
        if self._packed is None:
            try:
                self._packed = pack(self.weight.detach(), x.numel() // x.shape[-1])
            except RuntimeError:  # oneDNN cannot pack this dtype after all: plain products from now on
                PACKABLE.discard(dtype)
                return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
