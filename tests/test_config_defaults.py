"""A config.json that leaves a key out computes what transformers computes on the same files: tfcli's fallback
for every key a family reads is that family's default in transformers' config class (each family's `defaults`,
tfcli/checkpoints). Config translation only: no weights, no model but meta-device ones."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json

import pytest
import transformers

from tfcli.checkpoints import FAMILIES, translate_hf_config
from tfcli.config import from_dict, parameter_count
from tfcli.errors import TfcliError

# the labels (id2label) and dropout rates: no forward pass tfcli runs depends on them
IGNORED = ("labels", "num_labels", "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def translated(values: dict) -> dict:
    """tfcli's config for config.json `values`, as a plain dict, without the IGNORED fields."""
    config = dataclasses.asdict(from_dict(translate_hf_config(values, "config.json"), origin="config.json"))
    return {key: value for key, value in config.items() if key not in IGNORED}


def transformers_defaults(model_type: str) -> dict:
    """Every key transformers' config class for `model_type` writes, with its default value."""
    return json.loads(transformers.AutoConfig.for_model(model_type).to_json_string(use_diff=False))


def differences(model_type: str) -> list[str]:
    """Each key whose absence from transformers' default config.json changes tfcli's config, and how. A refusal
    is a difference too: transformers builds its default model without the key."""
    full = transformers_defaults(model_type)
    expected = translated(full)
    found = []
    for key in full:
        if key in ("model_type", "transformers_version"):
            continue
        try:
            got = translated({k: v for k, v in full.items() if k != key})
        except TfcliError as exc:
            found.append(f"{model_type} without `{key}`: refused ({exc.message})")
            continue
        changed = {field: (expected[field], got[field]) for field in expected if expected[field] != got[field]}
        if changed:
            found.append(f"{model_type} without `{key}`: " + ", ".join(
                f"{field} {want!r} (transformers) != {have!r} (tfcli)" for field, (want, have) in changed.items()))
    return found


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_missing_key_takes_transformers_default(model_type):
    assert differences(model_type) == []


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_default_is_transformers_class_default(model_type):
    """Each family's `defaults` are data: a constant equals the default of transformers' config class (None where
    the class derives the value from other keys, as tfcli then does); a rule gives the value transformers
    derives on its default config."""
    hf_class = type(transformers.AutoConfig.for_model(model_type))
    declared = inspect.signature(hf_class.__init__).parameters
    full = transformers_defaults(model_type)
    defaults = FAMILIES[model_type].defaults[model_type]
    for key, default in defaults.items():
        assert key in full or key in declared, f"{model_type}: transformers' config has no `{key}`"
        if callable(default):
            assert default(full) == full[key], key
        elif key in declared:
            assert default == declared[key].default, key
        else:
            assert default == full[key], key


def test_the_check_sees_a_wrong_default(monkeypatch):
    """The drop-one-key check can fail: a family whose fallback for pad_token_id is not transformers' is caught."""
    roberta = FAMILIES["roberta"]
    wrong = {**roberta.defaults, "roberta": {**roberta.defaults["roberta"], "pad_token_id": 0}}
    monkeypatch.setitem(FAMILIES, "roberta", dataclasses.replace(roberta, defaults=wrong))
    assert any("without `pad_token_id`" in line for line in differences("roberta"))


# a few families of each kind of stack (built on the meta device: well under a second each), and the transformers
# class that matches tfcli's head for that architecture
SIZED = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM", "gpt2": "GPT2LMHeadModel",
         "t5": "T5ForConditionalGeneration", "mbart": "MBartModel", "distilbert": "DistilBertModel",
         "albert": "AlbertModel", "electra": "ElectraModel", "opt": "OPTForCausalLM", "mpnet": "MPNetModel",
         "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}


@pytest.mark.parametrize("model_type", sorted(SIZED))
def test_a_config_with_only_model_type_builds_transformers_default_model(model_type):
    """config.json with only model_type and architectures: tfcli's parameter count (its arithmetic, checked
    against its built models in test_model_size.py) equals the count of transformers' default model."""
    import torch

    architecture = SIZED[model_type]
    config = from_dict(translate_hf_config({"model_type": model_type, "architectures": [architecture]}, "config.json"))
    hf_config = transformers.AutoConfig.for_model(model_type)
    with torch.device("meta"):
        model = getattr(transformers, architecture)(hf_config)
    pooler = sum(p.numel() for name, p in model.named_parameters() if "pooler" in name.split("."))
    assert parameter_count(config) == sum(p.numel() for p in model.parameters()) - pooler


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_any_value_of_any_key_translates_or_is_refused_in_one_line(model_type):
    """config.json is input: whatever one key holds (zero, a negative, a string, a list, a mapping, a boolean, a
    fraction), translating it gives a config or one TfcliError line naming the file, never a crash."""
    for key in (*FAMILIES[model_type].defaults[model_type], *FAMILIES[model_type].older_numbers):
        for value in (0, -1, "x", [1], {}, True, 1.5):
            try:
                translated({"model_type": model_type, key: value})
            except TfcliError as exc:
                assert exc.message.startswith("config.json: ") and "\n" not in exc.message, (key, value, exc.message)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_value_of_the_wrong_kind_is_refused_by_its_key(model_type):
    """Where transformers' default is a number, a string, a mapping or a list is refused in a line that names the
    key (the fallback's words name only the file); where it is a string, a number or a list is. Each in a file that
    holds every key, as transformers writes it. A list of end-of-sequence ids is no wrong kind: Llama 3 ends on
    several."""
    written = transformers_defaults(model_type)
    for key, default in FAMILIES[model_type].defaults[model_type].items():
        if isinstance(default, bool) or callable(default):
            continue
        if isinstance(default, (int, float)):
            wrong = ["x", {}] if key.endswith("token_id") else ["x", {}, [1]]
        elif isinstance(default, str):
            wrong = [0, [1]]
        else:
            continue
        for value in wrong:
            with pytest.raises(TfcliError, match=f"^config.json: `{key}` must be "):
                translated({**written, key: value})
    if isinstance(FAMILIES[model_type].defaults[model_type].get("eos_token_id"), int):
        assert translated({"model_type": model_type, "eos_token_id": [1, 2]})["eos_token_id"] == [1, 2]


def test_a_decoders_config_shows_no_segment_embeddings():
    """A causal stack builds no segment (token type) table, and `tfcli config` says so: type_vocab_size 0."""
    decoders = {model_type: translated(transformers_defaults(model_type)) for model_type in FAMILIES}
    decoders = {model_type: config for model_type, config in decoders.items() if config["architecture"] == "decoder"}
    assert len(decoders) >= 12 and {model_type: config["type_vocab_size"] for model_type, config in decoders.items()} \
        == dict.fromkeys(decoders, 0)


# settings of transformers' config classes that change nothing tfcli computes, and why
UNREAD = {
    **dict.fromkeys(("chunk_size_feed_forward", "use_cache", "output_attentions", "output_hidden_states",
                     "return_dict", "is_encoder_decoder"), "how transformers runs, not what it computes"),
    **dict.fromkeys(("initializer_range", "init_std", "initializer_factor", "initializer_cutoff_factor"),
                    "how new weights are drawn: tfcli reads stored ones"),
    **dict.fromkeys(("summary_use_proj", "summary_proj_to_labels"), "GPT-2's double-heads model, not loaded"),
    "sparse_prediction": "MLM training only: the head runs on the masked positions of labels",
    "sparse_pred_ignore_index": "MLM training only",
    "deterministic_flash_attn": "flash attention only",
    "reorder_and_upcast_attn": "float16 precision only",
    "pretraining_tp": "not read by transformers 5's Llama",
    "is_decoder": "GPT-NeoX is causal either way",
    "sinusoidal_pos_embds": "how DistilBERT's position table is drawn: tfcli reads the stored one",
    "legacy": "DeBERTa-v2's MLM head layout, read from the weights; no head here",
    "max_relative_positions": "DeBERTa-v2: -1 and -2 both mean max_position_embeddings",
    "num_kv_heads": "Falcon's first architecture has one key/value head whatever it says",
    "_sliding_window_pattern": "Gemma 3's layer_types, written beside it, win",
    "original_max_position_embeddings": "Phi-3: read by LongRoPE only; no rope scaling here",
    "max_window_layers": "Qwen: layer_types, written beside it, win",
    "use_sliding_window": "Qwen: layer_types, written beside it, win",
    "is_gated_act": "T5: derived from feed_forward_proj",
    "cls_token_id": "ModernBERT's tokenizer's, not the model's", "sep_token_id": "ModernBERT's tokenizer's",
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_setting_transformers_writes_reaches_tfcli(model_type):
    """Each number or switch in transformers' default config.json, set to another value, changes tfcli's
    config or is refused: a key read under a wrong name or dropped on the way shows here (unless UNREAD says why
    it changes nothing). Dropout rates (`drop` in their names: training only) are not tried."""
    full = transformers_defaults(model_type)
    expected = translated(full)
    unseen = []
    for key, value in full.items():
        if key in UNREAD or isinstance(value, (str, list, dict)) or value is None or "drop" in key:
            continue
        changed = (not value) if isinstance(value, bool) else value * 2 if value else type(value)(1)
        try:
            unseen += [f"{key}: {value!r} -> {changed!r}"] if translated({**full, key: changed}) == expected else []
        except TfcliError:
            pass  # refused: seen
    assert unseen == [], f"{model_type}: these settings change nothing tfcli computes"


# config.json keys that transformers 5 reads but does not write (older names, optional keys), at values other than
# its defaults; keys that act together are set together
UNWRITTEN_KEYS = [
    ("gpt_neox", dict(rotary_emb_base=25000.0)),
    ("gpt_neox", dict(rotary_pct=0.5)),
    ("gemma3_text", dict(sliding_window_pattern=3)),
    ("gemma3_text", dict(rope_local_base_freq=5000.0)),
    ("deberta-v2", dict(position_buckets=64)),
    ("deberta-v2", dict(share_att_key=True)),
    ("deberta-v2", dict(norm_rel_ebd="layer_norm")),
    ("deberta-v2", dict(pos_att_type="p2c|c2p")),  # deberta-v3-base's string form
    ("modernbert", dict(global_attn_every_n_layers=2)),
    ("modernbert", dict(global_rope_theta=20000.0)),
    ("modernbert", dict(local_rope_theta=500.0)),
    ("falcon", dict(n_embed=284)),
    ("llama", dict(rope_theta=20000.0)),
    ("llama", dict(rope_scaling={"type": "linear", "factor": 2.0})),
    ("phi", dict(partial_rotary_factor=0.25)),
    ("phi", dict(head_dim=32)),  # transformers' Phi, Phi-3 and OLMo 2 read it where config.json has it
    ("phi3", dict(head_dim=48)),
    ("phi3", dict(rope_parameters=dict(rope_type="su", rope_theta=10000.0, short_factor=[1.0] * 48,
                                       long_factor=[2.0] * 48, original_max_position_embeddings=4096))),
    ("olmo2", dict(head_dim=64)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),  # no layer_types yet
    ("t5", dict(n_positions=1024)),  # T5 has no position table: tfcli's cap on the input's length
]
CONTEXT = {"deberta-v2": dict(relative_attention=True)}  # what makes those keys count


@pytest.mark.parametrize("model_type, keys", UNWRITTEN_KEYS, ids=[f"{t}:{','.join(k)}" for t, k in UNWRITTEN_KEYS])
def test_an_older_number_of_the_wrong_kind_is_refused_by_its_name(model_type, keys):
    """An older key that holds a number, given a string (`"rotary_emb_base": "ten thousand"`), is refused in one
    line that names the key, not in the fallback's words about the whole file."""
    for key, value in keys.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            wrong = {"model_type": model_type, **CONTEXT.get(model_type, {}), **keys, key: "ten thousand"}
            with pytest.raises(TfcliError, match=f"^config.json: `{key}` must be ") as refused:
                translated(wrong)
            assert refused.value.hint  # what to write instead: transformers' default, or a number


def test_t5_written_by_transformers_5_reads_512_tokens():
    """transformers 5 writes no n_positions; tfcli then caps a T5 input at the 512 tokens T5 was trained on
    (transformers 4's default n_positions)."""
    assert translated(transformers_defaults("t5"))["max_position_embeddings"] == 512


@pytest.mark.parametrize("model_type, keys", UNWRITTEN_KEYS, ids=[f"{t}:{','.join(k)}" for t, k in UNWRITTEN_KEYS])
def test_keys_transformers_reads_but_does_not_write(model_type, keys):
    """A config.json holding keys that transformers 5 no longer writes (files written before it) gives tfcli the
    config that transformers' own reading of it (written back in today's keys) gives, and not the default one."""
    without = {"model_type": model_type, **CONTEXT.get(model_type, {})}
    values = {**without, **keys}
    # transformers gets a copy: its Phi-3 renames the rope type inside the mapping it is given
    rewritten = json.loads(transformers.AutoConfig.for_model(**copy.deepcopy(values)).to_json_string(use_diff=False))
    assert translated(values) == translated(rewritten)
    assert translated(values) != translated(without)
