"""Parity with transformers for the other encoder families: BERT with a classifier, DistilBERT, RoBERTa.

Tiny random checkpoints saved by transformers itself, a padded batch, fp32, max abs diff <= 1e-4 on
every hidden state, every attention map (real tokens) and the logits.
"""

from __future__ import annotations

import pytest
import torch

import tfcli
from conftest import captured_pass

SIZES = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def batch(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two texts, the second right-padded with `pad`; real ids avoid the pad id."""
    ids = torch.tensor([[5, 17, 42, 8, 99, 23, 6], [5, 61, 33, 6, pad, pad, pad]])
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    return ids, mask


@pytest.fixture
def check_parity(assert_close):
    """check_parity(ours_model, hf_model, ids, mask, logits=True): hidden states, attention maps, logits."""

    def check(ours_model, hf_model, ids, mask, logits: bool = True) -> None:
        with torch.no_grad():
            theirs = hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            ours = captured_pass(ours_model, ids, attention_mask=mask)
        real = mask.bool()
        assert len(ours.hidden_states) == len(theirs.hidden_states)
        for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
            assert_close(f"hidden.{i}", a[real], b[real])
        assert len(ours.attentions) == len(theirs.attentions)
        for i, b in enumerate(theirs.attentions):
            for row in range(ids.shape[0]):  # padded queries are ignored by design: compare the real ones
                n = int(mask[row].sum())
                assert_close(f"attention.{i}", ours.attentions[i][row, :, :n, :n], b[row, :, :n, :n])
        if logits:
            a, b = ours.logits, theirs.logits
            assert_close("logits", a[real] if a.dim() == 3 else a, b[real] if b.dim() == 3 else b)

    return check


def bert_config(**overrides):
    from transformers import BertConfig

    return BertConfig(**SIZES, max_position_embeddings=64, **overrides)


def distilbert_config(**overrides):
    from transformers import DistilBertConfig

    return DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                            max_position_embeddings=64, **overrides)


def roberta_config(**overrides):
    from transformers import RobertaConfig

    # RoBERTa's real shape: 2 position rows for <pad> and below, one segment, eps 1e-5
    return RobertaConfig(**SIZES, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5,
                         pad_token_id=1, **overrides)


CASES = [
    ("BertForSequenceClassification", bert_config, 0, "classifier"),
    ("DistilBertModel", distilbert_config, 0, "none"),
    ("DistilBertForMaskedLM", distilbert_config, 0, "mlm"),
    ("DistilBertForSequenceClassification", distilbert_config, 0, "classifier"),
    ("RobertaModel", roberta_config, 1, "none"),
    ("RobertaForMaskedLM", roberta_config, 1, "mlm"),
    ("RobertaForSequenceClassification", roberta_config, 1, "classifier"),
]


@pytest.mark.parametrize(("class_name", "make_config", "pad", "head"), CASES, ids=[c[0] for c in CASES])
def test_parity(tmp_path, save_hf_model, check_parity, class_name, make_config, pad, head):
    import transformers

    extra = {"id2label": LABELS} if head == "classifier" else {}
    hf = save_hf_model(getattr(transformers, class_name), make_config(**extra), tmp_path)
    ours = tfcli.load_model(str(tmp_path))
    assert ours.trained and ours.config.head == head
    if head == "classifier":
        assert ours.config.label_names == ["negative", "neutral", "positive"]
    ids, mask = batch(pad)
    check_parity(ours, hf, ids, mask, logits=head != "none")


def test_roberta_position_p_reads_row_p_plus_2(tmp_path, save_hf_model, assert_close):
    """RoBERTa numbers positions from its padding index + 1 = 2: position p adds row p + 2 of the table, rows 0
    and 1 are never read, and the last row serves the 64th token (the longest text the table allows)."""
    from safetensors.torch import load_file, save_file
    from transformers import RobertaModel

    hf = save_hf_model(RobertaModel, roberta_config(), tmp_path)
    ids = torch.arange(64)[None] % 90 + 5  # 64 tokens, none of them the padding id (1)

    def embeddings() -> torch.Tensor:  # (64, hidden): tfcli's embeddings output
        with torch.no_grad():
            return captured_pass(tfcli.load_model(str(tmp_path)), ids).hidden_states[0][0]

    base = embeddings()
    with torch.no_grad():
        assert_close("hidden.0", base, hf(input_ids=ids, output_hidden_states=True).hidden_states[0][0])
    weights = load_file(tmp_path / "model.safetensors")
    name = next(k for k in weights if k.endswith("position_embeddings.weight"))
    for row in (0, 1, 2, 30, 65):
        table = weights[name].clone()
        table[row] += torch.linspace(-1.0, 1.0, table.shape[1])  # not constant: the LayerNorm would remove that
        save_file({**weights, name: table}, tmp_path / "model.safetensors", metadata={"format": "pt"})
        moved = ((embeddings() - base).abs().amax(-1) > 1e-3).nonzero()[:, 0].tolist()
        assert moved == ([row - 2] if row >= 2 else []), f"row {row} of the position table moved positions {moved}"


def test_bert_classifier_uses_the_pooler(tmp_path, save_hf_model):
    """BertForSequenceClassification's logits come from the pooler (dense + tanh) on [CLS]."""
    from transformers import BertForSequenceClassification

    hf = save_hf_model(BertForSequenceClassification, bert_config(num_labels=3), tmp_path)
    ours = tfcli.load_model(str(tmp_path))
    assert torch.equal(ours.head.dense.weight, hf.bert.pooler.dense.weight)
