"""Worked solutions of lesson 6 (head-level analysis in value space).

``solve_<n>(ns)`` is the code a reader would write in the exercise cell (``ns`` is the
notebook's ``globals()``); ``expected_<n>(ns)`` is what the check cell compares with, computed
by another route where there is one. Try the exercises first.
"""

from __future__ import annotations

import torch

CHECKS = {
    1: {"rtol": 1e-6, "atol": 1e-9, "hint": "(value.gamma_mean.abs() > value.A_tt_mean).mean()"},
    2: {"rtol": 1e-3, "atol": 1e-6, "hint": "window_loss(edit) - base_loss, then the mean over windows"},
    3: {"hint": "count pattern[0, HEAD].diagonal() < 0 on the edited pattern"},
    4: {"rtol": 0.5, "atol": 1e-4, "hint": "max |a - b| / max |a - plain| with s_par=3, s_perp=1 and s_par=1, s_perp=1/3"},
}


def solve_1(ns):
    v = ns["prof"].value
    return float((v.gamma_mean.abs() > v.A_tt_mean).mean())


def expected_1(ns):
    v = ns["prof"].value
    n = sum(1 for g, a in zip(v.gamma_mean, v.A_tt_mean, strict=True) if abs(g) > a)
    return n / len(v)


def solve_2(ns):
    tld, t1 = ns["tld"], ns["t1"]
    edit = tld.ValueScale(s_par=0.0, mode="exclusive", layers=[int(t1.layer)], heads=[int(t1.h)])
    return float((ns["window_loss"](edit) - ns["base_loss"]).mean())


def expected_2(ns):
    return float(ns["ranked"].iloc[0].delta_loss)


def _pattern_diagonal(ns, edits):
    tld, model, layer, head = ns["tld"], ns["model"], ns["LAYER"], ns["HEAD"]
    batch = tld.prepare_inputs(model, [ns["texts"][0]])
    tokens = batch.tokens[:, :24]
    seen = {}

    def keep(pattern, hook):  # noqa: ARG001
        seen["p"] = pattern.detach().clone()
        return pattern

    hooks = tld.edit_hooks(model, *edits) + [(f"blocks.{layer}.attn.hook_pattern", keep)]
    model.run_with_hooks(tokens, fwd_hooks=hooks, return_type=None)
    return seen["p"][0, head].diagonal()


def solve_3(ns):
    tld = ns["tld"]
    edit = tld.EffectiveDiagonal(0.0, layers=[ns["LAYER"]], heads=[ns["HEAD"]])
    return int((_pattern_diagonal(ns, [edit]) < 0).sum())


def expected_3(ns):
    # Another route: the library's triptych data (its last panel is the V-Para effective diagonal).
    data = ns["views"].attention_triptych_figure(ns["model"], ns["texts"][0], ns["LAYER"], ns["HEAD"],
                                                 max_tokens=24).data
    last = data[data["edit"] == list(dict.fromkeys(data["edit"]))[-1]]
    return int((last[last["query"] == last["key"]]["value"] < 0).sum())


def solve_4(ns):
    tld, L = ns["tld"], ns["L_MID"]
    a = ns["logits_with"](tld.ValueScale(s_par=3.0, s_perp=1.0, layers=[L]))
    b = ns["logits_with"](tld.ValueScale(s_par=1.0, s_perp=1.0 / 3.0, layers=[L]))
    return float((a - b).abs().max() / (a - ns["plain"]).abs().max())


def expected_4(ns):
    tld, model, L = ns["tld"], ns["model"], ns["L_MID"]
    tokens, mask = ns["tokens"], ns["mask"]
    with torch.no_grad():
        a = model.run_with_hooks(tokens, attention_mask=mask,
                                 fwd_hooks=tld.ValueScale(s_par=3.0, s_perp=1.0, layers=[L]).fwd_hooks(model))
        b = model.run_with_hooks(tokens, attention_mask=mask,
                                 fwd_hooks=tld.ValueScale(s_par=1.0, s_perp=1.0 / 3.0, layers=[L]).fwd_hooks(model))
    return float((a - b).abs().max() / (a - ns["plain"]).abs().max())
