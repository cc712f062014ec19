"""The MLP carrier edits on plain ``transformers`` models (tl_directional.edit.hf.carrier): the
same edit object gives the TransformerLens lane's loss and is a bit-exact no-op at scale 1."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tl_directional.edit.hf.carrier import apply_carrier_edits, install_carrier_edits
from tl_directional.model.load import load_hf_model, load_model

FAMILIES = ("gpt2", "llama", "neox")


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    cache: dict = {}

    def get(family):
        if family not in cache:
            d = tiny_model_dir(family)
            cache[family] = (load_model(d).eval(), load_hf_model(d))
        return cache[family]

    return get


def _ids():
    return torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("site", ["input", "block"])
def test_hf_carrier_matches_the_transformerlens_lane(pair, family, site):
    tl, hf = pair(family)
    ids = _ids()
    before = _hooks(hf)
    with torch.no_grad():
        base = hf(ids).logits
        with apply_carrier_edits(hf, tld.MLPCarrierScale(1.0, 1.0, site=site)):
            assert torch.equal(hf(ids).logits, base)
        for sp, sq, layers in [(0.0, 1.0, None), (0.5, 0.0, [1])]:
            edit = tld.MLPCarrierScale(sp, sq, site=site, layers=layers)
            with tld.apply_edits(tl, edit):
                want = tl(ids)
            with apply_carrier_edits(hf, edit):
                got = hf(ids).logits
            assert (got - base).abs().max() > 1e-3
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert _hooks(hf) == before


def test_hf_carrier_gradients_and_refusals(pair):
    _, hf = pair("llama")
    ids = _ids()
    s = torch.tensor([0.3, 0.7], requires_grad=True)
    with apply_carrier_edits(hf, tld.MLPCarrierScale(s, site="block")):
        hf(ids).logits.logsumexp(-1).mean().backward()
    assert s.grad is not None and bool((s.grad != 0).all())
    assert hf.model.layers[0].mlp.down_proj.weight.grad is not None
    hf.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="positions=\\[1\\].*use the TransformerLens lane"):
        install_carrier_edits(hf, tld.MLPCarrierScale(0.0, positions=[1]))
    with pytest.raises(TypeError, match="install_carrier_edits takes MLPCarrierScale"):
        install_carrier_edits(hf, tld.ResidualScale("mlp", 0.0))
