"""The statistics of protocol sec. 15 (claim 4 in a single pass at six seeds): paired Student-t
intervals over seeds, the held / failed / not decided rule that waits for every seed, the
early-step gap and the learning-rate choice. Pure functions of per-seed numbers; the paired
comparison itself (mean, 95% Student-t interval, sign-flip p) is the library's
:func:`tl_directional.training.paired_comparison`.

Inputs are ``{variant: {seed: final validation loss}}`` (nats per predicted token) and, for the
early-step gap, ``{variant: {seed: {step: validation loss}}}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from studies import common

#: The evaluations the early-step gap averages (protocol sec. 15, "a declared secondary").
EARLY_STEPS = (100, 200, 300)


def counted_seeds(finals: Mapping[str, Mapping[int, float]], arms: Iterable[str], seeds: Iterable[int]) -> list[int]:
    """The seeds of ``seeds`` that count: those with a final loss in every one of ``arms`` (a seed
    counts only when all its arms are finished, protocol sec. 15)."""
    arms = list(arms)
    return [s for s in seeds if all(s in finals.get(a, {}) for a in arms)]


def paired(finals: Mapping[str, Mapping[int, float]], variant: str, reference: str,
           seeds: Sequence[int]) -> dict | None:
    """``variant - reference`` paired by seed over ``seeds`` (each must have both arms): the
    library's paired comparison (``n``, ``mean_diff``, ``std_diff``, ``ci95_low``, ``ci95_high``
    with ``t975(n - 1)``, ``perm_p``, ``wins``) plus ``seeds``; None under 2 seeds."""
    from tl_directional.training import paired_comparison

    seeds = list(seeds)
    if len(seeds) < 2:
        return None
    out = paired_comparison([finals[variant][s] for s in seeds], [finals[reference][s] for s in seeds])
    return {**out, "seeds": seeds}


def verdict(stat: dict | None, missing: Sequence[int]) -> str:
    """Sec. 10's rule at sec. 15's seeds: **held** if the interval's upper bound is below 0,
    **failed** if its lower bound is above 0, **not decided** otherwise, and not decided while any
    seed is ``missing`` (named)."""
    if missing:
        return f"not decided (seed{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} missing)"
    if stat is None:
        return "not decided (fewer than 2 seeds)"
    return common.interval_verdict(stat)


def early_gap(curves: Mapping[str, Mapping[int, Mapping[int, float]]], variant: str, reference: str,
              seeds: Sequence[int], steps: Sequence[int] = EARLY_STEPS) -> dict | None:
    """The early-step gap: per seed the mean over ``steps`` of ``variant - reference`` validation
    loss, then the paired comparison of those per-seed means over ``seeds`` (the mean of the
    differences is the difference of the means, so the interval is of the gap). Seeds without
    every step in both arms are left out and named in ``"incomplete"``; None under 2 seeds."""
    ok, incomplete = [], []
    for s in seeds:
        have = all(k in curves.get(a, {}).get(s, {}) for a in (variant, reference) for k in steps)
        (ok if have else incomplete).append(s)
    means = {a: {s: sum(curves[a][s][k] for k in steps) / len(steps) for s in ok} for a in (variant, reference)}
    stat = paired(means, variant, reference, ok)
    return None if stat is None else {**stat, "incomplete": incomplete, "steps": list(steps)}


def best_lr(losses: Mapping[float, float]) -> float:
    """The candidate rate with the lowest final validation loss; ties go to the smaller rate
    (protocol sec. 10's rule, used for sec. 15's V-Para check)."""
    if not losses:
        raise ValueError("best_lr needs at least one candidate rate with its final validation loss, got none")
    return min(sorted(losses), key=lambda lr: losses[lr])


__all__ = ["EARLY_STEPS", "best_lr", "counted_seeds", "early_gap", "paired", "verdict"]


def ledger(recs: Mapping[str, Mapping]) -> dict:
    """A manifest's CPU ledger of finished task records (name -> record): CPU hours summed, the
    tasks whose CPU time is partial (resumed), and the commits the tasks ran at (``+dirty`` kept)."""
    return {
        "cpu_hours": sum(r.get("cpu_s", 0) for r in recs.values()) / 3600,
        "cpu_partial_runs": sorted(t for t, r in recs.items() if not r.get("cpu_complete", False)),
        "task_commits": sorted({c[:7] + ("+dirty" if c.endswith("+dirty") else "")
                                for c in (r.get("commit", "unknown") for r in recs.values())}),
    }
