"""Marian's opus-mt tokenizer (source.spm, target.spm, vocab.json) against transformers' MarianTokenizer, and a
tiny MarianMTModel run through the commands with it: tokenize, encode --target, generate.

The SentencePiece models are trained inside the test (sentencepiece's trainer, about 0.1 s) on a few English
(source) and German (target) sentences; vocab.json numbers the pieces of both, with Marian's special tokens and
two `>>lang<<` codes, as the opus-mt repositories do.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings

import pytest
import torch

sentencepiece = pytest.importorskip("sentencepiece")

SOURCE = ["The quick brown fox jumps over the lazy dog.", "I am a small frog.", "Where is the train station?",
          "Tom asked his teacher for advice.", "Café crème, s'il vous plaît!", "A naïve résumé of the day."]
TARGET = ["Der schnelle braune Fuchs springt über den faulen Hund.", "Ich bin ein kleiner Frosch.",
          "Wo ist der Bahnhof?", "Tom bat seinen Lehrer um Rat.", "Schöne Grüße aus München."]
TEXTS = ["The quick fox", "Café crème über", ">>de<< Where is the frog?", "xyz QQQ 漢字 jumps",
         "hello </s> world <pad>", "  spaces  here ", ">>fr<<no space", "Tom >>de<< mid", ""]


def train_spm(sentences: list[str]) -> bytes:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(sentences * 3), model_writer=model,
                                             vocab_size=60, hard_vocab_limit=False, character_coverage=1.0,
                                             minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory, save_hf_model):
    """A tiny random MarianMTModel (2 + 2 layers, 32 wide) with an opus-mt-style tokenizer of about 110 pieces."""
    from transformers import MarianConfig, MarianMTModel

    directory = tmp_path_factory.mktemp("marian")
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2, ">>fr<<": 3}
    for name, sentences in (("source.spm", SOURCE), ("target.spm", TARGET)):
        (directory / name).write_bytes(train_spm(sentences))
        model = sentencepiece.SentencePieceProcessor(model_file=str(directory / name))
        for i in range(model.get_piece_size()):
            if not (model.is_control(i) or model.is_unknown(i)):
                vocab.setdefault(model.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text('{"source_lang": "en", "target_lang": "de"}', encoding="utf-8")
    config = MarianConfig(vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                          max_position_embeddings=64, pad_token_id=vocab["<pad>"], eos_token_id=0,
                          decoder_start_token_id=vocab["<pad>"], forced_eos_token_id=0, scale_embedding=True,
                          activation_function="swish")
    save_hf_model(MarianMTModel, config, directory, perturb=True)
    return directory


@pytest.fixture(scope="module")
def hf_tokenizer(marian_dir):
    from transformers import MarianTokenizer

    with warnings.catch_warnings():  # "sacremoses is missing": its optional normalizer, which tokenizing never uses
        warnings.simplefilter("ignore")
        return MarianTokenizer.from_pretrained(str(marian_dir))


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_ids_and_decoding_equal_transformers(marian_dir, hf_tokenizer):
    import tfcli

    tokenizer = tfcli.load_tokenizer(str(marian_dir))
    assert tokenizer.vocab_size == len(hf_tokenizer)
    for text, encoding in zip(TEXTS, tokenizer.encode(TEXTS)):
        expected = hf_tokenizer(text).input_ids
        assert encoding.ids == expected, text
        assert tokenizer.target_ids(text) == hf_tokenizer(text_target=text).input_ids[:-1], text  # target.spm
        for ids in (expected, hf_tokenizer(text_target=text).input_ids):
            for skip in (True, False):
                assert tokenizer.decode(ids, skip_special_tokens=skip) == hf_tokenizer.decode(
                    ids, skip_special_tokens=skip), (text, skip)
    unk = hf_tokenizer.unk_token_id
    assert tokenizer.encode(["xyz QQQ"])[0].ids[-2:] == [unk, hf_tokenizer.eos_token_id]  # a piece vocab.json lacks
    assert tokenizer.encode([">>de<< x"])[0].tokens[0] == ">>de<<"


def test_clean_up_tokenization_spaces_as_transformers(marian_dir, hf_tokenizer, tmp_path):
    from transformers import MarianTokenizer

    import tfcli

    for name in ("source.spm", "target.spm", "vocab.json"):
        (tmp_path / name).write_bytes((marian_dir / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"clean_up_tokenization_spaces": true}', encoding="utf-8")
    ids = hf_tokenizer("Where is the frog ? I am , here .").input_ids
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = MarianTokenizer.from_pretrained(str(tmp_path)).decode(ids, skip_special_tokens=True)
    assert expected == "Where is the frog? I am, here."  # the setting is on: the spaces went
    assert tfcli.load_tokenizer(str(tmp_path)).decode(ids) == expected


def test_tokenize_command(cli, marian_dir, hf_tokenizer):
    texts = ["Café crème über", ">>de<< Where is the frog?", "xyz QQQ 漢字 jumps"]
    for text, record in zip(texts, records(cli("tokenize", "--model", str(marian_dir), "--json", *texts))):
        assert record["ids"] == hf_tokenizer(text).input_ids
        assert record["tokens"] == hf_tokenizer.convert_ids_to_tokens(record["ids"])
        # each span is the text of the piece it came from (an unknown piece's too: QQQ, 漢字); </s> has none
        spans = [text[start:end].strip() for start, end in record["offsets"]]
        assert spans == [piece.replace("\u2581", " ").strip() for piece in hf_tokenizer.tokenize(text)] + [""]
    (record,) = records(cli("tokenize", "--model", str(marian_dir), "--json", "--max-length", "5", texts[0]))
    assert record["ids"] == hf_tokenizer(texts[0], truncation=True, max_length=5).input_ids  # </s> stays last


def test_encode_reads_the_target_with_target_spm(cli, marian_dir, hf_tokenizer):
    (record,) = records(cli("encode", "Where is the frog?", "--model", str(marian_dir), "--target",
                            "Wo ist der Frosch?", "--json"))
    assert record["ids"] == hf_tokenizer("Where is the frog?").input_ids
    start = hf_tokenizer.pad_token_id  # Marian's decoder starts from <pad>
    assert record["target_ids"] == [start] + hf_tokenizer(text_target="Wo ist der Frosch?").input_ids[:-1]
    assert record["target_tokens"][0] == "<pad>"


@pytest.mark.parametrize("text", [">>de<< Where is the café?", "The lazy dog, über QQQ."])
def test_generate_equals_transformers(cli, marian_dir, hf_tokenizer, text):
    from transformers import MarianMTModel

    (record,) = records(cli("generate", text, "--model", str(marian_dir), "-n", "8", "--json"))
    inputs = hf_tokenizer([text], return_tensors="pt")
    assert record["prompt_ids"] == inputs.input_ids[0].tolist()
    hf = MarianMTModel.from_pretrained(str(marian_dir)).eval()
    with torch.no_grad():
        expected = hf.generate(**inputs, max_new_tokens=8, do_sample=False, num_beams=1)
    assert record["generated_ids"] == expected[0, 1:].tolist()  # without the start token
    assert record["text"] == hf_tokenizer.batch_decode(expected, skip_special_tokens=True)[0]
    assert record["text"].strip()  # some text was made: the comparison above is not between two empty strings


def test_without_sentencepiece_one_line_and_the_install_hint(cli, marian_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # `import sentencepiece` now fails
    result = cli("tokenize", "--model", str(marian_dir), "hello")
    assert result.exit_code == 1
    assert result.stderr == (f"error: {marian_dir} has a Marian tokenizer (source.spm, target.spm, vocab.json), "
                             "which needs the sentencepiece package\nhint: pip install sentencepiece\n")


def test_other_tokenizers_do_not_import_sentencepiece():
    code = "import sys, tfcli; tfcli.load_tokenizer().encode(['hi']); assert 'sentencepiece' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("broken", ["no target.spm", "no vocab.json", "vocab.json without <unk>",
                                    "separate vocabularies", "corrupt source.spm", "a pair"])
def test_a_broken_or_unsupported_marian_tokenizer_is_a_clear_error(cli, marian_dir, tmp_path, broken):
    for name in ("source.spm", "target.spm", "vocab.json", "config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((marian_dir / name).read_bytes())
    args = ["tokenize", "--model", str(tmp_path), "hello"]
    if broken.startswith("no "):
        (tmp_path / broken[3:]).unlink()
    elif broken == "vocab.json without <unk>":
        vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
        (tmp_path / "vocab.json").write_text(json.dumps({k: v for k, v in vocab.items() if k != "<unk>"}))
    elif broken == "separate vocabularies":
        (tmp_path / "tokenizer_config.json").write_text('{"separate_vocabs": true}', encoding="utf-8")
    elif broken == "corrupt source.spm":
        (tmp_path / "source.spm").write_bytes(b"\x0a\x00")
    else:
        args += ["--pair", "world"]
    result = cli(*args)
    expected = {"no target.spm": "missing: target.spm", "no vocab.json": "missing: vocab.json",
                "vocab.json without <unk>": "vocab.json has no <unk> token",
                "separate vocabularies": "`separate_vocabs: true` (a target_vocab.json of its own) is not supported",
                "corrupt source.spm": f"cannot load the tokenizer in {tmp_path}",
                "a pair": "a Marian translation model reads one text, not a pair"}[broken]
    assert result.exit_code == (2 if broken == "a pair" else 1)
    assert expected in result.stderr.splitlines()[0]
    assert result.stderr.splitlines()[1].startswith("hint: ")
