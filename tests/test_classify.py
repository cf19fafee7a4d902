"""`tfcli classify`: probabilities that match transformers, batched or alone; --top, --explain, errors."""

from __future__ import annotations

import json

import pytest
import torch

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["I loved this film", "terrible, awful acting and a plot that goes nowhere at all", "ok"]


def _config(kind: str):
    import transformers

    if kind == "distilbert":
        return transformers.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                             max_position_embeddings=64, id2label=LABELS)
    if kind == "roberta":
        return transformers.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, max_position_embeddings=66, type_vocab_size=1,
                                          vocab_size=30522, id2label=LABELS)
    return transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, id2label=LABELS)


CLASSES = {"bert": "BertForSequenceClassification", "distilbert": "DistilBertForSequenceClassification",
           "roberta": "RobertaForSequenceClassification"}


@pytest.fixture(scope="module", params=list(CLASSES))
def checkpoint(request, tmp_path_factory, save_hf_model):
    """A tiny random classifier saved by transformers with id2label set (bundled BERT vocabulary)."""
    import transformers

    path = tmp_path_factory.mktemp(request.param)
    hf = save_hf_model(getattr(transformers, CLASSES[request.param]), _config(request.param), path)
    return path, hf


@pytest.fixture(scope="module")
def bert_checkpoint(tmp_path_factory, save_hf_model):
    import transformers

    path = tmp_path_factory.mktemp("bert")
    return path, save_hf_model(transformers.BertForSequenceClassification, _config("bert"), path)


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def hf_probs(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits.softmax(-1)[0]


def test_probabilities_match_transformers_batched_and_alone(cli, checkpoint, assert_close):
    path, hf = checkpoint
    batched = records(cli("classify", *TEXTS, "--model", str(path), "--json"))
    alone = [records(cli("classify", text, "--model", str(path), "--json"))[0] for text in TEXTS]
    assert [r["text"] for r in batched] == TEXTS
    for together, single in zip(batched, alone):
        assert list(together) == ["text", "ids", "labels", "probs", "prediction"]
        assert together["labels"] == ["negative", "neutral", "positive"]
        assert together["ids"] == single["ids"]
        theirs = hf_probs(hf, together["ids"])
        assert_close("batched probs", torch.tensor(together["probs"]), theirs, 1e-5)
        assert_close("alone probs", torch.tensor(single["probs"]), theirs, 1e-5)
        assert together["prediction"] == LABELS[int(theirs.argmax())]


def test_explain_is_the_first_tokens_last_layer_attention(cli, bert_checkpoint, assert_close):
    path, hf = bert_checkpoint
    record = records(cli("classify", *TEXTS[:2], "--model", str(path), "--json", "--explain"))[1]
    explain = record["explain"]
    assert explain["layers"] == [1] and len(explain["tokens"]) == len(explain["weights"]) == len(record["ids"])
    assert explain["tokens"][0] == "[CLS]"
    with torch.no_grad():
        attention = hf(input_ids=torch.tensor([record["ids"]]), output_attentions=True).attentions[-1]
    assert_close("explain", torch.tensor(explain["weights"]), attention[0, :, 0, :].mean(0), 1e-5)
    both = records(cli("classify", TEXTS[0], "--model", str(path), "--json", "--explain", "--explain-layers", "2"))
    assert both[0]["explain"]["layers"] == [0, 1]
    assert sum(both[0]["explain"]["weights"]) == pytest.approx(1.0, abs=1e-5)


def test_table_top_and_explain(cli, bert_checkpoint):
    path, _ = bert_checkpoint
    full = cli("classify", "good movie", "--model", str(path))
    assert full.exit_code == 0
    assert all(label in full.stdout for label in LABELS.values()) and "prediction" in full.stdout
    assert "weights: loaded from" in full.stderr
    top = cli("classify", "good movie", "--model", str(path), "--top", "1")
    prediction = records(cli("classify", "good movie", "--model", str(path), "--json"))[0]["prediction"]
    shown = [label for label in LABELS.values() if any(line.startswith(label) for line in top.stdout.splitlines())]
    assert shown == [prediction]
    explained = cli("classify", "good movie", "--model", str(path), "--explain")
    assert "why: first token's attention in layer 1" in explained.stdout
    assert "[CLS] good movie [SEP]" in explained.stdout
    assert "scale:" in explained.stdout and "most attended: " in explained.stdout
    assert cli("classify", "x", "--model", str(path), "--top", "0").exit_code == 2


def test_stdin_and_file(cli, bert_checkpoint, tmp_path):
    path, _ = bert_checkpoint
    from_args = records(cli("classify", "one", "two three", "--model", str(path), "--json"))
    from_stdin = records(cli("classify", "-", "--model", str(path), "--json", input="one\ntwo three\n"))
    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo three\n")
    from_file = records(cli("classify", "--file", str(texts), "--model", str(path), "--json"))
    assert from_args == from_stdin == from_file


@pytest.mark.slow
def test_bundled_classifier_works_out_of_the_box(cli):
    result = cli("classify", "hello world", "--json", "--seed", "3")
    (record,) = records(result)
    assert record["labels"] == ["negative", "neutral", "positive"]
    assert sum(record["probs"]) == pytest.approx(1.0, abs=1e-5)
    assert "random (seed 3)" in result.stderr and "classifier" in result.stderr


def test_model_without_classification_head_is_a_clear_error(cli, tmp_path):
    config = tmp_path / "plain.yaml"
    config.write_text("hidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\nintermediate_size: 64\n"
                      "head: mlm\n")
    result = cli("classify", "hello", "--model", str(config), env={"TFCLI_DEBUG": ""})
    assert result.exit_code == 2  # a usage error, as for `generate` on a model without an LM head
    assert result.stdout == ""
    assert result.stderr.startswith("error: plain has no classification head: it has a `mlm` head\nhint: ")
    assert "Traceback" not in result.stderr


def test_pair_is_the_second_segment_and_max_length_truncates(cli, bert_checkpoint):
    path, hf = bert_checkpoint
    (record,) = records(cli("classify", "a man eats", "--pair", "someone eats", "--model", str(path), "--json"))
    assert list(record)[:3] == ["text", "pair", "ids"] and record["pair"] == "someone eats"
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor([record["ids"]]),
                    token_type_ids=torch.tensor([[0] * 5 + [1] * 3])).logits.softmax(-1)[0]
    assert record["ids"][4] == 102 and torch.allclose(torch.tensor(record["probs"]), theirs, atol=1e-5)
    short = cli("classify", "a man eats bread", "--max-length", "3", "--model", str(path), "--json")
    assert len(records(short)[0]["ids"]) == 3 and "text 1 truncated from 6 to 3 tokens" in short.stderr


def test_explain_layers_are_checked_before_the_model_loads(cli, bert_checkpoint):
    path, _ = bert_checkpoint
    too_many = cli("classify", "x", "--model", str(path), "--explain", "--explain-layers", "9")
    assert too_many.exit_code == 2 and "--explain-layers must be between 1 and the model's 2 layers, got 9" \
        in too_many.stderr
    assert "model:" not in too_many.stderr  # refused before any model was built
    alone = cli("classify", "x", "--model", str(path), "--explain-layers", "2")
    assert alone.exit_code == 2 and "--explain-layers goes with --explain" in alone.stderr
