"""`tfcli sae train`: a step against the Gao et al. objective computed by hand (dense top-k, AuxK over the dead
latents, the decoder's gradient along its rows removed, Adam's first step, rows back to unit norm); the written
folder read by sae-lens 6.54's `SAE.load_from_disk`, whose features on transformers' own activations equal
`tfcli features --sae`; a run interrupted (Ctrl-C) and resumed equal to one never interrupted; bad input refused
with one error line. Tiny models, seconds each."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from tfcli.analysis.corpus import CHECKPOINT
from tfcli.commands.sae import core



@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """A 2-block GPT-2 saved by transformers on the bundled BERT vocabulary: (path, transformers' model)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.2)
    return path, save_hf_model(GPT2LMHeadModel, config, path, perturb=True)


SMALL = ("--tokens", "2048", "--batch", "128", "--buffer", "512", "--held-out", "512", "--context", "32",
         "--expansion", "4", "--k", "8")


def train_cli(cli, model, corpus, out, *extra: str, input: str | None = None):
    return cli("sae", "train", "-m", str(model), "--site", "blocks.1.resid_post", "--file", str(corpus),
               "--out", str(out), *SMALL, *extra, input=input)


# ------------------------------------------------------------------------------------------ the objective


def hand_step(params: dict, x: torch.Tensor, k: int, dead: torch.Tensor, lr: float) -> tuple[float, dict]:
    """Gao et al.'s loss on batch x, dense, and the parameters after Adam's first step (m^ = g, v^ = g^2), with
    the decoder rows' gradient along themselves removed and the rows set back to unit norm."""
    p = {name: value.detach().clone().double().requires_grad_() for name, value in params.items()}
    x = x.double()
    pre = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    order = pre.detach().argsort(dim=-1, descending=True)
    chosen = torch.zeros_like(pre, dtype=torch.bool).scatter(-1, order[:, :k], True)
    z = torch.where(chosen, torch.relu(pre), torch.zeros_like(pre))
    error = x - (z @ p["W_dec"] + p["b_dec"])
    variance = ((x - x.mean(0)) ** 2).sum()
    loss = (error ** 2).sum() / variance
    d = x.shape[1]
    k_aux = min(d // 2, int(dead.sum()))
    dead_pre = torch.where(dead, pre, torch.full_like(pre, -math.inf))
    aux_order = dead_pre.detach().argsort(dim=-1, descending=True)[:, :k_aux]
    aux_chosen = torch.zeros_like(pre, dtype=torch.bool).scatter(-1, aux_order, True)
    z_aux = torch.where(aux_chosen, torch.relu(pre), torch.zeros_like(pre))
    aux = min(int(dead.sum()) / (d // 2), 1.0) * ((z_aux @ p["W_dec"] - error.detach()) ** 2).sum() / variance
    total = loss + aux / 32
    total.backward()
    after = {}
    for name, value in p.items():
        grad = value.grad
        if name == "W_dec":
            grad = grad - (grad * value).sum(-1, keepdim=True) * value.detach()
        after[name] = value.detach() - lr * grad / (grad.abs() + 6.25e-10)
    after["W_dec"] = after["W_dec"] / after["W_dec"].norm(dim=-1, keepdim=True)
    return float(total.detach()), after


@pytest.mark.parametrize("every", [3, 16], ids=["more dead than k_aux", "fewer dead than k_aux"])
def test_a_step_is_gao_et_al_by_hand(every):
    """The objective and one Adam step equal the hand computation; the decoder's rows come out of unit norm; the
    counters restart for the latents that fired. With fewer dead latents than k_aux (d / 2), AuxK is scaled down."""
    torch.manual_seed(0)
    d, n, k, lr = 16, 48, 4, 1e-2
    x = torch.randn(64, d) * 3 + 1
    params = core.init_params(d, n, x, seed=1)
    with torch.no_grad():
        params["b_enc"].normal_(0, 0.5)
        params["W_enc"].add_(torch.randn(d, n) * 0.1)
    since = torch.zeros(n, dtype=torch.int64)
    since[::every] = 1000  # dead
    dead = since >= 500
    expected_loss, expected = hand_step(params, x, k, dead, lr)
    found = core.objective(params, x, k, dead)
    assert float(found["loss"].detach()) == pytest.approx(expected_loss, rel=1e-5)
    assert float(found["auxk"].detach()) > 0
    optimizer = torch.optim.Adam(list(params.values()), lr=lr, **core.ADAM)
    core.train_step(params, optimizer, since, x, k, 500)
    for name, value in expected.items():
        assert torch.allclose(params[name].detach().double(), value, atol=1e-5), name
    assert torch.allclose(params["W_dec"].norm(dim=-1), torch.ones(n), atol=1e-6)
    fired = torch.zeros(n, dtype=torch.bool)
    fired[found["indices"][found["values"] > 0]] = True
    assert (since[fired] == 0).all() and (since[~fired] >= 64).all()


def test_geometric_median_is_the_least_sum_of_distances():
    torch.manual_seed(0)
    x = torch.cat([torch.randn(50, 3), torch.randn(5, 3) + 40])  # outliers pull the mean, not the median
    median = core.geometric_median(x.double())
    cost = lambda point: float((x.double() - point).norm(dim=-1).sum())  # noqa: E731
    for _ in range(20):
        assert cost(median) <= cost(median + torch.randn(3, dtype=torch.float64) * 0.05) + 1e-9


# ------------------------------------------------------------------------------------------ the file


def test_the_file_loads_in_sae_lens_with_the_same_features(gpt2, corpus, tmp_path, cli):
    """SAELens's folder: sae-lens's TopKSAE on transformers' own block output gives the features that `tfcli
    features --sae` gives, to 1e-5 of scale; the hook maps back to the site; the decoder's rows have unit norm."""
    sae_lens = pytest.importorskip("sae_lens", reason="sae-lens 6.54 is the reference (tests/references.txt)")
    path, hf = gpt2
    out = tmp_path / "sae"
    result = train_cli(cli, path, corpus, out, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["tokens"] == 2048 and record["latents"] == 128 and record["hook"] == "blocks.1.hook_resid_post"
    said = [line for line in result.stderr.splitlines() if line.startswith("sae train: ")]  # into a log: at once, at
    assert said[0].startswith("sae train: started, over ") and said[-1].startswith("sae train: done, ")  # the end
    assert 0 <= record["dead"] <= 128 and record["l0"] <= 8
    theirs = sae_lens.SAE.load_from_disk(str(out))
    assert type(theirs).__name__ == "TopKSAE" and theirs.cfg.k == 8
    assert torch.allclose(theirs.W_dec.detach().norm(dim=-1), torch.ones(128), atol=1e-5)
    from tfcli.analysis.sae import read_sae

    assert read_sae(out).site == "blocks.1.resid_post"
    trained = torch.load(out / CHECKPOINT, weights_only=True)
    assert abs(trained["scale"] - 1) > 0.1  # the folding of the scale below is seen
    text = "the cat sat on a mat while the sun rose"
    shown = cli("features", "-m", str(path), "--sae", str(out), "--top", "8", "--json", text)
    assert shown.exit_code == 0, shown.stderr
    ours = json.loads(shown.stdout)
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    ids = load_tokenizer_for(resolve_source(str(path))).encode([text])[0].ids
    ids = ids[:-1] if ids[-1] == 102 else ids  # a decoder reads the text without [SEP]
    kept = {}
    handle = hf.transformer.h[1].register_forward_hook(
        lambda module, args, output: kept.update(value=output[0] if isinstance(output, tuple) else output))
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        handle.remove()
    x = kept["value"][0].reshape(len(ids), -1)
    features = theirs.encode(x).detach()
    scale = max(1.0, float(features.abs().max()))
    p, s = trained["params"], trained["scale"]  # what training computed, on x / s: s times the same features
    pre = (x / s - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    top = pre.topk(8, dim=-1).indices
    by_hand = torch.zeros_like(pre).scatter(-1, top, torch.relu(pre.gather(-1, top))) * s
    assert float((features - by_hand).abs().max()) <= 1e-5 * scale
    assert torch.allclose(theirs.decode(features).detach(), (by_hand / s @ p["W_dec"] + p["b_dec"]) * s,
                          atol=1e-5 * float(x.abs().max()))
    assert ours["ids"] == ids and len(ours["features"]) == len(ids)
    for position, pairs in enumerate(ours["features"]):
        for index, value in pairs:
            assert abs(float(features[position, index]) - value) <= 1e-5 * scale
        assert len(pairs) == int((features[position] > 0).sum()) > 0


def test_the_corpus_streams_from_stdin(tiny_decoder, corpus, tmp_path, cli):
    """`--file -` reads stdin: the same SAE as from the file."""
    from_file, from_stdin = tmp_path / "file", tmp_path / "stdin"
    assert train_cli(cli, tiny_decoder, corpus, from_file).exit_code == 0
    result = train_cli(cli, tiny_decoder, "-", from_stdin, input=corpus.read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.stderr
    a, b = load_file(str(from_file / "sae_weights.safetensors")), load_file(str(from_stdin / "sae_weights.safetensors"))
    assert all(torch.equal(a[name], b[name]) for name in a)


# ------------------------------------------------------------------------------------------ Ctrl-C and --resume


@pytest.mark.parametrize("where", ["in a step", "while a buffer fills"])
def test_resume_after_ctrl_c_equals_a_run_never_interrupted(tiny_decoder, corpus, tmp_path, cli, monkeypatch,
                                                            where):
    whole = tmp_path / "whole"
    never = train_cli(cli, tiny_decoder, corpus, whole, "--json")
    assert never.exit_code == 0
    broken = tmp_path / "broken"
    calls = {"n": 0}
    name, after = ("train_step", 8) if where == "in a step" else ("site_rows", 8)
    original = getattr(core, name)

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == after:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(core, name, interrupted)
    result = train_cli(cli, tiny_decoder, corpus, broken)
    assert result.exit_code == 130, result.stderr
    assert f"--resume {broken}" in result.stderr
    position = torch.load(broken / CHECKPOINT, weights_only=True)["current"]
    assert position[3] > 0 if where == "in a step" else position is None  # inside a buffer; between two
    monkeypatch.setattr(core, name, original)
    resumed = cli("sae", "train", "-m", str(tiny_decoder), "--file", str(corpus), "--resume", str(broken), "--json")
    assert resumed.exit_code == 0, resumed.stderr
    record = json.loads(resumed.stdout)
    assert record["tokens"] == 2048 and 0 < record["resumed_from"] < 2048
    expected = json.loads(never.stdout)
    for key in ("history", "fvu", "explained", "l0", "dead", "dead_in_training", "outliers"):
        assert record[key] == expected[key], key
    a, b = load_file(str(whole / "sae_weights.safetensors")), load_file(str(broken / "sae_weights.safetensors"))
    for tensor in ("W_enc", "b_enc", "W_dec", "b_dec"):
        assert torch.equal(a[tensor], b[tensor]), tensor


def test_resume_refuses_another_corpus_model_or_options(tiny_decoder, corpus, tmp_path, cli, monkeypatch):
    out = tmp_path / "run"
    original = core.train_step
    calls = {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(core, "train_step", interrupted)
    assert train_cli(cli, tiny_decoder, corpus, out).exit_code == 130
    monkeypatch.setattr(core, "train_step", original)
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text(encoding="utf-8").replace("cat", "dog"), encoding="utf-8")
    refusals = {("--file", str(other)): "error: --resume: the corpus differs from the one the run trained on",
                ("--file", str(corpus), "--k", "4"): f"error: --resume {out}: --k 4 differs from the run's options",
                ("--file", str(corpus), "-m", "gpt2-small"): "error: --resume: the checkpoint is of decoder (32 wide), "
                                                             "not of gpt2-small"}
    for args, says in refusals.items():
        model = () if "-m" in args else ("-m", str(tiny_decoder))
        result = cli("sae", "train", *model, *args, "--resume", str(out))
        assert result.exit_code == 2
        assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [says]


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("args, says", [
    (("--site", "blocks.7.resid_post"), "--site blocks.7.resid_post: the model has no such site"),
    (("--site", "blocks.0.attn.pattern"), "--site blocks.0.attn.pattern: sae train reads one vector per token"),
    (("--site", "blocks.0.attn_norm.scale"), "--site blocks.0.attn_norm.scale: sae train reads one vector"),
    (("--site", "blocks.0.resid_post", "--latents", "16", "--k", "32"), "--k 32: it must be between 1 and"),
    (("--site", "blocks.0.resid_post", "--file", "EMPTY"), "no text given"),
    (("--site", "blocks.0.resid_post", "--resume", "PLAIN"), "no checkpoint there"),
    (("--site", "blocks.0.resid_post", "--tokens", "100"), "--tokens 100: fewer than one batch"),
    (("--site", "blocks.0.resid_post", "--out", "PLAIN_FILLED"), "not an empty folder"),
])
def test_bad_input_is_one_error_line(tiny_decoder, corpus, tmp_path, cli, args, says):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine", encoding="utf-8") if "PLAIN_FILLED" in args else None
    args = tuple(str(empty) if a == "EMPTY" else str(plain) if a.startswith("PLAIN") else a for a in args)
    file = () if "--file" in args else ("--file", str(corpus))
    out = () if "--out" in args else ("--out", str(tmp_path / "out"))
    result = cli("sae", "train", "-m", str(tiny_decoder), *file, *out, "--context", "32", *args)
    # a missing checkpoint, an --out that holds files: exit 1 (a file, docs/errors.md); the rest are options: 2
    assert result.exit_code == (1 if says in ("no checkpoint there", "not an empty folder") else 2), \
        (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr
