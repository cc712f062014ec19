"""Worked solutions of notebook 3 (compression diagnostics). ``solve_<n>(ns)``: what a reader
would write (``ns`` is the notebook's ``globals()``); ``expected_<n>(ns)``: what the check compares with."""

from __future__ import annotations

import torch

CHECKS = {
    1: {"hint": "geometry[geometry.unit != 'block'].groupby('compressed').err_perp_energy.mean().idxmax()"},
    2: {"rtol": 0.0, "atol": 1e-6, "hint": "g = geometry; g[(g.compressed == 'drop1') & (g.unit == 'block') & (g.layer == 1)]"},
    3: {"rtol": 1e-4, "atol": 1e-6, "hint": "heldout_loss(compressed['rtn4'].model) - dense_loss"},
}


def solve_1(ns):
    g = ns["geometry"]
    return str(g[g.unit != "block"].groupby("compressed").err_perp_energy.mean().idxmax())


def expected_1(ns):
    g = ns["geometry"]
    g = g[g.unit != "block"]
    means = {name: g[g.compressed == name].err_perp_energy.mean() for name in g.compressed.unique()}
    return max(means, key=means.get)


def solve_2(ns):
    g = ns["geometry"]
    return float(g[(g.compressed == "drop1") & (g.unit == "block") & (g.layer == 1)].err_perp_energy.max())


def expected_2(ns):
    return 0.0


def solve_3(ns):
    return ns["heldout_loss"](ns["compressed"]["rtn4"].model) - ns["dense_loss"]


def expected_3(ns):
    batch, m, dense = ns["batch"], ns["compressed"]["rtn4"].model, ns["model"]
    with torch.no_grad():
        lc = m(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
        ld = dense(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
    return float(lc - ld)
