"""Linear layers pack their weights for oneDNN by themselves once used again and again, and hold one copy of each:
the same results as the first (plain) call, the weight still reading as its exact plain values everywhere, autograd
through a packed layer, a tied LM head never packed, packing under inference mode usable outside it."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tfcli
from tfcli.model import linear
from tfcli.model.linear import PACKABLE, Linear, PackedWeight, float32_rows_pack

from conftest import TINY_DECODER

BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    torch.bfloat16 not in PACKABLE, reason="this CPU has no oneDNN bfloat16 products (AVX-512 BF16 or AMX)"))
DTYPES = [pytest.param(torch.float32, marks=pytest.mark.skipif(
    torch.float32 not in PACKABLE, reason="this PyTorch has no oneDNN")), BF16]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 0.05}  # bfloat16: a few of its rounding steps at these scales


def linears(model: nn.Module) -> dict[str, Linear]:
    return {name: module for name, module in model.named_modules() if isinstance(module, Linear)}


def plain_copy(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeated_calls_pack_and_give_the_first_calls_results(dtype):
    model = tfcli.load_model("tiny", dtype=str(dtype).removeprefix("torch."))
    ids = torch.randint(1000, 30000, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = model(ids).logits
        assert not any(type(layer.weight) is PackedWeight for layer in linears(model).values())  # one pass: plain
        again = [model(ids).logits for _ in range(3)]
    for logits in again:
        assert (logits.float() - first.float()).abs().max() <= TOLERANCE[dtype] * first.float().abs().max()
    layers = linears(model)
    assert layers["head.unembed"].weight is model.embed_tokens.weight  # tiny's LM head is tied: never packed
    assert type(model.embed_tokens.weight) is nn.Parameter
    assert all(type(layer.weight) is PackedWeight for name, layer in layers.items() if name != "head.unembed")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_weight_reads_as_its_exact_plain_values(dtype):
    model = tfcli.load_model("tiny", dtype=str(dtype).removeprefix("torch."))
    before = plain_copy(model)
    names = [name for name, _ in model.named_parameters()]
    count = sum(p.numel() for p in model.parameters())
    ids = torch.randint(1000, 30000, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids), model(ids)
    out = model.get_submodule("encoder.blocks.0.attn.out")
    assert type(out.weight) is PackedWeight and isinstance(out.weight, nn.Parameter)
    original = before["encoder.blocks.0.attn.out.weight"]
    head = original.shape[1] // model.config.num_attention_heads
    assert torch.equal(out.weight[:, head:2 * head], original[:, head:2 * head])  # one head's slice
    assert torch.equal(out.weight.to(torch.float64), original.to(torch.float64))
    assert torch.equal(out.weight.T @ original[0], original.T @ original[0])
    assert out.weight.shape == original.shape and out.weight.dtype == dtype and out.weight.device == original.device
    assert repr(out.weight) == repr(nn.Parameter(original, requires_grad=out.weight.requires_grad))
    state = model.state_dict()
    assert state.keys() == before.keys()
    assert all(type(value) is torch.Tensor and torch.equal(value, before[name]) for name, value in state.items())
    assert [name for name, _ in model.named_parameters()] == names
    assert sum(p.numel() for p in model.parameters()) == count
    assert torch.equal(copy.deepcopy(model).get_submodule("encoder.blocks.0.attn.out").weight, original)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    reloaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert torch.equal(reloaded.get_submodule("encoder.blocks.0.attn.out").weight, original)


def test_one_copy_of_each_weight():
    """Packing frees the plain weight: the module holds only the packed tensor, of the weight's size."""
    torch.manual_seed(0)
    layers = [Linear(256, 512) for _ in range(3)]
    storages = [layer.weight.untyped_storage()._weak_ref() for layer in layers]  # not a weakref to the tensor
    x = torch.randn(4, 256)
    with torch.no_grad():
        for _ in range(2):
            for layer in layers:
                layer(x)
    for layer, storage in zip(layers, storages):
        weight = layer.weight
        assert type(weight) is PackedWeight
        assert torch.UntypedStorage._expired(storage)  # the plain weight's memory is gone
        (packed,) = weight.box  # and the only tensor the weight holds is the packed one
        assert packed.layout == torch._mkldnn and packed.numel() == weight.numel()
        assert not [value for value in vars(layer).values() if isinstance(value, torch.Tensor)]
        assert [type(value) for value in vars(weight).values()] == [list, int, bool]  # box, rows, _is_param
    model = tfcli.load_model("tiny")
    plain_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad():
        model(torch.ones(1, 5, dtype=torch.long)), model(torch.ones(1, 5, dtype=torch.long))
    held = 0
    for p in model.parameters():
        assert type(p) is nn.Parameter or type(p) is PackedWeight
        held += p.box[0].numel() * p.element_size() if type(p) is PackedWeight else p.untyped_storage().nbytes()
    assert held == plain_bytes


def test_a_single_forward_and_float32_single_rows_stay_plain():
    torch.manual_seed(0)
    layer = Linear(32, 16)
    with torch.no_grad():
        for _ in range(3):
            layer(torch.randn(1, 1, 32))  # a float32 decoding step: as fast plain
        assert type(layer.weight) is nn.Parameter
        layer(torch.randn(2, 32))
        assert type(layer.weight) is nn.Parameter  # the first product that could run packed
        layer(torch.randn(2, 32))
        assert type(layer.weight) is PackedWeight
        x = torch.randn(1, 1, 32)
        expected = F.linear(x, layer.weight, layer.bias)
        assert torch.equal(layer(x), expected)  # a float32 single row (decoding) puts the plain weight back
        assert type(layer.weight) is nn.Parameter
        layer(torch.randn(2, 32))
        layer(x)  # and breaks a run of products that could run packed
        layer(torch.randn(2, 32))
        assert type(layer.weight) is nn.Parameter
    # so does a product that wants a gradient: a forward-backward analysis repeated (attribution patching's clean
    # pass, then its corrupt pass with autograd) would otherwise pack and unpack every layer on every round
    with torch.enable_grad():
        layer(torch.randn(2, 32, requires_grad=True))
    with torch.no_grad():
        layer(torch.randn(2, 32))
        assert type(layer.weight) is nn.Parameter
        layer(torch.randn(2, 32))
        assert type(layer.weight) is PackedWeight
    plain = Linear(32, 16)
    plain.packable = False
    with torch.no_grad():
        for _ in range(3):
            plain(torch.randn(4, 32))
    assert type(plain.weight) is nn.Parameter


def test_which_cpus_pack_float32_single_rows():
    """Where MKL takes its generic path (AVX-512, not Intel: the module note of model/linear.py)."""
    assert float32_rows_pack("processor\t: 0\nvendor_id\t: AuthenticAMD\n", "AVX512")
    assert not float32_rows_pack("vendor_id\t: GenuineIntel\n", "AVX512")
    assert not float32_rows_pack("vendor_id\t: AuthenticAMD\n", "AVX2")
    assert not float32_rows_pack("", "AVX512")  # no vendor named: the rule measured on Intel and AVX2 CPUs


@pytest.mark.skipif(torch.float32 not in PACKABLE, reason="this PyTorch has no oneDNN")
@pytest.mark.parametrize("rows_pack", [False, True])
def test_float32_single_rows_pack_from_a_million_weights_where_faster(monkeypatch, rows_pack):
    """Where the rule holds, a layer of 2**20 weights or more packs float32 single rows (decoding steps), with the
    plain product's results; a smaller one stays plain; elsewhere both stay plain."""
    monkeypatch.setattr(linear, "FLOAT32_ROWS_PACK", rows_pack)
    torch.manual_seed(0)
    big, small = Linear(1024, 1024), Linear(1024, 1023)
    for layer in (big, small):
        x = torch.randn(1, 1, 1024)
        with torch.no_grad():
            expected = F.linear(x, layer.weight, layer.bias)
            for _ in range(3):
                assert torch.allclose(layer(x), expected, atol=1e-5)
    assert type(big.weight) is (PackedWeight if rows_pack else nn.Parameter)
    assert type(small.weight) is nn.Parameter


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_grad", [False, True])
def test_backward_through_a_packed_linear(dtype, weight_grad):
    torch.manual_seed(0)
    layer = Linear(48, 24).to(dtype).requires_grad_(weight_grad)
    reference = nn.Linear(48, 24).to(dtype)
    reference.load_state_dict(layer.state_dict())
    with torch.no_grad():
        layer(torch.randn(3, 48, dtype=dtype)), layer(torch.randn(3, 48, dtype=dtype))
    assert type(layer.weight) is PackedWeight
    x = torch.randn(2, 5, 48, dtype=dtype)
    upstream = torch.randn(2, 5, 24, dtype=dtype)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    (layer(ours) * upstream).sum().backward()
    (reference(theirs) * upstream).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)
    assert type(layer.weight) is nn.Parameter  # unpacked for autograd, for good: still one copy
    if weight_grad:
        assert torch.equal(layer.weight.grad, reference.weight.grad)
    # an analysis reading the packed weight directly, with autograd, gets the plain weight's gradients too
    with torch.no_grad():
        layer(torch.randn(3, 48, dtype=dtype)), layer(torch.randn(3, 48, dtype=dtype))
    assert type(layer.weight) is PackedWeight
    ours = x.clone().requires_grad_()
    (F.linear(ours, layer.weight, layer.bias) * upstream).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


def test_gradients_wrt_activations_through_a_packed_model():
    model = tfcli.load_model("tiny").requires_grad_(False)
    ids = torch.randint(1000, 30000, (1, 6), generator=torch.Generator().manual_seed(2))
    embeddings = model.embed_tokens(ids)

    def gradient() -> torch.Tensor:
        x = embeddings.clone().requires_grad_()
        hidden = model.encoder(x)
        hidden[0, -1].sum().backward()
        return x.grad

    expected = gradient()
    with torch.no_grad():
        model(ids), model(ids)
    assert type(model.get_submodule("encoder.blocks.0.mlp.fc1").weight) is PackedWeight
    assert torch.allclose(gradient(), expected, atol=1e-6)


def test_writes_to_a_packed_weight_are_seen():
    torch.manual_seed(0)
    layer = Linear(48, 24)
    x = torch.randn(3, 5, 48)
    with torch.no_grad():
        layer(x), layer(x)
        assert type(layer.weight) is PackedWeight
        original = layer.weight.to(torch.float64).float()
        layer.weight.mul_(2)
        assert type(layer.weight) is PackedWeight and torch.equal(layer.weight, 2 * original)
        assert torch.allclose(layer(x), F.linear(x, 2 * original, layer.bias), atol=1e-5)
        layer.weight.data.copy_(original)  # through an alias
        assert torch.allclose(layer(x), F.linear(x, original, layer.bias), atol=1e-5)
    layer.load_state_dict({"weight": 3 * original, "bias": torch.zeros(24)})
    with torch.no_grad():
        assert torch.allclose(layer(x), F.linear(x, 3 * original), atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_generation_packs_in_bfloat16_and_stays_plain_in_float32(tiny_decoder, dtype):
    """bfloat16 single rows run faster packed, float32 ones do not (README, Benchmarks): a decoding model packs its
    weights in bfloat16 and keeps them plain in float32. Generation gives the same tokens every time."""
    model = tfcli.load_model(str(tiny_decoder), dtype=str(dtype).removeprefix("torch."))
    prompt = torch.tensor([[101, 2023, 2003, 1037]])
    first = model.generate(prompt, max_new_tokens=5)
    for _ in range(2):
        assert torch.equal(model.generate(prompt, max_new_tokens=5), first)
    layers = linears(model)
    assert type(layers["head.unembed"].weight) is nn.Parameter  # tied to the embeddings
    assert layers["head.unembed"].weight is model.embed_tokens.weight
    others = [layer for name, layer in layers.items() if name != "head.unembed"]
    assert all(type(layer.weight) is (PackedWeight if dtype == torch.bfloat16 else nn.Parameter) for layer in others)


def test_packed_under_inference_mode_works_outside_it_and_moves(tiny_decoder):
    model = tfcli.load_model(str(tiny_decoder))
    prompt = torch.tensor([[101, 2023, 2003, 1037]])
    first = model.generate(prompt, max_new_tokens=5)
    with torch.inference_mode():
        logits = model(prompt).logits
        assert torch.allclose(model(prompt).logits, logits, atol=1e-5)
    packed = [layer for name, layer in linears(model).items() if name != "head.unembed"]
    assert packed and all(type(layer.weight) is PackedWeight for layer in packed)
    assert not any(layer.weight.is_inference() or layer.weight.box[0].is_inference() for layer in packed)
    with torch.no_grad():
        assert torch.allclose(model(prompt).logits, logits, atol=1e-5)
    with_grad = model(prompt).logits  # parameters not requiring grad: no autograd wanted, still packed
    assert not with_grad.requires_grad and torch.allclose(with_grad, logits, atol=1e-5)
    assert type(packed[0].weight) is PackedWeight
    x = torch.randn(1, 4, model.config.hidden_size, requires_grad=True)
    packed[0](x).sum().backward()  # grad-enabled code that wants a gradient
    assert x.grad is not None
    before = plain_copy(model)
    model.to(torch.float64)
    assert all(type(p) is nn.Parameter and p.dtype == torch.float64 for p in model.parameters())
    assert all(torch.equal(value, before[name].double()) for name, value in model.state_dict().items())
    with torch.no_grad():
        assert torch.allclose(model(prompt).logits, logits.double(), atol=1e-5)
    model.to(torch.float32).to("cpu")
    assert torch.equal(model.generate(prompt, max_new_tokens=5), first)


def test_an_lm_head_stays_plain_for_a_pass_and_its_lens_and_a_tied_one_packs_a_copy(yaml_model):
    """An LM head packs from its third product (a forward pass and the logit lens after it make two); a head tied
    to the token embeddings keeps its plain weight, which the embedding lookup reads, and packs a copy beside it for
    single-row (decoding) products only."""
    ids = torch.tensor([[101, 2023, 2003]])
    untied = yaml_model(TINY_DECODER.replace("tie_word_embeddings: true", "tie_word_embeddings: false"))
    head = untied.get_submodule("head.unembed")
    with torch.no_grad():
        logits = untied(ids).logits
        untied.unembed(torch.ones(2, 32))  # the logit lens: the head's second product
        assert type(head.weight) is nn.Parameter  # still plain
        x = torch.randn(2, 32)
        assert torch.allclose(head(x), F.linear(x, head.weight), atol=1e-5)  # a third: packed
        assert type(head.weight) is PackedWeight or torch.float32 not in PACKABLE
        assert torch.allclose(untied(ids).logits, logits, atol=1e-5)

    model = yaml_model(TINY_DECODER)
    tied = model.get_submodule("head.unembed")
    with torch.no_grad():
        logits = model(ids).logits
        for _ in range(3):
            again = model(ids).logits
    assert tied.tied and type(tied.weight) is nn.Parameter and tied.weight is model.embed_tokens.weight
    assert tied._packed is None  # products of several rows (passes, a lens) never make the second copy
    assert torch.allclose(again, logits, atol=1e-5)
    if torch.bfloat16 not in PACKABLE:
        return  # single rows pack only in bfloat16, where this CPU has native bfloat16 products
    model = model.to(torch.bfloat16)
    tied = model.get_submodule("head.unembed")
    with torch.no_grad():
        steps = [model(ids[:, :1]).logits for _ in range(3)]  # decoding steps: single rows
        assert tied._packed is not None and type(tied.weight) is nn.Parameter  # the copy beside the plain weight
        assert torch.allclose(steps[-1].float(), steps[0].float(), atol=1e-2)
        model.embed_tokens.weight.mul_(2)  # a changed weight: its stale copy is not used
        out = model(ids[:, :1])
        assert torch.allclose(out.logits.float(), F.linear(out.last_hidden_state, tied.weight).float(), atol=1e-2)


def test_a_weight_held_by_a_live_autograd_graph_is_not_swapped():
    """Packing swaps the Parameter's contents; while a graph built with grad still holds the plain weight, the layer
    waits (its backward pass must still work and fill the same Parameter's .grad)."""
    torch.manual_seed(0)
    layer = Linear(16, 8)
    x = torch.randn(3, 16)
    out = layer(x)  # the weight requires grad: a graph holding it
    with torch.no_grad():
        for _ in range(3):
            layer(x)
    assert type(layer.weight) is nn.Parameter
    out.sum().backward()
    assert torch.equal(layer.weight.grad, torch.ones(3, 8).T @ x)
    del out
    with torch.no_grad():
        layer(x)
    assert type(layer.weight) is PackedWeight
    assert torch.equal(layer.weight.grad, torch.ones(3, 8).T @ x)  # its gradient stays with it


def test_encode_lens_leaves_an_untied_head_plain_and_it_packs_when_used_again(yaml_model):
    """encode's logit lens runs its products `kept_plain`: however many chunks it makes, an untied head stays plain
    (a single encode would hold the plain and the packed head at once for a burst packing does not repay); the
    products outside count as before, so a head used again and again still packs on its third."""
    from tfcli.commands.encode.core import lens_rows

    model = yaml_model(TINY_DECODER.replace("tie_word_embeddings: true", "tie_word_embeddings: false"))
    head = model.get_submodule("head.unembed")
    ids = torch.tensor([[101, 2023, 2003, 1037]])
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, ["blocks.*.resid_post", "blocks.0.resid_pre"])
    hidden = [cache["blocks.0.resid_pre"], *(cache[f"blocks.{i}.resid_post"] for i in range(len(cache) - 1))]
    tokenizer = tfcli.load_tokenizer("bert-base")
    for _ in range(3):  # three lenses, a product of the head each: none of them packs it
        lens_rows(model, hidden, 0, ids.shape[1], None, 3, tokenizer)
    assert type(head.weight) is nn.Parameter and head.packable
    with torch.no_grad():
        for _ in range(3):
            model(ids)
    assert type(head.weight) is PackedWeight or torch.float32 not in PACKABLE


def test_bfloat16_products_of_several_rows_run_in_float32_without_bfloat16_instructions(tiny_decoder, monkeypatch):
    """On a CPU without bfloat16 instructions (emulated here: bfloat16 not packable, the cast on), products of 4 rows
    or more through a layer-sized weight run in float32 and round back: the model's logits are PyTorch's own
    bfloat16 products' exactly (the same float32 accumulation, rounded once); single rows stay bfloat16."""
    monkeypatch.setattr(linear, "PACKABLE", PACKABLE - {torch.bfloat16})
    model = tfcli.load_model(str(tiny_decoder), dtype="bfloat16")
    prompt = torch.tensor([[101, 2023, 2003, 1037, 2742, 1012]])
    monkeypatch.setattr(linear, "BFLOAT16_CAST", False)
    with torch.no_grad():
        expected = model(prompt).logits
    cast = []
    pays = linear._cast_pays
    monkeypatch.setattr(linear, "_cast_pays", lambda x, w, b: cast.append(pays(x, w, b)) or cast[-1])
    monkeypatch.setattr(linear, "BFLOAT16_CAST", True)
    with torch.no_grad():
        logits = model(prompt).logits
        assert torch.equal(logits, expected)
        assert any(cast)
        cast.clear()
        model(prompt[:, :1])  # a single row
    assert cast and not any(cast)
