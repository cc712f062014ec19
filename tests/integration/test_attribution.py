"""Directional attribution patching, the DirectionalResult type and the TransformerLens call shapes.

References are independent: TransformerLens 4.3's own ``attribution_patch`` (node scores), real
directional activation patching of a small step (``directional_patch`` fed an interpolated clean
cache), and hand-written hooks in this file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_directional as tld
from tl_directional.core.bootstrap import (
    BootstrapError,
    bootstrap_mean_interval,
    random_subspace_share,
)
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.evaluate.patching import (
    AttributionError,
    attribution_hooks,
    attribution_patch,
    directional_patch,
)
from tl_directional.evaluate.patching.cache_input import PatchingInputError
from tl_directional.evaluate.patching.result import DirectionalResult, ResultError
from tl_directional.model.load import load_model

GEN = torch.Generator().manual_seed(0)
CLEAN = torch.randint(1, 500, (3, 8), generator=GEN)
CORRUPTED = CLEAN.clone()
CORRUPTED[:, 3] = torch.randint(1, 500, (3,), generator=GEN)
CORRUPTED[:, 5] = torch.randint(1, 500, (3,), generator=GEN)


def metric(logits):
    """One logit difference per pair (shape [batch])."""
    return logits[:, -1, 3] - logits[:, -1, 4]


@pytest.fixture(scope="module")
def gpt2(tiny_model):
    return tiny_model("gpt2")


# ---------------------------------------------------------------------------------------------
# parity with TransformerLens 4.3 and the exact split identity
# ---------------------------------------------------------------------------------------------


@pytest.mark.bridge
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize(
    "family", ["gpt2", "llama"]
)  # tiny llama is GQA: 4 query heads, 2 KV heads
def test_full_estimate_equals_transformer_lens_attribution_patch(tiny_model, family, dtype):
    """Every node score equals TransformerLens 4.3's within the round-off bound of the dtype
    (float64: where equality is the claim; float32: what users run, whose gap moves with the
    CPU's kernels, 1.1e-6 on an embed node of scale 1.1 with AVX2 forced)."""
    tl_ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    model = tiny_model(family, fresh=True).to(dtype)
    ours = attribution_patch(model, CLEAN, CORRUPTED, metric)
    theirs = tl_ap.attribution_patch(model, CLEAN, CORRUPTED, lambda logits: metric(logits)[0])
    head, mlp, resid = (
        ours.mean("head", "full"),
        ours.mean("mlp", "full"),
        ours.mean("resid", "full"),
    )
    assert len(theirs.node_scores) == CLEAN.shape[1] * (
        1 + model.cfg.n_layers * (model.cfg.n_heads + 1)
    )
    largest = max(abs(score) for score in theirs.node_scores.values())
    # forward and backward through every layer, d_model terms each (tl_directional.core.roundoff)
    limit = roundoff_tolerance(dtype, largest, 2 * model.cfg.d_model * model.cfg.n_layers)
    for node, score in theirs.node_scores.items():
        if node.kind == "attn_head_out":
            got = head[node.layer, node.position, node.head]
        elif node.kind == "mlp_out":
            got = mlp[node.layer, node.position]
        else:  # embed: the stream entering block 0 differs from the embedding by a shared term
            got = resid[0, node.position]
        assert abs(got - score) <= limit, (node, got, score, limit)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_parallel_plus_perpendicular_is_full_for_every_node(tiny_model, family):
    model = tiny_model(family)
    res = attribution_patch(model, CLEAN, CORRUPTED, metric)
    assert res.node_types == ("resid", "attn", "mlp", "head", "value")
    for node in res.node_types:
        v = res.values[node]
        assert v["full"].dtype == np.float64
        assert np.abs(v["par"] + v["perp"] - v["full"]).max() <= 1e-12 * max(
            1.0, np.abs(v["full"]).max()
        )
        assert np.isfinite(v["full"]).all()
    # the head node and the value node score the same hook_z difference: equal full estimates
    assert np.array_equal(res.values["head"]["full"], res.values["value"]["full"])
    # before the first corrupted position nothing differs: every estimate is exactly 0
    assert (res.values["attn"]["full"][:, :, :3] == 0).all()


def test_batching_pairs_changes_nothing(gpt2):
    """Pairs one at a time and all in one batch agree within float32 round-off (batched matrix
    products reduce in another order; 1.2e-6 on this model with AVX2 kernels forced)."""
    one = attribution_patch(gpt2, CLEAN, CORRUPTED, metric, batch_size=1)
    all_ = attribution_patch(gpt2, CLEAN, CORRUPTED, metric)
    terms = 2 * gpt2.cfg.d_model * gpt2.cfg.n_layers
    for node in one.node_types:
        for part in ("full", "par"):
            a, b = one.values[node][part], all_.values[node][part]
            limit = roundoff_tolerance(torch.float32, float(np.abs(a).max()), terms)
            assert np.abs(a - b).max() <= limit, (node, part, np.abs(a - b).max(), limit)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_layer_passes_equal_one_pass_exactly(tiny_model, family):
    """``layers_per_pass`` (the backward in passes of a few blocks, the forward recomputed) gives
    the one-pass scores bit for bit (same values, same float ops), leaves the parameters' flags as
    they were and refuses a non-positive count."""
    model = tiny_model(family)
    flags = [p.requires_grad for p in model.parameters()]
    one = attribution_patch(model, CLEAN, CORRUPTED, metric)
    for k in (1, model.cfg.n_layers - 1):
        passes = attribution_patch(model, CLEAN, CORRUPTED, metric, layers_per_pass=k)
        assert np.array_equal(passes.corrupted_metric, one.corrupted_metric)
        for node in one.node_types:
            for part in ("full", "par", "perp"):
                assert np.array_equal(passes.values[node][part], one.values[node][part]), (k, node, part)
            assert np.array_equal(passes.par_frac[node], one.par_frac[node]), (k, node)
    assert [p.requires_grad for p in model.parameters()] == flags
    with pytest.raises(AttributionError, match=r"layers_per_pass must be None .* got 0"):
        attribution_patch(model, CLEAN, CORRUPTED, metric, layers_per_pass=0)


# ---------------------------------------------------------------------------------------------
# the split estimates are the small-step limit of real directional patching
# ---------------------------------------------------------------------------------------------


def _interpolated_cache(model, step: float):
    """A clean cache a fraction ``step`` of the way from the corrupted run to the clean run."""
    _, clean = model.run_with_cache(CLEAN)
    _, corr = model.run_with_cache(CORRUPTED)
    return {k: corr[k] + step * (clean[k] - corr[k]) for k in corr.keys()}


def _float64(tiny_model_dir, family):
    return load_model(tiny_model_dir(family), dtype=torch.float64).eval()


# HF's RMSNorm (Llama, Gemma-3) computes in float32 whatever the model dtype, so a one-sided
# difference at a tiny step is float32 noise over the step; a central difference at a moderate
# step cancels the second-order term instead.
STEP = 3e-3


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_split_estimate_is_the_small_step_limit_of_directional_patching(tiny_model_dir, family):
    model = _float64(tiny_model_dir, family)
    est = attribution_patch(model, CLEAN, CORRUPTED, metric, node_types=("attn", "mlp", "value"))
    runs = {}
    for sign in (1, -1):
        cache = _interpolated_cache(model, sign * STEP)
        runs[sign] = directional_patch(
            model, CORRUPTED, cache, metric, components=("attn", "mlp", "value"), result=True
        )
    for node in ("attn", "mlp", "value"):
        for part in ("par", "perp", "full"):
            want = est.values[node][part].sum(axis=2)  # the patch moves every position at once
            got = (runs[1].values[node][part] - runs[-1].values[node][part]) / (2 * STEP)
            scale = max(1e-2, np.abs(est.values[node]["full"]).sum(axis=2).max())
            np.testing.assert_allclose(
                got, want, atol=2e-3 * scale, err_msg=f"{family} {node} {part}"
            )


def test_head_split_is_the_small_step_limit_of_a_hand_written_patch(tiny_model_dir):
    """The head node's parallel part: move the attention update by ``step * P_x(W_O[h]^T dz_h)``."""
    model = _float64(tiny_model_dir, "gpt2")
    est = attribution_patch(model, CLEAN, CORRUPTED, metric, node_types=("head",))
    _, clean = model.run_with_cache(CLEAN)
    _, corr = model.run_with_cache(CORRUPTED)
    L, h = 1, 2
    dz = clean[f"blocks.{L}.attn.hook_z"][:, :, h] - corr[f"blocks.{L}.attn.hook_z"][:, :, h]
    write = dz @ model.blocks[L].attn.W_O[h]
    x = corr[f"blocks.{L}.hook_resid_pre"]
    par = (write * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
    for part, delta in (("par", par), ("perp", write - par)):
        out = {}
        for sign in (1, -1):

            def add(t, hook, delta=delta, sign=sign):  # noqa: ARG001
                return t + sign * STEP * delta

            out[sign] = metric(
                model.run_with_hooks(CORRUPTED, fwd_hooks=[(f"blocks.{L}.hook_attn_out", add)])
            )
        got = ((out[1] - out[-1]) / (2 * STEP)).detach().numpy()
        want = est.values["head"][part][:, L, :, h].sum(-1)
        np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, np.abs(want).max()))


# ---------------------------------------------------------------------------------------------
# TransformerLens's call shape, names_filter, results
# ---------------------------------------------------------------------------------------------


def test_transformer_lens_call_shape_with_a_filtered_cache(gpt2):
    _, cache = gpt2.run_with_cache(CLEAN, names_filter=attribution_hooks(gpt2))
    a = attribution_patch(gpt2, CLEAN, CORRUPTED, metric)
    b = attribution_patch(gpt2, CORRUPTED, cache, metric)
    for node in a.node_types:
        np.testing.assert_array_equal(a.values[node]["par"], b.values[node]["par"])
    assert np.isnan(b.clean_metric).all() and not np.isnan(a.clean_metric).any()
    np.testing.assert_allclose(
        a.corrupted_metric, metric(gpt2(CORRUPTED)).detach().numpy(), atol=1e-6
    )


def test_directional_patch_result_and_cache_shape_match_the_tuple(gpt2):
    comps = ("attn", "mlp", "value", "resid_pre")
    results, table = directional_patch(
        gpt2, CLEAN, CORRUPTED, lambda lg: metric(lg).mean(), components=comps
    )
    res = directional_patch(gpt2, CLEAN, CORRUPTED, metric, components=comps, result=True)
    assert isinstance(res, DirectionalResult) and res.kind == "patch" and res.n_examples == 3
    _, cache = gpt2.run_with_cache(CLEAN)
    res_tl = directional_patch(gpt2, CORRUPTED, cache, metric, components=comps, result=True)
    for c in comps:
        for w in ("par", "perp", "full"):
            # the mean of per-example effects is the effect on the mean metric
            np.testing.assert_allclose(
                res.mean(c, w), (results[c][w] - table["corrupted_metric"][0]).numpy(), atol=1e-5
            )
            np.testing.assert_allclose(res_tl.values[c][w], res.values[c][w], atol=1e-6)
    frame = res.to_frame(n_resamples=200)
    assert {
        "node_type",
        "layer",
        "head",
        "par",
        "par_low",
        "par_high",
        "par_frac",
        "random_share",
    } <= set(frame)
    assert (frame["par_low"] <= frame["par"] + 1e-12).all() and (
        frame["par"] <= frame["par_high"] + 1e-12
    ).all()
    assert frame.loc[frame.node_type == "value", "random_share"].iloc[0] == pytest.approx(
        random_subspace_share(gpt2.cfg.d_head)
    )


def test_names_filter_that_drops_a_needed_hook_is_an_error(gpt2):
    with pytest.raises(PatchingInputError, match="names_filter drops .*hook_z"):
        attribution_patch(gpt2, CLEAN, CORRUPTED, metric, names_filter=lambda n: "hook_z" not in n)
    attribution_patch(
        gpt2,
        CLEAN,
        CORRUPTED,
        metric,
        node_types=("mlp",),
        names_filter=attribution_hooks(gpt2, ("mlp",)),
    )
    with pytest.raises(PatchingInputError, match="names_filter drops"):
        directional_patch(gpt2, CLEAN, CORRUPTED, metric, names_filter=["blocks.0.hook_resid_pre"])


def test_result_intervals_are_seeded_and_figure_renders(gpt2):
    res = attribution_patch(gpt2, CLEAN, CORRUPTED, metric)
    lo1, hi1 = res.interval("head", "perp", n_resamples=300, seed=3)
    lo2, hi2 = res.interval("head", "perp", n_resamples=300, seed=3)
    assert np.array_equal(lo1, lo2) and np.array_equal(hi1, hi2) and lo1.shape == (2, 8, 4)
    view = res.figure("head")
    assert len(view.figure.data) == 3 and "random-line share" in view.figure.layout.title.text
    assert view.data.shape[0] == gpt2.cfg.n_layers * gpt2.cfg.n_heads
    with pytest.raises(ResultError, match="node='nope' is not in this result"):
        res.mean("nope", "full")
    # the values as float64 torch tensors, as TransformerLens's patching helpers return theirs
    t = res.tensor("head", "perp")
    assert t.dtype == torch.float64 and tuple(t.shape) == res.values["head"]["perp"].shape
    assert np.array_equal(t.numpy(), res.values["head"]["perp"], equal_nan=True)
    assert np.array_equal(res.tensor("head", "perp", mean=True).numpy(), res.mean("head", "perp"), equal_nan=True)
    with pytest.raises(ResultError, match="part='nope'"):
        res.tensor("head", "nope")


# ---------------------------------------------------------------------------------------------
# bad input: clear errors, never a silent zero
# ---------------------------------------------------------------------------------------------


def test_bad_input_errors(gpt2, tiny_model):
    with pytest.raises(AttributionError, match="same \\[batch, pos\\] shape"):
        attribution_patch(gpt2, CLEAN, CORRUPTED[:, :7], metric)
    with pytest.raises(AttributionError, match="shape \\[batch\\]"):
        attribution_patch(gpt2, CLEAN, CORRUPTED, lambda lg: lg[:, -1, :4])
    with pytest.raises(AttributionError, match="no gradient"):
        attribution_patch(gpt2, CLEAN, CORRUPTED, lambda lg: metric(lg).detach())
    with pytest.raises(AttributionError, match="must return a tensor"):
        attribution_patch(gpt2, CLEAN, CORRUPTED, lambda lg: metric(lg)[0].item())
    with pytest.raises(
        PatchingInputError, match="clean_cache has no 'blocks.1.hook_resid_pre'.*attribution_hooks"
    ):
        attribution_patch(
            gpt2, CORRUPTED, {"blocks.0.hook_resid_pre": torch.zeros(3, 8, 32)}, metric
        )
    with pytest.raises(AttributionError, match="node_types"):
        attribution_patch(gpt2, CLEAN, CORRUPTED, metric, node_types=("heads",))
    # training mode with live dropout: tests/integration/test_verb_preflight.py (every verb)
    assert issubclass(AttributionError, tld.TLDirectionalError) and issubclass(
        AttributionError, ValueError
    )


def test_bootstrap_and_random_share():
    x = np.random.default_rng(0).normal(size=(50, 4))
    lo, hi = bootstrap_mean_interval(x, n_resamples=500, seed=1)
    assert np.array_equal(lo, bootstrap_mean_interval(x, n_resamples=500, seed=1)[0])
    assert (lo < x.mean(0)).all() and (x.mean(0) < hi).all()
    with pytest.raises(BootstrapError, match="level must be"):
        bootstrap_mean_interval(x, level=1.5)
    d = 576
    r = torch.randn(20000, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    u = torch.randn(d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mc = (r @ u).abs() / (r.norm(dim=-1) * u.norm())
    assert random_subspace_share(d) == pytest.approx(float(mc.mean()), rel=0.02)
    assert random_subspace_share(d) == pytest.approx(np.sqrt(2 / (np.pi * d)), rel=0.01)


@pytest.mark.bridge
def test_benchmark_record_is_registered_and_its_check_passes(gpt2):
    """The record is registered beside the others; its equality check runs on a stand-in of the
    harness's ``Bench`` (the harness itself is not run here)."""
    from types import SimpleNamespace

    import benchmarks.run  # noqa: F401 - importing registers every record
    from benchmarks.attribution import ATTRIB_PAIRS, ATTRIB_SEQ, attribution_vs_transformer_lens
    from benchmarks.registry import REGISTRY

    spec = REGISTRY["attribution_vs_transformer_lens"]
    assert spec.target == 1.2 and spec.op == "<=" and spec.primary_only
    tokens = torch.randint(
        5, 500, (ATTRIB_PAIRS, ATTRIB_SEQ), generator=torch.Generator().manual_seed(0)
    )
    calls = []
    bench = SimpleNamespace(
        model=gpt2,
        inputs=SimpleNamespace(tokens=tokens),
        device=torch.device("cpu"),
        check=True,
        extra={},
        measure=lambda base, run: calls.append((base, run)) or "timed",
    )
    assert attribution_vs_transformer_lens(bench) == "timed" and len(calls) == 1
    assert bench.extra["check_max_abs_diff_vs_transformer_lens"] < 1e-6
    assert bench.extra["tl_nodes"] == ATTRIB_SEQ * (1 + gpt2.cfg.n_layers * (gpt2.cfg.n_heads + 1))
    # the memory-bounded form: the same check, in passes of ceil(n_layers / 8) blocks
    from benchmarks.attribution import attribution_layer_passes_vs_transformer_lens

    bench.extra.clear()
    assert attribution_layer_passes_vs_transformer_lens(bench) == "timed" and len(calls) == 2
    assert bench.extra["layers_per_pass"] == 1
    assert bench.extra["check_max_abs_diff_vs_transformer_lens"] < 1e-6
    # one pair per forward / backward, as TransformerLens runs them
    from benchmarks.attribution import attribution_batch_size_1_vs_transformer_lens

    bench.extra.clear()
    assert attribution_batch_size_1_vs_transformer_lens(bench) == "timed" and len(calls) == 3
    assert bench.extra["batch_size"] == 1 and bench.extra["layers_per_pass"] is None
    assert bench.extra["check_max_abs_diff_vs_transformer_lens"] < 1e-6


def test_sandwich_norm_head_split_is_the_small_step_limit_of_the_normalised_write(tiny_model_dir):
    """Gemma-3 normalises the attention write before the residual add. A head's residual-space
    difference is what reaches the stream to first order: the post-norm change from moving the
    pre-norm write by ``W_O[h]^T dz_h`` (through ``hook_z``), measured here by a central
    difference; its part along ``resid_pre`` moved into the stream must give the ``par`` estimate."""
    model = _float64(tiny_model_dir, "gemma3")
    est = attribution_patch(model, CLEAN, CORRUPTED, metric, node_types=("head",))
    _, clean = model.run_with_cache(CLEAN)
    _, corr = model.run_with_cache(CORRUPTED)
    L, h = 1, 1
    dz = clean[f"blocks.{L}.attn.hook_z"][:, :, h] - corr[f"blocks.{L}.attn.hook_z"][:, :, h]
    post = {}
    for sign in (1, -1):
        seen = {}

        def move(z, hook, sign=sign):  # noqa: ARG001 - moves the pre-norm write by sign * STEP * write
            z = z.clone()
            z[:, :, h] = z[:, :, h] + sign * STEP * dz
            return z

        def keep(t, hook, seen=seen):  # noqa: ARG001
            seen["out"] = t.detach()
            return t

        model.run_with_hooks(
            CORRUPTED,
            fwd_hooks=[(f"blocks.{L}.attn.hook_z", move), (f"blocks.{L}.hook_attn_out", keep)],
        )
        post[sign] = seen["out"]
    stream = (post[1] - post[-1]) / (2 * STEP)  # J W_O[h]^T dz_h
    x = corr[f"blocks.{L}.hook_resid_pre"]
    par = (stream * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
    out = {}
    for sign in (1, -1):

        def add(t, hook, sign=sign):  # noqa: ARG001
            return t + sign * STEP * par

        out[sign] = metric(
            model.run_with_hooks(CORRUPTED, fwd_hooks=[(f"blocks.{L}.hook_attn_out", add)])
        )
    got = ((out[1] - out[-1]) / (2 * STEP)).detach().numpy()
    want = est.values["head"]["par"][:, L, :, h].sum(-1)
    np.testing.assert_allclose(got, want, atol=2e-3 * max(1.0, np.abs(want).max()))
    assert any("sandwich-norm" in n for n in est.notes)
