"""The Llama family: Llama 1-3 (LlamaForCausalLM), Mistral, Qwen2 and Qwen3, and their bare models.

Pre-norm decoder: RMSNorm, rotary positions (rotate-half layout; any RoPE scaling of tfcli/model/rotary.py,
Llama 3's among them), gated SiLU feed-forward, grouped-query attention, a final RMSNorm and an (often untied)
LM head. The differences, as transformers' modeling files compute them:
- Llama: `attention_bias` on all four projections, `mlp_bias`, `head_dim` of its own;
- Mistral: no biases; `sliding_window` on every layer (Mistral 7B v0.1: 4096; null from v0.2);
- Qwen2: biases on Q, K and V only; windows only with `use_sliding_window`, on the layers `layer_types` marks
  (by default those from `max_window_layers` on);
- Qwen3: as Qwen2 for windows, `attention_bias` on all four projections, an RMSNorm over each head of the
  queries and keys (`q_norm`, `k_norm`), head_dim 128 unless given.
Every id of a list-valued `eos_token_id` (Llama 3) ends a generation. Settings tfcli does not implement
(partial rotary factors, which Llama's rotary ignores) are refused, naming them.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, head_dim_of, kv_heads_of, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings
from tfcli.config import ModelConfig

HEADS = {"ForCausalLM": "lm"}
LLAMA_DEFAULTS = {  # transformers' LlamaConfig; Mistral's and Qwen's differ where they say
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": kv_heads_of, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "pad_token_id": None, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False,
}
QWEN_DEFAULTS = {"vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32,
                 "max_position_embeddings": 32768, "use_sliding_window": False, "sliding_window": 4096,
                 "max_window_layers": 28, "layer_types": None, "bos_token_id": None, "eos_token_id": None}


def sliding_windows(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """sliding_window and layer_types as transformers reads them for Mistral (every layer) and Qwen2/Qwen3
    (use_sliding_window, then layer_types or the layers from max_window_layers on); Llama has none."""
    if model_type == "mistral":
        return {"sliding_window": hf["sliding_window"]}
    if model_type not in ("qwen2", "qwen3") or not hf["use_sliding_window"]:
        return {}
    window = hf["sliding_window"]
    if window is None:
        return {}
    first = hf["max_window_layers"]
    types = hf["layer_types"] or ["sliding_attention" if i >= first else "full_attention"
                                  for i in range(hf["num_hidden_layers"])]
    return {"sliding_window": window, "layer_types": list(types)}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    model_type = hf["model_type"]
    rope = rope_settings(hf, model_type)
    if model_type == "qwen2":
        qkv_bias, out_bias = True, False
    elif model_type == "mistral":
        qkv_bias = out_bias = False
    else:
        qkv_bias = out_bias = bool(hf["attention_bias"])
    values = common(hf, model_type=model_type, architecture="decoder", head_dim=hf.get("head_dim"),
                    layer_norm_eps=hf["rms_norm_eps"], num_key_value_heads=hf["num_key_value_heads"],
                    attention_probs_dropout_prob=hf.get("attention_dropout", 0.0), hidden_dropout_prob=0.0,
                    norm="rmsnorm", norm_position="pre", position="rotary", **rope, **sliding_windows(hf, model_type),
                    qk_norm="head" if model_type == "qwen3" else "none",
                    type_vocab_size=0, embedding_norm=False, final_norm=True, feed_forward="gated",
                    attention_bias=qkv_bias, attention_out_bias=out_bias,
                    mlp_bias=model_type == "llama" and bool(hf["mlp_bias"]),
                    head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"])
    for key in ("bos_token_id", "pad_token_id"):
        if isinstance(values.get(key), list):  # one id is used; several make sense only for eos
            values[key] = values[key][0] if values[key] else None
    return values


def config_rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    if config.qk_norm == "none":
        return []
    return [("layers.{}.self_attn.q_norm.weight", "decoder.blocks.{}.attn.q_norm.weight"),
            ("layers.{}.self_attn.k_norm.weight", "decoder.blocks.{}.attn.k_norm.weight")]


FAMILY = Family(
    model_types=("llama", "qwen2", "qwen3", "mistral"),
    older_numbers=OLDER_NUMBERS,
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("layers.{}.input_layernorm.weight", "decoder.blocks.{}.attn_norm.weight"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attn.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attn.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attn.v"),
        *weight_bias("layers.{}.self_attn.o_proj", "decoder.blocks.{}.attn.out"),
        ("layers.{}.self_attn.rotary_emb.inv_freq", None),
        ("layers.{}.post_attention_layernorm.weight", "decoder.blocks.{}.mlp_norm.weight"),
        *weight_bias("layers.{}.mlp.gate_proj", "decoder.blocks.{}.mlp.gate"),
        *weight_bias("layers.{}.mlp.up_proj", "decoder.blocks.{}.mlp.up"),
        *weight_bias("layers.{}.mlp.down_proj", "decoder.blocks.{}.mlp.down"),
        ("rotary_emb.inv_freq", None),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    config_rules=config_rules,
    defaults={
        "llama": {**LLAMA_DEFAULTS, "head_dim": head_dim_of, "attention_bias": False, "mlp_bias": False},
        "mistral": {**LLAMA_DEFAULTS, "head_dim": head_dim_of, "intermediate_size": 14336, "num_key_value_heads": 8,
                    "max_position_embeddings": 131072, "sliding_window": 4096},
        **{model_type: {**LLAMA_DEFAULTS, **QWEN_DEFAULTS, **extra}
           for model_type, extra in (("qwen2", {}), ("qwen3", {"head_dim": 128, "attention_bias": False}))},
    },
)
