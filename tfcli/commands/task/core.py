"""Task datasets for a model's tokenizer: pairs of a clean and a corrupted prompt with a target and a foil token, the
lines `tfcli task` writes and `--dataset FILE` reads ({"clean", "corrupt", "target", "foil"}).

- `ioi`: indirect-object identification, the BABA and ABBA templates of Wang et al. (2022), "Interpretability in
  the Wild"; the corrupt prompt puts three other names in the three name slots (their ABC distribution).
- `greater-than`: "The war lasted from the year 17YY to the year 17" (Hanna et al. 2023), corrupt: the year 1701.
- `induction`: a random sequence of word tokens, then that sequence again without its last token; corrupt: another
  first half.
- `facts`: a subject, a relation and its one-token object from `tfcli/commands/task/facts.tsv`, one template per
relation;
  corrupt: another subject of the relation whose prompt has as many tokens (its object is the foil).

Each line also names its position spans (`spans`: {"clean": {name: [start, end]}, "corrupt": {...}}, character
ranges of each text, as `circuit --positions spans` reads them): ioi `io`, `s1`, `s2` (the three name slots) and
`end` (the last word); greater-than `noun`, `yy` (the start year's last two digits) and `end`; induction `first` (the
first sequence), `repeat` (its repetition but the last word) and `end`; facts `subject` and `end`. What no span names
(the template's other words) is the `other` span of docs/datasets.md.

Every line is checked before it is kept, on the tokenizer at hand: the target and foil are single tokens that the
clean prompt reads as its next token (the prompt's ids with the token's text appended are the prompt's ids and that
token's), each written as text that `analysis.metric.parse_token` reads back as exactly that token, and the clean and
corrupt prompts are as many tokens as the model reads them (`analysis.inputs.model_input`). What the tokenizer cannot
give is left out, and a task with nothing left is refused, saying why. The draws are seeded (`random.Random(seed)`):
the same tokenizer and seed give the same lines, and no draw depends on n, so that n lines are the first n of any
longer run (ioi and facts draw in blocks of DEFAULT_N lines, which keeps the default 100 lines those that tfcli drew
when the draws did depend on n). docs/tasks.md has the templates and the choices behind them.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from tfcli.analysis.inputs import model_input
from tfcli.analysis.metric import parse_token
from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from tfcli.config import ModelConfig
    from tfcli.tokenizer import Tokenizer

TASKS = ("ioi", "greater-than", "induction", "facts")
DEFAULT_N = 100
FACTS_FILE = Path(__file__).resolve().parent / "facts.tsv"

# ---------------------------------------------------------------- ioi (Wang et al. 2022)

# Their BABA templates, the indirect object [A] last (the answer, left out of the prompt); the ABBA ones swap the
# two names of the first clause.
BABA_TEMPLATES = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")
# Common English first names; those that are not one token after a space in the tokenizer at hand are left out.
NAMES = (
    "Aaron Adam Alan Albert Alex Alice Amanda Amy Andrew Andy Angela Anna Anne Anthony Arthur Ashley Austin Barbara "
    "Ben Benjamin Betty Bill Bob Brandon Brian Bruce Carl Carol Catherine Charles Charlie Chris Christian Christina "
    "Christopher Daniel David Dean Deborah Dennis Diana Donald Dorothy Douglas Edward Elizabeth Emily Emma Eric Frank "
    "Gary George Grace Gregory Harry Helen Henry Ian Jack Jacob James Jane Janet Jason Jeff Jennifer Jeremy Jerry "
    "Jessica Jim Joe John Jonathan Joseph Joshua Julia Justin Karen Kate Katherine Keith Kelly Kevin Kyle Larry Laura "
    "Lauren Linda Lisa Louis Lucy Luke Margaret Maria Mark Martin Mary Matthew Max Megan Michael Michelle Nancy Nathan "
    "Nicholas Nicole Oliver Patricia Patrick Paul Peter Philip Rachel Ralph Raymond Rebecca Richard Robert Roger Rose "
    "Ruth Ryan Sam Samuel Sandra Sarah Scott Sean Simon Sophie Stephen Steve Steven Susan Thomas Timothy Tom Tony "
    "Tyler Victoria Walter William"
).split()


def _abba(template: str) -> str:
    """A BABA template with the first clause's two names swapped: "Then, [A] and [B] went ... [B] gave ... [A]"."""
    first, second = template.index("[B]"), template.index("[A]")
    return template[:first] + "[A]" + template[first + 3:second] + "[B]" + template[second + 3:]


IOI_TEMPLATES = {"ABBA": tuple(_abba(t) for t in BABA_TEMPLATES), "BABA": BABA_TEMPLATES}
NAME_SLOT = re.compile(r"\[[AB]\]")

# ---------------------------------------------------------------- greater-than (Hanna et al. 2023)

GREATER_THAN_TEMPLATE = "The {noun} lasted from the year 17{yy} to the year 17"
# nouns of the paper's list (and "war", its running example): events that last
GREATER_THAN_NOUNS = ("war", "expedition", "campaign", "siege", "voyage", "reign", "journey", "pilgrimage", "dynasty",
                      "epidemic", "treaty", "invasion", "rivalry", "marriage", "insurgency", "quest", "trial", "tour",
                      "plague", "friendship")
YEARS = range(2, 99)  # YY from 02 to 98, as in the paper: YY+1 and YY-1 are two-digit years too
CORRUPT_YEAR = "01"

# ---------------------------------------------------------------- induction

INDUCTION_LENGTH = 10  # tokens in the random sequence; the prompt repeats it without its last token
INDUCTION_POOL = 5000  # the words drawn from: the first of the vocabulary (in BPE the earliest merges, the commonest)
WORD = re.compile(r"[a-z]{3,}")


def dictionary() -> frozenset[str]:
    """English words: the whole-word entries of the bundled BERT vocabulary (lower case, three letters or more), so
    that a byte-level BPE's word-start pieces (" simpl", " diagn") are not taken for words."""
    from tfcli.tokenizer.loading import BUNDLED_VOCAB  # here: the tokenizers library is not imported with the CLI

    entries = BUNDLED_VOCAB.read_text(encoding="utf-8").split()
    return frozenset(entry for entry in entries if WORD.fullmatch(entry))

# ---------------------------------------------------------------- facts

FACT_TEMPLATES = {
    "landmark_city": "{} is in the city of",
    "capital": "The capital of {} is",
    "language": "The official language of {} is",
    "city_country": "{} is a city in the country of",
    "sport": "{} is a professional",
    "product_company": "{} is a product of",
    "currency": "The currency of {} is the",
    "continent": "{} is located in the continent of",
}


@dataclass(frozen=True)
class Fact:
    """A row of the facts table."""

    subject: str
    relation: str
    object: str

    @property
    def prompt(self) -> str:
        """The relation's template on the subject, capitalised where it opens the sentence."""
        template = FACT_TEMPLATES[self.relation]
        subject = self.subject[:1].upper() + self.subject[1:] if template.startswith("{}") else self.subject
        return template.format(subject)

    @property
    def spans(self) -> dict[str, list[int]]:
        """The prompt's spans: the subject and the end."""
        before, after = FACT_TEMPLATES[self.relation].split("{}")
        subject = self.prompt[len(before):len(self.prompt) - len(after)]
        return composed([(before, None), (subject, "subject"), (after, None)])[1]


def read_facts(path: Path = FACTS_FILE) -> list[Fact]:
    """The table: a header line, then subject, relation and object separated by tabs."""
    facts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()[1:], 2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3 or fields[1] not in FACT_TEMPLATES:
            raise TfcliError(f"{path}, line {number}: expected subject, relation ({', '.join(FACT_TEMPLATES)}) "
                             f"and object separated by tabs, got {line!r}")
        facts.append(Fact(*fields))
    return facts


# ---------------------------------------------------------------- what a tokenizer makes of texts


class Reader:
    """A tokenizer's (and its model's) reading of texts, remembered, with the checks every line passes."""

    def __init__(self, tokenizer: Tokenizer, config: ModelConfig):
        self.tokenizer, self.config = tokenizer, config
        self._ids: dict[str, list[int]] = {}
        self._lengths: dict[str, int] = {}
        self._written: dict[int, str | None] = {}

    def ids(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, without special tokens (new texts tokenized in one batch)."""
        new = list(dict.fromkeys(t for t in texts if t not in self._ids))
        if new:
            for text, encoding in zip(new, self.tokenizer.encode(new, add_special_tokens=False)):
                self._ids[text] = list(encoding.ids)
        return [self._ids[t] for t in texts]

    def lengths(self, texts: list[str]) -> list[int]:
        """How many tokens the model reads of each text (its start token, if the tokenizer adds one, included)."""
        new = list(dict.fromkeys(t for t in texts if t not in self._lengths))
        if new:
            for text, encoding in zip(new, self.tokenizer.encode(new)):
                self._lengths[text] = len(model_input(self.config, encoding))
        return [self._lengths[t] for t in texts]

    def one_token(self, texts: list[str]) -> list[int | None]:
        """Each text's id where the text is one token, else None."""
        return [ids[0] if len(ids) == 1 else None for ids in self.ids(texts)]

    def written(self, token_id: int) -> str | None:
        """The token as the text it stands for (" Mary" in byte-level BPE, "mary" in the bundled WordPiece), else
        its vocabulary entry ("##33"): whichever `parse_token` reads back as exactly this id; None if neither."""
        if token_id not in self._written:
            found = None
            for text in (self.tokenizer.decode([token_id], skip_special_tokens=False),
                         self.tokenizer.id_to_token(token_id)):
                if text and self.reads_back(text, token_id):
                    found = text
                    break
            self._written[token_id] = found
        return self._written[token_id]

    def reads_back(self, text: str, token_id: int) -> bool:
        try:
            return parse_token(self.tokenizer, text, "--target", self.config.vocab_size).id == token_id
        except TfcliError:
            return False

    def line(self, clean: str, corrupt: str, target: str, foil: str, spans: dict | None = None) -> dict | None:
        """The dataset line of a clean and corrupt prompt whose next token is the text `target` (or `foil`), when
        every check passes: target and foil are one token each, different, what the clean prompt reads next (its ids
        then the token's), written so that parse_token reads them back; and the two prompts are as long. `spans`:
        the line's {"clean": {name: [start, end]}, "corrupt": {...}}, written as given."""
        base, with_target, with_foil = self.ids([clean, clean + target, clean + foil])
        if with_target[:-1] != base or with_foil[:-1] != base or with_target[-1] == with_foil[-1]:
            return None
        written = [self.written(with_target[-1]), self.written(with_foil[-1])]
        if None in written:
            return None
        clean_length, corrupt_length = self.lengths([clean, corrupt])
        if clean_length != corrupt_length:
            return None
        line = {"clean": clean, "corrupt": corrupt, "target": written[0], "foil": written[1]}
        return line if spans is None else line | {"spans": spans}


# ---------------------------------------------------------------- position spans


def composed(pieces: list[tuple[str, str | None]]) -> tuple[str, dict[str, list[int]]]:
    """A text made of pieces (text, the span it is, or None) and each named piece's [start, end) characters, with
    `end` the text's last word (where the metric is read)."""
    text, spans = "", {}
    for piece, name in pieces:
        if name is not None:
            spans[name] = [len(text), len(text) + len(piece)]
        text += piece
    stripped = text.rstrip()
    spans["end"] = [len(stripped) - len(stripped.split()[-1]), len(stripped)]
    return text, spans


# ---------------------------------------------------------------- the tasks


class Task:
    """A task's lines for one tokenizer: `maximum` distinct clean prompts, `draw(rng, n)` n of them: the first n of
    what any larger n draws (no draw depends on n)."""

    def __init__(self, reader: Reader):
        self.reader = reader

    @property
    def maximum(self) -> int:
        raise NotImplementedError

    def draw(self, rng: random.Random, n: int) -> list[dict[str, str]]:
        raise NotImplementedError


def _distinct(rng: random.Random, count: int, line: Callable[[int], dict[str, str] | None]) -> Iterator[dict]:
    """Lines from distinct random indices of range(count), in the order drawn, skipping those `line` refuses (None),
    until every index is tried or (among many) 20 per line made and 1,000 more are: draws that do not depend on how
    many lines are taken."""
    made = 0
    if count <= 100_000:
        order = list(range(count))
        rng.shuffle(order)
        indices: Iterator[int] = iter(order)
    else:
        def fresh() -> Iterator[int]:
            tried: set[int] = set()
            while len(tried) < 20 * (made + 1) + 1000:
                index = rng.randrange(count)
                if index not in tried:
                    tried.add(index)
                    yield index

        indices = fresh()
    for index in indices:
        result = line(index)
        if result is not None:
            made += 1
            yield result


class IOI(Task):
    """Indirect-object identification (Wang et al. 2022): ABBA and BABA prompts in turn, corrupted by three other
    names."""

    @cached_property
    def names(self) -> list[str]:
        ids = self.reader.one_token([" " + name for name in NAMES])
        kept, seen = [], set()
        for name, token_id in zip(NAMES, ids):
            if token_id is not None and token_id not in seen and self.reader.written(token_id) is not None:
                kept.append(name)
                seen.add(token_id)
        if len(kept) < 5:
            raise usage_error(f"ioi needs 5 first names that are one token of {self.reader.tokenizer.name} after a "
                              f"space (two for the prompt, three others for its corruption); it has {len(kept)}")
        return kept

    def _sizes(self) -> list[int]:
        """The clean prompts of each template: ordered name pairs, times places and objects where it has them."""
        pairs = len(self.names) * (len(self.names) - 1)
        return [pairs * (len(PLACES) if "[PLACE]" in t else 1) * (len(OBJECTS) if "[OBJECT]" in t else 1)
                for t in BABA_TEMPLATES]

    @property
    def maximum(self) -> int:
        return 2 * sum(self._sizes())  # as many per order, and the orders alternate

    def _prompt(self, order: str, index: int) -> tuple[str, str, str, dict[str, str]]:
        """The index-th clean prompt of an order: (template, A, B, {place, object})."""
        sizes = self._sizes()
        template = 0
        while index >= sizes[template]:
            index -= sizes[template]
            template += 1
        text = IOI_TEMPLATES[order][template]
        index, pair = divmod(index, len(self.names) * (len(self.names) - 1))
        nouns = {}
        for slot, words in (("[PLACE]", PLACES), ("[OBJECT]", OBJECTS)):
            if slot in text:
                index, which = divmod(index, len(words))
                nouns[slot] = words[which]
        first, second = divmod(pair, len(self.names) - 1)
        second += second >= first
        return text, self.names[first], self.names[second], nouns

    def draw(self, rng: random.Random, n: int) -> list[dict[str, str]]:
        per_order = sum(self._sizes())
        made = {order: _distinct(rng, per_order, lambda i, o=order: self._line(rng, o, i)) for order in IOI_TEMPLATES}
        drawn: dict[str, list[dict[str, str]]] = {order: [] for order in IOI_TEMPLATES}
        # whole blocks of DEFAULT_N lines, each block's ABBA half drawn before its BABA half: a line's draws never
        # depend on n
        wanted = {"ABBA": (n + 1) // 2, "BABA": n // 2}
        while any(len(drawn[order]) < count for order, count in wanted.items()):
            before = sum(map(len, drawn.values()))
            for order in ("ABBA", "BABA"):
                drawn[order] += itertools.islice(made[order], DEFAULT_N // 2)
            if sum(map(len, drawn.values())) == before:
                passed = sum(min(len(drawn[order]), count) for order, count in wanted.items())
                raise TfcliError(f"ioi: only {passed} of {n} prompts passed the checks on "
                                 f"{self.reader.tokenizer.name}")
        return [drawn["ABBA" if i % 2 == 0 else "BABA"][i // 2] for i in range(n)]  # the orders alternate

    def _line(self, rng: random.Random, order: str, index: int) -> dict | None:
        template, a, b, nouns = self._prompt(order, index)
        prompt = template.removesuffix(" [A]")
        for slot, word in nouns.items():
            prompt = prompt.replace(slot, word)
        parts = NAME_SLOT.split(prompt)  # the text around the three name slots
        slots = NAME_SLOT.findall(prompt)
        roles = ["io" if slot == "[A]" else "s1" if slots[:k].count("[B]") == 0 else "s2" for k, slot in
                 enumerate(slots)]  # the indirect object, the subject, the subject again
        others = rng.sample([name for name in self.names if name not in (a, b)], 3)  # the corrupt slots' C, D, E

        def text(names: list[str]) -> tuple[str, dict[str, list[int]]]:
            pieces = [(parts[0], None)]
            for name, role, after in zip(names, roles, parts[1:]):
                pieces += [(name, role), (after, None)]
            return composed(pieces)
        clean, clean_spans = text([a if slot == "[A]" else b for slot in slots])
        corrupt, corrupt_spans = text(others)
        return self.reader.line(clean, corrupt, " " + a, " " + b, {"clean": clean_spans, "corrupt": corrupt_spans})


def greater_than_prompt(noun: str, yy: str) -> tuple[str, dict[str, list[int]]]:
    """GREATER_THAN_TEMPLATE on a noun and two digits, with its spans: the noun, the digits and the end."""
    before, middle = GREATER_THAN_TEMPLATE.split("{noun}")
    middle, after = middle.split("{yy}")
    text, spans = composed([(before, None), (noun, "noun"), (middle, None), (yy, "yy"), (after, None)])
    assert text == GREATER_THAN_TEMPLATE.format(noun=noun, yy=yy)
    return text, spans


class GreaterThan(Task):
    """Greater-than (Hanna et al. 2023): "The war lasted from the year 17YY to the year 17", corrupt: 1701."""

    @cached_property
    def lines(self) -> list[dict[str, str]]:
        """Every (noun, YY) that passes the checks, in order: target YY+1, foil YY-1."""
        kept = []
        for noun in GREATER_THAN_NOUNS:
            for yy in YEARS:
                clean, clean_spans = greater_than_prompt(noun, f"{yy:02d}")
                corrupt, corrupt_spans = greater_than_prompt(noun, CORRUPT_YEAR)
                line = self.reader.line(clean, corrupt, f"{yy + 1:02d}", f"{yy - 1:02d}",
                                        {"clean": clean_spans, "corrupt": corrupt_spans})
                if line is not None:
                    kept.append(line)
        if not kept:
            ids = self.reader.ids([" 1732"])[0]
            pieces = [self.reader.tokenizer.decode([i], skip_special_tokens=False) for i in ids]
            shown = " ".join(repr(p) for p in pieces)
            digits = len(pieces) >= 4 and all(re.fullmatch(r"\d?", p.strip()) for p in pieces)
            why = " (one token per digit)" if digits else " (the whole year as one token)" if len(pieces) == 1 else ""
            raise usage_error(f"greater-than needs a tokenizer that reads a year 17YY as two tokens, '17' then 'YY', "
                              f"so that the model's next token after \"... to the year 17\" is a two-digit year; "
                              f"{self.reader.tokenizer.name} reads ' 1732' as {shown}{why}",
                              "the task is for tokenizers like GPT-2's, which read 1732 as '17' '32'")
        return kept

    @property
    def maximum(self) -> int:
        return len(self.lines)

    def draw(self, rng: random.Random, n: int) -> list[dict[str, str]]:
        # a line at a time, drawn again when one comes up twice (rng.sample's draws depend on n)
        chosen: dict[int, None] = {}
        while len(chosen) < n:
            chosen.setdefault(rng.randrange(len(self.lines)))
        return [self.lines[index] for index in chosen]


class Induction(Task):
    """A random sequence of words and its repetition but the last; corrupt: another first half."""

    @cached_property
    def pool(self) -> list[int]:
        """The first INDUCTION_POOL ids that are an English word in lower case (`dictionary`), one token after a
        space (" the" in byte-level BPE, "the" in WordPiece), written back as itself."""
        tokenizer, words = self.reader.tokenizer, dictionary()
        candidates = []
        for token_id in range(tokenizer.vocab_size):
            word = tokenizer.decode([token_id], skip_special_tokens=False).strip()
            if word in words:
                candidates.append((token_id, word))
        pool: list[int] = []
        for start in range(0, len(candidates), 2000):  # in chunks: the pool is full long before the vocabulary ends
            chunk = candidates[start:start + 2000]
            for (token_id, _), found in zip(chunk, self.reader.one_token([" " + word for _, word in chunk])):
                if found == token_id and len(pool) < INDUCTION_POOL and self.reader.written(token_id) is not None:
                    pool.append(token_id)
            if len(pool) == INDUCTION_POOL:
                break
        if len(pool) < 2 * INDUCTION_LENGTH + 1:
            raise usage_error(f"induction needs {2 * INDUCTION_LENGTH + 1} words that are one token of "
                              f"{tokenizer.name} after a space; it has {len(pool)}")
        return pool

    @property
    def maximum(self) -> int:
        return math.perm(len(self.pool), INDUCTION_LENGTH)

    def text(self, ids: list[int]) -> str:
        return "".join(" " + self.reader.tokenizer.decode([i], skip_special_tokens=False).strip() for i in ids)

    def spans(self, ids: list[int]) -> dict[str, list[int]]:
        """A prompt's spans: the first sequence, its repetition but the last word, and the last word."""
        first, repeat = len(self.text(ids[:INDUCTION_LENGTH])), len(self.text(ids[INDUCTION_LENGTH:-1]))
        whole = len(self.text(ids))  # each word's leading space is left out of its span
        return {"first": [1, first], "repeat": [first + 1, first + repeat], "end": [first + repeat + 1, whole]}

    def draw(self, rng: random.Random, n: int) -> list[dict[str, str]]:
        lines, seen, tries = [], set(), 0
        while len(lines) < n:
            tries += 1
            if tries > 20 * n + 1000:
                raise TfcliError(f"induction: only {len(lines)} of {n} sequences passed the checks on "
                                 f"{self.reader.tokenizer.name}")
            drawn = rng.sample(self.pool, 2 * INDUCTION_LENGTH + 1)  # distinct: sequence, other first half, foil
            sequence, other, foil = drawn[:INDUCTION_LENGTH], drawn[INDUCTION_LENGTH:-1], drawn[-1]
            if tuple(sequence) in seen:
                continue
            seen.add(tuple(sequence))
            clean_ids, corrupt_ids = sequence + sequence[:-1], other + sequence[:-1]
            clean, corrupt = self.text(clean_ids), self.text(corrupt_ids)
            if self.reader.ids([clean, corrupt]) != [clean_ids, corrupt_ids]:  # the text reads as exactly these
                continue
            line = self.reader.line(clean, corrupt, self.text([sequence[-1]]), self.text([foil]),
                                    {"clean": self.spans(clean_ids), "corrupt": self.spans(corrupt_ids)})
            if line is not None:
                lines.append(line)
        return lines


class Facts(Task):
    """A fact of the table on its relation's template; corrupt: another subject of the relation, as many tokens."""

    @cached_property
    def partners(self) -> list[tuple[Fact, list[dict[str, str]]]]:
        """Each fact of the table whose object is one token, with its lines: one per other subject of the relation
        whose prompt has as many tokens and whose object differs (the foil)."""
        facts = read_facts()
        objects = self.reader.one_token([" " + fact.object for fact in facts])
        facts = [fact for fact, token_id in zip(facts, objects) if token_id is not None]
        lengths = dict(zip(facts, self.reader.lengths([fact.prompt for fact in facts])))
        pairs = {fact: [other for other in facts if other.relation == fact.relation and other.object != fact.object
                        and lengths[other] == lengths[fact]] for fact in facts}
        self.reader.ids([fact.prompt + " " + other.object for fact in facts for other in [fact, *pairs[fact]]])
        kept = []
        for fact in facts:
            lines = [self.reader.line(fact.prompt, other.prompt, " " + fact.object, " " + other.object,
                                      {"clean": fact.spans, "corrupt": other.spans}) for other in pairs[fact]]
            lines = [line for line in lines if line is not None]
            if lines:
                kept.append((fact, lines))
        if not kept:
            raise usage_error(f"facts: no fact of {FACTS_FILE.name} fits {self.reader.tokenizer.name} (an object of "
                              "one token, and another subject of its relation as many tokens long)")
        return kept

    @property
    def maximum(self) -> int:
        return len(self.partners)

    def draw(self, rng: random.Random, n: int) -> list[dict[str, str]]:
        pool, lines = list(self.partners), []
        while len(lines) < n:  # whole blocks of DEFAULT_N facts, then their partners: no draw depends on n
            block = []
            for _ in range(min(DEFAULT_N, len(pool))):  # as random.sample draws from a pool
                index = rng.randrange(len(pool))
                block.append(pool[index])
                pool[index] = pool[-1]
                pool.pop()
            lines += [rng.choice(partners) for _, partners in block[:n - len(lines)]]
        return lines


TASK_CLASSES: dict[str, type[Task]] = {"ioi": IOI, "greater-than": GreaterThan, "induction": Induction,
                                       "facts": Facts}


def check_task(task: str) -> None:
    """A task name that is not one of TASKS: a usage error naming them."""
    if task not in TASK_CLASSES:
        raise usage_error(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def maximum(task: str, tokenizer: Tokenizer, config: ModelConfig) -> int:
    """How many distinct lines `task` can give for this tokenizer."""
    check_task(task)
    return TASK_CLASSES[task](Reader(tokenizer, config)).maximum


def generate(task: str, tokenizer: Tokenizer, config: ModelConfig, n: int = DEFAULT_N,
             seed: int = 0) -> list[dict[str, str]]:
    """n lines of `task` for the tokenizer (and the model of `config`), each {"clean", "corrupt", "target", "foil"},
    drawn with `seed`; distinct clean prompts. An n beyond what the task can give is refused, naming the maximum."""
    check_task(task)
    if n < 1:
        raise usage_error(f"n must be at least 1, got {n}", parameter="n")
    job = TASK_CLASSES[task](Reader(tokenizer, config))
    most = job.maximum
    if n > most:
        raise usage_error(f"n {n} is more than {task} can give for {tokenizer.name}: at most {most:,} lines",
                          f"ask for --n {most} or fewer", parameter="n")
    return job.draw(random.Random(seed), n)
