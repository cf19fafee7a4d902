"""The runner (tfcli/runner.py) gives any analysis one text, --file, --dataset, --per-item, the bootstrap, --ray,
progress, Ctrl-C, JSON, views and a --report page, with no code of the analysis's own for any of them: the whole
small analysis of docs/adding-an-analysis.md, "the norm of the residual stream entering each block at a text's last
token", is written here (item -> result -> aggregate -> view) and run through a command of a few lines, its numbers
checked against transformers' own hidden states of a GPT-2 checkpoint transformers saved. With --top K it has a
second stage, as circuit (score, then measure) and every multi-stage analysis has: the K blocks of the largest mean
norm are picked, and the command's session runs a second analysis over the texts the first finished (the mean norm
over every position entering those blocks), on the same model, Ray workers, progress display and Ctrl-C rule."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import typer
from typer.testing import CliRunner

from tfcli.analysis.dataset import Dataset, Done, Line, LineSpec, mean_spread
from tfcli.analysis.inputs import model_input
from tfcli.analysis.names import every_block
from tfcli.cli.app import app
from tfcli.cli.console import output_console
from tfcli.cli.output import View
from tfcli.cli.session import inputs, run_dataset
from tfcli.cli.options import DatasetFlags, FileOption, RunOptions, TextsArgument, shared_options
from tfcli.errors import usage_error

TEXTS = ["when mary and john went to the store john gave a drink to", "the cat sat on the mat",
         "time flies like an arrow and fruit flies like a banana"]


# ---------------------------------------------------------------- the analysis: what it declares, nothing else


@dataclass
class Text:
    line: int
    ids: list[int]


@dataclass
class TextNorms:
    """One text's result: the norm of the residual stream entering each block, at its last token."""

    line: int
    norms: list[float]


@dataclass
class Norms:
    """The aggregate: each block's mean norm over the texts, with its 95% bootstrap interval (None: no resample). How
    many texts, and whether Ctrl-C cut the run short, is the run's Envelope's to say."""

    mean: list[float]
    low: list[float] | None
    high: list[float] | None
    picked: list[int] | None = None  # with --top: the second stage's blocks, their norms and the texts measured
    measured: list[float] | None = None
    measured_n: int = 0


@dataclass
class ResidualNorm:
    command, unit, line, block, streams = "norms", "texts", LineSpec(("text",), ()), None, False

    def check(self, config, tokenizer, line: Line) -> Text:
        ids = model_input(config, tokenizer.encode([line.fields["text"]])[0])
        if len(ids) > config.max_position_embeddings:
            raise usage_error(f"the text has {len(ids)} tokens: the model has {config.max_position_embeddings}")
        return Text(line.number, ids)

    def check_items(self, items: list[Text]) -> None:
        pass

    def results(self, model, tokenizer, items: list[Text], progress):
        names = every_block(model, "resid_pre")
        for done, item in enumerate(items, 1):
            _, cache = model.run_with_cache(torch.tensor([item.ids], device=model.device), names)
            yield TextNorms(item.line, [float(cache[name][0, -1].double().norm()) for name in names])
            if progress is not None:
                progress(done)

    def shown(self, result: TextNorms) -> TextNorms:
        return result

    def aggregate(self, done: Done, dataset: Dataset) -> Norms:
        norms = torch.tensor([result.norms for _, result in done], dtype=torch.float64)
        mean, _, low, high = mean_spread(norms, dataset.resamples)
        return Norms(mean.tolist(), None if low is None else low.tolist(), None if high is None else high.tolist())


@dataclass
class Measured:
    """The second stage's aggregate: for each block picked, the norm entering it averaged over a text's positions,
    then over the texts."""

    blocks: list[int]
    mean: list[float]


@dataclass
class PositionNorms(ResidualNorm):
    """The second stage: each text's norm entering each of `blocks`, averaged over its positions."""

    blocks: list[int]

    def results(self, model, tokenizer, items: list[Text], progress):
        names = [every_block(model, "resid_pre")[b] for b in self.blocks]
        for done, item in enumerate(items, 1):
            _, cache = model.run_with_cache(torch.tensor([item.ids], device=model.device), names)
            yield TextNorms(item.line, [float(cache[name][0].double().norm(dim=-1).mean()) for name in names])
            if progress is not None:
                progress(done)

    def aggregate(self, done: Done, dataset: Dataset) -> Measured:
        norms = torch.tensor([result.norms for _, result in done], dtype=torch.float64)
        return Measured(self.blocks, norms.mean(0).tolist())


def measure(top: int):
    """The command's second stage (`run_dataset`'s `after`): the `top` blocks of the largest mean norm, measured over
    the texts the first stage finished, on the same session; said in the aggregate (`picked`, `measured`,
    `measured_n`)."""

    def after(session, first) -> None:
        norms = first.value
        picked = sorted(range(len(norms.mean)), key=lambda b: -norms.mean[b])[:top]
        second = session.run(PositionNorms(picked), first.dataset(), stage="measure")
        norms.picked = picked
        if second.value is not None:
            norms.measured, norms.measured_n = second.value.mean, second.n
    return after


def item_record(result: TextNorms) -> dict:
    return {"line": result.line, "norms": result.norms}


def item_lines(result: TextNorms, number: int) -> list:
    from rich.text import Text as Line

    return [Line(f"text {number} (line {result.line}): " + " ".join(f"{v:.3f}" for v in result.norms))]


def record(run) -> dict:
    """The run's record: its Envelope's counts, then the aggregate's numbers."""
    return {"n": run.n, "interrupted": run.interrupted} | vars(run.value)


def lines(run, number: int) -> list:
    from rich.text import Text as Line

    return [Line(f"{run.n} texts: " + " ".join(f"{v:.3f}" for v in run.value.mean))]


# ---------------------------------------------------------------- its command: options, then the runner

norms_app = typer.Typer(cls=app.info.cls)


@norms_app.callback()
def root() -> None:
    """A command line of one command, beside tfcli's."""


@norms_app.command()
@shared_options(dataset=True, without=("ray_gpus_per_worker",))
def norms(texts: TextsArgument = None, file: FileOption = None, top: int | None = None, *, run: RunOptions,
          data: DatasetFlags) -> None:
    from tfcli.sources import resolve_source

    out = output_console(run.width, run.color)
    given = data.options(data.cluster(True, ""), None if data.dataset is not None else inputs(texts, file))
    run_dataset(ResidualNorm(), resolve_source(run.model, run.revision), given, run,
                (View(out, item_record, item_lines), View(out, record, lines, of_run=True)), "these norms say nothing",
                after=None if top is None else measure(top))


def invoke(*args: str):
    return CliRunner().invoke(norms_app, ["norms", *args])


# ---------------------------------------------------------------- what it gets


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """A 3-block GPT-2 checkpoint transformers saved, on the bundled BERT vocabulary, and transformers' model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0)
    save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    return path, GPT2LMHeadModel.from_pretrained(path).eval()


def by_hand(hf, text: str) -> list[float]:
    """The norm at the last token of each block's input: transformers' hidden_states[0 .. L-1] (its last one is
    after the final norm), the text read as tfcli reads it (BERT's tokenizer, no [SEP] at the end of a prompt)."""
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    ids = load_tokenizer_for(resolve_source("gpt2-small")).encode([text])[0].ids[:-1]
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return [float(state[0, -1].double().norm()) for state in states[:-1]]


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_one_text_gives_its_result_as_the_aggregate_of_one(gpt2):
    path, hf = gpt2
    [aggregate] = records(invoke("-m", str(path), "--json", TEXTS[0]))
    assert aggregate["n"] == 1 and aggregate["low"] is None and not aggregate["interrupted"]
    assert aggregate["mean"] == pytest.approx(by_hand(hf, TEXTS[0]), abs=1e-4)


def test_a_file_and_a_dataset_give_each_text_first_then_the_mean_with_its_interval(gpt2, tmp_path):
    path, hf = gpt2
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 4) + "\n")
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS * 4))
    hand = torch.tensor([by_hand(hf, text) for text in TEXTS * 4], dtype=torch.float64)
    for source in (["--file", str(corpus)], ["--dataset", str(dataset)]):
        *each, aggregate = records(invoke("-m", str(path), *source, "--per-item", "--bootstrap", "200", "--json"))
        assert [item["line"] for item in each] == list(range(1, 13))
        for item, row in zip(each, hand):
            assert item["norms"] == pytest.approx(row.tolist(), abs=1e-4)
        assert aggregate["n"] == 12 and aggregate["mean"] == pytest.approx(hand.mean(0).tolist(), abs=1e-4)
        assert all(low <= mean <= high for low, mean, high in zip(aggregate["low"], aggregate["mean"],
                                                                   aggregate["high"]))


def test_a_bad_line_is_named_before_any_model_is_built(gpt2, tmp_path, no_model_built):
    path, _ = gpt2
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"txt": "typo"}) + "\n")
    result = invoke("-m", str(path), "--dataset", str(dataset))
    assert result.exit_code == 2 and "error: line 2: unknown key `txt`" in result.stderr
    result = invoke("-m", str(path), "--dataset", str(dataset), "--skip-bad", "--json")
    assert "skipped line 2" in result.stderr and "a model was built" in result.stderr  # it got past the lines


def test_the_views_and_the_page_come_from_the_runner(gpt2, tmp_path, monkeypatch):
    """The terminal views are the analysis's: one for an item, one for the aggregate; --report finds the renderer's page_section by the command's
    name, as it finds tfcli's own (a renderer module here stands in for tfcli/commands/norms/render.py)."""
    path, hf = gpt2
    result = invoke("-m", str(path), "--per-item", TEXTS[0], TEXTS[1])
    assert result.exit_code == 0, result.stderr
    first, second, aggregate = result.stdout.splitlines()
    assert first.startswith("text 1 (line 1): ") and second.startswith("text 2 (line 2): ")  # each item its number
    assert aggregate.startswith("2 texts")
    renderer = types.ModuleType("tfcli.commands.norms.render")
    renderer.page_section = lambda run, tokenizer: {"mean": run.value.mean}
    for name in ("tfcli.commands.norms", "tfcli.commands.norms.render"):  # the package and its renderer
        monkeypatch.setitem(sys.modules, name, renderer)
    page = tmp_path / "norms.html"
    result = invoke("-m", str(path), "--report", str(page), TEXTS[0])
    assert result.exit_code == 0, result.stderr
    data = page.read_text().split('<script id="tfcli-data" type="application/json">')[1].split("</script>")[0]
    [section] = json.loads(data)["sections"]
    assert section["mean"] == pytest.approx(by_hand(hf, TEXTS[0]), abs=1e-4)


def interrupt_at_the_third(monkeypatch, analysis) -> None:
    """Ctrl-C (a KeyboardInterrupt) as `analysis`'s third item runs: the two before it finished."""
    seen = []
    results = analysis.results

    def interrupted(self, model, tokenizer, items, progress):
        for result in results(self, model, tokenizer, items, progress):
            seen.append(result.line)
            if len(seen) == 3:
                raise KeyboardInterrupt
            yield result
    monkeypatch.setattr(analysis, "results", interrupted)


def test_ctrl_c_keeps_the_texts_finished(gpt2, tmp_path, monkeypatch):
    path, hf = gpt2
    interrupt_at_the_third(monkeypatch, ResidualNorm)
    result = invoke("-m", str(path), "--json", *TEXTS, *TEXTS)
    assert result.exit_code == 130 and "interrupted: 2 texts finished; the aggregate is theirs" in result.stderr
    [aggregate] = [json.loads(line) for line in result.stdout.splitlines()]
    hand = torch.tensor([by_hand(hf, text) for text in TEXTS[:2]], dtype=torch.float64).mean(0)
    assert aggregate["interrupted"] and aggregate["n"] == 2
    assert aggregate["mean"] == pytest.approx(hand.tolist(), abs=1e-4)


def test_ray_gives_the_one_process_aggregate(gpt2, tmp_path):
    """--ray local: the texts go in blocks to 2 workers (each builds the model), the analysis itself travels to
    them (pickled by value: it lives in this test module), and the aggregate is the one-process one."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install \"tfcli[ray]\"")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    path, _ = gpt2
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 4) + "\n")
    here = records(invoke("-m", str(path), "--file", str(corpus), "--per-item", "--json"))
    there = records(invoke("-m", str(path), "--file", str(corpus), "--per-item", "--json", "--ray", "local",
                           "--ray-workers", "2"))
    assert [item.get("line") for item in there] == [item.get("line") for item in here]
    for a, b in zip(here, there):
        for key in ("norms", "mean", "low", "high"):
            if a.get(key) is not None:
                assert b[key] == pytest.approx(a[key], abs=1e-6)


def test_a_log_gets_a_plain_progress_line_now_and_then(monkeypatch):
    """Without a terminal (a batch job's log), progress is a first line at once (over how many items), then a line
    every PLAIN_EVERY seconds: items done, the rate, the time left; a rate under a fifth of the best seen says why
    that may be; and a last line at the end, how many in how long."""
    from tfcli.cli import progress as common

    said = []
    monkeypatch.setattr(common, "say", said.append)
    times = iter([0.0, 0.0, 10.0, 60.0, 120.0, 150.0, 400.0, 430.0])
    progress = common.PlainProgress("patch", "pairs", clock=lambda: next(times))
    progress(0, 100)  # at once
    progress(1, 100)  # 10 s: too soon
    progress(30, 100)  # 60 s: 30 in 60 s
    progress(60.5, 100)  # 120 s: 30.5 in 60 s
    progress(61, 100)  # 150 s: too soon after the last line
    progress(62, 100, "2 of 2 workers alive")  # 400 s: 1.5 in 280 s
    progress.end()  # 430 s
    assert said == ["patch: started, over 100 pairs",
                    "patch: 30 of 100 pairs, 0.5 per s, about 2 min 20 s left",
                    "patch: 60 of 100 pairs, 0.508 per s, about 1 min 18 s left",
                    "patch: 62 of 100 pairs, 0.00536 per s, about 4 min 5 s left (slower than before: a busy machine? "
                    "OMP_NUM_THREADS=1 helps under load); 2 of 2 workers alive",
                    "patch: done, 62 of 100 pairs in 7 min 10 s"]


def test_a_dataset_run_into_a_log_says_how_far_it_is(gpt2, tmp_path, monkeypatch):
    from tfcli.cli import progress as common

    monkeypatch.setattr(common, "PLAIN_EVERY", 0.0)
    path, _ = gpt2
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 2) + "\n")
    result = invoke("-m", str(path), "--file", str(corpus))
    assert result.exit_code == 0, result.stderr
    assert "norms: 6 of 6 texts, " in result.stderr


# ---------------------------------------------------------------- a second stage on the same session


def by_hand_over_positions(hf, text: str) -> list[float]:
    """The norm entering each block averaged over the text's positions (transformers' hidden states)."""
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    ids = load_tokenizer_for(resolve_source("gpt2-small")).encode([text])[0].ids[:-1]
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return [float(state[0].double().norm(dim=-1).mean()) for state in states[:-1]]


def expected(hf, texts: list[str], top: int) -> tuple[list[int], list[float]]:
    """The blocks of the largest mean last-token norm over `texts`, and their norms over positions, by hand."""
    last = torch.tensor([by_hand(hf, text) for text in texts], dtype=torch.float64).mean(0)
    picked = sorted(range(len(last)), key=lambda b: -float(last[b]))[:top]
    over = torch.tensor([by_hand_over_positions(hf, text) for text in texts], dtype=torch.float64).mean(0)
    return picked, [float(over[b]) for b in picked]


def test_a_second_stage_measures_what_the_first_picked_over_a_text_and_a_dataset(gpt2, tmp_path, monkeypatch):
    """One text and a dataset: the second stage's blocks and norms equal transformers' by hand, and each stage has a
    progress display of its own name (in a log: a line per stage)."""
    from tfcli.cli import progress

    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    path, hf = gpt2
    [one] = records(invoke("-m", str(path), "--json", "--top", "2", TEXTS[0]))
    picked, measured = expected(hf, TEXTS[:1], 2)
    assert one["picked"] == picked and one["measured_n"] == 1
    assert one["measured"] == pytest.approx(measured, abs=1e-4)
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS * 2))
    result = invoke("-m", str(path), "--dataset", str(dataset), "--top", "3", "--json")
    [aggregate] = records(result)
    picked, measured = expected(hf, TEXTS * 2, 3)
    assert aggregate["picked"] == picked and aggregate["measured_n"] == 6
    assert aggregate["measured"] == pytest.approx(measured, abs=1e-4)
    assert "norms: 6 of 6 texts" in result.stderr and "measure: 6 of 6 texts" in result.stderr, result.stderr
    assert result.stderr.count("model: ") == 1  # one model for both stages


def test_ctrl_c_in_the_first_stage_measures_the_texts_it_finished(gpt2, monkeypatch):
    path, hf = gpt2
    interrupt_at_the_third(monkeypatch, ResidualNorm)
    result = invoke("-m", str(path), "--json", "--top", "2", *TEXTS, *TEXTS)
    assert result.exit_code == 130 and "interrupted: 2 texts finished; the aggregate is theirs" in result.stderr
    [aggregate] = [json.loads(line) for line in result.stdout.splitlines()]
    picked, measured = expected(hf, TEXTS[:2], 2)
    assert aggregate["interrupted"] and aggregate["n"] == 2 and aggregate["measured_n"] == 2
    assert aggregate["picked"] == picked and aggregate["measured"] == pytest.approx(measured, abs=1e-4)


def test_ctrl_c_in_the_second_stage_keeps_the_first_and_what_the_second_finished(gpt2, monkeypatch):
    path, hf = gpt2
    interrupt_at_the_third(monkeypatch, PositionNorms)
    result = invoke("-m", str(path), "--json", "--top", "2", *TEXTS, *TEXTS)
    assert result.exit_code == 130 and "interrupted: 6 texts finished; the aggregate is theirs" in result.stderr
    [aggregate] = [json.loads(line) for line in result.stdout.splitlines()]
    picked, _ = expected(hf, TEXTS * 2, 2)  # the blocks the first stage picked over all 6 texts
    over = torch.tensor([by_hand_over_positions(hf, text) for text in TEXTS[:2]], dtype=torch.float64).mean(0)
    assert aggregate["n"] == 6 and aggregate["measured_n"] == 2 and aggregate["picked"] == picked
    assert aggregate["measured"] == pytest.approx([float(over[b]) for b in picked], abs=1e-4)  # over the 2 finished


def test_both_stages_run_on_one_pool_of_ray_workers(gpt2, tmp_path):
    """--ray local with 2 workers: the second stage runs on the workers the first started (the pool is said once),
    and both stages give the one-process numbers."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install \"tfcli[ray]\"")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    path, _ = gpt2
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 3) + "\n")
    [here] = records(invoke("-m", str(path), "--file", str(corpus), "--top", "2", "--json"))
    result = invoke("-m", str(path), "--file", str(corpus), "--top", "2", "--json", "--ray", "local",
                    "--ray-workers", "2")
    [there] = records(result)
    assert result.stderr.count("ray: 2 workers at local") == 1, result.stderr
    assert there["picked"] == here["picked"] and there["measured_n"] == here["measured_n"] == 9
    assert there["measured"] == pytest.approx(here["measured"], abs=1e-6)
