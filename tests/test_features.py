"""`tfcli features` against the SAE libraries' own code, on activations taken from transformers' own modules.

Random SAEs are written in every format inside the tests (no network): SAELens's (by sae-lens 6.54's `save_model`:
standard, topk, jumprelu, gated, transcoder, skip transcoder, jumprelu transcoder; with and without b_dec applied to
the input, with its normalisations, rescale_acts_by_decoder_norm and hook_head_index), Gemma Scope's params.npz and
Gemma Scope 2's params.safetensors + config.json, Llama Scope's hyperparams.json + checkpoints/final.safetensors (all
three read by sae-lens's own loaders, their download replaced by the local file) and EleutherAI sparsify's
(`SparseCoder.save_to_disk`: top-k, groupmax, a skip transcoder). tfcli's features and reconstructions, from its own
site values, equal the library's `encode`/`decode` (sparsify's `encode`/`decode`/`forward`) on the value transformers'
module gives (a forward hook), to 1e-5 of scale. The losses with the reconstruction spliced in equal transformers'
own with the module's output replaced by hand. Then the corpus mode, the CLI (JSON keys, views, refusals before any
model is built) and --report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy
import pytest
import torch

import tfcli
from conftest import LazyModule
from tfcli.commands.features import core
from tfcli.analysis.dataset import line_of
from tfcli.analysis.sae import check_fit, fit, read_sae
from tfcli.api import load_tokenizer_for
from tfcli.errors import TfcliError
from tfcli.render.layout import screen_text, token_label
from tfcli.sources import resolve_source

# imported by the first test that uses them (conftest's LazyModule): seconds that the other test process never spends
SAE_LENS = ("sae-lens 6.54 is the reference: pip install --no-deps sae-lens==6.54.0 transformer-lens==3.9.0 "
            "(docs/commands.md#features)")
lens = LazyModule("sae_lens.saes", SAE_LENS)
loaders = LazyModule("sae_lens.loading.pretrained_sae_loaders", SAE_LENS)

TEXT = "When Mary and John went to the store, John gave a drink to"
TEXTS = [TEXT, "the cat sat on the mat", "time flies like an arrow and fruit flies like a banana"]


def close(ours, theirs, what: str, tolerance: float = 1e-5) -> None:
    """Within `tolerance` of the reference's scale (its largest |value|, at least 1)."""
    ours, theirs = (torch.as_tensor(v).detach().double() for v in (ours, theirs))
    assert ours.shape == theirs.shape, f"{what}: {tuple(ours.shape)} != {tuple(theirs.shape)}"
    scale = max(1.0, float(theirs.abs().max()))
    assert float((ours - theirs).abs().max()) <= tolerance * scale, f"{what}: off by {(ours - theirs).abs().max()}"


def load(path):
    return tfcli.load_model(str(path)), load_tokenizer_for(resolve_source(str(path)))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory, save_hf_model):
    """A 2-block GPT-2 saved by transformers (biases and norms random) on the bundled BERT vocabulary."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.2)
    hf = save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    return (path, hf, *load(path))


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory, save_hf_model):
    """A 2-block Gemma 2 (RMSNorm, grouped-query attention, the sandwich norms around its MLP)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    path = tmp_path_factory.mktemp("gemma2")
    config = Gemma2Config(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                          bos_token_id=101, eos_token_id=102, pad_token_id=0, sliding_window=16)
    hf = save_hf_model(Gemma2ForCausalLM, config, path, perturb=True)
    return (path, hf, *load(path))


def ids_of(tokenizer, model, text: str) -> list[int]:
    return core.check_text(model.config, tokenizer, line_of(1, {"text": text}, core.FEATURES_LINE)).ids


def hf_value(hf, module, ids: list[int], into: bool = False) -> torch.Tensor:
    """What transformers' `module` computes (its output, or with `into` its input) on ids: (T, ...)."""
    kept = {}

    def keep(_, args, output=None):
        value = args[0] if into else output
        kept["value"] = (value[0] if isinstance(value, tuple) else value).detach()

    handle = module.register_forward_pre_hook(keep) if into else module.register_forward_hook(keep)
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        handle.remove()
    return kept["value"][0]


def randomized(sae, threshold: float = 0.0, scale: float = 0.3):
    """An sae-lens SAE with every parameter random (a jumprelu threshold in [0, 2 x threshold], so that it matters)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in sae.named_parameters():
            param.normal_(0, scale)
            if name == "threshold":
                param.uniform_(0, 2 * threshold)
    return sae


def written(sae, path: Path, hook: str, **metadata) -> Path:
    sae.cfg.metadata.hook_name = hook
    for key, value in metadata.items():
        setattr(sae.cfg.metadata, key, value)
    sae.save_model(path)
    return path


def ours_on(setup, folder, text: str = TEXT):
    """tfcli's SAE, the site values of its pass and its Fitted on `text`."""
    _, _, model, tokenizer = setup
    sae = read_sae(folder)
    check_fit(sae, model.site_shapes())
    ids = ids_of(tokenizer, model, text)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]), names=[sae.site] + ([sae.site_out] if sae.site_out
                                                                                 else []))
    return sae, ids, fit(sae, cache)


# ------------------------------------------------------------------------------------------------- SAELens


def gpt2_blocks(hf):
    return hf.transformer.h


SAELENS_CASES = {  # name -> (the SAE, its hook, transformers' module and whether its input, head index)
    "standard": (lambda: lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64)), "blocks.1.hook_resid_post"),
    "standard, no b_dec at the input, layer_norm": (lambda: lens.StandardSAE(lens.StandardSAEConfig(
        d_in=32, d_sae=64, apply_b_dec_to_input=False, normalize_activations="layer_norm")), "blocks.0.hook_mlp_out"),
    "standard, constant_norm_rescale": (lambda: lens.StandardSAE(lens.StandardSAEConfig(
        d_in=32, d_sae=64, normalize_activations="constant_norm_rescale")), "blocks.1.hook_resid_pre"),
    "topk": (lambda: lens.TopKSAE(lens.TopKSAEConfig(d_in=32, d_sae=64, k=6)), "blocks.1.hook_resid_post"),
    "topk, rescaled by the decoder's norm": (lambda: lens.TopKSAE(lens.TopKSAEConfig(
        d_in=32, d_sae=64, k=6, rescale_acts_by_decoder_norm=True)), "blocks.0.hook_attn_out"),
    "jumprelu": (lambda: lens.JumpReLUSAE(lens.JumpReLUSAEConfig(d_in=32, d_sae=64)), "blocks.1.hook_resid_mid"),
    "gated": (lambda: lens.GatedSAE(lens.GatedSAEConfig(d_in=32, d_sae=64)), "blocks.1.hook_resid_post"),
    "attn.z, flattened over heads": (lambda: lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64)),
                                     "blocks.1.attn.hook_z"),
}


def reference_site(hf, hook: str, ids: list[int]) -> torch.Tensor:
    """The value transformers' GPT-2 gives for a TransformerLens hook name: (T, d)."""
    block = gpt2_blocks(hf)[int(hook.split(".")[1])]
    leaf = hook.split(".", 2)[2]
    if leaf == "hook_resid_post":
        return hf_value(hf, block, ids)
    if leaf == "hook_resid_pre":
        return hf_value(hf, block, ids, into=True)
    if leaf == "hook_resid_mid":
        return hf_value(hf, block.ln_2, ids, into=True)
    if leaf == "hook_mlp_out":
        return hf_value(hf, block.mlp, ids)
    if leaf == "hook_attn_out":
        return hf_value(hf, block.attn, ids)
    if leaf == "attn.hook_z":  # the input of the output projection: the heads' values, head after head
        return hf_value(hf, block.attn.c_proj, ids, into=True)
    if leaf == "ln2.hook_normalized":
        return hf_value(hf, block.ln_2, ids)
    raise AssertionError(hook)


@pytest.mark.parametrize("case", SAELENS_CASES)
def test_saelens_features_and_reconstruction_equal_sae_lens(gpt2, tmp_path, case):
    make, hook = SAELENS_CASES[case]
    reference = randomized(make(), threshold=0.3).eval()
    folder = written(reference, tmp_path / "sae", hook)
    sae, ids, ours = ours_on(gpt2, folder)
    x = reference_site(gpt2[1], hook, ids)
    close(ours.x[0], x, "the site's value", 1e-4)  # tfcli's activations are transformers'
    with torch.no_grad():
        features, recon = reference.encode(x), reference(x)
    close(ours.features[0], features, f"{case}: features")
    close(ours.reconstruction[0], recon, f"{case}: reconstruction")
    assert 0 < int((features > 0).sum()) < features.numel()  # some features active, not all


def test_a_head_index_reads_one_head_of_z(gpt2, tmp_path):
    """hook_head_index: the SAE reads head 2's z (d_head wide), and the splice replaces that head only."""
    reference = randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=8, d_sae=24))).eval()
    folder = written(reference, tmp_path / "sae", "blocks.1.attn.hook_z", hook_head_index=2)
    sae, ids, ours = ours_on(gpt2, folder)
    assert sae.head == 2 and sae.site == "blocks.1.attn.z"
    x = reference_site(gpt2[1], "blocks.1.attn.hook_z", ids)[:, 16:24]  # head 2 of 4, 8 wide
    with torch.no_grad():
        close(ours.features[0], reference.encode(x), "features of head 2")
        close(ours.reconstruction[0], reference(x), "reconstruction of head 2")


TRANSCODER = {"d_in": 32, "d_sae": 64, "d_out": 32, "apply_b_dec_to_input": False}
TRANSCODERS = {
    "transcoder": lambda: lens.Transcoder(lens.TranscoderConfig(**TRANSCODER)),
    "skip_transcoder": lambda: lens.SkipTranscoder(lens.SkipTranscoderConfig(**TRANSCODER)),
    "jumprelu_transcoder": lambda: lens.JumpReLUTranscoder(lens.JumpReLUTranscoderConfig(**TRANSCODER)),
}


@pytest.mark.parametrize("case", TRANSCODERS)
def test_saelens_transcoders_equal_sae_lens(gpt2, tmp_path, case):
    """A transcoder reads the MLP's normed input (ln2.hook_normalized) and stands for its output (hook_mlp_out)."""
    reference = randomized(TRANSCODERS[case](), threshold=0.3).eval()
    folder = written(reference, tmp_path / "tc", "blocks.0.ln2.hook_normalized",
                     hook_name_out="blocks.0.hook_mlp_out")
    sae, ids, ours = ours_on(gpt2, folder)
    assert (sae.site, sae.site_out) == ("blocks.0.mlp_norm.out", "blocks.0.mlp.out")
    x = reference_site(gpt2[1], "blocks.0.ln2.hook_normalized", ids)
    close(ours.target[0], reference_site(gpt2[1], "blocks.0.hook_mlp_out", ids), "what it stands for", 1e-4)
    with torch.no_grad():
        close(ours.features[0], reference.encode(x), f"{case}: features")
        close(ours.reconstruction[0], reference(x), f"{case}: output")
        if "W_skip" in sae.weights:  # the skip term counts: without it the output is another
            assert float((reference(x) - reference.decode(reference.encode(x))).abs().max()) > 1e-2


def test_the_jumprelu_threshold_and_the_gated_paths_matter(gpt2, tmp_path):
    """The planted-bug guards: the threshold zeroes some positive pre-activations, and the gate and magnitude paths
    differ, so that the parity tests above fail if either is dropped."""
    reference = randomized(lens.JumpReLUSAE(lens.JumpReLUSAEConfig(d_in=32, d_sae=64)), threshold=0.3).eval()
    _, ids, ours = ours_on(gpt2, written(reference, tmp_path / "j", "blocks.1.hook_resid_post"))
    x = reference_site(gpt2[1], "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        pre = (x - reference.b_dec) @ reference.W_enc + reference.b_enc
        assert int(((pre > 0) & (pre <= reference.threshold)).sum()) > 0
        gated = randomized(lens.GatedSAE(lens.GatedSAEConfig(d_in=32, d_sae=64))).eval()
        centred = x - gated.b_dec
        gate = (centred @ gated.W_enc + gated.b_gate) > 0
        magnitude = (centred @ (gated.W_enc * gated.r_mag.exp()) + gated.b_mag) > 0
        assert bool((gate != magnitude).any())
    assert float(ours.features.abs().sum()) > 0


# ------------------------------------------------------------------------------------------------- Gemma Scope


def saelens_of(cfg_dict: dict, state: dict):
    """An SAE built from a loader's (config, state dict) as sae-lens's load_from_disk builds it."""
    cfg_dict = loaders.handle_config_defaulting(cfg_dict)
    config = lens.SAE.get_sae_config_class_for_architecture(cfg_dict["architecture"]).from_dict(cfg_dict)
    sae = lens.SAE.get_sae_class_for_architecture(config.architecture())(config)
    sae.process_state_dict_for_loading(state)
    sae.load_state_dict(state, assign=True)
    return sae.eval()


@pytest.fixture
def local_hub(monkeypatch, tmp_path):
    """sae-lens's loaders read the files of tmp_path/<repo>/ instead of downloading them."""
    def download(repo_id, filename, subfolder=None, **_):
        return str(tmp_path / repo_id / (subfolder or "") / filename)

    def shapes(repo_id, filename):
        from safetensors import safe_open
        with safe_open(str(tmp_path / repo_id / filename), "pt") as f:
            return {name: list(f.get_slice(name).get_shape()) for name in f.keys()}

    monkeypatch.setattr(loaders.module, "hf_hub_download", download)
    monkeypatch.setattr(loaders.module, "get_safetensors_tensor_shapes", shapes)
    return tmp_path


def random_jumprelu(d_in: int, d_sae: int, d_out: int | None = None) -> dict[str, numpy.ndarray]:
    rng = numpy.random.default_rng(3)
    d_out = d_out or d_in
    return {"W_enc": rng.normal(0, 0.3, (d_in, d_sae)), "W_dec": rng.normal(0, 0.3, (d_sae, d_out)),
            "b_enc": rng.normal(0, 0.3, d_sae), "b_dec": rng.normal(0, 0.3, d_out),
            "threshold": rng.uniform(0, 0.6, d_sae)}


def test_gemma_scope_npz_equals_sae_lens_loader(gpt2, local_hub):
    """params.npz (allow_pickle=False) under a Gemma Scope release's path: a jumprelu SAE on the residual stream."""
    folder = local_hub / "google/gemma-scope-2b-pt-res" / "layer_1/width_16k/average_l0_10"
    folder.mkdir(parents=True)
    numpy.savez(folder / "params.npz", **{k: v.astype(numpy.float32) for k, v in random_jumprelu(32, 64).items()})
    cfg, state, _ = loaders.gemma_2_sae_huggingface_loader("google/gemma-scope-2b-pt-res",
                                                           "layer_1/width_16k/average_l0_10",
                                                           cfg_overrides={"d_in": 32, "d_sae": 64})
    reference = saelens_of(cfg, state)
    sae, ids, ours = ours_on(gpt2, folder)
    assert (sae.format, sae.architecture, sae.site) == ("gemmascope", "jumprelu", "blocks.1.resid_post")
    x = reference_site(gpt2[1], "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        close(ours.features[0], reference.encode(x), "features")
        close(ours.reconstruction[0], reference(x), "reconstruction")
    plain = local_hub / "plain"  # a path that does not say the hook: refused, and read with --site
    plain.mkdir()
    (plain / "params.npz").write_bytes((folder / "params.npz").read_bytes())
    with pytest.raises(TfcliError, match="does not say which activation"):
        read_sae(plain)
    assert read_sae(plain, "blocks.1.resid_post").site == "blocks.1.resid_post"


def write_safetensors(path: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.as_tensor(v, dtype=torch.float32).contiguous() for k, v in tensors.items()}, str(path))


@pytest.mark.parametrize("kind", ["resid_post", "transcoder"])
def test_gemma_scope_2_equals_sae_lens_loader(gemma2, local_hub, kind):
    """params.safetensors + config.json; the affine transcoder reads the pre-MLP norm's output and stands for the
    post-MLP norm's (Gemma's sandwich norm), with its skip term."""
    folder_name = f"transcoder/layer_1_width_16k_l0_small_affine" if kind == "transcoder" else \
        "resid_post/layer_1_width_16k_l0_small"
    folder = local_hub / "google/gemma-scope-2-270m-pt" / folder_name
    raw = {k.lower() if k.startswith("W_") else k: v for k, v in random_jumprelu(32, 64).items()}
    hooks = {"hf_hook_point_in": "model.layers.1.output"}
    if kind == "transcoder":
        raw["affine_skip_connection"] = numpy.random.default_rng(4).normal(0, 0.3, (32, 32))
        hooks = {"hf_hook_point_in": "model.layers.1.pre_feedforward_layernorm.output",
                 "hf_hook_point_out": "model.layers.1.post_feedforward_layernorm.output", "affine_connection": True}
    write_safetensors(folder / "params.safetensors", raw)
    (folder / "config.json").write_text(json.dumps({"architecture": "jump_relu", "model_name": "gemma-v3-270m-pt",
                                                    **hooks}))
    cfg, state, _ = loaders.gemma_3_sae_huggingface_loader("google/gemma-scope-2-270m-pt", folder_name)
    reference = saelens_of(cfg, state)
    sae, ids, ours = ours_on(gemma2, folder)
    layer = gemma2[1].model.layers[1]
    if kind == "transcoder":
        assert (sae.site, sae.site_out) == ("blocks.1.mlp_norm.out", "blocks.1.mlp_output_norm.out")
        x = hf_value(gemma2[1], layer.pre_feedforward_layernorm, ids)
        close(ours.target[0], hf_value(gemma2[1], layer.post_feedforward_layernorm, ids), "post-MLP norm", 1e-4)
    else:
        assert sae.site == "blocks.1.resid_post"
        x = hf_value(gemma2[1], layer, ids)
    close(ours.x[0], x, "the site's value", 1e-4)
    with torch.no_grad():
        close(ours.features[0], reference.encode(x), "features")
        close(ours.reconstruction[0], reference(x), "reconstruction")


def test_llama_scope_equals_sae_lens_loader(gpt2, local_hub):
    """hyperparams.json + checkpoints/final.safetensors: a scalar threshold, the dataset's norm folded in as
    sae-lens's from_pretrained folds it (fold_activation_norm_scaling_factor with sqrt(d) / norm_in)."""
    repo, name = "fnlp/Llama3_1-8B-Base-LXR-8x", "Llama3_1-8B-Base-L1R-8x"
    folder = local_hub / repo / name
    rng = numpy.random.default_rng(5)
    write_safetensors(folder / "checkpoints" / "final.safetensors", {
        "encoder.weight": rng.normal(0, 0.3, (64, 32)), "encoder.bias": rng.normal(0, 0.3, 64),
        "decoder.weight": rng.normal(0, 0.3, (32, 64)), "decoder.bias": rng.normal(0, 0.3, 32)})
    norm = 7.5
    (folder / "hyperparams.json").write_text(json.dumps({
        "d_model": 32, "d_sae": 64, "hook_point_in": "blocks.1.hook_resid_post",
        "hook_point_out": "blocks.1.hook_resid_post", "jump_relu_threshold": 0.05, "act_fn": "jumprelu",
        "dataset_average_activation_norm": {"in": norm, "out": norm}, "top_k": 50}))
    cfg, state, _ = loaders.llama_scope_sae_huggingface_loader(repo, name, cfg_overrides={"dtype": "float32"})
    reference = saelens_of(cfg, state)
    reference.fold_activation_norm_scaling_factor(32 ** 0.5 / norm)
    sae, ids, ours = ours_on(gpt2, folder)
    assert (sae.format, sae.site) == ("llamascope", "blocks.1.resid_post")
    x = reference_site(gpt2[1], "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        features = reference.encode(x)
        close(ours.features[0], features, "features")
        close(ours.reconstruction[0], reference(x), "reconstruction")
    assert 0 < int((features > 0).sum()) < features.numel()


# ------------------------------------------------------------------------------------------------- sparsify


@pytest.mark.parametrize("case", ["topk", "groupmax", "skip transcoder"])
def test_sparsify_equals_eai_sparsify(gpt2, tmp_path, case):
    sparsify = pytest.importorskip("sparsify", reason="eai-sparsify is the reference: pip install --no-deps "
                                   "eai-sparsify natsort schedulefree")
    transcode = case == "skip transcoder"
    config = sparsify.SparseCoderConfig(num_latents=64, k=8, activation="groupmax" if case == "groupmax" else "topk",
                                        transcode=transcode, skip_connection=transcode)
    torch.manual_seed(2)
    reference = sparsify.SparseCoder(32, config)
    with torch.no_grad():
        for param in reference.parameters():
            param.normal_(0, 0.3)
    folder = tmp_path / ("h.0.mlp" if transcode else "layers.1")
    reference.save_to_disk(folder)
    sae, ids, ours = ours_on(gpt2, folder)
    if transcode:
        assert (sae.site, sae.site_out) == ("blocks.0.mlp_norm.out", "blocks.0.mlp.out")
        x = reference_site(gpt2[1], "blocks.0.ln2.hook_normalized", ids)
    else:
        assert sae.site == "blocks.1.resid_post"
        x = reference_site(gpt2[1], "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        top_acts, top_indices, _ = reference.encode(x)
        features = torch.zeros(len(ids), 64).scatter_(-1, top_indices, top_acts)
        out = reference.decode(top_acts, top_indices)
        if transcode:
            out = out + x @ reference.W_skip.mT
            assert float((x @ reference.W_skip.mT).abs().max()) > 1e-2
    close(ours.features[0], features, f"{case}: features")
    close(ours.reconstruction[0], out, f"{case}: output")


# ------------------------------------------------------------------------------------------------- losses, batches


def hand_losses(hf, reference, ids: list[int], keep: torch.Tensor) -> dict:
    """transformers' own losses with block 1's output replaced by sae-lens's reconstruction (by x itself, by zeros)
    at the positions `keep` (T,) only: the cross-entropy means over the kept positions that predict a next token, the
    KL per position and its mean over those, the clean logits; computed by hand."""
    x = reference_site(hf, "blocks.1.hook_resid_post", ids)
    tensor = torch.tensor([ids])

    def logits_with(value):
        value = torch.where(keep[:, None], value, x)

        def swap(_, args, output):
            return (value[None], *output[1:]) if isinstance(output, tuple) else value[None]
        handle = gpt2_blocks(hf)[1].register_forward_hook(swap)
        try:
            with torch.no_grad():
                return hf(tensor).logits[0]
        finally:
            handle.remove()

    with torch.no_grad():
        clean = hf(tensor).logits[0]
        spliced, zero = logits_with(reference(x)), logits_with(torch.zeros_like(x))
    predicts = keep[:-1]

    def loss(logits):
        return float(torch.nn.functional.cross_entropy(logits[:-1][predicts], tensor[0, 1:][predicts]))

    kl = torch.nn.functional.kl_div(spliced.log_softmax(-1), clean.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    return {"clean": loss(clean), "spliced": loss(spliced), "zero": loss(zero), "kl": kl,
            "kl_mean": float(kl[:-1][predicts].mean()), "count": int(predicts.sum()), "x": x}


@pytest.mark.parametrize("every_token", [False, True])
def test_losses_equal_transformers_with_the_block_output_replaced(gpt2, tmp_path, every_token):
    """The spliced, with-error and zeroed losses and the KL are transformers' own with block 1's output replaced by
    sae-lens's reconstruction (by x itself, by zeros), the cross-entropy and KL computed by hand: at every position
    but 0 (the [CLS] the text starts with), over the positions after it, as sae train measures; with every_token
    (--all-tokens) at every position."""
    path, hf, model, tokenizer = gpt2
    reference = randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))).eval()
    sae = read_sae(written(reference, tmp_path / "sae", "blocks.1.hook_resid_post"))
    ids = ids_of(tokenizer, model, TEXT)
    ((result,),) = core.run_batch(model, tokenizer, [sae], [core.Text(1, TEXT, ids)],
                                  core.FeaturesOptions(every_token=every_token))
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[0] = every_token
    hand = hand_losses(hf, reference, ids, keep)
    losses = result.losses
    for ours, theirs, what in ((losses.clean, hand["clean"], "clean"), (losses.spliced, hand["spliced"], "spliced"),
                               (losses.with_error, hand["clean"], "with the error term"),
                               (losses.zero, hand["zero"], "zeroed"), (losses.kl, hand["kl_mean"], "KL's mean")):
        assert abs(ours - theirs) <= 1e-4 * max(1, abs(theirs)), what
    assert losses.count == hand["count"] == len(ids) - 1 - (not every_token)
    assert result.left_out == ({} if every_token else {0: "first"})
    close(result.kl, hand["kl"], "KL per position", 1e-4)
    assert losses.spliced - losses.clean > 1e-3 and abs(losses.with_error - losses.clean) < 1e-4
    assert abs(losses.recovered - (losses.zero - losses.spliced) / (losses.zero - losses.clean)) < 1e-9
    x = hand["x"]
    target, recon = x.double(), reference(x).detach().double()
    close(result.mse, ((target - recon) ** 2).mean(-1), "MSE per token")
    close(result.cosine, torch.nn.functional.cosine_similarity(target, recon, dim=-1), "cosine per token")
    spread = ((target - target[keep].mean(0)) ** 2).sum(-1)  # against the mean of the tokens measured
    close(result.explained, 1 - ((target - recon) ** 2).sum(-1) / spread, "explained variance per token")
    explained = 1 - float(((target - recon) ** 2).sum(-1)[keep].sum() / spread[keep].sum())
    assert abs(result.explained_text - explained) <= 1e-5 * max(1, abs(explained))


@pytest.fixture(scope="module")
def outlier_gpt2(tmp_path_factory, save_hf_model):
    """The 2-block GPT-2 with one token's embedding row 100 times longer: where the token stands, the residual
    stream's norm is hundreds of times its text's median (a planted attention-sink-like outlier)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("outlier-gpt2")
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                        eos_token_id=102, pad_token_id=0, initializer_range=0.2)
    hf = save_hf_model(GPT2LMHeadModel, config, path, perturb=True)
    model, tokenizer = load(path)
    store = tokenizer.encode(["store"])[0].ids[1]
    with torch.no_grad():
        hf.transformer.wte.weight[store] *= 100
    hf.save_pretrained(path)
    return (path, hf, *load(path)), store


def test_an_outlier_position_is_left_out_of_the_figures(outlier_gpt2, tmp_path, cli):
    """A token whose norm at the site is over 10 times its text's median (planted) is left out as sae train leaves it
    out: not spliced, not in the losses' means, the MSE, cosine, L0 or the explained variance; the losses equal
    transformers' own with block 1's output replaced at the other positions (not 0, not the outlier); the record
    and the view say what was left out; --all-tokens measures it, and its spliced loss is then far worse."""
    (path, hf, model, tokenizer), store = outlier_gpt2
    reference = randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))).eval()
    folder = written(reference, tmp_path / "sae", "blocks.1.hook_resid_post")
    ids = ids_of(tokenizer, model, TEXT)
    outlier = ids.index(store)
    record = json.loads(cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--json").stdout)
    assert record["left_out"] == [{"position": 0, "why": "first"}, {"position": outlier, "why": "outlier"}]
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[[0, outlier]] = False
    hand = hand_losses(hf, reference, ids, keep)
    for name in ("clean", "spliced", "zero"):
        assert abs(record["loss"][name] - hand[name]) <= 1e-4 * max(1, abs(hand[name])), name
    assert abs(record["loss"]["kl"] - hand["kl_mean"]) <= 1e-4 * max(1, hand["kl_mean"])
    assert record["loss"]["positions"] == hand["count"]
    x = hand["x"].double()
    error = ((x - reference(hand["x"]).detach().double()) ** 2).sum(-1)
    spread = ((x - x[keep].mean(0)) ** 2).sum(-1)
    explained = 1 - float(error[keep].sum() / spread[keep].sum())
    assert abs(record["explained_variance_text"] - explained) <= 1e-5 * max(1, abs(explained))
    every = json.loads(cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--json", "--all-tokens").stdout)
    assert every["left_out"] == [] and every["loss"]["positions"] == len(ids) - 1
    assert abs(every["loss"]["spliced"] - record["loss"]["spliced"]) > 0.1  # the outlier spliced too
    shown = cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--width", "80", "--no-color").stdout
    flat = " ".join(shown.split())
    assert "left out of the figures, as sae train leaves them out: position 0, outliers (norm over 10x the text's " \
        f"median) (1) (position {outlier}); --all-tokens measures them" in flat, shown
    assert re.search(rf"^\s*{outlier}\*\s", shown, re.M) and re.search(r"^\s*0\*\s", shown, re.M)
    corpus = cli("features", "-m", str(path), "--sae", str(folder), TEXT, "a store", "--json").stdout.splitlines()
    aggregate = json.loads(corpus[-1])
    assert aggregate["left_out"] == {"first": 2, "outlier": 2} and aggregate["measured"] == aggregate["tokens"] - 4


def test_a_batch_equals_its_texts_one_at_a_time(gpt2, tmp_path):
    _, _, model, tokenizer = gpt2
    reference = randomized(lens.TopKSAE(lens.TopKSAEConfig(d_in=32, d_sae=64, k=6)))
    sae = read_sae(written(reference, tmp_path / "sae", "blocks.1.hook_resid_post"))
    texts = [core.Text(n, text, ids_of(tokenizer, model, text)) for n, text in enumerate(TEXTS, 1)]
    together = [parts[0] for parts in core.run_batch(model, tokenizer, [sae], texts, core.FeaturesOptions())]
    for text, batched in zip(texts, together):
        ((alone,),) = core.run_batch(model, tokenizer, [sae], [text], core.FeaturesOptions())
        assert [[i for i, _ in top] for top in alone.top] == [[i for i, _ in top] for top in batched.top]
        close(batched.mse, alone.mse, "MSE", 1e-4)
        for name in ("clean", "spliced", "zero", "kl"):
            assert abs(getattr(batched.losses, name) - getattr(alone.losses, name)) < 1e-4, name


def direct_reader(hf, ids: list[int], p: int, target: int, foil: int):
    """v (d,) -> what transformers' GPT-2 reads of v at position p as a direct write to the final stream: centred,
    times ln_f's weight over ln_f's divisor there (frozen), dotted with W_U[target] - W_U[foil]."""
    final = hf_value(hf, hf.transformer.ln_f, ids, into=True)[p].double()
    scale = (final.var(unbiased=False) + hf.config.layer_norm_epsilon).sqrt()
    unembed = hf.lm_head.weight.detach().double()

    def read(v) -> float:
        v = v.double()
        return float(((v - v.mean()) * hf.transformer.ln_f.weight.detach().double() / scale)
                     @ (unembed[target] - unembed[foil]))
    return read


def test_direct_effects_equal_the_readout_by_hand(gpt2, tmp_path, cli):
    """--target/--foil: each active feature's direct effect at the last position is its activation x its decoder
    row, centred, times ln_f's weight over ln_f's divisor there (frozen), dotted with W_U[target] - W_U[foil], all
    from transformers' GPT-2; the features, the rest and the error sum to what the site adds."""
    path, hf, model, tokenizer = gpt2
    reference = randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))).eval()
    folder = written(reference, tmp_path / "sae", "blocks.0.hook_mlp_out")
    result = cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--target", "#1996", "--foil", "#4937",
                 "--json")
    assert result.exit_code == 0, result.stderr
    direct = json.loads(result.stdout)["direct"]
    ids = ids_of(tokenizer, model, TEXT)
    p = len(ids) - 1
    read = direct_reader(hf, ids, p, 1996, 4937)

    x = reference_site(hf, "blocks.0.hook_mlp_out", ids)
    with torch.no_grad():
        features, recon = reference.encode(x)[p], reference(x)[p]
        logits = hf(torch.tensor([ids])).logits[0, p]
    effects = {n: float(features[n]) * read(reference.W_dec[n].detach()) for n in features.nonzero().flatten().tolist()}
    assert direct["position"] == p and abs(direct["logit"] - float(logits[1996] - logits[4937])) < 1e-4
    assert {i for i, _, _ in direct["features"]} == set(effects)
    for i, activation, effect in direct["features"]:
        assert abs(effect - effects[i]) <= 1e-4 * max(1.0, abs(effects[i])), i
    assert [abs(e) for _, _, e in direct["features"]] == sorted((abs(e) for _, _, e in direct["features"]),
                                                                reverse=True)
    assert abs(direct["site"] - read(x[p])) < 1e-4 and abs(direct["error"] - read(x[p] - recon)) < 1e-4
    assert abs(direct["rest"] + sum(effects.values()) - read(recon)) < 1e-4
    assert "the residual stream" in refused(cli, "-m", str(path), "--sae", str(written(
        randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))), tmp_path / "z",
        "blocks.0.attn.hook_z")), TEXT, "--target", "#1996")


@pytest.mark.parametrize("hook", ["blocks.1.hook_mlp_out", "blocks.0.hook_resid_post"])
def test_attribute_splits_the_sae_site_into_its_features_by_hand(gpt2, tmp_path, cli, hook):
    """attribute --sae: the components the SAE's site holds (block 1's MLP; everything written up to block 0's
    output) give way to each active feature's direct effect (activation x decoder row, centred, times ln_f's weight
    over its divisor, dotted with W_U[target] - W_U[foil], from transformers' GPT-2), the rest and the error; the
    other components stay as they were and all still sum to the model's logit difference."""
    path, hf, model, tokenizer = gpt2
    reference = randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))).eval()
    folder = written(reference, tmp_path / "sae", hook)
    args = ("attribute", "-m", str(path), TEXT, "--target", "#1996", "--foil", "#4937", "--json")
    plain, split = (json.loads(result.stdout) for result in (cli(*args), cli(*args, "--sae", str(folder))))
    ids = ids_of(tokenizer, model, TEXT)
    p = len(ids) - 1
    read = direct_reader(hf, ids, p, 1996, 4937)

    x = reference_site(hf, hook, ids)[p]
    with torch.no_grad():
        features, recon = reference.encode(x), reference(x)
    label = "L1.mlp" if "mlp" in hook else "L0.resid_post"
    held = {"L1.mlp"} if "mlp" in hook else {"embed", "pos_embed", "L0.attn", "L0.attn_bias", "L0.mlp"}
    values = {c["name"]: c["value"] for c in split["components"]}
    expected = {f"{label}#{n}": float(features[n]) * read(reference.W_dec[n].detach())
                for n in features.nonzero().flatten().tolist()}
    expected |= {f"{label}.sae_error": read(x - recon), f"{label}.sae_rest": read(recon) - sum(expected.values())}
    expected |= {c["name"]: c["value"] for c in plain["components"] if c["name"] not in held}
    assert values.keys() == expected.keys() and len(expected) > len(held) + 2
    for name, value in expected.items():
        assert abs(values[name] - value) <= 1e-4 * max(1.0, abs(value)), name
    assert abs(split["total"] - split["logit"]) < 1e-4 and abs(split["logit"] - plain["logit"]) < 1e-9
    site = "blocks.1.mlp.out" if "mlp" in hook else "blocks.0.resid_post"
    assert [(sae["site"], sae["label"], sae["active"]) for sae in split["saes"]] == [
        (site, label, int(features.count_nonzero()))]
    own = 1 if "mlp" in hook else None  # a sublayer's features count in its layer, a residual site's in none
    assert {c["layer"] for c in split["components"] if c["name"].startswith((label + "#", label + ".sae_"))} == {own}


def test_attribute_sae_refusals(gpt2, saved_sae, cli, tmp_path):
    path = str(gpt2[0])
    z = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))), tmp_path / "z",
                "blocks.0.attn.hook_z")
    assert "not to the residual stream" in refused_by(cli, "attribute", "-m", path, "--sae", str(z), TEXT)
    inner = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))), tmp_path / "mlp0",
                    "blocks.0.hook_mlp_out")
    assert "holds another --sae's features" in refused_by(cli, "attribute", "-m", path, "--sae", str(inner),
                                                          "--sae", str(saved_sae[0]), TEXT)


def test_attribute_sae_over_a_dataset_is_the_mean_of_its_texts(gpt2, saved_sae, cli, tmp_path):
    """Each feature's mean over a dataset's prompts is the mean of the single runs' effects, 0 where a prompt's
    feature is inactive; each item (--per-item) lists its active features only, as a single run does."""
    path, folder = str(gpt2[0]), str(saved_sae[0])
    dataset = tmp_path / "d.jsonl"
    dataset.write_text("".join(json.dumps({"text": text, "target": "#1996"}) + "\n" for text in TEXTS))
    singles = [json.loads(cli("attribute", "-m", path, "--sae", folder, text, "--target", "#1996", "--json").stdout)
               for text in TEXTS]
    result = cli("attribute", "-m", path, "--sae", folder, "--dataset", str(dataset), "--per-item", "--json")
    assert result.exit_code == 0, result.stderr
    *items, aggregate = [json.loads(line) for line in result.stdout.splitlines()]
    for item, single in zip(items, singles):  # the same components, to rounding (a padded batch against one text)
        assert [c["name"] for c in item["components"]] == [c["name"] for c in single["components"]]
        assert max(abs(a["value"] - b["value"]) for a, b in zip(item["components"], single["components"])) < 1e-5
    means = {c["name"]: c["mean"] for c in aggregate["components"]}
    names = {c["name"] for single in singles for c in single["components"]}
    assert len(means) == len([n for n in means if "#" not in n]) + 64 and names <= means.keys()
    for name in names:
        expected = sum(next((c["value"] for c in single["components"] if c["name"] == name), 0.0)
                       for single in singles) / len(singles)
        assert abs(means[name] - expected) < 1e-5, name
    assert aggregate["saes"][0]["active"] == sum(single["saes"][0]["active"] for single in singles) / len(singles)


# ------------------------------------------------------------------------------------------------- interventions


def logits_with_block_output(hf, layer: int, ids: list[int], change) -> torch.Tensor:
    """transformers' logits with block `layer`'s output x replaced by change(x) (T, d), through a forward hook."""
    def swap(_, args, output):
        return (change(output[0][0])[None], *output[1:]) if isinstance(output, tuple) else change(output[0])[None]
    handle = gpt2_blocks(hf)[layer].register_forward_hook(swap)
    try:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0]
    finally:
        handle.remove()


@pytest.mark.parametrize("edit", ["zero", "clamp", "steer"])
def test_feature_edits_equal_transformers_with_the_decoder_row_added(gpt2, saved_sae, edit):
    """Ablating (clamping) feature N with the error term kept moves block 1's output by (value - f_N) W_dec[N] and
    nothing else; steering adds strength x W_dec[N]: transformers' logits with that done by hand in a forward hook.
    The pass before the site is unchanged."""
    from tfcli.analysis.ablation import FeatureEdit, edit_hooks

    _, hf, model, tokenizer = gpt2
    folder, reference = saved_sae
    sae = read_sae(folder)
    ids = ids_of(tokenizer, model, TEXT)
    x = reference_site(hf, "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        features = reference.encode(x)
    n = int((features > 0).sum(0).argmax())  # a feature active on some tokens
    row = reference.W_dec[n].detach()
    spec = {"zero": FeatureEdit(n, value=0.0), "clamp": FeatureEdit(n, value=2.5),
            "steer": FeatureEdit(n, strength=4.0)}[edit]
    if edit == "steer":
        change = lambda x: x + 4.0 * row  # noqa: E731
    else:
        change = lambda x: x + (spec.value - features[:, n:n + 1]) * row  # noqa: E731
    theirs = logits_with_block_output(hf, 1, ids, change)
    hooks = edit_hooks(sae, [spec])
    with torch.no_grad():
        ours, cache = model.run_with_cache(torch.tensor([ids]), names=["blocks.1.resid_mid", "blocks.1.resid_post"],
                                           hooks=hooks)
        _, clean = model.run_with_cache(torch.tensor([ids]), names=["blocks.1.resid_mid", "blocks.1.resid_post"])
    close(ours[0], theirs, f"{edit}: logits", 1e-4)
    assert torch.equal(cache["blocks.1.resid_mid"], clean["blocks.1.resid_mid"])  # the run before the site
    moved = cache["blocks.1.resid_post"][0] - clean["blocks.1.resid_post"][0]
    close(moved, change(x) - x, f"{edit}: the site moves along feature {n}'s decoder row only", 1e-4)
    assert float(moved.abs().max()) > 1e-3


def test_a_transcoder_feature_edit_changes_the_mlp_output(gpt2, tmp_path):
    """A transcoder's edit reads the MLP's normed input and moves the MLP's output by -f_N W_dec[N]."""
    from tfcli.analysis.ablation import FeatureEdit, edit_hooks

    _, hf, model, tokenizer = gpt2
    reference = randomized(lens.SkipTranscoder(lens.SkipTranscoderConfig(**TRANSCODER))).eval()
    sae = read_sae(written(reference, tmp_path / "tc", "blocks.0.ln2.hook_normalized",
                           hook_name_out="blocks.0.hook_mlp_out"))
    ids = ids_of(tokenizer, model, TEXT)
    block = gpt2_blocks(hf)[0]
    with torch.no_grad():
        features = reference.encode(hf_value(hf, block.ln_2, ids))
    n = int((features > 0).sum(0).argmax())
    row = reference.W_dec[n].detach()

    def swap(_, args, output):
        return output - features[:, n:n + 1][None] * row
    handle = block.mlp.register_forward_hook(swap)
    try:
        with torch.no_grad():
            theirs = hf(torch.tensor([ids])).logits[0]
    finally:
        handle.remove()
    with torch.no_grad():
        ours = model.run_with_hooks(torch.tensor([ids]), edit_hooks(sae, [FeatureEdit(n, value=0.0)]))
    close(ours[0], theirs, "logits with the transcoder's feature zeroed", 1e-4)


def test_ablate_takes_a_feature(gpt2, saved_sae, cli):
    """--ablate SAE#N zeroes feature N (SAE#N=V clamps it), through the hooks every command's --ablate runs: generate's
    greedy continuation is transformers' with (V - f_N) W_dec[N] added to block 1's output by hand."""
    from tfcli.analysis.ablation import ablated_label, ablation

    path, hf, model, tokenizer = gpt2
    folder, reference = saved_sae
    ids = ids_of(tokenizer, model, TEXT)
    spec = f"{folder}#7=3.0"
    removed = ablation([spec], model.config)
    assert ablated_label([spec, f"{folder}#7"]) == f"{folder}#7 (clamped to 3.0), {folder}#7 (zeroed)"
    x = reference_site(hf, "blocks.1.hook_resid_post", ids)
    with torch.no_grad():
        f7 = reference.encode(x)[:, 7:8]
        ours = model.run_with_hooks(torch.tensor([ids]), removed.hooks)
    theirs = logits_with_block_output(hf, 1, ids, lambda x: x + (3.0 - f7) * reference.W_dec[7].detach())
    close(ours[0], theirs, "logits with feature 7 clamped", 1e-4)
    result = cli("generate", "-m", str(path), TEXT, "--ablate", f"{folder}#7", "--max-new-tokens", "2", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["ablated"] == [f"{folder}#7"]
    assert "--ablate" in refused_by(cli, "generate", "-m", str(path), TEXT, "--ablate", f"{folder}#x")


def test_steer_takes_a_feature(gpt2, saved_sae, cli):
    """--steer SAE#N:S adds S x W_dec[N] to the SAE's block output (generate's steering hooks): transformers' logits
    with that added by hand; an SAE on another site is refused, one line."""
    from tfcli.analysis.vectors import load_vector, steering_hooks

    path, hf, model, tokenizer = gpt2
    folder, reference = saved_sae
    ids = ids_of(tokenizer, model, TEXT)
    hooks = steering_hooks(model, [load_vector(f"{folder}#5", model.config)], [4.0])
    with torch.no_grad():
        ours = model.run_with_hooks(torch.tensor([ids]), hooks)
    theirs = logits_with_block_output(hf, 1, ids, lambda x: x + 4.0 * reference.W_dec[5].detach())
    close(ours[0], theirs, "logits steered by feature 5", 1e-4)
    result = cli("generate", "-m", str(path), TEXT, "--steer", f"{folder}#5:4", "--max-new-tokens", "2", "--json")
    assert result.exit_code == 0, result.stderr


def refused_by(cli, *args, code: int = 2) -> str:
    result = cli(*args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    return line


# ------------------------------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def saved_sae(gpt2, tmp_path_factory):
    reference = randomized(lens.JumpReLUSAE(lens.JumpReLUSAEConfig(d_in=32, d_sae=64)), threshold=0.3).eval()
    return written(reference, tmp_path_factory.mktemp("sae") / "sae", "blocks.1.hook_resid_post"), reference


def test_feature_over_a_file_gives_its_top_contexts(gpt2, saved_sae, cli, tmp_path):
    """--feature N --file: the top activating contexts over the corpus are sae-lens's on transformers' activations,
    the largest first, and the density counts every token measured (position 0, the [CLS], left out)."""
    path, hf, model, tokenizer = gpt2
    folder, reference = saved_sae
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    found = []
    tokens = 0
    for number, text in enumerate(TEXTS, 1):
        ids = ids_of(tokenizer, model, text)
        with torch.no_grad():
            acts = reference.encode(reference_site(hf, "blocks.1.hook_resid_post", ids))[:, 7]
        found += [(float(a), number, p) for p, a in enumerate(acts) if a > 0 and p > 0]  # position 0 left out
        tokens += len(ids)
    found.sort(key=lambda f: -f[0])
    result = cli("features", "-m", str(path), "--sae", str(folder), "--feature", "7", "--contexts", "4", "--file",
                 str(corpus), "--json")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(record) == {"texts", "tokens", "sae", "mse", "explained_variance", "cosine", "l0", "loss", "feature",
                           "active", "max_activation", "mean_activation", "contexts", "measured", "left_out",
                           "interrupted"}
    assert (record["texts"], record["tokens"], record["active"]) == (3, tokens, len(found))
    assert record["measured"] == tokens - 3 and record["left_out"] == {"first": 3}
    assert [(c["text"], c["position"]) for c in record["contexts"]] == [(n, p) for _, n, p in found[:4]]
    close([c["activation"] for c in record["contexts"]], [a for a, _, _ in found[:4]], "top activations")


def test_json_record_and_views_keep_every_token_and_number(gpt2, saved_sae, cli):
    path = gpt2[0]
    folder, _ = saved_sae
    result = cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--json")
    assert result.exit_code == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert set(record) == {"text", "ids", "tokens", "sae", "features", "mse", "explained_variance", "cosine", "l0",
                           "explained_variance_text", "loss", "kl", "feature", "activations", "direct", "left_out"}
    assert set(record["loss"]) == {"clean", "spliced", "with_error", "zero", "recovered", "kl", "kl_with_error",
                                   "positions"}
    for width in (80, 120):
        for color in ("--no-color", "--color"):
            shown = cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--width", str(width), color)
            assert shown.exit_code == 0, shown.stderr
            lines = shown.stdout.splitlines()
            assert max(map(len, [screen_text_line(line) for line in lines])) <= width
            plain = "\n".join(screen_text_line(line) for line in lines)
            for token in record["tokens"]:
                assert token_label(token) in plain
            for top in record["features"]:
                for index, value in top:
                    assert f"{index}:{value:.3g}" in plain
            assert f"{record['loss']['spliced']:.4f}" in plain
    for extra in (["--target", "#1996", "--foil", "#4937"], ["--feature", "7"], ["--feature", "7", TEXT, "a b"]):
        for width in (80, 120):
            shown = cli("features", "-m", str(path), "--sae", str(folder), TEXT, *extra, "--width", str(width),
                        "--color")
            assert shown.exit_code == 0, shown.stderr
            assert max(len(screen_text_line(line)) for line in shown.stdout.splitlines()) <= width, extra


def test_several_saes_give_each_its_own_results(gpt2, saved_sae, cli, tmp_path):
    """--sae repeated (one per site): each SAE's record equals a run with it alone (its losses splice it alone)."""
    path = str(gpt2[0])
    folder, _ = saved_sae
    other = written(randomized(lens.TopKSAE(lens.TopKSAEConfig(d_in=32, d_sae=48, k=4))), tmp_path / "other",
                    "blocks.0.hook_mlp_out")
    both = cli("features", "-m", path, "--sae", str(folder), "--sae", str(other), TEXT, "--json")
    assert both.exit_code == 0, both.stderr
    records = [json.loads(line) for line in both.stdout.splitlines()]
    assert [r["sae"]["site"] for r in records] == ["blocks.1.resid_post", "blocks.0.mlp.out"]
    for record, alone in zip(records, (folder, other)):
        single = json.loads(cli("features", "-m", path, "--sae", str(alone), TEXT, "--json").stdout)
        assert record["features"] == single["features"] and record["loss"] == single["loss"]
    shown = cli("features", "-m", path, "--sae", str(folder), "--sae", str(other), TEXT, "--width", "80",
                "--no-color")
    assert shown.exit_code == 0 and shown.stdout.count("text 1:") == 1
    assert len(re.findall(r"^SAE\s", shown.stdout, re.M)) == 2  # a long path may wrap after "SAE"
    corpus = cli("features", "-m", path, "--sae", str(folder), "--sae", str(other), *TEXTS, "--json")
    assert [json.loads(line)["sae"]["site"] for line in corpus.stdout.splitlines()[-2:]] == \
        ["blocks.1.resid_post", "blocks.0.mlp.out"]
    assert "another --sae reads blocks.1.resid_post too" in refused(cli, "-m", path, "--sae", str(folder), "--sae",
                                                                    str(folder), TEXT)


def screen_text_line(line: str) -> str:
    """A line of output without its colour codes."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", line)


def test_reports_draw_in_a_browser(gpt2, saved_sae, cli, tmp_path):
    """A text's page (tokens shaded by a feature picked among their top ones; the feature followed), a corpus's
    page (the top contexts) and a figure: drawn by a real browser with no script error and no request."""
    import os
    import shutil

    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    browser_path = os.environ.get("TFCLI_BROWSER") or shutil.which("chromium-headless-shell") or \
        shutil.which("chromium")
    path, folder = gpt2[0], saved_sae[0]
    pages = {}
    other = written(randomized(lens.TopKSAE(lens.TopKSAEConfig(d_in=32, d_sae=48, k=4))), tmp_path / "other",
                    "blocks.0.hook_mlp_out")
    for name, args in (("text", [TEXT]), ("feature", ["--feature", "7", TEXT]),
                       ("corpus", ["--feature", "7", *TEXTS]), ("several", ["--sae", str(other), TEXT])):
        pages[name] = tmp_path / f"{name}.html"
        result = cli("features", "-m", str(path), "--sae", str(folder), *args, "--report", str(pages[name]))
        assert result.exit_code == 0, result.stderr
    figure = tmp_path / "corpus.svg"
    assert cli("features", "-m", str(path), "--sae", str(folder), "--feature", "7", *TEXTS, "--report",
               str(figure)).exit_code == 0
    assert "<svg" in figure.read_text()
    if browser_path is None:
        pytest.skip("no browser: apt-get install -y chromium-headless-shell")
    record = json.loads(cli("features", "-m", str(path), "--sae", str(folder), TEXT, "--json").stdout)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path)
        try:
            for name, page_path in pages.items():
                page = browser.new_page()
                errors, asked = [], []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.route("**/*", lambda route: (asked.append(route.request.url), route.continue_()
                                                  if route.request.url == page_path.as_uri() else route.abort()))
                page.goto(page_path.as_uri())
                page.wait_for_selector("body[data-ready]")
                assert page.get_attribute("body", "data-ready") == "1" and not errors, (errors,
                                                                                        page.text_content("body"))
                assert asked == [page_path.as_uri()]
                if name == "several":  # a part per SAE
                    assert page.locator(".tokens.features").count() == 2
                elif name == "corpus":
                    assert page.locator("table.contexts tbody tr").count() == 10 or \
                        page.locator("table.contexts tbody tr").count() > 0
                else:
                    tokens = page.locator(".tokens.features .tok")
                    assert tokens.count() == len(record["tokens"])
                    tip = tokens.nth(1).get_attribute("data-tip")
                    top = ", ".join(f"{i}: " for i, _ in record["features"][1])
                    assert tip.startswith("position 1: ") and all(f"{i}: " in tip for i, _ in record["features"][1]), \
                        (tip, top)
                page.close()
        finally:
            browser.close()


def refused(cli, *args, code: int = 2) -> str:
    """The one error line of a features run that fails with `code`: 2 for a bad option or argument, 1 for a file that
    is missing, malformed or does not fit the model (docs/errors.md)."""
    result = cli("features", *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture
def no_model_loaded(monkeypatch):
    """Building the model (the runner's `build`) fails the test: the SAE is checked against the sites' shapes, which
    a pass on the meta device gives (no weights), before any model is loaded."""
    from tfcli.cli import session

    def refuse(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(session, "build", refuse)


def test_bad_input_is_one_error_line_before_any_model(gpt2, saved_sae, cli, tmp_path, no_model_loaded):
    path = str(gpt2[0])
    folder, reference = saved_sae
    wide = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=48, d_sae=64))), tmp_path / "wide",
                   "blocks.1.hook_resid_post")
    assert "48 values per token, but blocks.1.resid_post has 32" in refused(cli, "-m", path, "--sae", str(wide), TEXT,
                                                                            code=1)
    nowhere = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))), tmp_path / "nowhere",
                      "blocks.1.hook_somewhere")
    assert "the hook blocks.1.hook_somewhere has no tfcli site" in refused(cli, "-m", path, "--sae", str(nowhere),
                                                                           TEXT, code=1)
    deep = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))), tmp_path / "deep",
                   "blocks.7.hook_resid_post")
    assert "no site blocks.7.resid_post" in refused(cli, "-m", path, "--sae", str(deep), TEXT, code=1)
    strange = tmp_path / "strange"
    strange.mkdir()
    config = json.loads((folder / "cfg.json").read_text())
    (strange / "cfg.json").write_text(json.dumps(config | {"architecture": "matryoshka"}))
    assert "unknown architecture 'matryoshka'" in refused(cli, "-m", path, "--sae", str(strange), TEXT, code=1)
    (strange / "cfg.json").write_text(json.dumps(config))
    assert "sae_weights.safetensors is missing" in refused(cli, "-m", path, "--sae", str(strange), TEXT, code=1)
    (strange / "cfg.json").write_text("{not json")
    assert "is not readable JSON" in refused(cli, "-m", path, "--sae", str(strange), TEXT, code=1)
    assert "no such file or folder" in refused(cli, "-m", path, "--sae", str(tmp_path / "absent"), TEXT, code=1)
    assert "features 0 to 63" in refused(cli, "-m", path, "--sae", str(folder), "--feature", "64", TEXT)
    assert "--sae is required" in refused(cli, "-m", path, TEXT)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no SAE there" in refused(cli, "-m", path, "--sae", str(empty), TEXT, code=1)


@pytest.mark.parametrize("field,value,message", [
    ("d_in", "32", "`d_in` in cfg.json must be a whole number, not \"32\""),
    ("d_sae", 32.0, "`d_sae` in cfg.json must be a whole number, not 32.0"),
    ("d_in", 48, "cfg.json gives d_in 48, but its weights read 32 values"),
    ("apply_b_dec_to_input", "false", "`apply_b_dec_to_input` in cfg.json must be true or false, not \"false\""),
    ("hook_name", 7, "`hook_name` in cfg.json must be a string, not 7"),
    ("hook_head_index", "1", "`hook_head_index` in cfg.json must be a whole number, not \"1\""),
    ("normalize_activations", 0, "`normalize_activations` in cfg.json must be a string or true or false, not 0"),
])
def test_a_cfg_field_of_the_wrong_type_is_refused(gpt2, saved_sae, cli, tmp_path, no_model_loaded, field, value,
                                                  message):
    """Every field read from an SAE's cfg.json has its type checked (a string "576" for d_in was taken silently),
    and d_in and d_sae must be the weights' own: a file that is malformed exits 1 (docs/errors.md)."""
    import shutil

    folder, _ = saved_sae
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    config = json.loads((folder / "cfg.json").read_text())
    (bad / "cfg.json").write_text(json.dumps(config | {field: value}))
    assert message in refused(cli, "-m", str(gpt2[0]), "--sae", str(bad), TEXT, code=1)


def test_attribute_per_layer_table_gives_a_residual_sae_its_own_row(gpt2, tmp_path, cli):
    """attribute --sae on a residual site: the SAE's parts (features, rest, error) hold every layer's writes up to
    the site, so the per-layer table shows them on a row of their own after that layer (its running total the
    parts' sum), not on the embeddings' row; the layers the SAE holds have blank cells, not +0.0000."""
    path = gpt2[0]
    folder = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=32, d_sae=64))).eval(), tmp_path / "sae",
                     "blocks.0.hook_resid_post")
    args = ("attribute", "-m", str(path), TEXT, "--target", "#1996", "--foil", "#4937", "--sae", str(folder))
    record = json.loads(cli(*args, "--json").stdout)
    parts = sum(c["value"] for c in record["components"] if c["name"].startswith(("L0.resid_post#",
                                                                                   "L0.resid_post.sae_")))
    shown = cli(*args, "--width", "120", "--no-color")
    assert shown.exit_code == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("per layer"):].splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in table[3:] if line.strip()}
    assert rows["L0.resid_post"][-1] == f"{parts:+.4f}", rows
    assert rows["embeddings"] == ["+0.0000"] and rows["0"] == ["+0.0000"], rows  # only the running total
    layer1 = [c["value"] for c in record["components"] if c["layer"] == 1]
    assert rows["1"][-1] == f"{parts + sum(layer1):+.4f}"


def test_an_sae_given_to_another_option_is_named_by_that_option(gpt2, tmp_path, cli):
    """An SAE read for --steer SAE#N:S, --ablate SAE#N or steer sweep's --vector SAE#N: its errors name that option
    as the user gave it, never --sae (which the user did not give)."""
    path = str(gpt2[0])
    wide = written(randomized(lens.StandardSAE(lens.StandardSAEConfig(d_in=48, d_sae=64))), tmp_path / "wide",
                   "blocks.1.hook_resid_post")
    cases = {("generate", "-m", path, TEXT, "--steer", "nonexistent#3:5"): "--steer nonexistent#3:5: ",
             ("generate", "-m", path, TEXT, "--ablate", f"{wide}#3"): f"--ablate {wide}#3: ",
             ("attribute", "-m", path, TEXT, "--ablate", "nonexistent#3"): "--ablate nonexistent#3: ",
             ("steer", "sweep", "-m", path, TEXT, "--vector", f"{wide}#3"): f"--vector {wide}#3: "}
    for args, start in cases.items():
        line = refused_by(cli, *args, code=1)  # a missing SAE, one of another width: exit 1 (docs/errors.md)
        assert line.startswith("error: " + start) and "--sae" not in line, (args, line)
    assert "no such file or folder" in refused_by(cli, "generate", "-m", path, TEXT, "--steer", "nonexistent#3:5",
                                                  code=1)
    assert "48 values per token" in refused_by(cli, "generate", "-m", path, TEXT, "--ablate", f"{wide}#3", code=1)


def test_a_jumprelu_pre_activation_exactly_at_its_threshold_does_not_fire(tmp_path):
    """JumpReLU fires where the pre-activation is above the threshold, not at it (sae-lens: `pre > threshold`).
    Random SAEs never tie, so this one is built to: W_enc = W_dec = I, biases 0, every threshold 0.5, and inputs
    that hit 0.5 exactly; sae-lens's own `encode` is the reference, and the rule by hand."""
    reference = lens.JumpReLUSAE(lens.JumpReLUSAEConfig(d_in=8, d_sae=8))
    with torch.no_grad():
        reference.W_enc.copy_(torch.eye(8))
        reference.W_dec.copy_(torch.eye(8))
        reference.b_enc.zero_()
        reference.b_dec.zero_()
        reference.threshold.fill_(0.5)
    sae = read_sae(written(reference, tmp_path / "tie", "blocks.0.hook_resid_post"))
    x = torch.tensor([[0.5, 0.25, 1.0, 0.5, 0.75, 0.5, 0.0, 2.0], [0.5] * 8])
    ours = sae.encode(x)
    with torch.no_grad():
        theirs = reference.encode(x)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours, torch.where(x > 0.5, x, torch.zeros_like(x)))
    assert int((ours[1] > 0).sum()) == 0  # every pre-activation at the threshold: none fires


LONG_WORDS = ("extraordinary circumstances notwithstanding, the administration unquestionably acknowledged "
              "responsibilities regarding environmental sustainability considerations internationally yesterday")


@pytest.mark.parametrize("width", [80, 112, 120])
def test_the_contexts_table_stays_one_table_at_any_width(gpt2, saved_sae, cli, tmp_path, width):
    """--feature over a file: a context wider than the room beside its numbers wraps in its cell; the table is never
    split into pages that put the text and position apart from the context (as at 112 columns it was)."""
    path = str(gpt2[0])
    folder, _ = saved_sae
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(LONG_WORDS + "\n" + LONG_WORDS.replace("the", "an") + "\n")
    record = json.loads(cli("features", "-m", path, "--sae", str(folder), "--feature", "7", "--file", str(corpus),
                            "--json").stdout.splitlines()[-1])
    assert record["contexts"], "feature 7 is active somewhere"
    shown = cli("features", "-m", path, "--sae", str(folder), "--feature", "7", "--file", str(corpus), "--width",
                str(width), "--no-color")
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(map(len, lines)) <= width
    headers = [line for line in lines if line.lstrip().startswith("activation")]
    assert len(headers) == 1 and all(word in headers[0] for word in ("text", "position", "context")), shown.stdout
    table = " ".join(shown.stdout[shown.stdout.index(headers[0]):].split())
    for c in record["contexts"]:
        assert " ".join(token_label(t) for t in c["before"]) in table
        assert f"[{token_label(c['token'])}]" in table


def test_a_log_gets_a_first_line_at_once_and_a_last_line(gpt2, saved_sae, cli, tmp_path):
    """Into a log (stderr not a terminal), a run over a --file says at once what runs over how many texts (the file's
    lines are counted, not `?`) and, at its end, how many it did in how long; none of the minute's lines between."""
    path = str(gpt2[0])
    folder, _ = saved_sae
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n\n")  # a blank line is no text
    result = cli("features", "-m", path, "--sae", str(folder), "--file", str(corpus), "--json")
    assert result.exit_code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("features: ")]
    assert said[0] == "features: started, over 3 texts", result.stderr
    assert re.fullmatch(r"features: done, 3 of 3 texts in \d+ s", said[-1]) and len(said) == 2, result.stderr


def test_a_feature_steering_strength_is_shown_against_the_prompts_numbers(gpt2, saved_sae, cli):
    """--steer SAE#N:S: S is in the feature's activation units (S x W_dec[N] is added); the record's
    steered.features and the view say, per prompt, the feature's largest activation there (position 0 left out) and
    the median norm of block L's output (the same), with the vector's share of it, all from transformers' own block
    output and sae-lens's encode."""
    path, hf, model, tokenizer = gpt2
    folder, reference = saved_sae
    args = ("generate", "-m", str(path), TEXT, "--steer", f"{folder}#5:4", "--max-new-tokens", "2")
    record = json.loads(cli(*args, "--json").stdout)
    [scale] = record["steered"]["features"]
    x = reference_site(hf, "blocks.1.hook_resid_post", ids_of(tokenizer, model, TEXT))
    with torch.no_grad():
        activation = float(reference.encode(x)[1:, 5].max())
    norm = float(x[1:].norm(dim=-1).median())
    share = 4 * float(reference.W_dec[5].norm()) / norm
    assert (scale["spec"], scale["feature"], scale["block"], scale["strength"]) == (f"{folder}#5:4", 5, 1, 4.0)
    for key, value in (("activation", activation), ("site_norm", norm), ("share", share)):
        assert abs(scale[key] - value) <= 1e-4 * max(1.0, abs(value)), key
    shown = " ".join(cli(*args, "--width", "80", "--no-color").stdout.split())
    assert f"4 x feature 5's decoder row, the feature made 4 more active (its strength is in the feature's " \
           f"activation units; on this prompt the feature reaches {activation:.4g}); block 1's output has a median " \
           f"norm of {norm:.4g} here, so the vector added is {share:.0%} of it" in shown, shown
