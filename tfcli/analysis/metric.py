"""The metric an analysis reads: a target token (or a classifier's label), an optional foil, the position, and the
logit (difference) of a row of logits.

Shapes: B batch, T tokens, V vocabulary (or labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.config import ModelConfig
    from tfcli.tokenizer import Tokenizer


@dataclass
class Token:
    """A token (or a classifier's label) and its id (index): `token` its vocabulary entry (`ĠMary`, what JSON
    records), `text` the text it stands for (` Mary`, `Tokenizer.text_of`: what a person reads; a label's name)."""

    token: str
    id: int
    text: str = ""

    def __post_init__(self) -> None:
        self.text = self.text or self.token


def parse_token(tokenizer: Tokenizer, spec: str, option: str, vocab_size: int) -> Token:
    """`#ID` or a string that is one token of the tokenizer (as it reads: " Mary" with its leading space for
    byte-level BPE); anything else is a usage error that shows how the string tokenizes."""
    if spec.startswith("#") and spec[1:].isdigit():
        token_id = int(spec[1:])
        if token_id >= vocab_size:
            raise usage_error(f"{option} {spec}: the model's vocabulary has {vocab_size} tokens "
                              f"(0 to {vocab_size - 1})")
        return token_of(tokenizer, token_id)
    token_id = tokenizer.token_to_id(spec)
    if token_id is None:
        encoding = tokenizer.encode([spec], add_special_tokens=False)[0]
        if len(encoding.ids) == 1:
            token_id = encoding.ids[0]
        else:
            pieces = " ".join(repr(t) for t in encoding.tokens) or "no token"
            raise usage_error(f"{option} {spec!r} is not one token of {tokenizer.name}: it reads as "
                              f"{len(encoding.ids)} ({pieces})",
                              "give one token (byte-level BPE tokens carry their leading space: \" Mary\") or #ID")
    return Token(tokenizer.id_to_token(token_id) or spec, token_id, tokenizer.text_of(token_id))


def spacing_hint(tokenizer: Tokenizer, spec: str | None, option: str) -> str | None:
    """A warning for a token given without its leading space (`--target Mary`) where the tokenizer has the spaced
    one too (" Mary", the word after a space, which is what follows "gave a drink to"); None otherwise."""
    if spec is None or spec.startswith((" ", "#")) or tokenizer.token_to_id(spec) is None:
        return None
    spaced = tokenizer.encode([" " + spec], add_special_tokens=False)[0]
    if len(spaced.ids) != 1 or tokenizer.id_to_token(spaced.ids[0]) == spec:
        return None
    return (f"{option} {spec!r} is the token without a leading space; {' ' + spec!r} (#{spaced.ids[0]}) is one "
            f"token too, the word as it follows a space: give {option} \" {spec}\" for that one")


def token_of(tokenizer: Tokenizer, token_id: int) -> Token:
    """The token of an id, `<id>` where the tokenizer has none."""
    return Token(tokenizer.id_to_token(token_id) or f"<{token_id}>", token_id, tokenizer.text_of(token_id))


def parse_label(config: ModelConfig, spec: str, option: str) -> Token:
    """A classifier's label: its name or #index."""
    names = config.label_names
    if spec.startswith("#") and spec[1:].isdigit() and int(spec[1:]) < len(names):
        return Token(names[int(spec[1:])], int(spec[1:]))
    if spec in names:
        return Token(spec, names.index(spec))
    raise usage_error(f"{option} {spec!r} is not a label of {config.name}", f"its labels: {', '.join(names)} "
                      f"(or #0 to #{len(names) - 1})")


def parse_metric(config: ModelConfig, tokenizer: Tokenizer, target: str | None, foil: str | None,
                 position: int | None = None, prefix: str = "--") -> tuple[Token | None, Token | None]:
    """The target and foil of a metric, as options (`prefix` "--") or a dataset line's keys (prefix ""): tokens of
    the tokenizer, or a classifier's labels (read from the whole text: no position); None where not given (a target:
    the model's own top prediction). A target and foil that are the same are refused (their difference is 0)."""
    if config.head == "classifier":
        if position is not None:
            raise usage_error(f"{prefix}position is for a token's logit: a classifier's labels are read from the "
                              "whole text")
        read = [None if spec is None else parse_label(config, spec, f"{prefix}{name}")
                for name, spec in (("target", target), ("foil", foil))]
    else:
        read = [None if spec is None else parse_token(tokenizer, spec, f"{prefix}{name}", config.vocab_size)
                for name, spec in (("target", target), ("foil", foil))]
    if read[0] is not None and read[1] is not None and read[0].id == read[1].id:
        raise usage_error(f"{prefix}target and {prefix}foil are the same ({read[0].text!r}): their difference is "
                          "always 0")
    return read[0], read[1]


def check_head(config: ModelConfig, heads: tuple[str, ...], reads: str, hint: str) -> None:
    """Refuse, before a model is built, one whose head is not one of `heads` ("lm", "mlm", "classifier"): `reads`
    says what the analysis reads of the output (a sentence's end, after "`name` has no head: "), `hint` what to use."""
    if config.head not in heads:
        has = "no head" if config.head == "none" else f"a `{config.head}` head"
        raise usage_error(f"{config.name} has {has}: {reads}", hint)


def position_of(ids: list[int], tokenizer: Tokenizer, config: ModelConfig, position: int | None) -> int:
    """The position the metric is read at: `position` (negative counts from the end), else a masked-LM encoder's
    [MASK] when the text has one, else the last token."""
    if position is not None:
        if not -len(ids) <= position < len(ids):
            raise usage_error(f"position {position} is out of range: the text has {len(ids)} tokens "
                              f"(0 to {len(ids) - 1})", parameter="position")
        return position % len(ids)
    mask = tokenizer.mask_token_id
    if config.head == "mlm" and mask is not None and mask in ids:
        return ids.index(mask)
    return len(ids) - 1


class Metric:
    """The logit (difference) target - foil, at `position` of a token head's logits or of a classifier's labels
    (position None)."""

    def __init__(self, target: int, foil: int | None, position: int | None):
        self.target, self.foil, self.position = target, foil, position

    def of_row(self, logits: Tensor) -> Tensor:
        """(B, V) or (B, labels) -> (B,) in float64."""
        logits = logits.double()
        value = logits[:, self.target]
        return value - logits[:, self.foil] if self.foil is not None else value

    def __call__(self, logits: Tensor) -> Tensor:
        """A model's logits, (B, T, V) or (B, labels) -> (B,)."""
        return self.of_row(logits[:, self.position] if self.position is not None else logits)
