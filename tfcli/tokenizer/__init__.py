"""Tokenizers. Here, what every tokenizer of tfcli is, whichever files it is built from: `Encoding` (one tokenized
text) and `Tokenizer` (a `tokenizers.Tokenizer` with the special-token ids and the batch helpers tfcli needs).

The package's modules build them: `loading` (`load_tokenizer`: a model source's own tokenizer.json, BERT's WordPiece
vocab.txt, byte-level BPE's vocab.json + merges.txt, or the bundled BERT WordPiece vocabulary), `marian` (Marian's
opus-mt tokenizers) and `gguf` (the tokenizer a GGUF file's metadata describes). Built on the `tokenizers` library,
and on `sentencepiece` (an optional package, imported only then) for Marian's opus-mt tokenizers; no torch here, so
the CLI stays quick to start.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as _Backend

from tfcli.errors import usage_error

# Attribute -> the names that token goes by in common vocabularies, first match wins.
SPECIAL_TOKEN_NAMES = {
    "pad_token_id": ("[PAD]", "<pad>"),
    "cls_token_id": ("[CLS]", "<s>"),
    "sep_token_id": ("[SEP]", "</s>"),
    "mask_token_id": ("[MASK]", "<mask>"),
    "bos_token_id": ("<s>", "<|endoftext|>"),
    "eos_token_id": ("</s>", "<|endoftext|>"),
}


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

    def read_part(self, sequence: int) -> str | None:
        """What a truncated encoding kept of its text (sequence 0) or pair (1): the text up to the end of its last
        kept token; None when nothing of it was cut."""
        whole = self.text if sequence == 0 else self.pair
        if not self.truncated or whole is None:
            return None
        end = max((stop for (_, stop), s in zip(self.offsets, self.sequence_ids) if s == sequence), default=0)
        return whole[:end] if whole[end:].strip() else None

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

    chat_template: str | None = None  # a GGUF file's tokenizer.chat_template (Jinja), where it has one

    def __init__(self, backend: _Backend, name: str, note: str | None = None,
                 special_ids: dict[str, int | None] | None = None):
        backend.no_padding()
        backend.no_truncation()
        self.backend = backend
        self.name = name
        self.note = note  # what a person should know about where it came from (a fallback), else None
        self._find_special_ids()
        for attribute, value in (special_ids or {}).items():  # ids the source names (a GGUF file's metadata)
            setattr(self, attribute, value)

    def _find_special_ids(self) -> None:
        for attribute, names in SPECIAL_TOKEN_NAMES.items():
            ids = (self.token_to_id(n) for n in names)
            setattr(self, attribute, next((i for i in ids if i is not None), None))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    def tokens(self, ids: list[int]) -> list[str]:
        """Each id's token, `<id>` for an id the vocabulary lacks (a model's vocabulary may be larger)."""
        return [self.id_to_token(i) or f"<{i}>" for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def text_of(self, token_id: int) -> str:
        """The text a token stands for, as a person reads it (`text_of`); cached per id, so that a long text's
        tokens cost a decode per distinct id."""
        texts = self.__dict__.setdefault("_texts", {})  # (MarianTokenizer has its own __init__)
        text = texts.get(token_id)
        if text is None:
            text = texts[token_id] = text_of(self, token_id)
        return text

    def texts(self, ids: list[int]) -> list[str]:
        """Each id's text (`text_of`): what the views show where `tokens` gives the vocabulary entries."""
        return [self.text_of(i) for i in ids]

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

    def target_ids(self, text: str) -> list[int]:
        """The ids of an encoder-decoder's target text, without special tokens (what its decoder reads)."""
        return self.encode([text], add_special_tokens=False)[0].ids

    def _special_token_count(self, is_pair: bool) -> int:
        post = self.backend.post_processor
        return post.num_special_tokens_to_add(is_pair) if post else 0

    def _check_max_length(self, max_length: int, is_pair: bool, add_special_tokens: bool) -> None:
        # at least one token of the text besides the special tokens: fewer would read none of it
        specials = self._special_token_count(is_pair) if add_special_tokens else 0
        if max_length < specials + 1:
            raise usage_error(
                f"max_length {max_length} is too small: it must be at least {specials + 1}",
                f"the special tokens alone take {specials}, and a text needs one more" if specials else None,
                parameter="max_length",
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


def text_of(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as it reads: the text it stands for, decoded alone (byte-level BPE's `ĠMary` is ` Mary`, `Ċ` is
    `\\n`, SentencePiece's `<0x0A>` is `\\n`), with the leading spaces of a SentencePiece piece (`▁Mary`: ` Mary`)
    that its decoder drops at the start of a text; the vocabulary entry where decoding gives no clean text (part of
    a character, U+FFFD, or nothing). WordPiece decodes a lone token as it is: `##ing` keeps its `##` (it continues
    a word) and `[CLS]` stays `[CLS]`. `<ID>` for an id the vocabulary lacks (a model's may be larger).
    `Tokenizer.text_of` caches it per id."""
    token = tokenizer.id_to_token(token_id)
    if token is None:
        return f"<{token_id}>"
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    if token.startswith(_METASPACE) and _METASPACE not in text:  # the decoder read ▁ as a space, and stripped it
        text = " " * (len(token) - len(token.lstrip(_METASPACE))) + text.lstrip(" ")
    if not text or "\ufffd" in text:
        return token
    return text


_METASPACE = "\u2581"  # SentencePiece's mark of a space: `▁Mary`


def _cut_after(text: str, encoding, tokens: int) -> str:
    """The start of `text` that holds its first `tokens` tokens, cut before the next whitespace (a word
    boundary for every pre-tokenizer), or all of it when no whitespace comes soon."""
    end = max(stop for _, stop in encoding.offsets[:tokens + 1])
    space = _WHITESPACE.search(text, end, end + 1000)
    return text[:space.start()] if space else text


_WHITESPACE = re.compile(r"\s")


def tokenizer_settings(directory: Path) -> dict:
    """tokenizer_config.json's settings; none when it has none."""
    config = directory / "tokenizer_config.json"
    return json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
