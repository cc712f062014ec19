"""Worked solutions of lesson 7 (SAE features and a steering vector, split against the stream).

Each ``solve_<n>(ns)`` is the code a reader would write in the exercise cell, reading the
notebook's variables from ``ns`` (its ``globals()``); ``expected_<n>(ns)`` is the value the check
cell compares with, computed by another route where there is one. Try the exercises first.
"""

from __future__ import annotations

import torch

CHECKS = {
    1: {"rtol": 1e-4, "atol": 1e-6, "hint": "coef = (u * x).sum(-1) / (x * x).sum(-1); par = coef[..., None] * x; "
                                            "sum over s.kept() of |par|^2 over sum of |u|^2"},
    2: {"hint": "into.labels[int(into.energy_share().argmax())]"},
    3: {"rtol": 1e-4, "atol": 1e-7, "hint": "h = cache0[f'blocks.{L}.hook_resid_pre'][0, -1]; (v . h)^2 / (|v|^2 |h|^2)"},
    4: {"rtol": 1e-3, "atol": 1e-3, "hint": "inside the hook: h = resid[:, 1:]; v_perp = v - ((h @ v) / (h * h).sum(-1))"
                                            "[..., None] * h; resid[:, 1:] = h + ALPHA * v_perp"},
}


# Exercise 1: the reconstruction's energy share along the stream, by hand.
def solve_1(ns):
    s = ns["s"]
    keep = s.kept()
    u, x = s.reconstruction[keep].double(), s.stream[keep].double()  # [tokens, d_model]
    coef = (u * x).sum(-1) / (x * x).sum(-1)
    par = coef[:, None] * x
    return float((par * par).sum() / (u * u).sum())


def expected_1(ns):
    summary = ns["s"].summary().set_index("part")
    return float(summary.loc["reconstruction", "energy_share"])


# Exercise 2: the component with the largest energy share inside the top features' span.
def solve_2(ns):
    into = ns["into"]
    return into.labels[int(into.energy_share().argmax())]


def expected_2(ns):
    # independently: TransformerLens's own stack projected on an orthonormal basis of the rows
    stack, labels = ns["sae_cache"].decompose_resid(ns["s"].layer, pos_slice=-1, return_labels=True)
    q = torch.linalg.qr(ns["features"].vectors.double().T).Q  # [d_model, K]
    u = stack.double().reshape(len(labels), -1, stack.shape[-1])
    inside = ((u @ q) ** 2).sum((1, 2))
    share = inside / (u * u).sum((1, 2))
    return labels[int(share.argmax())]


# Exercise 3: the steering vector's energy share along the stream at the last token.
def solve_3(ns):
    h = ns["cache0"][f"blocks.{ns['L']}.hook_resid_pre"][0, -1].double()
    v = ns["v"].vectors.double()
    return float((v @ h) ** 2 / ((v @ v) * (h @ h)))


def expected_3(ns):
    return float(ns["steer"].last_report.par_share[ns["L"]][0, -1])


# Exercise 4: the turning part alone, with a hand-written hook.
def solve_4(ns):
    model, v, alpha = ns["model"], ns["v"].vectors, ns["ALPHA"]

    def add_perp(resid, hook):  # noqa: ARG001
        h = resid[:, 1:]
        coef = (h @ v.to(h.dtype)) / (h * h).sum(-1)
        v_perp = v.to(h.dtype) - coef[..., None] * h
        resid[:, 1:] = h + alpha * v_perp
        return resid

    logits = model.run_with_hooks(ns["tokens"], fwd_hooks=[(f"blocks.{ns['L']}.hook_resid_pre", add_perp)])
    return ns["logit_diff"](logits)


def expected_4(ns):
    return float(ns["sweep_wide"].loc[ns["ALPHA"], "turning part (s_par=0)"])
