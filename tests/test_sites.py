"""Named sites (tfcli/model/sites.py) against transformers' own modules, for every registered family.

One table, CASES, keyed by model_type: the tiny transformers model to build (biases and norm weights made random, so
one read from the wrong place shows) and where each stack's sites are in it, as attribute paths: its list of layers
(whose input is resid_pre and output resid_post), the self-attention's output projection (its input is z, as
(B, T, H * D); its output attn.out), the module whose output is mlp.out and, in an encoder-decoder's decoder, the
cross-attention's output projection. attn.pattern is what transformers' eager attention returns
(output_attentions=True). Every block's sites are compared with forward hooks on those modules, on the real tokens of
a right-padded batch of 2, fp32, within 1e-4; then a replacement made through `run_with_hooks` (a head of z zeroed,
a vector added to resid_post) against the same replacement made by a hook on transformers' module: the same logits.

Also: `site_shapes` against the shapes of a real pass, and `run_with_cache(grad=True)`'s gradients against
transformers' autograd.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

import tfcli
from tfcli.checkpoints import FAMILIES
from tfcli.model import sites

IDS = [[5, 17, 42, 8, 77, 9, 60, 11], [9, 31, 12, 50, 44, None, None, None]]  # None: padding (the case's pad id)
MASK = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
DECODER_IDS = torch.tensor([[0, 40, 41, 7, 9, 13, 15], [0, 12, 13, 14, 0, 0, 0]])  # column 0: the start token
DECODER_MASK = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="needs a CUDA GPU"))]
LAYER_SITES = ("resid_pre", "attn.pattern", "attn.z", "attn.out", "mlp.out", "resid_post")
CROSS_SITES = ("cross_attn.pattern", "cross_attn.z", "cross_attn.out")


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Stack:
    """Where one stack's sites are in transformers' model: dotted attribute paths."""

    layers: str  # from the model: its ModuleList of layers, or one layer module run at every depth (ALBERT)
    attn: str  # from a layer: the self-attention's output projection (input z (B, T, H * D), output attn.out)
    mlp: str  # from a layer: the module whose output is mlp.out (before any output norm)
    cross: str | None = None  # from a decoder layer: the cross-attention's output projection


@dataclass(frozen=True)
class Case:
    """One family's parity case. Every family has a module boundary in transformers at each compared site (fused
    projections, as Phi-3's qkv_proj and gate_up_proj or Falcon's query_key_value, sit inside the boundaries), so no
    site is left out; a site that could not be compared would be named in a comment on the case."""

    model: str  # transformers' model class
    config: str  # its config class
    settings: dict
    stacks: dict[str, Stack]  # tfcli's site prefix ("", "encoder.", "decoder.") -> where the stack is in transformers
    pad: int = 0  # the padding id (RoBERTa numbers positions from the ids)
    marks: tuple = field(default=())  # e.g. an xfail, with what differs


def decoder(layers: str, attn: str, mlp: str = "mlp") -> dict[str, Stack]:
    return {"": Stack(layers, attn, mlp)}


def encoder(layers: str, attn: str = "attention.output.dense", mlp: str = "output.dense") -> dict[str, Stack]:
    return {"": Stack(layers, attn, mlp)}


# layouts shared by several families
LLAMA_LAYOUT = decoder("model.layers", "self_attn.o_proj")  # mlp: its down projection's output
BART_LAYOUT = {"encoder.": Stack("model.encoder.layers", "self_attn.out_proj", "fc2"),
               "decoder.": Stack("model.decoder.layers", "self_attn.out_proj", "fc2", cross="encoder_attn.out_proj")}
T5_LAYOUT = {"encoder.": Stack("encoder.block", "layer.0.SelfAttention.o", "layer.1.DenseReluDense"),
             "decoder.": Stack("decoder.block", "layer.0.SelfAttention.o", "layer.2.DenseReluDense",
                               cross="layer.1.EncDecAttention.o")}

SIZES = dict(vocab_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA = dict(SIZES, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64, initializer_range=0.2)
ENCODER = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
               max_position_embeddings=64, initializer_range=0.2)
ROBERTA = dict(ENCODER, max_position_embeddings=66, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1)
T5 = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
          relative_attention_max_distance=6, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
BART = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_position_embeddings=64,
            scale_embedding=True, init_std=0.2)

CASES: dict[str, Case] = {
    # decoders: right padding, which leaves the real tokens as they are
    "gpt2": Case("GPT2LMHeadModel", "GPT2Config", dict(SIZES, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                              initializer_range=0.2),
                 decoder("transformer.h", "attn.c_proj")),  # c_proj: a Conv1D, (B, T, H * D) in as a Linear
    "gptj": Case("GPTJForCausalLM", "GPTJConfig", dict(SIZES, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                                       n_positions=64, initializer_range=0.2),
                 decoder("transformer.h", "attn.out_proj")),  # parallel block: one norm for both
    "gpt_neox": Case("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(LLAMA, hidden_size=64, num_key_value_heads=None,
                                                                 rotary_pct=0.25, rotary_emb_base=10000),
                     decoder("gpt_neox.layers", "attention.dense")),  # parallel block, two norms
    "falcon": Case("FalconForCausalLM", "FalconConfig", dict(LLAMA, num_key_value_heads=None, multi_query=True,
                                                             parallel_attn=True, bias=False),
                   decoder("transformer.h", "self_attention.dense")),  # fused query_key_value: z is dense's input
    "llama": Case("LlamaForCausalLM", "LlamaConfig", dict(LLAMA, attention_bias=True, mlp_bias=True), LLAMA_LAYOUT),
    "mistral": Case("MistralForCausalLM", "MistralConfig", dict(LLAMA, sliding_window=4), LLAMA_LAYOUT),
    "qwen2": Case("Qwen2ForCausalLM", "Qwen2Config", dict(LLAMA, use_sliding_window=True, sliding_window=4,
                                                          max_window_layers=1), LLAMA_LAYOUT),
    "qwen3": Case("Qwen3ForCausalLM", "Qwen3Config", dict(LLAMA, head_dim=16), LLAMA_LAYOUT),
    "gemma": Case("GemmaForCausalLM", "GemmaConfig", dict(LLAMA, head_dim=16), LLAMA_LAYOUT),
    # sandwich blocks: attn.out is o_proj's output, before post_attention_layernorm; mlp.out before
    # post_feedforward_layernorm
    "gemma2": Case("Gemma2ForCausalLM", "Gemma2Config",
                   dict(LLAMA, head_dim=16, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                        final_logit_softcapping=3.0), LLAMA_LAYOUT),
    "gemma3_text": Case("Gemma3ForCausalLM", "Gemma3TextConfig",
                        dict(LLAMA, num_hidden_layers=3, num_key_value_heads=1, head_dim=16, sliding_window=4,
                             sliding_window_pattern=3, query_pre_attn_scalar=16), LLAMA_LAYOUT),
    # sublayer_output blocks: attn.out and mlp.out before their post-norms
    "olmo2": Case("Olmo2ForCausalLM", "Olmo2Config", LLAMA, LLAMA_LAYOUT),
    "phi": Case("PhiForCausalLM", "PhiConfig", dict(LLAMA, num_key_value_heads=None),
                decoder("model.layers", "self_attn.dense")),  # parallel block, one norm
    "phi3": Case("Phi3ForCausalLM", "Phi3Config", dict(LLAMA, sliding_window=4), LLAMA_LAYOUT),  # fused qkv, gate_up
    "opt": Case("OPTForCausalLM", "OPTConfig", dict(LLAMA, num_key_value_heads=None, intermediate_size=None,
                                                    ffn_dim=48),
                # no MLP module: fc2's output is mlp.out, flattened to (B * T, hidden)
                decoder("model.decoder.layers", "self_attn.out_proj", "fc2")),
    # encoders (post-norm but where noted): attn.out and mlp.out before the residual's norm
    "bert": Case("BertForMaskedLM", "BertConfig", ENCODER, encoder("bert.encoder.layer")),
    "roberta": Case("RobertaForMaskedLM", "RobertaConfig", ROBERTA, encoder("roberta.encoder.layer"), pad=1),
    "xlm-roberta": Case("XLMRobertaForMaskedLM", "XLMRobertaConfig", ROBERTA, encoder("roberta.encoder.layer"),
                        pad=1),
    "electra": Case("ElectraForMaskedLM", "ElectraConfig", dict(ENCODER, embedding_size=16),
                    encoder("electra.encoder.layer")),  # resid_pre of block 0: after embeddings_project
    "distilbert": Case("DistilBertForMaskedLM", "DistilBertConfig",
                       dict(vocab_size=96, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=64,
                            initializer_range=0.2),
                       encoder("distilbert.transformer.layer", "attention.out_lin", "ffn")),
    # ALBERT: one layer module (one group) run at every depth; its hooks fire once per depth, in order
    "albert": Case("AlbertForMaskedLM", "AlbertConfig", dict(ENCODER, embedding_size=16, num_hidden_layers=3),
                   encoder("albert.encoder.albert_layer_groups.0.albert_layers.0", "attention.dense", "ffn_output")),
    "mpnet": Case("MPNetForMaskedLM", "MPNetConfig", dict(ENCODER, max_position_embeddings=66),
                  encoder("mpnet.encoder.layer", "attention.attn.o")),
    "deberta-v2": Case("DebertaV2ForMaskedLM", "DebertaV2Config",
                       dict(ENCODER, relative_attention=True, pos_att_type="p2c|c2p", position_buckets=4,
                            max_relative_positions=6, share_att_key=True, norm_rel_ebd="layer_norm",
                            position_biased_input=False, type_vocab_size=0, initializer_range=0.2),
                       encoder("deberta.encoder.layer")),
    # pre-norm encoder; its first block has no attention norm
    "modernbert": Case("ModernBertForMaskedLM", "ModernBertConfig",
                       dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                            num_attention_heads=4, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
                            eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1, global_rope_theta=1000.0,
                            local_rope_theta=50.0, initializer_range=0.2),
                       encoder("model.layers", "attn.Wo", "mlp")),
    # encoder-decoders: both stacks, and the decoder's cross-attention
    "bart": Case("BartForConditionalGeneration", "BartConfig",
                 dict(BART, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2), BART_LAYOUT),
    "mbart": Case("MBartForConditionalGeneration", "MBartConfig",
                  dict(BART, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2), BART_LAYOUT,
                  pad=1),
    "marian": Case("MarianMTModel", "MarianConfig",
                   dict(BART, pad_token_id=95, eos_token_id=94, decoder_start_token_id=95,
                        activation_function="swish"), BART_LAYOUT, pad=95),
    "t5": Case("T5ForConditionalGeneration", "T5Config", dict(T5, feed_forward_proj="relu"), T5_LAYOUT),
    "mt5": Case("MT5ForConditionalGeneration", "MT5Config", dict(T5, feed_forward_proj="gated-gelu"), T5_LAYOUT),
}


def test_every_registered_family_has_a_case():
    assert set(CASES) == set(FAMILIES), (f"no case for {sorted(set(FAMILIES) - set(CASES))}; "
                                         f"not registered: {sorted(set(CASES) - set(FAMILIES))}")


# ---------------------------------------------------------------- building and running both


@dataclass
class Pair:
    case: Case
    hf: nn.Module
    ours: nn.Module
    path: object  # the checkpoint's directory

    @property
    def seq2seq(self) -> bool:
        return "decoder." in self.case.stacks

    def inputs(self, device) -> dict[str, torch.Tensor]:
        """The padded batch for both models (transformers' argument names, which tfcli shares)."""
        ids = torch.tensor([[self.case.pad if i is None else i for i in row] for row in IDS])
        inputs = {"input_ids": ids, "attention_mask": MASK}
        if self.seq2seq:
            decoder_ids = DECODER_IDS.clone()
            decoder_ids[:, 0] = self.ours.config.decoder_start_token_id
            inputs.update(decoder_input_ids=decoder_ids, decoder_attention_mask=DECODER_MASK)
        return {name: value.to(device) for name, value in inputs.items()}

    def masks(self, device) -> dict[str, torch.Tensor]:
        """Each stack's mask of real tokens, by prefix."""
        return {prefix: (DECODER_MASK if prefix == "decoder." else MASK).to(device) for prefix in self.case.stacks}

    def layers(self, prefix: str) -> list[nn.Module]:
        """transformers' layer module at each depth of the stack `prefix`."""
        stack = self.ours.decoder if prefix == "decoder." or self.ours.encoder is None else self.ours.encoder
        found = self.hf.get_submodule(self.case.stacks[prefix].layers)
        modules = list(found) if isinstance(found, nn.ModuleList) else [found] * len(stack.blocks)
        assert len(modules) == len(stack.blocks)
        return modules

    def modules(self, prefix: str, part: str) -> list[nn.Module]:
        """transformers' module at each depth for `part`: "layer", "attn", "mlp" or "cross"."""
        layers = self.layers(prefix)
        if part == "layer":
            return layers
        return [layer.get_submodule(getattr(self.case.stacks[prefix], part)) for layer in layers]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, save_hf_model):
    """pair(model_type, device="cpu") -> Pair: transformers' tiny model (eager attention, eval mode, biases and norms
    random) and tfcli's loaded from its checkpoint, built once per module."""
    import copy

    import transformers

    built: dict[tuple[str, str], Pair] = {}

    def get(model_type: str, device: str = "cpu") -> Pair:
        if (model_type, "cpu") not in built:
            case = CASES[model_type]
            path = tmp_path_factory.mktemp(model_type)
            config = getattr(transformers, case.config)(**copy.deepcopy(case.settings))
            hf = save_hf_model(getattr(transformers, case.model), config, path, perturb=True)
            built[model_type, "cpu"] = Pair(case, hf, tfcli.load_model(str(path)), path)
        if (model_type, device) not in built:
            cpu = built[model_type, "cpu"]
            built[model_type, device] = Pair(cpu.case, copy.deepcopy(cpu.hf).to(device),
                                             tfcli.load_model(str(cpu.path), device=device), cpu.path)
        return built[model_type, device]

    return get


def input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def output_of(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextmanager
def hooks_at_depths(modules: list[nn.Module], fn: Callable, pre: bool = False) -> Iterator[None]:
    """Hook each module of `modules` (the module at each depth) with fn(depth, args, kwargs) before its forward
    (`pre`; it may return new (args, kwargs)) or fn(depth, output) after it (it may return a new output). A module run
    at several depths (ALBERT's shared layer) is hooked once and calls fn with the depth of each call in turn. For one
    forward pass: the hooks are removed on exit."""
    depths: dict[int, list[int]] = {}
    unique: dict[int, nn.Module] = {}
    for depth, module in enumerate(modules):
        depths.setdefault(id(module), []).append(depth)
        unique[id(module)] = module

    def next_depth(calls: list[int]) -> int:
        assert calls, "a hooked module ran more often than the stack has layers"
        return calls.pop(0)

    handles = []
    try:
        for key, module in unique.items():
            calls = list(depths[key])
            if pre:
                handles.append(module.register_forward_pre_hook(
                    lambda _, args, kwargs, calls=calls: fn(next_depth(calls), args, kwargs), with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(
                    lambda _, args, output, calls=calls: fn(next_depth(calls), output)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def recorded(pair: Pair) -> Iterator[dict[str, torch.Tensor]]:
    """A dict that transformers' next forward pass fills, through hooks on the case's modules, with its values of
    tfcli's sites (by their names): resid_pre, attn.z, attn.out, mlp.out, resid_post and cross_attn.z, .out."""
    theirs: dict[str, torch.Tensor] = {}
    heads = pair.ours.config.num_attention_heads

    def by_heads(x: torch.Tensor) -> torch.Tensor:  # (B, T, H * D) -> (B, T, H, D)
        return x.unflatten(-1, (heads, -1))

    def by_tokens(x: torch.Tensor) -> torch.Tensor:  # OPT's feed-forward runs on (B * T, hidden)
        return x.unflatten(0, (len(IDS), -1)) if x.dim() == 2 else x

    with ExitStack() as hooks:
        for prefix, where in pair.case.stacks.items():
            def keep(site: str, depth: int, value: torch.Tensor, prefix=prefix) -> None:
                theirs[f"{prefix}blocks.{depth}.{site}"] = value.detach().clone()

            def before(part: str, site: str, shape: Callable = lambda x: x, keep=keep, prefix=prefix) -> None:
                hooks.enter_context(hooks_at_depths(pair.modules(prefix, part), lambda depth, args, kwargs: keep(
                    site, depth, shape(input_of(args, kwargs))), pre=True))

            def after(part: str, site: str, shape: Callable = lambda x: x, keep=keep, prefix=prefix) -> None:
                hooks.enter_context(hooks_at_depths(pair.modules(prefix, part), lambda depth, output: keep(
                    site, depth, shape(output_of(output)))))

            before("layer", "resid_pre")
            after("layer", "resid_post")
            before("attn", "attn.z", by_heads)
            after("attn", "attn.out")
            after("mlp", "mlp.out", by_tokens)
            if where.cross is not None:
                before("cross", "cross_attn.z", by_heads)
                after("cross", "cross_attn.out")
        yield theirs


def their_patterns(pair: Pair, out) -> dict[str, torch.Tensor]:
    """transformers' attention weights (output_attentions=True) under tfcli's site names."""
    if not pair.seq2seq:
        sources = {"": ("attn", out.attentions)}.items()
    else:
        sources = [("encoder.", ("attn", out.encoder_attentions)), ("decoder.", ("attn", out.decoder_attentions)),
                   ("decoder.", ("cross_attn", out.cross_attentions))]
    return {f"{prefix}blocks.{depth}.{sub}.pattern": weights
            for prefix, (sub, weights_by_depth) in sources for depth, weights in enumerate(weights_by_depth)}


def logits_of(pair: Pair, logits: torch.Tensor, device) -> torch.Tensor:
    """Logits of the real tokens of the stack the head reads."""
    real = (DECODER_MASK if pair.seq2seq else MASK).to(device).bool()
    return logits[real]


# ---------------------------------------------------------------- every block's sites


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_type", [pytest.param(t, marks=CASES[t].marks) for t in CASES])
def test_sites_equal_transformers_modules(model_type, device, pair, assert_close):
    pair = pair(model_type, device)
    inputs = pair.inputs(device)
    with torch.no_grad(), recorded(pair) as theirs:
        out = pair.hf(**inputs, output_attentions=True)
    theirs.update(their_patterns(pair, out))
    logits, cache = pair.ours.run_with_cache(inputs.pop("input_ids"), names=[f"*{site}" for site in LAYER_SITES],
                                             **inputs)

    masks = pair.masks(device)
    expected = []
    for prefix, stack in pair.case.stacks.items():
        for depth in range(len(pair.layers(prefix))):
            leaves = LAYER_SITES + (CROSS_SITES if stack.cross is not None else ())
            expected += [f"{prefix}blocks.{depth}.{leaf}" for leaf in leaves]
    assert sorted(theirs) == sorted(expected)  # every hook fired: each site has transformers' value
    for name in expected:
        prefix = name.split("blocks.")[0]
        real = masks[prefix]
        ours = cache[name]
        if name.endswith("pattern"):  # (B, H, T, S): the real queries against the real keys
            keys = masks["encoder."] if "cross_attn" in name else real
            for row in range(real.shape[0]):
                n, m = int(real[row].sum()), int(keys[row].sum())
                assert_close(f"{name}[{row}]", ours[row, :, :n, :m], theirs[name][row, :, :n, :m])
        else:
            assert_close(name, ours[real.bool()], theirs[name][real.bool()])
    assert_close("logits", logits_of(pair, logits, device), logits_of(pair, out.logits, device))


# ---------------------------------------------------------------- a replacement, made on both


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=CASES[t].marks) for t in CASES])
def test_zeroing_a_head_changes_the_logits_as_in_transformers(model_type, pair, assert_close):
    """Head 1 of every stack's last block's z zeroed at every position (and head 2 of the last decoder block's
    cross-attention): through run_with_hooks, and by a pre-hook on transformers' output projection that zeroes the
    head's slice of its input."""
    pair = pair(model_type)
    inputs = pair.inputs("cpu")
    size = pair.ours.config.head_size
    hooks, managers = {}, []
    for prefix, stack in pair.case.stacks.items():
        last = len(pair.layers(prefix)) - 1
        for part, sub, head in (("attn", "attn", 1), ("cross", "cross_attn", 2)):
            if getattr(stack, part) is None:
                continue
            hooks[f"{prefix}blocks.{last}.{sub}.z"] = sites.zero(f"{prefix}blocks.{last}.{sub}.z", heads=[head])

            def zero_slice(depth, args, kwargs, last=last, head=head):
                if depth != last:
                    return None
                x = input_of(args, kwargs).clone()
                x[..., head * size:(head + 1) * size] = 0
                return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

            managers.append(hooks_at_depths(pair.modules(prefix, part), zero_slice, pre=True))
    assert_same_replacement(pair, inputs, hooks, managers, assert_close)


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=CASES[t].marks) for t in CASES])
def test_adding_to_the_residual_stream_changes_the_logits_as_in_transformers(model_type, pair, assert_close):
    """A vector added to every stack's blocks.0.resid_post at position 1 (`sites.add`), and by a hook on
    transformers' first layer that adds it to the layer's output."""
    pair = pair(model_type)
    inputs = pair.inputs("cpu")
    vector = torch.linspace(-1.0, 1.0, pair.ours.config.hidden_size)
    hooks, managers = {}, []
    for prefix in pair.case.stacks:
        name = f"{prefix}blocks.0.resid_post"
        hooks[name] = sites.add(name, vector, positions=[1])

        def add_at_1(depth, output):
            if depth != 0:
                return None
            hidden = output_of(output).clone()
            hidden[:, 1] += vector
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        managers.append(hooks_at_depths(pair.modules(prefix, "layer"), add_at_1))
    assert_same_replacement(pair, inputs, hooks, managers, assert_close)


def assert_same_replacement(pair: Pair, inputs: dict, hooks: dict, managers: list, assert_close) -> None:
    """The logits of tfcli's run_with_hooks(hooks) and of transformers' model under `managers` (hooks_at_depths that
    make the same replacement) are the same, and differ from the plain pass's (so the check could fail)."""
    with torch.no_grad():
        plain = pair.hf(**inputs).logits
        with ExitStack() as stack:
            for manager in managers:
                stack.enter_context(manager)
            theirs = pair.hf(**inputs).logits
        ids = inputs.pop("input_ids")
        ours = pair.ours.run_with_hooks(ids, hooks, **inputs)
    plain, theirs, ours = (logits_of(pair, x, "cpu") for x in (plain, theirs, ours))
    assert (theirs - plain).abs().max() > 1e-2, "the replacement changed nothing: the check could not fail"
    assert_close("logits after the replacement", ours, theirs)


# ---------------------------------------------------------------- one forward engine: patch's fast sweep


@pytest.mark.parametrize("model_type", [pytest.param(t, marks=CASES[t].marks) for t in CASES])
def test_the_fast_patch_sweep_equals_one_pass_per_site(model_type, pair):
    """`tfcli patch`'s fast sweep starts its patched runs inside a stack (Stack.run_blocks from the layer patched, over
    the positions a causal patch can change, with the corrupt run's keys and values before them, batched) and must
    equal the naive sweep (one whole pass per site, Stack.forward with a hook), site kind by site kind: a position
    scheme, mask or bias that the engine did not carry would show here, in every family. Compared in logit units
    (the normalised score times clean - corrupt), the metric before the last position of a decoder, so that the
    sweep also skips the patches after it."""
    from tfcli.commands.patch import core as patch

    p = pair(model_type)
    clean = [p.case.pad if i is None else i for i in IDS[0]]
    corrupt = list(clean)
    corrupt[2], corrupt[4] = 43, 78  # two positions differ
    decoder_only = p.ours.config.architecture == "decoder"
    options = patch.PatchOptions(target="#40", foil="#13", position=-2 if decoder_only else None,
                                 sites=tuple(patch.KINDS))
    tokenizer = tfcli.load_tokenizer(str(p.path))
    fast = patch.run_ids(p.ours, tokenizer, clean, corrupt, options)
    options.fast = False
    naive = patch.run_ids(p.ours, tokenizer, clean, corrupt, options)
    scale = fast.clean_value - fast.corrupt_value
    assert fast.grids.keys() == naive.grids.keys() and naive.done == naive.total
    largest = 0.0
    for site in fast.grids:
        a, b = (torch.tensor(r.grids[site], dtype=torch.float64) * scale for r in (fast, naive))
        assert a.shape == b.shape, site
        assert (a - b).abs().max() <= 1e-4, (site, (a - b).abs().max())
        largest = max(largest, float(b.abs().max()))
    assert largest > 1e-3, "no patch moved the metric: the check could not fail"


# ---------------------------------------------------------------- the shapes site_shapes lists


@pytest.mark.parametrize("model_type", ["bert", "gpt2", "llama", "gemma2", "gpt_neox", "bart"])
def test_site_shapes_list_the_sites_of_a_real_pass(model_type, pair):
    """Post-norm, pre-norm, gated, sandwich, parallel blocks and an encoder-decoder: site_shapes (a pass on the meta
    device) lists the names a real run_with_cache keeps, in its order, with its shapes, B, T and S as letters."""
    ours = pair(model_type).ours
    batch, tokens, source = 3, 5, 6  # sizes no other dimension of these models has
    letters = {batch: "B", tokens: "T", source: "S"}
    if ours.config.architecture == "encoder-decoder":
        ids = torch.full((batch, source), 7)
        inputs = {"decoder_input_ids": torch.full((batch, tokens), 7)}
    else:
        ids, inputs = torch.full((batch, tokens), 7), {}
    _, cache = ours.run_with_cache(ids, **inputs)
    real = [(name, tuple(letters.get(size, size) for size in value.shape)) for name, value in cache.items()]
    assert list(ours.site_shapes().items()) == real
    prefix = "decoder." if ours.config.architecture == "encoder-decoder" else ""
    assert (f"{prefix}blocks.1.resid_mid" in cache) == (not ours.config.parallel_residual)


# ---------------------------------------------------------------- gradients


def test_cached_gradients_equal_transformers_autograd(pair, assert_close):
    """run_with_cache(grad=True) on GPT-2: after a logit difference's backward, cache[name].grad equals the gradient
    transformers' autograd gives the same tensors (layer 0's output, the input of layer 1's c_proj)."""
    pair = pair("gpt2")
    ids = torch.tensor([IDS[0]])
    heads = pair.ours.config.num_attention_heads

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, 7] - logits[0, -1, 11]

    logits, cache = pair.ours.run_with_cache(ids, names=["blocks.0.resid_post", "blocks.1.attn.z"], grad=True)
    metric(logits).backward()

    kept = {}

    def retain(key: str, value: torch.Tensor) -> None:
        value.retain_grad()
        kept[key] = value

    layers = pair.modules("", "layer")
    with torch.enable_grad(), \
            hooks_at_depths(layers, lambda d, o: retain(f"out{d}", output_of(o))), \
            hooks_at_depths(pair.modules("", "attn"), lambda d, a, k: retain(f"z{d}", input_of(a, k)), pre=True):
        metric(pair.hf(input_ids=ids).logits).backward()
    pair.hf.zero_grad(set_to_none=True)
    assert cache["blocks.0.resid_post"].grad is not None and cache["blocks.1.attn.z"].grad is not None
    assert_close("d metric / d blocks.0.resid_post", cache["blocks.0.resid_post"].grad, kept["out0"].grad)
    assert_close("d metric / d blocks.1.attn.z", cache["blocks.1.attn.z"].grad,
                 kept["z1"].grad.unflatten(-1, (heads, -1)))
    assert cache["blocks.1.attn.z"].grad.abs().max() > 1e-4  # a gradient that says something
