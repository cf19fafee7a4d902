"""The tokenizer a GGUF file's metadata describes (tokenizer.ggml.*), built as transformers' GGUF converters build it:
byte-level BPE or SentencePiece BPE, with the pre-tokenizer split its merges were learned on."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from tfcli.errors import TfcliError
from tfcli.tokenizer import Tokenizer

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


def from_gguf(path: Path) -> Tokenizer:
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
