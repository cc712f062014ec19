"""The lead table's order readings, both ways: hard diagonal removal against each removal that the
paper's table (`tab:general-zeroshot`, every version) ranks above it, read from the committed data
in nats (the amend run: paired bootstrap over windows, protocol sec. 2) and in accuracy points (the
accuracy suite the lead table reads: since protocol sec. 9.7's switch the fair suite's macro average
with its window-cluster bootstrap where committed, else sec. 9.4's pooled items with the item
bootstrap; either way the same resamples for every setting), per model. A pure function of the
statistics it is given, so the tests build those on constructed data.

Sign convention: every difference is hard diagonal minus the other setting, so a positive
difference (interval above zero) means hard diagonal removal costs more, the paper's order.
"""

from __future__ import annotations

import torch

from studies.claims import stats as S

HARD = "hard-diag skip0"
#: ``(setting, its name in the row)``, every one on layers 1.. (skip0) as the paper edits them
AGAINST = (
    ("value-exclusive-joint skip0 s_par=0", "joint exclude-self (the paper's form)"),
    ("value-exclusive skip0 s_par=0", "per-head exclude-self"),
    ("value-full-joint skip0 s_par=0", "V-Para (joint)"),
    ("resid-attn skip0 s_par=0", "residual attention"),
)


def side(lo: float, hi: float) -> str:
    """``"more"`` (interval above zero), ``"less"`` (below) or ``"not separated"``."""
    return "more" if lo > 0 else "less" if hi < 0 else "not separated"


def nat_difference(nats: dict, first: str, second: str) -> tuple[float, float, float]:
    """``(point, lo, hi)`` of ``first`` minus ``second`` in nats per predicted token, 95%, from
    one run's :func:`studies.claims.stats.setting_stats` (the same window resamples: paired)."""
    return S.interval(nats[first]["pooled"] - nats[second]["pooled"])


def acc_difference(acc: dict, first: str, second: str) -> tuple[float, float, float]:
    """``(point, lo, hi)`` of ``first``'s accuracy drop minus ``second``'s in points, 95%, from
    ``{setting: (PairedDrop, verdict)}`` (the same resamples for every setting, items or window
    clusters: paired)."""
    d1, d2 = acc[first][0], acc[second][0]
    diff = (d1.resamples - d2.resamples).double()
    lo, hi = torch.quantile(diff, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return d1.point - d2.point, lo, hi


def comparisons(nats: dict, acc: dict, models) -> dict[str, list[tuple[str, tuple | None, tuple | None]]]:
    """``{model: [(name, nats (point, lo, hi) or None, accuracy (point, lo, hi) or None)]}`` for
    every setting of :data:`AGAINST`; ``nats`` / ``acc`` map a model to its statistics (a model
    or setting without data gives ``None`` in that unit)."""
    out = {}
    for m in models:
        n, a = nats.get(m, {}), acc.get(m, {})
        rows = []
        for setting, name in AGAINST:
            rows.append((name,
                         nat_difference(n, HARD, setting) if HARD in n and setting in n else None,
                         acc_difference(a, HARD, setting) if HARD in a and setting in a else None))
        if any(r[1] or r[2] for r in rows):
            out[m] = rows
    return out


def _fmt(x, f: str) -> str:
    return f"{x[0]:{f}} [{x[1]:{f}}, {x[2]:{f}}]"


def ours_cell(rows, acc_name: str = "accuracy") -> str:
    """One model's cell: each comparison in both units (the accuracy one called ``acc_name``, e.g.
    ``"accuracy (fair suite)"``, so the cell names the suite it read)."""
    parts = []
    for name, nat, ac in rows:
        units = ([f"nats {_fmt(nat, '+.3f')}"] if nat else []) + ([f"{acc_name} {_fmt(ac, '+.2f')} points"] if ac else [])
        parts.append(f"hard diagonal minus {name}: " + ", ".join(units))
    return "; ".join(parts)


def reading(comps: dict) -> str:
    """The explanation cell: per comparison, which way the data point on every model and unit."""
    if not comps:
        return "Not yet measured (amend run, accuracy suite)."
    L = []
    for i, (_, name) in enumerate(AGAINST):
        sides = {(m, u): side(*x[1:]) for m, rows in comps.items()
                 for u, x in (("nats", rows[i][1]), ("accuracy", rows[i][2])) if x}
        if not sides:
            continue
        if set(sides.values()) == {"less"}:
            L.append(f"against {name} it costs *less* on every model in every unit measured, the reverse "
                     "of the paper's order")
        elif set(sides.values()) == {"more"}:
            L.append(f"against {name} it costs more on every model in every unit measured, the paper's order")
        else:
            per = "; ".join(f"{m}: " + ", ".join(f"{sides[(m, u)]} in {u}" for u in ("nats", "accuracy")
                                                 if (m, u) in sides) for m in comps)
            L.append(f"against {name} the reading depends on the model ({per})")
    return ("Hard diagonal minus each other removal, paired, both units (positive: hard diagonal costs "
            "more, the paper's order): " + "; ".join(L) + ".")
