"""No silent misloads: for each family, every config setting that changes what transformers computes, set
away from its default, either loads with parity (fp32, every hidden state, attention map and the logits,
through `tfcli.commands.compare.core`) or is refused with an error that names the setting.

Also the loader's rule: a checkpoint tensor is never dropped unless it equals the tensor read in its place.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from tfcli.errors import TfcliError

IDS = torch.tensor([[5, 17, 42, 8, 77, 4, 60, 11]])  # no special ids (0-3): RoBERTa positions skip the pad id
BERT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64)
DISTILBERT = dict(vocab_size=96, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=64)
ROBERTA = dict(BERT, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
GPT2 = dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)
BART = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)

# Settings that load with parity, several per checkpoint to keep the suite quick:
# (config class, model class, base sizes, settings away from their defaults)
PARITY = {
    "bert untied, relu, 3 segments, eps": ("BertConfig", "BertForMaskedLM", BERT, dict(
        tie_word_embeddings=False, hidden_act="relu", type_vocab_size=3, layer_norm_eps=1e-3)),
    "bert pretraining, gelu_fast": ("BertConfig", "BertForPreTraining", BERT, dict(hidden_act="gelu_fast")),
    "bert 5 labels, swish": ("BertConfig", "BertForSequenceClassification", BERT, dict(num_labels=5,
                                                                                      hidden_act="swish")),
    "distilbert untied, relu": ("DistilBertConfig", "DistilBertForMaskedLM", DISTILBERT, dict(
        tie_word_embeddings=False, activation="relu")),
    "distilbert sinusoidal, 4 labels": ("DistilBertConfig", "DistilBertForSequenceClassification", DISTILBERT,
                                        dict(sinusoidal_pos_embds=True, num_labels=4)),
    "roberta untied, relu, pad 3, 2 segments": ("RobertaConfig", "RobertaForMaskedLM", ROBERTA, dict(
        tie_word_embeddings=False, hidden_act="relu", pad_token_id=3, max_position_embeddings=68,
        type_vocab_size=2)),
    "roberta classifier, gelu_pytorch_tanh": ("RobertaConfig", "RobertaForSequenceClassification", ROBERTA, dict(
        hidden_act="gelu_pytorch_tanh")),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", ROBERTA, {}),
    "gpt2 untied, unscaled, upcast, n_inner, relu, eps": ("GPT2Config", "GPT2LMHeadModel", GPT2, dict(
        tie_word_embeddings=False, scale_attn_weights=False, reorder_and_upcast_attn=True, n_inner=40,
        activation_function="relu", layer_norm_epsilon=1e-3)),
    "bart untied": ("BartConfig", "BartForConditionalGeneration", BART, dict(tie_word_embeddings=False)),
    "bart untied, bare": ("BartConfig", "BartModel", BART, dict(tie_word_embeddings=False)),
    "bart scaled embeddings, relu, 3 decoder layers": ("BartConfig", "BartForConditionalGeneration", BART, dict(
        scale_embedding=True, activation_function="relu", decoder_layers=3)),
}

# Settings refused, with the words the error must hold: (config class, architecture, setting, refusal)
REFUSED = {
    "bert mish": ("BertConfig", "BertModel", dict(hidden_act="mish"), "hidden_act `mish`"),
    "bert is_decoder": ("BertConfig", "BertModel", dict(is_decoder=True), "is_decoder: true"),
    "bert cross-attention": ("BertConfig", "BertModel", dict(add_cross_attention=True), "add_cross_attention: true"),
    "bert question answering": ("BertConfig", "BertForQuestionAnswering", {}, "BertForQuestionAnswering"),
    "distilbert gelu_10": ("DistilBertConfig", "DistilBertModel", dict(activation="gelu_10"), "hidden_act `gelu_10`"),
    "roberta is_decoder": ("RobertaConfig", "RobertaModel", dict(is_decoder=True), "is_decoder: true"),
    "gpt2 inverse layer scaling": ("GPT2Config", "GPT2LMHeadModel", dict(scale_attn_by_inverse_layer_idx=True),
                                   "scale_attn_by_inverse_layer_idx: true"),
    "gpt2 cross-attention": ("GPT2Config", "GPT2Model", dict(add_cross_attention=True), "add_cross_attention: true"),
    "bart heads differ": ("BartConfig", "BartModel", dict(decoder_attention_heads=2),
                          "encoder_attention_heads != decoder_attention_heads"),
    "bart feed-forward sizes differ": ("BartConfig", "BartModel", dict(decoder_ffn_dim=40),
                                       "encoder_ffn_dim != decoder_ffn_dim"),
    "bart is_decoder": ("BartConfig", "BartModel", dict(is_decoder=True), "is_decoder: true"),
    "mbart is_decoder": ("MBartConfig", "MBartModel", dict(is_decoder=True), "is_decoder: true"),
    "bart sequence classification": ("BartConfig", "BartForSequenceClassification", {},
                                     "BartForSequenceClassification"),
    "marian, a decoder vocabulary of its own size": ("MarianConfig", "MarianMTModel", dict(
        share_encoder_decoder_embeddings=False, decoder_vocab_size=500), "decoder_vocab_size: 500"),
    "t5 question answering": ("T5Config", "T5ForQuestionAnswering", {}, "T5ForQuestionAnswering"),
    "t5 is_decoder": ("T5Config", "T5Model", dict(is_decoder=True), "is_decoder: true"),
    "bart pre-norm": ("BartConfig", "BartModel", dict(normalize_before=True), "normalize_before: true"),
    "bart final norm": ("BartConfig", "BartModel", dict(add_final_layer_norm=True), "add_final_layer_norm: true"),
    "deberta-v2 embeddings of another width": ("DebertaV2Config", "DebertaV2Model", dict(
        hidden_size=32, num_attention_heads=4, embedding_size=16), "embedding_size: 16"),
    "deberta-v2 heads of another size": ("DebertaV2Config", "DebertaV2Model", dict(
        hidden_size=32, num_attention_heads=4, attention_head_size=4), "attention_head_size: 4"),
    "albert, two layers per group": ("AlbertConfig", "AlbertModel", dict(inner_group_num=2), "inner_group_num: 2"),
    "electra is_decoder": ("ElectraConfig", "ElectraModel", dict(is_decoder=True), "is_decoder: true"),
    "mpnet, 64 buckets": ("MPNetConfig", "MPNetModel", dict(relative_attention_num_buckets=64),
                          "relative_attention_num_buckets: 64"),
    "deberta-v2 convolution": ("DebertaV2Config", "DebertaV2Model", dict(conv_kernel_size=3), "conv_kernel_size: 3"),
    "deberta-v2 convolution of width 1": ("DebertaV2Config", "DebertaV2Model", dict(conv_kernel_size=1),
                                          "conv_kernel_size: 1"),
    "deberta-v2 position-to-position term": ("DebertaV2Config", "DebertaV2Model", dict(
        relative_attention=True, pos_att_type=["c2p", "p2p"]), "pos_att_type. \\['p2p'\\]"),
    "marian is_decoder": ("MarianConfig", "MarianModel", dict(is_decoder=True), "is_decoder: true"),
    "deberta-v2 pooler of another size": ("DebertaV2Config", "DebertaV2ForSequenceClassification", dict(
        hidden_size=32, num_attention_heads=4, pooler_hidden_size=16), "pooler_hidden_size: 16"),
    "deberta-v2 token classification": ("DebertaV2Config", "DebertaV2ForTokenClassification", {},
                                        "DebertaV2ForTokenClassification"),
    "modernbert rope scaling": ("ModernBertConfig", "ModernBertModel", dict(
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}), "RoPE scaling"),
}


@pytest.fixture
def checkpoint(tmp_path, save_hf_model):
    """checkpoint(config class, model class, values) -> the directory transformers saved it to."""
    import transformers

    def save(config_class, model_class, values):
        config = getattr(transformers, config_class)(**copy.deepcopy(values))  # it may write into nested dicts
        save_hf_model(getattr(transformers, model_class), config, tmp_path, perturb=True)
        return tmp_path

    return save


def parity(path) -> dict[str, float]:
    """tfcli against transformers on the saved checkpoint: max abs difference per tensor."""
    from tfcli.commands.compare import core as compare
    from tfcli.api import build_model
    from tfcli.sources import resolve_source

    source = resolve_source(str(path))
    return {d.name: d.max_abs_diff for d in compare.compare(build_model(source), source, IDS)}


@pytest.mark.parametrize("case", PARITY)
def test_settings_load_with_parity(checkpoint, case):
    config_class, model_class, base, settings = PARITY[case]
    differences = parity(checkpoint(config_class, model_class, {**base, **settings}))
    assert differences and max(differences.values()) <= 1e-4, differences
    assert any(name.endswith("hidden.2") for name in differences)  # every layer compared


@pytest.mark.parametrize("case", REFUSED)
def test_settings_tfcli_does_not_implement_are_refused_by_name(tmp_path, case):
    import transformers

    from tfcli.sources import resolve_source

    config_class, architecture, settings, refusal = REFUSED[case]
    config = getattr(transformers, config_class)(architectures=[architecture], **copy.deepcopy(settings))
    config.save_pretrained(tmp_path)  # the refusal comes from config.json, before any weight is read
    with pytest.raises(TfcliError, match=refusal.replace("`", ".")) as refused:
        resolve_source(str(tmp_path))
    if refusal == architecture:  # a head tfcli does not run: the hint lists those it runs
        assert refused.value.hint.startswith("tfcli runs the bare model and the heads "), refused.value.hint
    elif not refusal.startswith("hidden_act"):  # (activations: tfcli's own list refuses them, for every family)
        # a setting the family refuses: the line names the family, however it spells it
        family = refused.value.message.split(" with ")[0].removeprefix("config.json: ")
        assert re.sub("[^a-z0-9]", "", family.lower()) == re.sub("[^a-z0-9]", "", config.model_type), family
        assert refused.value.hint


def test_a_stored_copy_that_differs_is_refused_not_dropped(checkpoint, tmp_path):
    """A tied checkpoint stores BART's embedding three times; if one copy differs, transformers 4 and 5 would
    compute different models, so tfcli refuses and names both tensors."""
    from safetensors.torch import load_file, save_file

    path = checkpoint("BartConfig", "BartForConditionalGeneration", BART)
    tensors = load_file(path / "model.safetensors")
    tensors["model.encoder.embed_tokens.weight"] = tensors["model.shared.weight"].clone()
    tensors["model.decoder.embed_tokens.weight"] = tensors["model.shared.weight"] + 1
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TfcliError, match="`model.decoder.embed_tokens.weight` differs from|differs from "
                                         "`model.decoder.embed_tokens.weight`"):
        parity(path)
    tensors["model.decoder.embed_tokens.weight"] = tensors["model.shared.weight"].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    assert max(parity(path).values()) <= 1e-4  # equal copies load


def test_a_tied_head_stored_apart_must_equal_the_embeddings(checkpoint):
    from safetensors.torch import load_file, save_file

    path = checkpoint("GPT2Config", "GPT2LMHeadModel", GPT2)
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] * 2
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TfcliError, match="lm_head.weight` differs from `transformer.wte.weight") as refused:
        parity(path)
    assert "check tie_word_embeddings" in refused.value.hint


def test_an_unknown_tensor_is_named(checkpoint):
    from safetensors.torch import load_file, save_file

    path = checkpoint("BertConfig", "BertModel", BERT)
    tensors = load_file(path / "model.safetensors")
    tensors["encoder.layer.0.attention.self.extra_gate.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TfcliError, match="1 unexpected: encoder.layer.0.attention.self.extra_gate.weight"):
        parity(path)


DEBERTA_V3 = dict(BERT, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=4, max_relative_positions=6,
                  share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)
BARE = {  # config class, model class saved, settings, architectures config.json then names (None: the key left out)
    "deberta-v3-base: no architecture, its pretraining heads stored": (
        "DebertaV2Config", "DebertaV2ForMaskedLM", dict(DEBERTA_V3, legacy=False), None),
    "deberta-v2: no architecture, the older MLM head stored": (
        "DebertaV2Config", "DebertaV2ForMaskedLM", dict(DEBERTA_V3, legacy=True), None),
    "bart-large: BartModel, the generation head's final_logits_bias stored": (
        "BartConfig", "BartForConditionalGeneration", BART, ["BartModel"]),
}


@pytest.mark.parametrize("case", BARE)
def test_head_weights_under_a_bare_architecture_load_as_the_bare_model(checkpoint, case):
    """microsoft/deberta-v3-base names no architecture and stores its pretraining heads (lm_predictions,
    mask_predictions); facebook/bart-large names BartModel and stores final_logits_bias: the bare model uses none
    of them, in tfcli or transformers."""
    import json

    from safetensors.torch import load_file, save_file

    from tfcli.sources import resolve_source

    config_class, model_class, settings, architectures = BARE[case]
    path = checkpoint(config_class, model_class, settings)
    if config_class == "DebertaV2Config":
        tensors = load_file(path / "model.safetensors")
        tensors |= {"mask_predictions.dense.weight": torch.zeros(32, 32),
                    "mask_predictions.classifier.bias": torch.zeros(1)}
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.pop("architectures")
    if architectures is not None:
        config["architectures"] = architectures
    (path / "config.json").write_text(json.dumps(config))
    assert resolve_source(str(path)).config.head == "none"
    differences = parity(path)
    assert "logits" not in differences and max(differences.values()) <= 1e-4
