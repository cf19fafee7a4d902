"""The numbers `encode` reports, checked against the tensors it saves and the tokens it was given: stage
statistics (population std: no Bessel correction) and attention summaries of each text of a padded batch,
the decoder input `--target` makes, and the memory check's arithmetic at its boundary."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import tfcli.api

ENCODER = "architecture: encoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\n" \
          "intermediate_size: 64\nmax_position_embeddings: 32\nhead: mlm\n"
SEQ2SEQ = "architecture: encoder-decoder\nhidden_size: 32\nnum_hidden_layers: 1\nnum_decoder_layers: 1\n" \
          "num_attention_heads: 2\nintermediate_size: 64\nmax_position_embeddings: 32\ntype_vocab_size: 0\n" \
          "head: lm\ndecoder_start_token_id: 101\n"


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def encoder_yaml(tmp_path):
    path = tmp_path / "encoder.yaml"
    path.write_text(ENCODER, encoding="utf-8")
    return str(path)


def test_statistics_and_attention_are_those_of_the_saved_tensors(cli, encoder_yaml, tmp_path):
    saved = tmp_path / "run.safetensors"
    texts = ["the animal did not cross the street because it was too tired", "time flies"]
    reports = records(cli("encode", *texts, "--model", encoder_yaml, "--json", "--top-k", "1", "--save", str(saved)))
    tensors = load_file(str(saved))
    for row, record in enumerate(reports):
        n = int(tensors["attention_mask"][row].sum())
        assert n == len(record["ids"]) and tensors["input_ids"][row, :n].tolist() == record["ids"]
        stages = {stage["stage"]: stage for stage in record["shapes"]}
        expected = {"blocks.0.resid_pre": tensors["hidden.0"], "blocks.0.resid_post": tensors["hidden.1"],
                    "blocks.1.resid_post": tensors["hidden.2"], "logits": tensors["logits"]}
        for name, tensor in expected.items():
            values = tensor[row, :n].double()  # the text's own tokens, not the batch's padding
            stage = stages[name]
            assert stage["shape"] == list(values.shape)
            assert stage["mean"] == pytest.approx(values.mean().item(), abs=1e-6), name
            assert stage["std"] == pytest.approx(values.std(correction=0).item(), abs=1e-6), name
            assert stage["norm"] == pytest.approx(values.norm().item(), abs=1e-4), name
        for amap in record["attention"]:  # without --heads: the mean over heads
            weights = tensors[f"attention.{amap['layer']}"][row, :, :n, :n].double().mean(0)
            best, where = weights.max(-1)
            assert amap["max_key"] == where.tolist()
            assert amap["max_weight"] == pytest.approx(best.tolist(), abs=1e-6)
            # every weight, rounded to 4 decimals (docs/commands.md, encode: "the query x key weights rounded")
            assert torch.tensor(amap["weights"], dtype=torch.float64).sub(weights).abs().max() <= 5e-5 + 1e-7
            assert all(round(w, 4) == w for row_weights in amap["weights"] for w in row_weights)  # as printed
        last = record["lens"][-1]
        assert [top[0]["id"] for top in last["top"]] == tensors["logits"][row, :n].argmax(-1).tolist()


def test_target_is_the_start_token_then_the_target_tokens(cli, tmp_path):
    config = tmp_path / "seq2seq.yaml"
    config.write_text(SEQ2SEQ, encoding="utf-8")
    (target,) = records(cli("tokenize", "--no-special", "--json", "le temps passe à 東京"))
    saved = tmp_path / "run.safetensors"
    (record,) = records(cli("encode", "time flies", "--model", str(config), "--target", "le temps passe à 東京",
                            "--json", "--save", str(saved)))
    assert record["target_ids"] == [101] + target["ids"]
    assert record["target_tokens"] == ["[CLS]"] + target["tokens"]
    assert load_file(str(saved))["decoder.input_ids"].tolist() == [record["target_ids"]]
    with safe_open(str(saved), "pt") as file:  # docs/commands.md's --save metadata: the decoder input's tokens
        assert json.loads(file.metadata()["target_tokens"]) == record["target_tokens"]
    raw = saved.read_bytes()
    assert "東".encode() in raw[8:8 + int.from_bytes(raw[:8], "little")]  # the header, as written: not \\u escaped
    queries = len(record["target_ids"])
    for amap in record["attention"]:
        keys = len(record["ids"]) if amap["kind"] in ("encoder", "cross") else queries
        assert len(amap["max_key"]) == (len(record["ids"]) if amap["kind"] == "encoder" else queries)
        assert max(amap["max_key"]) < keys
    assert [len(row["top"]) for row in record["lens"]] == [queries]


def test_a_start_token_outside_the_tokenizer_shows_its_id(cli, tmp_path):
    """A model may have more ids than its tokenizer has tokens: the decoder input then names the start token
    by its id, as the lens and generate name such ids."""
    config = tmp_path / "seq2seq.yaml"
    config.write_text(SEQ2SEQ.replace("decoder_start_token_id: 101", "decoder_start_token_id: 30600")
                      + "vocab_size: 30601\n", encoding="utf-8")
    (record,) = records(cli("encode", "time flies", "--model", str(config), "--target", "le temps", "--json"))
    assert record["target_ids"][0] == 30600 and record["target_tokens"][0] == "<30600>"


@pytest.mark.parametrize("dtype,size", [("float32", 4), ("bfloat16", 2)])
def test_memory_check_at_its_boundary(cli, encoder_yaml, monkeypatch, dtype, size):
    """Weights need parameters x bytes per parameter: exactly that much memory is enough, a byte less is not."""
    parameters = records(cli("config", encoder_yaml, "--json"))[0]["parameters"]
    monkeypatch.setattr(tfcli.api, "memory_size", lambda device=None: parameters * size)
    fits = cli("encode", "time flies", "--model", encoder_yaml, "--dtype", dtype, "--json")
    assert fits.exit_code == 0, fits.stderr
    assert {stage["dtype"] for stage in json.loads(fits.stdout)["shapes"]} == {dtype}  # each stage's, as --dtype says
    monkeypatch.setattr(tfcli.api, "memory_size", lambda device=None: parameters * size - 1)
    refused = cli("encode", "time flies", "--model", encoder_yaml, "--dtype", dtype, "--json")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert f"GiB for its weights in {dtype}" in refused.stderr
    # a float32 model one byte too big would fit in half the bytes; a bfloat16 one has nothing smaller
    assert ("--dtype bfloat16 would fit" in refused.stderr) == (dtype == "float32")


@pytest.mark.parametrize("norms", ["norm_position: post", "norm_position: pre",
                                   "norm_position: sandwich\nnorm: rmsnorm_plus_one"])
def test_the_sublayer_parameter_counts_add_up_to_the_block(cli, tmp_path, norms):
    """Each sublayer's row counts its own weights and the norms that go with it (before, after, or both, as
    Gemma 2 and OLMo 2 have them), so that attention + feed_forward = the block, whatever the norm placement."""
    path = tmp_path / "model.yaml"
    path.write_text(ENCODER + norms + "\n", encoding="utf-8")
    (record,) = records(cli("encode", "time flies", "--model", str(path), "--json", "--layers", "all", "--top-k", "0"))
    params = {stage["stage"]: stage["params"] for stage in record["shapes"]}
    for block in range(2):  # the sublayer rows: their outputs, or their output norms' (sandwich, sublayer_output)
        sublayers = [name for name in params if name.startswith((f"blocks.{block}.attn", f"blocks.{block}.mlp"))]
        assert len(sublayers) == 2 and sum(params[name] for name in sublayers) == params[f"blocks.{block}.resid_post"] > 0


@pytest.mark.parametrize("architecture,expected", [
    # 2 layers x 8 heads x 256 queries x 256 keys x 4 bytes = 4 MiB; 256 tokens: [CLS], 254 words, [SEP]
    ("architecture: encoder\nhead: mlm\n", "256 tokens would capture 4.0 MB of attention (8 heads x 256^2 positions x 2 layers)"),
    # the same through a decoder's causal maps (no cross-attention: nothing more)
    ("architecture: decoder\nnorm_position: pre\ntype_vocab_size: 0\nhead: lm\n",
     "256 tokens would capture 4.0 MB of attention (8 heads x 256^2 positions x 2 layers)"),
])
def test_the_capture_refusal_states_the_cost(cli, tmp_path, architecture, expected):
    path = tmp_path / "model.yaml"
    path.write_text("hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 8\nintermediate_size: 64\n"
                    "max_position_embeddings: 256\n" + architecture, encoding="utf-8")
    result = cli("encode", " ".join(["word"] * 254), "--model", str(path), "--max-capture-mb", "3")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: one text of {expected}: more than --max-capture-mb 3"]


@pytest.mark.parametrize("layers,detailed", [([], 1), (["--layers", "0"], 0), (["--layers", "all"], None)])
def test_the_stages_table_details_the_sublayers_of_the_chosen_blocks(cli, encoder_yaml, layers, detailed):
    """By default the last block's attention and feed-forward rows; with --layers, those blocks'; every block's
    output row always."""
    result = cli("encode", "time flies", "--model", encoder_yaml, "--width", "120", "--no-color", *layers)
    assert result.exit_code == 0, result.stderr
    stages = [line.split("  ")[0] for line in result.stdout.splitlines() if line.startswith("blocks.")]
    for block in range(2):
        sublayers = [f"blocks.{block}.attn.out", f"blocks.{block}.mlp.out"]
        shown = [stage for stage in sublayers if stage in stages]
        assert shown == (sublayers if detailed in (block, None) else []), stages
        assert f"blocks.{block}.resid_post" in stages


def test_an_encoder_decoder_table_names_the_keys_of_each_kind_of_attention(cli, tmp_path):
    """Encoder self-attention attends over the source tokens, the decoder's over its own (the target), cross
    attention from the target to the source: the keys each query attends to most are named from the right side."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    result = cli("encode", "time flies", "--model", str(path), "--target", "like an arrow", "--width", "120",
                 "--no-color", "--json")
    (record,) = records(result)
    source, target = record["tokens"], record["target_tokens"]
    result = cli("encode", "time flies", "--model", str(path), "--target", "like an arrow", "--width", "120",
                 "--no-color")
    assert result.exit_code == 0, result.stderr
    keys_of = {"encoder self-attention": source, "decoder self-attention": target,
               "cross-attention (decoder query -> encoder key)": source}
    seen, kind = set(), None
    for line in result.stdout.splitlines():
        title = line.split(": layer")[0]
        if title in keys_of:
            kind = title
            seen.add(kind)
        elif line.startswith("rows: "):
            kind = None
        elif kind and line[:1].isdigit():
            named = re.findall(r"(\d+) (\S+) \d\.\d\d", line.split("  ", 2)[-1])
            assert named and all(keys_of[kind][int(k)] == token for k, token in named), (kind, line)
    assert seen == set(keys_of), seen


def test_heads_selects_the_same_head_in_every_kind_of_attention(cli, tmp_path):
    """--heads 1 keeps head 1 of the encoder's, the decoder's and the cross attention, in --save and in JSON:
    each the same numbers as head 1 of an all-heads run."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    runs = {}
    for heads in ("all", "1"):
        saved = tmp_path / f"heads-{heads}.safetensors"
        (record,) = records(cli("encode", "time flies", "--model", str(path), "--target", "like an arrow", "--json",
                                "--heads", heads, "--top-k", "0", "--save", str(saved)))
        runs[heads] = load_file(str(saved)), {(m["kind"], m["head"]): m["weights"] for m in record["attention"]}
    (every, every_json), (one, one_json) = runs["all"], runs["1"]
    for name in ("encoder.attention.0", "decoder.attention.0", "decoder.cross_attention.0"):
        assert one[name].shape[1] == 1 and torch.equal(one[name], every[name][:, 1:2]), name
    assert set(one_json) == {("encoder", 1), ("decoder", 1), ("cross", 1)}
    assert all(one_json[key] == every_json[key] for key in one_json)



DECODER = ENCODER.replace("architecture: encoder", "architecture: decoder").replace("head: mlm", "head: lm") \
    + "norm_position: pre\ntype_vocab_size: 0\n"


@pytest.mark.parametrize("architecture", ["encoder", "decoder", "encoder-decoder"])
def test_the_capture_estimate_at_its_boundary(cli, tmp_path, architecture):
    """Attention weights cost 4 bytes each in float32: per layer and head, text x text for an encoder's or a
    decoder's self-attention; an encoder-decoder's encoder layers text x text, its decoder layers target x
    target (self-attention) and target x text (cross-attention). Exactly that many bytes of --max-capture-mb
    are enough, a byte less is refused. The --target is longer than the text, so an estimate that left it out
    (or the cross-attention) would let too much through."""
    path = tmp_path / "model.yaml"
    config = {"encoder": ENCODER, "decoder": DECODER,
              "encoder-decoder": SEQ2SEQ.replace("num_decoder_layers: 1", "num_decoder_layers: 2")}[architecture]
    path.write_text(config, encoding="utf-8")
    target = ["--target", "like an arrow over the old town at dawn"] if architecture == "encoder-decoder" else []
    text = "time flies" if target else "the animal did not cross the street because it was too tired"
    args = ("encode", text, "--model", str(path), *target, "--top-k", "0", "--json")
    (record,) = records(cli(*args))
    text = len(record["ids"])
    if architecture == "encoder-decoder":
        target_length, heads = len(record["target_ids"]), 2
        assert target_length > text
        attention = heads * 4 * (1 * text * text + 2 * (target_length * target_length + target_length * text))
        maps = (f"2 heads x {text}^2 positions x 1 layer in the encoder, "
                f"{target_length} x ({target_length} + {text}) positions x 2 layers in the decoder")
    else:
        attention = 4 * 4 * 2 * text * text  # 4 heads, 4 bytes, 2 layers
        maps = f"4 heads x {text}^2 positions x 2 layers"
    fits = cli(*args, "--max-capture-mb", repr(attention / 2**20))
    assert fits.exit_code == 0, fits.stderr
    refused = cli(*args, "--max-capture-mb", repr((attention - 1) / 2**20))
    assert refused.exit_code == 1 and refused.stdout == ""
    assert f"of {text} tokens would capture {attention / 1024:.1f} KB of attention ({maps})" in refused.stderr


HINT = "hint: capture fewer layers with --layers (e.g. --layers -1) or heads with --heads, use shorter texts, " \
       "or raise --max-capture-mb"


@pytest.mark.parametrize("heads,layers,length,args,size,maps", [
    (1, 1, 15, [], "900 bytes", "1 head x 15^2 positions x 1 layer"),  # 15 x 15 x 4 bytes
    (1, 1, 16, [], "1.0 KB", "1 head x 16^2 positions x 1 layer"),  # 1024 bytes
    (1, 1, 512, [], "1.0 MB", "1 head x 512^2 positions x 1 layer"),  # 2**20 bytes
    (16, 4, 4096, [], "4.0 GB", "16 heads x 4096^2 positions x 4 layers"),
    (16, 4, 65536, [], "1,024.0 GB", "16 heads x 65536^2 positions x 4 layers"),  # no unit above GB
    (16, 4, 4096, ["--heads", "3", "--layers", "-1"], "64.0 MB", "1 head x 4096^2 positions x 1 layer"),
])
def test_a_refused_capture_says_its_size_as_people_read_it(cli, tmp_path, heads, layers, length, args, size, maps):
    """The refusal comes before the model runs, so even a terabyte of attention is only arithmetic: heads x
    L^2 x layers x 4 bytes, counting only the heads and layers asked for, in the largest unit under 1024."""
    path = tmp_path / "model.yaml"
    path.write_text(f"hidden_size: 32\nnum_hidden_layers: {layers}\nnum_attention_heads: {heads}\n"
                    f"intermediate_size: 64\nmax_position_embeddings: {length}\nhead: mlm\n", encoding="utf-8")
    text = " ".join(["word"] * (length - 2))  # and [CLS], [SEP]
    result = cli("encode", text, "--model", str(path), "--max-capture-mb", "0.0001", *args)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.splitlines()[-2:] == [
        f"error: one text of {length} tokens would capture {size} of attention ({maps}): more than "
        "--max-capture-mb 0.0001", HINT]


def capture_per_text(blocks: int, heads: int, length: int, target: int = 0) -> tuple[int, int, str]:
    """What docs/errors.md ("Memory") says one text of `length` tokens costs to capture (32 wide, float32, an
    MLM or LM head, every block and head): attention heads x L^2 per block (an encoder-decoder's decoder blocks:
    T x (T + L) for a target of T tokens); besides it, per stack 4 x blocks + 2 tensors of its queries x 32, and
    the logits twice (queries x 30522). Returns (attention bytes, other bytes, the maps as the messages say
    them)."""
    if not target:
        maps = f"{length}^2 positions x {blocks} layers"
        return 4 * heads * blocks * length * length, 4 * ((4 * blocks + 2) * length * 32 + 2 * length * 30522), maps
    maps = (f"{length}^2 positions x {blocks} layer in the encoder, "
            f"{target} x ({target} + {length}) positions x {blocks} layer in the decoder")
    attention = 4 * heads * blocks * (length * length + target * (target + length))
    other = 4 * ((4 * blocks + 2) * (length + target) * 32 + 2 * target * 30522)
    return attention, other, maps


@pytest.mark.parametrize("architecture", ["encoder", "decoder", "encoder-decoder"])
def test_texts_per_batch_are_the_limit_over_the_cost_of_one(cli, tmp_path, architecture):
    """Three texts of 7 tokens: a limit of exactly three texts' cost runs them together, silently; a byte less
    runs two at a time, and the note says what three would have held."""
    path = tmp_path / "model.yaml"
    path.write_text({"encoder": ENCODER, "decoder": DECODER, "encoder-decoder": SEQ2SEQ}[architecture],
                    encoding="utf-8")
    texts = ["time flies like an arrow"] * 3  # [CLS] time flies like an arrow [SEP]
    if architecture == "encoder-decoder":  # 1 block each side, 2 heads
        target, heads, shown = ["--target", "fruit flies"], "2 heads", ("632 bytes", "722.9 KB")
        attention, other, maps = capture_per_text(1, 2, 7, target=3)  # [start] fruit flies
    else:  # 2 blocks, 4 heads
        target, heads, shown = [], "4 heads", ("1.5 KB", "1.6 MB")
        attention, other, maps = capture_per_text(2, 4, 7)
    total = attention + other
    args = ("encode", *texts, "--model", str(path), *target, "--json", "--max-capture-mb")
    together = cli(*args, repr(3 * total / 2**20))
    assert together.exit_code == 0 and together.stderr.startswith("model: ")
    assert len(together.stderr.splitlines()) == 1, together.stderr
    limit = (3 * total - 1) / 2**20
    split = cli(*args, repr(limit))
    assert split.exit_code == 0 and split.stdout == together.stdout
    assert split.stderr.splitlines()[1:] == [
        f"warning: capturing 3 texts at once would hold {3 * total / 2**20:.1f} MB (per text: {shown[0]} of "
        f"attention ({heads} x {maps}), {shown[1]} of hidden states and logits); running 2 at a "
        f"time to stay under --max-capture-mb {limit:g}"]


def test_save_must_fit_all_its_texts_at_once(cli, encoder_yaml, tmp_path):
    """--save keeps every text in one batch: their attention together must fit (exactly is enough)."""
    saved = tmp_path / "run.safetensors"
    texts = ["time flies like an arrow"] * 3
    attention, _, _ = capture_per_text(2, 4, 7)
    fits = cli("encode", *texts, "--model", encoder_yaml, "--save", str(saved), "--max-capture-mb",
               repr(3 * attention / 2**20))
    assert fits.exit_code == 0 and saved.exists(), fits.stderr
    saved.unlink()
    limit = (3 * attention - 1) / 2**20
    refused = cli("encode", *texts, "--model", encoder_yaml, "--save", str(saved), "--max-capture-mb", repr(limit))
    assert refused.exit_code == 1 and not saved.exists()
    assert refused.stderr.splitlines()[-2:] == [
        f"error: --save keeps all 3 texts in one batch: {3 * attention / 1024:.1f} KB of attention to capture, more "
        f"than --max-capture-mb {limit:g}", HINT.replace("hint: ", "hint: save fewer texts per run, or ")]


def test_an_encoder_decoder_counts_its_layers_by_the_decoder(cli, tmp_path):
    """--layers indexes the blocks of the stack that feeds the head: an encoder-decoder's decoder, here 3
    blocks under a 1-block encoder (so -1 is decoder block 2, 3 is out of range, `all` shows block 2 in full)."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ.replace("num_decoder_layers: 1", "num_decoder_layers: 3"), encoding="utf-8")
    args = ("encode", "time flies", "--model", str(path), "--target", "like an arrow")
    (record,) = records(cli(*args, "--layers", "-1", "--json"))
    assert {(amap["kind"], amap["layer"]) for amap in record["attention"]} == {("decoder", 2), ("cross", 2)}
    assert [row["layer"] for row in record["lens"]] == [2]
    refused = cli(*args, "--layers", "3")
    assert refused.exit_code == 2 and "3 is out of range: the model has 3 layers" in refused.stderr
    shown = cli(*args, "--layers", "all", "--width", "200", "--no-color")
    assert shown.exit_code == 0, shown.stderr
    titles = [line for line in shown.stdout.splitlines() if ": layer " in line and "heads" in line]
    assert [title.split(",")[0] for title in titles] == (
        ["encoder self-attention: layer 0"] + [f"decoder self-attention: layer {i}" for i in range(3)]
        + [f"cross-attention (decoder query -> encoder key): layer {i}" for i in range(3)])


@pytest.mark.parametrize("architecture", ["encoder", "encoder-decoder"])
def test_the_pair_is_embedded_as_the_second_segment(cli, tmp_path, architecture):
    """With --pair, each token adds the segment embedding of its type id (0: the text, 1: the pair), in an
    encoder's embeddings as in an encoder-decoder's encoder (a config with segments, type_vocab_size 2)."""
    config = ENCODER if architecture == "encoder" else SEQ2SEQ.replace("type_vocab_size: 0", "type_vocab_size: 2")
    path = tmp_path / "model.yaml"
    path.write_text(config + "position: learned\nembedding_norm: false\n", encoding="utf-8")
    saved = tmp_path / "run.safetensors"
    (record,) = records(cli("encode", "time flies", "--pair", "like an arrow", "--model", str(path), "--json",
                            "--top-k", "0", "--save", str(saved)))
    (tokenized,) = records(cli("tokenize", "time flies", "--pair", "like an arrow", "--json"))
    assert tokenized["ids"] == record["ids"] and 0 in tokenized["type_ids"] and 1 in tokenized["type_ids"]
    model = tfcli.load_model(str(path))  # the same random weights (seed 0)
    embeddings = model.encoder.embeddings
    ids, types = torch.tensor(tokenized["ids"]), torch.tensor(tokenized["type_ids"])
    with torch.no_grad():
        expected = (model.embed_tokens.weight[ids] + embeddings.positions.weight[torch.arange(len(ids))]
                    + embeddings.segments.weight[types])
    name = "hidden.0" if architecture == "encoder" else "encoder.hidden.0"
    assert (load_file(str(saved))[name][0] - expected).abs().max() <= 1e-6


@pytest.mark.parametrize("norm", ["rmsnorm", "rmsnorm_plus_one"])
def test_random_weights_make_every_norm_a_unit_scale_rmsnorm(cli, tmp_path, norm):
    """Random weights start every norm at scale 1, as transformers initialises them: an RMSNorm's weight at 1,
    Gemma's (1 + weight) RMSNorm's at 0. So each norm's output is its input over its root mean square, and the
    final norm stage of `encode` has a root mean square of 1 (its norm is sqrt(tokens x hidden))."""
    path = tmp_path / "model.yaml"
    path.write_text(DECODER + f"norm: {norm}\nnorm_position: sandwich\nfinal_norm: true\n", encoding="utf-8")
    model = tfcli.load_model(str(path))
    x = torch.randn(3, 5, 32) * 4
    unit = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.config.layer_norm_eps)
    norms = [module for module in model.modules() if isinstance(module, torch.nn.RMSNorm)]
    assert len(norms) == 2 * 2 * 2 + 2  # before and after 2 sublayers in 2 blocks, the embeddings', the final
    with torch.no_grad():
        for module in norms:
            assert (module(x) - unit).abs().max() <= 1e-5, module
    (record,) = records(cli("encode", "time flies like an arrow", "--model", str(path), "--json", "--top-k", "0"))
    (final,) = [stage for stage in record["shapes"] if stage["stage"] == "final_norm.out"]
    tokens, hidden = final["shape"]
    assert final["norm"] == pytest.approx((tokens * hidden) ** 0.5, rel=1e-4)


def test_a_classifiers_head_stage_is_its_label_scores(cli, tmp_path):
    """A classifier's head row holds one score per label, however short the text: 5 labels, 3 tokens."""
    path = tmp_path / "classifier.yaml"
    path.write_text(ENCODER.replace("head: mlm", "head: classifier") + "labels: [a, b, c, d, e]\n", encoding="utf-8")
    (record,) = records(cli("encode", "hi", "--model", str(path), "--json"))
    assert len(record["ids"]) == 3
    (head,) = [stage for stage in record["shapes"] if stage["stage"] == "logits"]
    assert head["shape"] == [5] and head["params"] == 32 * 32 + 32 + 32 * 5 + 5  # tanh pooler, then the labels


@pytest.mark.parametrize("extra,expected", [
    ("", 30522 * 32 + 32 * 32 + 2 * 32 + 2 * 32),  # words, positions, segments, LayerNorm weight and bias
    ("embedding_size: 16\n", 30522 * 16 + 32 * 16 + 2 * 16 + 2 * 16 + 16 * 32 + 32),  # ALBERT: narrow, projected
    ("word_embed_proj_dim: 16\nfinal_norm: true\n", 30522 * 16 + 16 * 32 + 32 * 32 + 2 * 32),  # a decoder, words projected in (OPT)
])
def test_the_embeddings_stage_counts_every_embedding_parameter(cli, tmp_path, extra, expected):
    path = tmp_path / "model.yaml"
    path.write_text((DECODER if "word_embed" in extra else ENCODER) + extra, encoding="utf-8")
    (record,) = records(cli("encode", "hi", "--model", str(path), "--json"))
    assert record["shapes"][0]["stage"] == "blocks.0.resid_pre" and record["shapes"][0]["params"] == expected
    final = [stage["params"] for stage in record["shapes"] if stage["stage"] == "final_norm.out"]
    assert final == ([2 * 32] if "word_embed" in extra else [])  # the pre-norm decoder's last LayerNorm


def test_each_hidden_state_row_has_the_statistics_of_that_hidden_state(cli, minilm_dir, tmp_path):
    """A trained model (a random post-norm one gives every hidden state mean 0 and std 1, whichever is read):
    the embeddings row is `hidden.0`, block i's output row `hidden.{i + 1}`."""
    saved = tmp_path / "run.safetensors"
    (record,) = records(cli("encode", "time flies like an arrow", "--model", str(minilm_dir), "--json",
                            "--save", str(saved)))
    tensors = load_file(str(saved))
    rows = {stage["stage"]: stage for stage in record["shapes"]}
    names = ["blocks.0.resid_pre"] + [f"blocks.{i}.resid_post" for i in range(6)]
    for i, name in enumerate(names):
        values = tensors[f"hidden.{i}"][0].double()
        assert rows[name]["mean"] == pytest.approx(values.mean().item(), abs=1e-6), name
        assert rows[name]["std"] == pytest.approx(values.std(correction=0).item(), abs=1e-6), name
    assert len({rows[name]["std"] for name in names}) == len(names)  # each hidden state is told apart


def test_an_encoder_decoder_reports_each_text_of_a_padded_batch_as_alone(cli, tmp_path):
    """Two sources of different lengths share a padded batch: each one's record (stages, every map, the lens)
    is what it gets alone, sized to its own tokens, with none of the other's padding."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(SEQ2SEQ, encoding="utf-8")
    texts = ["time flies", "the animal did not cross the street because it was too tired"]
    args = ("--model", str(path), "--target", "le temps", "--json", "--top-k", "2")
    together = records(cli("encode", *texts, *args))
    for text, batched in zip(texts, together):
        (alone,) = records(cli("encode", text, *args))
        n = len(alone["ids"])
        assert [stage["shape"] for stage in batched["shapes"]] == [stage["shape"] for stage in alone["shapes"]]
        assert [stage["shape"][0] for stage in alone["shapes"] if stage["stage"].startswith("encoder")] == \
            [n] * sum(stage["stage"].startswith("encoder") for stage in alone["shapes"])
        for a, b in zip(batched["shapes"], alone["shapes"]):
            assert a["std"] == pytest.approx(b["std"], abs=1e-5), a["stage"]
        for a, b in zip(batched["attention"], alone["attention"]):
            assert (a["kind"], a["layer"], a["head"]) == (b["kind"], b["layer"], b["head"])
            assert torch.tensor(a["weights"]).shape == torch.tensor(b["weights"]).shape
            assert torch.allclose(torch.tensor(a["weights"]), torch.tensor(b["weights"]), atol=2e-4), a["kind"]
        assert [[t["id"] for t in p] for row in batched["lens"] for p in row["top"]] == \
            [[t["id"] for t in p] for row in alone["lens"] for p in row["top"]]
