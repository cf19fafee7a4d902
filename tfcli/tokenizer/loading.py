"""`load_tokenizer`: a model source's tokenizer, built from the files it has: its own tokenizer.json, BERT's WordPiece
vocab.txt, Marian's source.spm + target.spm + vocab.json (tfcli.tokenizer.marian), byte-level BPE's vocab.json +
merges.txt, or a GGUF file's metadata (tfcli.tokenizer.gguf); the bundled BERT WordPiece vocabulary when it has
none."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, WordPiece

from tfcli.errors import TfcliError
from tfcli.tokenizer import Tokenizer, tokenizer_settings
from tfcli.tokenizer.gguf import from_gguf
from tfcli.tokenizer.marian import MarianTokenizer

BUNDLED_VOCAB = Path(__file__).parent.parent / "data" / "vocab.txt"
BUNDLED_NAME = "bundled bert-base-uncased WordPiece"
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# tokenizer files tfcli cannot read (SentencePiece models but Marian's; GPT-2-style vocab.json without merges.txt)
UNREAD_TOKENIZER_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model", "tokenizer.model", "vocab.json")


def load_tokenizer(source: str | Path | None = None) -> Tokenizer:
    """The tokenizer for a model source (see `tfcli.sources`); the bundled BERT one when it has none."""
    if source is None:
        return _from_directory(None)
    if Path(source).is_dir():
        return _from_directory(Path(source))
    from tfcli.sources import resolve_source

    return _from_directory(resolve_source(source).tokenizer_dir)


def _from_directory(directory: Path | None) -> Tokenizer:
    """Use the directory's tokenizer.json, else vocab.txt, else Marian's source.spm + target.spm + vocab.json,
    else vocab.json + merges.txt, else the bundled vocab (with a note saying so: a model directory without
    tokenizer files may well expect another vocabulary). A file rather than a directory is a GGUF file (a
    source's tokenizer_dir when --model names one, or an Ollama blob): its metadata holds its tokenizer."""
    if directory is not None and directory.is_file():
        return from_gguf(directory)
    if directory is not None:
        try:
            if (directory / "tokenizer.json").is_file():
                return Tokenizer(_Backend.from_file(str(directory / "tokenizer.json")), str(directory))
            if (directory / "source.spm").is_file():
                return MarianTokenizer(directory)
            if (directory / "vocab.txt").is_file():
                return Tokenizer(_wordpiece(directory / "vocab.txt", _lowercase(directory)), str(directory))
            if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
                return Tokenizer(_byte_level_bpe(directory), str(directory))
        except TfcliError:
            raise
        except Exception as e:  # the tokenizers and sentencepiece libraries report bad files as plain Exceptions
            raise TfcliError(
                f"cannot load the tokenizer in {directory}: {e}",
                "check tokenizer.json / vocab.txt / vocab.json + merges.txt / source.spm + target.spm there",
            ) from e
        unread = [name for name in UNREAD_TOKENIZER_FILES if (directory / name).is_file()]
        if unread:  # the bundled BERT vocabulary would give this model wrong ids without a word
            raise TfcliError(f"{directory}: its tokenizer is {unread[0]}, which tfcli does not read (it reads "
                             "tokenizer.json, vocab.txt, vocab.json + merges.txt, or Marian's source.spm)",
                             "write its tokenizer.json once with transformers: python -c \"from transformers import "
                             f"AutoTokenizer as T; T.from_pretrained('{directory}').save_pretrained('{directory}')\"")
    note = None if directory is None else (f"{directory} has no tokenizer files (tokenizer.json, vocab.txt, "
                                            f"vocab.json + merges.txt, source.spm): using the {BUNDLED_NAME} tokenizer")
    return Tokenizer(_wordpiece(BUNDLED_VOCAB, lowercase=True), BUNDLED_NAME, note)



def _lowercase(directory: Path) -> bool:
    """do_lower_case from tokenizer_config.json; True (as for BERT uncased) when it does not say."""
    return bool(tokenizer_settings(directory).get("do_lower_case", True))


def _wordpiece(vocab: Path, lowercase: bool) -> _Backend:
    """BERT's WordPiece pipeline: [CLS] a [SEP] (b [SEP]) with type ids 0 / 1."""
    backend = _Backend(WordPiece.from_file(str(vocab), unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.add_special_tokens([t for t in WORDPIECE_SPECIALS if backend.token_to_id(t) is not None])
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    if cls_id is not None and sep_id is not None:
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
    return backend


def _byte_level_bpe(directory: Path) -> _Backend:
    """Byte-level BPE: GPT-2 style (no special-token template), or RoBERTa style (<s> a </s>) when the
    vocabulary has <s> and </s>."""
    backend = _Backend(BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt")))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    bos, eos = backend.token_to_id("<s>"), backend.token_to_id("</s>")
    if bos is not None and eos is not None:
        backend.add_special_tokens([t for t in ("<s>", "</s>", "<pad>", "<unk>", "<mask>") if backend.token_to_id(t) is not None])
        backend.post_processor = processors.RobertaProcessing(("</s>", eos), ("<s>", bos), trim_offsets=True)
        return backend
    backend.post_processor = processors.ByteLevel(trim_offsets=True)
    if backend.token_to_id("<|endoftext|>") is not None:
        backend.add_special_tokens(["<|endoftext|>"])
    return backend
