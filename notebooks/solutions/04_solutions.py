"""Worked solutions of notebook 4 (training-time suppression). ``solve_<n>(ns)``: what a reader
would write (``ns`` is the notebook's ``globals()``); ``expected_<n>(ns)``: what the check compares with."""

from __future__ import annotations

CHECKS = {
    1: {"rtol": 1e-6, "atol": 1e-9, "hint": "c = curves[curves.variant == 'vpara']; the rows at c.step.max(), mean val_loss"},
    2: {"hint": "final rows per (variant, seed), then groupby('variant').val_loss.mean().idxmin()"},
    3: {"rtol": 1e-6, "atol": 1e-9, "hint": "geometry[geometry.variant == 'vpara'].value_energy_ratio.mean()"},
}


def _final(curves):
    return curves[curves.step == curves.groupby(["variant", "seed"]).step.transform("max")]


def solve_1(ns):
    c = ns["curves"]
    c = c[c.variant == "vpara"]
    return float(c[c.step == c.step.max()].val_loss.mean())


def expected_1(ns):
    f = _final(ns["curves"])
    return float(f[f.variant == "vpara"].val_loss.mean())


def solve_2(ns):
    return str(_final(ns["curves"]).groupby("variant").val_loss.mean().idxmin())


def expected_2(ns):
    f = _final(ns["curves"])
    means = {v: f[f.variant == v].val_loss.mean() for v in f.variant.unique()}
    return min(means, key=means.get)


def solve_3(ns):
    g = ns["geometry"]
    return float(g[g.variant == "vpara"].value_energy_ratio.mean())


def expected_3(ns):
    g = ns["geometry"]
    values = [r.value_energy_ratio for r in g.itertuples() if r.variant == "vpara"]
    return sum(values) / len(values)
