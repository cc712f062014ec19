"""The fused kernels and block histogram give the same tables as the unfused computation.

The reference below is a copy of the computation ``measure``/``stats`` used before the fused
path (``geometry.decompose`` on gathered tokens, one histogram per metric and bincount per
update, the value-space ``einsum``), kept here so the equivalence stays checkable. Here the
kernels on seeded random tensors; the whole profile tables on tiny models in float64, where the
two paths agree to rounding (1e-12): tests/integration/test_kernels_profile.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tl_directional.core import kernels
from tl_directional.core.geometry import decompose
from tl_directional.core.kernels import row_dot, row_norm, split_stats, value_stats
from tl_directional.core.quantiles import BIN_SCALES, QUANTILES
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.core.stats import EXACT_QUANTILE_LIMIT, StreamingSummary

# -- the old computation (reference) ---------------------------------------------------------


class _OldSummary:
    """Copy of the pre-fusion StreamingSummary: float64 histograms, one bincount per metric."""

    def __init__(self, n_groups, metrics):
        self.n_groups, self.metrics = n_groups, dict(metrics)
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.count, self.degenerate, self.par_sq, self.perp_sq = (z(n_groups) for _ in range(4))
        self.sums = {m: z(n_groups) for m in metrics}
        self.sumsq = {m: z(n_groups) for m in metrics}
        self.finite = {m: z(n_groups) for m in metrics}
        self.hist = {m: z(n_groups, BIN_SCALES[s].n_bins + 2) for m, s in metrics.items()}
        self.values = {m: [[] for _ in range(n_groups)] for m in metrics}  # for exact quantiles

    def update(self, group, values, *, degenerate, par_sq, perp_sq):
        group = group.long().reshape(-1)
        degenerate = degenerate.reshape(-1)
        self.degenerate += torch.bincount(group[degenerate], minlength=self.n_groups).double()
        keep = ~degenerate
        g = group[keep]
        self.count += torch.bincount(g, minlength=self.n_groups).double()
        self.par_sq.index_add_(0, g, par_sq.reshape(-1)[keep].double())
        self.perp_sq.index_add_(0, g, perp_sq.reshape(-1)[keep].double())
        for name, scale_name in self.metrics.items():
            x = values[name].reshape(-1)[keep].double()
            for gi in range(self.n_groups):
                xs = x[(g == gi) & ~torch.isnan(x)]
                self.values[name][gi].extend(xs.tolist())
            fin = torch.isfinite(x)
            xf = torch.where(fin, x, torch.zeros_like(x))
            self.sums[name].index_add_(0, g, xf)
            self.sumsq[name].index_add_(0, g, xf * xf)
            self.finite[name].index_add_(0, g, fin.double())
            scale = BIN_SCALES[scale_name]
            lo, hi = scale.edges
            pos = (scale.transform(x) - lo) / (hi - lo) * scale.n_bins
            idx = torch.where(x == float("inf"), torch.full_like(pos, scale.n_bins + 1),
                              torch.where(x == float("-inf"), torch.zeros_like(pos), pos.floor() + 1))
            flat = g * (scale.n_bins + 2) + idx.clamp(0, scale.n_bins + 1).long()
            self.hist[name] += torch.bincount(
                flat, minlength=self.n_groups * (scale.n_bins + 2)).double().view(self.n_groups, -1)

    def table(self):
        new = StreamingSummary(self.n_groups, self.metrics)  # quantile read-out is unchanged
        for attr in ("count", "degenerate", "par_sq", "perp_sq"):
            getattr(new, attr).copy_(getattr(self, attr))
        for m in self.metrics:
            new.sums[m].copy_(self.sums[m])
            new.sumsq[m].copy_(self.sumsq[m])
            new.finite[m].copy_(self.finite[m])
            new.hist[m].copy_(self.hist[m].long())
        table = new.table()
        if max(len(v) for m in self.metrics for v in self.values[m]) <= EXACT_QUANTILE_LIMIT:
            # small sample: numpy's linear quantiles (an infinite neighbour gives that infinity)
            names = [("median" if q == 0.5 else f"q{int(round(q * 100)):02d}") for q in QUANTILES]
            for m in self.metrics:
                for gi, xs in enumerate(self.values[m]):
                    for q, name in zip(QUANTILES, names, strict=True):
                        if not xs:
                            continue
                        lo, hi = (np.quantile(xs, q, method=k) for k in ("lower", "higher"))
                        if lo == hi or np.isinf(lo) != np.isinf(hi):  # an infinite neighbour wins
                            value = lo if lo == hi or np.isinf(lo) else hi
                        else:
                            value = np.quantile(xs, q)
                        table[f"{m}_{name}"][gi] = float(value)
        return table


# -- tests --------------------------------------------------------------------------------------


def test_split_stats_equals_decompose_including_degenerate_tokens():
    """The fused split (norms and dots without written products, issue 51) against
    ``decompose``: the flags and the values METHOD.md sec. 1 defines for degenerate and exactly
    parallel tokens exactly, every other value within float64's round-off of a 16-term sum (the
    two add in another order)."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(64, 3, 16, generator=g, dtype=torch.float64)
    r = torch.randn(64, 3, 16, generator=g, dtype=torch.float64)
    u[0], r[1] = 0.0, 0.0  # degenerate update / reference
    u[2] = 3.0 * r[2]  # exactly parallel: perpendicular part vanishes
    d, s = decompose(u, r), split_stats(u, r)
    assert torch.equal(d.degenerate, s.degenerate)
    for name in ("alpha", "par_frac", "par_perp_ratio", "rel_update", "par_sq", "perp_sq"):
        got, want = getattr(s, name), getattr(d, name)
        assert torch.equal(torch.isinf(got), torch.isinf(want)), name
        fin = torch.isfinite(want)
        scale = float(want[fin].abs().max())
        tol = roundoff_tolerance(torch.float64, scale, terms=16)
        torch.testing.assert_close(got[fin], want[fin], rtol=0, atol=tol, msg=name)
        if name in ("alpha", "par_frac", "par_perp_ratio", "par_sq"):
            for row in (0, 1):  # degenerate: exactly the defined values (zeros)
                assert torch.equal(got[row], want[row]), (name, row)
    assert math.isinf(float(s.par_perp_ratio[2, 0])) and bool(s.degenerate[0].all())


@pytest.mark.parametrize("gemm_dots", [True, False], ids=["gemm", "vecdot"])
@pytest.mark.parametrize("n, d", [(37, 576), (64, 300), (45, 64), (8, 256)])
def test_row_dot_and_row_norm_equal_the_sums_of_products(n, d, gemm_dots, monkeypatch):
    """:func:`row_dot` on both CPU paths (``_GEMM_DOTS``: block-diagonal GEMMs from 256 wide, one
    product per row below, rows left over by the blocks summed directly; or one ``vecdot``) and
    :func:`row_norm` against float64 sums of products written out, within float32's round-off of a
    ``d``-term sum; an empty input gives an empty result; a key-value head's one row broadcasts
    over its group's rows."""
    monkeypatch.setattr(kernels, "_GEMM_DOTS", gemm_dots)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(n, 3, d, generator=g), torch.randn(n, 3, d, generator=g)
    want_dot = (x.double() * y.double()).sum(-1)
    want_sq = (x.double() * x.double()).sum(-1)
    scale = float((x.double().abs() * y.double().abs()).sum(-1).max())
    tol = roundoff_tolerance(torch.float32, scale, terms=d)
    torch.testing.assert_close(row_dot(x, y).double(), want_dot, rtol=0, atol=tol)
    tol_sq = roundoff_tolerance(torch.float32, float(want_sq.max()), terms=d + 2)
    torch.testing.assert_close(row_norm(x).double() ** 2, want_sq, rtol=0, atol=tol_sq)
    assert row_dot(x[:0], y[:0]).shape == (0, 3)
    one = y[:, :1]  # [n, 1, d] against x's [n, 3, d]
    want_group = (x.double() * one.double()).sum(-1)
    torch.testing.assert_close(row_dot(x, one).double(), want_group, rtol=0, atol=tol)


def test_float32_split_is_within_round_off_of_float64():
    """The float32 kernels against the float64 split of the same numbers (the exact reference):
    ``alpha`` and ``perp_sq`` within float32's round-off; a nearly parallel update keeps its small
    perpendicular part to the explicit form's accuracy (the Gram closed form loses it)."""
    g = torch.Generator().manual_seed(4)
    n, d = 40, 576
    r = torch.randn(n, d, generator=g)
    u = 0.3 * torch.randn(n, d, generator=g) + 0.5 * r
    u[:8] = 2.0 * r[:8] + 1e-3 * torch.randn(8, d, generator=g)  # nearly parallel
    s32, s64 = split_stats(u, r), split_stats(u.double(), r.double())
    u_sq = (u.double() ** 2).sum(-1)
    tol = roundoff_tolerance(torch.float32, 1.0, terms=d)
    assert ((s32.alpha.double() - s64.alpha).abs() <= tol * (1 + s64.alpha.abs())).all()
    # explicit perpendicular part: error ~ eps * ||u|| * ||u_perp||, not eps * ||u||^2
    err = (s32.perp_sq.double() - s64.perp_sq).abs()
    assert (err <= 8 * tol * u_sq.sqrt() * s64.perp_sq.sqrt() + tol ** 2 * u_sq).all()
    assert (s64.perp_sq[:8] < 1e-4 * u_sq[:8]).all()  # the near-parallel rows are that


def test_value_stats_reconstruct_the_attention_alpha():
    g = torch.Generator().manual_seed(1)
    n, h, e, dm = 32, 4, 8, 32
    z, v = (torch.randn(n, h, e, generator=g, dtype=torch.float64) for _ in range(2))
    x = torch.randn(n, dm, generator=g, dtype=torch.float64)
    W_O = torch.randn(h, e, dm, generator=g, dtype=torch.float64)
    b_O = torch.randn(dm, generator=g, dtype=torch.float64)
    a_tt = torch.rand(n, h, generator=g, dtype=torch.float64)
    s = value_stats(z, v, a_tt, x, W_O, b_O)
    attn_out = torch.einsum("nhe,hed->nd", z, W_O) + b_O  # the attention update itself
    alpha = (attn_out * x).sum(-1) / (x * x).sum(-1)
    torch.testing.assert_close(s.recon, alpha, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s.self_term + s.cross_term, s.alpha_head, rtol=0, atol=1e-15)
    torch.testing.assert_close(s.full.alpha, s.exclusive.alpha + a_tt, rtol=1e-12, atol=1e-12)


def test_block_update_equals_the_old_per_metric_histograms():
    g = torch.Generator().manual_seed(2)
    metrics = {"a": "unit", "b": "positive", "c": "signed"}
    new, old = StreamingSummary(3, metrics), _OldSummary(3, metrics)
    for _ in range(3):
        n = 500
        grp = torch.randint(0, 3, (n,), generator=g)
        vals = {"a": torch.rand(n, generator=g, dtype=torch.float64),
                "b": torch.rand(n, generator=g, dtype=torch.float64).pow(4) * 100,
                "c": torch.randn(n, generator=g, dtype=torch.float64)}
        vals["b"][:5] = float("inf")
        vals["c"][5:9] = float("-inf")
        deg = torch.rand(n, generator=g) < 0.1
        keep = torch.rand(n, generator=g) < 0.8  # e.g. padding: left out entirely
        psq, qsq = (torch.rand(n, generator=g, dtype=torch.float64) for _ in range(2))
        new.update(grp, vals, degenerate=deg, par_sq=psq, perp_sq=qsq, keep=keep)
        old.update(grp[keep], {k: x[keep] for k, x in vals.items()}, degenerate=deg[keep],
                   par_sq=psq[keep], perp_sq=qsq[keep])
    new.flush()
    for m in metrics:
        assert torch.equal(new.hist[m].double(), old.hist[m]), m
    a, b = new.table(), old.table()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-13, atol=1e-13, equal_nan=True, msg=k)
    assert len(QUANTILES) == 5


def test_value_stats_read_a_gqa_groups_one_value_head():
    """Issue 51: ``value_stats`` takes ``hook_v``'s key-value heads as they are (query head ``h``
    reads head ``h // group``, no copy per query head) and gives what the heads expanded by
    ``repeat_interleave`` give, and what the split of each head against its value gives, to
    float64's round-off; a head count that does not divide is refused naming both counts."""
    g = torch.Generator().manual_seed(5)
    n, h, kv, e, dm = 24, 6, 2, 8, 16
    z = torch.randn(n, h, e, generator=g, dtype=torch.float64)
    v = torch.randn(n, kv, e, generator=g, dtype=torch.float64)
    x = torch.randn(n, dm, generator=g, dtype=torch.float64)
    W_O = torch.randn(h, e, dm, generator=g, dtype=torch.float64)
    a_tt = torch.rand(n, h, generator=g, dtype=torch.float64)
    grouped = value_stats(z, v, a_tt, x, W_O, None)
    v_h = v.repeat_interleave(h // kv, dim=1)
    expanded = value_stats(z, v_h, a_tt, x, W_O, None)
    full = decompose(z, v_h)
    excl = decompose(z - a_tt.unsqueeze(-1) * v_h, v_h)
    for want, got in ((expanded.full, grouped.full), (expanded.exclusive, grouped.exclusive),
                      (full, grouped.full), (excl, grouped.exclusive)):
        for name in ("alpha", "par_frac", "par_perp_ratio", "par_sq", "perp_sq"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-12, atol=1e-12)
    for name in ("alpha_head", "phi", "recon"):
        torch.testing.assert_close(getattr(grouped, name), getattr(expanded, name), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="v has 4 heads, which do not divide z's 6"):
        value_stats(z, torch.randn(n, 4, e, dtype=torch.float64), a_tt, x, W_O, None)
