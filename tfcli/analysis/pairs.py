"""A clean/corrupt pair, what patching (and any analysis that compares a clean run with a corrupted one: a circuit's
edges) reads: the two texts as the model reads them, of the same length (`pair_inputs`; a LengthMismatch aligns the
two tokenizations to show where they part), a dataset's line of a pair checked before any model is built
(`PAIR_LINE`, `check_pair`), what an analysis of the runner over such a dataset declares of its items (`OverPairs`:
`patch`'s and `circuit`'s), and whether the pair's clean and corrupt values of the metric differ enough to be
divided by (`same_value`, `small_gap`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcli.analysis.dataset import Line, LineSpec, check_one_metric
from tfcli.analysis.inputs import check_length, model_input
from tfcli.analysis.metric import parse_metric, position_of
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.tokenizer import Tokenizer

# |clean - corrupt| under this fraction of max(|clean|, |corrupt|, 1) is a small gap: the scores, divided by it, read
# ordinary changes of the metric as large ones (docs/commands.md#patch says why)
SMALL_GAP = 0.1


def same_value(clean: float, corrupt: float) -> bool:
    """The clean and corrupt values are equal (to 1e-6 of their size): no score can be normalised by their gap."""
    return abs(clean - corrupt) < 1e-6 * max(1.0, abs(clean))


def small_gap(clean: float, corrupt: float) -> bool:
    """|clean - corrupt| < SMALL_GAP x max(|clean|, |corrupt|, 1)."""
    return abs(clean - corrupt) < SMALL_GAP * max(abs(clean), abs(corrupt), 1.0)


class LengthMismatch(TfcliError):
    """The clean and corrupt texts tokenize to different lengths; `rows` align them: (clean index, clean token's
    text, corrupt index, corrupt token's text, mark) with None where one side has no token, mark `=`, `≠`, `+` or `-`."""

    def __init__(self, message: str, hint: str, rows: list[tuple[int | None, str | None, int | None, str | None, str]]):
        super().__init__(message, hint, exit_code=2)
        self.rows = rows


def pair_inputs(config: ModelConfig, tokenizer: Tokenizer, clean: str, corrupt: str) -> tuple[list[int], list[int]]:
    """The ids the model reads for the two texts (a decoder: as a prompt, without an appended end token); a
    LengthMismatch when their lengths differ, with the two tokenizations aligned."""
    encodings = tokenizer.encode([clean, corrupt])
    ids = [model_input(config, e) for e in encodings]
    # a text that gives no token of its own (nothing, or only the special tokens the tokenizer adds) is empty
    empty = [name for name, encoding in zip(("clean", "corrupt"), encodings)
             if all(sequence is None for sequence in encoding.sequence_ids)]
    if len(empty) == 2:
        raise usage_error("the clean and corrupt texts are both empty: they give no token of their own",
                          "give two texts of the same number of tokens that differ where the model should notice")
    for text, row in zip(("clean", "corrupt"), ids):
        check_length(config, len(row), f"the {text} text has")
    if len(ids[0]) != len(ids[1]) or empty:
        tokens = [tokenizer.texts(row) for row in ids]  # as people read them: ' Mary', not 'ĠMary'
        hint = "reword one so that both have the same number of tokens (swap words that are one token each)"
        if empty:
            other = ("corrupt", "clean")[("clean", "corrupt").index(empty[0])]
            hint = f"the {empty[0]} text is empty (no token of its own): give it a text of as many tokens as the " \
                   f"{other} one"
        raise LengthMismatch(
            f"the clean and corrupt texts tokenize to different lengths ({len(ids[0])} and {len(ids[1])} tokens): "
            "patching puts back position for position", hint, align(*tokens))
    return ids[0], ids[1]


def align(clean: list[str], corrupt: list[str]) -> list[tuple[int | None, str | None, int | None, str | None, str]]:
    """The two token lists aligned (difflib): equal runs side by side, replaced runs row by row (`≠`), the rest
    with a blank on the side that lacks them (`-`: only in clean, `+`: only in corrupt)."""
    import difflib

    rows: list[tuple[int | None, str | None, int | None, str | None, str]] = []
    for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, clean, corrupt, autojunk=False).get_opcodes():
        for k in range(max(a1 - a0, b1 - b0)):
            i, j = a0 + k, b0 + k
            left = (i, clean[i]) if i < a1 else (None, None)
            right = (j, corrupt[j]) if j < b1 else (None, None)
            mark = "=" if op == "equal" else "≠" if left[0] is not None and right[0] is not None else \
                "-" if right[0] is None else "+"
            rows.append((*left, *right, mark))
    return rows


# a line of a dataset of pairs; `spans` (tfcli task writes them) is read by `circuit --positions spans`
PAIR_LINE = LineSpec(("clean", "corrupt", "target"), ("foil", "position"), raw=("spans",))


@dataclass
class Pair:
    """A clean/corrupt pair: a checked line of a dataset of pairs, or a single run's texts (patch.run_ids)."""

    line: int | None  # None: a single run's texts
    clean: str
    corrupt: str
    ids_clean: list[int]
    ids_corrupt: list[int]
    target: str  # as the line gives them
    foil: str | None
    position: int | None
    end: int  # where `--align end` counts back from: the metric's position (a stack that reads the texts), else the
    # last token


def check_pair(config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
    """A dataset line checked as a single run's texts and options are (one token each, the pair's lengths, the
    position in range), before any model is built."""
    fields = line.fields
    parse_metric(config, tokenizer, fields["target"], fields["foil"], fields["position"], prefix="")
    try:
        ids_clean, ids_corrupt = pair_inputs(config, tokenizer, fields["clean"], fields["corrupt"])
    except LengthMismatch as mismatch:
        raise usage_error(mismatch.message.split(":")[0]) from None
    end = len(ids_clean) - 1
    if config.head != "classifier" and config.architecture != "encoder-decoder":
        end = position_of(ids_clean, tokenizer, config, fields["position"])
    elif fields["position"] is not None and config.head != "classifier":
        position_of([0], tokenizer, config, fields["position"])  # an encoder-decoder's metric: the decoder's first
    return Pair(line.number, fields["clean"], fields["corrupt"], ids_clean, ids_corrupt, fields["target"],
                fields["foil"], fields["position"], end)


class OverPairs:
    """What an analysis of the runner (tfcli/runner.py) over a dataset of clean/corrupt pairs declares of its items
    (`patch`'s, `circuit`'s): an item is a line's Pair, checked as a single run's texts are (check_pair), the metric
    of one kind over the pairs (check_items: a subclass that reads more from the pairs calls it first), and an
    item's result shown as it is (`shown`). A subclass names its `command` and runs and aggregates the pairs."""

    unit, line, block, streams = "pairs", PAIR_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Pair:
        return check_pair(config, tokenizer, line)

    def check_items(self, pairs: list[Pair]) -> None:
        check_one_metric(pairs)

    def shown(self, result: Any) -> Any:
        return result
