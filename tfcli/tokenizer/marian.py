"""Marian's opus-mt tokenizer (source.spm, target.spm and vocab.json), as transformers' MarianTokenizer computes it,
on `sentencepiece` (an optional package, imported only when one is loaded)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tfcli.errors import TfcliError, usage_error
from tfcli.tokenizer import Encoding, Tokenizer, tokenizer_settings

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")


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
        settings = tokenizer_settings(directory)
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
