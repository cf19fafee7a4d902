"""Each bundled config is the stack docs/models.md's table of bundled configs says it is (the seed notebooks'
stacks): its defining settings, as `tfcli config NAME --json` reports them. A config that drifted (post-norm
switched to pre-norm, ReLU to GELU, learned positions to sinusoidal, a label lost) fails here by name."""

from __future__ import annotations

import json

import pytest

from tfcli.sources import bundled_names

BERT_SIZES = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072)

# name -> the settings that define it (docs/models.md, "Bundled configs"; the comment atop each configs/NAME.yaml)
DEFINING = {
    "bert-base": dict(BERT_SIZES, architecture="encoder", num_hidden_layers=12, norm_position="post", norm="layernorm",
                      hidden_act="gelu", position="learned", type_vocab_size=2, embedding_norm=True, head="mlm",
                      vocab_size=30522, max_position_embeddings=512, tie_word_embeddings=True),
    "encoder-postnorm": dict(architecture="encoder", hidden_size=768, num_attention_heads=8, intermediate_size=4 * 768,
                             norm_position="post", hidden_act="relu", position="sinusoidal", type_vocab_size=0),
    "encoder-prenorm": dict(BERT_SIZES, architecture="encoder", num_hidden_layers=12, norm_position="pre",
                            hidden_act="gelu", position="learned", embedding_norm=True, type_vocab_size=0),
    "classifier": dict(BERT_SIZES, architecture="encoder", norm_position="pre", head="classifier",
                       classifier_pooler="none", num_labels=3, labels=["negative", "neutral", "positive"]),
    "encoder-decoder": dict(BERT_SIZES, architecture="encoder-decoder", norm_position="pre", head="lm",
                            decoder_start_token_id=101, eos_token_id=102, tie_word_embeddings=False),
    "gpt2-small": dict(BERT_SIZES, architecture="decoder", num_hidden_layers=12, norm_position="pre",
                       hidden_act="gelu_new", position="learned", final_norm=True, head="lm", tie_word_embeddings=True,
                       max_position_embeddings=1024, vocab_size=30522, eos_token_id=102, type_vocab_size=0),
    "tiny": dict(architecture="encoder", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, head="mlm"),
}


def config_record(cli, *args: str) -> dict:
    result = cli("config", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", sorted(DEFINING))
def test_bundled_config_is_the_stack_it_claims_to_be(cli, name):
    record = config_record(cli, name)
    assert record["source"] == f"bundled config `{name}`" and record["weights"] is None
    config = record["config"]
    wrong = {key: (config[key], value) for key, value in DEFINING[name].items() if config[key] != value}
    assert not wrong, f"{name}: (has, should have) {wrong}"


def test_every_bundled_config_is_described(cli):
    listed = config_record(cli)  # no SRC: the default, bert-base
    assert listed["source"] == "bundled config `bert-base`"
    assert sorted(bundled_names()) == sorted(DEFINING)
