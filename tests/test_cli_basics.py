"""The CLI shell: help, version, startup imports, error reporting."""

import json
import re
import select
import subprocess
import sys

import pytest

import tfcli
from tfcli.errors import TfcliError


def test_help_lists_commands(cli):
    result = cli("--help")
    assert result.exit_code == 0
    assert "tokenize" in result.stdout


def test_no_arguments_shows_help(cli):
    assert "Usage" in cli().output


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"tfcli {tfcli.__version__}"


def test_import_is_light():
    code = (
        "import sys, tfcli, tfcli.cli\n"
        "heavy = {'torch', 'transformers', 'tokenizers', 'matplotlib'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lazy_load_tokenizer():
    assert tfcli.load_tokenizer().encode(["arrow"])[0].ids == [101, 8612, 102]


def test_no_text_is_usage_error(cli):
    result = cli("tokenize")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no text given\nhint: ")


def test_texts_and_file_together_is_usage_error(cli, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("x\n")
    assert cli("tokenize", "a", "--file", str(path)).exit_code == 2


def test_user_error_in_subprocess_has_no_traceback(tfcli_process):
    result = tfcli_process("tokenize", "--max-length", "0", "hi")
    assert result.returncode == 2
    assert result.stdout == b""
    assert result.stderr.startswith(b"error: ")
    assert b"Traceback" not in result.stderr


def test_tfcli_error_from_core(cli, monkeypatch):
    def refuse(source):
        raise TfcliError("no such model: nowhere", "try a bundled config name")

    monkeypatch.setattr("tfcli.tokenizer.loading.load_tokenizer", refuse)
    result = cli("tokenize", "--model", "nowhere", "hi")
    assert result.exit_code == 1
    assert result.stderr == "error: no such model: nowhere\nhint: try a bundled config name\n"


def test_unexpected_exception_is_one_line_unless_debug(cli, monkeypatch):
    def crash(source):
        raise RuntimeError("boom")

    monkeypatch.setattr("tfcli.tokenizer.loading.load_tokenizer", crash)
    result = cli("tokenize", "hi", env={"TFCLI_DEBUG": ""})
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: unexpected RuntimeError: boom"
    assert "Traceback" not in result.stderr
    debug = cli("tokenize", "hi", env={"TFCLI_DEBUG": "1"})
    assert isinstance(debug.exception, RuntimeError)


def test_bad_option_is_usage_error(cli):
    assert cli("tokenize", "--no-such-option", "hi").exit_code == 2


@pytest.mark.parametrize("command", ["tokenize", "encode", "classify", "generate", "config", "compare"])
def test_help_shows_examples_and_words_for_placeholders(cli, command):
    result = cli(command, "--help")
    assert result.exit_code == 0
    examples = result.stdout[result.stdout.index("Examples:"):]
    assert examples.count(f"tfcli {command} ") >= 2
    assert not re.search(r"<[a-z\[\]]+>", result.stdout), result.stdout  # no `<list[str]>`, `<int>`
    if command in ("config", "compare"):
        assert "--model SRC" in result.stdout
    if command == "config":
        assert "one object per text" not in result.stdout


@pytest.mark.parametrize("args", [["tokenize", "-"], ["tokenize", "--json", "-"]])
def test_a_closed_pipe_ends_the_run_quietly_with_0(args, tmp_path):
    """`tfcli ... | head -1`: tables or JSON, the reader going away is no error."""
    texts = tmp_path / "texts.txt"
    texts.write_bytes(b"time flies like an arrow\n" * 20000)
    with texts.open("rb") as stdin:
        process = subprocess.Popen([sys.executable, "-m", "tfcli", *args], stdin=stdin, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
    process.stdout.readline()
    process.stdout.close()
    assert process.wait(timeout=60) == 0
    assert process.stderr.read() == b""


def test_stdin_is_answered_line_by_line(tmp_path):
    """`tail -f log | tfcli tokenize --json -`: each record comes as its line does, before stdin ends."""
    process = subprocess.Popen([sys.executable, "-m", "tfcli", "tokenize", "--json", "-"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in ("first line", "second line"):
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], 30)
            assert ready, f"no record for {line!r} while stdin stays open"
            assert json.loads(process.stdout.readline())["text"] == line
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    assert process.returncode == 0


def test_json_lines_escape_unicode_line_breaks(tfcli_process):
    text = "one\u2028two\u2029three\u0085four"
    result = tfcli_process("tokenize", "--json", text)
    assert result.returncode == 0
    line = result.stdout.decode("utf-8")
    assert line.count("\n") == 1 and not any(ch in line for ch in "\u2028\u2029\u0085")
    assert "\\u2028" in line and json.loads(line)["text"] == text
