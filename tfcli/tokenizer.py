"""Tokenizers: the bundled BERT WordPiece vocabulary, a model directory's own files, or a GGUF file's metadata.

Built on the `tokenizers` library, and on `sentencepiece` (an optional package, imported only then) for
Marian's opus-mt tokenizers; no torch here, so the CLI stays quick to start.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex
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
# tokenizer files tfcli cannot read (SentencePiece models but Marian's; GPT-2-style vocab.json without merges.txt)
UNREAD_TOKENIZER_FILES = ("spiece.model", "sentencepiece.bpe.model", "spm.model", "tokenizer.model", "vocab.json")
MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")


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


class MarianTokenizer(Tokenizer):
    """Marian's opus-mt tokenizer, as transformers' MarianTokenizer computes it: source.spm (SentencePiece) cuts
    the text into pieces, vocab.json numbers them (one vocabulary for source and target; a piece it lacks is
    <unk>) and </s> ends the text. A leading `>>xx<<` (the target language of a multilingual model) is one
    token, and the special tokens' own text (`</s>`, `<unk>`, `<pad>`) is read as them. target.spm tokenizes
    the decoder's text (`target_ids`); decoding reads pieces with source.spm, as transformers does when the
    vocabulary is shared. Sentence pairs are refused: a translation model reads one text."""

    def __init__(self, directory: Path):
        try:
            import sentencepiece
        except ImportError:
            raise TfcliError(f"{directory} has a Marian tokenizer ({', '.join(MARIAN_FILES)}), which needs the "
                             "sentencepiece package", "pip install sentencepiece") from None
        missing = [name for name in MARIAN_FILES if not (directory / name).is_file()]
        if missing:
            raise TfcliError(f"{directory}: a Marian tokenizer needs {', '.join(MARIAN_FILES)}; missing: "
                             f"{', '.join(missing)}", "copy the model's tokenizer files there")
        settings = _tokenizer_settings(directory)
        if settings.get("separate_vocabs"):
            raise TfcliError(f"{directory}: a Marian tokenizer with `separate_vocabs: true` (a target_vocab.json "
                             "of its own) is not supported by tfcli", "use a model with one vocab.json")
        self.name = str(directory)
        self.note = None
        self.vocab: dict[str, int] = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        self.pieces = {i: piece for piece, i in self.vocab.items()}
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(directory / "source.spm"))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(directory / "target.spm"))
        self.unk_token, eos, pad = (_token_text(settings.get(key, default)) for key, default in
                                    (("unk_token", "<unk>"), ("eos_token", "</s>"), ("pad_token", "<pad>")))
        for token in (self.unk_token, eos):
            if token not in self.vocab:
                raise TfcliError(f"{directory}: vocab.json has no {token} token", "a Marian vocabulary has its "
                                 f"unknown-piece ({self.unk_token}) and end ({eos}) tokens")
        self.specials = {token: self.vocab[token] for token in (eos, self.unk_token, pad) if token in self.vocab}
        self._special_text = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")")
        self.clean_up_spaces = bool(settings.get("clean_up_tokenization_spaces", False))
        self._find_special_ids()
        self.eos_token_id, self.pad_token_id = self.vocab[eos], self.vocab.get(pad)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def id_to_token(self, i: int) -> str | None:
        return self.pieces.get(i)

    def encode(self, texts: list[str], pairs: list[str] | None = None, add_special_tokens: bool = True,
               max_length: int | None = None) -> list[Encoding]:
        if pairs is not None:
            raise usage_error("a Marian translation model reads one text, not a pair", "leave out the pair",
                              parameter="pair")
        if max_length is not None:
            self._check_max_length(max_length, False, add_special_tokens)
        return [self._encode_one(text, add_special_tokens, max_length) for text in texts]

    def _encode_one(self, text: str, add_special_tokens: bool, max_length: int | None) -> Encoding:
        pieces = self._pieces(text, self.source)
        ids = [self.vocab.get(piece, self.vocab[self.unk_token]) for piece, _, _ in pieces]
        offsets = [[start, end] for _, start, end in pieces]
        sequence_ids: list[int | None] = [0] * len(ids)
        untruncated = len(ids) + (1 if add_special_tokens else 0)
        if max_length is not None and untruncated > max_length:  # as transformers: the end token stays
            kept = max_length - (1 if add_special_tokens else 0)
            ids, offsets, sequence_ids = ids[:kept], offsets[:kept], sequence_ids[:kept]
        if add_special_tokens:
            ids, offsets, sequence_ids = ids + [self.eos_token_id], offsets + [[0, 0]], sequence_ids + [None]
        return Encoding(text=text, pair=None, tokens=[self.pieces[i] for i in ids], ids=ids,
                        type_ids=[0] * len(ids), attention_mask=[1] * len(ids), offsets=offsets,
                        sequence_ids=sequence_ids, truncated=len(ids) < untruncated, untruncated_length=untruncated)

    def _pieces(self, text: str, model) -> list[tuple[str, int, int]]:
        """(piece, start, end) for each token of `text`: special tokens' text as they are, then in each stretch
        between them a leading `>>xx<<` as one piece and the rest through the SentencePiece `model`."""
        out = []
        start = 0
        for chunk in self._special_text.split(text):
            if chunk in self.specials:
                out.append((chunk, start, start + len(chunk)))
            elif chunk:
                code = chunk.find("<<") + 2 if chunk.startswith(">>") and "<<" in chunk else 0
                if code:
                    out.append((chunk[:code], start, start + code))
                mapped = model.encode(chunk[code:], return_type="offset_mapping")
                out += [(piece, start + code + a, start + code + b)
                        for piece, (a, b) in zip(mapped["pieces"], mapped["offsets"])]
            start += len(chunk)
        return out

    def target_ids(self, text: str) -> list[int]:
        unk = self.vocab[self.unk_token]
        return [self.vocab.get(piece, unk) for piece, _, _ in self._pieces(text, self.target)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """As transformers: pieces joined by source.spm, a special token kept as its text followed by a space."""
        special_ids = set(self.specials.values())
        text, run = "", []
        for i in ids:
            if skip_special_tokens and i in special_ids:
                continue
            token = self.pieces.get(i, self.unk_token)  # (transformers would read source.spm's piece number i)
            if token in self.specials:
                text += self.source.decode_pieces(run) + token + " "
                run = []
            else:
                run.append(token)
        text = (text + self.source.decode_pieces(run)).replace("\u2581", " ").strip()
        return _clean_up_spaces(text) if self.clean_up_spaces else text

    def _special_token_count(self, is_pair: bool) -> int:
        return 1


def _token_text(token: str | dict) -> str:
    """A special token as tokenizer_config.json gives it: its text, or (older files) {"content": text, ...}."""
    return token["content"] if isinstance(token, dict) else token


def _clean_up_spaces(text: str) -> str:
    """transformers' clean_up_tokenization (tokenizer_config.json's clean_up_tokenization_spaces)."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


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
        return _from_gguf(directory)
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


def _tokenizer_settings(directory: Path) -> dict:
    """tokenizer_config.json's settings; none when it has none."""
    config = directory / "tokenizer_config.json"
    return json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}


def _lowercase(directory: Path) -> bool:
    """do_lower_case from tokenizer_config.json; True (as for BERT uncased) when it does not say."""
    return bool(_tokenizer_settings(directory).get("do_lower_case", True))


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


# --- GGUF files: the tokenizer their metadata describes ------------------------------------------------------

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN35_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# transformers' GGUF_PRE_TOKENIZER_SPLITS: tokenizer.ggml.pre -> the split its merges were learned on
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def _from_gguf(path: Path) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes, built as transformers' GGUF converters build it
    (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): byte-level BPE (`tokenizer.ggml.model` gpt2) or
    SentencePiece BPE (llama; Gemma's and Phi-3's variants), its control tokens special, its user-defined tokens
    whole, the BOS (and EOS) that tokenizer.ggml.add_bos_token (add_eos_token) asks for."""
    from tfcli.sources import gguf_header

    header = gguf_header(path)
    meta = {**header.metadata, **{f"tokenizer.ggml.{key}": header.array(f"tokenizer.ggml.{key}")
                                  for key in ("tokens", "merges", "scores", "token_type")}}
    meta = {key: value for key, value in meta.items() if value is not None}
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise TfcliError(f"{path}: its metadata holds no vocabulary (tokenizer.ggml.tokens)",
                         "tfcli reads the tokenizer a GGUF file carries; this one carries none")
    try:
        if model == "gpt2":
            backend = _byte_level(meta, tokens)
        elif model == "llama":
            backend = _sentencepiece(meta, tokens, header.architecture)
        else:
            raise TfcliError(f"{path}: a `{model}` tokenizer (tokenizer.ggml.model) is not supported by tfcli",
                             "tfcli reads GGUF tokenizers of the kinds gpt2 (byte-level BPE) and llama (SentencePiece)")
        specials = _add_special_tokens(backend, meta, tokens, model)
        split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
        if split is not None:  # the split its merges were learned on, as transformers' set_split_regex
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    except TfcliError:
        raise
    except Exception as exc:  # the tokenizers library reports a bad vocabulary as a plain Exception
        raise TfcliError(f"cannot build the tokenizer of {path}: {exc}", "the file's vocabulary is malformed") from None
    ids = {attribute: specials.get(key) for attribute, key in (("bos_token_id", "bos"), ("eos_token_id", "eos"),
                                                              ("pad_token_id", "pad"))}
    tokenizer = Tokenizer(backend, str(path), special_ids={**ids, "cls_token_id": None, "sep_token_id": None,
                                                           "mask_token_id": None})
    tokenizer.chat_template = meta.get("tokenizer.chat_template")
    return tokenizer


def _merges(meta: dict[str, Any], tokens: list[str], scores: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """The merges the file gives, else those its vocabulary implies (transformers' generate_merges)."""
    if "tokenizer.ggml.merges" in meta:
        return [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]]
    vocab = {token: index for index, token in enumerate(tokens)}
    if scores is None:
        scores = dict(zip(tokens, meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)))
    merges = []
    for merge, score in scores.items():
        local = [(merge[:i], merge[i:], score) for i in range(1, len(merge))
                 if merge[:i] in vocab and merge[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda val: (val[2], len(val[0]), len(val[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


@functools.cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's bytes_to_unicode: each byte's printable stand-in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _byte_level(meta: dict[str, Any], tokens: list[str]) -> _Backend:
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for index, token in enumerate(tokens):
        spelled = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[spelled] = index
    backend = _Backend(BPE(vocab=vocab, merges=_merges(meta, tokens), dropout=None, continuing_subword_prefix="",
                          end_of_word_suffix="", fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(meta: dict[str, Any], tokens: list[str], architecture: str) -> _Backend:
    gemma = architecture in ("gemma", "gemma2", "gemma3")
    if gemma:  # a token of spaces only is stored as spaces; Gemma's merges follow the vocabulary's order
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {token: -index for index, token in enumerate(tokens)}
    else:
        scores = None
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges(meta, tokens, scores)
    if gemma:
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        backend = _Backend(BPE(vocab=vocab, merges=merges, fuse_unk=True, dropout=None, byte_fallback=True,
                              unk_token=tokens[unk] if unk is not None else "<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        backend.normalizer = normalizers.Replace(" ", "\u2581")
        backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                             decoders.Fuse()])
        return backend
    backend = _Backend(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    if architecture == "phi3":  # the prefix space comes from a normalizer, not from Metaspace
        backend.normalizer = normalizers.Sequence([normalizers.Prepend(prepend="\u2581"),
                                                   normalizers.Replace(pattern=" ", content="\u2581")])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    return backend


def _add_special_tokens(backend: _Backend, meta: dict[str, Any], tokens: list[str],
                        model: str) -> dict[str, int | None]:
    """Control tokens (and the named BOS, EOS, unknown and padding tokens) as special tokens, user-defined ones as
    whole added tokens, and the post-processor adding BOS / EOS as the file says; the named ids, by role."""
    types = meta.get("tokenizer.ggml.token_type") or ()
    spelled = set(_byte_alphabet().values()) if model == "gpt2" else None
    control = [AddedToken(token, normalized=False, special=True) for token, kind in zip(tokens, types)
               if kind == CONTROL and (spelled is None or set(token) <= spelled)]
    if control:
        backend.add_special_tokens(control)
    vocab = backend.get_vocab()
    user = [AddedToken(token, normalized=False, special=False) for token, kind in zip(tokens, types)
            if kind == USER_DEFINED and token in vocab]
    if user:
        backend.add_tokens(user)
    ids = {role: meta.get(f"tokenizer.ggml.{key}") for role, key in
           (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"), ("pad", "padding_token_id"))}
    ids = {role: i if isinstance(i, int) and 0 <= i < len(tokens) else None for role, i in ids.items()}
    added = {str(t.content) for t in backend.get_added_tokens_decoder().values()}
    named = [tokens[i] for i in ids.values() if i is not None and tokens[i] not in added]
    if named:
        backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in dict.fromkeys(named)])
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama")) and ids["bos"] is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and ids["eos"] is not None
    bos, eos = (tokens[ids[role]] if ids[role] is not None else None for role in ("bos", "eos"))
    single = f"{f'{bos}:0 ' if add_bos else ''}$A:0{f' {eos}:0' if add_eos else ''}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    special = ([(bos, ids["bos"])] if add_bos else []) + ([(eos, ids["eos"])] if add_eos else [])
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return ids
