"""Decoder families against transformers (fp32, tiny random checkpoints saved by transformers itself):
every hidden state, every self- and cross-attention map, the logits, and greedy generation."""

from __future__ import annotations

import pytest
import torch

import tfcli
from tfcli.errors import TfcliError
from tfcli.model import Capture

VOCAB = 96
IDS = torch.tensor([[5, 17, 42, 8, 77, 3, 60], [9, 31, 12, 50, 0, 0, 0]])
MASK = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])
SIZES = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def gpt2_config(**overrides):
    from transformers import GPT2Config

    return GPT2Config(**{**SIZES, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, **overrides})


def llama_config(cls_name="LlamaConfig", **overrides):
    import transformers

    values = dict(SIZES, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=48, max_position_embeddings=64, rope_theta=500.0)
    return getattr(transformers, cls_name)(**{**values, **overrides})


def bart_config(**overrides):
    from transformers import BartConfig

    values = dict(SIZES, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
                  decoder_start_token_id=2, forced_eos_token_id=None, forced_bos_token_id=None, scale_embedding=True)
    return BartConfig(**{**values, **overrides})


def test_gpt2_parity(tmp_path, load_pair, compare_decoder):
    from transformers import GPT2LMHeadModel

    hf, ours = load_pair(GPT2LMHeadModel, gpt2_config(), tmp_path)
    assert ours.config.model_type == "gpt2" and ours.config.head == "lm" and ours.config.tie_word_embeddings
    compare_decoder(ours, hf, IDS, MASK)


@pytest.mark.parametrize("cls_name,model_name", [("LlamaConfig", "LlamaForCausalLM"),
                                                 ("Qwen2Config", "Qwen2ForCausalLM"),
                                                 ("MistralConfig", "MistralForCausalLM")])
def test_llama_family_parity(tmp_path, load_pair, compare_decoder, cls_name, model_name):
    import transformers

    extra = {"sliding_window": None} if cls_name == "MistralConfig" else {}
    config = llama_config(cls_name, **extra)
    hf, ours = load_pair(getattr(transformers, model_name), config, tmp_path)
    assert ours.config.kv_heads == 2 < ours.config.num_attention_heads  # grouped-query attention
    assert ours.config.attention_bias == (cls_name == "Qwen2Config")
    assert not ours.config.attention_out_bias
    compare_decoder(ours, hf, IDS, MASK)


def test_llama_with_biases_and_tied_embeddings(tmp_path, load_pair, compare_decoder):
    from transformers import LlamaForCausalLM

    config = llama_config(attention_bias=True, mlp_bias=True, tie_word_embeddings=True, num_key_value_heads=1)
    hf, ours = load_pair(LlamaForCausalLM, config, tmp_path)
    assert ours.config.attention_out_bias and ours.config.mlp_bias and ours.config.tie_word_embeddings
    compare_decoder(ours, hf, IDS, MASK)


def test_bart_parity(tmp_path, load_pair, assert_close):
    from transformers import BartForConditionalGeneration

    hf, ours = load_pair(BartForConditionalGeneration, bart_config(), tmp_path)
    assert ours.config.position_offset == 2 and ours.config.scale_embedding and ours.config.lm_head_bias
    decoder_ids = torch.tensor([[2, 40, 41, 7, 9], [2, 12, 13, 0, 0]])
    decoder_mask = torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    with torch.no_grad():
        theirs = hf(input_ids=IDS, attention_mask=MASK, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=decoder_mask, output_hidden_states=True, output_attentions=True)
        ours = ours(IDS, attention_mask=MASK, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask,
                    capture=Capture())
    real, dec_real = MASK.bool(), decoder_mask.bool()
    for i, (a, b) in enumerate(zip(ours.encoder.hidden_states, theirs.encoder_hidden_states, strict=True)):
        assert_close(f"encoder.hidden.{i}", a[real], b[real])
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.decoder_hidden_states, strict=True)):
        assert_close(f"decoder.hidden.{i}", a[dec_real], b[dec_real])
    for row in range(2):
        n, m = int(MASK[row].sum()), int(decoder_mask[row].sum())
        for i in range(2):
            assert_close(f"encoder.attention.{i}", ours.encoder.attentions[i][row, :, :n, :n],
                         theirs.encoder_attentions[i][row, :, :n, :n])
            assert_close(f"decoder.attention.{i}", ours.attentions[i][row, :, :m, :m],
                         theirs.decoder_attentions[i][row, :, :m, :m])
            assert_close(f"decoder.cross_attention.{i}", ours.cross_attentions[i][row, :, :m, :n],
                         theirs.cross_attentions[i][row, :, :m, :n])
    assert_close("logits", ours.logits[dec_real], theirs.logits[dec_real])


# ---------------------------------------------------------------- greedy generation, token for token


def test_gpt2_greedy_generation_matches_transformers(tmp_path, load_pair, greedy):
    from transformers import GPT2LMHeadModel

    hf, ours = load_pair(GPT2LMHeadModel, gpt2_config(), tmp_path)
    mine, theirs = greedy(hf, ours, IDS[:1], MASK[:1], new=20)
    assert mine.tolist() == theirs.tolist()


def test_llama_greedy_generation_matches_transformers_left_padded(tmp_path, load_pair, greedy):
    from transformers import LlamaForCausalLM

    hf, ours = load_pair(LlamaForCausalLM, llama_config(), tmp_path)
    ids = torch.tensor([[5, 17, 42, 8, 77, 3], [0, 0, 0, 9, 31, 12]])  # left padding, as generation wants
    mask = (ids != 0).long()
    mine, theirs = greedy(hf, ours, ids, mask)
    assert mine.tolist() == theirs.tolist()


def test_bart_greedy_generation_matches_transformers(tmp_path, load_pair, greedy):
    from transformers import BartForConditionalGeneration

    hf, ours = load_pair(BartForConditionalGeneration, bart_config(), tmp_path)
    mine, theirs = greedy(hf, ours, IDS, MASK)
    assert mine.tolist() == theirs.tolist()
    assert mine[0, 0].item() == 2  # the decoder start token leads, as in transformers


def test_generation_stops_at_eos_like_transformers(tmp_path, load_pair, greedy):
    from transformers import GPT2LMHeadModel

    hf, ours = load_pair(GPT2LMHeadModel, gpt2_config(), tmp_path)
    ids = IDS[:1]
    free = ours.generate(ids, max_new_tokens=8)
    eos = free[0, ids.shape[1] + 2].item()  # make the third new token the end of sequence
    hf.generation_config.eos_token_id = eos
    ours.config.eos_token_id = eos
    mine, theirs = greedy(hf, ours, ids, None, new=8)
    assert mine.tolist() == theirs.tolist()
    assert mine.shape[1] <= ids.shape[1] + 3


# ---------------------------------------------------------------- configs tfcli refuses


def test_unsupported_gpt2_option_is_refused():
    from tfcli.checkpoints import translate_hf_config

    with pytest.raises(TfcliError, match="scale_attn_by_inverse_layer_idx"):
        translate_hf_config({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True}, "config.json")


def test_special_token_outside_the_vocabulary_is_dropped_like_transformers_tolerates(tmp_path, save_hf_model):
    """GPT2Config keeps bos/eos 50256 even with a smaller vocabulary; transformers loads it, so does tfcli."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tfcli.cli import app
    from typer.testing import CliRunner

    save_hf_model(GPT2LMHeadModel, GPT2Config(vocab_size=30522, n_embd=32, n_layer=1, n_head=4, n_positions=32),
                  tmp_path)
    model = tfcli.load_model(str(tmp_path))
    assert model.config.eos_token_id is None and model.config.bos_token_id is None
    result = CliRunner().invoke(app, ["compare", str(tmp_path), "time flies like an arrow"])
    assert result.exit_code == 0, result.stderr
