"""`tfcli steer fit` against the same directions computed by hand from transformers' own modules: each text run
alone (no padding) through the checkpoint transformers saved, block L's output read with a forward hook on the block
module (transformers' hidden_states[L + 1], except for the last block, whose hidden state transformers gives after
the final norm), then repeng's pca_diff / pca_center (a PCA as scikit-learn centres it: torch.linalg.svd after
subtracting the mean, and scikit-learn's own PCA where it is installed) and steering-vectors' mean aggregator, in
float64, with no tfcli code. Then the files: the GGUF parsed by an independent struct parser here, by tfcli's
checkpoint reader and by the gguf package's reader; a file written as repeng's export_gguf writes it read by tfcli;
safetensors round trips; the refusals; the JSON keys. Then `steering_hooks` against a forward hook on transformers'
block that adds the vector to its output."""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch

import tfcli
from tfcli.commands.steer import core as steer
from tfcli.analysis.ablation import ablation
from tfcli.analysis.dataset import Line
from tfcli.analysis.vectors import gguf_bytes, load_vector, write_vector
from tfcli.errors import TfcliError
from tfcli.model.decoding import decode

PAIRS = [
    ("I love this sunny day", "I hate this rainy day"),
    ("what a wonderful gift", "what an awful gift"),
    ("the food was great and warm", "the food was bad"),
    ("she smiled at everyone", "she frowned at everyone in the room"),
    ("we won the game", "we lost the game"),
    ("good news arrived this morning", "bad news arrived"),
    ("the music is beautiful", "the music is terrible and loud"),
    ("thank you so much", "leave me alone"),
    ("a bright happy song", "a dark sad song"),
]
LAYERS = 3


def pairs_file(path, pairs=PAIRS):
    path.write_text("".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in pairs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, save_hf_model):
    """name -> (path, transformers model, block modules): a GPT-2 (LayerNorm) and a Llama with grouped-query
    attention (RMSNorm), 3 blocks each, on the BERT vocabulary so that the bundled tokenizer reads the texts, biases
    and norms random."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=30522, bos_token_id=101, eos_token_id=102, pad_token_id=0)
    made = {}
    for name, model_class, config, blocks in (
            ("gpt2", GPT2LMHeadModel, GPT2Config(n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, **sizes),
             lambda m: m.transformer.h),
            ("llama", LlamaForCausalLM, LlamaConfig(hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=48,
                                                    max_position_embeddings=64, **sizes),
             lambda m: m.model.layers)):
        path = tmp_path_factory.mktemp(name)
        hf = save_hf_model(model_class, config, path, perturb=True)
        made[name] = (path, hf, blocks(hf))
    return made


def tokenizer_of(path):
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source

    return load_tokenizer_for(resolve_source(str(path)))


def read_pairs(path, pairs=PAIRS):
    config = tfcli.load_model(str(path)).config
    tokenizer = tokenizer_of(path)
    return [steer.check_pair(config, tokenizer, Line(i, {"positive": p, "negative": n}))
            for i, (p, n) in enumerate(pairs, 1)]


def hf_representations(hf, blocks, ids_list):
    """{block: (2n, d) float64}: each text's last token at the output of each block, read with forward hooks on
    transformers' block modules, one text at a time."""
    rows = {layer: [] for layer in range(len(blocks))}
    for ids in ids_list:
        seen = {}
        handles = [block.register_forward_hook(
            lambda module, args, output, layer=layer: seen.__setitem__(
                layer, (output[0] if isinstance(output, tuple) else output)[0, -1].double()))
            for layer, block in enumerate(blocks)]
        try:
            with torch.no_grad():
                out = hf(torch.tensor([ids]), output_hidden_states=True)
        finally:
            for handle in handles:
                handle.remove()
        for layer in rows:
            rows[layer].append(seen[layer])
            if layer < len(blocks) - 1:  # transformers' hidden_states[L + 1] is block L's output, but the last's
                assert torch.allclose(seen[layer], out.hidden_states[layer + 1][0, -1].double(), atol=1e-6)
    return {layer: torch.stack(values) for layer, values in rows.items()}


def by_hand(h, method):
    """repeng's pca_diff / pca_center (up to sign) and steering-vectors' mean aggregator, in float64."""
    positive, negative = h[0::2], h[1::2]
    if method == "mean-diff":
        return (positive - negative).mean(0)
    if method == "pca-diff":
        train = positive - negative
    else:
        center = (positive + negative) / 2
        train = torch.stack([positive - center, negative - center], 1).reshape(h.shape)
    train = train - train.mean(0)
    _, _, vt = torch.linalg.svd(train)
    return vt[0]


@pytest.fixture(scope="module")
def fitted(checkpoints):
    """(name, method) -> (SteerFit, representations by hand, pairs)."""
    done = {}

    def get(name, method):
        if (name, method) not in done:
            path, hf, blocks = checkpoints[name]
            pairs = read_pairs(path)
            model = tfcli.load_model(str(path))
            result = steer.fit(model, tokenizer_of(path), pairs, method, list(range(LAYERS)), batch_size=4)
            hand = hf_representations(hf, blocks, [ids for pair in pairs
                                                   for ids in (pair.positive_ids, pair.negative_ids)])
            done[name, method] = (result, hand, pairs)
        return done[name, method]

    return get


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["pca-diff", "pca-center", "mean-diff"])
def test_directions_equal_the_methods_by_hand(fitted, name, method):
    result, hand, pairs = fitted(name, method)
    assert [fit.layer for fit in result.layers] == list(range(LAYERS))
    assert result.width == 32 and result.model_hint == name and result.pairs == len(PAIRS)
    for fit in result.layers:
        h = hand[fit.layer]
        expected = by_hand(h, method)
        ours = fit.direction
        assert ours.dtype == torch.float64
        if method == "mean-diff":
            assert (ours - expected).abs().max() < 1e-5  # the mean keeps its own sign and norm
            continue
        assert abs(float(ours.norm()) - 1) < 1e-9
        assert min((ours - expected).abs().max(), (ours + expected).abs().max()) < 1e-5
        # the sign: positives project above their negatives in at least as many pairs as below
        projected = h @ ours
        above = int((projected[0::2] > projected[1::2]).sum())
        below = int((projected[0::2] < projected[1::2]).sum())
        assert above >= below
        if above == below:  # a tie keeps scikit-learn's sign: the largest |entry| positive
            assert ours[ours.abs().argmax()] > 0


@pytest.mark.parametrize("method", ["pca-diff", "pca-center"])
def test_directions_equal_scikit_learns_pca(fitted, method):
    decomposition = pytest.importorskip("sklearn.decomposition")
    result, hand, _ = fitted("llama", method)
    for fit in result.layers:
        h = hand[fit.layer].numpy()
        train = h[::2] - h[1::2] if method == "pca-diff" else h - ((h[::2] + h[1::2]) / 2).repeat(2, axis=0)
        component = torch.from_numpy(decomposition.PCA(n_components=1, svd_solver="full").fit(train).components_[0])
        assert min((fit.direction - component).abs().max(), (fit.direction + component).abs().max()) < 1e-5


def test_the_separation_and_gap(fitted):
    result, hand, _ = fitted("gpt2", "pca-diff")
    for fit in result.layers:
        h = hand[fit.layer]
        projected = h @ fit.direction / fit.direction.norm()
        positive, negative = projected[0::2], projected[1::2]
        assert fit.separation == pytest.approx(float((positive > negative).double().mean()))
        assert fit.gap == pytest.approx(float((positive - negative).mean() / projected.std()), rel=1e-6)
        assert fit.separation >= 0.5


def test_the_residual_norm_is_the_texts_median(fitted):
    """resid_norm: the median norm of the block's output at the texts' last tokens (transformers' own), the scale a
    strength meets (issue 51, item 7: the view's `norm` column was the unit direction's, always 1)."""
    result, hand, _ = fitted("llama", "pca-diff")
    for fit in result.layers:
        assert fit.resid_norm == pytest.approx(float(hand[fit.layer].norm(dim=1).quantile(0.5)), rel=1e-5)


@pytest.mark.parametrize("method", ["pca-diff", "mean-diff"])
def test_the_fit_view_heads_every_column_and_says_what_best_means(cli, checkpoints, tmp_path, method):
    """Every column of the fit's table has a header, none is the unit direction's norm (always 1), the direction's
    norm is shown where it is not 1 (mean-diff), and the block marked best comes with what best means (issue 51,
    item 7)."""
    result = cli(*fit_args(checkpoints["gpt2"][0], pairs_file(tmp_path / "p.jsonl"), tmp_path / "v.gguf"),
                 "--method", method, "--width", "100", "--no-color")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    headers = re.split(r"\s{2,}", lines[rule - 1].strip())
    assert len(headers) == len(lines[rule].split()) and all(headers), lines[rule - 1:rule + 1]
    expected = ["block", "separated", "gap (sd)", "resid norm"] + (["|v|"] if method == "mean-diff" else [])
    assert headers == expected
    rows = [line.split() for line in lines[rule + 1:rule + 3]]
    assert [row[0] for row in rows] == ["1", "2"] and all(len(row) == len(headers) for row in rows)
    record = json.loads(cli(*fit_args(checkpoints["gpt2"][0], tmp_path / "p.jsonl", tmp_path / "w.gguf"), "--method",
                            method, "--json").stdout)
    best = max(record["layers"], key=lambda layer: (layer["separation"], layer["gap"]))["layer"]
    said = " ".join(lines[rule + 3:])
    assert f"best: block {best}, the highest share separated (then gap)" in said
    assert "It need not be the one to steer" in said and "resid norm: the median norm" in said


def test_a_batch_gives_what_texts_one_at_a_time_give(checkpoints):
    path = checkpoints["llama"][0]
    pairs = read_pairs(path)
    model, tokenizer = tfcli.load_model(str(path)), tokenizer_of(path)
    one = steer.representations(model, tokenizer, pairs, [0, 2], batch_size=1)
    many = steer.representations(model, tokenizer, pairs, [0, 2], batch_size=32)
    for layer in (0, 2):
        assert (one[layer] - many[layer]).abs().max() < 1e-5


def test_a_decoder_reads_each_text_as_a_prompt(checkpoints):
    pairs = read_pairs(checkpoints["gpt2"][0])
    for pair in pairs:
        for ids in (pair.positive_ids, pair.negative_ids):
            assert ids[0] == 101 and 102 not in ids  # [CLS] kept, the [SEP] the tokenizer appends left out


def test_default_layers_leave_out_block_0(checkpoints):
    config = tfcli.load_model(str(checkpoints["gpt2"][0])).config
    assert steer.chosen_layers(config, None) == [1, 2]
    assert steer.chosen_layers(config, "-1") == [2]
    with pytest.raises(TfcliError, match="out of range"):
        steer.chosen_layers(config, "5")


# ---------------------------------------------------------------- the files


def parse_gguf(data: bytes):
    """An independent minimal GGUF parser: (version, metadata {key: (type, value)}, tensors {name: (dims, type,
    values)}, data start)."""
    assert data[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos = 24

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode()

    metadata = {}
    for _ in range(n_kv):
        key = string()
        kind = take("I")
        metadata[key] = (kind, string() if kind == 8 else take({4: "I", 5: "i"}[kind]))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, take("I"), take("Q")))
    start = (pos + 31) // 32 * 32
    assert all(byte == 0 for byte in data[pos:start])
    tensors = {}
    for name, dims, kind, offset in infos:
        assert offset % 32 == 0
        tensors[name] = (dims, kind, struct.unpack_from(f"<{dims[0]}f", data, start + offset))
    return version, metadata, tensors, start


def test_fit_writes_a_llama_cpp_control_vector(cli, checkpoints, fitted, tmp_path):
    path = checkpoints["gpt2"][0]
    output = tmp_path / "happy.gguf"
    result = cli("steer", "fit", "-m", str(path), "--pairs", str(pairs_file(tmp_path / "pairs.jsonl")), "-o",
                 str(output), "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert set(record) == {"layers", "method", "model_hint", "width", "output"}
    assert record["method"] == "pca-diff" and record["model_hint"] == "gpt2" and record["width"] == 32
    assert record["output"] == str(output)
    assert [layer["layer"] for layer in record["layers"]] == [1, 2]  # block 0 left out by default
    assert all(set(layer) == {"layer", "separation", "gap", "resid_norm"} for layer in record["layers"])
    assert "every block but 0" in result.stderr

    data = output.read_bytes()
    version, metadata, tensors, _ = parse_gguf(data)
    assert version == 3
    assert metadata == {"general.architecture": (8, "controlvector"), "controlvector.model_hint": (8, "gpt2"),
                        "controlvector.layer_count": (4, 2)}
    expected, _, _ = fitted("gpt2", "pca-diff")
    by_layer = expected.directions
    assert set(tensors) == {"direction.1", "direction.2"}
    for name, (dims, kind, values) in tensors.items():
        assert dims == [32] and kind == 0
        assert (torch.tensor(values, dtype=torch.float64) - by_layer[int(name.split(".")[1])]).abs().max() < 1e-6

    loaded = load_vector(output, tfcli.load_model(str(path)).config)
    assert set(loaded) == {1, 2}
    for layer, values in loaded.items():
        assert values.dtype == torch.float32 and (values.double() - by_layer[layer]).abs().max() < 1e-6


def test_tfcli_checkpoint_reader_and_gguf_read_the_file(tmp_path):
    pytest.importorskip("gguf")
    import gguf

    from tfcli.checkpoints.gguf import read_header

    directions = {3: torch.randn(40), 1: torch.randn(40)}
    path = tmp_path / "v.gguf"
    write_vector(path, directions, "llama")
    header = read_header(path)
    assert header.architecture == "controlvector"
    assert header.metadata["controlvector.model_hint"] == "llama"
    assert header.metadata["controlvector.layer_count"] == 2
    assert {name: (info.shape, info.type_name) for name, info in header.tensors.items()} == {
        "direction.1": ((40,), "F32"), "direction.3": ((40,), "F32")}
    reader = gguf.GGUFReader(path)
    assert bytes(reader.get_field("general.architecture").parts[-1]).decode() == "controlvector"
    for tensor in reader.tensors:
        assert torch.equal(torch.from_numpy(tensor.data.copy()), directions[int(tensor.name.split(".")[1])])


def test_a_file_written_as_repeng_writes_it_is_read(tmp_path):
    """repeng 0.4's ControlVector.export_gguf, line for line (gguf's GGUFWriter), read by tfcli."""
    pytest.importorskip("gguf")
    import gguf
    import numpy as np

    directions = {2: np.random.default_rng(0).normal(size=24).astype(np.float32),
                  1: np.random.default_rng(1).normal(size=24).astype(np.float32)}
    path = tmp_path / "repeng.gguf"
    writer = gguf.GGUFWriter(path, "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", len(directions))
    for layer in directions:
        writer.add_tensor(f"direction.{layer}", directions[layer])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = load_vector(path)
    assert list(loaded) == [1, 2]
    for layer, values in loaded.items():
        assert torch.equal(values, torch.from_numpy(directions[layer]))


def test_the_bytes_equal_ggufs_writer(tmp_path):
    """The hand-written file is byte for byte what gguf-py writes for the same metadata and tensors."""
    pytest.importorskip("gguf")
    import gguf
    import numpy as np

    arrays = {1: np.arange(7, dtype="<f4"), 4: -np.arange(7, dtype="<f4")}
    path = tmp_path / "theirs.gguf"
    writer = gguf.GGUFWriter(path, "controlvector")
    writer.add_string("controlvector.model_hint", "qwen2")
    writer.add_uint32("controlvector.layer_count", 2)
    for layer, array in arrays.items():
        writer.add_tensor(f"direction.{layer}", array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_bytes(arrays, "qwen2") == path.read_bytes()


def test_safetensors_round_trip(cli, checkpoints, tmp_path):
    from safetensors import safe_open

    path = checkpoints["llama"][0]
    output = tmp_path / "v.safetensors"
    result = cli("steer", "fit", "-m", str(path), "--pairs", str(pairs_file(tmp_path / "pairs.jsonl")), "-o",
                 str(output), "--layers", "0-", "--method", "mean-diff")
    assert result.exit_code == 0, result.stderr
    assert "wrote" in result.stdout and "separated" in result.stdout
    with safe_open(str(output), framework="pt") as f:
        assert f.metadata() == {"general.architecture": "controlvector", "controlvector.model_hint": "llama",
                                "controlvector.layer_count": "3"}
        stored = {name: f.get_tensor(name) for name in f.keys()}
    loaded = load_vector(output, tfcli.load_model(str(path)).config)
    assert set(stored) == {"direction.0", "direction.1", "direction.2"}
    for layer, values in loaded.items():
        assert torch.equal(values, stored[f"direction.{layer}"]) and values.dtype == torch.float32


# ---------------------------------------------------------------- refusals


def error_line(result) -> str:
    """The one `error:` line of a refusal (a note on the bundled tokenizer may come before it)."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def fit_args(path, pairs, output):
    return ("steer", "fit", "-m", str(path), "--pairs", str(pairs), "-o", str(output))


def test_a_bad_line_is_refused_naming_it_before_a_model_is_built(cli, checkpoints, tmp_path, no_model_built):
    path = checkpoints["gpt2"][0]
    pairs = tmp_path / "bad.jsonl"
    pairs.write_text('{"positive": "a b", "negative": "c d"}\n\n{"positive": "a b"}\n', encoding="utf-8")
    result = cli(*fit_args(path, pairs, tmp_path / "v.gguf"))
    assert result.exit_code == 2
    assert error_line(result) == "error: line 3: no `negative`"
    assert not (tmp_path / "v.gguf").exists()
    pairs.write_text('{"positive": "a b", "negative": "a b"}\n{"positive": "e", "negative": "f"}\n', encoding="utf-8")
    result = cli(*fit_args(path, pairs, tmp_path / "v.gguf"))
    assert result.exit_code == 2 and error_line(result).startswith("error: line 1: the positive and negative texts are")
    pairs.write_text('{"positive": "a b", "negative": "c d", "extra": 1}\n', encoding="utf-8")
    result = cli(*fit_args(path, pairs, tmp_path / "v.gguf"))
    assert result.exit_code == 2 and error_line(result).startswith("error: line 1: unknown key `extra`")
    # a pair has no optional key: the hint ends with the keys it has (issue 51, item 6: "... and optionally ")
    assert result.stderr.splitlines()[-1] == "hint: a line has positive, negative", result.stderr


@pytest.mark.parametrize("args, message", [
    (("--method", "pca"), "error: --method must be one of pca-diff, pca-center, mean-diff, got `pca`"),
    (("--layers", "7"), "error: --layers: 7 is out of range"),
    (("--layers", "0-"), "error: --layers includes block 0, which a llama.cpp control vector cannot hold"),
])
def test_bad_options_are_refused_before_a_model_is_built(cli, checkpoints, tmp_path, no_model_built, args, message):
    result = cli(*fit_args(checkpoints["gpt2"][0], pairs_file(tmp_path / "p.jsonl"), tmp_path / "v.gguf"), *args)
    assert result.exit_code == 2 and error_line(result).startswith(message)


def test_one_pair_an_unknown_format_and_a_missing_file(cli, checkpoints, tmp_path, no_model_built):
    path = checkpoints["gpt2"][0]
    result = cli(*fit_args(path, pairs_file(tmp_path / "p.jsonl", PAIRS[:1]), tmp_path / "v.gguf"))
    assert result.exit_code == 2 and "at least 2 pairs" in error_line(result)
    result = cli(*fit_args(path, pairs_file(tmp_path / "p.jsonl"), tmp_path / "v.npy"))
    assert result.exit_code == 2 and error_line(result).startswith("error: --output ") and "unknown format" in result.stderr
    result = cli(*fit_args(path, tmp_path / "none.jsonl", tmp_path / "v.gguf"))
    assert result.exit_code == 1 and error_line(result).startswith("error: --pairs ") and "no such file" in result.stderr  # a missing file: 1 (docs/errors.md)


def test_pairs_from_stdin(cli, checkpoints, tmp_path):
    text = "".join(json.dumps({"positive": p, "negative": n}) + "\n" for p, n in PAIRS)
    result = cli("steer", "fit", "-m", str(checkpoints["gpt2"][0]), "--pairs", "-", "-o", str(tmp_path / "v.gguf"),
                 "--json", input=text)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["layers"][0]["layer"] == 1


def test_an_existing_output_is_kept_unless_force(cli, checkpoints, tmp_path):
    output = tmp_path / "v.gguf"
    output.write_bytes(b"old")
    args = fit_args(checkpoints["gpt2"][0], pairs_file(tmp_path / "p.jsonl"), output)
    result = cli(*args)
    assert result.exit_code == 1 and error_line(result) == f"error: {output} already exists"
    assert output.read_bytes() == b"old"
    result = cli(*args, "--force")
    assert result.exit_code == 0 and output.read_bytes()[:4] == b"GGUF"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_a_model_gguf_is_refused(tmp_path):
    def kv(key, value):
        return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IQ", 8, len(value)) + value.encode()

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("general.architecture", "llama")
                     + kv("general.name", "SmolLM2"))
    with pytest.raises(TfcliError) as caught:
        load_vector(path)
    assert caught.value.message.startswith(f"{path} is a llama model, not a control vector")
    assert "\n" not in caught.value.message


def hostile_vector(case: str) -> bytes:
    """A control-vector GGUF with one thing wrong in its header (or nothing: "fine")."""
    def string(text):
        return struct.pack("<Q", len(text)) + text.encode()

    def kv(key, kind, value):
        return string(key) + struct.pack("<I", kind) + value

    def tensor(name, dims, offset=0):
        return string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
            struct.pack("<IQ", 0, offset)

    metadata = [kv("general.architecture", 8, string("controlvector")), kv("controlvector.model_hint", 8, string("x")),
                kv("controlvector.layer_count", 4, struct.pack("<I", 1))]
    tensors = [tensor("direction.1", [4])]
    if case == "nested":  # arrays of arrays, 10,000 deep: the reader's recursion must stop first
        metadata.append(string("deep") + struct.pack("<I", 9) + (struct.pack("<IQ", 9, 1)) * 10_000 +
                        struct.pack("<IQ", 4, 0))
    elif case == "key twice":
        metadata.append(metadata[1])
    elif case == "tensor twice":
        tensors.append(tensors[0])
    elif case in ("alignment 48", "alignment float"):
        metadata.append(kv("general.alignment", 4, struct.pack("<I", 48)) if case == "alignment 48" else
                        kv("general.alignment", 6, struct.pack("<f", 32.0)))
    elif case == "huge shape":  # its product wraps around in int64
        tensors = [tensor("direction.1", [2**32, 2**32, 4])]
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)) + b"".join(metadata) + b"".join(tensors)
    return header + bytes(-len(header) % 32) + struct.pack("<4f", 1, 2, 3, 4)


@pytest.mark.parametrize("case", ["nested", "key twice", "tensor twice", "alignment 48", "alignment float",
                                  "huge shape"])
def test_a_hostile_control_vector_is_one_error_line(tmp_path, cli, checkpoints, case):
    path = tmp_path / "v.gguf"
    path.write_bytes(hostile_vector("fine"))
    assert load_vector(path)[1].tolist() == [1.0, 2.0, 3.0, 4.0]  # the file is right but for the case
    path.write_bytes(hostile_vector(case))
    with pytest.raises(TfcliError) as caught:
        load_vector(path)
    assert caught.value.message.startswith(f"{path}: cannot read the GGUF file") and "\n" not in caught.value.message
    result = cli("generate", "-m", str(checkpoints["gpt2"][0]), "hi", "--steer", f"{path}:2", "-n", "2")
    assert result.exit_code == 1 and error_line(result).startswith(f"error: {path}: cannot read the GGUF file")
    assert "Traceback" not in result.stderr and "bug" not in result.stderr


def test_a_vector_of_another_width_or_block_is_refused(tmp_path, checkpoints):
    config = tfcli.load_model(str(checkpoints["gpt2"][0])).config
    for suffix in (".gguf", ".safetensors"):
        path = tmp_path / f"wide{suffix}"
        write_vector(path, {1: torch.ones(48)}, "gpt2")
        with pytest.raises(TfcliError, match=r"is 48 wide \(direction.1\) and .* is 32 wide"):
            load_vector(path, config)
        path = tmp_path / f"deep{suffix}"
        write_vector(path, {5: torch.ones(32)}, "gpt2")
        with pytest.raises(TfcliError, match="has direction.5, and .* has 3 blocks"):
            load_vector(path, config)
    with pytest.raises(TfcliError, match="cannot hold"):
        write_vector(tmp_path / "zero.gguf", {0: torch.ones(32)}, "gpt2")
    assert not (tmp_path / "zero.gguf").exists()


# ---------------------------------------------------------------- applying


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("normalize", [False, True])
def test_a_steered_pass_equals_transformers_with_a_hook(checkpoints, name, normalize):
    path, hf, blocks = checkpoints[name]
    model = tfcli.load_model(str(path))
    torch.manual_seed(1)
    first = {1: torch.randn(32), 2: torch.randn(32)}
    second = {2: torch.randn(32)}
    hooks = steer.steering_hooks(model, [first, second], [4.0, -2.5], normalize)
    assert set(hooks) == {"blocks.1.resid_post", "blocks.2.resid_post"}
    added = {1: 4.0 * first[1], 2: 4.0 * first[2] - 2.5 * second[2]}

    def adding(layer):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            steered = hidden + added[layer]
            if normalize:
                steered = steered / steered.norm(dim=-1, keepdim=True) * hidden.norm(dim=-1, keepdim=True)
            return (steered, *output[1:]) if isinstance(output, tuple) else steered
        return hook

    ids = torch.tensor([[101, 2023, 2003, 1037, 3231], [101, 2178, 2028, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    handles = [blocks[layer].register_forward_hook(adding(layer)) for layer in added]
    try:
        with torch.no_grad():
            theirs = hf(ids, attention_mask=mask).logits
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        ours = model.run_with_hooks(ids, hooks, attention_mask=mask)
        plain = model.run_with_hooks(ids, {}, attention_mask=mask)
    real = mask.bool()
    assert (ours[real] - theirs[real]).abs().max() < 1e-4
    assert (plain[real] - theirs[real]).abs().max() > 1e-2  # the vector does something


def test_steering_layers_pick_blocks(checkpoints):
    model = tfcli.load_model(str(checkpoints["gpt2"][0]))
    hooks = steer.steering_hooks(model, [{1: torch.ones(32), 2: torch.ones(32)}], [1.0], layers=[2])
    assert set(hooks) == {"blocks.2.resid_post"}
    with pytest.raises(TfcliError, match="does not fit"):
        steer.steering_hooks(model, [{1: torch.ones(48)}], [1.0])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_steered_generation_equals_transformers_generate_with_the_hook(checkpoints, name):
    """The hooks run on every pass of the generation loop, the prompt's and each new token's (with the KV cache):
    greedy tokens equal transformers' generate with the vector added to the block's output, and differ from the
    unsteered ones."""
    path, hf, blocks = checkpoints[name]
    model = tfcli.load_model(str(path))
    torch.manual_seed(2)
    vector = {1: 6.0 * torch.randn(32)}
    hooks = steer.steering_hooks(model, [vector], [1.0])

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        return (hidden + vector[1], *output[1:]) if isinstance(output, tuple) else hidden + vector[1]

    ids = torch.tensor([[101, 2023, 2003, 1037, 3231]])
    handle = blocks[1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            theirs = hf.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    finally:
        handle.remove()
    ours = model.generate(ids, max_new_tokens=8, hooks=hooks)
    plain = model.generate(ids, max_new_tokens=8)
    assert ours.tolist() == theirs.tolist()
    assert ours.tolist() != plain.tolist()  # the vector changes what is generated


def test_generate_steer_adds_the_file_s_vector_times_its_strength(cli, checkpoints, tmp_path):
    """`generate --steer FILE:STRENGTH` generates what transformers generates with the file's direction times the
    strength added to each block's output (greedy, JSON tokens); several --steer add up; --steer-layers picks the
    blocks; a strength that is not a number and a vector of another width are refused before the model is built."""
    path, hf, blocks = checkpoints["gpt2"]
    torch.manual_seed(3)
    vector = {1: torch.randn(32), 2: torch.randn(32)}
    file = tmp_path / "v.safetensors"
    write_vector(file, vector, "gpt2")

    def generated(*args):
        result = cli("generate", "-m", str(path), "this is a test", "-n", "6", "--json", *args)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout)["generated_ids"], result.stderr

    def transformers_generates(added):
        ids = torch.tensor([tokenizer_of(path).encode(["this is a test"])[0].ids[:-1]])  # a prompt: no [SEP]
        handles = [blocks[layer].register_forward_hook(
            lambda module, args, output, v=v: (output[0] + v, *output[1:]) if isinstance(output, tuple) else output + v)
            for layer, v in added.items()]
        try:
            with torch.no_grad():
                out = hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
        finally:
            for handle in handles:
                handle.remove()
        return out[0, ids.shape[1]:].tolist()

    steered, said = generated("--steer", f"{file}:3")
    assert steered == transformers_generates({1: 3 * vector[1], 2: 3 * vector[2]})[:len(steered)]
    assert "steering: " in said and "at blocks 1-2" in said
    twice, _ = generated("--steer", f"{file}:1", "--steer", f"{file}:2")
    assert twice == steered
    only, _ = generated("--steer", f"{file}:3", "--steer-layers", "2")
    assert only == transformers_generates({2: 3 * vector[2]})[:len(only)]
    plain, _ = generated()
    assert plain != steered  # it could fail: the vector changes the continuation


def test_generate_steer_refusals_come_before_the_model(cli, checkpoints, tmp_path, no_model_built):
    path = checkpoints["gpt2"][0]
    file = tmp_path / "wide.safetensors"
    write_vector(file, {1: torch.ones(48)}, "gpt2")
    for args, message, code in (([f"{file}:strong"], "the strength `strong` is not a number", 2),
                                ([str(file)], "is 48 wide", 1),  # a file that does not fit the model: 1
                                ([str(tmp_path / "none.gguf")], "no such file", 1)):
        result = cli("generate", "-m", str(path), "hello", "--steer", *args)
        assert result.exit_code == code and message in result.stderr, result.stderr
    result = cli("generate", "-m", str(path), "hello", "--steer-normalize")
    assert result.exit_code == 2 and "go with --steer" in result.stderr
    write_vector(file, {1: torch.ones(32)}, "gpt2", force=True)
    result = cli("generate", "-m", str(path), "hello", "--steer", str(file), "--steer-layers", "40")
    assert result.exit_code == 2 and error_line(result) == (  # issue 51, item 7: not "3 steer-layers"
        "error: --steer-layers: 40 is out of range: the model has 3 blocks"), result.stderr


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_ablate_zeroes_a_head_as_transformers_does(cli, checkpoints, name):
    """`generate --ablate L1H2` generates what transformers generates with head 2 of block 1 zeroed (its slice of
    the output projection's input, on every pass); `--ablate L1.mlp` the block's MLP output zeroed; unknown sites,
    heads the model lacks and mean-ablation while generating are refused."""
    path, hf, blocks = checkpoints[name]
    size = hf.config.hidden_size // hf.config.num_attention_heads
    o_proj = (lambda b: b.attn.c_proj) if name == "gpt2" else (lambda b: b.self_attn.o_proj)

    def zero_head(module, args):
        z = args[0].clone()
        z[..., 2 * size:3 * size] = 0
        return (z, *args[1:])

    def zero_output(module, args, output):
        return torch.zeros_like(output)

    ids = torch.tensor([tokenizer_of(path).encode(["this is a test"])[0].ids[:-1]])

    def transformers_generates(module, hook, pre):
        """The new tokens and each step's logits (6, V), with the hook on."""
        handle = module.register_forward_pre_hook(hook) if pre else module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                out = hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None,
                                  output_scores=True, return_dict_in_generate=True)
        finally:
            handle.remove()
        return out.sequences[0, ids.shape[1]:].tolist(), torch.cat(out.scores)

    model = tfcli.load_model(str(path))
    plain = torch.stack([step.logits[0] for step in decode(model, ids, max_new_tokens=6)])
    for spec, module, hook, pre in (("L1H2", o_proj(blocks[1]), zero_head, True),
                                    ("L1.mlp", blocks[1].mlp, zero_output, False)):
        hooks = ablation([spec], model.config, generating=True).hooks
        ours = torch.stack([step.logits[0] for step in decode(model, ids, max_new_tokens=6, hooks=hooks)])
        theirs, their_logits = transformers_generates(module, hook, pre)
        assert (ours - their_logits).abs().max() < 1e-4, spec
        assert (ours - plain).abs().max() > 1e-3  # the ablation changes the model: the comparison could fail
        result = cli("generate", "-m", str(path), "this is a test", "-n", "6", "--json", "--ablate", spec)
        assert result.exit_code == 0 and json.loads(result.stdout)["generated_ids"] == theirs[:6]
        assert f"ablating: {spec} (zeroed)" in result.stderr
    for args, message in ((["--ablate", "L1H9"], "has 4 heads per layer"), (["--ablate", "L1.mlp:mean"],
                          "zeroing only"), (["--ablate", "nothing.here"], "--ablate nothing.here: the model has no site"),
                          (["--ablate", "L1H2:half"], "`half` is not a way to ablate")):
        result = cli("generate", "-m", str(path), "hello", *args)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
