"""mBART and mBART-50 (MBartModel, MBartForConditionalGeneration): BART's layout and names, pre-norm, with a
final norm per stack (`encoder.layer_norm`, `decoder.layer_norm`) after the embedding norm and the blocks.
(mBART-50 translates into the language whose code `forced_bos_token_id` forces first, as generate does.)
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bart import RULES, SEQ2SEQ_DEFAULTS, embedding_rules, translate_seq2seq
from tfcli.checkpoints.family import Family, weight_bias


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    return translate_seq2seq(hf, "mBART", model_type="mbart", norm_position="pre", position="learned",
                             position_offset=2, embedding_norm=True, final_norm=True,
                             share_encoder_decoder_embeddings=hf["tie_word_embeddings"])


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
    defaults={"mbart": {**SEQ2SEQ_DEFAULTS, "decoder_start_token_id": None}},
)
