"""Fixtures that run the CLI in-process (CliRunner) or as a real subprocess; test modules import them."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tfcli.cli import app


@pytest.fixture
def cli():
    """cli(*args, input=None, env=None) -> Result with .exit_code, .stdout, .stderr."""
    runner = CliRunner()

    def invoke(*args: str, input: bytes | str | None = None, env: dict[str, str] | None = None):
        return runner.invoke(app, list(args), input=input, env=env)

    return invoke


@pytest.fixture
def tfcli_process():
    """tfcli_process(*args, input=b"", env=None) -> CompletedProcess of `python -m tfcli` (bytes output)."""

    def run(*args: str, input: bytes = b"", env: dict[str, str] | None = None):
        return subprocess.run([sys.executable, "-m", "tfcli", *args], input=input, capture_output=True, env=env)

    return run
