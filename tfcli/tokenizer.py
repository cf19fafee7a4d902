"""Tokenizers: the bundled BERT WordPiece vocabulary, or a model directory's own files.

Built on the `tokenizers` library; no torch here, so the CLI stays quick to start.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, WordPiece

from tfcli.errors import TfcliError, usage_error

BUNDLED_VOCAB = Path(__file__).parent / "data" / "vocab.txt"
BUNDLED_NAME = "bundled bert-base-uncased WordPiece"

# Attribute -> the names that token goes by in common vocabularies, first match wins.
SPECIAL_TOKEN_NAMES = {
    "pad_token_id": ("[PAD]", "<pad>"),
    "cls_token_id": ("[CLS]", "<s>"),
    "sep_token_id": ("[SEP]", "</s>"),
    "mask_token_id": ("[MASK]", "<mask>"),
    "bos_token_id": ("<s>", "<|endoftext|>"),
    "eos_token_id": ("</s>", "<|endoftext|>"),
}
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# tokenizer files tfcli cannot read (SentencePiece models; GPT-2-style vocab.json without its merges.txt)
UNREAD_TOKENIZER_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model", "source.spm", "tokenizer.model",
                          "vocab.json")


@dataclass
class Encoding:
    """One tokenized text (and its pair, if any). offsets index into the sequence the token came from."""

    text: str
    pair: str | None
    tokens: list[str]
    ids: list[int]
    type_ids: list[int]
    attention_mask: list[int]
    offsets: list[list[int]]
    sequence_ids: list[int | None]  # 0: text, 1: pair, None: special token
    truncated: bool
    untruncated_length: int  # number of tokens before truncation

    def span_text(self, position: int) -> str:
        """The substring of the original text (or pair) that token `position` covers."""
        sequence = self.sequence_ids[position]
        if sequence is None:
            return ""
        start, end = self.offsets[position]
        return (self.text if sequence == 0 else self.pair or "")[start:end]


class Tokenizer:
    """A `tokenizers.Tokenizer` with the special-token ids and the batch helpers tfcli needs.

    Padding and truncation saved in a tokenizer.json are switched off: callers ask for them per call.
    """

    def __init__(self, backend: _Backend, name: str, note: str | None = None):
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.name = name
        self.note = note  # what a person should know about where it came from (a fallback), else None
        for attribute, names in SPECIAL_TOKEN_NAMES.items():
            ids = (backend.token_to_id(n) for n in names)
            setattr(self, attribute, next((i for i in ids if i is not None), None))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(
        self,
        texts: list[str],
        pairs: list[str] | None = None,
        add_special_tokens: bool = True,
        max_length: int | None = None,
    ) -> list[Encoding]:
        """Tokenize each text (with pairs[i] as its second segment when given), truncating to max_length."""
        if max_length is not None:
            self._check_max_length(max_length, pairs is not None, add_special_tokens)
        inputs = list(zip(texts, pairs)) if pairs is not None else texts
        full = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        kept = list(full)
        # Only the texts that overflow are encoded again, truncated; a lone text is first cut at a space
        # past what is kept, so that a million-character text is not tokenized twice in full.
        long = [i for i, enc in enumerate(full) if max_length is not None and len(enc.ids) > max_length]
        if long:
            again = [inputs[i] if pairs is not None else _cut_after(texts[i], full[i], max_length) for i in long]
            self.backend.enable_truncation(max_length)
            try:
                for i, enc in zip(long, self.backend.encode_batch(again, add_special_tokens=add_special_tokens)):
                    kept[i] = enc
            finally:
                self.backend.no_truncation()
        return [
            Encoding(
                text=text,
                pair=pairs[i] if pairs is not None else None,
                tokens=enc.tokens,
                ids=enc.ids,
                type_ids=enc.type_ids,
                attention_mask=enc.attention_mask,
                offsets=[list(o) for o in enc.offsets],
                sequence_ids=enc.sequence_ids,
                truncated=len(enc.ids) < len(untruncated.ids),
                untruncated_length=len(untruncated.ids),
            )
            for i, (text, enc, untruncated) in enumerate(zip(texts, kept, full))
        ]

    def encode_for_model(self, texts: list[str], positions: int, pair: str | None = None,
                         max_length: int | None = None) -> list[Encoding]:
        """Tokenize texts (each with `pair` as its second segment when given) for a model with `positions`
        positions, truncated to max_length (at most `positions`; default: `positions`)."""
        if max_length is not None and max_length > positions:
            raise usage_error(f"max_length {max_length} is more than the model's {positions} positions",
                              f"use at most {positions}", parameter="max_length")
        pairs = [pair] * len(texts) if pair is not None else None
        return self.encode(texts, pairs, max_length=positions if max_length is None else max_length)

    def _check_max_length(self, max_length: int, is_pair: bool, add_special_tokens: bool) -> None:
        post = self.backend.post_processor
        specials = post.num_special_tokens_to_add(is_pair) if post and add_special_tokens else 0
        if max_length < max(specials, 1):
            raise usage_error(
                f"max_length {max_length} is too small: it must be at least {max(specials, 1)}",
                f"the special tokens alone take {specials}" if specials else None, parameter="max_length",
            )

    def pad(self, encodings: list[Encoding]) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """Right-pad a batch to its longest member: (ids, attention_mask, type_ids) as nested lists."""
        width = max((len(e.ids) for e in encodings), default=0)
        pad_id = self.pad_token_id if self.pad_token_id is not None else 0

        def padded(rows: list[list[int]], value: int) -> list[list[int]]:
            return [row + [value] * (width - len(row)) for row in rows]

        return (
            padded([e.ids for e in encodings], pad_id),
            padded([e.attention_mask for e in encodings], 0),
            padded([e.type_ids for e in encodings], 0),
        )


def _cut_after(text: str, encoding, tokens: int) -> str:
    """The start of `text` that holds its first `tokens` tokens, cut before the next whitespace (a word
    boundary for every pre-tokenizer), or all of it when no whitespace comes soon."""
    end = max(stop for _, stop in encoding.offsets[:tokens + 1])
    space = _WHITESPACE.search(text, end, end + 1000)
    return text[:space.start()] if space else text


_WHITESPACE = re.compile(r"\s")


def load_tokenizer(source: str | Path | None = None) -> Tokenizer:
    """The tokenizer for a model source (see `tfcli.sources`); the bundled BERT one when it has none."""
    if source is None:
        return _from_directory(None)
    if Path(source).is_dir():
        return _from_directory(Path(source))
    from tfcli.sources import resolve_source

    return _from_directory(resolve_source(source).tokenizer_dir)


def _from_directory(directory: Path | None) -> Tokenizer:
    """Use the directory's tokenizer.json, else vocab.txt, else vocab.json + merges.txt, else the bundled vocab
    (with a note saying so: a model directory without tokenizer files may well expect another vocabulary)."""
    if directory is not None:
        try:
            if (directory / "tokenizer.json").is_file():
                return Tokenizer(_Backend.from_file(str(directory / "tokenizer.json")), str(directory))
            if (directory / "vocab.txt").is_file():
                return Tokenizer(_wordpiece(directory / "vocab.txt", _lowercase(directory)), str(directory))
            if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
                return Tokenizer(_byte_level_bpe(directory), str(directory))
        except Exception as e:  # the tokenizers library reports bad files as plain Exceptions
            raise TfcliError(
                f"cannot load the tokenizer in {directory}: {e}",
                "check tokenizer.json / vocab.txt / vocab.json + merges.txt there",
            ) from e
        unread = [name for name in UNREAD_TOKENIZER_FILES if (directory / name).is_file()]
        if unread:  # the bundled BERT vocabulary would give this model wrong ids without a word
            raise TfcliError(f"{directory}: its tokenizer is {unread[0]}, which tfcli does not read (it reads "
                             "tokenizer.json, vocab.txt, or vocab.json + merges.txt)",
                             "write its tokenizer.json once with transformers: python -c \"from transformers import "
                             f"AutoTokenizer as T; T.from_pretrained('{directory}').save_pretrained('{directory}')\"")
    note = None if directory is None else (f"{directory} has no tokenizer files (tokenizer.json, vocab.txt, "
                                            f"vocab.json + merges.txt): using the {BUNDLED_NAME} tokenizer")
    return Tokenizer(_wordpiece(BUNDLED_VOCAB, lowercase=True), BUNDLED_NAME, note)


def _lowercase(directory: Path) -> bool:
    """do_lower_case from tokenizer_config.json; True (as for BERT uncased) when it does not say."""
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return True
    return bool(json.loads(config.read_text(encoding="utf-8")).get("do_lower_case", True))


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
