"""mBART and mBART-50 (MBartModel, MBartForConditionalGeneration): BART's layout and names, pre-norm, with a
final norm per stack (`encoder.layer_norm`, `decoder.layer_norm`) after the embedding norm and the blocks.

Translation with mBART-50 starts the output with the target language's code: transformers forces it with
`forced_bos_token_id`, which tfcli's generate does not apply (give the code as the start of `--target`).
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bart import RULES, embedding_rules, translate_seq2seq
from tfcli.checkpoints.family import Family, weight_bias


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    return translate_seq2seq(hf, "mBART", model_type="mbart", norm_position="pre", position="learned",
                             position_offset=2, embedding_norm=True, final_norm=True,
                             share_encoder_decoder_embeddings=hf.get("tie_word_embeddings", True))


FAMILY = Family(
    model_types=("mbart",),
    translate=translate,
    prefixes=("model.",),
    rules=(
        *RULES,
        *weight_bias("encoder.layer_norm", "encoder.final_norm"),
        *weight_bias("decoder.layer_norm", "decoder.final_norm"),
    ),
    config_rules=embedding_rules,
    flattened=("head.bias",),
)
