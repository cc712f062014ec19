"""Directional activation patching (METHOD.md sec. 5) and split direct logit attribution."""

import pytest
import torch

import tl_directional as tld
from tl_directional.patching import directional_patch, split_dla_figure, split_logit_attribution

from ._families import CAUSAL

CLEAN = torch.tensor([[0, 5, 9, 13, 22, 7, 31, 12]])
CORRUPTED = torch.tensor([[0, 5, 9, 14, 22, 7, 31, 12]])


def metric(logits):
    return logits[0, -1, 3] - logits[0, -1, 4]


@pytest.mark.parametrize("family", CAUSAL)
def test_result_shapes_follow_transformer_lens_patching(tiny_model, family):
    model = tiny_model(family)
    comps = ("attn", "mlp", "block", "value")
    res, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=comps)
    L, H, P = model.cfg.n_layers, model.cfg.n_heads, CLEAN.shape[1]
    assert res["attn"]["par"].shape == (L,) and res["value"]["perp"].shape == (L, H)
    res_p, _ = directional_patch(model, CLEAN, CORRUPTED, metric, components=("mlp", "value"), per_position=True, layers=[1])
    assert res_p["mlp"]["full"].shape == (L, P) and res_p["value"]["full"].shape == (L, P, H)
    assert torch.isnan(res_p["mlp"]["full"][0]).all() and not torch.isnan(res_p["mlp"]["full"][1]).any()
    # the interaction is reported, not assumed to vanish
    assert {"effect_par", "effect_perp", "effect_full", "par_plus_perp_minus_full"} <= set(table.columns)
    assert (table["effect_par"] + table["effect_perp"] - table["effect_full"] - table["par_plus_perp_minus_full"]).abs().max() < 1e-6


def test_identical_runs_give_zero_effects(tiny_model):
    model = tiny_model("gpt2")
    _, table = directional_patch(model, CLEAN, CLEAN, metric, components=("attn", "value"))
    assert table[["effect_par", "effect_perp", "effect_full"]].abs().max().max() < 1e-5


def test_patched_tensor_is_the_directional_mix(tiny_model):
    """The par patch puts the clean parallel part on the corrupted perpendicular part."""
    model = tiny_model("gpt2")
    name_u, name_r = "blocks.1.hook_mlp_out", "blocks.1.hook_resid_mid"
    _, clean = model.run_with_cache(CLEAN)
    _, corr = model.run_with_cache(CORRUPTED)
    seen = {}
    from tl_directional.patching import _patch_residual_hooks

    unit = tld.resolve_sites(model).unit("mlp", 1)
    hooks = _patch_residual_hooks(unit, clean[name_u], "par", None, 1e-12)
    hooks.append((name_u, lambda t, hook: seen.setdefault("u", t.detach().clone())))
    model.run_with_hooks(CORRUPTED, fwd_hooks=hooks)
    r = corr[name_r]
    got = tld.decompose(seen["u"], r)
    assert torch.allclose(got.par, tld.decompose(clean[name_u], r).par.float(), atol=1e-5)
    assert torch.allclose(got.perp, tld.decompose(corr[name_u], r).perp.float(), atol=1e-5)


def test_patching_positions_before_the_corruption_does_nothing(tiny_model):
    # Full patch of layer-0 attention at the corrupted position only: positions before it are untouched.
    model = tiny_model("gpt2")
    res, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=("attn",), per_position=True, layers=[0])
    effects = res["attn"]["full"][0] - table["corrupted_metric"].iloc[0]
    assert effects[:3].abs().max() < 1e-6  # patching a position before the change does nothing (same clean/corrupted there)
    assert effects[3:].abs().max() > 1e-4


def test_split_dla_adds_up(tiny_model):
    model = tiny_model("llama")
    table = split_logit_attribution(model, torch.cat([CLEAN, CORRUPTED]), [3, 3], wrong_tokens=[4, 4])
    assert (table["dla"] - table["dla_par"] - table["dla_perp"]).abs().max() < 1e-5
    assert set(table["unit"]) == {"attn", "mlp", "head"}
    # heads' outputs without the bias add up to the attention sub-layer's DLA (llama: no b_O)
    heads = table[table.unit == "head"].groupby(["sequence", "layer"])["dla"].sum()
    attn = table[table.unit == "attn"].set_index(["sequence", "layer"])["dla"]
    assert torch.allclose(torch.tensor(heads.values), torch.tensor(attn.loc[heads.index].values), atol=1e-4)
    assert len(split_dla_figure(table).figure.data) == 2  # a PlotlyView, like the other views


def test_patching_bad_input(tiny_model):
    model = tiny_model("gpt2")
    with pytest.raises(ValueError, match="same token shape"):
        directional_patch(model, CLEAN, CORRUPTED[:, :5], metric)
    with pytest.raises(ValueError, match="components has unknown entry 'resid'; choose from"):
        directional_patch(model, CLEAN, CORRUPTED, metric, components=("resid",))
    with pytest.raises(ValueError, match="heads has 7"):
        directional_patch(model, CLEAN, CORRUPTED, metric, components=("value",), heads=[7])
    with pytest.raises(ValueError, match="answer_tokens has 2 entries for 1 sequences"):
        split_logit_attribution(model, CLEAN, [3, 4])
