"""Terminal layout shared by the renderers: tables laid out to a width, text wrapped between whole items,
the shade ramp for weights, and the console the views are printed on.

The rule (README, "Terminal views"): never cut a number or a token. A table too wide for the terminal goes
on in pages of columns (its key columns repeated on each page); a cell too wide for any page breaks between
its items (tokens, numbers), never inside one; only an item wider than the whole page is folded over
several lines, every character kept. A view is a list of `rich.text.Text` lines, each at most `width` cells.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

GAP = 2  # spaces between columns
MIN_WIDTH = 40  # the narrowest layout (--width's lower bound)
PIPE_WIDTH = 120  # when neither stdout nor stderr is a terminal and nothing says otherwise

# Weights in [0, 1] on an absolute scale: (lowest weight, glyph, colour). The glyph alone carries the level
# (no colour, any theme); the colours (256-colour palette, mid-luminance, readable on dark and light
# backgrounds) only add to it. Below the last threshold: blank (masked keys are exactly 0).
HEAT = ((0.5, "█", "color(160)"), (0.3, "▓", "color(166)"), (0.15, "▒", "color(172)"), (0.05, "░", "color(178)"),
        (0.005, "·", "color(245)"))


def heat(weight: float) -> Text:
    """One cell of a heatmap: the glyph (and colour) of `weight`'s level, or a blank below 0.005."""
    return Text(*_level(weight))


def heat_row(weights: Sequence[float], spaced: bool = False, color: bool = True) -> Text:
    """A row of heat cells (a space between them when `spaced`), as one Text; colour only when `color`."""
    glyphs = [_level(w) for w in weights]
    row = Text(("" if not spaced else " ").join(glyph for glyph, _ in glyphs))
    if color:
        step = 2 if spaced else 1
        start = 0
        for end in range(1, len(glyphs) + 1):  # one span per run of equal colours
            if end == len(glyphs) or glyphs[end][1] != glyphs[start][1]:
                if glyphs[start][1]:
                    row.stylize(glyphs[start][1], start * step, (end - 1) * step + 1)
                start = end
    return row


def _level(weight: float) -> tuple[str, str]:
    for lowest, glyph, colour in HEAT:
        if weight >= lowest:
            return glyph, colour
    return " ", ""


def heat_legend(width: int) -> list[Text]:
    """The scale of `heat`, wrapped to `width`."""
    items = [Text(glyph, style=colour) + Text(f" ≥{lowest:g}", style="dim") for lowest, glyph, colour in reversed(HEAT)]
    return wrap([Text("scale:", style="dim"), *items, Text("(blank: less)", style="dim")], width)


def shown(token: str) -> str:
    """A token as the terminal can show it: control characters (a newline, a tab) escaped."""
    return token if token.isprintable() else repr(token)[1:-1]


SPACE = "␣"  # a space in a token's text, where the token stands unquoted (a label, a list of tokens)
SPACE_NOTE = f"{SPACE} = a space"


def token_label(text: str) -> str:
    """A token's text (`Tokenizer.text_of`: ` Mary`) where it stands unquoted (a grid's column, the list of
    tokens, a figure's axis): each space shown as ␣ (`␣Mary`), control characters escaped (`\\n`). Where a token
    stands quoted, it is its text's repr (`' Mary'`)."""
    return shown(text).replace(" ", SPACE)


def has_space(labels: Sequence[str]) -> bool:
    """Whether labels (`token_label`'s) show a space as ␣: then the view says what ␣ is (SPACE_NOTE)."""
    return any(SPACE in label for label in labels)


GLUE = "\u00a0"  # a space `words` never breaks a line at (one inside a quoted token), printed as a plain space


def quoted(text: str) -> str:
    """A token's text as a sentence names it: its repr (`' Mary'`), its spaces GLUE, so that `words` never cuts it
    (a page or a figure takes the sentence through `plain`). repr escapes a text's own no-break space: GLUE is
    never a text's."""
    return repr(text).replace(" ", GLUE)


def plain(sentence: str) -> str:
    """A sentence with `quoted` tokens as a page or a figure writes it: GLUE as plain spaces."""
    return sentence.replace(GLUE, " ")


def fold(item: Text, width: int) -> list[Text]:
    """`item` as lines of at most `width` cells: itself when it fits, else broken between characters."""
    if item.cell_len <= width:
        return [item]
    offsets, used = [], 0
    for offset, character in enumerate(item.plain):
        if used + cell_len(character) > width and used:
            offsets.append(offset)
            used = 0
        used += cell_len(character)
    return list(item.divide(offsets))


def wrap(items: Sequence[Text | str], width: int, sep: str = "  ", indent: int = 0) -> list[Text]:
    """Items joined by `sep` into lines of at most `width` cells, broken only between items (sep "\\n":
    one item per line), every line after the first starting `indent` spaces in. An item wider than `width` on its
    own is folded."""
    if len(items) == 1 and not isinstance(items[0], str) and items[0].cell_len <= width:
        return [items[0]]  # the common case, kept fast: one item that fits
    lines: list[Text] = []
    line: Text | None = None
    for item in items:
        for piece in fold(Text(item) if isinstance(item, str) else item, width - indent):
            if line is not None and sep != "\n" and line.cell_len + cell_len(sep) + piece.cell_len <= width:
                line.append(sep)
                line.append(piece)
            else:
                if line is not None:
                    lines.append(line)
                # not piece.copy(): its base style would spread over the whole line
                line = Text(" " * indent if lines else "")
                line.append_text(piece)
    return lines + [line] if line is not None else [Text()]


def words(text: Text | str, width: int, style: str = "") -> list[Text]:
    """A sentence wrapped at its spaces (a word wider than `width` folded), keeping its styles; never at a GLUE
    (a `quoted` token's space), which prints as a space."""
    text = Text(text, style=style) if isinstance(text, str) else text
    plain = text.plain
    lines, start, end, position = [], 0, 0, 0  # the current line is plain[start:end]
    for word in plain.split(" "):
        word_start, word_end = position, position + len(word)
        position = word_end + 1
        if word_start > start and cell_len(plain[start:word_end]) > width:
            lines.append(text[start:end])
            start = word_start
        end = word_end
    lines.append(text[start:end])
    out = [piece for line in lines for piece in fold(line, width)]
    for piece in out:
        if GLUE in piece.plain:  # a quoted token's spaces, kept together: printed as spaces
            piece.plain = piece.plain.replace(GLUE, " ")
    return out


ECHO_LINES = 3  # a text echoed above its results takes at most this many lines


def echo(head: str, text: str, width: int, tail: str = "", style: str = "bold") -> list[Text]:
    """`head` then the text as Python writes it (`'...'`) then `tail`, in at most ECHO_LINES lines: a longer text
    shows its beginning and its end around ` ... ` (what was left out in between is said by `tail`, or by the
    caller's counts), cut at spaces. The text is the input, not a result: a result is never cut."""
    whole = words(f"{head}{text!r}{tail}", width, style)
    budget = ECHO_LINES * width - len(head) - len(tail) - 8
    while len(whole) > ECHO_LINES and budget > 20:
        half = budget // 2
        start, end = text[:half].rsplit(" ", 1)[0], text[-half:].split(" ", 1)[-1]
        gap = "\ue000"  # not printable: repr escapes it, and no text holds its escape
        shown = repr(f"{start}{gap}{end}").replace("\\ue000", " ... ")
        whole = words(f"{head}{shown}{tail}", width, style)
        budget = budget * 4 // 5
    return whole


@dataclass
class Column:
    """One column of a `table`: a header (its lines stacked, bottom-aligned) and, per row, the items of the
    cell. A cell's items stay on one line, `sep` apart, unless the column is narrowed to fit a page."""

    header: str
    cells: list[list[Text]]
    right: bool = False  # right-aligned (numbers)
    sep: str = "  "  # between a cell's items; "\n" puts each item on its own line
    gap: int = GAP  # spaces before the column (the first column of a page always gets GAP)

    @classmethod
    def of(cls, header: str, values: Sequence[Text | str], right: bool = False) -> Column:
        """A column of one item per cell."""
        return cls(header, [[Text(v) if isinstance(v, str) else v] for v in values], right)

    def natural_width(self) -> int:
        widths = [cell_len(line) for line in self.header.split("\n")]
        for items in self.cells:
            if self.sep == "\n":
                widths += [item.cell_len for item in items]
            else:
                widths.append(sum(item.cell_len for item in items) + cell_len(self.sep) * max(len(items) - 1, 0))
        return max(widths)


def table(columns: list[Column], width: int, keys: int = 1,
          title: Text | str | Callable[[list[Column]], Text | str] | None = None,
          page_note: Callable[[list[Column]], str] | None = None, rule: bool = True) -> list[Text]:
    """Lay out `columns` (the first `keys` of them identify the rows) as lines of at most `width` cells:
    title, header, a rule, then the rows. Columns that do not fit go on to further pages, each repeating the
    key columns; `page_note(page's columns)` says what a page holds when there are several, and a callable
    `title(page's columns)` titles each page by what it holds. A row with a cell of several lines is followed by a
    blank line."""
    key_columns, rest = columns[:keys], columns[keys:]
    key_widths = key_column_widths(key_columns, width, bool(rest))
    used = sum(key_widths) + GAP * max(len(key_columns) - 1, 0)
    pages: list[list[tuple[Column, int, int]]] = []  # per page: (column, width, gap before it)
    page: list[tuple[Column, int, int]] = []
    page_width = used
    for column in rest:
        gap = (column.gap if page else GAP) if key_columns or page else 0
        natural = column.natural_width()
        if page and page_width + gap + natural > width:
            pages.append(page)
            page, page_width, gap = [], used, GAP if key_columns else 0
        fitted = max(1, min(natural, width - page_width - gap))
        page.append((column, fitted, gap))
        page_width += gap + fitted
    pages.append(page)
    lines: list[Text] = []
    for number, page in enumerate(pages, 1):
        if number > 1:
            lines.append(Text())
        titled = title([c for c, _, _ in page]) if callable(title) else title
        title_text = Text(titled, style="bold") if isinstance(titled, str) else titled
        if title_text is not None:
            heading = title_text.copy()
            if len(pages) > 1:
                note = f": {page_note([c for c, _, _ in page])}" if page_note else ""
                heading.append(f" (page {number} of {len(pages)}{note})", style="dim")
            lines += words(heading, width)
        placed = [(c, w, GAP if i else 0) for i, (c, w) in enumerate(zip(key_columns, key_widths))] + page
        lines += _page_lines(placed, rule)
    return lines


def key_column_widths(key_columns: list[Column], width: int, more: bool = True) -> list[int]:
    """The widths of a table's key columns: their natural widths, the widest narrowed (its cells wrapped)
    only when they would leave less than a third of the width to the other columns (`more`)."""
    widths = [c.natural_width() for c in key_columns]
    room = width - (width // 3 if more else 0) - GAP * max(len(widths) - 1, 0)
    while widths and sum(widths) > room:
        widest = widths.index(max(widths))
        widths[widest] = max(1, widths[widest] - (sum(widths) - room))
    return widths


def _page_lines(placed: list[tuple[Column, int, int]], rule: bool) -> list[Text]:
    """One page of a table: the header lines, the rule, then every row (cells wrapped to their widths)."""
    headers = [[line for part in c.header.split("\n") for line in words(Text(part, style="bold"), w)]
               for c, w, _ in placed]
    height = max(len(h) for h in headers)
    rows = len(placed[0][0].cells) if placed else 0
    cells = [[wrap(column.cells[row], w, column.sep) for row in range(rows)] for column, w, _ in placed]
    spaced = any(len(cell) > 1 for column_cells in cells for cell in column_cells)
    lines = []
    for level in range(height):
        lines.append(_join([([Text()] * (height - len(h)) + h)[level] for h in headers], placed))
    if rule:
        lines.append(_join([Text("─" * w, style="dim") for _, w, _ in placed], placed))
    for row in range(rows):
        depth = max(len(column_cells[row]) for column_cells in cells)
        for level in range(depth):
            lines.append(_join([c[row][level] if level < len(c[row]) else Text() for c in cells], placed))
        if spaced and row < rows - 1:
            lines.append(Text())
    return lines


def _join(parts: list[Text], placed: list[tuple[Column, int, int]]) -> Text:
    line = Text()
    for part, (column, width, gap) in zip(parts, placed):
        padding = width - part.cell_len
        line.append(" " * (gap + padding if column.right else gap))
        line.append_text(part)
        if not column.right:
            line.append(" " * padding)
    line.rstrip()
    return line


def layer_runs(values: Sequence[tuple[int, object]]) -> list[tuple[int, int, object]]:
    """(layer, value) pairs in layer order -> (first layer, last layer, value) runs of consecutive layers that
    agree: [(0, a), (1, a), (2, b)] -> [(0, 1, a), (2, 2, b)]."""
    runs: list[tuple[int, int, object]] = []
    for layer, value in values:
        if runs and runs[-1][2] == value and runs[-1][1] == layer - 1:
            runs[-1] = (runs[-1][0], layer, value)
        else:
            runs.append((layer, layer, value))
    return runs


# ---------------------------------------------------------------- the console


def output_width(width: int | None = None) -> int:
    """--width, else $COLUMNS, else the width of a terminal the person sits at: stdout's, stderr's or stdin's when
    one of them is a terminal (stdout piped into `less`, or `... 2>/dev/null | head`), else the controlling
    terminal's (`/dev/tty`: `echo x | tfcli ... 2>/dev/null | head`), else PIPE_WIDTH; never below MIN_WIDTH."""
    if width is None:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) > 0 else None
    if width is None:
        width = terminal_columns()
    return max(width or PIPE_WIDTH, MIN_WIDTH)


def terminal_columns() -> int | None:
    """The columns of the first terminal among stdout, stderr, stdin and the controlling terminal (`/dev/tty`),
    or None when there is none (a job without a terminal, a test)."""
    for stream in (sys.stdout, sys.stderr, sys.stdin):
        try:
            if stream is not None and stream.isatty():
                columns = os.get_terminal_size(stream.fileno()).columns
                if columns > 0:
                    return columns
        except (AttributeError, ValueError, OSError):
            continue
    return _controlling_terminal_columns()


def _controlling_terminal_columns() -> int | None:
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | getattr(os, "O_NOCTTY", 0))
    except OSError:  # no controlling terminal (or no /dev/tty on this platform)
        return None
    try:
        columns = os.get_terminal_size(fd).columns
        return columns if columns > 0 else None
    except OSError:
        return None
    finally:
        os.close(fd)


def message_lines(message: str, width: int, whole: Sequence[str] = ()) -> list[str]:
    """A message for stderr as lines of at most `width` cells, broken only at spaces; each of `whole` (paths)
    found in it stays unbroken even when it holds spaces, and a word or path wider than `width` keeps a line of
    its own, whole (the terminal folds it, nothing is lost)."""
    protected = [(start, start + len(part)) for part in whole if part
                 for start in _occurrences(message, part)]
    units: list[str] = []  # the message's words, each protected span one unit
    start = 0
    for index, character in enumerate(message):
        if character == " " and not any(low <= index < high for low, high in protected):
            units.append(message[start:index])
            start = index + 1
    units.append(message[start:])
    lines: list[str] = []
    line: str | None = None
    for unit in units:
        if line is not None and cell_len(line) + 1 + cell_len(unit) <= width:
            line += " " + unit
        else:
            if line is not None:
                lines.append(line)
            line = unit
    lines.append(line or "")
    return lines


def _occurrences(text: str, part: str) -> list[int]:
    starts, start = [], text.find(part)
    while start >= 0:
        starts.append(start)
        start = text.find(part, start + 1)
    return starts


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`| head`): raise, for the command line to end quietly (rich would exit 1)."""
        self.quiet = True
        raise BrokenPipeError


def make_console(width: int, color: bool | None = None, file: TextIO | None = None, record: bool = False) -> Console:
    """The console a view is printed on, `width` cells wide. color None: colour when it is a terminal and
    NO_COLOR is unset (rich's rule); True: colour even into a pipe (e.g. for `less -R`); False: none."""
    options = dict(width=width, file=file, record=record, highlight=False, markup=False, emoji=False, soft_wrap=False)
    if color is None:
        return _Console(**options)
    if color:
        return _Console(**options, force_terminal=True, no_color=False, color_system="256")
    return _Console(**options, color_system=None, no_color=True)


def print_lines(console: Console, lines: list[Text]) -> None:
    """Print a view's lines (each already within the console's width: printed as they are, not wrapped again,
    so that a line too wide would show as one, in tests too)."""
    console.print(Text("\n").join(lines), no_wrap=True, overflow="ignore", crop=False)


def screen_text(lines: list[Text], width: int, color: bool = False) -> str:
    """What a person sees: `lines` printed on a `width`-wide console (ANSI colour codes when `color`).
    Tests read views through this."""
    console = make_console(width, color, file=io.StringIO(), record=True)
    print_lines(console, lines)
    return console.export_text(styles=color)
