"""Protocol sec. 13.4's rules on constructed records: accuracies per length against a plain
groupby, each rule's point against a hand computation, verdicts on both sides, the slope of L4
and the tasks that get a verdict (sec. 13.2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from studies.ruler.stats import EXCL, HARD, VPARA, per_length_accuracy, rules, verdict_tasks

TASKS = ("needle-single", "needle-multi", "variable-tracking", "common-words")
LENGTHS = (256, 512, 1024, 2048)


def _records(drops: dict[str, dict[int, float]], base: float = 0.85, haystacks: int = 40, seed: int = 0):
    """Items right with probability ``base`` unedited; each edit turns a share ``drops[s][length]``
    of the right items wrong (the same items across lengths' haystacks drawn at random)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in LENGTHS:
        for h in range(haystacks):
            for t in TASKS:
                b = int(torch.rand(1, generator=g) < base)
                u = float(torch.rand(1, generator=g))
                rows.append({"length": n, "haystack": h, "task": t, "setting": "baseline", "correct": b})
                for s, by in drops.items():
                    rows.append({"length": n, "haystack": h, "task": t, "setting": s,
                                 "correct": int(b and u >= by[n])})
    return pd.DataFrame(rows)


def _flat(x):
    return dict.fromkeys(LENGTHS, x)


def test_accuracy_per_length_is_the_plain_mean():
    rec = _records({HARD: _flat(0.3)}, haystacks=8)
    lengths, point, res = per_length_accuracy(rec, TASKS, ["baseline", HARD], n_resamples=50)
    want = rec[rec.setting == HARD].groupby("length")["correct"].mean() * 100
    assert lengths == list(LENGTHS) and np.allclose(point[HARD].numpy(), want.to_numpy(), rtol=0, atol=1e-12)
    assert res[HARD].shape == (50, 4)
    # dropping a task leaves the others' means
    one = per_length_accuracy(rec, ["needle-single"], ["baseline"], n_resamples=5)[1]["baseline"]
    want = rec[(rec.setting == "baseline") & (rec.task == "needle-single")].groupby("length")["correct"].mean() * 100
    assert np.allclose(one.numpy(), want.to_numpy(), rtol=0, atol=1e-12)


def test_rules_points_and_verdicts_on_both_sides():
    grow = {256: 0.0, 512: 0.1, 1024: 0.2, 2048: 0.3}  # exclude-self 0.5 loses more with length
    rec = _records({EXCL[0]: _flat(0.3), EXCL[0.5]: grow, VPARA[0]: _flat(0.6), VPARA[0.5]: _flat(0.5),
                    HARD: _flat(0.9)})
    got = rules(rec, TASKS, n_resamples=400)
    acc = rec.groupby(["setting", "length"])["correct"].mean().unstack() * 100
    drop = acc.loc["baseline"] - acc
    ratio = drop.loc[EXCL[0.5]] / (acc.loc["baseline"] - 25)
    assert got["L1"].point == pytest.approx(ratio.mean(), abs=1e-9)
    assert got["L2"].point == pytest.approx((drop.loc[VPARA[0.5]] - drop.loc[EXCL[0.5]]).mean(), abs=1e-9)
    assert got["L3"].point == pytest.approx(min((drop.loc[HARD] - drop.loc[EXCL[0]]).mean(),
                                                (drop.loc[HARD] - drop.loc[VPARA[0]]).mean()), abs=1e-9)
    x = np.log2(LENGTHS)
    assert got["L4"].point == pytest.approx(np.polyfit(x, ratio.to_numpy(), 1)[0], abs=1e-9)
    assert {k: v.verdict for k, v in got.items()} == {"L1": "failed", "L2": "held", "L3": "held", "L4": "held"}
    # the other side: no damage at half retention, V-Para gentler, hard diagonal gentlest, no trend
    rec = _records({EXCL[0]: _flat(0.5), EXCL[0.5]: _flat(0.0), VPARA[0]: _flat(0.5), VPARA[0.5]: _flat(0.0),
                    HARD: _flat(0.0)})
    got = rules(rec, TASKS, n_resamples=400)
    assert got["L1"].verdict == "held" and got["L3"].verdict == "failed"
    assert got["L2"].point == 0 and got["L2"].verdict == "not decided"


def test_a_task_on_its_easiest_rung_gets_a_verdict_only_above_the_floor():
    rec = _records({}, base=0.9, haystacks=20)
    low = rec[(rec.task == "common-words")].index
    rec.loc[low, "correct"] = 0  # common words never right: its lower bound at 512 is 0
    rungs = {"needle-multi": {"reached_floor": True}, "variable-tracking": {"reached_floor": False},
             "common-words": {"reached_floor": False}}
    assert verdict_tasks(rec, rungs, 0.35, n_resamples=200) == ["needle-single", "needle-multi", "variable-tracking"]
