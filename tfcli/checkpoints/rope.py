"""Rotary settings from a Hugging Face config.json, in both of the forms transformers reads.

transformers 5 writes `rope_parameters` ({rope_type, rope_theta, partial_rotary_factor, factor, ...}, or one
such mapping per layer type: full_attention, sliding_attention); older files have top-level `rope_theta`,
`rope_scaling` ({type or rope_type, factor, ...}), `partial_rotary_factor` and, for Gemma 3,
`rope_local_base_freq`. Both become ModelConfig's rope_theta, rope_scaling, partial_rotary_factor and
local_rope_theta. A scaling type tfcli does not implement is refused, naming it, and so is a
partial_rotary_factor in a family whose rotary turns whole heads whatever it says.
"""

from __future__ import annotations

from typing import Any

from tfcli.checkpoints.family import unsupported
from tfcli.config import ROPE_SCALING_KEYS
from tfcli.errors import TfcliError

SCALINGS = "tfcli implements plain RoPE, the scalings linear, dynamic, llama3 and yarn, and Phi-3's longrope"


def _scaling(params: dict[str, Any], hf: dict[str, Any], model_type: str,
             longrope: bool = False) -> dict[str, Any] | None:
    """tfcli's rope_scaling from one rope mapping: its type and the keys that type reads, None for plain RoPE."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_SCALING_KEYS or kind == "longrope" and not longrope:
        raise unsupported(model_type, f"RoPE scaling `{kind}`", SCALINGS)
    required, optional = ROPE_SCALING_KEYS[kind]
    scaling = {"rope_type": kind, **{key: params[key] for key in required + optional if params.get(key) is not None}}
    if "original_max_position_embeddings" in required:
        # transformers prefers a top-level original_max_position_embeddings, then the mapping's, then the table's
        scaling["original_max_position_embeddings"] = (hf.get("original_max_position_embeddings")
                                                        or params.get("original_max_position_embeddings")
                                                        or hf.get("max_position_embeddings"))
    if kind == "yarn" and scaling.get("factor") is None:  # transformers derives it from the two lengths
        scaling["factor"] = hf["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    return scaling


# top-level keys of files written before transformers 5's rope_parameters, which it still reads
OLDER_NUMBERS = ("rope_theta", "partial_rotary_factor", "rope_local_base_freq")


def rope_settings(hf: dict[str, Any], model_type: str, theta: float = 10000.0, local_theta: float | None = None,
                  partial: float | None = None, longrope: bool = False) -> dict[str, Any]:
    """ModelConfig values rope_theta, rope_scaling, partial_rotary_factor (and local_rope_theta when the config
    gives sliding-window layers a rope of their own). `theta`, `local_theta` and `partial` are the family's
    defaults when the file names none; `partial` None: the family turns whole heads, and a factor other than
    1 is refused. LongRoPE is refused unless the family recomputes its cache where the long factors take
    over, as transformers' Phi-3 does (`longrope`)."""
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(legacy, dict):
        raise TfcliError("config.json: `rope_parameters` and `rope_scaling` must be mappings")
    if any(key in params for key in ("full_attention", "sliding_attention")):  # one mapping per layer type
        full, local = {**(params.get("full_attention") or {}), **legacy}, params.get("sliding_attention") or {}
    else:
        full, local = legacy or params, {}  # transformers lets an old rope_scaling replace rope_parameters
    values = {
        "rope_theta": float(full.get("rope_theta", hf.get("rope_theta", theta))),
        "rope_scaling": _scaling(full, hf, model_type, longrope),
        "partial_rotary_factor": float(full.get("partial_rotary_factor", hf.get("partial_rotary_factor", partial))
                                       or 1.0),
    }
    if partial is None and values["partial_rotary_factor"] != 1.0:
        raise unsupported(model_type, f"partial_rotary_factor {values['partial_rotary_factor']}",
                          "transformers' rotary for this family turns whole heads")
    if local_theta is not None or local:
        if _scaling(local, hf, model_type) is not None:
            raise unsupported(model_type, f"RoPE scaling `{local.get('rope_type')}` on sliding-window layers", SCALINGS)
        values["local_rope_theta"] = float(local.get("rope_theta", hf.get("rope_local_base_freq", local_theta)))
    return values
