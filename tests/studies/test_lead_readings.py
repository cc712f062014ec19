"""The lead table's hard-diagonal readings, both ways (issue 50): computed from the statistics the
builder is given, checked on constructed data against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studies import lead_readings as LR
from studies import paper_vs_ours as pvo
from studies.accuracy import page as A
from tl_directional.core.paired import paired_drop

N_ITEMS, B = 4000, 2000
JOINT, PER_HEAD, VPARA, RESID = (s for s, _ in LR.AGAINST)


def _nats(points: dict, seed: int) -> dict:
    """``{setting: {"pooled": [B+1]}}`` as ``setting_stats`` gives: the point, then resamples."""
    noise = np.random.default_rng(seed).normal(0.0, 0.01, B)  # shared by the settings: paired
    return {k: {"pooled": np.concatenate([[v], v + noise * (1 + 0.1 * i)])}
            for i, (k, v) in enumerate(points.items())}


def _items(drops_points: dict, seed: int) -> dict[str, torch.Tensor]:
    """0/1 edited items (the baseline is all correct) with the given drops in points."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, pts in drops_points.items():
        e = torch.ones(N_ITEMS, dtype=torch.long)
        e[torch.randperm(N_ITEMS, generator=g)[: int(pts / 100 * N_ITEMS)]] = 0
        out[k] = e
    return out


def _acc(items: dict) -> dict:
    base = torch.ones(N_ITEMS, dtype=torch.long)
    return {k: (paired_drop(base, e, B, 0), "-") for k, e in items.items()}


def _fixture():
    # model a: hard diagonal costs more than joint exclude-self, less than the rest (both units);
    # model b: less than every other removal
    nats = {"a": _nats({LR.HARD: 0.30, JOINT: 0.20, PER_HEAD: 0.70, VPARA: 0.80, RESID: 1.0}, 1),
            "b": _nats({LR.HARD: 0.20, JOINT: 0.40, PER_HEAD: 0.50, VPARA: 2.0, RESID: 9.0}, 2)}
    items = {"a": _items({LR.HARD: 6.0, JOINT: 1.0, PER_HEAD: 12.0, VPARA: 15.0, RESID: 14.0}, 3),
             "b": _items({LR.HARD: 1.0, JOINT: 8.0, PER_HEAD: 9.0, VPARA: 20.0, RESID: 30.0}, 4)}
    return nats, items, {m: _acc(v) for m, v in items.items()}


def test_differences_equal_an_independent_computation():
    nats, items, acc = _fixture()
    x = nats["a"][LR.HARD]["pooled"] - nats["a"][JOINT]["pooled"]
    point, lo, hi = LR.nat_difference(nats["a"], LR.HARD, JOINT)
    assert point == pytest.approx(0.10, abs=1e-9)
    assert (lo, hi) == pytest.approx((np.quantile(x[1:], 0.025), np.quantile(x[1:], 0.975)), abs=1e-8)
    # accuracy: both settings' drops resample the same items (seed 0); redrawn here by hand
    idx = torch.randint(0, N_ITEMS, (B, N_ITEMS), generator=torch.Generator().manual_seed(0))
    hard, joint = (100.0 * (1 - items["a"][k].double()) for k in (LR.HARD, JOINT))
    by_hand = (hard[idx].mean(1) - joint[idx].mean(1)).numpy()
    point, lo, hi = LR.acc_difference(acc["a"], LR.HARD, JOINT)
    assert point == pytest.approx(float(hard.mean() - joint.mean()), abs=1e-9)
    assert point == pytest.approx(5.0, abs=0.03)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(by_hand, [0.025, 0.975])), abs=1e-6)
    assert lo > 0  # 6 against 1 point dropped on 4,000 items: separated
    # the lead table's older helper reads the same interval
    assert pvo._order_interval(acc, "a", LR.HARD, JOINT) == (point, lo, hi)


def test_the_readings_go_both_ways_and_name_each_model():
    nats, _, acc = _fixture()
    comps = LR.comparisons(nats, acc, ("a", "b"))
    (name, nat, ac), *_ = comps["a"]
    assert name.startswith("joint exclude-self") and LR.side(*nat[1:]) == "more" == LR.side(*ac[1:])
    assert all(LR.side(*r[1][1:]) == "less" == LR.side(*r[2][1:]) for r in comps["b"])
    text = LR.reading(comps)
    assert ("against joint exclude-self (the paper's form) the reading depends on the model "
            "(a: more in nats, more in accuracy; b: less in nats, less in accuracy)") in text
    for _, name in LR.AGAINST[1:]:
        assert f"against {name} it costs *less* on every model in every unit measured, the reverse" in text
    cell = LR.ours_cell(comps["a"])
    assert cell.startswith("hard diagonal minus joint exclude-self (the paper's form): nats +0.100 [")
    # a model with accuracy only, and a unit not measured, still read; nothing measured says so
    only_acc = LR.comparisons({}, {"a": acc["a"]}, ("a", "b"))
    assert set(only_acc) == {"a"} and all(r[1] is None for r in only_acc["a"])
    assert "nats" not in LR.ours_cell(only_acc["a"])
    assert LR.reading({}).startswith("Not yet measured")


def test_the_hard_diagonal_row_carries_both_units_and_its_versions():
    nats, _, acc = _fixture()
    models = dict.fromkeys(pvo.MODELS)
    am = dict(zip(models, (nats["a"], nats["b"]), strict=True))
    runs = {m: A.LeadRun(f"accuracy_{m}", A.POOLED, a, {k: d for k, (d, _) in a.items()})
            for m, a in zip(models, (acc["a"], acc["b"]), strict=True)}
    rows = pvo._removal_rows({m: {} for m in models}, am, runs)
    hard = next(r for r in rows if r.startswith("| hard diagonal removal"))
    assert "`sections/experiments.tex`@`28ae91f`" in hard and "@`8e5278e` / `739519c` / `b6d7a16`" in hard
    assert hard.count("hard diagonal minus residual attention: nats ") == 2
    assert "(addresses `28ae91f`'s \"severely degrades\")" in hard
    assert "the reading depends on the model" in hard
    assert hard.count("accuracy (pooled suite) ") == 8 and "pooled suite: **" in hard  # the suite read, named
