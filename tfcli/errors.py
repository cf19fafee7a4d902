"""The one user-facing error type: a short message plus a hint, turned into an exit code by the CLI."""


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
