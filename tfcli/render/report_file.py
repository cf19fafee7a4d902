"""`--report PATH`: a run's results as one file, its format chosen by the extension: an interactive page
(.html, `render/page.py`) or a static figure (.svg, .png, .pdf, `render/figure.py`), each headed by the run's
`RunInfo` (`render/run_info.py`).

The path is checked before any work (`check_report_path`), and the file is written atomically: into a
temporary file beside it, then renamed, so an interrupted run leaves no half-written report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from tfcli.errors import TfcliError, check_writable_folder, replace_atomically, usage_error

if TYPE_CHECKING:
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

FORMATS = {".html": "interactive page", ".svg": "vector figure", ".png": "image", ".pdf": "figure, a page per text"}
ONE_TEXT_FORMATS = (".svg", ".png")  # one picture: one text


def check_report_path(path: Path, overwrite: bool, texts: int) -> None:
    """Before any work: a known extension (else a usage error listing them), one text for a one-picture
    format, an existing folder, and no existing file unless `overwrite` (--force)."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        listed = ", ".join(f"{ext} ({what})" for ext, what in FORMATS.items())
        raise usage_error(f"--report {path}: unknown format `{path.suffix or '(no extension)'}`",
                          f"end the file name in one of: {listed}")
    if suffix in ONE_TEXT_FORMATS and texts > 1:
        raise usage_error(f"--report {path}: a {suffix} figure holds one text, and {texts} were given",
                          "use .pdf (a page per text) or .html (a section per text), or run one text at a time")
    if path.exists() and not overwrite:
        raise TfcliError(f"{path} already exists", "pass --force to overwrite it, or choose another name")
    if not path.parent.is_dir():
        raise TfcliError(f"--report {path}: the folder {path.parent} does not exist")
    check_writable_folder("--report", path)


def write_report(path: Path, run: RunInfo, items: list[Any], overwrite: bool, tokenizer: Tokenizer | None = None,
                 parts: tuple[Callable, Callable] | None = None) -> None:
    """Write the report of `items` (encode's TextReports, generate's Generations with their `tokenizer`,
    or classify's Classifications) in the format of `path`'s extension; `parts`: the page section and the figure
    of one item (None: the command's renderer's `page_section` and `figure`)."""
    section, draw = parts or (None, None)
    suffix = path.suffix.lower()
    if suffix == ".html":
        from tfcli.render.page import page

        text = page(run, items, tokenizer, section)
        write_atomically(path, lambda stream: stream.write(text.encode("utf-8")), overwrite)
    else:
        from tfcli.render.figure import save_figure

        write_atomically(path, lambda stream: save_figure(stream, suffix[1:], run, items, tokenizer, draw),
                         overwrite)


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any], overwrite: bool) -> None:
    """write(stream) into a temporary file in path's folder, then rename it to path. Checked again first:
    the file may have appeared while the model ran. A failed write (a full disk, a read-only folder) is one line
    saying what happened and that the file there before, if any, is kept."""
    check_report_path(path, overwrite, texts=1)

    def to_file(temporary: str) -> None:
        with open(temporary, "wb") as stream:
            write(stream)

    replace_atomically(path, to_file)
