"""The Python API: load a model or tokenizer the way the CLI does.

    model = tfcli.load_model("bert-base")            # bundled config, random weights (seed 0)
    model = tfcli.load_model("path/to/checkpoint")   # its weights
    out = model(input_ids)                           # ModelOutput: .last_hidden_state, .logits
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.errors import TfcliError, usage_error
from tfcli.sources import Source, resolve_source

if TYPE_CHECKING:
    import torch

    from tfcli.config import ModelConfig
    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def resolve_device(name: str = "cpu") -> "torch.device":
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' | 'mps' -> a device that is present, else a clear error."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise usage_error(f"unknown device `{name}`", "use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TfcliError(f"device `{name}` is not available: this machine has no CUDA GPU "
                             "(or this torch build has no CUDA support)", "use --device cpu or --device auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            present = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise TfcliError(f"device `{name}` is not available: this machine has {count} CUDA GPU(s)",
                             f"use --device {present}, or --device cpu")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise TfcliError(f"device `{name}` is not available on this machine", "use --device cpu or auto")
    elif device.type != "cpu":
        raise usage_error(f"unsupported device `{name}`", "use auto, cpu, cuda, cuda:N or mps")
    return device


def resolve_dtype(name: str | None) -> "torch.dtype":
    import torch

    if name is None or name == "auto":
        return torch.float32
    if name not in DTYPES:
        raise usage_error(f"unknown dtype `{name}`", "use float32, float16 or bfloat16")
    return getattr(torch, DTYPES[name])


def memory_size() -> int | None:
    """This machine's memory in bytes, or None where the platform does not tell."""
    import os

    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(config: "ModelConfig", origin: str, dtype: "torch.dtype",
                         device: "torch.device | None" = None) -> None:
    """Refuse, before allocating anything, a config whose weights alone, in `dtype`, exceed the memory of
    `device` (default: this machine's); say which --dtype would fit when a smaller one would."""
    from tfcli.config import parameter_count  # arithmetic: nothing is built

    if device is not None and device.type == "cuda":
        import torch

        memory = torch.cuda.get_device_properties(device).total_memory  # the GPU's own
    else:
        memory = memory_size()
    if memory is None:
        return
    parameters = parameter_count(config)
    needed = parameters * dtype.itemsize
    if needed <= memory:
        return
    where = "this machine's" if device is None or device.type != "cuda" else f"{device}'s"
    hint = (f"--dtype bfloat16 would fit ({parameters * 2 / 2**30:,.1f} GiB)" if parameters * 2 <= memory else
            "check hidden_size, num_hidden_layers, intermediate_size and vocab_size in the config")
    raise TfcliError(f"{origin}: {config.name} needs {needed / 2**30:,.1f} GiB for its weights in "
                     f"{str(dtype).removeprefix('torch.')}, more than {where} {memory / 2**30:,.1f} GiB "
                     "of memory", hint)


def build_model(source: Source, device: str = "cpu", dtype: str | None = None, seed: int = 0) -> "TransformerModel":
    """A model from a resolved source: trained weights when it has them, else random from `seed`.
    Its `weights_description` says which, for every output. The model is built on the meta device and
    each weight is made once, in `dtype` on `device`: read straight from the checkpoint files, or drawn."""
    import torch

    from tfcli.checkpoints import load_checkpoint
    from tfcli.model import TransformerModel, assign_parameters, init_weights

    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if not 0 <= seed < 2**64:
        raise usage_error(f"seed must be between 0 and 2**64 - 1, got {seed}", parameter="seed")
    check_fits_in_memory(source.config, source.description, torch_dtype, torch_device)
    with torch.device("meta"):
        model = TransformerModel(source.config)
    try:
        if source.weights is not None:
            assign_parameters(model, load_checkpoint(model, source.weights, torch_dtype, torch_device))
            model.weights_description = f"loaded from {source.weights}" + (
                f" ({source.weights_note})" if source.weights_note else "")  # a GGUF file's `dequantized from Q4_1`
        else:
            init_weights(model, seed, torch_dtype, torch_device)
            model.weights_description = f"random (seed {seed}), from {source.description}"
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError on a GPU; from the CPU allocator a
        # RuntimeError, or a MemoryError where a CUDA build of torch runs under an address-space limit
        if isinstance(exc, RuntimeError) and not isinstance(exc, torch.OutOfMemoryError) \
                and "can't allocate memory" not in str(exc):
            raise
        raise TfcliError(f"{source.config.name} does not fit in the free memory of {torch_device} in "
                         f"{str(torch_dtype).removeprefix('torch.')}",
                         "close other programs, or try --dtype bfloat16 or another device") from None
    model.trained = source.weights is not None
    try:
        # the computed buffers (positions, rotary frequencies) move but stay float32: they are cast where used
        model.to(device=torch_device)
        if torch_device.type != "cpu":  # the CPU build runs every op in all three dtypes; a GPU may not
            with torch.no_grad():  # fail now, with a clear message, if the device cannot run this dtype
                model(torch.zeros(1, 1, dtype=torch.long, device=torch_device))
    except RuntimeError as exc:
        raise TfcliError(f"cannot run {source.config.name} in {str(torch_dtype).removeprefix('torch.')} on {torch_device}: "
                         f"{str(exc).splitlines()[0][:160]}", "try --dtype float32 or another device") from None
    return model.eval().requires_grad_(False)  # an inspector: gradients, where asked, are the activations' own


def load_model(source: str | None = None, device: str = "cpu", dtype: str | None = None,
               seed: int = 0, revision: str | None = None) -> "TransformerModel":
    """An eval-mode model from a path, bundled config name or hub id (None: bundled bert-base);
    `revision` picks a branch, tag or commit of a hub model."""
    return build_model(resolve_source(source, revision), device=device, dtype=dtype, seed=seed)


def load_tokenizer_for(source: Source) -> "Tokenizer":
    """A resolved source's tokenizer (its own files, else the bundled BERT one), checked to fit its vocabulary."""
    from tfcli.tokenizer.loading import load_tokenizer

    tokenizer = load_tokenizer(source.tokenizer_dir)
    if tokenizer.vocab_size > source.config.vocab_size:
        raise TfcliError(f"the tokenizer ({tokenizer.name}) has {tokenizer.vocab_size} tokens but the model's "
                         f"vocabulary has {source.config.vocab_size}",
                         "set vocab_size in the config to at least the tokenizer's size")
    return tokenizer


def load_model_and_tokenizer(source: str | None, device: str = "cpu", dtype: str | None = None, seed: int = 0):
    """The model and its tokenizer (its own files, else the bundled BERT one), checked to fit together."""
    resolved = resolve_source(source)
    tokenizer = load_tokenizer_for(resolved)
    return build_model(resolved, device=device, dtype=dtype, seed=seed), tokenizer


@dataclass
class SourceSummary:
    """What `tfcli config` shows: the resolved source, the parameter count of the model it builds and, when asked
    for, its sites with their shapes (see TransformerModel.site_shapes)."""

    source: Source
    parameters: int
    sites: dict[str, tuple[int | str, ...]] | None = None


def describe(source: str | None, revision: str | None = None, sites: bool = False) -> SourceSummary:
    """Resolve a model source and count its parameters without building it (nor importing torch); with `sites`,
    list its sites too (a forward pass on the meta device: shapes only, no weights, whatever the size)."""
    from tfcli.config import parameter_count

    resolved = resolve_source(source, revision)
    summary = SourceSummary(resolved, parameter_count(resolved.config))
    if sites:
        from tfcli.model.transformer import site_shapes

        summary.sites = site_shapes(resolved.config)
    return summary
