"""Component-weighted Wanda (tl_directional.compression.weighted) and the ranking-overlap diagnostic
(tl_directional.compression.ranking) against an independent per-weight implementation written here."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tests.integration._families import CAUSAL
from tl_directional.compression import (
    CalibrationRequiredError,
    WeightingError,
    collect_error_energy,
    prune_wanda_weighted,
    ranking_overlap,
)
from tl_directional.compression.compressors import compress, linear_weights, prune_wanda
from tl_directional.compression.specs import parse_spec
from tl_directional.model.sites import resolve_sites
from tl_directional.model.weights import linear_input_hooks


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _tokens(n=3, length=10, seed=0, vocab=400):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, length), generator=g)


def _by_hand(model, toks, lw):
    """Independent reference: the per-token inputs x_t and references r_t of one linear, read from
    a cached forward (the residual reference for attn.o / mlp.out, the linear's output W x_t else)."""
    got = {}
    li = linear_input_hooks(model, lw.layer)[lw.key]
    sites = resolve_sites(model, warn=False)
    names = [li.hook]
    ref = None
    if lw.key in ("attn.o", "mlp.out"):
        ref = sites.units["attn" if lw.key == "attn.o" else "mlp"][lw.layer].reference_hook
        names.append(ref)

    def keep(name):
        return lambda t, hook: got.setdefault(name, t.detach().clone())

    model.run_with_hooks(toks, return_type=None, fwd_hooks=[(n, keep(n)) for n in names])
    w = lw.get().double()
    x = got[li.hook].double().reshape(-1, w.shape[1])
    if li.scale is not None:
        x = x * li.scale.double()
    r = got[ref].double().reshape(-1, w.shape[0]) if ref is not None else x @ w.T
    return w, x, r


def _split_energy(e, r):
    """||e_par||^2, ||e_perp||^2 of vectors e [n, d] against r [n, d] (METHOD.md sec. 1, eps 1e-12)."""
    rr = (r * r).sum(-1)
    a = torch.where(rr > 1e-12, (e * r).sum(-1) / rr.clamp_min(1e-300), torch.zeros_like(rr))
    par = a[:, None] * r
    return (par * par).sum(-1), ((e - par) ** 2).sum(-1)


@pytest.mark.parametrize("family", CAUSAL)
def test_energies_equal_an_explicit_per_weight_split(family, tiny_model):
    """For sampled weights (i, j): form the error vector e_t = -W_ij x_tj e_i of every token, split
    it against r_t, and average: the module's (total, par, perp) energies match."""
    model = tiny_model(family)
    toks = _tokens()
    energy = collect_error_energy(model, toks, layers=[0])
    g = torch.Generator().manual_seed(1)
    for lw in linear_weights(model, layers=0):
        w, x, r = _by_hand(model, toks, lw)
        total, par, perp = energy.energies(lw.name, lw.get())
        for _ in range(6):
            i = int(torch.randint(w.shape[0], (1,), generator=g))
            j = int(torch.randint(w.shape[1], (1,), generator=g))
            e = torch.zeros_like(r)
            e[:, i] = -w[i, j] * x[:, j]
            p2, q2 = _split_energy(e, r)
            torch.testing.assert_close(par[i, j], p2.mean(), rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(perp[i, j], q2.mean(), rtol=1e-6, atol=1e-12)
            torch.testing.assert_close(total[i, j], (e * e).sum(-1).mean(), rtol=1e-6, atol=1e-12)
        if lw.key in ("attn.o", "mlp.out"):
            assert energy.reference[lw.name].startswith(f"blocks.{lw.layer}.")
        else:
            assert energy.reference[lw.name] == "own output"


def test_none_is_standard_wanda_and_flips_are_counted(tiny_model):
    model = tiny_model("gpt2")
    toks = _tokens()
    energy = collect_error_energy(model, toks)
    base = prune_wanda(model, toks, 0.5)
    none = prune_wanda_weighted(model, sparsity=0.5, weighting="none", energy=energy)
    for a, b in zip(base.model.parameters(), none.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert none.record.stats["flipped_vs_wanda"] == 0.0
    for weighting in ("perp", "par"):
        res = prune_wanda_weighted(model, sparsity=0.5, weighting=weighting, energy=energy)
        assert res.record.stats["zero_fraction"] == pytest.approx(0.5, abs=1e-3)
        # the flip count, recomputed from the two models' zero patterns
        flipped = pruned = 0
        for lw_b, lw_w in zip(linear_weights(base.model), linear_weights(res.model), strict=True):
            zb, zw = lw_b.get() == 0, lw_w.get() == 0
            pruned += int(zb.sum())
            flipped += int((zw & ~zb).sum())
        assert res.record.stats["flipped_weights"] == flipped
        assert res.record.stats["flipped_vs_wanda"] == pytest.approx(flipped / pruned)
    assert tld.compression.WEIGHTINGS == ("none", "perp", "par")


def test_perp_and_par_masks_follow_their_scores(tiny_model):
    """The kept set of each row is the top half by the chosen energy (independently recomputed)."""
    model = tiny_model("llama")
    toks = _tokens()
    res = prune_wanda_weighted(model, toks, 0.5, weighting="par", layers=[1], keys=["mlp.out"])
    (lw,) = linear_weights(model, layers=1, keys=["mlp.out"])
    (lw_new,) = linear_weights(res.model, layers=1, keys=["mlp.out"])
    w, x, r = _by_hand(model, toks, lw)
    c = r**2 / (r**2).sum(-1, keepdim=True)
    par = w**2 * (c.T @ x**2) / x.shape[0]
    k = w.shape[1] // 2
    expect = torch.ones_like(w, dtype=torch.bool)
    expect.scatter_(1, torch.argsort(par, dim=1, stable=True)[:, :k], False)
    assert torch.equal(lw_new.get() != 0, expect & (w != 0))


def test_seeded_determinism_and_spec(tiny_model):
    model = tiny_model("neox")
    toks = _tokens()
    a = ranking_overlap(model, toks, n_null=3, seed=5, layers=[0])
    b = ranking_overlap(model, toks, n_null=3, seed=5, layers=[0])
    assert a.equals(b)
    c = ranking_overlap(model, toks, n_null=3, seed=6, layers=[0])
    assert not a[["null_mean"]].equals(c[["null_mean"]]) or a["null_sd"].eq(0).all()
    assert list(a.columns) == list(tld.compression.ranking.COLUMNS)
    assert a.iloc[-1]["name"] == "all" and ((a["overlap"] >= 0) & (a["overlap"] <= 1)).all()
    assert parse_spec("wanda_perp:sparsity=0.5") == ("wanda_perp", {"sparsity": 0.5})
    via_spec = compress(model, "wanda_perp:sparsity=0.5,layers=0", calibration=toks)
    direct = prune_wanda_weighted(model, toks, 0.5, weighting="perp", layers=[0])
    assert via_spec.record.method == "wanda_perp"
    for p, q in zip(via_spec.model.parameters(), direct.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_ranking_overlap_null_is_the_isotropic_reference(tiny_model):
    """The null's overlap, recomputed here from random references of the same norms, with the
    module's own seeded generator order, matches: the null is what it says it is."""
    model = tiny_model("gpt2")
    toks = _tokens(n=2, length=6)
    energy = collect_error_energy(model, toks, layers=[0], keys=["attn.o"], n_null=2, seed=3)
    (lw,) = linear_weights(model, layers=0, keys=["attn.o"])
    w, x, r = _by_hand(model, toks, lw)
    gen = torch.Generator().manual_seed(3)
    for k in range(2):
        g = torch.randn(r.shape, generator=gen, dtype=torch.float64)
        g = g * (r.norm(dim=-1, keepdim=True) / g.norm(dim=-1, keepdim=True))
        c = g**2 / (g**2).sum(-1, keepdim=True)
        torch.testing.assert_close(energy.null_par[lw.name][k], (c.T @ x**2) / x.shape[0])


def test_errors_name_the_argument_and_the_fix(tiny_model):
    model = tiny_model("gpt2")
    with pytest.raises(CalibrationRequiredError, match="calibration.*pass calibration="):
        prune_wanda_weighted(model, None, 0.5)
    with pytest.raises(CalibrationRequiredError):
        compress(model, "wanda_par:sparsity=0.5")
    with pytest.raises(WeightingError, match=r"weighting must be one of .*got 'orth'"):
        prune_wanda_weighted(model, _tokens(), 0.5, weighting="orth")
    with pytest.raises(ValueError, match="sparsity"):
        prune_wanda_weighted(model, _tokens(), 1.5)
    with pytest.raises(ValueError, match="n_null must be an int >= 2"):
        ranking_overlap(model, _tokens(), n_null=1)
    assert issubclass(CalibrationRequiredError, tld.TLDirectionalError)
    assert issubclass(WeightingError, ValueError)


def test_cli_compress_and_compress_check_take_the_weighted_specs(tiny_model_dir, lane, tmp_path, capsys):
    """``tl-directional compress --spec wanda_perp:...`` writes a model (bridge lane) whose record
    carries the flip fraction, and ``compress-check`` reads it like any compressed model."""
    if lane != "bridge":
        pytest.skip("compress writes Hugging Face directories from the bridge lane only")
    from tl_directional.cli import main

    dense = tiny_model_dir("gpt2")
    text = tmp_path / "t.txt"
    text.write_text("In the beginning was the word, and the word was with God. " * 20)
    out = tmp_path / "perp"
    assert main(["compress", "--model", str(dense), "--spec", "wanda_perp:sparsity=0.5", "--out", str(out),
                 "--calib-text", str(text), "--calib-sequences", "4", "--seq-len", "32"]) == 0
    assert "flipped_vs_wanda" in capsys.readouterr().out
    assert main(["compress-check", "--dense", str(dense), "--compressed", str(out), "--text", str(text),
                 "--max-sequences", "2", "--seq-len", "32", "--max-perp-error", "100"]) == 0
