"""A GGUF file as transformers' GGUF loader reads it (`from_pretrained(dir, gguf_file=...)`): `hf_config` gives the
Hugging Face config values that loader reads from the metadata, which the family's own translation then reads as it
reads a config.json (tfcli.sources); `hf_names` each tensor's Hugging Face name; `read_tensors` gives the loader
(`load_checkpoint`) every tensor under that name, read dequantized by tfcli.checkpoints.gguf (which parses the file).

What is computed follows transformers' GGUF loader, which un-permutes llama.cpp's Llama Q and K rows, takes 1
back off Gemma's norms and transposes GPT-2's projections. Where that loader leaves out metadata that llama.cpp
computes with, tfcli reads it as the original checkpoint's config said (ORIGINAL_KEYS, `_rope_scaling`), and
refuses, naming it, what it cannot read (mixtures of experts, RoPE scalings other than linear and Llama 3's,
Phi-3's LongRoPE factors).
"""

from __future__ import annotations

import functools
import math
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfcli.checkpoints.gguf import (FLOAT_TYPES, GgufHeader, GgufTensor, dequantize, dequantize_rows, gguf_module,
                                    read_header)
from tfcli.errors import TfcliError

if TYPE_CHECKING:
    import numpy as np


# --- architectures: config and tensor names -------------------------------------------------------------------

# transformers' GGUF_CONFIG_MAPPING (integrations/ggml.py) for the architectures tfcli has: "{arch}.KEY" -> HF key
_COMMON = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
           "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
           "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
           "vocab_size": "vocab_size"}
CONFIG_KEYS: dict[str, dict[str, str]] = {
    "llama": {**_COMMON, "rope.dimension_count": "head_dim"},
    "qwen2": _COMMON, "qwen3": _COMMON, "falcon": _COMMON, "phi3": _COMMON,
    "gemma2": {**_COMMON, "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gemma3": {**_COMMON, "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"},
    "gpt2": {"block_count": "n_layer", "context_length": "n_ctx", "embedding_length": "n_embd",
             "feed_forward_length": "feed_forward_length", "attention.head_count": "n_head",
             "attention.layer_norm_epsilon": "layer_norm_epsilon"},
}
TOKEN_ID_KEYS = {"tokenizer.ggml.bos_token_id": "bos_token_id", "tokenizer.ggml.eos_token_id": "eos_token_id",
                 "tokenizer.ggml.padding_token_id": "pad_token_id"}
MODEL_TYPES = {"gemma3": "gemma3_text"}
CAUSAL_LM = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
             "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
             "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel", "falcon": "FalconForCausalLM"}
# metadata that transformers' GGUF loader leaves out but llama.cpp computes with: "{arch}.KEY" -> (HF key, the
# value transformers assumes instead). tfcli reads the file's value, as the original config.json said it, where
# it differs (beyond float32 rounding) from what transformers assumes.
ORIGINAL_KEYS: dict[str, dict[str, tuple[str, Any]]] = {
    "qwen3": {"attention.key_length": ("head_dim", 128)},
    "phi3": {"attention.sliding_window": ("sliding_window", None)},
    "gemma2": {"attn_logit_softcapping": ("attn_logit_softcapping", 50.0),
               "final_logit_softcapping": ("final_logit_softcapping", 30.0)},
    "gemma3": {"final_logit_softcapping": ("final_logit_softcapping", None)},
    "falcon": {"attention.layer_norm_epsilon": ("layer_norm_epsilon", 1e-5)},
    "gpt2": {"context_length": ("n_positions", 1024), "feed_forward_length": ("n_inner", None)},
}

_LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_q.bias": "model.layers.{}.self_attn.q_proj.bias",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_k.bias": "model.layers.{}.self_attn.k_proj.bias",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_v.bias": "model.layers.{}.self_attn.v_proj.bias",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.attn_output.bias": "model.layers.{}.self_attn.o_proj.bias",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    **{f"blk.{{}}.ffn_{part}.{param}": f"model.layers.{{}}.mlp.{part}_proj.{param}"
       for part in ("gate", "up", "down") for param in ("weight", "bias")},
}
_QK_NORMS = {"blk.{}.attn_q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
             "blk.{}.attn_k_norm.weight": "model.layers.{}.self_attn.k_norm.weight"}
_GEMMA_NAMES = {**{k: v for k, v in _LLAMA_NAMES.items() if "ffn_norm" not in k and "output.weight" != k},
                "output.weight": "lm_head.weight",
                "blk.{}.post_attention_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
                "blk.{}.ffn_norm.weight": "model.layers.{}.pre_feedforward_layernorm.weight",
                "blk.{}.post_ffw_norm.weight": "model.layers.{}.post_feedforward_layernorm.weight"}
TENSOR_NAMES: dict[str, dict[str, str]] = {
    "llama": _LLAMA_NAMES, "qwen2": _LLAMA_NAMES, "qwen3": {**_LLAMA_NAMES, **_QK_NORMS},
    "gemma2": _GEMMA_NAMES, "gemma3": {**_GEMMA_NAMES, **_QK_NORMS},
    "phi3": {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight",
             "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
             "blk.{}.attn_qkv.weight": "model.layers.{}.self_attn.qkv_proj.weight",
             "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
             "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
             "blk.{}.ffn_up.weight": "model.layers.{}.mlp.gate_up_proj.weight",
             "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight"},
    "gpt2": {"token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
             "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
             "output.weight": "lm_head.weight",
             **{f"blk.{{}}.{gguf_name}.{param}": f"transformer.h.{{}}.{hf_name}.{param}"
                for gguf_name, hf_name in (("attn_norm", "ln_1"), ("attn_qkv", "attn.c_attn"),
                                           ("attn_output", "attn.c_proj"), ("ffn_norm", "ln_2"),
                                           ("ffn_up", "mlp.c_fc"), ("ffn_down", "mlp.c_proj"))
                for param in ("weight", "bias")}},
    "falcon": {"token_embd.weight": "transformer.word_embeddings.weight",
               "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
               "output.weight": "lm_head.weight",
               **{f"blk.{{}}.{gguf_name}.{param}": f"transformer.h.{{}}.{hf_name}.{param}"
                  for gguf_name, hf_name in (("attn_norm", "input_layernorm"),
                                             ("attn_qkv", "self_attention.query_key_value"),
                                             ("attn_output", "self_attention.dense"),
                                             ("ffn_up", "mlp.dense_h_to_4h"), ("ffn_down", "mlp.dense_4h_to_h"))
                  for param in ("weight", "bias")}},
}
SUPPORTED = tuple(TENSOR_NAMES)
# GGUF architectures transformers' GGUF loader reads and tfcli's families do not (yet): named in the refusal
NOT_IN_TFCLI = {"t5": "T5 (an encoder-decoder)", "t5encoder": "T5's encoder", "umt5": "UMT5", "bloom": "BLOOM",
                "stablelm": "StableLM", "starcoder2": "StarCoder2", "mamba": "Mamba", "nemotron": "Nemotron",
                "qwen2moe": "Qwen2-MoE", "qwen3moe": "Qwen3-MoE", "lfm2": "LFM2", "deci": "DeciLM",
                "gpt-oss": "gpt-oss", "minimax-m2": "MiniMax-M2", "gemma4": "Gemma 4", "qwen35": "Qwen3.5",
                "qwen35moe": "Qwen3.5-MoE", "gemma": "Gemma 1 (transformers' GGUF loader does not read it)",
                "mistral": "llama.cpp writes Mistral's models as `llama`; transformers cannot load this name either"}


def _template(template: str) -> re.Pattern[str]:
    return re.compile(r"(\d+)".join(re.escape(part) for part in template.split("{}")))


def _check_architecture(header: GgufHeader) -> None:
    arch = header.architecture
    if arch in SUPPORTED:
        return
    what = f"`{arch}` ({NOT_IN_TFCLI[arch]})" if arch in NOT_IN_TFCLI else f"`{arch}`"
    raise TfcliError(f"{header.path}: GGUF architecture {what} is not supported by tfcli",
                     f"tfcli reads GGUF files of the architectures {', '.join(SUPPORTED)} (llama: Mistral's too)")


def hf_config(header: GgufHeader) -> dict[str, Any]:
    """The Hugging Face config values of a GGUF file: what transformers' GGUF loader reads from its metadata
    (`load_gguf_checkpoint(..., return_tensors=False)["config"]`), plus the keys it leaves out that change the
    computation (ORIGINAL_KEYS, RoPE scaling), an `architectures` entry (the file holds a causal LM) and no more."""
    _check_architecture(header)
    arch, path = header.architecture, header.path
    name = header.metadata.get("general.name")
    # llama.cpp writes Mistral's models as `llama` (and computes them so: no sliding window). transformers reads a
    # file named exactly "mistral" as a Mistral model, then fails to load its weights; tfcli reads it as llama.cpp
    model_type = MODEL_TYPES.get(arch, arch)
    values: dict[str, Any] = {"model_type": model_type, "architectures": [CAUSAL_LM[model_type]]}
    if name is not None:
        values["_name_or_path"] = name
    for key, hf_key in {**{f"{arch}.{k}": v for k, v in CONFIG_KEYS[arch].items()}, **TOKEN_ID_KEYS}.items():
        if key in header.metadata:
            value = header.metadata[key]
            if isinstance(value, list):
                raise TfcliError(f"{path}: `{key}` holds one value per layer ({value[:4]}...), which tfcli does not "
                                 "support", "tfcli reads GGUF files whose layers all have the same shape")
            values[hf_key] = value
    if arch != "gpt2" and "vocab_size" not in values and header.count("tokenizer.ggml.tokens"):
        values["vocab_size"] = header.count("tokenizer.ggml.tokens")
    values["tie_word_embeddings"] = "output.weight" not in header.tensors or arch == "falcon"
    if arch in ("llama", "qwen3"):  # no key says so: the tensors do (transformers would drop them)
        if any(re.fullmatch(r"blk\.\d+\.attn_(q|output)\.bias", tensor) for tensor in header.tensors):
            values["attention_bias"] = True
        if arch != "qwen3" and any(re.fullmatch(r"blk\.\d+\.ffn_\w+\.bias", tensor) for tensor in header.tensors):
            values["mlp_bias"] = True
    for key, (hf_key, assumed) in ORIGINAL_KEYS.get(arch, {}).items():
        found = header.get(key)
        if found is not None and not _same(found, assumed):
            values[hf_key] = found
    _refuse_unread(header)
    if arch == "gpt2":  # no vocab_size key: the embeddings' rows (transformers takes the vocabulary's length)
        embeddings = header.tensors.get("token_embd.weight")
        values["vocab_size"] = embeddings.shape[0] if embeddings else header.count("tokenizer.ggml.tokens") or 0
    if arch == "falcon" and header.get("attention.head_count_kv", 1) != 1:
        raise TfcliError(f"{path}: Falcon with {header.get('attention.head_count_kv')} key/value heads "
                         "(new_decoder_architecture, Falcon-40B's shape) from a GGUF file is not supported by tfcli",
                         "transformers' GGUF loader reads multi-query Falcon (Falcon-7B's shape) only")
    if arch in ("gemma2", "gemma3") and header.get("attention.key_length", 256) != 256:
        raise TfcliError(f"{path}: {arch} with heads of {header.get('attention.key_length')} dimensions from a GGUF "
                         "file is not supported by tfcli: the file does not say by what its attention scores are "
                         "scaled (query_pre_attn_scalar)", "transformers assumes 256, right for heads of 256 only")
    if arch == "phi3" and header.get("rope.dimension_count") is not None:
        rotated, head = header.get("rope.dimension_count"), _head_dim(header, values)
        if rotated != head:
            values["partial_rotary_factor"] = rotated / head
    values.update(_rope_scaling(header, values))
    return values


def _head_dim(header: GgufHeader, values: dict[str, Any]) -> int:
    """The size of each attention head: head_dim where the config gives it, else hidden_size / heads."""
    try:
        return values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    except (KeyError, TypeError, ZeroDivisionError):
        raise TfcliError(f"{header.path}: its metadata gives no valid embedding_length and attention.head_count",
                         "the file is not a complete GGUF model: convert it again") from None


def _same(found: Any, assumed: Any) -> bool:
    if isinstance(found, float) and isinstance(assumed, float):
        return struct.unpack("<f", struct.pack("<f", assumed))[0] == found
    return found == assumed


def _refuse_unread(header: GgufHeader) -> None:
    """Refuse, naming it, metadata that changes the computation and that neither tfcli nor transformers reads."""
    path, arch = header.path, header.architecture
    if header.get("expert_count"):
        raise TfcliError(f"{path}: a mixture of experts ({header.get('expert_count')} experts per layer) is not "
                         "supported by tfcli", "tfcli reads dense models")
    for key in ("attention.clamp_kqv", "attention.max_alibi_bias", "logit_scale", "embedding_scale",
                "residual_scale", "attention.scale"):
        value = header.get(key)
        if value not in (None, 0, 0.0, 1.0) or key == "attention.clamp_kqv" and value is not None:
            raise TfcliError(f"{path}: {arch} with `{arch}.{key}: {value}` is not supported by tfcli",
                             "transformers' GGUF loader does not read it either")


def _rope_scaling(header: GgufHeader, values: dict[str, Any]) -> dict[str, Any]:
    """RoPE scaling, which transformers' GGUF loader leaves out: `{arch}.rope.scaling.type` linear (Gemma 3 4B
    and up), and Llama 3's, which llama.cpp stores as a `rope_freqs` tensor of per-frequency factors, read back
    into its four numbers (and checked to give that tensor again). Any other is refused, naming it."""
    path, arch = header.path, header.architecture
    kind = header.get("rope.scaling.type")
    if kind in (None, "none") or kind == "linear" and header.get("rope.scaling.factor", 1.0) == 1.0:
        scaling = None
    elif kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(header.get("rope.scaling.factor"))}
    else:
        raise TfcliError(f"{path}: RoPE scaling `{kind}` in a GGUF file is not supported by tfcli",
                         "tfcli reads linear scaling and Llama 3's (the rope_freqs tensor) from GGUF files")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in header.tensors:
            raise TfcliError(f"{path}: LongRoPE (the {name} tensor) in a GGUF file is not supported by tfcli",
                             "use the original checkpoint (config.json + safetensors), whose longrope tfcli reads")
    if "rope_freqs.weight" in header.tensors:
        if scaling is not None or arch != "llama":
            raise TfcliError(f"{path}: a rope_freqs tensor in a {arch} GGUF file is not supported by tfcli",
                             "tfcli reads rope_freqs as Llama 3's RoPE scaling only")
        scaling = _llama3_scaling(header, values)
    if scaling is None:
        return {}
    if arch == "gemma3":
        return {"rope_parameters": {"full_attention": {"rope_theta": values.get("rope_theta", 1e6), **scaling},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    return {"rope_scaling": scaling}


def _llama3_scaling(header: GgufHeader, values: dict[str, Any]) -> dict[str, Any]:
    """Llama 3's rope_scaling from the factors llama.cpp computed from it (convert_hf_to_gguf.py) and stored as
    rope_freqs: the largest is `factor`; the other three numbers are those of every Llama 3.x release."""
    import numpy as np

    info = header.tensors["rope_freqs.weight"]
    stored = dequantize_rows(header.path, info, 0, 1).reshape(-1)
    head_dim = _head_dim(header, values)
    theta = values.get("rope_theta", 10000.0)
    scaling = {"rope_type": "llama3", "factor": float(stored.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low, high = 8192 / scaling["low_freq_factor"], 8192 / scaling["high_freq_factor"]
    expected = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < high:
            expected.append(1.0)
        elif wavelength > low:
            expected.append(scaling["factor"])
        else:
            smooth = (8192 / wavelength - 1.0) / (4.0 - 1.0)
            expected.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    if stored.shape != (head_dim // 2,) or not np.allclose(stored, np.array(expected, np.float32), rtol=1e-5):
        raise TfcliError(f"{header.path}: its rope_freqs tensor is not Llama 3's RoPE scaling with "
                         "low_freq_factor 1, high_freq_factor 4 and original_max_position_embeddings 8192",
                         "tfcli reads rope_freqs as Llama 3.x releases write it")
    return scaling


# --- what a load needs ---------------------------------------------------------------------------------------

def check_loadable(header: GgufHeader) -> None:
    """Refuse, before anything is built, a file holding a tensor type the gguf package cannot dequantize or a
    tensor tfcli's family has no place for."""
    import numpy as np

    gguf = gguf_module()
    for type_name in sorted({info.type_name for info in header.tensors.values()}):
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name in FLOAT_TYPES:
            continue
        try:
            gguf.quants.dequantize(np.zeros(gguf.GGML_QUANT_SIZES[qtype][1], np.uint8), qtype)
        except NotImplementedError:
            used = next(info.name for info in header.tensors.values() if info.type_name == type_name)
            raise TfcliError(f"{header.path}: tensor {used} is quantized as {type_name}, which the gguf package "
                             "cannot dequantize", "use a file quantized to another type (Q4_K_M, Q8_0, F16, ...)") from None
    hf_names(header)


def hf_names(header: GgufHeader) -> dict[str, str]:
    """GGUF tensor name -> its Hugging Face name; a tensor no rule knows is an error naming it (rope_freqs, read
    into the config, maps to nothing)."""
    rules = [(_template(gguf_name), hf_name) for gguf_name, hf_name in TENSOR_NAMES[header.architecture].items()]
    names, unknown = {}, []
    for name in header.tensors:
        if name == "rope_freqs.weight":
            continue
        for pattern, hf_name in rules:
            match = pattern.fullmatch(name)
            if match:
                names[name] = hf_name.format(*match.groups())
                break
        else:
            unknown.append(name)
    if unknown:
        shown = ", ".join(unknown[:4]) + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else "")
        raise TfcliError(f"{header.path}: {len(unknown)} tensor(s) that tfcli does not know for a "
                         f"{header.architecture} model: {shown}", "nothing of a model is dropped silently; this file "
                         "holds more than the architecture tfcli reads")
    return names


# --- tensors --------------------------------------------------------------------------------------------------

def read_tensors(path: Path) -> dict[str, GgufTensor]:
    """Every tensor of a GGUF file under its Hugging Face name, none read yet: `read(out=None)` dequantizes it
    (with transformers' GGUF fixes: Llama's Q/K rows un-permuted, Gemma's norms less 1, GPT-2's projections
    transposed) a slice of rows at a time into `out` (any dtype, on the CPU), or whole into a float32 tensor."""
    import torch

    header = read_header(path)
    check_loadable(header)
    values = hf_config(header)
    arch = header.architecture
    tensors = {}
    for gguf_name, hf_name in hf_names(header).items():
        info = header.tensors[gguf_name]
        heads, fix = 0, None
        if arch == "llama" and re.search(r"\.attn_[qk]\.", gguf_name):  # transformers' LlamaTensorProcessor
            heads = values["num_attention_heads"]
            if ".attn_k." in gguf_name and values.get("num_key_value_heads", heads) != heads:
                heads = values["num_key_value_heads"]
        if arch in ("gemma2", "gemma3") and gguf_name.endswith("norm.weight"):
            fix = _less_one  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
        transposed = arch == "gpt2" and re.search(r"\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight$", gguf_name)
        shape = info.shape[::-1] if transposed else info.shape
        tensors[hf_name] = GgufTensor(tuple(shape), torch.float32,
                                      functools.partial(dequantize, header.path, info, heads, fix, bool(transposed)))
    return tensors


def _less_one(values: np.ndarray) -> np.ndarray:
    return values - 1
