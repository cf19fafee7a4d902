"""The CLI shell: help, version, startup imports, error reporting."""

import subprocess
import sys

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

    monkeypatch.setattr("tfcli.tokenizer.load_tokenizer", refuse)
    result = cli("tokenize", "--model", "nowhere", "hi")
    assert result.exit_code == 1
    assert result.stderr == "error: no such model: nowhere\nhint: try a bundled config name\n"


def test_unexpected_exception_is_one_line_unless_debug(cli, monkeypatch):
    def crash(source):
        raise RuntimeError("boom")

    monkeypatch.setattr("tfcli.tokenizer.load_tokenizer", crash)
    result = cli("tokenize", "hi", env={"TFCLI_DEBUG": ""})
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "error: unexpected RuntimeError: boom"
    assert "Traceback" not in result.stderr
    debug = cli("tokenize", "hi", env={"TFCLI_DEBUG": "1"})
    assert isinstance(debug.exception, RuntimeError)


def test_bad_option_is_usage_error(cli):
    assert cli("tokenize", "--no-such-option", "hi").exit_code == 2
