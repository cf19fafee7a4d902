"""--ray: dataset analyses on a local Ray cluster started inside the tests (2 workers on this machine) give the
aggregate one process gives (patch and attribute datasets, heads over a corpus, on GPT-2 and Llama checkpoints
transformers saved); a worker killed mid-run has its block run again, nothing counted twice or lost; a model path a
worker cannot read is refused naming it; without Ray, --ray is one error line."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install \"tfcli[ray]\"")

CLEAN = ["when mary and john went to the store, john gave a drink to",
         "when tom and anna went to the park, anna gave a ball to",
         "then kate and paul had lunch at home. paul gave a cup to",
         "when mary and john went to the park, john gave a book to",
         "then tom and anna had lunch at home. anna gave a cake to"]


def swapped(text: str) -> str:
    """The corrupt text: the two names of the first clause swapped (the same length)."""
    words = text.split()
    words[1], words[3] = words[3], words[1]
    return " ".join(words)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module (2 CPUs: 2 workers); the CLI's --ray local joins it."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error",
             configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory, save_hf_model):
    """name -> checkpoint path: a GPT-2 and a Llama (grouped-query attention), 3 blocks, on the BERT vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=30522, bos_token_id=101, eos_token_id=102, pad_token_id=0)
    made = {}
    for name, model_class, config in (
            ("gpt2", GPT2LMHeadModel, GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, **sizes)),
            ("llama", LlamaForCausalLM, LlamaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=48,
                                                    max_position_embeddings=64, **sizes))):
        path = tmp_path_factory.mktemp(name)
        save_hf_model(model_class, config, path, perturb=True)
        made[name] = path
    return made


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 IOI-shaped pairs (the five texts, with their names swapped, and the names as target and foil)."""
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    lines = []
    for k in range(12):
        clean = CLEAN[k % len(CLEAN)]
        words = clean.split()
        target, foil = (words[1], words[3]) if k % 2 else (words[3], words[1])
        lines.append({"clean": clean, "corrupt": swapped(clean), "target": target, "foil": foil})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def summed(aggregate, results) -> list:
    """The aggregate's numerator per cell: its score x the sum of the pairs' gaps = the sum over the pairs of patched
    - corrupt. The score itself divides by that sum, and this random model's gaps are 1e-5 to 7e-5 (it barely tells
    the names apart), as small as float32's noise allows them to be told apart: noise of 2e-8 in a pair's values
    (a block of 2 on one thread there, a batch of 12 on two threads here: other sums, other roundings) moves the
    score by up to 1e-3 (issue 51, item 3: the 7e-4 a full-suite run once saw). The numerator does not magnify."""
    gaps = sum(r.clean_value - r.corrupt_value for r in results)
    return [None if v is None else v * gaps for v in flat(aggregate.grids["heads"])]


def close(a: list, b: list, tolerance: float) -> float:
    """The largest |a - b| of two lists of numbers (None where None in both), asserted within `tolerance`."""
    assert [x is None for x in a] == [y is None for y in b]
    worst = max(abs(x - y) for x, y in zip(a, b) if x is not None)
    assert worst <= tolerance, f"differs by {worst:.2e}"
    return worst


def flat(value):
    if isinstance(value, list):
        return [x for item in value for x in flat(item)]
    return [value]


def assert_same(one: dict, spread: dict, keys: list[str]) -> None:
    """Every number under `keys` equal to 1e-6 (None where None)."""
    assert set(one) == set(spread)
    for key in keys:
        a, b = flat(json.loads(json.dumps(one[key]))), flat(json.loads(json.dumps(spread[key])))
        assert len(a) == len(b), key
        for x, y in zip(a, b):
            assert (x is None) == (y is None), key
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                assert abs(x - y) <= 1e-6, (key, x, y)
            elif not isinstance(x, dict):
                assert x == y, key


def lines_of(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_patch_dataset_on_the_cluster_equals_one_process(cli, cluster, models, dataset, name):
    """Every grid, interval and share of the aggregate, and each pair's record (--per-item, in dataset order)."""
    args = ["patch", "-m", str(models[name]), "--dataset", str(dataset), "--sites", "resid,heads", "--per-item",
            "--bootstrap", "200", "--json"]
    one = lines_of(cli(*args))
    spread = cli(*args, "--ray", "local", "--ray-workers", "2")
    assert "ray: 2 workers at local" in spread.stderr
    spread = lines_of(spread)
    assert len(one) == len(spread) == 13
    for a, b in zip(one[:-1], spread[:-1]):
        assert a["clean"] == b["clean"] and a["target"] == b["target"]
        assert_same(a, b, ["grids", "clean_value", "corrupt_value"])
    assert_same(one[-1], spread[-1], ["grids", "intervals", "restored_share", "clean_value", "corrupt_value"])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_an_attribute_dataset_on_the_cluster_equals_one_process(cli, cluster, models, dataset, name):
    args = ["attribute", "-m", str(models[name]), "--dataset", str(dataset), "--by", "head", "--json"]
    one, spread = lines_of(cli(*args))[-1], lines_of(cli(*args, "--ray", "local"))[-1]
    assert one["n"] == spread["n"] == 12
    assert_same(one, spread, ["components", "logit", "total", "worst"])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_heads_over_a_corpus_on_the_cluster_equals_one_process(cli, cluster, models, tmp_path, name):
    """Every detector's mean per head over 40 texts (blocks of 32: two blocks, one per worker), each text's with
    --per-text in order, and the page's best text per head."""
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(f"{CLEAN[k % 5]} and {k} more words {'a b ' * (k % 4)}" for k in range(40))
                           + "\n", encoding="utf-8")
    args = ["heads", "-m", str(models[name]), "--file", str(corpus_file), "--per-text", "--json"]
    one, spread = lines_of(cli(*args)), lines_of(cli(*args, "--ray", "local"))
    assert len(one) == len(spread) == 41
    for a, b in zip(one, spread):
        assert_same(a, b, [key for key in a if key in ("scores", "texts", "counts")])
    import tfcli
    from tfcli.commands.heads import core
    from tfcli import runner
    from tfcli.analysis.dataset import Dataset
    from tfcli.api import load_tokenizer_for
    from tfcli.cluster import RaySettings, spec_of
    from tfcli.sources import resolve_source

    model = tfcli.load_model(str(models[name]))
    tokenizer = load_tokenizer_for(resolve_source(str(models[name])))
    options = core.HeadsOptions(detectors=core.parse_detectors(None), keep_best=True)
    corpus = core.HeadsCorpus(options)
    texts = [core.text_of(model.config, tokenizer, e) for e in tokenizer.encode(corpus_file.read_text().splitlines())]
    here = runner.run(corpus, model, tokenizer, Dataset("", texts, 0, 0)).value
    there = runner.run(corpus, model, tokenizer, Dataset("", texts, 0, 0), cluster=runner.Cluster(
        RaySettings("local", 2), spec_of(str(models[name]), None, "cpu", "float32", 0), lambda message: None)).value
    assert here.best == there.best and sorted(here.kept) == sorted(there.kept)


def read_pairs(path: str, dataset):
    """The model at `path`, its tokenizer and the dataset's pairs as `patch --dataset` reads them (the runner)."""
    import tfcli
    from tfcli.commands.patch import core
    from tfcli.api import load_tokenizer_for
    from tfcli.runner import read_dataset
    from tfcli.sources import resolve_source

    model, tokenizer = tfcli.load_model(path), load_tokenizer_for(resolve_source(path))
    analysis = core.PatchDataset(core.PatchOptions(target="", sites=("heads",)))
    return model, tokenizer, analysis, read_dataset(analysis, model.config, tokenizer, str(dataset), False, 0, print)


def test_a_worker_killed_mid_run_has_its_block_run_again(cluster, models, dataset):
    """Kill one worker's process after the first block came back: Ray restarts it, the blocks it held run again,
    and the aggregate is the undisturbed one; every pair counted once. A pair whose result differs is named, with
    its block and by how much."""
    from tfcli import runner
    from tfcli.analysis.dataset import Done
    from tfcli.cluster import Cluster, RaySettings, spec_of

    path = str(models["gpt2"])
    model, tokenizer, analysis, data = read_pairs(path, dataset)
    alone = list(analysis.results(model, tokenizer, data.items, None))
    undisturbed = analysis.aggregate(Done(zip(data.items, alone)), data)
    with Cluster(RaySettings("local", 2), spec_of(path, None, "cpu", "float32", 0)) as workers:
        pids = ray.get([worker.alive.remote() for worker in workers.workers])
        blocks = workers.map(runner.block_results, data.items, analysis, block=2)
        first = next(blocks)
        os.kill(pids[1], signal.SIGKILL)
        finished = [first] + list(blocks)
        assert sorted(ray.get([worker.alive.remote() for worker in workers.workers])) != sorted(pids)  # restarted
    results = [result for _, block in finished for result in block]
    assert [start for start, _ in finished] == list(range(0, len(data.items), 2))
    assert [r.line for r in results] == [p.line for p in data.items]  # each pair once, in order
    for k, (here, there) in enumerate(zip(alone, results)):  # each pair's values, as it ran here and there
        worst = max(abs(x - y) for x, y in zip(flat(here.grids["heads"]) + [here.clean_value, here.corrupt_value],
                                               flat(there.grids["heads"]) + [there.clean_value, there.corrupt_value]))
        assert worst <= 1e-5, f"line {here.line} (block {k // 2}) differs by {worst:.2e} after the kill"
    done = Done(zip(data.items, results))
    again = analysis.aggregate(done, data)
    assert done.count == len(data.items) == 12
    close(summed(undisturbed, alone), summed(again, results), 1e-6)


def test_ctrl_c_keeps_the_blocks_finished(cluster, models, dataset):
    """A KeyboardInterrupt while blocks are in flight (raised here from the progress callback after the first
    block) cancels the rest, yields the blocks finished and passes the interrupt on: the runner aggregates those
    pairs, marked interrupted, as a single process does."""
    from tfcli import runner
    from tfcli.analysis.dataset import Dataset
    from tfcli.cluster import RaySettings, spec_of

    path = str(models["gpt2"])
    model, tokenizer, analysis, data = read_pairs(path, dataset)

    def interrupt(done, total, alive):
        if done:  # after the first block: the progress is also told while none has finished (each poll)
            raise KeyboardInterrupt

    lines = []
    cluster = runner.Cluster(RaySettings("local", 2), spec_of(path, None, "cpu", "float32", 0), print)
    analysis.block = 2
    done = runner.run(analysis, None, tokenizer, data, lambda pair: lines.append(pair.line), interrupt, cluster)
    assert done.interrupted and 2 <= done.n < len(data.items) and done.n == len(lines) == len(set(lines))
    result = done.value
    assert lines == sorted(lines)  # the blocks finished, in dataset order
    finished = [pair for pair in data.items if pair.line in lines]
    alone = runner.run(analysis, model, tokenizer, Dataset("", finished, 0, 0)).value
    singles = list(analysis.results(model, tokenizer, finished, None))  # their gaps: the workers', to float noise
    close(summed(result, singles), summed(alone, singles), 1e-6)


def test_a_model_path_a_worker_cannot_read_is_refused_naming_it(cluster, tmp_path):
    from tfcli.cluster import Cluster, ModelSpec, RaySettings
    from tfcli.errors import TfcliError

    missing = str(tmp_path / "only-on-the-driver")
    with pytest.raises(TfcliError, match=r"the worker on \S+ cannot read the model at .*only-on-the-driver"):
        with Cluster(RaySettings("local", 1), ModelSpec(missing, None, "cpu", "float32", 0, True)):
            pass


def test_without_ray_the_option_is_one_error_line(cli, dataset, monkeypatch, no_model_built):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as it does where Ray is not installed
    result = cli("patch", "--dataset", str(dataset), "--ray", "local")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and errors == ["error: --ray needs Ray, which is not installed"], result.stderr
    assert 'pip install "tfcli[ray]"' in result.stderr


def test_an_address_nobody_answers_is_refused_before_any_work(cli, dataset, no_model_built):
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = cli("patch", "--dataset", str(dataset), "--ray", f"127.0.0.1:{port}")
    assert result.exit_code == 1 and f"--ray 127.0.0.1:{port}: no Ray cluster answers there" in result.stderr


def test_more_workers_than_cpus_share_them_and_missing_gpus_are_refused(cluster, models):
    """3 workers on the test's 2 CPUs get two thirds of one each (Ray would wait for whole ones forever); GPUs the
    cluster lacks are refused naming what it has."""
    from tfcli.cluster import Cluster, RaySettings, spec_of
    from tfcli.errors import TfcliError

    spec = spec_of(str(models["gpt2"]), None, "cpu", "float32", 0)
    with Cluster(RaySettings("local", 3), spec) as workers:
        assert len(set(ray.get([worker.alive.remote() for worker in workers.workers]))) == 3
    gpus = int(ray.cluster_resources().get("GPU", 0))
    with pytest.raises(TfcliError, match=f"x 1 workers: the cluster at local has {gpus} GPUs"):
        with Cluster(RaySettings("local", 1, gpus + 1), spec):
            pass


def test_ray_options_without_a_dataset_are_refused(cli, models, no_model_built):
    result = cli("patch", "-m", str(models["gpt2"]), "--target", "mary", CLEAN[0], swapped(CLEAN[0]), "--ray",
                 "local")
    assert result.exit_code == 2 and "--ray and its options are for a --dataset" in result.stderr
    result = cli("heads", "--probe", "induction", "--ray-workers", "2")
    assert result.exit_code == 2 and "--ray and its options are for texts, not --probe" in result.stderr
