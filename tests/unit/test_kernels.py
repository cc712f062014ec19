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
import torch

from tl_directional.core.geometry import decompose
from tl_directional.core.kernels import split_stats, value_stats
from tl_directional.core.quantiles import BIN_SCALES, QUANTILES
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
    g = torch.Generator().manual_seed(0)
    u = torch.randn(64, 3, 16, generator=g, dtype=torch.float64)
    r = torch.randn(64, 3, 16, generator=g, dtype=torch.float64)
    u[0], r[1] = 0.0, 0.0  # degenerate update / reference
    u[2] = 3.0 * r[2]  # exactly parallel: perpendicular part vanishes
    d, s = decompose(u, r), split_stats(u, r)
    for name in ("alpha", "par_frac", "par_perp_ratio", "rel_update", "degenerate", "par_sq", "perp_sq"):
        assert torch.equal(getattr(d, name), getattr(s, name)), name
    assert math.isinf(float(s.par_perp_ratio[2, 0])) and bool(s.degenerate[0].all())


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
