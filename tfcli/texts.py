"""The input texts of a command: its arguments, or the lines of stdin (`-`) or of a file (`--file`), read as
they arrive so that `tail -f log | tfcli tokenize --json -` prints each record as its line comes.

Lines are handed out in batches: a batch ends when it is full or when no further line is ready yet, so a
slow stream is answered line by line and a fast one still runs in full batches. A blank line of a stream
is skipped with a warning naming it (a command that has something to say about an empty text, `tokenize`,
keeps it); a blank argument is a usage error. A batch becomes a model's input through `tokenized`, which
warns about (or refuses) a text longer than the model takes; warnings go to a `warn` callback, nothing here
prints.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from tfcli.errors import TfcliError, usage_error

if TYPE_CHECKING:
    from tfcli.tokenizer import Encoding, Tokenizer

CHUNK = 1 << 16  # bytes read at a time


@dataclass
class Input:
    text: str
    where: str  # for messages: "text 2" (an argument) or "line 5 of stdin"


class LineReader:
    """The lines of a byte stream (without their line endings, `\\r\\n` too), decoded from UTF-8 one by one
    as they arrive; `ready()` says whether the next one can be had without waiting."""

    def __init__(self, stream: BinaryIO, name: str, close: bool = False):
        self.stream, self.name, self.close = stream, name, close
        try:
            self.fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):  # an in-memory stream: everything is there already
            self.fd = None
        self.buffer = bytearray()  # read and not yet handed out from self.start on
        self.start = 0
        self.eof = False
        self.offset = 0  # bytes of the stream before self.buffer[self.start], for error messages

    def _fill(self) -> None:
        chunk = os.read(self.fd, CHUNK) if self.fd is not None else self.stream.read(CHUNK)
        self.buffer += chunk
        self.eof = not chunk

    def ready(self) -> bool:
        if self.eof or self.fd is None or self.buffer.find(b"\n", self.start) >= 0:
            return True
        return bool(select.select([self.fd], [], [], 0)[0])

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """(line number, text) for each line."""
        number = 0
        while True:
            end = self.buffer.find(b"\n", self.start)
            while end < 0 and not self.eof:
                del self.buffer[:self.start]  # what was handed out already
                self.start = 0
                searched = len(self.buffer)
                self._fill()
                end = self.buffer.find(b"\n", searched)
            if end < 0:  # the last line, without a line ending; or nothing left
                if self.start >= len(self.buffer):
                    if self.close:
                        self.stream.close()
                    return
                end = len(self.buffer)
            line = bytes(self.buffer[self.start:end])
            self.start = end + 1
            number += 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TfcliError(f"{self.name} is not valid UTF-8: line {number}, byte offset {self.offset + e.start}",
                                 "convert it first, e.g. `iconv -f latin1 -t utf-8`") from e
            self.offset += len(line) + 1
            yield number, text.removesuffix("\r")


class CappedWarnings:
    """Warnings of one kind (a truncated text, a blank line): the first `shown` printed, the rest counted and
    summed up by `finish`, so that a long stream's stderr stays readable."""

    def __init__(self, warn: Callable[[str], None], what: str, shown: int = 5):
        self.warn, self.what, self.shown, self.count = warn, what, shown, 0

    def add(self, message: str) -> None:
        self.count += 1
        if self.count <= self.shown:
            self.warn(message)

    def finish(self, total: int | None = None) -> None:
        if self.count > self.shown:
            of = f" of {total}" if total is not None else ""
            self.warn(f"{self.count - self.shown} more {self.what} ({self.count}{of} in all)")


class Inputs:
    """The texts a command runs on: arguments, or one per line of stdin (`-` alone) or of `file`."""

    def __init__(self, texts: list[str] | None, file: Path | None, keep_blank: bool = False,
                 warn: Callable[[str], None] = lambda message: None):
        self.keep_blank = keep_blank
        self.arguments: list[str] | None = None
        self.reader: LineReader | None = None
        self.blank = CappedWarnings(warn, "blank lines skipped")
        if file is not None:
            if texts:
                raise usage_error("give texts as arguments or with --file, not both")
            try:
                self.reader = LineReader(file.open("rb"), str(file), close=True)
            except OSError as e:
                raise TfcliError(f"cannot read {file}: {e.strerror}", "check the path given to --file") from e
        elif texts == ["-"]:
            self.reader = LineReader(sys.stdin.buffer, "stdin")
        elif texts:
            self.arguments = texts
            for number, text in enumerate([] if keep_blank else texts, 1):
                if not text.strip():
                    raise usage_error(f"text {number} is {'only whitespace' if text else 'empty'}: there is "
                                      "nothing to run", "give some text")
        else:
            raise usage_error("no text given", "pass texts as arguments, `-` to read stdin, or --file PATH")

    @property
    def count(self) -> int | None:
        """How many texts there are, when known before reading (arguments)."""
        return len(self.arguments) if self.arguments is not None else None

    @property
    def expected(self) -> int | None:
        """How many texts there will be, as far as known before reading: the arguments, or a regular file's lines that
        hold more than whitespace (counted once, for the progress; None for stdin or a pipe)."""
        if self.arguments is not None:
            return len(self.arguments)
        path = Path(self.reader.name) if self.reader is not None and self.reader.name != "stdin" else None
        if path is None or not path.is_file():
            return None
        with path.open("rb") as lines:
            return sum(1 for line in lines if self.keep_blank or line.strip())

    def batches(self, size: int | None) -> Iterator[list[Input]]:
        """The texts in order, in batches of at most `size` (None: all in one); a stream's batch also ends
        where no further line is ready yet. No text at all (every line blank) is a usage error."""
        if self.arguments is not None:
            items = [Input(text, f"text {number}") for number, text in enumerate(self.arguments, 1)]
            step = size or len(items)
            yield from (items[start:start + step] for start in range(0, len(items), step))
            return
        batch: list[Input] = []
        count = 0
        for number, text in self.reader:
            where = f"line {number} of {self.reader.name}"
            if not text.strip() and not self.keep_blank:
                self.blank.add(f"{where} is {'only whitespace' if text else 'empty'}: skipped")
                continue
            batch.append(Input(text, where))
            count += 1
            if size is not None and (len(batch) >= size or not self.reader.ready()):
                yield batch
                batch = []
        if batch:
            yield batch
        self.blank.finish()
        if not count:
            raise usage_error(f"no text given: {self.reader.name} " + ("holds only blank lines" if self.blank.count
                              else "is empty"), "give one text per line")


def tokenized(tokenizer: Tokenizer, batch: list[Input], positions: int, truncated: CappedWarnings,
              pair: str | None = None, max_length: int | None = None, refuse_longer: bool = False) -> list[Encoding]:
    """A batch of texts tokenized for a model with `positions` positions: truncated to --max-length (at most
    the positions) with a warning, or refused (--no-truncate)."""
    encodings = tokenizer.encode_for_model([item.text for item in batch], positions, pair, max_length)
    limit = (f"--max-length {max_length}" if max_length is not None else f"the model's {positions} positions") \
        if refuse_longer else None
    check_truncated(batch, encodings, truncated, limit)
    return encodings


def check_truncated(batch: list[Input], encodings: list[Encoding], truncated: CappedWarnings,
                    refused_beyond: str | None = None) -> None:
    """Warn about each truncated text (the first few, then a count); or, given `refused_beyond` (what a text
    may not be longer than), refuse it."""
    for item, encoding in zip(batch, encodings):
        if not encoding.truncated:
            continue
        if refused_beyond is not None:
            raise usage_error(f"{item.where} has {encoding.untruncated_length} tokens, more than {refused_beyond}",
                              "drop --no-truncate to truncate it")
        truncated.add(f"{item.where} truncated from {encoding.untruncated_length} to {len(encoding.ids)} tokens")
