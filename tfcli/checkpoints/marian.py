"""Marian (MarianModel, MarianMTModel: the Helsinki-NLP opus-mt translation models): BART's layout and
names, post-norm, without embedding norms; fixed sinusoidal positions with the sines in the first half of
each vector and the cosines in the second (`sinusoidal_halves`, computed, never stored), starting at 0;
token embeddings usually scaled by sqrt(d_model); SiLU ("swish"). With `share_encoder_decoder_embeddings:
false` each stack has its own token embedding and a tied head uses the decoder's.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.bart import RULES, SEQ2SEQ_DEFAULTS, embedding_rules, translate_seq2seq
from tfcli.checkpoints.family import Family, unsupported


def translate(hf: dict[str, Any]) -> dict[str, Any]:
    vocab = hf["vocab_size"]
    if hf["decoder_vocab_size"] not in (None, vocab):
        raise unsupported("Marian", f"`decoder_vocab_size: {hf['decoder_vocab_size']}` != vocab_size {vocab}",
                          "tfcli's two stacks share one vocabulary size")
    return translate_seq2seq(hf, "Marian", model_type="marian", norm_position="post", position="sinusoidal_halves",
                             embedding_norm=False, final_norm=False,
                             share_encoder_decoder_embeddings=hf["share_encoder_decoder_embeddings"])


FAMILY = Family(
    model_types=("marian",),
    translate=translate,
    prefixes=("model.",),
    rules=tuple(rule for rule in RULES if "embed_positions" not in rule[0]),
    config_rules=embedding_rules,
    flattened=("head.bias",),
    defaults={"marian": {**SEQ2SEQ_DEFAULTS, "vocab_size": 58101, "decoder_vocab_size": None,
                         "share_encoder_decoder_embeddings": True, "pad_token_id": 58100, "bos_token_id": None,
                         "eos_token_id": 0, "decoder_start_token_id": 58100, "forced_eos_token_id": 0}},
)
