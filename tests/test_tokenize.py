"""`tfcli tokenize` and `tfcli.tokenizer`."""

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcli.tokenizer.loading import BUNDLED_NAME, load_tokenizer

SEED_TEXT = "time flies like an arrow"
SEED_IDS = [101, 2051, 10029, 2066, 2019, 8612, 102]
TOKENIZE_KEYS = ["text", "tokens", "ids", "type_ids", "attention_mask", "offsets"]


def records(result):
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def bundled():
    return load_tokenizer()


def test_seed_text_ids_and_keys(cli):
    [record] = records(cli("tokenize", "--json", SEED_TEXT))
    assert list(record) == TOKENIZE_KEYS
    assert record["ids"] == SEED_IDS
    assert record["tokens"] == ["[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]"]
    assert record["offsets"][1:-1] == [[0, 4], [5, 10], [11, 15], [16, 18], [19, 24]]
    assert record["attention_mask"] == [1] * 7


def test_table_output(cli):
    result = cli("tokenize", SEED_TEXT)
    assert result.exit_code == 0
    for token in ("[CLS]", "flies", "10029", "5:10", "'arrow'"):
        assert token in result.stdout
    assert "\x1b[" not in result.stdout


def test_stdin_dash_one_text_per_line(cli):
    out = records(cli("tokenize", "--json", "-", input=b"time flies like an arrow\r\nhello\n"))
    assert [r["text"] for r in out] == [SEED_TEXT, "hello"]
    assert out[0]["ids"] == SEED_IDS


def test_file(cli, tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text(f"{SEED_TEXT}\nsecond line\n", encoding="utf-8")
    out = records(cli("tokenize", "--json", "--file", str(path)))
    assert [r["text"] for r in out] == [SEED_TEXT, "second line"]


def test_pair_with_each_text(cli):
    out = records(cli("tokenize", "--json", "--pair", "fruit flies", "a", "b c"))
    assert [r["pair"] for r in out] == ["fruit flies", "fruit flies"]
    assert list(out[0]) == ["text", "pair", *TOKENIZE_KEYS[1:]]
    assert out[0]["tokens"] == ["[CLS]", "a", "[SEP]", "fruit", "flies", "[SEP]"]
    assert out[0]["type_ids"] == [0, 0, 0, 1, 1, 1]
    assert out[1]["type_ids"] == [0, 0, 0, 0, 1, 1, 1]


def test_no_special(cli):
    [record] = records(cli("tokenize", "--json", "--no-special", SEED_TEXT))
    assert record["ids"] == SEED_IDS[1:-1]


def test_truncation_warns_on_stderr(cli):
    result = cli("tokenize", "--json", "--max-length", "4", SEED_TEXT, "hi")
    out = records(result)
    assert out[0]["ids"] == [101, 2051, 10029, 102]
    assert "warning: text 1 truncated from 7 to 4 tokens" in result.stderr
    assert "text 2" not in result.stderr


@pytest.mark.parametrize("max_length", ["0", "-3", "1"])
def test_max_length_too_small_is_usage_error(cli, max_length):
    result = cli("tokenize", "--max-length", max_length, SEED_TEXT)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --max-length")


def test_empty_text_gives_special_tokens(cli):
    [record] = records(cli("tokenize", "--json", ""))
    assert record["tokens"] == ["[CLS]", "[SEP]"]


def test_non_utf8_stdin(tfcli_process):
    result = tfcli_process("tokenize", "-", input=b"fine\ncaf\xe9\n")
    assert result.returncode == 1
    assert b"Traceback" not in result.stderr
    assert b"error: stdin is not valid UTF-8: line 2, byte offset 8" in result.stderr


def test_non_utf8_file(cli, tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("naïve\n".encode("latin-1"))
    result = cli("tokenize", "--file", str(path))
    assert result.exit_code == 1
    assert "is not valid UTF-8: line 1, byte offset 2" in result.stderr
    assert "hint:" in result.stderr


def test_missing_file_is_an_error(cli, tmp_path):
    result = cli("tokenize", "--file", str(tmp_path / "absent.txt"))
    assert result.exit_code == 1  # a missing file, not a bad option (docs/errors.md, "Errors and exit codes")
    assert "cannot read" in result.stderr


def test_checkpoint_dir_matches_bundled(bundled, minilm_dir, tmp_path):
    texts = [SEED_TEXT, "Héllo, WORLD! unaffable [MASK] 東京"]
    expected = [e.ids for e in bundled.encode(texts)]
    checkpoint = load_tokenizer(minilm_dir)  # uses its tokenizer.json
    assert [e.ids for e in checkpoint.encode(texts)] == expected
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    vocab_only = load_tokenizer(tmp_path)
    assert vocab_only.name == str(tmp_path)
    assert [e.ids for e in vocab_only.encode(texts)] == expected


def test_special_token_ids(bundled):
    assert (bundled.pad_token_id, bundled.cls_token_id, bundled.sep_token_id, bundled.mask_token_id) == (0, 101, 102, 103)
    assert bundled.bos_token_id is None and bundled.eos_token_id is None
    assert bundled.vocab_size == 30522 and bundled.name == BUNDLED_NAME
    assert bundled.id_to_token(8612) == "arrow" and bundled.token_to_id("arrow") == 8612


def test_decode_and_pad(bundled):
    encodings = bundled.encode(["a", SEED_TEXT])
    assert bundled.decode(encodings[1].ids) == SEED_TEXT
    ids, mask, type_ids = bundled.pad(encodings)
    assert ids[0] == [101, 1037, 102, 0, 0, 0, 0]
    assert mask[0] == [1, 1, 1, 0, 0, 0, 0]
    assert ids[1] == SEED_IDS and type_ids == [[0] * 7] * 2


@pytest.fixture
def gpt2_style_dir(tmp_path):
    """A tiny byte-level BPE vocabulary saved as GPT-2 does: vocab.json + merges.txt."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["time flies like an arrow", "fruit flies like a banana"] * 20, trainer)
    backend.model.save(str(tmp_path))
    return tmp_path


def test_gpt2_style_bpe_dir(gpt2_style_dir, cli):
    tokenizer = load_tokenizer(gpt2_style_dir)
    [encoding] = tokenizer.encode(["time flies<|endoftext|>"])
    assert encoding.tokens[:2] == ["time", "Ġflies"]
    assert encoding.ids[-1] == tokenizer.eos_token_id == tokenizer.bos_token_id
    assert encoding.span_text(1) == "flies"  # offsets trimmed of the leading space
    assert tokenizer.decode(encoding.ids) == "time flies"
    assert tokenizer.cls_token_id is None and tokenizer.pad_token_id is None
    [record] = records(cli("tokenize", "--json", "--model", str(gpt2_style_dir), ""))
    assert record["ids"] == []


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=40))
def test_offsets_point_into_the_text(bundled, text):
    [encoding] = bundled.encode([text])
    assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
    for start, end in encoding.offsets[1:-1]:
        assert 0 <= start <= end <= len(text)


def test_roberta_style_bpe_dir_gets_roberta_template(tmp_path):
    """A vocab.json + merges.txt with <s> and </s> gets RoBERTa's template: <s> a </s> (</s> b </s>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(["time flies like an arrow", "fruit flies like a banana"] * 20, trainer)
    backend.model.save(str(tmp_path))
    ours = load_tokenizer(tmp_path)
    bos, pad, eos = 0, 1, 2
    assert (ours.bos_token_id, ours.pad_token_id, ours.eos_token_id) == (bos, pad, eos)
    words = backend.encode("time flies").ids
    [single] = ours.encode(["time flies"])
    assert single.ids == [bos, *words, eos]
    [pair] = ours.encode(["time flies"], ["time flies"])
    assert pair.ids == [bos, *words, eos, eos, *words, eos]
    assert ours.decode(single.ids) == "time flies"


def test_the_tokenizer_is_named_as_such_after_each_text(cli, minilm_dir):
    """A model's own tokenizer is named by its path: the last line says what the path is, not the bare path."""
    result = cli("tokenize", "--model", str(minilm_dir), "time flies", "like an arrow", "--width", "200")
    assert result.exit_code == 0, result.stderr
    named = [line for line in result.stdout.splitlines() if str(minilm_dir) in line]
    assert named == [f"tokenizer: {minilm_dir}"] * 2
    assert cli("tokenize", "time flies").stdout.splitlines()[-1] == "tokenizer: bundled bert-base-uncased WordPiece"


# ---------------------------------------------------------------- a token as a person reads it (issue 39, item 10)


def test_a_byte_level_token_reads_as_the_text_it_stands_for(gpt2_style_dir, cli):
    """`text_of`: byte-level BPE's `Ġflies` is ` flies` (its leading space kept), a newline's `Ċ` is `\\n`, half of
    `é` (U+FFFD when decoded alone) and nothing else stays its vocabulary entry, an id past the vocabulary is `<id>`;
    `tokenize`, where the vocabulary entries are the subject, still shows `Ġflies`."""
    tokenizer = load_tokenizer(gpt2_style_dir)
    flies, newline, half = (tokenizer.token_to_id(t) for t in ("Ġflies", "Ċ", "Ã"))
    assert tokenizer.text_of(flies) == " flies" and tokenizer.text_of(newline) == "\n"
    assert tokenizer.decode([half]) == "\ufffd" and tokenizer.text_of(half) == "Ã"
    assert tokenizer.text_of(tokenizer.eos_token_id) == "<|endoftext|>"  # a special token reads as its name
    assert tokenizer.text_of(10**6) == f"<{10**6}>"
    [encoding] = tokenizer.encode(["time flies"])
    assert tokenizer.texts(encoding.ids) == ["time", " flies"]
    result = cli("tokenize", "--model", str(gpt2_style_dir), "time flies", "--width", "120")
    assert result.exit_code == 0, result.stderr
    assert "Ġflies" in result.stdout
    [record] = records(cli("tokenize", "--json", "--model", str(gpt2_style_dir), "time flies"))
    assert record["tokens"] == ["time", "Ġflies"]


def test_wordpiece_tokens_read_as_they_are(bundled):
    """WordPiece: a continuation keeps its `##` (it continues a word: decoding it alone would drop the sign) and the
    special tokens read as their names."""
    for token in ("##ing", "[CLS]", "[SEP]", "[MASK]", "time"):
        assert bundled.text_of(bundled.token_to_id(token)) == token


def test_a_sentencepiece_token_keeps_its_leading_space(tmp_path):
    """SentencePiece (Llama's tokenizer.json: ▁ read as a space, the first one stripped when decoding) and Marian:
    `▁Mary` is ` Mary`, as ` Mary` reads after another word, not the `Mary` that decoding it alone gives; a byte
    token `<0x0A>` is `\\n`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "\u2581Mary": 2, "\u2581": 3, "M": 4, "<0x0A>": 5, "\u2581\u2581": 6, "ary": 7}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.decode([2]) == "Mary"  # what decoding it alone gives
    assert [tokenizer.text_of(i) for i in range(8)] == ["<unk>", "<s>", " Mary", " ", "M", "\n", "  ", "ary"]


def test_a_long_texts_tokens_are_decoded_once_per_id(gpt2_style_dir, monkeypatch):
    """`texts` caches each id's text: a 5,000-token text costs a decode per distinct id, not per token (encode,
    attribute and patch show every token of a long text)."""
    tokenizer = load_tokenizer(gpt2_style_dir)
    [encoding] = tokenizer.encode([" ".join(["time flies like an arrow", "fruit flies like a banana"] * 500)])
    assert len(encoding.ids) >= 5000
    whole, calls = tokenizer.decode(encoding.ids), []
    decode = tokenizer.decode
    monkeypatch.setattr(tokenizer, "decode", lambda ids, **options: calls.append(ids) or decode(ids, **options))
    assert "".join(tokenizer.texts(encoding.ids)) == whole
    assert len(calls) == len(set(encoding.ids)) < 20
    tokenizer.texts(encoding.ids)
    assert len(calls) == len(set(encoding.ids))
