"""`tfcli sae train --transcoder`: a step against the objective computed layer by layer by hand; the figures it reports
(explained variance of the MLP output, L0, dead features) against a hand computation on transformers' own modules
(the MLP's input and output hooked, the written weights applied by hand); the written folder read by `tfcli graph
--transcoders` and by circuit-tracer 0.5.0 itself with the same graph, and each layer's SAELens folder by sae-lens;
training lowers the loss; a run interrupted (Ctrl-C) and resumed equal to one never interrupted; bad input refused
with one error line. Tiny models (a 3-block Llama saved by transformers), seconds each."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from test_graph import PROMPT, tfcli_graph, write_tokenizer
from test_graph_circuit_tracer import INSTALLED, assert_same, run_circuit_tracer
from tfcli.analysis.corpus import CHECKPOINT
from tfcli.commands.graph import core as graph_core
from tfcli.commands.sae import transcoder

SMALL = ("--tokens", "3072", "--batch", "128", "--buffer", "1024", "--held-out", "512", "--context", "16",
         "--latents", "64", "--k", "8")


@pytest.fixture(scope="module")
def llama(tmp_path_factory, save_hf_model):
    """A 3-block Llama saved by transformers with a word-level tokenizer: (path, transformers' model)."""
    import transformers

    from test_graph import WORDS

    path = tmp_path_factory.mktemp("tc-llama")
    config = transformers.LlamaConfig(vocab_size=len(WORDS) + 3, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False)
    hf = save_hf_model(transformers.LlamaForCausalLM, config, path, perturb=True)
    write_tokenizer(path)
    return path, hf


def train_cli(cli, model, corpus, out, *extra: str):
    return cli("sae", "train", "-m", str(model), "--transcoder", "--file", str(corpus), "--out", str(out), *SMALL,
               *extra)


@pytest.fixture(scope="module")
def trained(llama, corpus, tmp_path_factory):
    """Transcoders with a skip matrix trained on the Llama: (their folder, the run's JSON record)."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    out = tmp_path_factory.mktemp("tc") / "transcoders"
    result = CliRunner().invoke(app, ["sae", "train", "-m", str(llama[0]), "--transcoder", "--skip", "--file",
                                      str(corpus), "--out", str(out), *SMALL, "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout.splitlines()[-1])


# ------------------------------------------------------------------------------------------ the objective by hand


def hand_layer(w: dict, x: torch.Tensor, y: torch.Tensor, k: int, dead: torch.Tensor) -> tuple:
    """One layer's FVU and AuxK, dense: features TopK(ReLU(x W_enc + b_enc)), y^ = f W_dec + b_dec + x W_skip^T."""
    pre = x @ w["W_enc"] + w["b_enc"]
    top = pre.topk(k, dim=-1).indices
    f = torch.zeros_like(pre).scatter(-1, top, torch.relu(pre.gather(-1, top)))
    recon = f @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T
    error = y - recon
    variance = (y - y.mean(0)).pow(2).sum()
    fvu = error.pow(2).sum() / variance
    count = int(dead.sum())
    if not count:
        return fvu, torch.zeros(())
    k_aux = x.shape[-1] // 2
    masked = pre.masked_fill(~dead, -math.inf)
    chosen = masked.topk(min(k_aux, count), dim=-1).indices
    z = torch.zeros_like(pre).scatter(-1, chosen, torch.relu(pre.gather(-1, chosen)))
    auxk = min(count / k_aux, 1.0) * (z @ w["W_dec"] - error.detach()).pow(2).sum() / variance
    return fvu, auxk


def test_a_step_is_each_layers_objective_by_hand():
    """The stacked objective's per-layer FVU, AuxK and gradients equal each layer's computed alone: layers with more
    and fewer dead latents than k_aux, one with none."""
    generator = torch.Generator().manual_seed(0)
    layers, n, d, k, tokens = 3, 24, 8, 3, 40
    x = torch.randn(layers, tokens, d, generator=generator)
    y = torch.randn(layers, tokens, d, generator=generator) * 2 + 0.5
    params = transcoder.init_params(d, n, layers, y, 0, with_skip=True)
    with torch.no_grad():
        params["W_skip"] += torch.randn(layers, d, d, generator=generator) * 0.1
        params["b_enc"] += torch.randn(layers, n, generator=generator) * 0.1
    dead = torch.zeros(layers, n, dtype=torch.bool)
    dead[0, :10] = True  # more than k_aux (4)
    dead[1, 5:7] = True  # fewer
    found = transcoder.objective(params, x, y, k, dead)
    found["loss"].backward()
    for layer in range(layers):
        w = {name: value[layer].detach().clone().requires_grad_() for name, value in params.items()}
        fvu, auxk = hand_layer(w, x[layer], y[layer], k, dead[layer])
        assert torch.allclose(found["fvu"][layer], fvu, rtol=1e-5)
        assert torch.allclose(found["auxk"][layer], auxk, rtol=1e-5, atol=1e-7)
        (fvu + auxk / 32).backward()
        for name in params:
            assert torch.allclose(params[name].grad[layer], w[name].grad, rtol=1e-4, atol=1e-6), (layer, name)
    auxk = found["auxk"].detach()
    assert float(auxk[0]) > 0 and float(auxk[1]) > 0 and float(auxk[2]) == 0


def test_thresholds_reproduce_top_k_as_well_as_any():
    """Each feature's threshold disagrees with top-k on no more tokens than any other threshold would."""
    generator = torch.Generator().manual_seed(1)
    pre = torch.randn(300, 12, generator=generator) + torch.linspace(-1, 1, 12)
    k = 3
    found = transcoder.thresholds(pre, k)
    values, indices = pre.topk(k, dim=-1)
    chosen = torch.zeros_like(pre, dtype=torch.bool).scatter(-1, indices, values > 0)

    def wrong(feature: int, threshold: float) -> int:
        return int(((pre[:, feature] > threshold) != chosen[:, feature]).sum())

    for feature in range(12):
        values = pre[:, feature].sort().values
        candidates = [0.0, *((values[1:] + values[:-1]) / 2).tolist(), float(values[-1])]
        best = min(wrong(feature, t) for t in candidates if t >= 0)
        assert found[feature] >= 0 and wrong(feature, float(found[feature])) == best


# ------------------------------------------------------------------------------------------ the figures by hand


def held_out_activations(path, hf, corpus, context: int, held_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out tokens' MLP inputs and outputs (L, N, d) by transformers' own modules: the corpus's lines
    tokenized, each after <s>, joined, cut into windows; positions 0 and <s> left out; the first `held_out` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = []
    for line in corpus.read_text(encoding="utf-8").splitlines():
        ids += [1, *tokenizer.encode(line).ids]
    inputs, outputs = {}, {}
    hooks = []
    for layer, block in enumerate(hf.model.layers):
        hooks.append(block.post_attention_layernorm.register_forward_hook(
            lambda module, args, out, layer=layer: inputs.__setitem__(layer, out)))
        hooks.append(block.mlp.register_forward_hook(
            lambda module, args, out, layer=layer: outputs.__setitem__(layer, out)))
    xs, ys, count = [], [], 0
    with torch.no_grad():
        for start in range(0, len(ids) - context, context):
            window = torch.tensor([ids[start:start + context]])
            hf(window)
            keep = (window[0] != 1)
            keep[0] = False
            xs.append(torch.stack([inputs[i][0][keep] for i in range(len(inputs))]))
            ys.append(torch.stack([outputs[i][0][keep] for i in range(len(outputs))]))
            count += int(keep.sum())
            if count >= held_out:
                break
    for hook in hooks:
        hook.remove()
    return torch.cat(xs, 1)[:, :held_out].double(), torch.cat(ys, 1)[:, :held_out].double()


def test_the_figures_are_the_written_weights_on_transformers_activations(llama, corpus, trained):
    """Explained variance, top-k explained variance, L0 and dead features of each layer equal the layer file applied
    by hand to transformers' own MLP input and output on the held-out tokens (outliers left out as documented)."""
    path, hf = llama
    out, record = trained
    x, y = held_out_activations(path, hf, corpus, 16, 512)
    norms = torch.cat([x, y]).norm(dim=-1)
    ok = (norms <= norms.median(dim=1).values[:, None] * 10).all(0)
    x, y = x[:, ok], y[:, ok]
    assert record["held_out"] == int(ok.sum()) and record["held_outliers"] == int((~ok).sum())
    for layer, figures in enumerate(record["figures"]):
        w = {name: value.double() for name, value in load_file(str(out / f"layer_{layer}.safetensors")).items()}
        pre = x[layer] @ w["W_enc"].T + w["b_enc"]
        acts = pre * (pre > w["activation_function.threshold"])
        recon = acts @ w["W_dec"] + w["b_dec"] + x[layer] @ w["W_skip"].T
        top = pre.topk(8, dim=-1).indices
        topk = torch.zeros_like(pre).scatter(-1, top, torch.relu(pre.gather(-1, top)))
        recon_topk = topk @ w["W_dec"] + w["b_dec"] + x[layer] @ w["W_skip"].T
        variance = (y[layer] - y[layer].mean(0)).pow(2).sum()
        assert figures["explained"] == pytest.approx(1 - float((y[layer] - recon).pow(2).sum() / variance), abs=1e-5)
        assert figures["explained_topk"] == pytest.approx(
            1 - float((y[layer] - recon_topk).pow(2).sum() / variance), abs=1e-5)
        assert figures["l0"] == pytest.approx(float((acts > 0).sum(-1).double().mean()), abs=1e-6)
        assert figures["dead"] == int((~(acts > 0).any(0)).sum())
        assert 0.3 < figures["explained_topk"] and 0.2 < figures["explained"]  # it learned the MLP, not nothing


def test_training_lowers_the_loss(trained):
    out, record = trained
    first, last = record["history"][0][1], record["history"][-1][1]
    assert last < 0.7 * first and record["fvu"] < 0.7 * first


def test_each_saelens_folder_loads_in_sae_lens_with_the_same_features(trained):
    from sae_lens import SAE

    out, _ = trained
    generator = torch.Generator().manual_seed(2)
    for layer in range(3):
        w = load_file(str(out / f"layer_{layer}.safetensors"))
        sae = SAE.load_from_disk(str(out / "saelens" / f"layer_{layer}"), device="cpu")
        assert type(sae).__name__ == "JumpReLUSkipTranscoder"
        x = torch.randn(20, 32, generator=generator) * 3
        pre = x @ w["W_enc"].T + w["b_enc"]
        acts = pre * (pre > w["activation_function.threshold"])
        with torch.no_grad():
            features = sae.encode(x)
            assert torch.allclose(features, acts, atol=1e-5)
            assert torch.allclose(sae.decode(features) if "W_skip" not in dict(sae.named_parameters())
                                  else sae(x), acts @ w["W_dec"] + w["b_dec"] + x @ w["W_skip"].T, atol=1e-4)


# ------------------------------------------------------------------------------------------ read by graph and circuit-tracer


@INSTALLED
def test_graph_and_circuit_tracer_read_the_folder_alike(llama, trained, tmp_path):
    path, _ = llama
    out, _ = trained
    options = graph_core.GraphOptions(batch_size=64, validate=0)
    ours = tfcli_graph(path, out, options)
    job = {"model": str(path), "transcoders": str(out), "layers": 3, "prompt": PROMPT, "max_feature_nodes": None,
           "batch_size": 64, "out": str(tmp_path / "theirs.safetensors")}
    [scores] = run_circuit_tracer([job])
    assert_same(ours, scores, job["out"], features_kept=False)


# ------------------------------------------------------------------------------------------ Ctrl-C and --resume


def test_resume_after_ctrl_c_equals_a_run_never_interrupted(llama, corpus, trained, tmp_path, cli, monkeypatch):
    path, _ = llama
    whole, expected = trained
    broken = tmp_path / "broken"
    calls = {"n": 0}
    original = transcoder.train_step

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(transcoder, "train_step", interrupted)
    result = train_cli(cli, path, corpus, broken, "--skip")
    assert result.exit_code == 130, result.stderr
    assert f"--resume {broken}" in result.stderr
    assert torch.load(broken / CHECKPOINT, weights_only=True)["current"][3] > 0  # inside a buffer
    monkeypatch.setattr(transcoder, "train_step", original)
    resumed = cli("sae", "train", "-m", str(path), "--file", str(corpus), "--resume", str(broken), "--json")
    assert resumed.exit_code == 0, resumed.stderr
    record = json.loads(resumed.stdout)
    assert record["tokens"] == 3072 and 0 < record["resumed_from"] < 3072
    for key in ("history", "fvu", "figures", "outliers"):
        assert record[key] == expected[key], key
    for layer in range(3):
        a = load_file(str(whole / f"layer_{layer}.safetensors"))
        b = load_file(str(broken / f"layer_{layer}.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a), layer


# ------------------------------------------------------------------------------------------ the view and bad input


@pytest.mark.parametrize("width", [80, 120])
def test_the_view_fits_and_cuts_no_number(trained, width):
    from rich.console import Console

    from tfcli.commands.sae import render
    from tfcli.commands.sae.transcoder import LayerFigures, TranscodersTrained

    _, record = trained
    result = TranscodersTrained(**{**record, "figures": [LayerFigures(**f) for f in record["figures"]]})
    lines = render.transcoder_view(result, width)
    console = Console(width=width, record=True, color_system=None)
    for line in lines:
        console.print(line)
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    for figures in record["figures"]:
        assert f"{figures['explained']:.3f}" in text and f"{figures['l0']:.1f}" in text


@pytest.mark.parametrize("args, says, code", [
    (("--transcoder", "--site", "blocks.0.mlp.out"), "--site blocks.0.mlp.out: --transcoder trains every layer", 2),
    (("--skip", "--site", "blocks.0.mlp.out"), "--site blocks.0.mlp.out: --transcoder trains every layer", 2),
    (("--skip",), "--skip is a transcoder's skip matrix: give --transcoder too", 2),
    (("--transcoder", "-m", "ENCODER"), "sae train --transcoder reads a decoder's MLPs", 2),
    (("--transcoder", "--latents", "16", "--k", "32"), "--k 32: it must be between 1 and", 2),
    (("--transcoder", "--out", "FILLED"), "not an empty folder", 1),
    (("--transcoder", "--resume", "PLAIN"), "no checkpoint there", 1),
])
def test_bad_input_is_one_error_line(llama, tiny_config, corpus, tmp_path, cli, args, says, code):
    plain = tmp_path / "plain"
    plain.mkdir()
    if "FILLED" in args:
        (plain / "notes.txt").write_text("mine", encoding="utf-8")
    args = tuple(str(plain) if a in ("PLAIN", "FILLED") else str(tiny_config) if a == "ENCODER" else a for a in args)
    model = () if "-m" in args else ("-m", str(llama[0]))
    out = () if "--out" in args else ("--out", str(tmp_path / "out"))
    result = cli("sae", "train", *model, "--file", str(corpus), *out, "--context", "16", *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr
