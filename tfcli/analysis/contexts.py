"""A feature's top activating contexts over a corpus, streamed: only the best `count` are kept (a heap), each a token
with the tokens around it. `features --feature N` and `graph --contexts FILE` keep them."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

BEFORE, AFTER = 10, 4  # tokens of a context shown before and after its token


@dataclass
class Context:
    """A token where the feature is active, with the tokens around it."""

    activation: float
    text: int  # the text's number (its line)
    position: int
    before: list[str]
    token: str
    after: list[str]


class TopContexts:
    """The `count` largest positive activations seen so far, each with its context; of equal activations the one
    seen first ranks first."""

    def __init__(self, count: int):
        self.count = count
        self.heap: list[tuple[float, int, int, Context]] = []
        self.order = itertools.count()

    def add(self, activation: float, text: int, position: int, tokens: list[str]) -> None:
        """The activation at `position` of text number `text` (its tokens), kept if among the best so far."""
        if activation <= 0 or self.count <= 0 or (len(self.heap) == self.count and activation <= self.heap[0][0]):
            return
        context = Context(activation, text, position, tokens[max(0, position - BEFORE):position], tokens[position],
                          tokens[position + 1:position + 1 + AFTER])
        entry = (activation, -next(self.order), position, context)
        if len(self.heap) < self.count:
            heapq.heappush(self.heap, entry)
        else:
            heapq.heapreplace(self.heap, entry)

    def best(self) -> list[Context]:
        """The contexts kept, the largest activation first."""
        return [entry[3] for entry in sorted(self.heap, key=lambda e: (-e[0], -e[1]))]
