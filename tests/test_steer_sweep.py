"""`tfcli steer sweep` against the same quantities computed by hand on transformers' own modules: a GPT-2
checkpoint transformers saved, the vector times each strength added to block outputs with forward hooks on the
block modules; the effect (the logit difference at the prompt's last position), the cost (the mean KL divergence of
the steered next-token distributions from the unsteered ones over the prompt) and the greedy continuation
(transformers' generate with the same hooks). Then the view at 80 columns, the page and figure, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch

from tfcli.analysis.vectors import write_vector

PROMPT = "this is a test of"
STRENGTHS = [-6.0, 0.0, 3.0, 6.0]
NEW = 6


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """(path, transformers model, vector file, {block: direction}): a 3-block GPT-2 on the BERT vocabulary (the
    bundled tokenizer reads the texts), and a vector for blocks 1 and 2 written as safetensors."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0)
    path = tmp_path_factory.mktemp("gpt2")
    hf = save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    torch.manual_seed(3)
    directions = {1: torch.randn(32), 2: torch.randn(32)}
    vector = path / "vector.safetensors"
    write_vector(vector, directions, "gpt2")
    return path, hf, vector, directions


def error_line(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def transformers_run(hf, ids: list[int], added: dict[int, torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """transformers with `added[L]` added to block L's output: the prompt's log-probabilities (T, V) in float64 and
    its greedy continuation of NEW tokens (up to the end of sequence)."""
    def adding(layer):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            return (hidden + added[layer], *output[1:]) if isinstance(output, tuple) else hidden + added[layer]
        return hook

    handles = [hf.transformer.h[layer].register_forward_hook(adding(layer)) for layer in added]
    try:
        with torch.no_grad():
            prompt = torch.tensor([ids])
            logits = hf(prompt).logits[0].double().log_softmax(-1)
            new = hf.generate(prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                              eos_token_id=102)[0, len(ids):].tolist()
    finally:
        for handle in handles:
            handle.remove()
    return logits, new


def test_the_sweep_equals_transformers_with_the_vector_added(cli, gpt2):
    path, hf, vector, directions = gpt2
    result = cli("steer", "sweep", "-m", str(path), "--vector", str(vector), "--strengths",
                 ",".join(f"{s:g}" for s in STRENGTHS), "--layers", "2", "--target", "the", "--foil", "a", "-n",
                 str(NEW), "--json", PROMPT)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["strength"] for r in records] == STRENGTHS
    assert all(set(r) == {"prompt", "strength", "layers", "text", "ids", "effect", "kl"} for r in records)
    assert all(r["layers"] == [2] and r["prompt"] == PROMPT for r in records)
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    tokenizer = load_tokenizer_for(resolve_source(str(path)))
    ids = tokenizer.encode([PROMPT])[0].ids[:-1]  # a decoder reads a prompt without BERT's [SEP]
    the, a = (tokenizer.encode([word])[0].ids[1] for word in ("the", "a"))
    plain, _ = transformers_run(hf, ids, {})
    effects = []
    for record, strength in zip(records, STRENGTHS):
        steered, new = transformers_run(hf, ids, {2: strength * directions[2]})
        kl = float((steered.exp() * (steered - plain)).sum(-1).mean())
        effects.append(float(steered[-1, the] - steered[-1, a]))  # log-softmax: the same difference as the logits
        assert record["effect"] == pytest.approx(effects[-1], abs=1e-4)
        assert record["kl"] == pytest.approx(kl, abs=1e-5)
        assert record["ids"] == new, strength
        assert record["text"].strip() == tokenizer.decode(new).strip()
    assert records[1]["kl"] == 0.0  # strength 0 is the model unsteered
    assert min(r["kl"] for r in records if r["strength"]) > 1e-3 and len(set(round(e, 4) for e in effects)) == 4


def test_the_view_fits_80_columns_and_the_page_and_figure_say_the_same(cli, gpt2, tmp_path):
    """At 80 columns every line fits and every continuation's words are there (wrapped, never cut); the page's data
    and the SVG figure hold the continuations."""
    path, _, vector, _ = gpt2
    args = ["steer", "sweep", "-m", str(path), "--vector", str(vector), "--strengths", "-6,0,6", "-n", "12"]
    records = [json.loads(line) for line in cli(*args, "--json", PROMPT, "another prompt here").stdout.splitlines()]
    assert len(records) == 6 and [r["prompt"] for r in records] == [PROMPT] * 3 + ["another prompt here"] * 3
    view = cli(*args, "--width", "80", "--no-color", PROMPT, "another prompt here")
    assert view.exit_code == 0, view.stderr
    lines = view.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "effect" not in view.stdout.split("strength")[1].splitlines()[0]  # no --target: no effect column
    flat = " ".join(view.stdout.split())
    for record in records:
        assert " ".join(repr(record["text"]).split()) in flat, record["text"]
    page = tmp_path / "sweep.html"
    assert cli(*args, "--report", str(page), PROMPT).exit_code == 0
    data = json.loads(page.read_text().split('type="application/json">')[1].split("</script>")[0].replace("<\\/", "</"))
    assert [s["text"] for s in data["sections"][0]["steps"]] == [r["text"] for r in records[:3]]
    svg = tmp_path / "sweep.svg"
    assert cli(*args, "--report", str(svg), PROMPT).exit_code == 0
    assert "KL" in svg.read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--strengths", "-2,x,2"], "--strengths: `x` is not a number"),
    (["--strengths", "2,2"], "a strength is given twice"),
    (["--layers", "7"], "--layers"),
    (["--layers", "0"], "the vector has none of these blocks"),
    (["--foil", "a"], "--foil goes with --target"),
])
def test_bad_input_is_one_error_line(cli, gpt2, args, message):
    path, _, vector, _ = gpt2
    result = cli("steer", "sweep", "-m", str(path), "--vector", str(vector), *args, PROMPT)
    assert result.exit_code == 2 and message in error_line(result), result.stderr
    assert "model:" not in result.stderr  # refused before the model is built


def test_a_vector_of_another_width_is_refused(cli, gpt2, tmp_path):
    path, _, _, _ = gpt2
    wide = tmp_path / "wide.safetensors"
    write_vector(wide, {1: torch.ones(48)}, "gpt2")
    result = cli("steer", "sweep", "-m", str(path), "--vector", str(wide), PROMPT)
    assert result.exit_code == 1 and "48" in error_line(result) and "32" in error_line(result), result.stderr  # a file that does not fit: 1
