"""Encoder-decoder families against transformers (fp32, tiny random checkpoints saved by transformers itself,
with the real models' distinctive settings): BART, T5 (ReLU, tied and rescaled head), T5 v1.1 / Flan-T5 (gated GELU,
untied head, a head size that is not hidden_size / heads), mT5, T5's encoder alone, mBART (pre-norm, final
norms, scaled embeddings), Marian (sinusoidal halves, SiLU, scaled embeddings, shared or separate embeddings).

For each: every encoder and decoder hidden state, self- and cross-attention map and the logits on a padded
batch, then greedy generation token for token (with the KV cache: T5's relative position bias at each step).
"""

from __future__ import annotations

import pytest
import torch

import tfcli

from tfcli.model.decoding import decode
from conftest import captured_pass

IDS = torch.tensor([[5, 17, 42, 8, 77, 9, 60, 11, 23, 35, 36, 38], [9, 31, 12, 50, 44, 0, 0, 0, 0, 0, 0, 0]])
MASK = (torch.arange(12)[None] < torch.tensor([[12], [5]])).long()
DECODER_IDS = torch.tensor([[0, 40, 41, 7, 9, 13, 15], [0, 12, 13, 14, 0, 0, 0]])
DECODER_MASK = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
# relative_attention_max_distance 6: the 12-token batch reaches the far buckets that every longer distance shares
T5 = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
          relative_attention_max_distance=6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
BART_SIZES = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64)
BART = dict(BART_SIZES, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True)
MBART = dict(BART_SIZES, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True,
             forced_eos_token_id=2)
MARIAN = dict(BART_SIZES, pad_token_id=95, eos_token_id=94, decoder_start_token_id=95, scale_embedding=True,
              activation_function="swish")

CASES = {  # config class, model class, settings
    "t5 (relu, tied, rescaled head)": ("T5Config", "T5ForConditionalGeneration", dict(T5, feed_forward_proj="relu")),
    "flan-t5 (gated gelu, untied, 6 heads of 8 in 32)": ("T5Config", "T5ForConditionalGeneration", dict(
        T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_heads=6)),
    "mt5": ("MT5Config", "MT5ForConditionalGeneration", dict(T5, tie_word_embeddings=False)),
    "mt5, tied as transformers 5 writes it (the head not rescaled, unlike T5's)": (
        "MT5Config", "MT5ForConditionalGeneration", T5),
    "bart (scaled embeddings, forced end of sequence)": ("BartConfig", "BartForConditionalGeneration", BART),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", MBART),
    "mbart, untied (each stack's embeddings and the head apart)": (
        "MBartConfig", "MBartForConditionalGeneration", dict(MBART, tie_word_embeddings=False)),
    "marian": ("MarianConfig", "MarianMTModel", MARIAN),
    "marian, separate embeddings": ("MarianConfig", "MarianMTModel", dict(
        MARIAN, share_encoder_decoder_embeddings=False, tie_word_embeddings=False)),
    "marian, separate embeddings, head tied to the decoder's": ("MarianConfig", "MarianMTModel", dict(
        MARIAN, share_encoder_decoder_embeddings=False)),
}


def untie_t5(path, model_class):
    """Make a saved T5 checkpoint untied as T5 v1.1, Flan-T5 and mT5 files are (config.json says
    `tie_word_embeddings: false` and model.safetensors holds an `lm_head` of its own), and load it with
    transformers: transformers 5 builds every T5 tied, whatever the config says, and saves no head."""
    import json

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn(tensors["shared.weight"].shape, generator=torch.Generator().manual_seed(3))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.pop("scale_decoder_outputs", None)  # as the published files: no such key, the head's tie decides
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    hf = model_class.from_pretrained(path, attn_implementation="eager").eval()
    assert torch.equal(hf.lm_head.weight, tensors["lm_head.weight"])
    assert not getattr(hf.config, "scale_decoder_outputs", False)
    return hf


@pytest.fixture
def pair(tmp_path, save_hf_model):
    """pair(case) -> (transformers model, tfcli model) for a CASES entry."""
    import transformers

    def make(case):
        config_class, model_class, settings = CASES[case]
        config = getattr(transformers, config_class)(**settings)
        hf = save_hf_model(getattr(transformers, model_class), config, tmp_path, perturb=True)
        if config_class in ("T5Config", "MT5Config") and settings.get("tie_word_embeddings") is False:
            hf = untie_t5(tmp_path, getattr(transformers, model_class))
        if case == "mbart":  # mBART-50 forces the target language code first: generation_config.json says so
            hf.generation_config.forced_bos_token_id = 7
            hf.save_pretrained(tmp_path)
        return hf, tfcli.load_model(str(tmp_path))

    return make


@pytest.mark.parametrize("case", CASES)
def test_parity_and_greedy_generation(tmp_path, pair, assert_close, compare_passes, case):
    hf, ours = pair(case)
    decoder_ids = DECODER_IDS.clone()
    decoder_ids[:, 0] = ours.config.decoder_start_token_id
    with torch.no_grad():
        theirs = hf(input_ids=IDS, attention_mask=MASK, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=DECODER_MASK, output_hidden_states=True, output_attentions=True)
        mine = captured_pass(ours, IDS, attention_mask=MASK, decoder_input_ids=decoder_ids, decoder_attention_mask=DECODER_MASK)
    real, dec_real = MASK.bool(), DECODER_MASK.bool()
    encoder_states = [*mine.encoder.hidden_states[:-1], mine.encoder.last_hidden_state]  # last: after a final norm
    decoder_states = [*mine.hidden_states[:-1], mine.last_hidden_state]
    for i, (a, b) in enumerate(zip(encoder_states, theirs.encoder_hidden_states, strict=True)):
        assert_close(f"encoder.hidden.{i}", a[real], b[real])
    for i, (a, b) in enumerate(zip(decoder_states, theirs.decoder_hidden_states, strict=True)):
        assert_close(f"decoder.hidden.{i}", a[dec_real], b[dec_real])
    for row in range(2):
        n, m = int(MASK[row].sum()), int(DECODER_MASK[row].sum())
        for i, b in enumerate(theirs.encoder_attentions):
            assert_close(f"encoder.attention.{i}", mine.encoder.attentions[i][row, :, :n, :n], b[row, :, :n, :n])
        for i, b in enumerate(theirs.decoder_attentions):
            assert_close(f"decoder.attention.{i}", mine.attentions[i][row, :, :m, :m], b[row, :, :m, :m])
        for i, b in enumerate(theirs.cross_attentions):
            assert_close(f"decoder.cross_attention.{i}", mine.cross_attentions[i][row, :, :m, :n], b[row, :, :m, :n])
    assert_close("logits", mine.logits[dec_real], theirs.logits[dec_real])
    compare_passes(tmp_path, ours, IDS[:1])

    # greedy decoding with the KV cache, as model.generate runs it: the tokens, and since random tiny models
    # repeat tokens, each cached step's logits against a full forward pass over the same tokens
    steps = list(decode(ours, IDS, MASK, max_new_tokens=12))
    generated = torch.cat([ours.start_tokens(2, IDS.device), torch.stack([step.tokens for step in steps], 1)], 1)
    with torch.no_grad():
        expected = hf.generate(IDS, attention_mask=MASK, max_new_tokens=12, do_sample=False, num_beams=1)
        forward = hf(input_ids=IDS, attention_mask=MASK, decoder_input_ids=generated[:, :-1]).logits
    assert generated.tolist() == expected.tolist()
    if case == "mbart":  # the forced first and last tokens are among those compared
        assert generated[:, 1].tolist() == [7, 7] and generated[:, -1].tolist() == [2, 2]
    assert_close("cached step logits", torch.stack([step.logits for step in steps], dim=1), forward)


def test_t5_encoder_model_is_an_encoder(tmp_path, save_hf_model, assert_close):
    from transformers import T5Config, T5EncoderModel

    hf = save_hf_model(T5EncoderModel, T5Config(**T5), tmp_path, perturb=True)
    ours = tfcli.load_model(str(tmp_path))
    assert ours.config.architecture == "encoder" and ours.decoder is None
    with torch.no_grad():
        theirs = hf(input_ids=IDS, attention_mask=MASK, output_hidden_states=True)
        mine = captured_pass(ours, IDS, attention_mask=MASK)
    assert_close("last_hidden_state", mine.last_hidden_state[MASK.bool()], theirs.last_hidden_state[MASK.bool()])
