"""`tfcli lens fit` and `lens eval`, the tuned lens: a lens tfcli fitted, read by tuned-lens 0.2 on transformers' own
model, gives tfcli's logits per layer (a tiny GPT-2 and Llama made here; SmolLM2, slow); a lens tuned-lens's own
code fitted reads the same in tfcli; two training steps equal the objective and tuned-lens's SGD computed by hand on
transformers' modules; Ctrl-C and --resume give the lens of a run never interrupted; bad input is one error line.
Tiny models, about a second each. The references skip where tuned-lens is not installed
(`pip install --no-deps -c constraints.txt -r tests/references.txt`)."""

from __future__ import annotations

import json

import pytest
import torch

import tfcli
from tfcli.analysis import tuned_lens as tl
from tfcli.analysis.corpus import Windows
from tfcli.commands.lens import core
from tfcli.render.layout import screen_text

SMALL = ("--tokens", "1024", "--batch", "128", "--held-out", "256", "--context", "32")


@pytest.fixture(scope="module")
def reference():
    return pytest.importorskip("tuned_lens", reason="tuned-lens 0.2 is the reference: pip install --no-deps "
                               "tuned-lens==0.2.0 (tests/references.txt)")


def gpt2(path, save_hf_model):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.2)
    return save_hf_model(GPT2LMHeadModel, config, path, perturb=True)


def llama(path, save_hf_model):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=30522, max_position_embeddings=64, bos_token_id=101,
                         eos_token_id=102, pad_token_id=0, tie_word_embeddings=False, initializer_range=0.2)
    return save_hf_model(LlamaForCausalLM, config, path, perturb=True)


FAMILIES = {"gpt2": gpt2, "llama": llama}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory, save_hf_model):
    """(path, transformers' model) of a tiny GPT-2 or Llama on the bundled BERT vocabulary."""
    path = tmp_path_factory.mktemp(request.param)
    return path, FAMILIES[request.param](path, save_hf_model)


def fit_cli(cli, model, corpus, out, *extra: str, input: str | None = None):
    return cli("lens", "fit", "-m", str(model), "--file", str(corpus), "--out", str(out), *SMALL, *extra,
               input=input)


def close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """The project's parity rule: max abs difference <= 1e-4 + 1e-5 of the tensor's scale."""
    gap, scale = float((ours - theirs).abs().max()), float(theirs.abs().max())
    assert gap <= 1e-4 + 1e-5 * scale, f"{what}: differs by {gap:.3g} (scale {scale:.3g})"


def windows_of(model, corpus, count: int = 2, context: int = 32) -> list:
    texts = corpus.read_text(encoding="utf-8").splitlines()
    windows = Windows(iter([texts[:100]]), tfcli.load_tokenizer(str(model)), tfcli.load_model(str(model)), context)
    return [windows.next() for _ in range(count)]


def their_lens_logits(reference_lens, hf, ids: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
        return [reference_lens(hidden[layer], idx=layer) for layer in range(len(hidden) - 1)]


def our_lens_logits(lens: tl.Lens, model, ids: torch.Tensor) -> list[torch.Tensor]:
    from tfcli.model.sites import hidden_site

    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=[hidden_site(l) for l in range(lens.layers)])
        return [lens.logits(model, cache[hidden_site(l)], l) for l in range(lens.layers)]


# ------------------------------------------------------------------------------------------ equal to tuned-lens


def test_a_lens_tfcli_fitted_reads_the_same_in_tuned_lens(family, corpus, tmp_path, cli, reference, caplog):
    path, hf = family
    out = tmp_path / "lens"
    result = fit_cli(cli, path, corpus, out, "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["steps"] == 8 and record["held_out"]["layers"] == 3
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert set(config) == {"base_model_name_or_path", "d_model", "num_hidden_layers", "bias", "base_model_revision",
                           "unembed_hash", "lens_type"}
    theirs = reference.TunedLens.from_model_and_pretrained(hf, str(out))
    assert "hash does not match" not in caplog.text  # tuned-lens's hash of transformers' unembedding is tfcli's
    assert config["unembed_hash"] == theirs.unembed.unembedding_hash()
    model = tfcli.load_model(str(path))
    lens = tl.read_lens(out, model)
    assert all(float(lens.translators.weight[l].abs().max()) > 1e-3 for l in range(3))  # the fit moved each layer
    ids = torch.tensor([w[0] for w in windows_of(path, corpus)])
    for layer, (ours, want) in enumerate(zip(our_lens_logits(lens, model, ids), their_lens_logits(theirs, hf, ids))):
        close(ours, want, f"layer {layer}'s lens logits")


def test_a_lens_tuned_lens_fitted_reads_the_same_in_tfcli(family, corpus, tmp_path, cli, reference):
    """tuned-lens's TunedLens fitted by its trainer's step (train_loop.py: KL to the final distribution at the current
    token, the gradient clipped to 1, SGD with Nesterov momentum as ingredients.py makes it; its module imports
    torchdata's DataLoader2, which current torchdata no longer has, so the loop body is written out here), saved by
    TunedLens.save: tfcli reads it, and its logits per layer are tuned-lens's."""
    path, hf = family
    theirs = reference.TunedLens.from_model(hf)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    windows = windows_of(path, corpus, 6)
    for start in range(0, 6, 2):
        ids = torch.tensor([w[0] for w in windows[start:start + 2]])
        with torch.no_grad():
            output = hf(ids, output_hidden_states=True)
        labels = output.logits.float().log_softmax(-1)
        for layer, hidden in enumerate(output.hidden_states[:-1]):
            logits = theirs(hidden, idx=layer)
            torch.sum(labels.exp() * (labels - logits.log_softmax(-1)), dim=-1).mean().backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    out = tmp_path / "theirs"
    theirs.save(out)
    model = tfcli.load_model(str(path))
    lens = tl.read_lens(out, model)
    ids = torch.tensor([w[0] for w in windows[:2]])
    for layer, (ours, want) in enumerate(zip(our_lens_logits(lens, model, ids), their_lens_logits(theirs, hf, ids))):
        close(ours, want, f"layer {layer}'s lens logits")
    result = cli("lens", "eval", str(out), "-m", str(path), "--file", str(corpus), "--context", "32", "--held-out",
                 "256", "--json")
    assert result.exit_code == 0, result.stderr
    rows = json.loads(result.stdout)["per_layer"]
    assert [row["layer"] for row in rows] == [0, 1, 2]
    assert all(row["kl_tuned"] < row["kl_logit"] for row in rows)  # fitted: closer to the final than the logit lens


# ------------------------------------------------------------------------------------------ the objective


def hand_steps(hf, windows, steps: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` steps of one window each, by hand on transformers' modules: the loss is the sum over layers of the
    mean over the kept tokens of KL(final || lm_head(final_norm(h + h A^T + b))); the gradient clipped to norm 1;
    SGD with weight decay 1e-3 and Nesterov momentum 0.9 at lr 0.1 (1 - step / total)."""
    layers, d = hf.config.num_hidden_layers, hf.config.hidden_size
    norm = hf.transformer.ln_f if hasattr(hf, "transformer") else hf.model.norm
    weight, bias = torch.zeros(layers, d, d, requires_grad=True), torch.zeros(layers, d, requires_grad=True)
    momentum = [torch.zeros(layers, d, d), torch.zeros(layers, d)]
    for step, (ids, kept) in enumerate(windows[:steps]):
        with torch.no_grad():
            output = hf(torch.tensor([ids]), output_hidden_states=True)
        keep = torch.tensor(kept)
        p_log = output.logits[0, keep].log_softmax(-1)
        loss = 0
        for layer in range(layers):
            h = output.hidden_states[layer][0, keep]
            q_log = hf.lm_head(norm(h + h @ weight[layer].T + bias[layer])).log_softmax(-1)
            loss = loss + (p_log.exp() * (p_log - q_log)).sum(-1).mean()
        grads = torch.autograd.grad(loss, [weight, bias])
        scale = min(1.0, 1.0 / (float(torch.cat([g.flatten() for g in grads]).norm()) + 1e-6))
        lr = 0.1 * (total - step) / total
        with torch.no_grad():
            for param, grad, buffer in zip((weight, bias), grads, momentum):
                g = grad * scale + 1e-3 * param
                buffer.copy_(g if step == 0 else 0.9 * buffer + g)
                param -= lr * (g + 0.9 * buffer)
    return weight.detach(), bias.detach()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_two_steps_are_the_objective_and_sgd_by_hand(name, corpus, tmp_path, save_hf_model):
    hf = FAMILIES[name](tmp_path, save_hf_model)
    model, windows = tfcli.load_model(str(tmp_path)), windows_of(tmp_path, corpus)
    state = core.new_state(model)
    options = core.FitOptions(tokens=64 * 5, batch=32, context=32)
    for window in windows:
        core.step(model, state, [window], options, lambda done: None)
    weight, bias = hand_steps(hf, windows, 2, options.steps)
    assert float(weight.abs().max()) > 1e-3
    close(state.lens.translators.weight.detach(), weight, "translators' A")
    close(state.lens.translators.bias.detach(), bias, "translators' b")


# ------------------------------------------------------------------------------------------ runs


def test_resume_after_ctrl_c_equals_a_run_never_interrupted(tiny_decoder, corpus, tmp_path, cli, monkeypatch):
    whole = tmp_path / "whole"
    never = fit_cli(cli, tiny_decoder, corpus, whole, "--json")
    assert never.exit_code == 0, never.stderr
    broken, original, calls = tmp_path / "broken", core.step, {"n": 0}

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(core, "step", interrupted)
    result = fit_cli(cli, tiny_decoder, corpus, broken)
    assert result.exit_code == 130, result.stderr
    assert f"--resume {broken}" in result.stderr
    monkeypatch.setattr(core, "step", original)
    resumed = cli("lens", "fit", "-m", str(tiny_decoder), "--file", str(corpus), "--resume", str(broken), "--json")
    assert resumed.exit_code == 0, resumed.stderr
    record, expected = json.loads(resumed.stdout), json.loads(never.stdout)
    assert record["resumed_from"] == 3 * 128 and record["tokens"] == 1024
    for key in ("loss", "history"):
        assert record[key] == expected[key], key
    assert record["held_out"]["per_layer"] == expected["held_out"]["per_layer"]
    a, b = torch.load(whole / "params.pt", weights_only=True), torch.load(broken / "params.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_corpus_streams_from_stdin_and_eval_repeats_the_fits_figures(tiny_decoder, corpus, tmp_path, cli):
    from_file, from_stdin = tmp_path / "file", tmp_path / "stdin"
    fitted = fit_cli(cli, tiny_decoder, corpus, from_file, "--json")
    assert fitted.exit_code == 0
    result = fit_cli(cli, tiny_decoder, "-", from_stdin, input=corpus.read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.stderr
    a = torch.load(from_file / "params.pt", weights_only=True)
    b = torch.load(from_stdin / "params.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    again = cli("lens", "eval", str(from_file), "-m", str(tiny_decoder), "--file", str(corpus), "--context", "32",
                "--held-out", "256", "--json")
    assert json.loads(again.stdout) == json.loads(fitted.stdout)["held_out"]


@pytest.mark.parametrize("width", [80, 120])
def test_the_table_keeps_every_number_at_any_width(tiny_decoder, corpus, tmp_path, cli, width):
    out = tmp_path / "lens"
    assert fit_cli(cli, tiny_decoder, corpus, out).exit_code == 0
    result = cli("lens", "eval", str(out), "-m", str(tiny_decoder), "--file", str(corpus), "--context", "32",
                 "--held-out", "256", "--width", str(width), "--report", str(tmp_path / "lens.svg"),
                 env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.stderr
    assert "\x1b[" not in result.stdout and all(len(line) <= width for line in result.stdout.splitlines())
    record = json.loads(cli("lens", "eval", str(out), "-m", str(tiny_decoder), "--file", str(corpus), "--context",
                            "32", "--held-out", "256", "--json").stdout)
    for row in record["per_layer"]:
        line = next(line for line in result.stdout.splitlines() if line.split()[:1] == [str(row["layer"])])
        assert line.split()[1:] == [f"{row['kl_logit']:.3f}", f"{row['kl_tuned']:.3f}", f"{row['top1_logit']:.1%}",
                                    f"{row['top1_tuned']:.1%}"]
    assert (tmp_path / "lens.svg").read_text(encoding="utf-8").startswith("<?xml")
    from tfcli.commands.lens.render import eval_lines

    evaluated = core.Evaluated("lens", "m", 2, 8, tl.Evaluation(10, [1.0, 2.0], [0.5, 3.0], [0.1, 0.2], [0.3, 0.1]))
    coloured = screen_text(eval_lines(evaluated, width), width, color=True)
    assert "\x1b[32m" in coloured  # the tuned lens's KL in green where it is lower than the logit lens's


# ------------------------------------------------------------------------------------------ bad input


class Payload:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.fixture(scope="module")
def fitted(tiny_decoder, corpus, tmp_path_factory):
    """A lens fitted on the tiny decoder (3 steps), through Python."""
    out = tmp_path_factory.mktemp("fitted") / "lens"
    texts = [corpus.read_text(encoding="utf-8").splitlines()]
    model, tokenizer = tfcli.load_model(str(tiny_decoder)), tfcli.load_tokenizer(str(tiny_decoder))
    core.fit(model, tokenizer, iter(texts), core.FitOptions(tokens=96, batch=32, context=32, held_out=32), out)
    return out


def broken_lens(fitted, tmp_path, how: str):
    import shutil

    folder = tmp_path / how
    shutil.copytree(fitted, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if how == "no-config":
        (folder / "config.json").unlink()
    elif how == "garbage-config":
        (folder / "config.json").write_text("{not json", encoding="utf-8")
    elif how == "pickle":
        torch.save({"0.weight": Payload()}, folder / "params.pt")
    elif how in ("width", "layers", "hash"):
        config[{"width": "d_model", "layers": "num_hidden_layers", "hash": "unembed_hash"}[how]] = \
            {"width": 64, "layers": 7, "hash": "0" * 64}[how]
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize("how, says", [
    ("no-config", "no config.json there"),
    ("garbage-config", "config.json: not JSON"),
    ("pickle", "params.pt: refused to load: it holds Python objects other than tensors"),
    ("width", "the lens is for a model of 64 wide; decoder has 32 (d_model differs)"),
    ("layers", "the lens is for a model of 7 blocks; decoder has 2 (num_hidden_layers differs)"),
    ("hash", "the lens was fitted to another unembedding (its unembed_hash differs from decoder's)"),
])
def test_a_lens_that_does_not_fit_the_model_is_one_error_line(fitted, tiny_decoder, corpus, tmp_path, cli, capfd,
                                                             how, says):
    folder = broken_lens(fitted, tmp_path, how)
    result = cli("lens", "eval", str(folder), "-m", str(tiny_decoder), "--file", str(corpus), "--context", "32")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr and "this ran" not in capfd.readouterr().out


@pytest.mark.parametrize("args, says", [
    (("-m", "bert-base"), "lens fit: bert-base is an encoder with a masked-LM head; a tuned lens reads a decoder's"),
    (("--out", "FILLED"), "not an empty folder"),
    (("--resume", "EMPTY_DIR"), "no checkpoint there (training.pt)"),
    (("--tokens", "16"), "--tokens 16: fewer than one step"),
    (("--report", "lens.html"), "lens writes a figure: .svg, .png or .pdf"),
])
def test_bad_input_is_one_error_line(tiny_decoder, corpus, tmp_path, cli, no_model_built, args, says):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine", encoding="utf-8") if "FILLED" in args else None
    args = tuple(str(folder) if a in ("FILLED", "EMPTY_DIR") else
                 str(tmp_path / a) if a == "lens.html" else a for a in args)
    model = () if "-m" in args else ("-m", str(tiny_decoder))
    file = () if "--file" in args else ("--file", str(corpus))
    out = () if "--out" in args else ("--out", str(tmp_path / "out"))
    result = cli("lens", "fit", *model, *file, *out, "--context", "32", *args)
    # docs/errors.md: a folder that holds files, or one with no checkpoint, is a file's error (1), as sae train's
    assert result.exit_code == (1 if says.startswith(("not an empty", "no checkpoint")) else 2), \
        (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("lines, says", [
    ("\n\n", "no text given"),
    ("a few words\n", "the corpus gave fewer than 32 tokens (one window of --context)"),
])
def test_a_corpus_too_short_is_one_error_line(tiny_decoder, tmp_path, cli, lines, says):
    short = tmp_path / "short.txt"
    short.write_text(lines, encoding="utf-8")
    result = fit_cli(cli, tiny_decoder, short, tmp_path / "out")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ encode and generate


def same_top(ours: dict, theirs: torch.Tensor, what: str) -> None:
    """tfcli's top token of a position is tuned-lens's (its probability there the largest, to 1e-5: a tie in a tiny
    random model may fall either way) with tuned-lens's probability."""
    probs = theirs.float().softmax(-1)
    assert float(probs.max() - probs[ours["id"]]) <= 1e-5, what
    assert abs(ours["prob"] - float(probs[ours["id"]])) <= 1e-5, what


def test_encode_and_generate_read_through_the_tuned_lens(family, corpus, tmp_path, cli, reference):
    """`encode --lens tuned:DIR` (a row per block output: block l's output is layer l + 1's input) and `generate
    --lens tuned:DIR` (a row per hidden state, 0 = the embeddings) show tuned-lens's own top tokens."""
    path, hf = family
    out = tmp_path / "lens"
    assert fit_cli(cli, path, corpus, out).exit_code == 0
    theirs = reference.TunedLens.from_model_and_pretrained(hf, str(out))
    text = "the cat sat on a mat and dog ran to park"
    encoded = cli("encode", "-m", str(path), "--lens", f"tuned:{out}", "--top-k", "1", "--json", text)
    assert encoded.exit_code == 0, encoded.stderr
    record = json.loads(encoded.stdout)
    assert record["lens_from"] == str(out)
    ids = torch.tensor([record["ids"]])
    lensed = their_lens_logits(theirs, hf, ids) + [hf(ids).logits.detach()]  # hidden 0..L-1 translated, then L
    for row in record["lens"]:
        for position, top in enumerate(row["top"]):
            same_top(top[0], lensed[row["layer"] + 1][0, position], f"encode: block {row['layer']}, {position}")
    generated = cli("generate", "-m", str(path), "--lens", f"tuned:{out}", "-n", "3", "--json", text)
    assert generated.exit_code == 0, generated.stderr
    record = json.loads(generated.stdout)
    assert record["lens_from"] == str(out) and record["prompt"] == text
    for step in record["steps"]:
        ids = torch.tensor([record["prompt_ids"] + record["generated_ids"][:step["step"]]])
        lensed = their_lens_logits(theirs, hf, ids) + [hf(ids).logits.detach()]
        for entry in step["lens"]:
            same_top(entry, lensed[entry["layer"]][0, -1], f"generate: step {step['step']}, layer {entry['layer']}")


@pytest.mark.parametrize("args, says", [
    (("encode", "--lens", "tuned"), "--lens tuned: give `logit` or `tuned:DIR`"),
    (("encode", "--lens", "tuned:MISSING"), "no such folder"),
    (("encode", "-m", "bert-base", "--lens", "tuned:LENS"), "bert-base is an encoder with a masked-LM head"),
    (("generate", "--lens", "tuned:MISSING"), "no such folder"),
    (("generate", "-m", "gpt2-small", "--lens", "tuned:LENS"), "the lens is for a model of 32 wide; gpt2-small has"),
])
def test_a_lens_encode_or_generate_cannot_read_is_one_error_line(fitted, tiny_decoder, tmp_path, cli, no_model_built,
                                                                 args, says):
    args = tuple(a.replace("MISSING", str(tmp_path / "missing")).replace("LENS", str(fitted)) for a in args)
    model = () if "-m" in args else ("-m", str(tiny_decoder))
    result = cli(args[0], *model, *args[1:], "the cat sat")
    assert result.exit_code in (1, 2), (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------ SmolLM2


@pytest.mark.slow
def test_smollm2_lens_reads_the_same_in_tuned_lens(smollm2_gguf, corpus, tmp_path, cli, reference):
    """One step of one window on the real SmolLM2-135M GGUF; tuned-lens reads the lens on transformers' own loading
    of the same file."""
    path, hf, _ = smollm2_gguf
    out = tmp_path / "lens"
    result = cli("lens", "fit", "-m", str(path), "--file", str(corpus), "--out", str(out), "--tokens", "64",
                 "--batch", "64", "--context", "64", "--held-out", "64")
    assert result.exit_code == 0, result.stderr
    theirs = reference.TunedLens.from_model_and_pretrained(hf, str(out))
    assert json.loads((out / "config.json").read_text())["unembed_hash"] == theirs.unembed.unembedding_hash()
    model = tfcli.load_model(str(path))
    lens = tl.read_lens(out, model)
    ids = torch.tensor([windows_of(path, corpus, 1, 64)[0][0]])
    for layer, (ours, want) in enumerate(zip(our_lens_logits(lens, model, ids), their_lens_logits(theirs, hf, ids))):
        close(ours, want, f"layer {layer}'s lens logits")
