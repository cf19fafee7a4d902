"""What `generate` reports, checked against transformers on a checkpoint that predicts with conviction: the
step probabilities are the model's own (softmax of the logits, before temperature and filtering), and in a
batch a row that has ended gets padding, not more tokens, while the others go on."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import tfcli

PROMPT = "time flies like"


def test_step_probabilities_are_taken_before_temperature(cli, peaked_gpt2):
    path, hf = peaked_gpt2
    result = cli("generate", PROMPT, "--model", str(path), "-n", "4", "--temperature", "0.4", "--top-k", "5",
                 "--seed", "1", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert len(record["steps"]) == 4
    ids = record["prompt_ids"]
    for step in record["steps"]:
        with torch.no_grad():
            probs = hf(input_ids=torch.tensor([ids])).logits[0, -1].softmax(-1)
        assert step["prob"] == pytest.approx(float(probs[step["id"]]), abs=2e-6)
        best = probs.topk(len(step["top"]))
        assert [t["id"] for t in step["top"]] == best.indices.tolist()
        assert [t["prob"] for t in step["top"]] == pytest.approx(best.values.tolist(), abs=2e-6)
        ids = ids + [step["id"]]


def greedy(hf, prompt: list[int], new: int) -> list[int]:
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_a_row_that_ended_is_padded_while_the_others_go_on(tmp_path, peaked_gpt2):
    path, hf = peaked_gpt2
    first, second = [101, 2051, 10029, 2066], [101, 8612]
    new = 6
    # end of sequence: a token the first prompt produces early on and the second never does
    eos = next(t for t in greedy(hf, first, new)[1:4] if t not in greedy(hf, second, new))
    for name in ("config.json", "model.safetensors"):
        shutil.copy(path / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    ours = tfcli.load_model(str(tmp_path))

    batch = torch.tensor([first, [0, 0] + second])  # left-padded
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    together = ours.generate(batch, max_new_tokens=new, attention_mask=mask)[:, batch.shape[1]:].tolist()
    ended = together[0].index(eos)
    assert ended < new - 1, "the first row should end before the last step"
    assert together[0][:ended + 1] == greedy(hf, first, new)[:ended + 1]
    assert together[0][ended + 1:] == [0] * (new - ended - 1)  # pad_token_id after the end
    assert together[1] == greedy(hf, second, new)  # the other row is not cut short
    theirs = hf.generate(batch, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=eos,
                         pad_token_id=0)[:, batch.shape[1]:].tolist()
    assert together == theirs


def test_top_p_keeps_the_tokens_transformers_keeps_at_the_boundary(yaml_model):
    """Eight equally likely tokens (an LM head of zeros): cumulative probabilities 1/8, 2/8, ... are exact, so
    top_p 0.75 lands on a boundary. transformers drops the tokens whose cumulative probability is <= 1 - top_p
    (two of them) and samples among the other six; so must tfcli."""
    from transformers.generation.logits_process import TopPLogitsWarper

    model = yaml_model("architecture: decoder\nvocab_size: 8\nhidden_size: 16\nnum_hidden_layers: 1\n"
                       "num_attention_heads: 2\nintermediate_size: 32\nmax_position_embeddings: 8\n"
                       "norm_position: pre\ntype_vocab_size: 0\nembedding_norm: false\nfinal_norm: true\nhead: lm\n"
                       "tie_word_embeddings: false\n")
    with torch.no_grad():
        model.head.unembed.weight.zero_()
    kept = TopPLogitsWarper(top_p=0.75)(None, torch.zeros(1, 8)).isfinite()[0].nonzero()[:, 0].tolist()
    assert len(kept) == 6
    drawn = {int(model.generate(torch.tensor([[1, 2]]), max_new_tokens=1, do_sample=True, top_p=0.75, seed=seed)[0, -1])
             for seed in range(80)}
    assert drawn == set(kept)


def test_sampling_with_a_temperature_draws_what_transformers_draws(peaked_gpt2):
    """Scores divided by the temperature, then sampled: with the same seed, the same tokens as transformers'
    generate (top-k and top-p switched off on both sides), for a temperature below and above 1. top_p=1 is
    accepted and keeps every token, as no top_p does."""
    path, hf = peaked_gpt2
    model = tfcli.load_model(str(path))
    prompt = torch.tensor([[101, 2051, 10029, 2066]])
    for temperature, top_p in ((0.5, None), (1.7, None), (1.7, 1.0)):
        for seed in range(3):
            ours = model.generate(prompt, max_new_tokens=12, do_sample=True, temperature=temperature, top_p=top_p,
                                  seed=seed)
            torch.manual_seed(seed)
            with torch.no_grad():
                theirs = hf.generate(prompt, max_new_tokens=12, do_sample=True, temperature=temperature, top_k=0,
                                     top_p=1.0, eos_token_id=None, pad_token_id=0)
            assert ours.tolist() == theirs.tolist(), (temperature, seed)


def test_sampling_from_one_kept_token_is_greedy(peaked_gpt2):
    """--top-k 1 leaves one token to draw: sampling must make the greedy tokens, whatever the seed."""
    model = tfcli.load_model(str(peaked_gpt2[0]))
    prompt = torch.tensor([[101, 2051, 10029, 2066]])
    greedy = model.generate(prompt, max_new_tokens=6)
    for seed in range(3):
        assert torch.equal(model.generate(prompt, max_new_tokens=6, do_sample=True, top_k=1, seed=seed), greedy)
