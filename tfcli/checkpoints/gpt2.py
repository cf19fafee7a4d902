"""GPT-2 (GPT2Model, GPT2LMHeadModel).

A pre-norm decoder with learned positions and a final LayerNorm; the LM head is tied to the token
embeddings. Its linear layers are Conv1D modules that store weights as (in, out), so they are
transposed; `c_attn` already holds Q, K and V side by side, the layout of our fused `qkv`.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.common import architecture_head, common
from tfcli.config import ModelConfig
from tfcli.errors import TfcliError

MODEL_TYPES = ("gpt2",)
HEADS = {"LMHeadModel": "lm", "ForCausalLM": "lm"}
PREFIXES = ("transformer.",)


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    unsupported = [(hf.get("scale_attn_by_inverse_layer_idx"), "scale_attn_by_inverse_layer_idx: true"),
                   (hf.get("scale_attn_weights", True) is False, "scale_attn_weights: false"),
                   (hf.get("add_cross_attention"), "add_cross_attention: true")]
    for present, what in unsupported:
        if present:
            raise TfcliError(f"config.json: GPT-2 option `{what}` is not supported by tfcli",
                             "tfcli implements the standard GPT-2 block")
    hidden = hf.get("n_embd", 768)
    act = hf.get("activation_function", "gelu_new")
    return common(hf, model_type="gpt2", architecture="decoder", hidden_size=hidden,
                  num_hidden_layers=hf.get("n_layer", 12), num_attention_heads=hf.get("n_head", 12),
                  intermediate_size=hf.get("n_inner") or 4 * hidden,
                  max_position_embeddings=hf.get("n_positions", 1024),
                  layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                  hidden_act="gelu_new" if act == "gelu_pytorch_tanh" else act,
                  hidden_dropout_prob=hf.get("resid_pdrop", 0.1),
                  attention_probs_dropout_prob=hf.get("attn_pdrop", 0.1),
                  norm="layernorm", norm_position="pre", position="learned", type_vocab_size=0,
                  embedding_norm=False, final_norm=True, feed_forward="mlp",
                  head=architecture_head(hf, HEADS), tie_word_embeddings=hf.get("tie_word_embeddings", True))


def rules(config: ModelConfig) -> list[tuple[str, str | None]]:
    layer, block = r"h\.(\d+)", r"decoder.blocks.\1"
    return [
        (r"wte\.weight", "embed_tokens.weight"),
        (r"wpe\.weight", "decoder.embeddings.positions.weight"),
        (rf"{layer}\.ln_1\.(weight|bias)", rf"{block}.attention_norm.\2"),
        (rf"{layer}\.attn\.c_attn\.(weight|bias)", rf"{block}.attention.qkv.\2"),
        (rf"{layer}\.attn\.c_proj\.(weight|bias)", rf"{block}.attention.out.\2"),
        (rf"{layer}\.attn\.(?:bias|masked_bias)", None),  # causal-mask buffers of old checkpoints
        (rf"{layer}\.ln_2\.(weight|bias)", rf"{block}.feed_forward_norm.\2"),
        (rf"{layer}\.mlp\.c_fc\.(weight|bias)", rf"{block}.feed_forward.fc1.\2"),
        (rf"{layer}\.mlp\.c_proj\.(weight|bias)", rf"{block}.feed_forward.fc2.\2"),
        (r"ln_f\.(weight|bias)", r"decoder.final_norm.\1"),
        (r"lm_head\.weight", "head.unembed.weight"),
    ]


def transposed(config: ModelConfig) -> list[str]:
    return [f"decoder.blocks.{i}.{name}.weight" for i in range(config.num_hidden_layers)
            for name in ("attention.qkv", "attention.out", "feed_forward.fc1", "feed_forward.fc2")]
