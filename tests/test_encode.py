"""`tfcli encode`, `tfcli compare`, `tfcli config` and the Python API, through their public interfaces."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import tfcli
from tfcli.cli import app
from conftest import captured_pass

SEED_SENTENCE = "I gave the dog a bone because it was hungry"
TINY_DECODER = "architecture: decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n" \
               "intermediate_size: 64\nnorm_position: pre\nfinal_norm: true\nhead: lm\ntype_vocab_size: 0\n"
TINY_SEQ2SEQ = "architecture: encoder-decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_decoder_layers: 1\n" \
               "num_attention_heads: 4\nintermediate_size: 64\nhead: lm\ndecoder_start_token_id: 101\n"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_seed_sentence_through_bert_base():
    model = tfcli.load_model("bert-base")
    tokenizer = tfcli.load_tokenizer()
    ids = torch.tensor([tokenizer.encode([SEED_SENTENCE])[0].ids])
    with torch.no_grad():
        out = captured_pass(model, ids)
    assert out.last_hidden_state.shape == (1, 12, 768)
    assert len(out.attentions) == 12
    for weights in out.attentions.values():
        assert weights.shape == (1, 12, 12, 12)
        assert torch.allclose(weights.sum(-1), torch.ones(1, 12, 12), atol=1e-5)


def test_encode_json_keys_and_selection():
    result = run("encode", "time flies like an arrow", "--model", "tiny", "--layers", "-1", "--heads", "0,2",
                 "--top-k", "2", "--json")
    (record,) = records(result)
    assert list(record) == ["text", "tokens", "ids", "shapes", "attention", "lens", "weights", "seed"]
    assert record["ids"] == [101, 2051, 10029, 2066, 2019, 8612, 102]
    assert record["weights"] == "random" and record["seed"] == 0
    assert [(a["layer"], a["head"]) for a in record["attention"]] == [(1, 0), (1, 2)]
    assert [row["layer"] for row in record["lens"]] == [1]
    assert all(len(top) == 2 for top in record["lens"][0]["top"])
    stages = [s["stage"] for s in record["shapes"]]
    assert stages[0] == "blocks.0.resid_pre" and stages[-1] == "logits" and "blocks.1.mlp.out" in stages
    assert "random (seed 0)" in result.stderr


def test_random_weights_follow_the_seed():
    first, same, other = (records(run("encode", "hello", "--model", "tiny", "--json", "--seed", s))[0]["shapes"]
                          for s in ("1", "1", "2"))
    assert first == same and first != other


def test_save_writes_design_names_and_never_overwrites(tmp_path):
    path = tmp_path / "run.safetensors"
    assert run("encode", "a b c", "--model", "tiny", "--save", str(path)).exit_code == 0
    tensors = load_file(str(path))
    assert {"input_ids", "hidden.0", "hidden.2", "attention.0", "attention.1", "logits"} <= set(tensors)
    assert tensors["attention.1"].shape == (1, 4, 5, 5)
    again = run("encode", "a b c", "--model", "tiny", "--save", str(path))
    assert again.exit_code == 1 and again.stderr.splitlines()[-2:] == [
        f"error: {path} already exists", "hint: pass --force to overwrite it, or choose another name"]
    assert run("encode", "x", "--model", "tiny", "--save", str(path), "--force").exit_code == 0
    assert load_file(str(path))["input_ids"].shape == (1, 3)


def test_lens_of_last_layer_is_the_model_prediction(tmp_path, save_hf_model):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64)
    hf = save_hf_model(BertForMaskedLM, config, tmp_path)
    (record,) = records(run("encode", "time flies", "--model", str(tmp_path), "--json", "--top-k", "1"))
    assert record["weights"] == "loaded" and record["weights_from"] == str(tmp_path / "model.safetensors")
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([record["ids"]])).logits[0]
    assert [top[0]["id"] for top in record["lens"][-1]["top"]] == logits.argmax(-1).tolist()


def test_decoder_attention_is_causal(tmp_path):
    config = tmp_path / "decoder.yaml"
    config.write_text(TINY_DECODER)
    path = tmp_path / "out.safetensors"
    assert run("encode", "time flies like an arrow", "--model", str(config), "--save", str(path)).exit_code == 0
    weights = load_file(str(path))["attention.0"][0]
    assert torch.all(weights.triu(diagonal=1) == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5)


def test_encoder_decoder_shows_three_kinds_of_attention(tmp_path):
    config = tmp_path / "seq2seq.yaml"
    config.write_text(TINY_SEQ2SEQ)
    path = tmp_path / "out.safetensors"
    result = run("encode", "time flies", "--model", str(config), "--target", "le temps", "--json", "--save", str(path))
    (record,) = records(result)
    assert record["target_ids"][0] == 101
    kinds = {(a["kind"], a["layer"]) for a in record["attention"]}
    assert kinds == {("encoder", 0), ("encoder", 1), ("decoder", 0), ("cross", 0)}
    tensors = load_file(str(path))
    assert {"encoder.hidden.2", "decoder.hidden.1", "decoder.cross_attention.0", "logits"} <= set(tensors)
    assert tensors["decoder.cross_attention.0"].shape[-1] == len(record["ids"])


def test_table_output_shows_every_section():
    result = run("encode", "time flies", "--model", "tiny", "--layers", "0")
    assert result.exit_code == 0
    for title in ("stages", "attention: layer 0, mean of heads", "logit lens", "attends most to"):
        assert title in result.stdout


def test_compare_reports_parity(tmp_path, save_hf_model):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64)
    save_hf_model(BertForMaskedLM, config, tmp_path)
    (record,) = records(run("compare", str(tmp_path), "time flies like an arrow", "--json"))
    names = [t["name"] for t in record["tensors"]]
    assert names == ["hidden.0", "hidden.1", "hidden.2", "attention.0", "attention.1", "logits"]
    assert record["max_abs_diff"] <= 1e-4


def test_compare_needs_weights():
    result = run("compare", "tiny", "hello")
    assert result.exit_code == 1 and "has none" in result.stderr


def test_config_counts_parameters():
    (record,) = records(run("config", "tiny", "--json"))
    model = tfcli.load_model("tiny")
    assert record["parameters"] == sum(p.numel() for p in model.parameters())
    assert record["config"]["hidden_size"] == 64


@pytest.mark.parametrize("name", ["bert-base", "encoder-postnorm", "encoder-prenorm", "classifier",
                                  "encoder-decoder", "gpt2-small", "tiny"])
def test_every_bundled_config_resolves(name):
    (record,) = records(run("config", name, "--json"))
    assert record["parameters"] > 0


def test_compare_on_an_encoder_decoder(tmp_path, save_hf_model):
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=30522, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    save_hf_model(BartForConditionalGeneration, config, tmp_path)
    (record,) = records(run("compare", str(tmp_path), "time flies like an arrow", "--json"))
    names = {t["name"] for t in record["tensors"]}
    assert {"encoder.hidden.2", "decoder.attention.0", "decoder.cross_attention.0", "logits"} <= names
    assert record["max_abs_diff"] <= 1e-4


# ---------------------------------------------------------------- issue 10: options people type, what scripts read


def test_attention_weights_in_json_are_the_saved_maps(tmp_path):
    path = tmp_path / "run.safetensors"
    (record,) = records(run("encode", "time flies like an arrow", "--model", "tiny", "--layers", "-1", "--heads", "1",
                            "--json", "--save", str(path)))
    (attention,) = record["attention"]
    saved = load_file(str(path))["attention.1"][0, 0]  # the one selected head
    weights = torch.tensor(attention["weights"])
    assert weights.shape == (7, 7) and torch.allclose(weights, saved, atol=5e-5)  # rounded to 4 decimals
    assert attention["max_key"] == saved.argmax(-1).tolist()
    assert attention["max_weight"] == pytest.approx(saved.max(-1).values.tolist(), abs=1e-6)


def test_top_k_0_switches_the_lens_off():
    (record,) = records(run("encode", "time flies", "--model", "tiny", "--top-k", "0", "--json"))
    assert record["lens"] == [] and record["attention"]
    table = run("encode", "time flies", "--model", "tiny", "--top-k", "0")
    assert table.exit_code == 0 and "logit lens" not in table.stdout and "predicts" not in table.stdout


@pytest.mark.slow  # a lens over the whole vocabulary: 4 MB of JSON
def test_top_k_as_large_as_the_vocabulary_lists_every_token():
    """--top-k up to the vocabulary size is allowed (one more is a usage error: test_bad_input.py): each position
    then lists every token once, most probable first, the probabilities adding up to 1."""
    (record,) = records(run("encode", "hi", "--model", "tiny", "--top-k", "30522", "--layers", "-1", "--json"))
    for position in record["lens"][0]["top"]:
        assert sorted(token["id"] for token in position) == list(range(30522))
        probs = [token["prob"] for token in position]
        assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize("spec, layers", [("0-1", [0, 1]), ("-1-", [1]), ("1-", [1]), ("-2--1", [0, 1]),
                                          ("all", [0, 1]), ("1,0", [0, 1]), ("0", [0]), (" 1, 0 ", [0, 1]),
                                          ("--2", [0]), ("--1", [0, 1])])
def test_layers_take_ranges(spec, layers):
    """Spaces are ignored; an open start (`--2`: up to the second-last) starts at 0."""
    (record,) = records(run("encode", "hi", "--model", "tiny", f"--layers={spec}", "--json"))
    assert sorted({a["layer"] for a in record["attention"]}) == layers == [row["layer"] for row in record["lens"]]


def test_heads_take_ranges():
    (record,) = records(run("encode", "hi", "--model", "tiny", "--layers", "0", "--heads", "1-2", "--json"))
    assert [a["head"] for a in record["attention"]] == [1, 2]


def test_reversed_range_is_a_usage_error():
    result = run("encode", "hi", "--model", "tiny", "--layers", "1-0")
    assert result.exit_code == 2 and "--layers: the range `1-0` is empty (1 comes after 0)" in result.stderr
    assert "hint: for example 0,-1 or 8-11 or -3- (the last three) or all; the model has 2 layers (0 to 1)" \
        in result.stderr


def test_pair_and_max_length():
    (record,) = records(run("encode", "time flies", "--pair", "fruit flies", "--model", "tiny", "--json"))
    assert list(record)[:4] == ["text", "pair", "tokens", "ids"] and record["pair"] == "fruit flies"
    assert record["tokens"] == ["[CLS]", "time", "flies", "[SEP]", "fruit", "flies", "[SEP]"]
    short = run("encode", "time flies like an arrow", "--max-length", "4", "--model", "tiny", "--json")
    (record,) = records(short)
    assert record["tokens"] == ["[CLS]", "time", "flies", "[SEP]"]
    assert "text 1 truncated from 7 to 4 tokens" in short.stderr
    refused = run("encode", "time flies like an arrow", "--max-length", "4", "--no-truncate", "--model", "tiny")
    assert refused.exit_code == 2 and "text 1 has 7 tokens, more than --max-length 4" in refused.stderr


def test_save_stores_where_its_tensors_came_from(tmp_path):
    from safetensors import safe_open

    path = tmp_path / "run.safetensors"
    assert run("encode", "time flies", "hello", "--model", "tiny", "--seed", "3", "--save", str(path)).exit_code == 0
    with safe_open(str(path), "pt") as saved:
        metadata = saved.metadata()
    assert metadata["tfcli_version"] == tfcli.__version__
    assert json.loads(metadata["texts"]) == ["time flies", "hello"]
    assert json.loads(metadata["tokens"]) == [["[CLS]", "time", "flies", "[SEP]"], ["[CLS]", "hello", "[SEP]"]]
    assert "tiny" in metadata["model"] and metadata["weights"].startswith("random (seed 3)")
    assert set(metadata) == {"tfcli_version", "model", "weights", "texts", "tokens"}  # no pairs, no target here


def test_save_stores_the_pairs_as_written(tmp_path):
    """With --pair, `pairs` holds each row's second text; the header keeps non-ASCII text as UTF-8, so that
    it reads as typed in the file itself (`head -c`), not as \\u escapes."""
    from safetensors import safe_open

    path = tmp_path / "run.safetensors"
    args = ("encode", "café au lait", "東京", "--pair", "crème brûlée", "--model", "tiny", "--save", str(path))
    assert run(*args).exit_code == 0
    with safe_open(str(path), "pt") as saved:
        metadata = saved.metadata()
    assert json.loads(metadata["pairs"]) == ["crème brûlée", "crème brûlée"]
    assert json.loads(metadata["tokens"])[1][:3] == ["[CLS]", "東", "京"]
    raw = path.read_bytes()
    header = raw[8:8 + int.from_bytes(raw[:8], "little")].decode("utf-8")  # safetensors: length, then JSON
    for written in ("café au lait", "crème brûlée", '\\"東\\"'):
        assert written in header, header
    assert "\\u" not in header


def test_save_name_must_be_safetensors_a_usage_error(tmp_path):
    result = run("encode", "hi", "--model", "tiny", "--save", str(tmp_path / "out.npz"))
    assert result.exit_code == 2 and "must end in .safetensors" in result.stderr
    assert result.stderr.splitlines()[-1] == "hint: for example --save out.safetensors"


def test_compare_reads_texts_from_stdin_and_takes_model_as_an_option(tmp_path, save_hf_model):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64)
    save_hf_model(BertForMaskedLM, config, tmp_path)
    result = CliRunner().invoke(app, ["compare", "--model", str(tmp_path), "--json", "-"], input="time flies\n\nhello\n")
    assert [r["text"] for r in records(result)] == ["time flies", "hello"]
    assert "line 2 of stdin is empty: skipped" in result.stderr
    positional = records(run("compare", str(tmp_path), "time flies", "--json"))
    assert positional[0]["tensors"] == records(result)[0]["tensors"]
    empty = run("compare", str(tmp_path), "")
    assert empty.exit_code == 2 and "text 1 is empty" in empty.stderr
    assert run("compare", str(tmp_path)).exit_code == 2  # no text


def test_config_takes_model_as_an_option_too():
    assert records(run("config", "--model", "tiny", "--json")) == records(run("config", "tiny", "--json"))
    both = run("config", "tiny", "--model", "tiny")
    assert both.exit_code == 2 and "not both" in both.stderr
