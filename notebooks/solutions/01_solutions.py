"""Worked solutions of notebook 1 (the tour). ``solve_<n>(ns)``: what a reader would write
(``ns`` is the notebook's ``globals()``); ``expected_<n>(ns)``: what the check compares with."""

from __future__ import annotations

import torch

CHECKS = {
    1: {"hint": "v = prof.value; ((v.layer == 1) & (v.gamma_mean > v.A_tt_mean)).sum()"},
    2: {"rtol": 1e-4, "atol": 1e-6, "hint": "loss(tld.ResidualScale('attn', s_perp=0.0, layers=[1])) - loss()"},
    3: {"hint": "the triptych's last panel is the effective diagonal: rows with query == key, value < 0"},
}


def solve_1(ns):
    v = ns["prof"].value
    return int(((v.layer == 1) & (v.gamma_mean > v.A_tt_mean)).sum())


def expected_1(ns):
    v = ns["prof"].value
    return sum(1 for r in v.itertuples() if r.layer == 1 and r.gamma_mean > r.A_tt_mean)


def solve_2(ns):
    tld = ns["tld"]
    return ns["loss"](tld.ResidualScale("attn", s_perp=0.0, layers=[1])) - ns["loss"]()


def expected_2(ns):
    tld, model, batch = ns["tld"], ns["model"], ns["batch"]
    edit = tld.ResidualScale("attn", s_perp=0.0, layers=[1])
    with torch.no_grad():
        edited = model.run_with_hooks(batch.tokens, attention_mask=batch.attention_mask, return_type="loss",
                                      fwd_hooks=edit.fwd_hooks(model))
        plain = model(batch.tokens, attention_mask=batch.attention_mask, return_type="loss")
    return float(edited - plain)


def solve_3(ns):
    data = ns["views"].attention_triptych(ns["model"], ns["texts"][0], ns["layer"], ns["head"], max_tokens=20).data
    last = data[data["edit"] == list(dict.fromkeys(data["edit"]))[-1]]
    return int((last[last["query"] == last["key"]]["value"] < 0).sum())


def expected_3(ns):
    tld, model, layer, head = ns["tld"], ns["model"], ns["layer"], ns["head"]
    tokens = tld.prepare_inputs(model, [ns["texts"][0]]).tokens[:, :20]
    seen = {}

    def keep(pattern, hook):  # noqa: ARG001
        seen["p"] = pattern.detach().clone()
        return pattern

    hooks = tld.EffectiveDiagonal(0.0, layers=[layer], heads=[head]).fwd_hooks(model)
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks + [(f"blocks.{layer}.attn.hook_pattern", keep)], return_type=None)
    return int((seen["p"][0, head].diagonal() < 0).sum())
