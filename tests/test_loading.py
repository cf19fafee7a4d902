"""Loading paths: every checkpoint layout (one safetensors file, safetensors shards, a .bin file, .bin shards),
stored in float32, float16 or bfloat16, with a tied head (GPT-2) or an untied one (Llama), read into each dtype.

Each checkpoint is written from a transformers model whose weights were rounded to the stored dtype; that model,
back in float32, holds exactly the stored values and is the reference."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import tfcli

IDS = torch.tensor([[5, 17, 42, 8, 77, 3, 60]])
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tiny_models():
    """name -> a tiny random transformers LM: GPT-2 ties its head to the embeddings, this Llama does not."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    return {
        "gpt2 (tied head)": GPT2LMHeadModel(GPT2Config(**sizes, n_embd=32, n_layer=2, n_head=4, n_positions=64)),
        "llama (untied head)": LlamaForCausalLM(LlamaConfig(
            **sizes, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=False)),
    }


def save(model, directory, layout: str) -> None:
    """Write `model` in `layout`: save_pretrained for safetensors (shards: at most a third of the weights
    each), torch.save of the state dict (tied copies included, as older files have them) for .bin."""
    if layout.startswith("safetensors"):
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        model.save_pretrained(directory, max_shard_size=size // 3 if layout.endswith("shards") else "5GB")
        assert (len(list(directory.glob("*.safetensors"))) > 1) == layout.endswith("shards")
        return
    model.config.save_pretrained(directory)
    state = model.state_dict()
    if layout == "bin":
        torch.save(state, directory / "pytorch_model.bin")
        return
    names = list(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, part in shards.items():
        torch.save({name: state[name] for name in part}, directory / file)
    weight_map = {name: file for file, part in shards.items() for name in part}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


# every layout and every stored dtype, each with both heads (the full product adds time, not paths)
CASES = [(name, layout, stored) for name in ("gpt2 (tied head)", "llama (untied head)") for layout, stored in (
    ("safetensors", "float32"), ("safetensors", "float16"), ("safetensors", "bfloat16"),
    ("safetensors shards", "bfloat16"), ("bin", "float16"), ("bin shards", "float32"))]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(model name, layout, stored dtype) -> (checkpoint directory, reference transformers model in float32)."""
    found = {}
    for name, model in tiny_models().items():
        for stored, dtype in DTYPES.items():
            rounded = copy.deepcopy(model).to(dtype)
            reference = copy.deepcopy(rounded).float().eval()
            for case_name, layout, case_stored in CASES:
                if (case_name, case_stored) == (name, stored):
                    directory = tmp_path_factory.mktemp("checkpoint")
                    save(rounded, directory, layout)
                    found[name, layout, stored] = directory, reference
    return found


@pytest.mark.parametrize("name, layout, stored", CASES)
def test_every_layout_and_stored_dtype_loads_into_every_dtype(checkpoints, assert_close, name, layout, stored):
    directory, reference = checkpoints[name, layout, stored]
    with torch.no_grad():
        expected = reference(IDS).logits
    exact = tfcli.load_model(str(directory))  # float32: the stored values exactly
    with torch.no_grad():
        assert_close("logits", exact(IDS).logits, expected)
    for dtype in (torch.float16, torch.bfloat16):
        model = tfcli.load_model(str(directory), dtype=str(dtype).removeprefix("torch."))
        weights, exact_weights = model.state_dict(), exact.state_dict()
        for key, value in weights.items():  # each stored weight rounded once, straight into the dtype
            assert value.dtype == dtype and torch.equal(value, exact_weights[key].to(dtype)), key
        with torch.no_grad():
            logits = model(IDS).logits
        assert logits.dtype == dtype and torch.isfinite(logits).all()
        assert_close("logits", logits.float(), expected, tolerance=0.05 * float(expected.abs().max()))


def test_tied_head_is_one_tensor_and_untied_head_is_its_own(checkpoints):
    tied = tfcli.load_model(str(checkpoints["gpt2 (tied head)", "bin", "float16"][0]), dtype="bfloat16")
    assert tied.head.unembed.weight is tied.embed_tokens.weight
    untied = tfcli.load_model(str(checkpoints["llama (untied head)", "safetensors shards", "bfloat16"][0]))
    assert untied.head.unembed.weight.data_ptr() != untied.embed_tokens.weight.data_ptr()
    assert not torch.equal(untied.head.unembed.weight, untied.embed_tokens.weight)


def test_ids_beyond_the_tokenizer_show_as_their_number(cli, tiny_config):
    """A model whose vocabulary is larger than its tokenizer's (padded, as many checkpoints are): the logit
    lens shows an id the tokenizer does not have as <id>."""
    padded = tiny_config.parent / "padded.yaml"
    padded.write_text(tiny_config.read_text() + "vocab_size: 300000\n")  # the bundled tokenizer has 30522
    result = cli("encode", "--model", str(padded), "--json", "--top-k", "3", "time flies")
    assert result.exit_code == 0, result.stderr
    tops = [top for row in json.loads(result.stdout)["lens"] for position in row["top"] for top in position]
    beyond = [top for top in tops if top["id"] >= 30522]
    assert beyond and all(top["token"] == f"<{top['id']}>" for top in beyond)
    assert all(top["token"] != f"<{top['id']}>" for top in tops if top["id"] < 30522)
    table = cli("encode", "--model", str(padded), "time flies")
    assert table.exit_code == 0, table.stderr


def test_the_model_line_names_the_checkpoint(cli, minilm_dir, tmp_path):
    """stderr's first line names the model as its config.json does (`_name_or_path`, which the real MiniLM's has),
    or by its model_type when config.json has no name (transformers 5 writes none)."""
    from pathlib import Path

    named = cli("encode", "--model", str(minilm_dir), "hi")
    assert named.stderr.startswith("model: nreimers/MiniLM-L6-H384-uncased (encoder); weights: loaded from "), \
        named.stderr
    for file in Path(minilm_dir).iterdir():
        (tmp_path / file.name).symlink_to(file)
    (tmp_path / "config.json").unlink()
    config = json.loads((Path(minilm_dir) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "_name_or_path"}))
    unnamed = cli("encode", "--model", str(tmp_path), "hi")
    assert unnamed.stderr.startswith("model: bert (encoder); weights: loaded from "), unnamed.stderr
