"""BERT-family parity with transformers: every hidden state, every attention map, the MLM logits."""

from __future__ import annotations

import pytest
import torch

import tfcli
from conftest import captured_pass

IDS = torch.tensor([[101, 2051, 10029, 2066, 2019, 8612, 102], [101, 7592, 2088, 102, 0, 0, 0]])
MASK = (IDS != 0).long()


def tiny_bert_config(**overrides):
    from transformers import BertConfig

    values = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    return BertConfig(**{**values, **overrides})


@pytest.fixture
def check_parity(assert_close):
    """check_parity(ours_model, hf_model, ids=IDS, mask=MASK, logits=True): hidden states, attention, logits."""

    def check(ours_model, hf_model, ids=IDS, mask=MASK, logits=True):
        with torch.no_grad():
            theirs = hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
            ours = captured_pass(ours_model, ids, attention_mask=mask)
        real = mask.bool()
        for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
            assert_close(f"hidden.{i}", a[real], b[real])
        for i, b in enumerate(theirs.attentions):
            # padded queries differ by design (they are ignored); compare the real ones
            for row in range(ids.shape[0]):
                n = int(mask[row].sum())
                assert_close(f"attention.{i}", ours.attentions[i][row, :, :n, :n], b[row, :, :n, :n])
        if logits:
            assert_close("logits", ours.logits[real], theirs.logits[real])

    return check


def test_bert_masked_lm_parity(tmp_path, save_hf_model, check_parity):
    from transformers import BertForMaskedLM

    hf = save_hf_model(BertForMaskedLM, tiny_bert_config(), tmp_path)
    ours = tfcli.load_model(str(tmp_path))
    assert ours.trained and ours.config.head == "mlm"
    check_parity(ours, hf)


def test_bert_model_parity_with_bin_weights(tmp_path, save_hf_model, check_parity):
    from transformers import BertModel

    hf = save_hf_model(BertModel, tiny_bert_config(), tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    ours = tfcli.load_model(str(tmp_path))
    check_parity(ours, hf, logits=False)


def test_real_minilm_checkpoint_parity(minilm_dir, check_parity):
    from transformers import BertModel

    hf = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    ours = tfcli.load_model(str(minilm_dir))
    check_parity(ours, hf, logits=False)


def test_fast_path_matches_explicit_softmax(minilm_dir, assert_close):
    model = tfcli.load_model(str(minilm_dir))
    with torch.no_grad():
        fast = model(IDS, attention_mask=MASK)
        explicit = captured_pass(model, IDS, attention_mask=MASK)
    assert_close("last_hidden_state", fast.last_hidden_state, explicit.last_hidden_state, 1e-5)


def test_padded_batch_equals_each_text_alone(minilm_dir, assert_close):
    model = tfcli.load_model(str(minilm_dir))
    with torch.no_grad():
        batch = model(IDS, attention_mask=MASK).last_hidden_state
        for row in range(IDS.shape[0]):
            n = int(MASK[row].sum())
            alone = model(IDS[row:row + 1, :n]).last_hidden_state
            assert_close(f"text {row}", batch[row, :n], alone[0], 1e-5)


def test_mismatched_weights_are_named(tmp_path, save_hf_model):
    from transformers import BertModel

    save_hf_model(BertModel, tiny_bert_config(), tmp_path)
    config = (tmp_path / "config.json").read_text().replace('"hidden_size": 32', '"hidden_size": 64')
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(tfcli.errors.TfcliError, match="wrong shape"):
        tfcli.load_model(str(tmp_path))
