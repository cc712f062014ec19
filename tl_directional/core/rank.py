"""Rank statistics: average ranks and Spearman's rank correlation, vectorised over leading axes.

The one implementation the library and the studies use (``studies/``: the claims, compression
and attribution pages). Ties are decided once, here: tied values share the mean of the ranks
they span (``scipy.stats.rankdata(method="average")``, pandas' ``rank()``), so Spearman's rho is
the Pearson correlation of those average ranks, as ``scipy.stats.spearmanr`` computes it. The
order a sort gives tied values never matters (a bootstrap resample repeats values, and an
unstable sort orders repeats differently between numpy builds).

A side with every value equal has no ranking; rho is then undefined: ``if_constant`` (NaN by
default, like scipy) is returned for it. Pure numpy, float64 throughout.
"""

from __future__ import annotations

import numpy as np

from .errors import TLDirectionalError


class RankError(TLDirectionalError, ValueError):
    """A rank statistic was asked of arrays it cannot rank (mismatched or empty last axes)."""


def average_ranks(x) -> np.ndarray:
    """1-based ranks of ``x`` along its last axis, ties sharing their average rank.

    ``x``: ``[..., n]`` numbers (any array-like: numpy, torch on the CPU, lists). Returns a float64
    ``[..., n]`` array; each row's ranks sum to ``n (n + 1) / 2``. NaN is ranked above every
    number, each NaN on its own."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0 or a.shape[-1] == 0:
        raise RankError(f"x has shape {a.shape}: pass at least one value along the last axis")
    n = a.shape[-1]
    order = np.argsort(a, axis=-1, kind="stable")
    s = np.take_along_axis(a, order, axis=-1)
    pos = np.broadcast_to(np.arange(n), s.shape)
    # a run of equal sorted values spans [first, last]; every member gets (first + last) / 2
    new_run = np.ones(s.shape, dtype=bool)
    new_run[..., 1:] = s[..., 1:] != s[..., :-1]
    end_run = np.ones(s.shape, dtype=bool)
    end_run[..., :-1] = new_run[..., 1:]
    first = np.maximum.accumulate(np.where(new_run, pos, 0), axis=-1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(end_run, pos, n - 1), -1), axis=-1), -1)
    ranks = np.empty(s.shape, dtype=np.float64)
    np.put_along_axis(ranks, order, (first + last) / 2.0 + 1.0, axis=-1)
    return ranks


def spearman(x, y, *, if_constant: float = float("nan")):
    """Spearman's rho of ``x`` and ``y`` along their last axis (Pearson correlation of
    :func:`average_ranks`).

    ``x``, ``y``: ``[..., n]`` (leading axes broadcast, e.g. ``[B + 1, n]`` bootstrap draws
    against one ``[n]`` target). Returns a Python float for 1-D inputs, else a float64 array of
    the broadcast leading shape. Where a side is constant (no ranking) the result is
    ``if_constant``: NaN by default; pass ``0.0`` where a constant diagnostic should read as
    "no rank agreement" (the compression pages do)."""
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.shape[-1] != ry.shape[-1]:
        raise RankError(f"x has {rx.shape[-1]} values along the last axis, y {ry.shape[-1]}: pass paired values")
    rx = rx - rx.mean(-1, keepdims=True)
    ry = ry - ry.mean(-1, keepdims=True)
    den = np.sqrt((rx * rx).sum(-1) * (ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(den > 0, (rx * ry).sum(-1) / np.where(den > 0, den, 1.0), if_constant)
    return float(rho) if rho.ndim == 0 else rho
