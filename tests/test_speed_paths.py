"""The fast paths stay fast by construction: a plain pass does no per-site work, a pass that wants only some sites
(the logit lens's hidden states, a steering hook) skips the others' scopes, and decoding with the lens packs a tied
head's copy for its products while it runs and drops it after. Behaviour, not timings."""

from __future__ import annotations

import pytest
import torch

from tfcli.model import sites as sites_module
from tfcli.model.decoding import decode
from tfcli.model.linear import PACKABLE
from tfcli.model.sites import NO_SITES, Sites, hidden_site

from conftest import TINY_DECODER

IDS = torch.tensor([[101, 2023, 2003, 1037]])
LENS_NAMES = {hidden_site(i) for i in range(3)}  # the tiny decoder's 2 blocks: embeddings and each block's output


def test_a_plain_pass_builds_no_site_names_and_looks_up_no_hooks(yaml_model, monkeypatch):
    model = yaml_model(TINY_DECODER)

    def refuse(*args, **kwargs):
        raise AssertionError("a plain pass did per-site work")

    for name in ("__call__", "scope", "wants"):  # NO_SITES overrides each of them with a no-op
        monkeypatch.setattr(Sites, name, refuse)
    with torch.no_grad():
        model(IDS)
        model.generate(IDS, max_new_tokens=2)
    assert type(NO_SITES) is not Sites


def test_a_pass_wanting_only_the_hidden_states_skips_the_sublayers(yaml_model):
    model = yaml_model(TINY_DECODER)
    sites = Sites(set(LENS_NAMES))
    with torch.no_grad():
        model(IDS, sites=sites)
        _, every = model.run_with_cache(IDS)
    assert set(sites.cache) == LENS_NAMES
    assert not [name for name in sites.reached if ".attn." in name or ".mlp." in name]
    for name in LENS_NAMES:
        torch.testing.assert_close(sites.cache[name], every[name])  # (every site: explicit attention, packed)


def test_a_hook_inside_a_sublayer_still_runs_and_an_unknown_name_is_still_refused(yaml_model):
    model = yaml_model(TINY_DECODER)
    with torch.no_grad():
        plain = model(IDS).logits
        zeroed = model.run_with_hooks(IDS, {"blocks.1.mlp.out": sites_module.zero("blocks.1.mlp.out")})
        steered = Sites(hooks={"blocks.0.resid_post": lambda x: x + 1})
        model(IDS, sites=steered)
        with pytest.raises(Exception, match="no site"):
            model.run_with_hooks(IDS, {"blocks.1.mlp.outt": lambda x: None})
    assert not torch.equal(zeroed, plain)
    assert not [name for name in steered.reached if ".attn." in name or ".mlp." in name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decoding_with_the_lens_packs_a_tied_heads_copy_while_it_runs(yaml_model, dtype):
    if dtype not in PACKABLE:
        pytest.skip(f"oneDNN packs no {dtype} products here")
    model = yaml_model(TINY_DECODER, dtype=str(dtype).removeprefix("torch."))
    head = model.get_submodule("head.unembed")
    steps = decode(model, IDS, max_new_tokens=3, lens=True)
    first = next(steps)
    assert head._packed is not None and head.copy_rows == 3  # from the first lens product: 3 hidden states
    rest = list(steps)
    assert head._packed is None and head.copy_rows == 1  # the copy went with the loop
    plain = [step.tokens for step in decode(model, IDS, max_new_tokens=3)]
    assert [step.tokens for step in [first, *rest]] == plain
