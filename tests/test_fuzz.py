"""Fuzzing with Hypothesis: random configs within and just outside the valid ranges build and run a
forward pass, or fail with a clean TfcliError (never another exception); random unicode text goes
through tokenize and encode (tiny config) without surprises."""

from __future__ import annotations

import functools
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfcli.errors import TfcliError
from conftest import captured_pass

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


def configs(outside: bool) -> st.SearchStrategy[dict]:
    """Config values in the valid ranges, or (outside=True) also just outside them: one below the
    minimum, two below, one above the range tried; an unknown choice; NaN, infinity, zero, negatives."""

    def ints(low: int, high: int) -> st.SearchStrategy[int]:
        return st.integers(low - 2, high + 1) if outside else st.integers(low, high)

    def choice(*values: str) -> st.SearchStrategy[str]:
        return st.sampled_from([*values, "bogus", ""] if outside else values)

    def probability() -> st.SearchStrategy[float]:
        return floats if outside else st.floats(0, 0.9)

    def positive() -> st.SearchStrategy[float]:
        return floats if outside else st.floats(1e-12, 1e5)

    return st.fixed_dictionaries(
        {
            "hidden_size": st.sampled_from([4, 8, 12, 16]) if not outside else ints(1, 16),
            "num_hidden_layers": ints(1, 2),
            "num_attention_heads": st.sampled_from([1, 2, 4]) if not outside else ints(1, 4),
            "intermediate_size": ints(1, 16),
            "vocab_size": ints(41, 50),  # above every token id the options below may name
            "max_position_embeddings": ints(1, 6),
        },
        optional={
            "architecture": choice("encoder", "decoder", "encoder-decoder"),
            "num_decoder_layers": st.one_of(st.none(), ints(1, 2)),
            "num_key_value_heads": st.one_of(st.none(), st.just(1) if not outside else ints(1, 4)),
            "type_vocab_size": ints(0, 2),
            "hidden_act": choice("relu", "gelu", "gelu_new", "silu"),
            "norm": choice("layernorm", "rmsnorm"),
            "norm_position": choice("pre", "post"),
            "position": choice("learned", "sinusoidal", "rotary"),
            "position_offset": ints(0, 2),
            "feed_forward": choice("mlp", "gated"),
            "head": choice("none", "mlm", "lm", "classifier"),
            "classifier_pooler": choice("none", "tanh", "relu"),
            "layer_norm_eps": positive(),
            "rope_theta": positive(),
            "hidden_dropout_prob": probability(),
            "final_norm": st.booleans(),
            "embedding_norm": st.booleans() if not outside else st.one_of(st.booleans(), st.just(1)),
            "scale_embedding": st.booleans(),
            "tie_word_embeddings": st.booleans(),
            "lm_head_bias": st.booleans(),
            "pad_token_id": st.one_of(st.none(), ints(0, 40)),
            "decoder_start_token_id": st.one_of(st.none(), ints(0, 40)),
        },
    )


floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1e-12, 1e-12, 0.5, 1.0]))
CONFIGS = st.one_of(configs(outside=False), configs(outside=True))


@FAST
@given(values=CONFIGS, length=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_random_configs_run_or_fail_cleanly(values, length, seed):
    import torch

    from tfcli.api import build_model
    from tfcli.config import from_dict
    from tfcli.sources import Source

    try:
        config = from_dict(values, origin="fuzz")
        model = build_model(Source(config, None, None, "fuzz"), seed=seed)
    except TfcliError as e:
        assert e.message and "\n" not in e.message
        return
    length = min(length, config.max_position_embeddings)
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, length - 1:] = 0 if length > 1 else 1  # a padded row too
    kwargs = {"decoder_input_ids": ids[:, :1]} if config.architecture == "encoder-decoder" else {}
    with torch.no_grad():
        out = captured_pass(model, ids, attention_mask=mask, **kwargs)
    queries = 1 if config.architecture == "encoder-decoder" else length
    assert out.last_hidden_state.shape == (2, queries, config.hidden_size)
    assert torch.isfinite(out.last_hidden_state).all()
    assert len(out.hidden_states) == len(model.output_stack.blocks) + 1
    for layer, weights in out.attentions.items():
        assert weights.shape[:3] == (2, config.num_attention_heads, queries)
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-5)
    if config.head in ("mlm", "lm"):
        assert out.logits.shape == (2, queries, config.vocab_size)
        lens = model.unembed(out.hidden_states[1])
        assert lens.shape == (2, queries, config.vocab_size) and torch.isfinite(lens).all()
    elif config.head == "classifier":
        assert out.logits.shape == (2, config.num_labels)


@functools.lru_cache(maxsize=None)
def tiny_model():
    from tfcli.api import build_model
    from tfcli.config import from_dict
    from tfcli.sources import Source
    from tfcli.tokenizer.loading import load_tokenizer

    config = from_dict({"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                        "max_position_embeddings": 16, "head": "mlm"}, origin="tiny")
    return build_model(Source(config, None, None, "tiny")), load_tokenizer()


texts = st.text(st.characters(codec="utf-8"), max_size=80)


@FAST
@given(batch=st.lists(texts, min_size=1, max_size=4), max_length=st.one_of(st.none(), st.integers(3, 12)))
def test_random_unicode_through_tokenize(batch, max_length):
    _, tokenizer = tiny_model()
    for text, encoding in zip(batch, tokenizer.encode(batch, max_length=max_length)):
        assert encoding.text == text
        n = len(encoding.ids)
        assert len(encoding.tokens) == len(encoding.type_ids) == len(encoding.attention_mask) == len(encoding.offsets) == n
        assert max_length is None or n <= max_length
        assert encoding.truncated == (encoding.untruncated_length > n)
        for (start, end), sequence in zip(encoding.offsets, encoding.sequence_ids):
            assert 0 <= start <= end <= len(text) or sequence is None
        json.dumps(encoding.tokens, ensure_ascii=False).encode("utf-8")  # every token is printable as JSON


@FAST
@given(text=texts, max_length=st.integers(3, 12))
def test_truncation_matches_the_backend(text, max_length):
    """tfcli re-encodes only a cut prefix of a long text; the result equals the library's own truncation. (A
    max_length of 2 or less, BERT's two special tokens and no room for the text, is refused: test_first_day.py.)"""
    _, tokenizer = tiny_model()
    ours = tokenizer.encode([text], max_length=max_length)[0]
    backend = tokenizer.backend
    backend.enable_truncation(max_length)
    try:
        reference = backend.encode(text)
    finally:
        backend.no_truncation()
    assert ours.ids == reference.ids
    assert ours.offsets == [list(o) for o in reference.offsets]


@FAST
@given(batch=st.lists(texts.filter(str.strip), min_size=1, max_size=3))
def test_random_unicode_through_encode(batch):
    from tfcli.commands.encode import core as encode
    from tfcli.commands.encode.render import record as json_record

    model, tokenizer = tiny_model()
    options = encode.EncodeOptions(top_k=2)
    encodings = tokenizer.encode(batch, max_length=model.config.max_position_embeddings)
    out, _ = encode.encode_batch(model, tokenizer, encodings, None, options)
    for row, encoding in enumerate(encodings):
        record = json_record(encode.text_report(model, out, row, encoding, None, options, tokenizer), False)
        assert record["text"] == batch[row] and record["ids"] == encoding.ids
        assert all(math.isfinite(stage["std"]) for stage in record["shapes"])
        assert [len(position) for position in record["lens"][0]["top"]] == [2] * len(encoding.ids)
        # what --json prints is strict JSON (no NaN or infinity) that reads back as the very same record
        line = json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")
        assert json.loads(line) == record


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts.filter(lambda t: t.strip() and t != "-" and "\n" not in t and "\r" not in t))
def test_random_unicode_through_the_cli(cli, text):
    result = cli("tokenize", "--json", "--", text)  # `--`: a text may start with a dash; `-` alone is stdin
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["text"] == text


@pytest.mark.parametrize("text", ["\x00", "\u202e\u200b\ufeff", "🧑‍🚀" * 50, "\u0301" * 30, "a\u00a0b", "\U0010ffff"])
def test_awkward_characters_through_encode(cli, tiny_config, text):
    result = cli("encode", "--model", str(tiny_config), "--json", text)
    if text.strip():
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["text"] == text
    else:
        assert result.exit_code == 2 and "error: text 1 is" in result.stderr
