"""Nested split hook points: blocks.L.hook_attn_out.hook_par / .hook_perp."""

import pytest
import torch

import tl_directional as tld
from tl_directional.model.split_hooks import attach_split_hook_points, split_hook_points

from ._families import CAUSAL

TOKENS = torch.tensor([[0, 5, 9, 13, 22, 7, 31]])


@pytest.mark.parametrize("family", CAUSAL)
def test_children_cache_split_and_model_is_unchanged(tiny_model, family):
    model = tiny_model(family)
    base = model(TOKENS)
    _, plain = model.run_with_cache(TOKENS)
    with split_hook_points(model) as handle:
        assert "blocks.1.hook_mlp_out.hook_perp" in handle.names and "blocks.0.attn.hook_z.hook_par" in handle.names
        assert torch.equal(model(TOKENS), base)  # no hooks on the children: bit-exact
        _, cache = model.run_with_cache(TOKENS, names_filter=lambda n: n.endswith(("hook_par", "hook_perp")))
        for L in range(model.cfg.n_layers):
            sites = tld.resolve_sites(model)
            u = sites.unit("mlp", L)
            par, perp = cache[f"{u.update_hook}.hook_par"], cache[f"{u.update_hook}.hook_perp"]
            assert torch.allclose(par + perp, plain[u.update_hook], atol=1e-6)
            assert (tld.decompose(perp, plain[u.reference_hook]).par_frac < 1e-3).all()
            z_par = cache[f"blocks.{L}.attn.hook_z.hook_par"]
            assert z_par.shape == plain[f"blocks.{L}.attn.hook_z"].shape
    assert torch.equal(model(TOKENS), base)
    assert "blocks.0.hook_attn_out.hook_par" not in model.hook_dict
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_hooking_a_child_is_the_same_as_the_edit(tiny_model):
    model = tiny_model("llama")
    with split_hook_points(model, components=("attn", "value")):
        zero_par = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.hook_attn_out.hook_par", lambda t, hook: 0 * t)])
        half_perp_v = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_z.hook_perp", lambda t, hook: 0.5 * t)])
    with tld.apply_edits(model, tld.ResidualScale("attn", 0.0, layers=[1])):
        ref = model(TOKENS)
    with tld.apply_edits(model, tld.ValueScale(1.0, 0.5, layers=[0])):
        ref_v = model(TOKENS)
    assert torch.allclose(zero_par, ref, atol=1e-5)
    assert torch.allclose(half_perp_v, ref_v, atol=1e-5)


def test_user_hooks_survive_removal_and_errors_clean_up(tiny_model):
    model = tiny_model("gpt2", fresh=True)
    marker = []
    model.add_perma_hook("blocks.0.hook_attn_out", lambda t, hook: marker.append(1))
    handle = attach_split_hook_points(model, layers=[0])
    handle.remove()
    model(TOKENS)
    assert marker, "the user's permanent hook must stay"
    with pytest.raises(ValueError, match="components has unknown entry 'block'; choose from \\('attn', 'mlp', 'value'\\)"):
        attach_split_hook_points(model, components=("block",))
    with split_hook_points(model, layers=[1]):
        with pytest.raises(ValueError, match="already exists"):
            attach_split_hook_points(model, layers=[1])
    assert "blocks.1.hook_attn_out.hook_par" not in model.hook_dict


def test_nested_points_are_registered_the_lanes_way(tiny_model, lane):
    """Legacy lane: a real child module of its parent hook point, registered by TL's public
    HookedRootModule.setup(); bridge: an entry of the hook registry (no public call on TL 4.3).
    Either way hooks(), run_with_hooks and run_with_cache see it, and removal leaves nothing."""
    model = tiny_model("gpt2", fresh=True)
    parent = tld.resolve_sites(model).unit("attn", 0).update_hook
    name = f"{parent}.hook_par"
    with split_hook_points(model, components=("attn", "value"), layers=[0]):
        modules = dict(model.named_modules())
        assert (modules.get(name) is model.hook_dict[name]) == (lane == "legacy")
        assert "blocks.0.hook_z.hook_par" in model.hook_dict  # TL's get_act_name spelling, kept
        seen = []
        with model.hooks(fwd_hooks=[(name, lambda t, hook: seen.append(hook.name))]):
            model(TOKENS)
        model.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda t, hook: seen.append(hook.name))])
        _, cache = model.run_with_cache(TOKENS, names_filter=[name, "blocks.0.hook_z.hook_par"])
        assert seen == [name, name] and set(cache.keys()) == {name, "blocks.0.hook_z.hook_par"}
    assert name not in model.hook_dict and name not in dict(model.named_modules())
    assert "blocks.0.hook_z.hook_par" not in model.hook_dict


def _split_gap(cache, parent):
    return (cache[f"{parent}.hook_par"] + cache[f"{parent}.hook_perp"] - cache[parent]).abs().max().item()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_children_split_the_value_the_parent_finally_holds(tiny_model, family):
    """Issue 23 item 1: whatever the order of split points, edits and user hooks on the
    parent, hook_par + hook_perp is the parent's final value (the split runs last)."""
    model = tiny_model(family)
    sites = tld.resolve_sites(model)
    parent = sites.unit("attn", 1).update_hook
    z = sites.value[1].z_hook
    edits = (tld.ResidualScale("attn", s_par=0.0, layers=[1]), tld.ValueScale(0.0, 0.5, layers=[1]))
    double = (parent, lambda t, hook: 2.0 * t)

    def check(cache):
        assert _split_gap(cache, parent) < 1e-5
        assert _split_gap(cache, z) < 1e-5

    # split outside / inside the edits
    with split_hook_points(model, layers=[1]), tld.apply_edits(model, *edits):
        _, c = model.run_with_cache(TOKENS)
    check(c)
    with tld.apply_edits(model, *edits), split_hook_points(model, layers=[1]):
        _, c = model.run_with_cache(TOKENS)
    check(c)
    # a user hook on the parent, added after the split (hooks() and run_with_hooks) and before it
    with split_hook_points(model, layers=[1]):
        with model.hooks(fwd_hooks=[double]):
            _, c = model.run_with_cache(TOKENS)
        check(c)
        seen = {}
        def keep(name):
            return name, lambda t, hook: seen.__setitem__(name, t.clone())
        model.run_with_hooks(TOKENS, fwd_hooks=[double, keep(parent), keep(f"{parent}.hook_par"),
                                                keep(f"{parent}.hook_perp")])
        assert torch.allclose(seen[f"{parent}.hook_par"] + seen[f"{parent}.hook_perp"], seen[parent], atol=1e-5)
    with model.hooks(fwd_hooks=[double]), split_hook_points(model, layers=[1]), tld.apply_edits(model, *edits):
        _, c = model.run_with_cache(TOKENS)
    check(c)
    # hooking a child still changes what flows on, after every parent hook
    with split_hook_points(model, layers=[1]), tld.apply_edits(model, edits[0]):
        out = model.run_with_hooks(TOKENS, fwd_hooks=[(f"{parent}.hook_perp", lambda t, hook: 0 * t)])
    with tld.apply_edits(model, tld.ResidualScale("attn", 0.0, 0.0, layers=[1])):
        ref = model(TOKENS)
    assert torch.allclose(out, ref, atol=1e-5)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    assert all(not hp._forward_pre_hooks for hp in model.hook_dict.values())
