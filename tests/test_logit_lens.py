"""The logit lens at every layer, against a hand computation with transformers' own modules: a block's output
through the final norm (when the model has one) and the head (else the token embeddings), softmaxed.
Checkpoints with non-trivial norm weights and biases, so that skipping or misplacing a norm shows."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import captured_pass

TEXT = "time flies like an arrow"
TOP_K = 3


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def assert_lens_matches(lens: list[dict], expected_logits: list[torch.Tensor], top_k: int = TOP_K) -> None:
    """lens: the JSON `lens` rows, one per layer; expected_logits: per layer, (T, V) by hand."""
    assert [row["layer"] for row in lens] == list(range(len(expected_logits)))
    for row, logits in zip(lens, expected_logits):
        probs, ids = logits.softmax(-1).topk(top_k, dim=-1)
        assert [[t["id"] for t in top] for top in row["top"]] == ids.tolist(), f"layer {row['layer']}"
        got = torch.tensor([[t["prob"] for t in top] for top in row["top"]], dtype=torch.float64)
        assert torch.allclose(got, probs.double(), atol=2e-6), f"layer {row['layer']}"


# a text shorter than --top-k still shows --top-k tokens per position
@pytest.mark.parametrize("text, top_k", [(TEXT, TOP_K), ("hi", 7)])
def test_lens_through_the_final_layernorm_at_every_layer(cli, peaked_gpt2, text, top_k):
    path, hf = peaked_gpt2
    (record,) = records(cli("encode", text, "--model", str(path), "--json", "--top-k", str(top_k)))
    assert text == TEXT or len(record["ids"]) < top_k  # the short text is shorter than top_k
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([record["ids"]]), output_hidden_states=True)
        # transformers' hidden_states: the embeddings, each block's output, the last one after ln_f
        blocks = out.hidden_states[1:-1] + (None,)
        expected = [hf.lm_head(hf.transformer.ln_f(h))[0] if h is not None else out.logits[0] for h in blocks]
    assert len(expected) == hf.config.n_layer
    assert_lens_matches(record["lens"], expected, top_k)
    # the final norm matters here: without it, the first layer's top tokens would be others
    with torch.no_grad():
        unnormed = hf.lm_head(out.hidden_states[1])[0].topk(top_k, dim=-1).indices
    assert [[t["id"] for t in top] for top in record["lens"][0]["top"]] != unnormed.tolist()


@pytest.mark.parametrize("class_name", ["BertForMaskedLM", "BertModel"])
def test_lens_through_the_mlm_head_or_the_embeddings(cli, tmp_path, save_hf_model, class_name):
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64, initializer_range=0.3)
    hf = save_hf_model(getattr(transformers, class_name), config, tmp_path)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "LayerNorm" in name:  # the head's transform norm too
                param.add_(torch.randn_like(param) * 0.5)
    hf.save_pretrained(tmp_path)
    (record,) = records(cli("encode", TEXT, "--model", str(tmp_path), "--json", "--top-k", str(TOP_K)))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([record["ids"]]), output_hidden_states=True)
        if class_name == "BertForMaskedLM":  # the MLM head: dense, GELU, LayerNorm, decoder
            expected = [hf.cls(h)[0] for h in out.hidden_states[1:]]
            assert torch.equal(expected[-1], out.logits[0])
        else:  # no head: the tied token embeddings unembed
            expected = [h[0] @ hf.embeddings.word_embeddings.weight.T for h in out.hidden_states[1:]]
    assert_lens_matches(record["lens"], expected)


def test_generate_lens_and_probabilities_at_every_step(cli, peaked_gpt2):
    path, hf = peaked_gpt2
    (record,) = records(cli("generate", TEXT, "--model", str(path), "-n", "3", "--lens", "--json"))
    assert len(record["steps"]) == 3
    ids = record["prompt_ids"]
    for step in record["steps"]:
        with torch.no_grad():
            out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
            lens_logits = [hf.lm_head(h[0, -1] if layer == len(out.hidden_states) - 1 else hf.transformer.ln_f(h[0, -1]))
                           for layer, h in enumerate(out.hidden_states)]  # layer 0: embeddings; the last is after ln_f
        probs = out.logits[0, -1].softmax(-1)
        assert step["id"] == int(probs.argmax()) and step["prob"] == pytest.approx(float(probs.max()), abs=2e-6)
        assert len(step["lens"]) == len(lens_logits)
        for layer, (guess, logits) in enumerate(zip(step["lens"], lens_logits)):
            lens_probs = logits.softmax(-1)
            assert guess["layer"] == layer
            assert guess["id"] == int(lens_probs.argmax()), f"step {step['step']}, layer {layer}"
            assert guess["prob"] == pytest.approx(float(lens_probs.max()), abs=2e-6)
        ids = ids + [step["id"]]


def test_lens_of_an_encoder_decoder_without_head_unembeds_with_the_decoders_own_embeddings(yaml_model):
    """No LM head and separate decoder token embeddings: the lens reads the decoder's states through the
    decoder's embeddings (the ones its output stack was fed by), not the encoder's."""

    model = yaml_model("architecture: encoder-decoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
                       "head: none\nshare_encoder_decoder_embeddings: false\n")
    with torch.no_grad():
        out = captured_pass(model, torch.tensor([[5, 17, 42]]), decoder_input_ids=torch.tensor([[101, 7, 9]]))
        state = out.hidden_states[-1]
        lens = model.unembed(state)
        assert torch.allclose(lens, state @ model.decoder_embed_tokens.weight.T, atol=1e-5)
        assert not torch.allclose(lens, state @ model.embed_tokens.weight.T, atol=1e-2)
