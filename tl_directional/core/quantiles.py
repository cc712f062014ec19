"""Quantiles of a streaming summary: the fixed histogram grids and how quantiles are read.

Two readings (METHOD.md sec. 1, "Aggregation"): exact, numpy's default (linear) quantiles of
the values themselves (:func:`linear_quantiles`), and approximate, read from a fixed histogram
grid (:data:`BIN_SCALES`, :func:`histogram_quantiles`) once there are too many values to keep.
:class:`tl_directional.core.stats.StreamingSummary` decides which applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)


@dataclass(frozen=True)
class BinScale:
    """A fixed histogram grid on a transformed axis.

    ``kind``: ``"unit"`` linear on [0, 1]; ``"positive"`` log10-spaced on
    [lo, hi] (0 and tiny values go to the underflow bin, ``inf`` to the
    overflow bin); ``"signed"`` linear in ``asinh(x / scale)`` on [-hi, hi].
    """

    kind: str
    n_bins: int
    lo: float = 0.0
    hi: float = 1.0
    scale: float = 1e-3

    def transform(self, x: Tensor) -> Tensor:
        if self.kind == "unit":
            return x
        if self.kind == "positive":
            return torch.log10(x.clamp_min(self.lo * 0.5))
        return torch.asinh(x / self.scale)

    def inverse(self, t: float) -> float:
        if self.kind == "unit":
            return t
        if self.kind == "positive":
            return 10.0**t
        return math.sinh(t) * self.scale

    @property
    def edges(self) -> tuple[float, float]:
        """Bounds of the grid in transformed space."""
        if self.kind == "unit":
            return 0.0, 1.0
        if self.kind == "positive":
            return math.log10(self.lo), math.log10(self.hi)
        top = math.asinh(self.hi / self.scale)
        return -top, top


# unit: bin width 1/1000. positive: 1e-6..1e6 (12 decades) in 2400 bins = 0.005 decades, ~1.2% relative width.
# signed: asinh(x/1e-3) on |x| <= 1e4 (+-16.8) in 4000 bins: ~0.8% relative width
# above |x| ~ 1e-2, absolute width ~1e-5 near 0.
BIN_SCALES: dict[str, BinScale] = {
    "unit": BinScale("unit", 1000),
    "positive": BinScale("positive", 2400, lo=1e-6, hi=1e6),
    "signed": BinScale("signed", 4000, hi=1e4, scale=1e-3),
}


def histogram_quantiles(scale: BinScale, qs, hist: Tensor) -> list[Tensor]:
    """Quantiles ``qs`` per group read from ``hist`` ``[n_groups, n_bins + 2]`` (underflow bin
    first, overflow bin last) on the grid ``scale``: linear interpolation inside the bin holding
    the ``q * count``-th value, on the grid's transformed axis; the underflow / overflow bins
    read as the grid's edges (``0`` / ``inf`` for the positive grid), an empty group as NaN.
    One ``[n_groups]`` tensor per quantile."""
    lo, hi = scale.edges
    width = (hi - lo) / scale.n_bins
    total = hist.sum(-1, keepdim=True)  # [groups, 1]
    cum = torch.cumsum(hist, -1)
    target = torch.tensor(list(qs), dtype=hist.dtype) * total  # [groups, n_q]
    b = torch.searchsorted(cum, target).clamp(max=scale.n_bins + 1)
    before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp(min=0)), torch.zeros_like(target))
    in_bin = hist.gather(-1, b).clamp_min(1e-300)
    frac = ((target - before) / in_bin).clamp(0.0, 1.0)
    t = lo + (b - 1 + frac) * width
    if scale.kind == "unit":
        values = t
    elif scale.kind == "positive":
        values = torch.pow(10.0, t)
    else:
        values = torch.sinh(t) * scale.scale
    under = 0.0 if scale.kind == "positive" else scale.inverse(lo)
    over = float("inf") if scale.kind == "positive" else scale.inverse(hi)
    values = torch.where(b == 0, torch.full_like(values, under), values)
    values = torch.where(b == scale.n_bins + 1, torch.full_like(values, over), values)
    values = torch.where(total > 0, values, torch.full_like(values, float("nan")))
    return list(values.unbind(-1))


def linear_quantiles(group, x, use, counts, width: int, qs, n_groups: int):
    """``[n_q, n_metrics, n_groups]`` numpy-default (linear) quantiles of the metrics in ``x``.

    ``group`` ``[n]`` holds each value's group id in group order, ``x`` / ``use``
    ``[n_metrics, n]`` the values and which of them count, ``counts`` ``[n_metrics, n_groups]``
    how many count per group and ``width`` the largest count: the values are sorted per group
    in one call (NaN-padded rows) and every quantile is read at once. With a group's ``n``
    values sorted, ``q`` reads position ``h = (n - 1) q`` and interpolates linearly between its
    two neighbours; an infinite neighbour gives that infinity. NaN for an empty group.

    ``x`` float32 is sorted as float32 (half the bytes of float64 and twice the lanes of the
    vectorised sort); the float64 conversion is exact and keeps the order, so the two neighbours,
    taken to float64 before the interpolation, are the ones a float64 sort gives."""
    import numpy as np

    n_m, n_g = len(x), n_groups
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.float64
    if group.size == n_g * width and bool(use.all()):
        # every value counts and every group holds the same number (a profile's usual case): the
        # values, in group order, already are the rows; no padding or scatter
        sorted_rows = np.array(x, dtype=dtype).reshape(n_m, n_g, width)
    else:
        sorted_rows = np.full((n_m, n_g, width), np.nan, dtype=dtype)
        for j in range(n_m):
            g, values = group[use[j]], x[j][use[j]]
            starts = np.concatenate([[0], np.cumsum(counts[j])[:-1]])
            sorted_rows[j, g, np.arange(g.size) - starts[g]] = values  # in original order per group
    # numpy's default sort (vectorised introsort, AVX-512 / AVX2 on x86), not the stable merge
    # sort, which is much slower on these rows; equal values are interchangeable, so the sorted rows, and every
    # quantile read from them, are the same (only the order of a -0.0 and a +0.0 may differ)
    sorted_rows.sort(axis=2)
    n = np.maximum(counts, 1)[None]
    h = (n - 1) * np.asarray([float(q) for q in qs], dtype=np.float64)[:, None, None]
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = h - lo
    mi, gi = np.arange(n_m)[None, :, None], np.arange(n_g)[None, None, :]
    a, b = sorted_rows[mi, gi, lo].astype(np.float64), sorted_rows[mi, gi, hi].astype(np.float64)
    with np.errstate(invalid="ignore"):
        v = a + frac * (b - a)
    # an infinite neighbour wins the interpolation (nan only between -inf and +inf)
    v = np.where(np.isinf(b) & np.isfinite(a), b, v)
    v = np.where(np.isinf(a) & np.isfinite(b), a, v)
    v = np.where((a == b) | (frac == 0), a, v)
    return np.where(counts[None] > 0, v, np.nan).astype(np.float64)
