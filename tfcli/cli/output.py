"""What a command shows of its results: `emit`, the one loop that prints them (the terminal view or JSON Lines) and
writes its --report; `View`, how one kind of result shows; `Report`, what a --report file says of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console

from tfcli.cli.console import say
from tfcli.render.jsonl import write_jsonl
from tfcli.render.layout import print_lines
from tfcli.render.report_file import check_report_path
from tfcli.texts import CappedWarnings

if TYPE_CHECKING:
    from rich.text import Text

    from tfcli.model import TransformerModel
    from tfcli.sources import Source

T = TypeVar("T")


@dataclass
class View:
    """How a command shows one result: on `out`, as its JSON record (`record(result)`: a dict, or a list of them)
    or its terminal view (`lines(result, number)`, numbered from 1; `spaced`: a blank line between two); in a
    --report, as `report`: its page section and figure (None: the renderer's `page_section` and `figure`, found by
    the command's name), for a renderer with a result type per mode."""

    out: Console
    record: Callable[[Any], dict[str, Any] | list[dict[str, Any]]]
    lines: Callable[[Any, int], list[Text]]
    spaced: bool = False
    report: tuple[Callable, Callable] | None = None
    of_run: bool = False  # its functions take the run's Envelope (an aggregate with its n, ...), not a value alone

@dataclass
class Report:
    """--report: where (`path`; `force` overwrites), and what the page or figure says of the run: the command, the
    model built from `source`, the tokenizer the page reads tokens with, encode's layers shown in full (`detail`)."""

    path: Path
    force: bool
    command: str
    model: TransformerModel
    source: Source
    tokenizer: Any = None
    detail: list[int] | None = None

def report_of(path: Path | None, force: bool, command: str, model: TransformerModel, source: Source,
              tokenizer: Any = None, detail: list[int] | None = None) -> Report | None:
    """The Report of --report PATH (None without it)."""
    return None if path is None else Report(path, force, command, model, source, tokenizer, detail)

def write_report_file(report: Report, items: list[Any], parts: tuple[Callable, Callable] | None = None) -> None:
    """Write --report from a command's report objects (`parts`: as View.report), and say so on stderr."""
    from tfcli.render.report_file import write_report
    from tfcli.render.run_info import run_info

    path = report.path
    check_report_path(path, report.force, len(items))  # a stream's texts are counted only now
    write_report(path, run_info(report.command, report.model, report.source.description, report.detail), items,
                 report.force, report.tokenizer, parts)
    say(f"wrote {path}", whole=[str(path)])  # a path is never broken across lines

def write_text(path: Path, text: str) -> None:
    """A command's output file of text (--graph-out), written atomically, and said on stderr."""
    from tfcli.errors import replace_atomically

    replace_atomically(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
    say(f"wrote {path}", whole=[str(path)])  # a path is never broken across lines


def emit(results: Iterable[T], view: View, json_output: bool, *, after: Callable[[], None] | None = None,
         truncated: CappedWarnings | None = None, report: Report | None = None, first: int = 1) -> int:
    """The one way a command shows what its core yields: each result, as it comes, as one JSON line
    (`view.record(result)`: a dict, or a list of them, a JSON line each) or as its terminal view (`view.lines(result,
    number)`, numbered from `first`); then `after()`, the note of the texts `truncated` beyond those already said,
    and --report (`report`: every result, written by `write_report_file`). Returns the number of results."""
    number, kept = first - 1, []  # kept: every result, for --report
    for result in results:
        number += 1
        if json_output:
            written = view.record(result)
            write_jsonl(written if isinstance(written, list) else [written])
        else:
            if view.spaced and number > first:
                view.out.print()  # a blank line between results
            print_lines(view.out, view.lines(result, number))
        if report is not None:
            kept.append(result)
    if after is not None:
        after()
    if truncated is not None:
        truncated.finish(number - first + 1)
    if report is not None:
        write_report_file(report, kept, view.report)
    return number - first + 1
