"""Seeded percentile bootstrap of a mean over examples, and the random-subspace baseline.

:func:`bootstrap_mean_interval` resamples the first axis (examples) of an array with replacement
and returns the percentile interval of the mean, for every trailing element at once (so one call
gives the intervals of a whole ``[examples, layer, pos, head]`` table, each node resampled with the
same example draws). Pure numpy; the generator is seeded, so the interval is reproducible.

:func:`random_subspace_share` is the level a "share carried by the parallel part" must be read
against: the share of a difference carried by a uniformly random one-dimensional subspace of a
``d``-dimensional space.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .errors import TLDirectionalError


class BootstrapError(TLDirectionalError, ValueError):
    """A bootstrap was asked for with unusable arguments (no examples, a level outside (0, 1), ...)."""


def _check_args(n_resamples, level) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise BootstrapError(
            f"n_resamples must be a positive integer, got {n_resamples!r}; e.g. 2000"
        )
    if (
        isinstance(level, bool)
        or not isinstance(level, (int, float))
        or not 0.0 < float(level) < 1.0
    ):
        raise BootstrapError(
            f"level must be a number in (0, 1), got {level!r}; e.g. 0.95 for a 95% interval"
        )


def bootstrap_mean_interval(
    values, *, n_resamples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over the first axis.

    Args:
        values: array-like ``[n_examples, *rest]`` (float); NaN entries are left out of the
            mean they fall in (``nanmean``), so a node undefined for some examples still gets an
            interval from the others.
        n_resamples: bootstrap resamples (examples drawn with replacement, ``n_examples`` each).
        level: coverage of the two-sided percentile interval.
        seed: seed of the numpy generator (same seed, same interval).

    Returns:
        ``(low, high)``, each shaped ``rest``. With one example both equal that example's values
        (a resample of one is that one: no spread can be estimated).
    """
    _check_args(n_resamples, level)
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 0 or x.shape[0] == 0:
        raise BootstrapError(
            f"values must hold at least one example along axis 0, got shape {x.shape}"
        )
    n = x.shape[0]
    rng = np.random.default_rng(seed)
    flat = x.reshape(n, -1)
    means = np.empty((n_resamples, flat.shape[1]))
    # chunks of resamples keep the [chunk, n, elements] gather bounded in memory
    chunk = max(1, min(n_resamples, 2**24 // max(1, n * flat.shape[1])))
    for start in range(0, n_resamples, chunk):
        k = min(chunk, n_resamples - start)
        idx = rng.integers(0, n, size=(k, n))
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means[start : start + k] = np.nanmean(flat[idx], axis=1)
    tail = (1.0 - float(level)) / 2.0
    with warnings.catch_warnings():  # an all-NaN node stays NaN, which is the answer
        warnings.simplefilter("ignore", RuntimeWarning)
        low = np.nanquantile(means, tail, axis=0)
        high = np.nanquantile(means, 1.0 - tail, axis=0)
    rest = x.shape[1:]
    return low.reshape(rest), high.reshape(rest)


def random_subspace_share(d: int, k: int = 1) -> float:
    """Expected norm share ``E |cos(u, r)|`` of a fixed vector ``u`` carried by a uniformly random
    line ``r`` in ``d`` dimensions: the level of ``par_frac = ||u_par|| / ||u||`` that carries no
    information. Exactly ``Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))``, about ``sqrt(2 / (pi d))``
    (``d = 576``: 0.033); the root-mean-square share is ``1 / sqrt(d)`` (0.042).

    ``k > 1``: the same against a uniformly random ``k``-dimensional subspace, ``E ||P u|| / ||u||
    = Gamma((k+1)/2) Gamma(d/2) / (Gamma(k/2) Gamma((d+1)/2))`` (``||P u||^2 / ||u||^2`` is
    ``Beta(k/2, (d-k)/2)``); ``k = 1`` is the line's value above, ``k = d`` gives 1.

    A "97% perpendicular" figure means little by itself: a random line leaves ~96-97% of any
    difference perpendicular to it in a 576-dimensional stream.
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise BootstrapError(
            f"d must be a positive integer dimension (d_model or d_head), got {d!r}"
        )
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
        raise BootstrapError(f"k must be an integer dimension in [1, d={d}], got {k!r}")
    if k == d:
        return 1.0
    if k == 1:
        return math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi)
    return math.exp(math.lgamma((k + 1) / 2) + math.lgamma(d / 2) - math.lgamma(k / 2) - math.lgamma((d + 1) / 2))


def random_subspace_sq_share(d: int) -> float:
    """Expected squared share ``E cos^2(u, r) = 1 / d`` of a fixed vector's energy (``||u_par||^2 /
    ||u||^2``) carried by a uniformly random line in ``d`` dimensions; the baseline for shares of
    a dot product or an energy, as attribution scores' parallel share is."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise BootstrapError(
            f"d must be a positive integer dimension (d_model or d_head), got {d!r}"
        )
    return 1.0 / d


__all__ = [
    "BootstrapError",
    "bootstrap_mean_interval",
    "random_subspace_share",
    "random_subspace_sq_share",
]
