"""A linear layer that packs its weight for oneDNN by itself once it is used again and again, keeping one copy.

On the CPU, PyTorch's kernels rearrange ("pack") the weight into the blocked layout the matrix kernels read on
every call. oneDNN can pack it once and reuse the packed weight: float32 products of several rows (a sentence, a
batch) run about 1.2-1.5x faster, and bfloat16 products about 1.2-1.7x faster at any number of rows, a single
row included (decoding steps), on a CPU with AVX-512 BF16 or AMX (measured on a 2-core Xeon with AVX-512 BF16;
`benchmarks/generate.py --floor` times the packed products). float32 single rows stay plain (`FLOAT32_ROWS_PACK`):
on Intel CPUs and AVX2 ones they are no faster packed, and with two threads on a busy machine much slower. On a
CPU with AVX-512 that is not Intel's they are 1.4-3.4x faster packed from a million weights up (a 2-core AMD
EPYC), because there PyTorch's plain float32 product (MKL) takes MKL's generic code path (`MKL_VERBOSE=1` names
it "Intel(R) Architecture processors") while oneDNN runs its AVX-512 kernels; so there those layers pack them
too (smaller ones, slower packed, stay plain), in the layout oneDNN picks for 16 rows (`FLOAT32_PACK_ROWS`): the one
it picks for a single row runs slower. Where the CPU has no bfloat16 instructions, bfloat16 weights stay plain and
products of several rows through layer-sized weights run in float32 (`BFLOAT16_CAST`). Packing costs one reordering,
so it pays only for a weight used again and again, and each layer decides that from its own use, unasked: it packs
on its second product in a row that can run packed (no gradient wanted, on the CPU, input and weight of one dtype
that oneDNN packs here, not a float32 single row). So a single forward pass, and the logit lens after it, stay
plain; a model called in a loop, a sweep, a stream of batches, or bfloat16 generation (from its first step) runs
packed; float32 generation stays plain (its single rows break the run, and put back the plain weight of a layer
packed before), except for the layers that pack float32 single rows on a CPU where they are faster so.

One copy of each weight: the packed weight replaces the plain one. The layer's `weight` Parameter becomes a
`PackedWeight`, a tensor subclass that holds only the packed oneDNN tensor (which `.to_dense()` turns back into
the exact plain weight) and reads as the plain weight everywhere: shape, dtype and parameter counts are the
plain weight's, and any operation on it (slicing, matmuls, `.to(...)`) runs on the plain values, unpacked for
that operation (a transient copy, in `__torch_dispatch__`); an in-place write repacks them. `state_dict()`,
`copy.deepcopy`, pickling and printing give the plain weight, and `module.to(...)` (any `_apply`) puts it back
first. (The first operation that dispatches costs about 0.5 s and 40 MB, once a process: PyTorch imports its
distributed and symbolic-shape modules on a tensor subclass's first dispatch; packing, the products,
`state_dict()`, copies, printing and `module.to(...)` do not dispatch.) The Parameter object stays the same (its contents are
swapped, `torch.utils.swap_tensors`), so whatever holds it (an optimizer, an analysis) holds the current
weight; while something else holds its tensor (a live autograd graph) it is not swapped. A product that wants
a gradient (for its input, weight or bias: analyses that differentiate through the model) takes the plain
kernel: on a packed weight it puts the plain weight back for good (still one copy; two more products in a row
that can run packed pack it again).

An LM head packs from its third product (`packs_after`): a single pass makes one product with it and the logit
lens after it a second, which stay plain. A head tied to the token embeddings (`tied`) cannot give its plain
weight up, since the embedding lookup reads it: it packs a copy beside it for single-row products only (bfloat16
decoding steps, and float32 ones where they pack: 154 MB for GPT-2's head), the one place where two copies serve (decoding with a tied head, as GPT-2's, makes every step's
largest product with it); its products of several rows (a pass, the logit lens, a sweep) stay plain, so that a
burst of them does not hold a second copy of the vocabulary matrix. Decoding with the logit lens is the exception:
its one product a step has as many rows as hidden states (`copy_rows`, which the decoding loop sets while it runs),
and float32 products of 2-15 rows on the plain weight take MKL's slow path (about 3x the packed product), so the
copy is packed on the first of them and dropped when the loop ends. `encode`'s logit lens runs its products
`kept_plain`: a burst of a few products, then the process ends, which packing would not repay (about 40 ms for a
32000 x 1024 bfloat16 head against 2 ms saved a product) while holding the plain and the packed head at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._pytree import tree_map


def _packable_dtypes() -> set[torch.dtype]:
    """The dtypes whose products oneDNN can run on packed weights on this CPU: float32 wherever PyTorch has
    oneDNN, bfloat16 where the CPU has native bfloat16 instructions (AVX-512 BF16, AMX), else none."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return set()
    return {torch.float32} | ({torch.bfloat16} if torch.ops.mkldnn._is_mkldnn_bf16_supported() else set())


PACKABLE: set[torch.dtype] = _packable_dtypes()


def float32_rows_pack(cpuinfo: str, capability: str) -> bool:
    """Whether float32 single rows run faster on packed weights on a CPU with this /proc/cpuinfo text and PyTorch
    capability (see the module note): AVX-512, and a vendor other than Intel."""
    vendors = {line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("vendor_id")}
    return capability == "AVX512" and bool(vendors) and "GenuineIntel" not in vendors


def _float32_rows_pack_here() -> bool:
    if torch.float32 not in PACKABLE:
        return False
    try:
        cpuinfo = open("/proc/cpuinfo").read()
    except OSError:  # not Linux: keep the rule measured on Intel and AVX2 CPUs
        return False
    return float32_rows_pack(cpuinfo, torch.backends.cpu.get_cpu_capability())


FLOAT32_ROWS_PACK: bool = _float32_rows_pack_here()
ROWS_PACK_FROM = 1 << 20  # weights of fewer elements run single rows faster plain, even there
FLOAT32_PACK_ROWS = 16  # there: the fewest rows a float32 weight's packed layout is chosen for

# An x86 CPU without bfloat16 instructions (oneDNN has no bfloat16 products there): PyTorch's bfloat16 product
# costs about 0.14 ms a row through a 2,304 x 768 weight, every row alike, while casting both operands to float32
# first costs 0.4 ms for 4 rows and 0.8 ms for 16 (docs/benchmarks.md, measured by emulation on a CPU that has
# them). So there products of BFLOAT16_CAST_ROWS rows or more run in float32 and round back, for weights under
# BFLOAT16_CAST_BELOW elements: a vocabulary head's cast (tens of millions) costs more than it saves.
BFLOAT16_CAST: bool = (torch.float32 in PACKABLE and torch.bfloat16 not in PACKABLE
                       and torch.backends.cpu.get_cpu_capability().startswith("AVX"))
BFLOAT16_CAST_ROWS = 4
BFLOAT16_CAST_BELOW = 1 << 22


def pack(weight: Tensor, rows: int) -> Tensor:
    """weight (out, in) in oneDNN's blocked layout (a torch._mkldnn tensor) for products of about `rows` rows.
    Where float32 single rows pack, the layout oneDNN picks for one row runs every product slower than the one
    for 16 rows, single rows included (GPT-2's head 1.7x, generate 1.3x: docs/benchmarks.md), so fewer rows ask
    for that one."""
    if FLOAT32_ROWS_PACK and weight.dtype is torch.float32:
        rows = max(rows, FLOAT32_PACK_ROWS)
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


class PackedWeight(Tensor):
    """A linear weight held only as its oneDNN-packed tensor, reading as the plain weight: every aten
    operation on it runs on the plain values, unpacked for that operation; an in-place write repacks them.
    `box` is a one-item list holding the packed tensor, shared by the detached aliases of one weight (the
    Parameter, its `.data`), so that a write through any of them is seen by all."""

    box: list[Tensor]
    rows: int
    __torch_function__ = torch._C._disabled_torch_function_impl  # results are plain tensors, not this class

    @staticmethod
    def __new__(cls, box: list[Tensor], rows: int) -> PackedWeight:
        packed = box[0]
        return Tensor._make_wrapper_subclass(cls, packed.shape, dtype=packed.dtype, device=packed.device)

    def __init__(self, box: list[Tensor], rows: int):
        self.box, self.rows = box, rows

    def plain(self) -> Tensor:
        """The plain weight (a new tensor, exactly the values packed)."""
        return self.box[0].to_dense()

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:  # so nn.Parameter(packed) and .data stay packed
            return cls(args[0].box, args[0].rows)
        plain: dict[int, Tensor] = {}

        def unpack(value):
            if isinstance(value, PackedWeight):
                return plain.setdefault(id(value), value.plain())
            return value

        args_, kwargs_ = tree_map(unpack, (args, kwargs))
        out = func(*args_, **kwargs_)
        for i, spec in enumerate(func._schema.arguments):  # written into a packed weight: repack its values
            value = args[i] if i < len(args) else kwargs.get(spec.name)
            if isinstance(value, PackedWeight) and spec.alias_info is not None and spec.alias_info.is_write:
                value.box[0] = pack(plain[id(value)], value.rows)
                out = value if out is plain[id(value)] else out
        return out

    def as_plain_parameter(self) -> Tensor:
        """The plain weight, a Parameter (with this one's requires_grad) where this one is a Parameter."""
        if isinstance(self, nn.Parameter):
            return nn.Parameter(self.plain(), requires_grad=self.requires_grad)
        return self.plain()

    def __repr__(self, *, tensor_contents=None) -> str:
        return repr(self.as_plain_parameter())

    def __deepcopy__(self, memo: dict) -> Tensor:
        return memo.setdefault(id(self), self.as_plain_parameter())

    def __reduce_ex__(self, protocol):
        return self.as_plain_parameter().__reduce_ex__(protocol)


def _swap(parameter: Tensor, contents: Tensor) -> None:
    """Make `parameter` (the same object) hold `contents` (a new tensor), as an nn.Parameter with its
    requires_grad, outside inference mode so that it works outside it too; its gradient, if any, stays."""
    grad, parameter.grad = parameter.grad, None
    try:
        with torch.inference_mode(False), torch.no_grad():
            if type(contents) is PackedWeight:  # what nn.Parameter does, without its detach (a first dispatch:
                contents.requires_grad_(parameter.requires_grad)  # see the module note)
                contents._is_param = True
            else:
                contents = nn.Parameter(contents, requires_grad=parameter.requires_grad)
            torch.utils.swap_tensors(parameter, contents)
    finally:
        parameter.grad = grad


def _free(weight: Tensor) -> bool:
    """Whether only its module holds the weight's tensor (no live autograd graph, no weak reference to it), so
    that its contents can be swapped without breaking what holds it."""
    return weight._use_count() == 1 and not weakref.getweakrefs(weight)


def _cast_pays(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether this bfloat16 product runs faster in float32 on a CPU without bfloat16 instructions."""
    return (x.is_cpu and weight.dtype is torch.bfloat16 and x.numel() >= BFLOAT16_CAST_ROWS * x.shape[-1]
            and weight.numel() < BFLOAT16_CAST_BELOW and not _needs_grad(x, weight, bias))


def _needs_grad(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                        (bias is not None and bias.requires_grad))


class Linear(nn.Linear):
    """nn.Linear that, on its second product in a row that can run packed (see the module note), packs its
    weight for oneDNN in place of the plain one, and multiplies by the packed weight from then on in inference
    on the CPU. Same results to the dtype's rounding. `packable` False keeps it plain; `tied` (a weight an
    embedding reads too) packs a copy beside the plain weight instead; `packs_after` products in a row pack it."""

    packable: bool = True
    tied: bool = False
    copy_rows: int = 1  # tied: the most rows of a product that the packed copy serves (decoding.py raises it)
    packs_after: int = 2
    _uses: int = 0  # products in a row that could have run packed, while plain
    _copy: tuple[tuple[int, int], Tensor] | None = None  # tied: (the weight's storage and version, its packed copy)

    def __init__(self, in_features: int, out_features: int, *args, **kwargs):
        super().__init__(in_features, out_features, *args, **kwargs)
        self.rows_plain = not (FLOAT32_ROWS_PACK and in_features * out_features >= ROWS_PACK_FROM)

    def forward(self, x: Tensor) -> Tensor:
        """(..., in_features) -> (..., out_features)."""
        # one call per layer and token in generation: each attribute of a module read here costs time
        weight, bias, dtype = self.weight, self.bias, x.dtype
        row = dtype is torch.float32 and self.rows_plain and x.numel() == x.shape[-1]  # a float32 single row
        if type(weight) is PackedWeight:
            if not row and dtype is weight.dtype and x.is_cpu and not _needs_grad(x, weight, bias):
                return torch.ops.mkldnn._linear_pointwise(x, weight.box[0], bias, "none", [], "")
            if (row or _needs_grad(x, weight, bias)) and _free(weight):  # the plain weight back, for good
                self.unpack()
            return F.linear(x, weight, bias)  # (other dtypes, devices: on the weight unpacked for this product)
        if row or not self.packable or dtype not in PACKABLE or weight.dtype is not dtype or not x.is_cpu \
                or _needs_grad(x, weight, bias):
            if self._uses and (row or _needs_grad(x, weight, bias)):  # a product that cannot run packed ends the run
                self._uses = 0
            if dtype is torch.bfloat16 and BFLOAT16_CAST and _cast_pays(x, weight, bias):
                return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(dtype)
            return F.linear(x, weight, bias)
        rows = max(1, x.numel() // x.shape[-1])
        lens_step = self.tied and rows > 1  # with a tied head, only decoding with the lens (copy_rows) packs these
        if lens_step and rows > self.copy_rows:  # a second copy serves decoding steps only (not a lens burst)
            return F.linear(x, weight, bias)
        self._uses += 1
        if (self._uses < self.packs_after and not lens_step) or not (self.tied or _free(weight)):
            return F.linear(x, weight, bias)
        state = (weight.data_ptr(), weight._version)
        if self.tied and self._copy is not None and self._copy[0] == state:  # its packed copy, still current
            return torch.ops.mkldnn._linear_pointwise(x, self._copy[1], bias, "none", [], "")
        try:
            with torch.inference_mode(False):  # normal tensors, usable outside inference mode too
                packed = pack(weight.detach(), rows)
                if self.tied:
                    self._copy = (state, packed)
                else:
                    _swap(weight, PackedWeight([packed], rows))
        except RuntimeError:  # oneDNN cannot pack this dtype after all: plain products from now on
            PACKABLE.discard(dtype)
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    @property
    def _packed(self) -> Tensor | None:
        """The packed oneDNN weight (a tied weight's packed copy), None while plain (benchmarks/generate.py
        --floor reads it)."""
        weight = self.weight
        return weight.box[0] if type(weight) is PackedWeight else self._copy[1] if self._copy else None

    def unpack(self) -> None:
        """Put the plain weight back (the same Parameter object); it packs again after two more products."""
        weight = self.weight
        if type(weight) is PackedWeight:
            _swap(weight, weight.plain())
            self._uses = 0

    def _apply(self, fn, recurse=True):
        self.unpack()  # conversions (`.to(...)`, `.float()`, ...) see, and keep, a plain weight
        self._copy = None
        return super()._apply(fn, recurse)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        weight = self.weight
        if keep_vars or type(weight) is not PackedWeight:  # (keep_vars: the Parameter itself)
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = weight.plain()  # what nn.Linear's gives, unpacked
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias.detach()


@contextmanager
def kept_plain(layer: Linear | None) -> Iterator[None]:
    """Products made inside run on `layer`'s weight as it is (packed if it already was) and do not count towards
    packing it."""
    if layer is None:
        yield
        return
    packable, layer.packable = layer.packable, False
    try:
        yield
    finally:
        layer.packable = packable
