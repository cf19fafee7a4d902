"""Encoder families against transformers (fp32, tiny random checkpoints saved by transformers itself, with the
real models' distinctive settings): ELECTRA (narrower embeddings projected up; discriminator, generator and
classifier heads), MPNet (relative position bias and absolute positions), DeBERTa-v2/v3 (disentangled
attention: c2p and p2c, log buckets, shared or own position projections), ModernBERT (rotary with separate global
and local bases, alternating global and sliding-window attention, GeGLU, no biases, mean pooling), ALBERT
(factorised embeddings, one block's weights at every depth, and two groups).

A padded batch; every hidden state, every attention map (real tokens) and the logits within 1e-4.
"""

from __future__ import annotations

import pytest
import torch

import tfcli
from conftest import captured_pass


IDS = torch.tensor([[5, 17, 42, 8, 77, 9, 60, 11], [9, 31, 12, 50, 44, 0, 0, 0]])
MASK = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
LABELS = {0: "entailment", 1: "neutral", 2: "contradiction"}
ELECTRA = dict(vocab_size=96, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=64)
MPNET = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=66)
DEBERTA_V3 = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=64, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=4,
                  max_relative_positions=6, share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
                  type_vocab_size=0, initializer_range=0.2)  # deberta-v3-base's settings, with buckets small enough for 8 tokens
MODERNBERT = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                  local_attention=4, global_attn_every_n_layers=2, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  cls_token_id=2, sep_token_id=1, global_rope_theta=1000.0, local_rope_theta=50.0)  # windows of 5 in 8
ALBERT = dict(vocab_size=96, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              intermediate_size=48, max_position_embeddings=64)

CASES = {  # config class, model class, settings, tfcli head
    "electra discriminator": ("ElectraConfig", "ElectraForPreTraining", ELECTRA, "discriminator"),
    "electra generator (relu, its head still GELU)": ("ElectraConfig", "ElectraForMaskedLM", dict(
        ELECTRA, hidden_act="relu"), "mlm"),
    "electra generator, untied": ("ElectraConfig", "ElectraForMaskedLM", dict(ELECTRA, tie_word_embeddings=False),
                                  "mlm"),
    "electra classifier, embeddings as wide as the hidden state": ("ElectraConfig", "ElectraForSequenceClassification",
                                                                   dict(ELECTRA, embedding_size=32, id2label=LABELS),
                                                                   "classifier"),
    "mpnet masked lm": ("MPNetConfig", "MPNetForMaskedLM", MPNET, "mlm"),
    "mpnet masked lm, relu (its head still GELU)": ("MPNetConfig", "MPNetForMaskedLM", dict(MPNET, hidden_act="relu"),
                                                    "mlm"),
    "mpnet classifier, relu": ("MPNetConfig", "MPNetForSequenceClassification", dict(MPNET, hidden_act="relu",
                                                                                     id2label=LABELS), "classifier"),
    "deberta-v3 classifier": ("DebertaV2Config", "DebertaV2ForSequenceClassification", dict(
        DEBERTA_V3, id2label=LABELS), "classifier"),
    "deberta-v3 masked lm": ("DebertaV2Config", "DebertaV2ForMaskedLM", DEBERTA_V3, "mlm"),
    "deberta-v3 masked lm, untied": ("DebertaV2Config", "DebertaV2ForMaskedLM", dict(
        DEBERTA_V3, tie_word_embeddings=False), "mlm"),
    "deberta-v3 masked lm, the newer head (tied to the embeddings whatever the config says)": (
        "DebertaV2Config", "DebertaV2ForMaskedLM", dict(DEBERTA_V3, tie_word_embeddings=False, legacy=False), "mlm"),
    "deberta-v2 masked lm (own position projections, exact distances, absolute positions, segments)": (
        "DebertaV2Config", "DebertaV2ForMaskedLM", dict(DEBERTA_V3, share_att_key=False, position_buckets=-1,
                                                        norm_rel_ebd="none", position_biased_input=True,
                                                        type_vocab_size=2, legacy=False), "mlm"),
    "deberta-v2 c2p only": ("DebertaV2Config", "DebertaV2Model", dict(DEBERTA_V3, pos_att_type=["c2p"],
                                                                      share_att_key=False), "none"),
    "deberta-v2 p2c only": ("DebertaV2Config", "DebertaV2Model", dict(DEBERTA_V3, pos_att_type=["p2c"],
                                                                      share_att_key=False), "none"),
    "modernbert masked lm": ("ModernBertConfig", "ModernBertForMaskedLM", MODERNBERT, "mlm"),
    "modernbert masked lm, relu": ("ModernBertConfig", "ModernBertForMaskedLM", dict(
        MODERNBERT, hidden_activation="relu"), "mlm"),
    "modernbert classifier, mean pooling": ("ModernBertConfig", "ModernBertForSequenceClassification", dict(
        MODERNBERT, classifier_pooling="mean", id2label=LABELS), "classifier"),
    "modernbert with biases everywhere, cls pooling": ("ModernBertConfig", "ModernBertForSequenceClassification", dict(
        MODERNBERT, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, id2label=LABELS),
        "classifier"),
    "albert masked lm, one shared block": ("AlbertConfig", "AlbertForMaskedLM", ALBERT, "mlm"),
    "albert classifier, two groups over three layers": ("AlbertConfig", "AlbertForSequenceClassification", dict(
        ALBERT, num_hidden_groups=2, id2label=LABELS), "classifier"),
    "albert pretraining, untied": ("AlbertConfig", "AlbertForPreTraining", dict(ALBERT, tie_word_embeddings=False),
                                   "mlm"),
}


@pytest.mark.parametrize("case", CASES)
def test_parity(tmp_path, save_hf_model, assert_close, compare_passes, case):
    import transformers

    config_class, model_class, settings, head = CASES[case]
    hf = save_hf_model(getattr(transformers, model_class), getattr(transformers, config_class)(**settings), tmp_path,
                       perturb=True)
    ours = tfcli.load_model(str(tmp_path))
    assert ours.config.head == head
    with torch.no_grad():
        theirs = hf(input_ids=IDS, attention_mask=MASK, output_hidden_states=True, output_attentions=True)
        mine = captured_pass(ours, IDS, attention_mask=MASK)
    real = MASK.bool()
    assert len(mine.hidden_states) == len(theirs.hidden_states) == settings["num_hidden_layers"] + 1
    states = [*mine.hidden_states[:-1], mine.last_hidden_state]  # transformers' last: after any final norm
    for i, (a, b) in enumerate(zip(states, theirs.hidden_states)):
        assert_close(f"hidden.{i}", a[real], b[real])
    assert len(mine.attentions) == len(theirs.attentions)
    for i, b in enumerate(theirs.attentions):
        for row in range(2):
            n = int(MASK[row].sum())
            assert_close(f"attention.{i}", mine.attentions[i][row, :, :n, :n], b[row, :, :n, :n])
    compare_passes(tmp_path, ours, IDS[:1])
    if head == "none":
        return
    logits = getattr(theirs, "logits", None)
    if logits is None:
        logits = theirs.prediction_logits  # AlbertForPreTraining
    assert_close("logits", mine.logits if head == "classifier" else mine.logits[real],
                 logits if head == "classifier" else logits[real])


def test_mpnet_far_distances_share_its_log_buckets(tmp_path, save_hf_model, assert_close):
    """MPNet's relative position buckets at distances up to 99: beyond 8 they widen with the log of the distance,
    up to transformers' fixed max_distance of 128, which a short input never reaches. A bias table of unit scale
    makes a bucket off by one show."""
    from transformers import MPNetConfig, MPNetModel

    config = MPNetConfig(**dict(MPNET, max_position_embeddings=130, initializer_range=1.0))
    hf = save_hf_model(MPNetModel, config, tmp_path, perturb=True)
    ours = tfcli.load_model(str(tmp_path))
    ids = torch.randint(3, 96, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=ids).last_hidden_state
        mine = ours(ids).last_hidden_state
    assert_close("last hidden state", mine, theirs)


def test_albert_runs_one_block_at_every_depth(tmp_path, save_hf_model):
    """The shared weights are held once, yet each depth has its own attention map and hidden state."""
    from transformers import AlbertConfig, AlbertModel

    save_hf_model(AlbertModel, AlbertConfig(**ALBERT), tmp_path)
    ours = tfcli.load_model(str(tmp_path))
    blocks = ours.encoder.blocks
    assert blocks[0] is blocks[1] is blocks[2]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in blocks[0].parameters()) + sum(
        p.numel() for p in ours.embed_tokens.parameters()) + sum(p.numel() for p in ours.encoder.embeddings.parameters())
    with torch.no_grad():
        out = captured_pass(ours, IDS[:1])
    assert len(out.attentions) == 3 and not torch.equal(out.attentions[0], out.attentions[1])
