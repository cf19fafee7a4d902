"""`--ablate` on encode, attribute and patch, against the same quantities computed by hand on transformers' own
modules: a GPT-2 checkpoint transformers saved, a head zeroed with a forward pre-hook on its block's output
projection (the head's slice of its input), a sublayer replaced by its mean over the text's positions with a
forward hook, clean values put back with hooks on the block modules. No tfcli code computes a reference."""

from __future__ import annotations

import json

import pytest
import torch

CLEAN = "when mary and john went to the store, john gave a drink to"
CORRUPT = "when mary and john went to the store, mary gave a drink to"
LAYERS, HEADS, WIDTH = 3, 4, 32
SIZE = WIDTH // HEADS


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """(path, transformers model): a 3-block GPT-2 on the BERT vocabulary (the bundled tokenizer reads the texts),
    every bias and norm random."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=64, vocab_size=30522,
                        bos_token_id=101, eos_token_id=102, pad_token_id=0)
    path = tmp_path_factory.mktemp("gpt2")
    return path, save_hf_model(GPT2LMHeadModel, config, path, perturb=True)


def error_line(result) -> str:
    """The one `error:` line of a refusal (a note on the bundled tokenizer may come before it)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def ablation_handles(hf, spec: str) -> list:
    """transformers' hooks removing what `spec` names: `L1H2` zeroes head 2's slice of block 1's c_proj input,
    `L0.mlp:mean` replaces block 0's MLP output by its mean over the positions."""
    blocks = hf.transformer.h
    if spec == "L1H2":
        def zero_head(module, args):
            z = args[0].clone()
            z[..., 2 * SIZE:3 * SIZE] = 0
            return (z, *args[1:])
        return [blocks[1].attn.c_proj.register_forward_pre_hook(zero_head)]
    assert spec == "L0.mlp:mean"
    return [blocks[0].mlp.register_forward_hook(lambda m, a, out: out.mean(1, keepdim=True).expand_as(out))]


def hf_logits(hf, ids: list[int], specs: list[str], extra: list | None = None) -> torch.Tensor:
    """transformers' logits (T, V) of one text with the ablations (and `extra` hook makers: hf -> handle) on."""
    handles = [h for spec in specs for h in ablation_handles(hf, spec)] + [make(hf) for make in extra or []]
    try:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0].double()
    finally:
        for handle in handles:
            handle.remove()


def ids_of(gpt2, text: str) -> list[int]:
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    return load_tokenizer_for(resolve_source(str(gpt2[0]))).encode([text])[0].ids


def difference(logits: torch.Tensor, position: int, record: dict) -> float:
    return float(logits[position, record["target"]["id"]] - logits[position, record["foil"]["id"]])


def test_attribute_ablate_reports_the_ablated_model_and_its_value_without(cli, gpt2):
    """attribute --ablate L1H2: `logit` is transformers' logit difference with the head zeroed, `logit_unablated`
    without; the head's component is 0 and the components sum to the ablated value; the view says both."""
    path, hf = gpt2
    result = cli("attribute", "-m", str(path), "--target", "mary", "--foil", "john", "--by", "head", "--ablate",
                 "L1H2", "--json", CLEAN)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    ids, position = record["ids"], record["position"]
    ablated, plain = hf_logits(hf, ids, ["L1H2"]), hf_logits(hf, ids, [])
    assert record["ablated"] == ["L1H2"]
    assert abs(record["logit"] - difference(ablated, position, record)) < 1e-4
    assert abs(record["logit_unablated"] - difference(plain, position, record)) < 1e-4
    assert abs(record["logit"] - record["logit_unablated"]) > 1e-3  # the ablation moves it: the check could fail
    assert abs(record["total"] - record["logit"]) < 1e-4
    assert [c["value"] for c in record["components"] if c["name"] == "L1H2"] == [0.0]
    assert "ablating: L1H2 (zeroed)" in result.stderr
    view = cli("attribute", "-m", str(path), "--target", "mary", "--foil", "john", "--ablate", "L1H2", "--width",
               "80", CLEAN)
    said = " ".join(view.stdout.split())
    assert f"ablated L1H2 (zeroed): the model's value {record['logit']:+.4f}, " \
           f"{record['logit_unablated']:+.4f} with nothing ablated" in said


def captured(hf, ids: list[int], specs: list[str]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The ablated run of one text on transformers: each block's input (1, T, d) and c_proj's input (1, T, d)."""
    blocks, inputs, z = hf.transformer.h, [], []
    extra = [lambda hf, i=i: blocks[i].register_forward_pre_hook(
                 lambda m, args, kwargs: inputs.append(args[0].clone() if args else kwargs["hidden_states"].clone()),
                 with_kwargs=True) for i in range(LAYERS)]
    extra += [lambda hf, i=i: blocks[i].attn.c_proj.register_forward_pre_hook(
                  lambda m, args: z.append(args[0].clone())) for i in range(LAYERS)]
    hf_logits(hf, ids, specs, extra)
    return inputs, z


@pytest.mark.parametrize("specs", [["L1H2"], ["L0.mlp:mean"], ["L0.mlp:mean", "L1H2"], ["L1H2", "L0.mlp:mean"]])
def test_patch_ablate_patches_the_ablated_model_as_by_hand(cli, gpt2, specs):
    """patch --ablate: every run (clean, corrupt, patched) without the components, on transformers by hand: each
    head's output put back (c_proj's input slice, every position) and each block's input at each position, with the
    ablations' hooks on; the scores, the clean and corrupt values, and the values with nothing ablated. A
    mean-ablation runs whole passes (the fast sweep covers part of the text, and a mean reads every position: no
    position before the first difference scores 0 by causality), a zeroed head the fast sweep; with both, in either
    order, whole passes (issue 51, item 1: the last spec alone deciding failed this)."""
    path, hf = gpt2
    result = cli("patch", "-m", str(path), "--target", "mary", "--foil", "john", "--sites", "resid,heads",
                 *(option for spec in specs for option in ("--ablate", spec)), "--json", CLEAN, CORRUPT)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    clean_ids, corrupt_ids, position = record["ids_clean"], record["ids_corrupt"], record["position"]
    assert record["ablated"] == specs
    clean = difference(hf_logits(hf, clean_ids, specs), position, record)
    corrupt = difference(hf_logits(hf, corrupt_ids, specs), position, record)
    assert abs(record["clean_value"] - clean) < 1e-4 and abs(record["corrupt_value"] - corrupt) < 1e-4
    assert abs(record["clean_value_unablated"] - difference(hf_logits(hf, clean_ids, []), position, record)) < 1e-4
    assert abs(record["corrupt_value_unablated"] - difference(hf_logits(hf, corrupt_ids, []), position, record)) < 1e-4
    inputs, z = captured(hf, clean_ids, specs)
    blocks = hf.transformer.h

    def patched(make) -> float:
        return (difference(hf_logits(hf, corrupt_ids, specs, [make]), position, record) - corrupt) / (clean - corrupt)

    def put_head(layer, head):
        def hook(module, args):
            value = args[0].clone()
            value[..., head * SIZE:(head + 1) * SIZE] = z[layer][..., head * SIZE:(head + 1) * SIZE]
            return (value, *args[1:])
        return lambda hf: blocks[layer].attn.c_proj.register_forward_pre_hook(hook)

    def put_resid(layer, at):
        def hook(module, args, kwargs):
            value = (args[0] if args else kwargs["hidden_states"]).clone()
            value[:, at] = inputs[layer][:, at]
            return ((value, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": value})
        return lambda hf: blocks[layer].register_forward_pre_hook(hook, with_kwargs=True)

    # compared in the metric's units: a score is (patched - corrupt) / (clean - corrupt), which divides float32's
    # noise in the logits (about 1e-5 here, and CPU-dependent) by that gap
    gap = abs(clean - corrupt)
    heads = [[patched(put_head(layer, head)) for head in range(HEADS)] for layer in range(LAYERS)]
    assert torch.tensor(record["grids"]["heads"]).sub(torch.tensor(heads)).abs().max() * gap < 1e-4
    resid = [[patched(put_resid(layer, at)) for at in range(len(clean_ids))] for layer in range(LAYERS)]
    assert torch.tensor(record["grids"]["resid"]).sub(torch.tensor(resid)).abs().max() * gap < 1e-4
    assert max(abs(v) for row in heads for v in row) > 0.01  # scores that could differ


def test_encode_ablate_saves_the_ablated_logits_and_says_so(cli, gpt2, tmp_path):
    """encode --ablate L1H2 --save: the saved logits are transformers' with the head zeroed; the view and the JSON
    say what was ablated."""
    from safetensors.torch import load_file

    path, hf = gpt2
    saved = tmp_path / "out.safetensors"
    result = cli("encode", "-m", str(path), "--ablate", "L1H2", "--save", str(saved), "--json", CLEAN)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["ablated"] == ["L1H2"]
    tensors = load_file(saved)
    ids = tensors["input_ids"][0].tolist()
    expected, plain = hf_logits(hf, ids, ["L1H2"]), hf_logits(hf, ids, [])
    assert (tensors["logits"][0].double() - expected).abs().max() < 1e-4
    assert (expected - plain).abs().max() > 1e-3
    view = cli("encode", "-m", str(path), "--ablate", "L1H2", "--ablate", "L0.mlp:mean", CLEAN)
    assert "ablated: L1H2 (zeroed), L0.mlp (mean)" in view.stdout


def test_a_dataset_ablated_reports_the_means_with_and_without(cli, gpt2, tmp_path):
    """patch --dataset --ablate: the aggregate's clean and corrupt values, with and without, are the means of the
    pairs' own (--per-item), each pair ablated."""
    path, _ = gpt2
    lines = [{"clean": CLEAN, "corrupt": CORRUPT, "target": "mary", "foil": "john"},
             {"clean": CORRUPT, "corrupt": CLEAN, "target": "john", "foil": "mary"}]
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = cli("patch", "-m", str(path), "--dataset", str(dataset), "--sites", "heads", "--ablate", "L1H2",
                 "--per-item", "--json")
    assert result.exit_code == 0, result.stderr
    *items, aggregate = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(item["ablated"] == ["L1H2"] for item in items) and aggregate["ablated"] == ["L1H2"]
    for key in ("clean_value", "corrupt_value", "clean_value_unablated", "corrupt_value_unablated"):
        assert aggregate[key] == pytest.approx(sum(item[key] for item in items) / 2, abs=1e-9), key
    assert items[0]["clean_value"] != pytest.approx(items[0]["clean_value_unablated"])


@pytest.mark.parametrize("command", ["encode", "attribute", "patch"])
@pytest.mark.parametrize(("spec", "message"), [("L1H9", "has 4 heads per layer (H0 to H3)"),
                                               ("nothing.here", "--ablate nothing.here: the model has no site"),
                                               ("L1H2:half", "`half` is not a way to ablate")])
def test_a_bad_ablation_is_refused_before_the_model_is_built(cli, gpt2, command, spec, message):
    """One error line, exit 2, before the model is built and loaded (which says `model: ...` on stderr); the sites
    are checked on a meta-device copy (shapes only)."""
    path, _ = gpt2
    args = {"encode": [CLEAN], "attribute": [CLEAN], "patch": ["--target", "mary", CLEAN, CORRUPT]}[command]
    result = cli(command, "-m", str(path), "--ablate", spec, *args)
    assert result.exit_code == 2 and error_line(result).startswith("error: ") and message in result.stderr, \
        result.stderr
    assert "model:" not in result.stderr


def test_generate_says_what_it_steered_and_ablated(cli, gpt2, tmp_path):
    """generate's view and record say what changed the model: the vectors with their strengths and blocks, and the
    ablations as given; a plain run's record has neither key."""
    from tfcli.analysis.vectors import write_vector

    path, _ = gpt2
    vector = tmp_path / "v.safetensors"
    write_vector(vector, {1: torch.ones(WIDTH), 2: torch.ones(WIDTH)}, "gpt2")
    args = ["generate", "-m", str(path), "-n", "3", "--steer", f"{vector}:2", "--steer-layers", "2", "--ablate",
            "L1H2", "this is"]
    record = json.loads(cli(*args, "--json").stdout)
    assert record["steered"] == {"vectors": [f"{vector}:2"], "blocks": [2], "normalize": False}
    assert record["ablated"] == ["L1H2"]
    view = cli(*args, "--width", "80").stdout
    # a path longer than the width is broken across lines (pytest-xdist's temporary paths pass 80 columns)
    assert f"steered:{vector}:2atblocks2" in "".join(view.split()) and "ablated: L1H2 (zeroed)" in view
    plain = json.loads(cli("generate", "-m", str(path), "-n", "3", "--json", "this is").stdout)
    assert "steered" not in plain and "ablated" not in plain


def test_a_head_or_sublayer_of_a_block_the_model_lacks_names_its_blocks(cli, gpt2):
    path, _ = gpt2
    for spec in ("L7H0", "L3.mlp"):
        result = cli("attribute", "-m", str(path), "--ablate", spec, CLEAN)
        assert result.exit_code == 2 and f"--ablate {spec}: " in error_line(result), result.stderr
        assert f"has {LAYERS} blocks (L0 to L{LAYERS - 1})" in result.stderr
