"""The Typer `app` of `tfcli` and its sub-command groups: the help layout (wrapped between whole words) and the error
reporting every command shares (a TfcliError, or any unexpected exception, as `error:`/`hint:` lines and an exit
code)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Annotated, Any

import click
import typer
from typer.core import TyperArgument, TyperGroup
from typer.exceptions import TyperException

from tfcli import __version__
from tfcli.cli.console import STDERR, fail, option_words
from tfcli.errors import TfcliError

# Typer writes an argument's Python type beside its name in --help (`TEXT <list[str]>`): the name alone says it.
# Typer writes an argument's Python type beside its name in --help (`TEXT <list[str]>`): the name alone says it.
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]


def _help_wrap(text: str, width: int, indent: str = "") -> str:
    """click's paragraph wrapping (a paragraph after a `\\b` line kept as written), broken only between words:
    never inside an option name (`--max-length`) or a range (`-3-`), and a word wider than the line kept whole."""
    wrapper = textwrap.TextWrapper(max(width, 10), initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=False, replace_whitespace=False)
    paragraphs: list[str] = []
    for block in text.expandtabs().split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        if lines[0].strip() == "\b":
            paragraphs.append("\n".join(indent + line for line in lines[1:]))
        else:
            extra = " " * (len(lines[0]) - len(lines[0].lstrip()))
            wrapper.initial_indent = wrapper.subsequent_indent = indent + extra
            paragraphs.append(wrapper.fill(" ".join(line.strip() for line in lines)))
    return "\n\n".join(paragraphs)

class _HelpFormatter(click.HelpFormatter):
    """click's help layout, wrapped between whole words (click's own wrapping splits `--max-length` at its
    hyphen)."""

    def write_text(self, text: str) -> None:
        self.write(_help_wrap(text, self.width, " " * self.current_indent) + "\n")

    def write_dl(self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            if not second:
                self.write("\n")
                continue
            if len(first) <= first_col - col_spacing:
                self.write(" " * (first_col - len(first)))
            else:
                self.write("\n" + " " * (first_col + self.current_indent))
            lines = _help_wrap(second, self.width - first_col - self.current_indent).splitlines() or [""]
            self.write(lines[0] + "\n")
            for line in lines[1:]:
                self.write(" " * (first_col + self.current_indent) + line + "\n")

class _HelpContext(typer.Context):
    formatter_class = _HelpFormatter

class _ErrorReportingGroup(TyperGroup):
    """Turns TfcliError, and any unexpected exception, into `error:` / `hint:` lines and an exit code; a
    reader that goes away (`| head`) ends the run quietly with 0. Its help, and every command's, is wrapped
    between whole words, and lists each command's first sentence in full."""

    context_class = _HelpContext

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            command.context_class = _HelpContext  # the command's --help, wrapped like the group's
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands with their summaries (the first sentence of each), in full: never cut with `...`."""
        rows = [(name, command.get_short_help_str(limit=10**6)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: typer.Context) -> Any:
        STDERR.width = None  # until the command reads its --width
        try:
            return super().invoke(ctx)
        except TfcliError as e:
            fail(option_words(e), e.hint, e.exit_code)
        except BrokenPipeError:
            _quiet_stdout()
            raise typer.Exit(0) from None
        except (TyperException, typer.Exit, typer.Abort):
            raise  # typer handles these: usage errors, exits, Ctrl-C (130)
        except MemoryError:  # e.g. importing torch under an address-space limit (ulimit -v)
            fail("out of memory", "close other programs, or raise the memory limit (ulimit -v)", 1)
        except Exception as e:
            if os.environ.get("TFCLI_DEBUG") == "1":
                raise
            fail(f"unexpected {type(e).__name__}: {e}", "this is a bug in tfcli; TFCLI_DEBUG=1 shows the traceback", 1)

def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush into the closed pipe cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests capture stdout in memory)
        pass


GROUP_SETTINGS = dict(cls=_ErrorReportingGroup, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings={"help_option_names": ["-h", "--help"]})
app = typer.Typer(name="tfcli", **GROUP_SETTINGS)


def command_group(name: str, help: str) -> typer.Typer:
    """A group of sub-commands (`tfcli steer fit`, `tfcli sae train`) with the root group's error reporting and help
    layout, registered under the root."""
    group = typer.Typer(name=name, help=help, **GROUP_SETTINGS)
    app.add_typer(group)
    return group

def _show_version(value: bool) -> None:
    if value:
        print(f"tfcli {__version__}")
        raise typer.Exit()

@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """See inside a transformer's forward pass: tokens, shapes, attention, and what each layer would predict."""
