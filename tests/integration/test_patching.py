"""Directional activation patching (METHOD.md sec. 5) and split direct logit attribution."""

import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.patching import directional_patch, split_logit_attribution
from tl_directional.views import split_dla_figure

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
    from tl_directional.evaluate.patching.patch_hooks import patch_residual_hooks

    unit = tld.resolve_sites(model).unit("mlp", 1)
    hooks = patch_residual_hooks(unit, clean[name_u], "par", None, 1e-12)
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
    table = split_logit_attribution(model, torch.cat([CLEAN, CORRUPTED]), [3, 3], incorrect_tokens=[4, 4])
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


# --- the fast path (cached runs, forwards from block L, stacked patches) against one full
# forward per patch (the previous implementation) and against transformer_lens.patching ----

ALL_UNITS = ("attn", "mlp", "block", "value", "resid_pre")


def _slow_patch(model, clean, corrupted, metric_fn, components, per_position, heads=None, attention_mask=None):
    """One full ``run_with_hooks`` forward per patch: the previous implementation's loop."""
    from tl_directional.evaluate.patching import WHICH
    from tl_directional.evaluate.patching.patch_hooks import patch_residual_hooks, patch_value_hooks

    sites = tld.resolve_sites(model, warn=False)
    _, cache = model.run_with_cache(clean, attention_mask=attention_mask)
    n_pos = clean.shape[1]
    heads = list(range(sites.n_heads)) if heads is None else heads
    out = {}
    for c in components:
        for L in range(sites.n_layers):
            for p in (range(n_pos) if per_position else [None]):
                mask = None
                if p is not None:
                    mask = torch.zeros(clean.shape, dtype=torch.bool)
                    mask[:, p] = True
                for h in (heads if c == "value" else [None]):
                    for w in WHICH:
                        if c == "value":
                            vs = sites.value[L]
                            hooks = patch_value_hooks(vs, sites.n_heads, h, cache[vs.z_hook], w, mask, 1e-12)
                        elif c == "resid_pre":
                            name = f"blocks.{L}.hook_resid_pre"

                            def hook(t, hook, name=name, w=w, mask=mask):  # noqa: ARG001
                                new = tld.patch_components(cache[name], t, t, w)
                                return new if mask is None else torch.where(mask.unsqueeze(-1), new, t)

                            hooks = [(name, hook)]
                        else:
                            u = sites.unit(c, L)
                            clean_u = cache[u.update_hook]
                            if u.update_is_difference:
                                clean_u = clean_u - cache[u.reference_hook]
                            hooks = patch_residual_hooks(u, clean_u, w, mask, 1e-12)
                        with torch.no_grad():
                            logits = model.run_with_hooks(corrupted, fwd_hooks=hooks, attention_mask=attention_mask)
                        out[(c, w, L) + ((p,) if p is not None else ()) + ((h,) if h is not None else ())] = float(
                            metric_fn(logits))
    return out


def _assert_matches_slow(res, slow):
    worst = max(abs(float(res[c][w][tuple(idx)]) - v) for (c, w, *idx), v in slow.items())
    assert worst < 1e-5, worst


@pytest.mark.parametrize("family", CAUSAL)
def test_fast_patching_equals_one_forward_per_patch(tiny_model, family):
    model = tiny_model(family)
    res, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=ALL_UNITS, per_position=True)
    _assert_matches_slow(res, _slow_patch(model, CLEAN, CORRUPTED, metric, ALL_UNITS, per_position=True))
    assert not any(torch.isnan(t).any() for r in res.values() for t in r.values())
    assert len(table) == model.cfg.n_layers * CLEAN.shape[1] * (4 + model.cfg.n_heads)


def test_fast_patching_equals_slow_path_without_positions(tiny_model):
    model = tiny_model("llama")  # GQA: the value patch reads the query head's shared KV head
    res, _ = directional_patch(model, CLEAN, CORRUPTED, metric, components=ALL_UNITS, heads=[1, 2])
    _assert_matches_slow(res, _slow_patch(model, CLEAN, CORRUPTED, metric, ALL_UNITS, per_position=False,
                                          heads=[1, 2]))
    assert torch.isnan(res["value"]["par"][:, [0, 3]]).all()


def test_fast_patching_equals_slow_path_on_a_padded_batch(tiny_model):
    model = tiny_model("llama")  # rotary positions and a padding mask: the forwards from block L keep both
    batch = tld.prepare_inputs(model, ["the cat sat on the mat", "a dog"])
    assert not batch.attention_mask.bool().all()
    clean, corrupted = batch.tokens, batch.tokens.clone()
    corrupted[:, 1] = (corrupted[:, 1] + 3) % model.cfg.d_vocab

    def mean_diff(logits):
        return (logits[:, -1, 3] - logits[:, -1, 4]).mean()

    comps = ("attn", "value", "resid_pre")
    res, _ = directional_patch(model, clean, corrupted, mean_diff, components=comps, per_position=True,
                               attention_mask=batch.attention_mask, heads=[0, 3], batch_size=5)
    _assert_matches_slow(res, _slow_patch(model, clean, corrupted, mean_diff, comps, per_position=True, heads=[0, 3],
                                          attention_mask=batch.attention_mask))


@pytest.mark.parametrize("family", CAUSAL)
def test_full_resid_pre_patch_equals_transformer_lens_patching(tiny_model, family):
    from transformer_lens import patching

    model = tiny_model(family)
    _, clean_cache = model.run_with_cache(CLEAN)
    want = patching.get_act_patch_resid_pre(model, CORRUPTED, clean_cache, metric)
    res, _ = directional_patch(model, CLEAN, CORRUPTED, metric, components=("resid_pre",), per_position=True,
                               which="full")
    assert res["resid_pre"]["full"].shape == want.shape
    assert (res["resid_pre"]["full"] - want.cpu().float()).abs().max() < 1e-5
    # and the full patch of each sub-layer is TL's attn_out / mlp_out patch
    for comp, tl_fn in (("attn", patching.get_act_patch_attn_out), ("mlp", patching.get_act_patch_mlp_out)):
        res, _ = directional_patch(model, CLEAN, CORRUPTED, metric, components=(comp,), per_position=True,
                                   which="full")
        assert (res[comp]["full"] - tl_fn(model, CORRUPTED, clean_cache, metric).cpu().float()).abs().max() < 1e-5


def _count_forwards(model):
    """Rows entering the last block, per forward (a hook on its resid_post)."""
    seen = []
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    return seen, model.hooks(fwd_hooks=[(name, lambda t, hook: seen.append(t.shape[0]))])


def test_chunking_does_not_change_results(tiny_model):
    model = tiny_model("neox")
    comps = ("block", "value", "resid_pre")
    ref, ref_table = directional_patch(model, CLEAN, CORRUPTED, metric, components=comps, per_position=True,
                                       batch_size=1)
    rows = {}
    for bs in (2, 7, None):
        seen, ctx = _count_forwards(model)
        with ctx:
            res, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=comps, per_position=True,
                                           batch_size=bs)
        rows[bs] = seen
        for c in comps:
            for w in ("par", "perp", "full"):
                assert (res[c][w] - ref[c][w]).abs().max() < 1e-5, (bs, c, w)
        assert list(table.columns) == list(ref_table.columns) and len(table) == len(ref_table)
        assert max(seen[2:]) <= (bs or 64)  # the first two forwards are the clean and corrupted runs
    # the same patched rows are run however they are chunked, in fewer forwards when stacked
    assert sum(rows[2][2:]) == sum(rows[7][2:]) == sum(rows[None][2:])
    assert len(rows[None]) < len(rows[7]) < len(rows[2])


def test_patches_that_change_nothing_need_no_forward(tiny_model):
    model = tiny_model("gpt2")
    seen, ctx = _count_forwards(model)
    with ctx:
        res, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=("resid_pre",),
                                       per_position=True, which="full", layers=[0])
    # layer 0's stream differs only at the corrupted token (position 3): one patched run
    assert seen[2:] == [1]
    assert (res["resid_pre"]["full"][0, [0, 1, 2, 4, 5, 6, 7]] == table["corrupted_metric"].iloc[0]).all()


def test_which_selects_the_patches_run(tiny_model):
    model = tiny_model("gpt2")
    every, _ = directional_patch(model, CLEAN, CORRUPTED, metric, components=("mlp",), per_position=True)
    only, table = directional_patch(model, CLEAN, CORRUPTED, metric, components=("mlp",), per_position=True,
                                    which=["perp", "par"])
    assert set(only["mlp"]) == {"par", "perp"}
    assert "metric_full" not in table and "par_plus_perp_minus_full" not in table
    for w in ("par", "perp"):
        assert (only["mlp"][w] - every["mlp"][w]).abs().max() < 1e-5


def test_patching_bad_knobs(tiny_model):
    model = tiny_model("gpt2")
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            directional_patch(model, CLEAN, CORRUPTED, metric, components=("attn",), batch_size=bad)
    for bad in (1.5, "4"):  # the annotation's type check (test runs) or the same ValueError
        with pytest.raises((TypeError, ValueError)):
            directional_patch(model, CLEAN, CORRUPTED, metric, components=("attn",), batch_size=bad)
    with pytest.raises(ValueError, match="which has unknown entry 'both'"):
        directional_patch(model, CLEAN, CORRUPTED, metric, components=("attn",), which=("par", "both"))
    with pytest.raises(ValueError, match="which is empty"):
        directional_patch(model, CLEAN, CORRUPTED, metric, components=("attn",), which=())
