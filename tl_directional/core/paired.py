"""Paired item-level statistics of accuracy (protocol sec. 9.4): the bootstrap of baseline minus
edited accuracy over items (:func:`paired_drop`) or over clusters of items such as windows, with
an optional macro average over cells (:func:`cluster_paired_drop`, sec. 9.7), the two margin rules
and Holm's step-down over a family of them.

Accuracy is in points (percent of items right); every item is resampled with both of its
scores (baseline and edited), so the interval is of the paired difference."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tl_directional.core.errors import TLDirectionalError

HELD, FAILED, UNDECIDED = "held", "failed", "not decided"


class PairedStatsError(TLDirectionalError, ValueError):
    """An argument of the paired accuracy statistics is out of its valid range."""


@dataclass(frozen=True)
class PairedDrop:
    """Baseline minus edited accuracy in points: ``point`` on all items, the 95% percentile
    interval ``[lo, hi]`` of the bootstrap, and the resampled drops (``[n_resamples]``)."""

    point: float
    lo: float
    hi: float
    n_items: int
    resamples: Tensor


def paired_drop(
    base_correct: Tensor,
    edit_correct: Tensor,
    n_resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> PairedDrop:
    """Bootstrap over items (``n_resamples`` draws of ``n`` items with replacement, a CPU
    ``torch.Generator`` seeded ``seed``) of ``100 * (mean(base) - mean(edit))``.
    ``base_correct`` / ``edit_correct``: ``[n]`` 0/1 (bool or number), item ``i`` of both the
    same item."""
    b, e = base_correct.double().flatten(), edit_correct.double().flatten()
    if b.shape != e.shape or b.numel() == 0:
        raise PairedStatsError(
            f"base_correct has {b.numel()} items, edit_correct {e.numel()}: pass the same, "
            "non-empty item list scored twice"
        )
    if n_resamples < 1 or not 0 < level < 1:
        raise PairedStatsError(
            f"n_resamples={n_resamples}, level={level}: need n_resamples >= 1 and "
            "0 < level < 1; pass e.g. 2000 and 0.95"
        )
    d = 100.0 * (b - e)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, d.numel(), (n_resamples, d.numel()), generator=g)
    rs = d[idx].mean(1)
    q = torch.quantile(rs, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return PairedDrop(float(d.mean()), float(q[0]), float(q[1]), int(d.numel()), rs)


def within_verdict(drop: PairedDrop, margin: float) -> str:
    """Sec. 9.4's "within ``margin`` points of baseline": held if the interval's upper bound is
    below ``margin``, failed if its lower bound is above it, else not decided."""
    return HELD if drop.hi < margin else FAILED if drop.lo > margin else UNDECIDED


def worse_verdict(drop: PairedDrop, margin: float) -> str:
    """Sec. 9.4's "at least ``margin`` points worse": held if the interval's lower bound is above
    ``margin``, failed if its upper bound is below it, else not decided."""
    return HELD if drop.lo > margin else FAILED if drop.hi < margin else UNDECIDED


def one_sided_p(drop: PairedDrop, margin: float, held_below: bool) -> float:
    """Bootstrap p-value of the held side: the share of resamples on the other side of
    ``margin`` (``held_below``: the "within" rule, held when the drop is below the margin)."""
    rs = drop.resamples
    bad = (rs >= margin) if held_below else (rs <= margin)
    return float((bad.double().sum() + 1) / (rs.numel() + 1))


def holm(pvalues: dict[str, float], alpha: float = 0.05) -> set[str]:
    """Holm's step-down: the keys whose hypotheses are rejected at family-wise ``alpha``.

    ``pvalues``: ``{key: p}``. The hypotheses are tested in increasing ``p`` (ties by key, so the
    order is deterministic); the ``i``-th (0-based) of ``m`` is rejected while ``p <= alpha / (m - i)``
    and testing stops at the first that is not. Tied p-values always share one decision (the later
    of two ties is tested against a larger level), so the returned set never depends on the tie
    order. The one Holm procedure of the library and the studies."""
    order = sorted(pvalues, key=lambda k: (pvalues[k], k))
    out: set[str] = set()
    for i, k in enumerate(order):
        if pvalues[k] > alpha / (len(order) - i):
            break
        out.add(k)
    return out


def cluster_draw_counts(clusters: Tensor, strata: Tensor, n_resamples: int, seed: int = 0) -> Tensor:
    """``[n_resamples, n_clusters]`` float64 draw counts of a stratified cluster bootstrap: within
    each stratum (in increasing id order), its clusters drawn with replacement as many times as it
    has clusters, from a CPU ``torch.Generator`` seeded ``seed``. ``clusters``: ``[n]`` ids
    numbered ``0 .. n_clusters - 1`` (every id used), ``strata``: ``[n]`` the stratum of each
    entry, constant over a cluster. An item's weight in resample ``r`` is its cluster's count."""
    g = torch.Generator().manual_seed(seed)
    n_clusters = int(clusters.max()) + 1
    counts = torch.zeros(n_resamples, n_clusters, dtype=torch.float64)
    of = torch.full((n_clusters,), -1, dtype=torch.long)
    of[clusters] = strata
    for s in torch.unique(strata).tolist():
        members = torch.nonzero(of == s).flatten()
        draws = members[torch.randint(0, members.numel(), (n_resamples, members.numel()), generator=g)]
        counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
    return counts


def cluster_paired_drop(
    base_correct: Tensor,
    edit_correct: Tensor,
    clusters: Tensor,
    strata: Tensor | None = None,
    cells: Tensor | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> PairedDrop:
    """Baseline minus edited accuracy in points with a cluster bootstrap: the clusters
    (``clusters``, ``[n]`` ids, e.g. the window each item was cut from) are resampled with
    replacement within each stratum (``strata``, ``[n]`` ids constant over a cluster, e.g. the
    text; default one stratum), each item weighted by its cluster's draw count, so items that
    share a window move together. The statistic is the item mean (``cells`` None) or the
    **macro** average: the mean over cells (``cells``, ``[n]`` ids, e.g. text x kind) of each
    cell's item mean, as the paper's Avg. over tasks. ``n_resamples`` draws from a CPU
    ``torch.Generator`` seeded ``seed``; the same ids and seed give the same resamples for every
    setting, so differences between settings are paired.

    Raises:
        PairedStatsError: ids not of the items' length, a cluster in two strata, or bad
            ``n_resamples`` / ``level``.
    """
    b, e = base_correct.double().flatten(), edit_correct.double().flatten()
    n = b.numel()
    strata = torch.zeros(n, dtype=torch.long) if strata is None else strata.long().flatten()
    cells_ = torch.zeros(n, dtype=torch.long) if cells is None else cells.long().flatten()
    ids = clusters.long().flatten()
    if e.shape != b.shape or n == 0 or ids.numel() != n or strata.numel() != n or cells_.numel() != n:
        raise PairedStatsError(
            f"base_correct {b.numel()}, edit_correct {e.numel()}, clusters {ids.numel()}, strata "
            f"{strata.numel()}, cells {cells_.numel()} items: pass one non-empty id per item")
    if n_resamples < 1 or not 0 < level < 1:
        raise PairedStatsError(f"n_resamples={n_resamples}, level={level}: need n_resamples >= 1 and "
                               "0 < level < 1; pass e.g. 2000 and 0.95")
    _, ids = torch.unique(ids, return_inverse=True)
    pairs = torch.unique(torch.stack([ids, strata]), dim=1)
    if pairs.shape[1] != int(ids.max()) + 1:
        raise PairedStatsError("clusters: a cluster lies in two strata; strata must be constant over a cluster")
    _, cell = torch.unique(cells_, return_inverse=True)
    onehot = torch.nn.functional.one_hot(cell).double()  # [n, n_cells]
    d = 100.0 * (b - e)
    w = cluster_draw_counts(ids, strata, n_resamples, seed)[:, ids]  # [R, n]
    per_cell = ((w * d) @ onehot) / (w @ onehot)  # a cell no resample drew: NaN, left out
    rs = per_cell.nanmean(1)
    point = float(((d @ onehot) / onehot.sum(0)).mean())
    q = torch.quantile(rs, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return PairedDrop(point, float(q[0]), float(q[1]), n, rs)
