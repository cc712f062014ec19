"""Worked solutions of notebook 2 (editing and sweeps). ``solve_<n>(ns)``: what a reader would
write (``ns`` is the notebook's ``globals()``); ``expected_<n>(ns)``: what the check compares with."""

from __future__ import annotations

import torch

CHECKS = {
    1: {"rtol": 0.0, "atol": 1e-3, "hint": "float((logits(tld.ValueScale(s_par=0.5)) - logits(tld.EffectiveDiagonal(0.5))).abs().max())"},
    2: {"hint": "r = results[results.s_par == 0]; r.loc[r.delta_ppl.idxmax(), 'space']"},
    3: {"rtol": 1e-3, "atol": 1e-5, "hint": "with tld.apply_edits(model, tld.ValueScale(s_par=0.0)): model(..., return_type='loss')"},
}


def solve_1(ns):
    tld, logits = ns["tld"], ns["logits"]
    return float((logits(tld.ValueScale(s_par=0.5)) - logits(tld.EffectiveDiagonal(0.5))).abs().max())


def expected_1(ns):
    return 0.0  # the same edit: equal to float rounding


def solve_2(ns):
    r = ns["results"]
    r = r[r.s_par == 0]
    return str(r.loc[r.delta_ppl.idxmax(), "space"])


def expected_2(ns):
    r = ns["results"]
    return str(r[r.s_par == 0].sort_values("delta_ppl").iloc[-1]["space"])


def solve_3(ns):
    tld, model, batch = ns["tld"], ns["model"], ns["batch"]
    with torch.no_grad():
        plain = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
        with tld.apply_edits(model, tld.ValueScale(s_par=0.0)):
            edited = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
    return float(edited - plain)


def expected_3(ns):
    r = ns["results"]
    return float(r[(r.space == "value") & (r.s_par == 0)].delta_loss.iloc[0])
