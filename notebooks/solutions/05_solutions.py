"""Worked solutions of lesson 5 (directional activation patching).

Each ``solve_<n>(ns)`` is the code a reader would write in the exercise cell, reading the
notebook's variables from ``ns`` (its ``globals()``); ``expected_<n>(ns)`` is the value the check
cell compares with, computed by another route where there is one. Try the exercises first.
"""

from __future__ import annotations

import torch

CHECKS = {
    1: {"rtol": 1e-3, "atol": 1e-3, "hint": "logits[0, -1, answer_ids[0]] - logits[0, -1, wrong_ids[0]], clean minus corrupted"},
    2: {"hint": "int(res_layers['attn']['par'].argmax())"},
    3: {"rtol": 1e-3, "atol": 1e-5, "hint": "pick the head with the largest |full - corrupted|, then par + perp - full"},
    4: {"rtol": 1e-3, "atol": 1e-4, "hint": "inside the hook: z[:, :, head] = clean_split_cache[hook.name][:, :, head]"},
}


# Exercise 1: the clean-minus-corrupted logit difference of pair 0, from the logits themselves.
def solve_1(ns):
    a, b = ns["answer_ids"][0], ns["wrong_ids"][0]
    clean, corrupted = ns["clean_logits"][0, -1], ns["corrupted_logits"][0, -1]
    return float((clean[a] - clean[b]) - (corrupted[a] - corrupted[b]))


def expected_1(ns):
    row = ns["baseline"].iloc[0]
    return float(row.clean_logit_diff - row.corrupted_logit_diff)


# Exercise 2: the layer whose parallel-only attention patch recovers most.
def solve_2(ns):
    return int(ns["res_layers"]["attn"]["par"].argmax())


def expected_2(ns):
    t = ns["table_layers"]
    attn = t[t.component == "attn"]
    return int(attn.loc[attn.effect_par.idxmax(), "layer"])


# Exercise 3: the interaction term of the head with the largest |full effect|.
def solve_3(ns):
    res = ns["res_heads"]["value"]
    corrupted = float(ns["table_heads"].corrupted_metric.iloc[0])  # 0 by construction of recovery
    full = res["full"] - corrupted
    flat = torch.nan_to_num(full.abs(), nan=-1.0).argmax()
    layer, head = divmod(int(flat), full.shape[1])
    return float((res["par"][layer, head] - corrupted) + (res["perp"][layer, head] - corrupted) - full[layer, head])


def expected_3(ns):
    return float(ns["head_split"].iloc[0].par_plus_perp_minus_full)


# Exercise 4: TransformerLens-style perpendicular-only patch of one head, by hand.
def solve_4(ns):
    tld, model, h0 = ns["tld"], ns["model"], ns["h0"]
    layer, head = int(h0.layer), int(h0["head"])
    name = f"blocks.{layer}.attn.hook_z.hook_perp"
    clean = ns["clean_split_cache"][name]

    def patch(z, hook):  # noqa: ARG001
        z[:, :, head] = clean[:, :, head]
        return z

    with tld.split_hook_points(model, components=("value",), layers=[layer]):
        logits = model.run_with_hooks(ns["corrupted_tokens"], fwd_hooks=[(name, patch)])
    return float(ns["recovery"](logits))


def expected_4(ns):
    h0, t = ns["h0"], ns["head_tl"]
    row = t[(t.layer == int(h0.layer)) & (t["head"] == int(h0["head"]))]
    return float(row.tl_hook_perp.iloc[0])
