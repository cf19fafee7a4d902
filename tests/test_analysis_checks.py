"""Four analysis results checked against quantities computed by hand on transformers' own GPT-2 modules (issue 39:
each guards against a bug that was planted in the code on purpose and that the rest of the suite let through).

- test_attribute_by_neuron_keeps_the_largest_neurons_by_magnitude: `attribute --by neuron --top k` must keep the k
  neurons with the largest |direct contribution|, not the k most positive ones. Every neuron's contribution is
  computed here (its activation after the GELU at the position, times its row of c_proj's weight, centred, through
  the final LayerNorm with its scale frozen, dotted with W_U[target] - W_U[foil]); the kept names (L{l}N{n}) and
  values must be the top k by magnitude, in a case where that set holds negative neurons and differs from the top k
  by signed value (asserted, so the check cannot pass vacuously).
- test_attribution_patching_of_the_pattern_equals_autograd: `patch --method attribution` on the `pattern` site
  must sum (clean - corrupt pattern) x d metric / d pattern over each head's queries and keys (a sum over the wrong
  axes gives zeros or other heads' numbers, which a finiteness check lets through). The gradient is taken with
  torch.autograd through transformers' eager attention weights on the corrupt run.
- test_zero_and_replace_on_a_pattern_select_query_rows: `sites.zero` / `sites.replace` on `attn.pattern` with
  `positions=[p]` must change query row p of the attention weights (not key column p): the logits equal those of
  transformers with that row of its eager attention weights zeroed, or replaced by another run's row.
- test_mean_ablation_averages_each_texts_own_positions: `sites.mean` must put in each text's own mean over its
  positions, not a mean over the batch: on blocks.0.resid_post, for a batch of two different texts, the logits
  equal transformers' with each text's own mean put in by a hook on its first block.

One tiny GPT-2 checkpoint (2 layers, 32 wide, 4 heads, 64 neurons per MLP, vocabulary 96, biases and norm weights
random) saved by transformers inside the tests, built once for the file.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import tfcli
from tfcli.commands.attribute import core as attribute
from tfcli.commands.patch import core as patch
from tfcli.model import sites

CLEAN = [5, 17, 42, 8, 77, 9, 60, 11]
CORRUPT = [5, 17, 43, 8, 78, 9, 60, 11]  # two positions differ
OTHER = [9, 31, 12, 50, 44, 7, 3, 21]  # a second text of the same length, different from the first everywhere
TARGET, FOIL = 40, 13
LAYERS, HEADS, NEURONS = 2, 4, 64


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """(path, transformers model, tfcli model, tokenizer): a tiny GPT-2 saved by transformers (eager attention,
    eval mode, biases and norm weights random, weights large enough that components and patches differ)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("analysis-gpt2")
    config = GPT2Config(vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, n_embd=32, n_layer=LAYERS,
                        n_head=HEADS, n_inner=NEURONS, n_positions=64, initializer_range=0.3)
    hf = save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    return path, hf, tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))


def encoding_of(tokenizer, ids):
    encoding = tokenizer.encode(["x"])[0]
    encoding.ids = list(ids)  # the model reads these ids: no tokenizer involved
    return encoding


def metric(logits, position=-1):
    return logits[0, position, TARGET] - logits[0, position, FOIL]


def with_attention(monkeypatch, hf, edit):
    """Route GPT-2's eager attention through `edit(layer, weights) -> weights or None`: when it returns weights,
    the attention's output is recomputed from them exactly as transformers' `eager_attention_forward` computes it
    (softmax weights @ values, heads moved back next to the tokens; dropout is the identity in eval mode), so the
    tensor it returns is the one the rest of the model reads. Returns the list of layers the function ran for."""
    modeling = importlib.import_module(type(hf).__module__)
    original = modeling.eager_attention_forward
    calls = []

    def forward(module, query, key, value, attention_mask, **kwargs):
        output, weights = original(module, query, key, value, attention_mask, **kwargs)
        calls.append(module.layer_idx)
        new = edit(module.layer_idx, weights)
        if new is None:
            return output, weights
        return torch.matmul(new, value).transpose(1, 2), new

    # GPT2Attention looks the function up in its module's globals at every call (eager implementation)
    monkeypatch.setattr(modeling, "eager_attention_forward", forward)
    return calls


# ---------------------------------------------------------------- 15: attribute --by neuron --top k


def neurons_by_hand(hf, ids, position, target, foil) -> dict[str, float]:
    """Every neuron's direct contribution to logit[target] - logit[foil] at `position`, on transformers' modules in
    float64: its activation after the GELU (c_proj's input) times its row of c_proj's weight (a Conv1D: (in, out)),
    centred and divided by the final LayerNorm's scale there (frozen: the real residual's), times its weight,
    dotted with W_U[target] - W_U[foil]."""
    seen, handles = {}, []
    for i, block in enumerate(hf.transformer.h):
        handles.append(block.mlp.c_proj.register_forward_pre_hook(
            lambda m, args, i=i: seen.__setitem__(f"post{i}", args[0][0, position].detach().double())))
    handles.append(hf.transformer.ln_f.register_forward_pre_hook(
        lambda m, args: seen.__setitem__("final", args[0][0, position].detach().double())))
    with torch.no_grad():
        hf(input_ids=torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    norm = hf.transformer.ln_f
    scale = torch.sqrt(seen["final"].var(correction=0) + norm.eps)
    w_u = hf.lm_head.weight.detach().double()
    raw = w_u[target] - w_u[foil]
    gain = norm.weight.detach().double()
    values = {}
    for i, block in enumerate(hf.transformer.h):
        rows = block.mlp.c_proj.weight.detach().double()  # (F, d): neuron n writes row n
        rows = rows - rows.mean(-1, keepdim=True)  # the LayerNorm centres what each neuron writes
        read = rows / scale * gain @ raw  # (F,): what one unit of each neuron's activation adds to the logit diff
        for n, value in enumerate((seen[f"post{i}"] * read).tolist()):
            values[f"L{i}N{n}"] = value
    return values


def test_attribute_by_neuron_keeps_the_largest_neurons_by_magnitude(gpt2):
    path, hf, model, tokenizer = gpt2
    top, position = 6, len(CLEAN) - 1
    expected = neurons_by_hand(hf, CLEAN, position, TARGET, FOIL)
    assert len(expected) == LAYERS * NEURONS
    by_magnitude = sorted(expected, key=lambda name: -abs(expected[name]))[:top]
    by_value = sorted(expected, key=lambda name: -expected[name])[:top]
    # the precondition: the largest by magnitude include negative neurons, so keeping the most positive differs
    assert any(expected[name] < 0 for name in by_magnitude), "no negative neuron among the top: the check is vacuous"
    assert set(by_magnitude) != set(by_value), "the top by magnitude and by value agree: the check is vacuous"
    # well separated from the next neuron, so that float rounding cannot swap the last one kept
    ranked = sorted((abs(v) for v in expected.values()), reverse=True)
    assert ranked[top - 1] - ranked[top] > 1e-4

    (result,) = attribute.run(model, tokenizer, [[encoding_of(tokenizer, CLEAN)]],
                              attribute.AttributeOptions(target=f"#{TARGET}", foil=f"#{FOIL}", position=position,
                                                         by="neuron", top=top))
    kept = {c.name: c.value for c in result.components if c.neuron is not None}
    assert sorted(kept) == sorted(by_magnitude), (
        f"neurons kept {sorted(kept)}; the {top} largest |contribution| by hand: "
        + ", ".join(f"{n} {expected[n]:+.4f}" for n in by_magnitude))
    for c in result.components:
        if c.neuron is not None:
            assert c.name == f"L{c.layer}N{c.neuron}"
            assert c.value == pytest.approx(expected[c.name], abs=1e-5), c.name


# ---------------------------------------------------------------- 16: patch --method attribution, pattern


def test_attribution_patching_of_the_pattern_equals_autograd(gpt2, monkeypatch):
    """Each head's estimate: (clean pattern - corrupt pattern) . d metric / d pattern, the gradient on the corrupt
    run, summed over that head's queries and keys, divided by clean metric - corrupt metric.

    How the gradient is taken: transformers' eager attention computes the softmax weights inside
    `eager_attention_forward` and returns them with its output, but whether the returned tensor is the one the
    output was computed from depends on its `nn.functional.dropout` call (GPT-2's eager path does not go through
    its `attn_dropout` module, so a hook there would never fire). So the function is wrapped (with_attention): it
    keeps transformers' weights and recomputes the output from exactly that tensor (the logits are checked equal to
    an unwrapped pass's, so the pass is unchanged). The weights are then a node of the graph that everything
    downstream reads, nothing detached (a layer-0 weight also reaches the metric through layer 1's pattern), and
    torch.autograd.grad(metric, weights) is the full d metric / d pattern."""
    path, hf, model, tokenizer = gpt2
    with torch.no_grad():
        clean_out = hf(input_ids=torch.tensor([CLEAN]), output_attentions=True)
    clean_patterns = [w.detach().double() for w in clean_out.attentions]
    kept = {}

    def keep(layer, weights):
        kept[layer] = weights
        return weights  # the output is recomputed from this very tensor

    calls = with_attention(monkeypatch, hf, keep)
    corrupt_out = hf(input_ids=torch.tensor([CORRUPT]), output_attentions=True)
    monkeypatch.undo()
    assert calls == list(range(LAYERS)) and all(kept[i].requires_grad for i in range(LAYERS))
    with torch.no_grad():  # the recomputed output is transformers' own: the same logits as an unwrapped pass
        plain = hf(input_ids=torch.tensor([CORRUPT])).logits
    assert (corrupt_out.logits - plain).abs().max() < 1e-5
    grads = torch.autograd.grad(metric(corrupt_out.logits), [kept[i] for i in range(LAYERS)])
    hf.zero_grad(set_to_none=True)
    clean_value, corrupt_value = float(metric(clean_out.logits)), float(metric(corrupt_out.logits.detach()))
    scale = clean_value - corrupt_value
    assert abs(scale) > 0.1

    options = patch.PatchOptions(target=f"#{TARGET}", foil=f"#{FOIL}", sites=("pattern",), method="attribution")
    result = patch.run_ids(model, tokenizer, CLEAN, CORRUPT, options)
    assert result.clean_value == pytest.approx(clean_value, abs=1e-4)
    assert result.corrupt_value == pytest.approx(corrupt_value, abs=1e-4)
    grid = result.grids["pattern"]
    assert len(grid) == LAYERS and all(len(row) == HEADS for row in grid)
    checked = []
    for layer in range(LAYERS):
        delta = (clean_patterns[layer] - kept[layer].detach().double()) * grads[layer].double()  # (1, H, T, S)
        for head in range(HEADS):
            expected = float(delta[0, head].sum()) / scale  # over the head's queries and keys
            assert grid[layer][head] == pytest.approx(expected, abs=1e-4), (
                f"pattern estimate of L{layer}H{head}: {grid[layer][head]:+.6f}, by autograd {expected:+.6f}")
            checked.append(expected)
    assert max(abs(v) for v in checked) > 0.05  # not all near zero: the check can fail
    assert max(checked) - min(checked) > 0.05  # the heads differ: numbers put on the wrong head show


# ---------------------------------------------------------------- 17: zero / replace on a pattern's query row


@pytest.mark.parametrize("edit,heads", [("zero", None), ("zero", [2]), ("replace", None), ("replace", [1])],
                         ids=["zero", "zero-head2", "replace", "replace-head1"])
def test_zero_and_replace_on_a_pattern_select_query_rows(gpt2, monkeypatch, assert_close, edit, heads):
    """`positions=[p]` on blocks.0.attn.pattern: query row p of the weights (of the heads given) zeroed, or replaced
    by another run's row (transformers' own weights for OTHER), against transformers' logits with that row changed
    inside its eager attention; every logit of the text within 1e-4."""
    path, hf, model, tokenizer = gpt2
    layer, row = 0, 3  # a row with queries after it and keys before it: its column differs from it
    name = f"blocks.{layer}.attn.pattern"
    chosen = slice(None) if heads is None else heads
    ids = torch.tensor([CLEAN])
    with torch.no_grad():
        plain = hf(input_ids=ids).logits
        source = hf(input_ids=torch.tensor([OTHER]), output_attentions=True).attentions[layer].detach()

    def change(depth, weights):
        if depth != layer:
            return None
        weights = weights.clone()
        weights[:, chosen, row] = 0 if edit == "zero" else source[:, chosen, row]
        return weights

    calls = with_attention(monkeypatch, hf, change)
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    monkeypatch.undo()
    assert calls == list(range(LAYERS))
    hook = sites.zero(name, positions=[row], heads=heads) if edit == "zero" else \
        sites.replace(name, source, positions=[row], heads=heads)
    with torch.no_grad():
        ours = model.run_with_hooks(ids, {name: hook})
    assert (theirs - plain).abs().max() > 1e-2, "changing the row changed nothing: the check could not fail"
    assert_close(f"logits with {name} query row {row} {edit} (heads {heads})", ours, theirs)


# ---------------------------------------------------------------- 18: sites.mean, each text's own positions


@pytest.mark.parametrize("positions", [None, [1, 5]], ids=["every-position", "positions-1-5"])
def test_mean_ablation_averages_each_texts_own_positions(gpt2, assert_close, positions):
    """blocks.0.resid_post mean-ablated (at every position, or at two) in a batch of two different texts of the
    same length (no padding): against transformers with each text's own mean over its positions put in by a hook
    on its first block's output."""
    path, hf, model, tokenizer = gpt2
    ids = torch.tensor([CLEAN, OTHER])
    where = slice(None) if positions is None else positions

    def put_mean(module, args, output):
        hidden = (output[0] if isinstance(output, tuple) else output).clone()
        hidden[:, where] = hidden.mean(1, keepdim=True).expand_as(hidden)[:, where]  # each row: its own mean
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    with torch.no_grad():
        plain = hf(input_ids=ids).logits
        handle = hf.transformer.h[0].register_forward_hook(put_mean)
        try:
            theirs = hf(input_ids=ids).logits
        finally:
            handle.remove()
        name = "blocks.0.resid_post"
        ours = model.run_with_hooks(ids, {name: sites.mean(name, positions=positions)})
    assert (theirs - plain).abs().max() > 1e-2, "the mean-ablation changed nothing: the check could not fail"
    for text in range(2):
        assert_close(f"logits of text {text} with {name} mean-ablated at {positions}", ours[text], theirs[text])
