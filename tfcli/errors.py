"""The one user-facing error type: a short message plus a hint, turned into an exit code by the CLI; and how a file
that cannot be written is said (`check_writable_folder` before any work, `write_error` when a write fails); a file
that does not serve (`file_error`, `check_fields`: the types of a JSON file's fields), an error named for the option
given (`named_for`)."""

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class TfcliError(Exception):
    """A user's mistake (bad path, bad config, missing device...): printed as one line, never a traceback.

    exit_code is 2 for usage errors (bad options or arguments), 1 otherwise. `parameter` names the
    Python parameter a usage error is about when the message starts with it (`top_k must be >= 1`), so
    that the CLI can say it with the option's name (`--top-k must be >= 1`).
    """

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 1, parameter: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.parameter = parameter

    def __str__(self) -> str:
        return self.message


def usage_error(message: str, hint: str | None = None, parameter: str | None = None) -> TfcliError:
    """A bad option or argument (exit code 2)."""
    return TfcliError(message, hint, exit_code=2, parameter=parameter)


@contextmanager
def named_for(option: str, read_as: str = "--sae") -> Iterator[None]:
    """Errors raised inside, which name the option `read_as` (an SAE's reader says `--sae PATH: ...`), name `option`
    instead, as the user gave it (`--steer sae#3:5: sae: no such file or folder`): the user gave no --sae."""
    try:
        yield
    except TfcliError as error:
        if error.message.startswith(read_as):
            error.message = f"{option}: " + error.message[len(read_as):].lstrip(": ")
            error.args, error.parameter = (error.message,), None
        raise


def file_error(message: str, hint: str | None = None) -> TfcliError:
    """A file the command line names that is missing, unreadable, malformed or does not fit the model (exit code 1:
    docs/errors.md#errors-and-exit-codes)."""
    return TfcliError(message, hint, exit_code=1)


KINDS = {str: "a string", int: "a whole number", bool: "true or false", float: "a number", dict: "an object"}


def check_fields(data: dict, kinds: dict[str, Any], where: str, name: str) -> None:
    """Each field of a JSON file's object `data` (and of its `metadata` object) of its kind (a type, or a tuple of
    them; null counts as absent): `"d_in": "576"` is refused as a file error naming the field (`{where}: `d_in` in
    {name} must be a whole number, not "576"`), never taken silently. A bool is no number, nor a number a bool."""
    def fits(value: Any, kind: type) -> bool:
        if kind is bool or isinstance(value, bool):
            return kind is bool and isinstance(value, bool)
        return isinstance(value, (int, float) if kind is float else kind)

    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    for source in (data, metadata):
        for field, kind in kinds.items():
            value, kind = source.get(field), kind if isinstance(kind, tuple) else (kind,)
            if value is not None and not any(fits(value, k) for k in kind):
                raise file_error(f"{where}: `{field}` in {name} must be {' or '.join(KINDS[k] for k in kind)}, "
                                 f"not {json.dumps(value)}")


# errno -> how a person says it; anything else: the system's own words (strerror), lower-cased
_WRITE_PROBLEMS = {28: "no space left on device", 122: "disk quota exceeded", 30: "read-only file system",
                   13: "permission denied", 1: "permission denied", 27: "file too large"}


def write_error(path: object, exc: BaseException, existed: bool) -> TfcliError:
    """One line for a file that could not be written (a full disk, a read-only folder, no permission): what
    happened, the path, and what became of the file there before (`existed`: it is kept; else nothing was
    written). `exc` is an OSError, or another library's error that names the OS error (safetensors' says `(os
    error 28)`)."""
    number = getattr(exc, "errno", None)
    if number is None:
        found = re.search(r"os error (\d+)", str(exc))
        number = int(found.group(1)) if found else None
    what = _WRITE_PROBLEMS.get(number) if number is not None else None
    if what is None:
        what = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip().rstrip(".")
        what = what[:1].lower() + what[1:]
    kept = "the previous file is kept" if existed else "nothing was written"
    hint = {28: "free some space, or write to another disk", 122: "free some space, or write to another disk"}.get(
        number, "choose a folder you can write to" if number in (1, 13, 30) else None)
    return TfcliError(f"{what} writing {path}: {kept}", hint)


def check_writable_folder(option: str, path: "os.PathLike[str]") -> None:
    """Before any work: a folder this user cannot write in (read-only, or not theirs) is refused now, not after
    the model has run."""
    if not os.access(Path(path).parent, os.W_OK | os.X_OK):
        raise TfcliError(f"{option} {path}: cannot write in the folder {Path(path).parent or '.'} (read-only or not "
                         "yours)", "choose a folder you can write to")


def replace_atomically(path: Path, write: Callable[[str], None]) -> None:
    """write(temporary) into a temporary file in path's folder, then rename it to path: a full disk or an
    interrupted run keeps the file there before and leaves no half-written one. A failed write is one line
    (`write_error`), for an OSError or another library's error that names one (safetensors': `(os error 28)`)."""
    import tempfile

    existed = path.exists()
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(handle)
    except OSError as exc:
        raise write_error(path, exc, existed) from None
    try:
        write(temporary)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temporary, 0o666 & ~mask)  # mkstemp makes it private; what tfcli writes is an ordinary file
        os.replace(temporary, path)
    except Exception as exc:
        if isinstance(exc, OSError) or "os error" in str(exc):
            raise write_error(path, exc, existed) from None
        raise
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def check_output_file(path: Path, force: bool, hint: str = "give a file name", option: str = "--output") -> None:
    """An output file (`option`: --output, --graph-out) before any work: not a folder, no existing file unless
    `force`, an existing folder it can write in."""
    if path.is_dir():
        raise TfcliError(f"{option} {path} is a folder", hint)
    if path.exists() and not force:
        raise TfcliError(f"{path} already exists", "pass --force to overwrite it, or choose another name")
    if not path.parent.is_dir():
        raise TfcliError(f"{option} {path}: the folder {path.parent} does not exist")
    check_writable_folder(option, path)
