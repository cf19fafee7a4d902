"""Decoder families against transformers (fp32, tiny random checkpoints saved by transformers itself):
every hidden state, every attention map, the logits, and greedy generation. (Encoder-decoders, BART among
them: test_parity_seq2seq.py.)"""

from __future__ import annotations

import pytest
import torch

import tfcli
from tfcli.errors import TfcliError

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
