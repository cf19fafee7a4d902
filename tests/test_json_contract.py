"""The JSON Lines records are a contract (docs/commands.md): scripts read these keys, at every level. Each
record type's full key set, including the keys of the objects nested in it, is written out here; changing
one is a deliberate change of docs/commands.md and of this file together."""

from __future__ import annotations

import json

import pytest

ENCODE = {"text", "tokens", "ids", "shapes", "attention", "lens", "weights"}
RANDOM = {"seed"}  # with "weights": "random"
LOADED = {"weights_from"}  # with "weights": "loaded"
ENCODE_SEQ2SEQ = ENCODE | {"target_tokens", "target_ids"}
STAGE = {"stage", "shape", "dtype", "params", "mean", "std", "norm"}
ATTENTION = {"kind", "layer", "head", "max_key", "max_weight", "weights"}
LENS = {"layer", "top"}
LENS_TOKEN = {"token", "id", "prob"}
TOKENIZE = {"text", "tokens", "ids", "type_ids", "attention_mask", "offsets"}
CLASSIFY = {"text", "ids", "labels", "probs", "prediction"}
EXPLAIN = {"layers", "tokens", "weights"}
GENERATE = {"prompt", "ids", "prompt_ids", "generated_ids", "text", "steps"}
STEP = {"step", "id", "token", "prob", "eos", "top"}
STEP_TOKEN = {"id", "token", "prob"}
STEP_LENS = {"layer", "id", "token", "prob"}
CONFIG = {"source", "config", "parameters", "weights"}
COMPARE = {"text", "ids", "tolerance", "max_abs_diff", "matches", "tensors"}
COMPARED_TENSOR = {"name", "shape", "max_abs_diff", "allowed"}
ATTRIBUTE = {"text", "ids", "tokens", "position", "target", "foil", "logit", "total", "components"}
ATTRIBUTE_TOKEN = {"token", "id"}
COMPONENT = {"name", "layer", "head", "neuron", "value"}
PATCH = {"clean", "corrupt", "tokens_clean", "tokens_corrupt", "ids_clean", "ids_corrupt", "position", "target", "foil",
         "clean_value", "corrupt_value", "small_gap", "method", "positions", "grids"}
PATCH_TOKEN = {"token", "id"}

SIZES = "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 2\nintermediate_size: 64\n" \
        "max_position_embeddings: 32\n"
CONFIGS = {
    "encoder": "architecture: encoder\nhead: mlm\n",
    "classifier": "architecture: encoder\nhead: classifier\nlabels: ['no', maybe, 'yes']\n",
    "decoder": "architecture: decoder\nnorm_position: pre\nfinal_norm: true\ntype_vocab_size: 0\nhead: lm\n",
    "seq2seq": "architecture: encoder-decoder\ntype_vocab_size: 0\nhead: lm\ndecoder_start_token_id: 101\n",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    for name, text in CONFIGS.items():
        (root / f"{name}.yaml").write_text(SIZES + text, encoding="utf-8")
    return {name: str(root / f"{name}.yaml") for name in CONFIGS}


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_tokenize_record(cli):
    (plain,) = records(cli("tokenize", "--json", "time flies"))
    assert set(plain) == TOKENIZE
    (paired,) = records(cli("tokenize", "--json", "time flies", "--pair", "like an arrow"))
    assert set(paired) == TOKENIZE | {"pair"}
    assert all(len(paired[key]) == len(paired["ids"]) for key in ("tokens", "type_ids", "attention_mask", "offsets"))


def check_encode_parts(record: dict, top_k: int) -> None:
    for stage in record["shapes"]:
        assert set(stage) == STAGE, stage
    assert record["attention"]
    for amap in record["attention"]:
        assert set(amap) == ATTENTION, amap
        assert len(amap["max_key"]) == len(amap["max_weight"]) == len(amap["weights"])
    assert record["lens"]
    for row in record["lens"]:
        assert set(row) == LENS
        for position in row["top"]:
            assert len(position) == top_k and all(set(token) == LENS_TOKEN for token in position)
    stages, maps = record["shapes"], record["attention"]  # docs/commands.md's rounding of each kind of number
    for values, decimals in [([s["mean"] for s in stages] + [s["std"] for s in stages], 6),
                             ([s["norm"] for s in stages], 4), ([w for a in maps for w in a["max_weight"]], 6),
                             ([w for a in maps for row in a["weights"] for w in row], 4),
                             ([t["prob"] for row in record["lens"] for p in row["top"] for t in p], 6)]:
        assert all(round(value, decimals) == value for value in values), decimals
        assert any(round(value, decimals - 1) != value for value in values), decimals  # not fewer either


def test_encode_record(cli, models):
    (record,) = records(cli("encode", "time flies", "--model", models["encoder"], "--json", "--top-k", "2",
                            "--heads", "0,1"))
    assert set(record) == ENCODE | RANDOM and (record["weights"], record["seed"]) == ("random", 0)
    check_encode_parts(record, top_k=2)
    (paired,) = records(cli("encode", "time flies", "--pair", "like an arrow", "--model", models["encoder"], "--json",
                            "--seed", "7"))
    assert set(paired) == ENCODE | RANDOM | {"pair"} and paired["seed"] == 7
    assert len(record["attention"]) == 4  # 2 layers x 2 heads


def test_encode_record_of_a_checkpoint_says_which_file(cli, tmp_path, save_hf_model):
    """Loaded weights: tfcli cannot tell whether they were trained, so the record says where they come from."""
    from transformers import BertConfig, BertModel

    save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=32), tmp_path)
    (record,) = records(cli("encode", "time flies", "--model", str(tmp_path), "--json"))
    assert set(record) == ENCODE | LOADED
    assert (record["weights"], record["weights_from"]) == ("loaded", str(tmp_path / "model.safetensors"))


def test_encode_record_of_an_encoder_decoder(cli, models):
    (record,) = records(cli("encode", "time flies", "--model", models["seq2seq"], "--target", "le temps",
                            "--json", "--top-k", "1"))
    assert set(record) == ENCODE_SEQ2SEQ | RANDOM
    check_encode_parts(record, top_k=1)
    assert {amap["kind"] for amap in record["attention"]} == {"encoder", "decoder", "cross"}


def test_classify_record(cli, models):
    (record,) = records(cli("classify", "time flies", "--model", models["classifier"], "--json"))
    assert set(record) == CLASSIFY and record["labels"] == ["no", "maybe", "yes"]
    (paired,) = records(cli("classify", "time flies", "--pair", "an arrow", "--model", models["classifier"], "--json"))
    assert set(paired) == CLASSIFY | {"pair"}
    (explained,) = records(cli("classify", "time flies", "--model", models["classifier"], "--json", "--explain"))
    assert set(explained) == CLASSIFY | {"explain"} and set(explained["explain"]) == EXPLAIN


def test_generate_record(cli, models):
    (record,) = records(cli("generate", "time flies", "--model", models["decoder"], "-n", "2", "--json"))
    assert set(record) == GENERATE
    (with_lens,) = records(cli("generate", "time flies", "--model", models["decoder"], "-n", "2", "--json", "--lens"))
    assert set(with_lens) == GENERATE
    for plain, lens in zip(record["steps"], with_lens["steps"], strict=True):
        assert set(plain) == STEP and set(lens) == STEP | {"lens"}
        assert all(set(token) == STEP_TOKEN for token in plain["top"] + lens["top"])
        assert len(lens["lens"]) == 3 and all(set(guess) == STEP_LENS for guess in lens["lens"])


def test_attribute_record(cli, models):
    for by, foil in (("component", []), ("head", ["--foil", "#1996"]), ("neuron", [])):
        (record,) = records(cli("attribute", "time flies", "--model", models["decoder"], "--by", by, *foil, "--json"))
        assert set(record) == ATTRIBUTE and set(record["target"]) == ATTRIBUTE_TOKEN
        assert record["foil"] is None if not foil else set(record["foil"]) == ATTRIBUTE_TOKEN
        assert record["components"] and all(set(c) == COMPONENT for c in record["components"])


def test_patch_record(cli, models):
    for method, extra in (("activation", set()), ("both", {"attribution_grids"})):
        (record,) = records(cli("patch", "time flies like an arrow", "time flies like a banana", "--model",
                                models["decoder"], "--target", "#1996", "--foil", "#2000", "--method", method,
                                "--sites", "resid,heads", "--json"))
        assert set(record) == PATCH | extra and set(record["target"]) == set(record["foil"]) == PATCH_TOKEN
        assert set(record["grids"]) == {"resid", "heads"} and isinstance(record["small_gap"], bool)
    (seq2seq,) = records(cli("patch", "time flies", "time flew", "--model", models["seq2seq"], "--target", "#1996",
                             "--sites", "resid", "--json"))
    assert set(seq2seq) == PATCH | {"decoder_tokens"} and seq2seq["foil"] is None
    assert set(seq2seq["grids"]) == {"encoder.resid", "decoder.resid"}


def test_config_record(cli, models):
    (record,) = records(cli("config", models["decoder"], "--json"))
    assert set(record) == CONFIG
    named = {"architecture", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "max_position_embeddings", "hidden_act", "norm", "norm_position", "position",
             "head", "labels", "eos_token_id"}
    assert named <= set(record["config"])


def test_compare_record(cli, tmp_path, save_hf_model):
    from transformers import BertConfig, BertModel

    save_hf_model(BertModel, BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, max_position_embeddings=32), tmp_path)
    (record,) = records(cli("compare", str(tmp_path), "time flies", "--json"))
    assert set(record) == COMPARE
    assert record["tensors"] and all(set(tensor) == COMPARED_TENSOR for tensor in record["tensors"])
