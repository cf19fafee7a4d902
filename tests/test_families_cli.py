"""The new encoder and encoder-decoder families through the commands: encode (attention of every kind, the logit
lens, --target), generate (greedy ids equal to transformers' generate on the same tokens), compare, classify;
and a tokenizer tfcli cannot read is refused rather than replaced by the bundled BERT vocabulary (Marian's, which
it reads, is tests/test_marian_tokenizer.py).

The checkpoints are tiny and random, with the bundled BERT vocabulary's size so the bundled tokenizer fits.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

VOCAB = 30522  # the bundled BERT tokenizer's


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def t5_dir(tmp_path, save_hf_model):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    save_hf_model(T5ForConditionalGeneration, config, tmp_path, perturb=True)
    return tmp_path


def test_t5_encode_shows_every_kind_of_attention_and_the_lens(cli, t5_dir):
    (record,) = records(cli("encode", "time flies like an arrow", "--model", str(t5_dir), "--target", "it flies",
                            "--top-k", "2", "--json"))
    assert record["target_tokens"] == ["[PAD]", "it", "flies"]  # T5's decoder starts from the pad token, id 0
    kinds = {(a["kind"], a["layer"]) for a in record["attention"]}
    assert kinds == {(kind, layer) for kind in ("encoder", "decoder", "cross") for layer in (0, 1)}
    assert [row["layer"] for row in record["lens"]] == [0, 1]
    assert all(len(position) == 2 for row in record["lens"] for position in row["top"])
    stages = [s["stage"] for s in record["shapes"]]
    assert "encoder.final_norm.out" in stages and "decoder.final_norm.out" in stages and stages[-1] == "logits"


def test_t5_generate_equals_transformers_and_compare_passes(cli, t5_dir):
    from transformers import T5ForConditionalGeneration

    (record,) = records(cli("generate", "time flies like an arrow", "--model", str(t5_dir), "-n", "6", "--json"))
    hf = T5ForConditionalGeneration.from_pretrained(str(t5_dir)).eval()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([record["prompt_ids"]]), max_new_tokens=6, do_sample=False, num_beams=1)
    assert record["generated_ids"] == expected[0, 1:].tolist()  # without the start token

    (comparison,) = records(cli("compare", str(t5_dir), "time flies like an arrow", "--json"))
    names = {t["name"] for t in comparison["tensors"]}
    assert {"encoder.hidden.2", "decoder.attention.1", "decoder.cross_attention.1", "logits"} <= names
    assert comparison["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("name", ["spiece.model", "sentencepiece.bpe.model", "spm.model"])
def test_a_sentencepiece_only_tokenizer_is_refused_not_replaced(cli, t5_dir, name):
    (t5_dir / name).write_bytes(b"\x0a\x00")  # present: tfcli must not fall back to the bundled vocabulary
    result = cli("encode", "hello", "--model", str(t5_dir))
    assert result.exit_code == 1
    assert f"its tokenizer is {name}, which tfcli does not read" in result.stderr
    assert "save_pretrained" in result.stderr


def test_electra_discriminator_encode_has_a_score_per_token_and_no_lens(cli, tmp_path, save_hf_model):
    """Its embeddings are narrower than the hidden state and it has no MLM head: nothing to unembed through."""
    from transformers import ElectraConfig, ElectraForPreTraining

    config = ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=48)
    save_hf_model(ElectraForPreTraining, config, tmp_path)
    (record,) = records(cli("encode", "time flies like an arrow", "--model", str(tmp_path), "--json"))
    head = record["shapes"][-1]
    assert head["stage"] == "logits" and head["shape"] == [len(record["ids"])]
    assert record["shapes"][0]["shape"] == [len(record["ids"]), 32]  # hidden.0: projected to the hidden size
    assert record["lens"] == [] and len(record["attention"]) == 2


@pytest.mark.parametrize("family", ["albert", "electra"])
def test_classify_reads_the_checkpoint_labels(cli, tmp_path, save_hf_model, family):
    import transformers

    prefix = {"albert": "Albert", "electra": "Electra"}[family]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, id2label={0: "negative", 1: "positive"})
    hf = save_hf_model(getattr(transformers, f"{prefix}ForSequenceClassification"), config, tmp_path, perturb=True)
    (record,) = records(cli("classify", "I loved this film", "--model", str(tmp_path), "--json"))
    assert record["labels"] == ["negative", "positive"]
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([record["ids"]])).logits.softmax(-1)[0]
    assert torch.allclose(torch.tensor(record["probs"]), expected, atol=1e-5)


@pytest.fixture
def deberta_nli(tmp_path, save_hf_model):
    """A tiny DeBERTa-v3-shaped NLI classifier (disentangled attention, log buckets, shared keys)."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    config = DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=48, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=4,
                             max_relative_positions=6, share_att_key=True, norm_rel_ebd="layer_norm",
                             position_biased_input=False, type_vocab_size=0, initializer_range=0.2,
                             id2label={0: "entailment", 1: "neutral", 2: "contradiction"})
    return save_hf_model(DebertaV2ForSequenceClassification, config, tmp_path, perturb=True), tmp_path


def test_deberta_encode_shows_attention_and_lens(cli, deberta_nli):
    _, path = deberta_nli
    (record,) = records(cli("encode", "a man plays a guitar", "--model", str(path), "--json", "--heads", "0,3"))
    assert [(a["layer"], a["head"]) for a in record["attention"]] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    assert [row["layer"] for row in record["lens"]] == [0, 1]  # through the tied token embeddings


def test_deberta_classifies_sentence_pairs_like_transformers(cli, deberta_nli):
    hf, path = deberta_nli
    (record,) = records(cli("classify", "a man plays a guitar", "--pair", "someone makes music", "--model", str(path),
                            "--json"))
    assert record["ids"].count(102) == 2  # [CLS] premise [SEP] hypothesis [SEP]
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([record["ids"]])).logits.softmax(-1)[0]
    assert record["labels"] == ["entailment", "neutral", "contradiction"]
    assert torch.allclose(torch.tensor(record["probs"]), expected, atol=1e-5)


def test_modernbert_encode_and_classify(cli, tmp_path, save_hf_model):
    """Sliding-window layers show attention only within their window; classify reads mean-pooled labels."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
                              eos_token_id=102, bos_token_id=101, cls_token_id=101, sep_token_id=102,
                              classifier_pooling="mean", id2label={0: "negative", 1: "positive"})
    hf = save_hf_model(ModernBertForSequenceClassification, config, tmp_path, perturb=True)
    text = "time flies like an arrow and fruit flies like a banana"
    result = cli("encode", text, "--model", str(tmp_path), "--json", "--save", str(tmp_path / "out.safetensors"))
    (record,) = records(result)
    local = load_file(tmp_path / "out.safetensors")["attention.1"][0]  # layer 1 slides: |query - key| <= 2
    distance = (torch.arange(local.shape[-1])[:, None] - torch.arange(local.shape[-1])[None, :]).abs()
    assert bool((local[:, distance > 2] == 0).all()) and bool((local[:, distance <= 2] > 0).all())
    assert [row["layer"] for row in record["lens"]] == [0, 1]

    (classified,) = records(cli("classify", text, "--model", str(tmp_path), "--json"))
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([classified["ids"]])).logits.softmax(-1)[0]
    assert classified["labels"] == ["negative", "positive"]
    assert torch.allclose(torch.tensor(classified["probs"]), expected, atol=1e-5)


YAMLS = {  # the encoder families' fields, from a YAML config with random weights
    "t5-like": "architecture: encoder-decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
               "head_dim: 6\nintermediate_size: 48\nposition: none\nrelative_attention_num_buckets: 8\nnorm: rmsnorm\n"
               "norm_position: pre\nfinal_norm: true\nembedding_norm: false\nfeed_forward: gated\n"
               "query_pre_attn_scalar: 1\nscale_decoder_outputs: true\nhead: lm\ndecoder_start_token_id: 0\n",
    "albert-like": "hidden_size: 32\nembedding_size: 16\nnum_hidden_layers: 3\nnum_hidden_groups: 1\n"
                   "num_attention_heads: 4\nintermediate_size: 48\nhead: discriminator\n",
    "deberta-like": "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nintermediate_size: 48\n"
                    "position: none\nrelative_attention: true\npos_att_type: [c2p, p2c]\nposition_buckets: 4\n"
                    "max_relative_positions: 8\nshare_att_key: true\nnorm_rel_ebd: true\nhead: mlm\n",
    "modernbert-like": "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nintermediate_size: 48\n"
                       "position: rotary\nnorm_position: pre\nnorm_bias: false\nfirst_block_attention_norm: false\n"
                       "final_norm: true\nfeed_forward: gated\nhead: classifier\nclassifier_pooling: mean\n"
                       "classifier_norm: true\nclassifier_pooler: gelu\nsliding_window: 3\n"
                       "layer_types: [full_attention, sliding_attention]\n",
}


@pytest.mark.parametrize("name", YAMLS)
def test_the_new_fields_work_from_yaml(cli, tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(YAMLS[name], encoding="utf-8")
    (record,) = records(cli("encode", "time flies like an arrow", "--model", str(path), "--json"))
    assert record["weights"] == "random" and record["attention"]
    if name == "t5-like":
        (generated,) = records(cli("generate", "time flies", "--model", str(path), "-n", "3", "--json"))
        assert len(generated["generated_ids"]) == 3
