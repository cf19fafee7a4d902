"""Gemma 1, 2 and 3 (GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM: model types gemma, gemma2,
gemma3_text) and their bare models.

What sets them apart from Llama, as transformers' modeling files compute it:
- all: RMSNorm scaling by (1 + weight) in float32, token embeddings times sqrt(hidden_size), a GELU (tanh)
  gated feed-forward, head_dim of its own (256 unless given), tied LM head;
- Gemma 1: pre-norm; the legacy `hidden_act: gelu` means the tanh approximation (transformers converts it);
- Gemma 2: a norm before and after each sublayer (sandwich), scores scaled by query_pre_attn_scalar^-1/2,
  attention scores and final logits soft-capped (50, 30), sliding windows on alternate layers (`layer_types`),
  the activation from `hidden_activation`;
- Gemma 3: as Gemma 2, plus an RMSNorm over each head of Q and K, five sliding layers to one global
  (`sliding_window_pattern` 6), a rotary base of their own for sliding layers (`rope_local_base_freq`, 10,000;
  global 1,000,000, which alone takes `rope_scaling`), no final soft-capping by default. transformers' Gemma 3
  does not apply `attn_logit_softcapping`, so neither does tfcli.
`use_bidirectional_attention` (embedding models) is refused.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import Family, architecture_head, common, refuse, unsupported, weight_bias
from tfcli.checkpoints.rope import OLDER_NUMBERS, rope_settings
from tfcli.config import ModelConfig

HEADS = {"ForCausalLM": "lm"}
GEMMA_DEFAULTS = {  # transformers' GemmaConfig; Gemma 2's and 3's differ where they say
    "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "attention_bias": False, "use_bidirectional_attention": None, "pad_token_id": 0,
    "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True,
}
GEMMA2_DEFAULTS = {"hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                   "num_key_value_heads": 4, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                   "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": 30.0,
                   "attn_logit_softcapping": 50.0}
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_new", "gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    model_type = hf["model_type"]
    refuse(hf, model_type, {"use_bidirectional_attention": (None, False)})
    gemma3 = model_type == "gemma3_text"
    rope = rope_settings(hf, model_type, theta=1e6 if gemma3 else 10000.0, local_theta=10000.0 if gemma3 else None)
    if model_type == "gemma":
        act = hf["hidden_act"]
        act = "gelu_pytorch_tanh" if act == "gelu" else act  # transformers' conversion of old Gemma configs
    else:
        act = hf["hidden_activation"]
    if act not in ACTIVATIONS:
        raise unsupported(model_type, f"activation `{act}`")
    values = dict(model_type=model_type, architecture="decoder", head_dim=hf["head_dim"],
                  num_key_value_heads=hf["num_key_value_heads"], layer_norm_eps=hf["rms_norm_eps"],
                  hidden_act=ACTIVATIONS[act], attention_probs_dropout_prob=hf.get("attention_dropout", 0.0),
                  hidden_dropout_prob=0.0, norm="rmsnorm_plus_one", norm_position="pre", position="rotary", **rope,
                  type_vocab_size=0, embedding_norm=False, scale_embedding=True, final_norm=True,
                  feed_forward="gated", attention_bias=bool(hf["attention_bias"]),
                  attention_out_bias=bool(hf["attention_bias"]), mlp_bias=False,
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf["tie_word_embeddings"])
    if model_type != "gemma":
        layers = hf["num_hidden_layers"]
        pattern = hf.get("sliding_window_pattern", 6) if gemma3 else 2  # an old key transformers still reads
        window = hf["sliding_window"]
        types = hf["layer_types"] or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                          for i in range(layers)]
        if window is None and "sliding_attention" in types:
            raise unsupported(model_type, "sliding_attention layers and no sliding_window",
                              "transformers cannot run it either")
        values.update(norm_position="sandwich", query_pre_attn_scalar=hf["query_pre_attn_scalar"],
                      sliding_window=window, layer_types=list(types),
                      final_logit_softcapping=hf["final_logit_softcapping"],
                      attn_logit_softcapping=None if gemma3 else hf["attn_logit_softcapping"],
                      qk_norm="head" if gemma3 else "none")
    return common(hf, **values)


def config_rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    """Gemma 1's post_attention_layernorm is the feed-forward's input norm; Gemma 2 and 3 name four norms."""
    layer = "layers.{}."
    block = "decoder.blocks.{}."
    if config.norm_position == "pre":
        return [(layer + "post_attention_layernorm.weight", block + "mlp_norm.weight")]
    rules = [(layer + "post_attention_layernorm.weight", block + "attn_output_norm.weight"),
             (layer + "pre_feedforward_layernorm.weight", block + "mlp_norm.weight"),
             (layer + "post_feedforward_layernorm.weight", block + "mlp_output_norm.weight")]
    if config.qk_norm == "head":
        rules += [(layer + "self_attn.q_norm.weight", block + "attn.q_norm.weight"),
                  (layer + "self_attn.k_norm.weight", block + "attn.k_norm.weight")]
    return rules


FAMILY = Family(
    model_types=("gemma", "gemma2", "gemma3_text"),
    older_numbers=(*OLDER_NUMBERS, "sliding_window_pattern"),
    translate=translate,
    prefixes=("model.",),
    rules=(
        ("embed_tokens.weight", "embed_tokens.weight"),
        ("layers.{}.input_layernorm.weight", "decoder.blocks.{}.attn_norm.weight"),
        *weight_bias("layers.{}.self_attn.q_proj", "decoder.blocks.{}.attn.q"),
        *weight_bias("layers.{}.self_attn.k_proj", "decoder.blocks.{}.attn.k"),
        *weight_bias("layers.{}.self_attn.v_proj", "decoder.blocks.{}.attn.v"),
        *weight_bias("layers.{}.self_attn.o_proj", "decoder.blocks.{}.attn.out"),
        ("layers.{}.mlp.gate_proj.weight", "decoder.blocks.{}.mlp.gate.weight"),
        ("layers.{}.mlp.up_proj.weight", "decoder.blocks.{}.mlp.up.weight"),
        ("layers.{}.mlp.down_proj.weight", "decoder.blocks.{}.mlp.down.weight"),
        ("norm.weight", "decoder.final_norm.weight"),
        ("lm_head.weight", "head.unembed.weight"),
    ),
    config_rules=config_rules,
    defaults={
        "gemma": {**GEMMA_DEFAULTS, "hidden_act": "gelu_pytorch_tanh"},
        "gemma2": {**GEMMA_DEFAULTS, **GEMMA2_DEFAULTS},
        "gemma3_text": {**GEMMA_DEFAULTS, **GEMMA2_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072,
                        "final_logit_softcapping": None, "attn_logit_softcapping": None,
                        "use_bidirectional_attention": False},
    },
)
