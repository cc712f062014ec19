"""Paired, interleaved timing and the statistics of the ratios.

Only ratios measured in the same run are meaningful on a shared, noisy machine, so every
measurement is a *pair*: one call of the baseline and one call of the candidate, back to back.
Load that changes over seconds (another engineer's test run starting) hits both halves of a
pair almost equally and cancels in their ratio. The order inside a pair alternates
(baseline first on even pairs, candidate first on odd pairs), so a systematic "second call is
faster / slower" effect (cache warmth, allocator state) cancels too. A few warm-up pairs run
first and are discarded (first-call costs: lazy imports, allocator growth, kernel selection).

The reported ``ratio`` is the median of the per-pair ratios ``candidate_i / baseline_i``; its
``ci95`` is a seeded percentile bootstrap over pairs (resample the pairs with replacement,
take the median, read the 2.5 % and 97.5 % quantiles of those medians).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

#: Bootstrap resamples for the ratio's confidence interval.
N_BOOTSTRAP = 2000


@dataclass
class PairedTiming:
    """Raw result of one paired measurement: seconds per call and the per-pair ratios."""

    baseline_s: list[float] = field(default_factory=list)
    candidate_s: list[float] = field(default_factory=list)
    warmup_pairs: int = 0
    stop_reason: str = ""

    @property
    def ratios(self) -> list[float]:
        return [c / b for b, c in zip(self.baseline_s, self.candidate_s, strict=True)]

    @property
    def n_pairs(self) -> int:
        return len(self.baseline_s)


def _timed(fn: Callable[[], object], sync: Callable[[], None] | None) -> float:
    """Wall-clock seconds of one call of ``fn`` (device synchronised before and after)."""
    if sync is not None:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - t0


def median_ci(ratios: list[float], *, seed: int, n_boot: int = N_BOOTSTRAP,
              level: float = 0.95) -> tuple[float, tuple[float, float]]:
    """Median of ``ratios`` and a seeded percentile-bootstrap interval for it.

    With fewer than two ratios the interval is degenerate (``(median, median)``).
    """
    x = np.asarray(ratios, dtype=np.float64)
    if x.size == 0:
        return math.nan, (math.nan, math.nan)
    med = float(np.median(x))
    if x.size < 2:
        return med, (med, med)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    boots = np.median(x[idx], axis=1)
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return med, (float(lo), float(hi))


def paired_timing(
    baseline: Callable[[], object],
    candidate: Callable[[], object],
    *,
    warmup: int,
    min_pairs: int,
    max_pairs: int,
    max_seconds: float,
    done: Callable[[list[float]], bool] | None = None,
    sync: Callable[[], None] | None = None,
    floor_pairs: int = 5,
    baseline_scale: float = 1.0,
) -> PairedTiming:
    """Time ``baseline`` and ``candidate`` in interleaved pairs.

    Runs ``warmup`` discarded pairs, then at least ``min_pairs`` pairs and at most
    ``max_pairs``; after ``min_pairs`` it stops as soon as ``done(ratios)`` is true (the
    interval is decisive or narrow enough) or ``max_seconds`` of measuring have passed. A
    record whose pairs are so slow that ``min_pairs`` would take more than twice
    ``max_seconds`` stops at that hard budget, but never before ``floor_pairs`` pairs.

    Args:
        baseline, candidate: zero-argument callables doing one unit of work each.
        warmup: pairs run first and thrown away.
        min_pairs, max_pairs: bounds on the recorded pairs.
        max_seconds: time budget for the recorded pairs (checked between pairs).
        done: stopping rule on the ratios so far.
        sync: device synchronisation (``torch.cuda.synchronize``) or None on CPU.
        floor_pairs: fewest pairs before the hard budget (``2 x max_seconds``) may stop.
        baseline_scale: each baseline time is multiplied by this (``k`` when ``baseline`` is
            one of ``k`` identical sequential calls that make up the real baseline).
    """
    result = PairedTiming(warmup_pairs=warmup)
    for i in range(warmup):
        if i % 2 == 0:
            _timed(baseline, sync), _timed(candidate, sync)
        else:
            _timed(candidate, sync), _timed(baseline, sync)
    start = time.perf_counter()
    while result.n_pairs < max_pairs:
        if result.n_pairs % 2 == 0:
            b = _timed(baseline, sync) * baseline_scale
            c = _timed(candidate, sync)
        else:
            c = _timed(candidate, sync)
            b = _timed(baseline, sync) * baseline_scale
        result.baseline_s.append(b)
        result.candidate_s.append(c)
        elapsed = time.perf_counter() - start
        if result.n_pairs < min_pairs:
            if result.n_pairs >= floor_pairs and elapsed > 2 * max_seconds:
                result.stop_reason = f"hard time budget (2 x {max_seconds:g} s) spent"
                return result
            continue
        if done is not None and done(result.ratios):
            result.stop_reason = "ci95 decisive or narrow enough"
            return result
        if elapsed > max_seconds:
            result.stop_reason = f"time budget ({max_seconds:g} s) spent"
            return result
    result.stop_reason = f"max_pairs ({max_pairs}) reached"
    return result


__all__ = ["N_BOOTSTRAP", "PairedTiming", "median_ci", "paired_timing"]
