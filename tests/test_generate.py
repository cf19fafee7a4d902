"""Generation: KV cache, sampling, the step stream and `tfcli generate` (tiny models, so it stays fast)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import tfcli
from tfcli.cli import app
from tfcli.errors import TfcliError
from tfcli.model.decoding import Sampling, stream

TINY = {
    "decoder": "architecture: decoder\nnorm_position: pre\nfinal_norm: true\nembedding_norm: false\n"
               "type_vocab_size: 0\nhead: lm\neos_token_id: 102\n",
    "rotary": "architecture: decoder\nnorm_position: pre\nnorm: rmsnorm\nposition: rotary\nfeed_forward: gated\n"
              "hidden_act: silu\nnum_key_value_heads: 2\nfinal_norm: true\nembedding_norm: false\n"
              "type_vocab_size: 0\nhead: lm\ntie_word_embeddings: false\neos_token_id: 102\n",
    "seq2seq": "architecture: encoder-decoder\nnum_decoder_layers: 3\ntype_vocab_size: 0\nhead: lm\n"
               "tie_word_embeddings: false\ndecoder_start_token_id: 101\neos_token_id: 102\n",
    "encoder": "architecture: encoder\nhead: mlm\n",
}
SIZES = "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nintermediate_size: 48\nmax_position_embeddings: 24\n"
PROMPT = torch.tensor([[101, 1996, 4248, 2829, 4419]])


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    root = tmp_path_factory.mktemp("configs")
    paths = {}
    for name, text in TINY.items():
        paths[name] = root / f"tiny-{name}.yaml"
        paths[name].write_text(SIZES + text)
    return paths


@pytest.fixture(scope="module")
def models(configs):
    return {name: tfcli.load_model(str(path), seed=3) for name, path in configs.items() if name != "encoder"}


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output + result.stderr
    return result


def words(count: int) -> str:
    """A prompt of [CLS] + `count` tokens ([SEP] is dropped from a decoder's prompt)."""
    return " ".join(["word"] * count)


def forced_gpt2(path, vocab_size: int, token: int, eos_token_id: int | None) -> None:
    """Save a one-layer GPT-2 that always predicts `token`: every final hidden state is all ones (a zero LayerNorm
    weight, a bias of ones) and `token`'s embedding, tied to the head, points there."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=1, n_head=4, n_positions=32,
                                       eos_token_id=eos_token_id))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.transformer.wte.weight[token] = 10.0
    model.save_pretrained(path)


# ---------------------------------------------------------------- the decoding loop


@pytest.mark.parametrize("name", ["decoder", "rotary", "seq2seq"])
def test_cached_and_uncached_decoding_give_the_same_tokens(models, name):
    model = models[name]
    for options in (dict(), dict(do_sample=True, temperature=2.0, top_k=50, seed=5)):
        cached = model.generate(PROMPT, max_new_tokens=10, use_cache=True, **options)
        uncached = model.generate(PROMPT, max_new_tokens=10, use_cache=False, **options)
        assert cached.tolist() == uncached.tolist()
    start = 1 if name == "seq2seq" else PROMPT.shape[1]
    assert cached.shape[1] == start + 10 or cached[0, -1].item() == 102


def test_each_cached_step_feeds_one_token(models):
    model, lengths = models["rotary"], []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(args[0].shape[1]),
                                           with_kwargs=True)
    try:
        model.generate(PROMPT, max_new_tokens=6)
    finally:
        hook.remove()
    assert lengths[0] == PROMPT.shape[1] and set(lengths[1:]) <= {1}


def test_encoder_decoder_encodes_once_and_feeds_one_decoder_token(models):
    model, seen = models["seq2seq"], []
    model.encoder.register_forward_hook(lambda module, args, out: seen.append("encoder"))
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["decoder_input_ids"].shape[1]),
                                           with_kwargs=True)
    try:
        ids = model.generate(PROMPT, max_new_tokens=5)
    finally:
        hook.remove()
        model.encoder._forward_hooks.clear()
    assert seen.count("encoder") == 1 and [s for s in seen if s != "encoder"] == [1] * (ids.shape[1] - 1)
    assert ids[0, 0].item() == 101


def test_left_padded_batch_equals_each_prompt_alone(models):
    model = models["rotary"]
    short = torch.tensor([[101, 2829, 4419]])
    batch = torch.tensor([[101, 1996, 4248, 2829, 4419], [0, 0, 101, 2829, 4419]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    together = model.generate(batch, max_new_tokens=6, attention_mask=mask)
    assert together[0].tolist() == model.generate(PROMPT, max_new_tokens=6)[0].tolist()
    assert together[1, 2:].tolist() == model.generate(short, max_new_tokens=6)[0].tolist()


def test_sampling_is_seeded_and_filters(models):
    model = models["decoder"]
    greedy = model.generate(PROMPT, max_new_tokens=8)
    one = dict(do_sample=True, temperature=1.5, seed=1)
    assert model.generate(PROMPT, max_new_tokens=8, **one).tolist() == \
        model.generate(PROMPT, max_new_tokens=8, **one).tolist()
    assert model.generate(PROMPT, max_new_tokens=8, do_sample=True, top_k=1, seed=2).tolist() == greedy.tolist()
    assert model.generate(PROMPT, max_new_tokens=8, do_sample=True, top_p=1e-6, seed=2).tolist() == greedy.tolist()
    runs = {tuple(model.generate(PROMPT, max_new_tokens=8, do_sample=True, temperature=5.0, seed=s)[0].tolist())
            for s in range(3)}
    assert len(runs) > 1


def test_stream_reports_probabilities_and_the_lens(models):
    model = models["rotary"]
    steps = list(stream(model, PROMPT, max_new_tokens=4, lens=True, top=3))
    greedy = model.generate(PROMPT, max_new_tokens=4)[0, PROMPT.shape[1]:].tolist()
    assert [s.token_id for s in steps] == greedy[:len(steps)]
    for step in steps:
        assert step.top[0] == (step.token_id, pytest.approx(step.prob))
        assert len(step.lens) == model.config.num_hidden_layers + 1
        assert step.lens[-1][0] == step.token_id  # the last layer's lens is the model's own prediction


@pytest.mark.parametrize("options, message, parameter", [
    (dict(max_new_tokens=0), "max_new_tokens", "max_new_tokens"),
    (dict(do_sample=True, temperature=0.0), "temperature", "temperature"),
    (dict(do_sample=True, top_k=0), "top_k", "top_k"),
    (dict(do_sample=True, top_k=10**6), "larger than the vocabulary", "top_k"),
    (dict(do_sample=True, top_p=0.0), "top_p", "top_p"),
    (dict(do_sample=True, top_p=1.5), "top_p", "top_p"),
    (dict(max_new_tokens=100), "do not fit", None),
])
def test_bad_generation_options_are_usage_errors(models, options, message, parameter):
    """A usage error (exit 2) naming the Python parameter (the CLI says it as its option) with a hint."""
    with pytest.raises(TfcliError, match=message) as info:
        models["decoder"].generate(PROMPT, **{"max_new_tokens": 3, **options})
    assert info.value.exit_code == 2
    assert info.value.parameter == parameter
    assert info.value.hint or parameter == "max_new_tokens"


def test_model_without_lm_head_cannot_generate(configs):
    with pytest.raises(TfcliError, match="head is `mlm`"):
        tfcli.load_model(str(configs["encoder"])).generate(PROMPT, max_new_tokens=2)


# ---------------------------------------------------------------- tfcli generate


def test_cli_table_and_weights_statement(configs):
    result = invoke("generate", "time flies like", "-m", str(configs["decoder"]), "-n", "3", "--lens")
    assert result.exit_code == 0, result.stderr
    assert "random (seed 0)" in result.stderr
    assert result.stdout.startswith("time flies like")
    assert "top alternatives" in result.stdout and "lens" in result.stdout


def test_cli_samples_as_the_python_api_does(configs):
    """--temperature (and --top-k/--top-p) switch sampling on, seeded by --seed: the CLI's tokens are the ones
    model.generate(do_sample=True, ...) draws with the same seed, not the greedy ones."""
    result = invoke("generate", "time flies", "-m", str(configs["decoder"]), "-n", "6", "--json",
                    "--temperature", "3", "--top-k", "50", "--seed", "5")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    model = tfcli.load_model(str(configs["decoder"]), seed=5)
    prompt = torch.tensor([record["prompt_ids"]])
    sampled = model.generate(prompt, max_new_tokens=6, do_sample=True, temperature=3.0, top_k=50, seed=5)
    greedy = model.generate(prompt, max_new_tokens=6)
    assert record["generated_ids"] == sampled[0, prompt.shape[1]:].tolist()
    assert record["generated_ids"] != greedy[0, prompt.shape[1]:].tolist()


def test_top_k_up_to_the_vocabulary_size(configs, models):
    """--top-k as large as the vocabulary keeps every token: the same draws as sampling without it; one more
    is refused (exit 2, naming the vocabulary), by the CLI before the model is built and by model.generate."""
    args = ("generate", "time flies", "-m", str(configs["decoder"]), "-n", "6", "--json", "--temperature", "3",
            "--seed", "5")
    every = invoke(*args)
    assert every.exit_code == 0, every.stderr
    vocabulary = models["decoder"].config.vocab_size
    whole = invoke(*args, "--top-k", str(vocabulary))
    assert whole.exit_code == 0, whole.stderr
    assert json.loads(whole.stdout)["generated_ids"] == json.loads(every.stdout)["generated_ids"]
    beyond = invoke(*args, "--top-k", str(vocabulary + 1))
    assert beyond.exit_code == 2 and beyond.stdout == ""
    assert f"error: --top-k {vocabulary + 1} is larger than the vocabulary ({vocabulary})" in beyond.stderr
    with pytest.raises(TfcliError, match="larger than the vocabulary") as info:
        models["decoder"].generate(PROMPT, max_new_tokens=2, do_sample=True, top_k=vocabulary + 1)
    assert info.value.exit_code == 2


def test_a_prompt_of_only_the_appended_end_of_sequence_token(cli, tmp_path, save_hf_model):
    """A decoder drops the end-of-sequence token its tokenizer appends to a prompt; a prompt that is that token
    alone (text with no tokens of its own: a zero-width space) keeps it and generates from it, as GPT-2 generates
    from <|endoftext|> alone: the tokens transformers' generate gives from it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab = {"<unk>": 0, "</s>": 1, "time": 2, "flies": 3, "like": 4, "an": 5, "arrow": 6, "<pad>": 7}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["</s>", "<unk>", "<pad>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    config = GPT2Config(vocab_size=8, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=1,
                        eos_token_id=1, pad_token_id=7, initializer_range=0.5)
    hf = save_hf_model(GPT2LMHeadModel, config, tmp_path, seed=1)  # a seed whose model does not stop at once
    for prompt, ids in (("time flies", [2, 3]), ("time", [2]), ("\u200b", [1])):
        result = cli("generate", prompt, "--model", str(tmp_path), "-n", "6", "--json")
        assert result.exit_code == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["prompt_ids"] == ids
        with torch.no_grad():
            theirs = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=6, do_sample=False)
        assert record["generated_ids"] == theirs[0, len(ids):].tolist()
        assert len(record["generated_ids"]) == 6  # no early end of sequence: more than one token compared

def test_cli_json_keys(configs):
    result = invoke("generate", "time flies", "an arrow", "-m", str(configs["rotary"]), "-n", "4", "--json",
                    "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed", "7", "--lens")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [record["prompt"] for record in records] == ["time flies", "an arrow"]
    for record in records:
        assert set(record) == {"prompt", "ids", "prompt_ids", "generated_ids", "text", "steps"}
        assert record["ids"] == record["prompt_ids"] and record["prompt_ids"][-1] != 102  # [SEP] dropped
        assert [s["id"] for s in record["steps"]] == record["generated_ids"]
        assert 1 <= len(record["generated_ids"]) <= 4
        assert len(record["steps"][0]["lens"]) == 3 and len(record["steps"][0]["top"]) == 5
    again = invoke("generate", "time flies", "an arrow", "-m", str(configs["rotary"]), "-n", "4", "--json",
                   "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed", "7", "--lens")
    assert again.stdout == result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2-small", "encoder-decoder"])
def test_cli_on_bundled_configs(name):
    result = invoke("generate", "hello", "-m", name, "-n", "2", "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert "random (seed 0)" in result.stderr
    generated, steps = record["generated_ids"], record["steps"]
    # two new tokens, unless the first one ended the sequence
    assert len(generated) == 2 or (len(generated) == 1 and steps[0]["eos"] and steps[0]["id"] == 102)
    assert [step["id"] for step in steps] == generated
    assert all(step["id"] == step["top"][0]["id"] and 0 < step["prob"] <= 1 for step in steps)  # greedy
    if name == "encoder-decoder":
        assert record["prompt_ids"] == [101, 7592, 102]  # the encoder reads the text with its specials


def test_cli_checkpoint_without_and_with_tokenizer_files(tmp_path, save_hf_model):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0,
                        eos_token_id=102)
    save_hf_model(GPT2LMHeadModel, config, tmp_path)
    bare = invoke("generate", "hello world", "-m", str(tmp_path), "-n", "3", "--json")
    assert bare.exit_code == 0, bare.stderr
    assert json.loads(bare.stdout)["prompt_ids"] == [101, 7592, 2088]  # bundled BERT vocabulary
    assert "weights: loaded from" in bare.stderr
    assert f"{tmp_path} has no tokenizer files" in bare.stderr and "using the bundled" in bare.stderr

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["hello world", "time flies like an arrow"] * 10,
                                  trainers.BpeTrainer(vocab_size=60, show_progress=False))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    own = invoke("generate", "hello world", "-m", str(tmp_path), "-n", "3", "--json")
    assert own.exit_code == 0, own.stderr
    assert "tokenizer files" not in own.stderr
    assert json.loads(own.stdout)["prompt_ids"] == tokenizer.encode("hello world").ids


@pytest.mark.parametrize("args,message", [
    (["generate"], "no text given"),
    (["generate", ""], "empty"),
    (["generate", "   "], "whitespace"),
    (["generate", "hi", "-n", "0"], "--max-new-tokens"),
    (["generate", "hi", "-n", "-3"], "--max-new-tokens"),
    (["generate", "hi", "--temperature", "0"], "temperature"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-k", "0"], "top-k"),
    (["generate", "hi", "--top-p", "0"], "top-p"),
    (["generate", "hi", "--top-p", "1.5"], "top-p"),
    (["generate", "hi", "--greedy", "--temperature", "0.5"], "--greedy"),
])
def test_cli_bad_input_is_a_usage_error(configs, args, message):
    result = invoke(*args, "-m", str(configs["decoder"]))
    assert result.exit_code == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and message in error[0]
    assert result.stdout == ""


@pytest.mark.parametrize("model,says", [
    ("architecture: encoder\nhead: mlm\n", "head is `mlm` (encoder)"),
    ("architecture: decoder\nnorm_position: pre\nhead: classifier\nnum_labels: 2\n",
     "head is `classifier` (decoder)"),  # a decoder alone does not make a generator
])
def test_cli_model_that_cannot_generate(tmp_path, model, says):
    (tmp_path / "model.yaml").write_text(SIZES + model)
    result = invoke("generate", "hi", "-m", str(tmp_path / "model.yaml"))
    assert result.exit_code == 2 and says in result.stderr, result.stderr
    assert "hint: use a decoder or encoder-decoder with `head: lm`" in result.stderr


def test_cli_stops_at_the_end_of_the_position_table(configs):
    result = invoke("generate", words(18), "-m", str(configs["decoder"]), "-n", "20", "--json")
    assert result.exit_code == 0, result.stderr
    assert "only 5 new tokens fit" in result.stderr
    assert len(json.loads(result.stdout)["generated_ids"]) <= 5


def test_wordpiece_continuation_joins_the_prompt_and_the_text_shows_once(tmp_path):
    """A continuation that starts inside a word (`##beau`) is decoded after the prompt: `text` is `beau...`,
    not `##beau ...`; and the text is on stdout once, whether it streamed there (a terminal) or not."""
    beau = tfcli.load_tokenizer().token_to_id("##beau")
    forced_gpt2(tmp_path, 30522, beau, 102)
    record = json.loads(invoke("generate", "time flies like", "-m", str(tmp_path), "-n", "3", "--json").stdout)
    assert record["generated_ids"] == [beau] * 3 and record["text"] == "beaubeaubeau"
    for terminal in ([], ["--color"]):  # --color: stdout is treated as a terminal, the text streams there
        result = invoke("generate", "time flies like", "-m", str(tmp_path), "-n", "3", *terminal)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.count("time flies likebeaubeaubeau") == 1, result.stdout


def test_an_encoder_decoders_text_is_its_new_tokens_decoded(configs):
    """The prompt is the encoder's input, not text the decoder continues: `text` is the new tokens alone."""
    (record,) = [json.loads(line) for line in invoke("generate", "time flies like an arrow", "-m",
                                                     str(configs["seq2seq"]), "-n", "5", "--json").stdout.splitlines()]
    assert record["prompt"] == "time flies like an arrow"
    assert record["text"] == tfcli.load_tokenizer().decode(record["generated_ids"])
    assert record["text"] == record["text"].strip()


def test_a_byte_level_token_is_shown_as_the_text_it_decodes_to(tmp_path):
    """GPT-2-style byte-level BPE: the step's token is ` world`, as it reads, not the vocabulary entry `Ġworld`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["hello world", "time flies like an arrow"] * 10,
                                  trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    world = tokenizer.token_to_id("Ġworld")
    forced_gpt2(tmp_path, tokenizer.get_vocab_size(), world, None)
    record = json.loads(invoke("generate", "hello", "-m", str(tmp_path), "-n", "2", "--json").stdout)
    assert record["generated_ids"] == [world, world]
    assert [step["token"] for step in record["steps"]] == [" world", " world"]
    assert record["text"] == " world world"


def test_an_encoder_decoders_budget_is_its_decoders_positions_whatever_the_prompt(configs, tmp_path):
    """The decoder starts from one token, so it can make max_position_embeddings - 1 new tokens (23 here) however
    long the encoder's prompt is; one more asked for stops at the end of its table, with a warning."""
    path = tmp_path / "seq2seq.yaml"
    path.write_text(configs["seq2seq"].read_text().replace("eos_token_id: 102", "eos_token_id: null"))
    prompt = "one two three four five six seven eight nine ten"  # 12 tokens with [CLS] and [SEP]
    for asked in (23, 24):
        result = invoke("generate", prompt, "-m", str(path), "-n", str(asked), "--json")
        assert result.exit_code == 0, result.stderr
        assert len(json.loads(result.stdout)["generated_ids"]) == 23
        assert ("only 23 new tokens fit in the model's 24 positions" in result.stderr) == (asked == 24), result.stderr


def test_the_python_api_generates_greedily_twenty_tokens_by_default(models, peaked_gpt2):
    """`model.generate(ids)` as docs/python-api.md describes it: greedy, 20 new tokens; with do_sample,
    temperature 1."""
    model, prompt = models["rotary"], PROMPT[:, :4]  # 4 + 20 tokens fill its 24 positions
    greedy = model.generate(prompt)
    assert greedy.shape == (1, 4 + 20) or greedy[0, -1].item() == 102
    assert torch.equal(greedy, model.generate(prompt, max_new_tokens=20, do_sample=False))
    model = tfcli.load_model(str(peaked_gpt2[0]))  # confident predictions: a temperature shows in what is drawn
    default = [model.generate(PROMPT, max_new_tokens=8, do_sample=True, seed=seed) for seed in range(4)]
    runs = {t: [model.generate(PROMPT, max_new_tokens=8, do_sample=True, temperature=t, seed=seed) for seed in range(4)]
            for t in (1.0, 2.0)}
    assert all(torch.equal(a, b) for a, b in zip(default, runs[1.0]))
    assert not all(torch.equal(a, b) for a, b in zip(default, runs[2.0]))


def test_a_token_that_is_part_of_a_character_shows_its_vocabulary_entry(tmp_path):
    """A byte-level token holding half of `é` decodes to U+FFFD; the step shows its vocabulary entry instead."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    half = tokenizer.token_to_id("Ã")  # the byte 0xC3, which starts é
    assert tokenizer.decode([half]) == "\ufffd"
    forced_gpt2(tmp_path, tokenizer.get_vocab_size(), half, None)
    record = json.loads(invoke("generate", "hello", "-m", str(tmp_path), "-n", "1", "--json").stdout)
    assert [(step["id"], step["token"]) for step in record["steps"]] == [(half, "Ã")]


def test_the_table_says_when_generation_stopped_at_the_end_of_sequence(tmp_path):
    forced_gpt2(tmp_path, 30522, 102, 102)  # always [SEP], the end of sequence
    result = invoke("generate", "time flies", "-m", str(tmp_path), "-n", "5", "--width", "200")
    assert result.exit_code == 0, result.stderr
    assert "stopped at end of sequence" in result.stdout
    forced_gpt2(tmp_path, 30522, 2051, 102)  # always `time`: it runs to -n
    assert "5 new tokens" in invoke("generate", "time flies", "-m", str(tmp_path), "-n", "5", "--width", "200").stdout


@pytest.mark.parametrize("count, says", [
    (23, "the prompt has 24 tokens, which fill the model's 24 positions: no room for a new token"),
    (40, "the prompt has 41 tokens, more than the model's 24 positions"),
])
def test_a_prompt_that_fills_the_position_table_is_refused_before_a_model_is_built(configs, no_model_built, count,
                                                                                   says):
    """The tiny decoder has 24 positions: a prompt of 24 tokens or more leaves no room for a new token, a usage
    error that says so before any model is built (of a real size, that would be a long wait for a refusal)."""
    result = invoke("generate", words(count), "-m", str(configs["decoder"]), "-n", "3")
    assert result.exit_code == 2 and result.stdout == ""
    assert f"error: {says}\nhint: shorten the prompt\n" in result.stderr


def test_a_prompt_one_short_of_the_position_table_makes_one_token(configs):
    """A 23-token prompt in the tiny decoder's 24 positions makes exactly one new token, with a warning; an
    encoder-decoder's prompt may fill its encoder's table (its decoder starts from one token)."""
    result = invoke("generate", words(22), "-m", str(configs["decoder"]), "-n", "3", "--json")
    assert result.exit_code == 0, result.stderr
    assert "only 1 new token fit in the model's 24 positions" in result.stderr
    assert len(json.loads(result.stdout)["generated_ids"]) == 1
    result = invoke("generate", words(22), "-m", str(configs["seq2seq"]), "-n", "2", "--json")  # 24 with [SEP]
    assert result.exit_code == 0, result.stderr  # an encoder-decoder's prompt may fill its encoder's table
    assert len(json.loads(result.stdout)["prompt_ids"]) == 24
