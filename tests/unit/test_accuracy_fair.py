"""The accuracy suite made fair (protocol sec. 9.7): the window-cluster bootstrap with a macro
average over cells, against a plain loop over the same draws, and the hard distractors (the
unedited model's ranks 2-4) on constructed rankings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tl_directional.core.paired import PairedStatsError, cluster_paired_drop
from tl_directional.evaluate.suites.accuracy import (
    AccuracySuiteError,
    ClozeItem,
    hard_cloze_items,
)


def _data(seed=3):
    g = torch.Generator().manual_seed(seed)
    n = 120
    clusters = torch.arange(n) // 10  # 12 windows of 10 items
    strata = (clusters >= 6).long()  # two texts of 6 windows
    cells = strata * 2 + (torch.arange(n) % 10 >= 8).long()  # text x kind: 8 + 2 items a window
    base = (torch.rand(n, generator=g) < 0.7).long()
    edit = torch.where(torch.rand(n, generator=g) < 0.2, 1 - base, base)
    return base, edit, clusters, strata, cells


def test_cluster_bootstrap_macro_matches_a_loop_over_the_same_draws():
    base, edit, clusters, strata, cells = _data()
    R = 300
    d = cluster_paired_drop(base, edit, clusters, strata, cells, n_resamples=R, seed=0)
    diff = 100.0 * (base - edit).double().numpy()
    cl, st, ce = clusters.numpy(), strata.numpy(), cells.numpy()
    # the point: the plain mean over the four cells of each cell's mean
    assert d.point == pytest.approx(np.mean([diff[ce == c].mean() for c in range(4)]), abs=1e-12)
    # the resamples: the same generator draws, per stratum in increasing order, windows with replacement
    g = torch.Generator().manual_seed(0)
    members = {s: sorted(set(cl[st == s].tolist())) for s in (0, 1)}
    draws = {s: torch.randint(0, len(members[s]), (R, len(members[s])), generator=g) for s in (0, 1)}
    rs = []
    for r in range(R):
        picked = [members[s][k] for s in (0, 1) for k in draws[s][r].tolist()]
        rows = np.concatenate([np.flatnonzero(cl == w) for w in picked])
        rs.append(np.mean([diff[rows][ce[rows] == c].mean() for c in range(4)]))
    assert d.resamples.numpy() == pytest.approx(np.array(rs), abs=1e-9)
    assert (d.lo, d.hi) == pytest.approx(tuple(np.percentile(rs, [2.5, 97.5])), abs=1e-9)


def test_cluster_bootstrap_pooled_and_its_identities():
    base, edit, clusters, strata, _ = _data()
    d = cluster_paired_drop(base, edit, clusters, strata, n_resamples=200, seed=0)
    assert d.point == pytest.approx(100.0 * (base - edit).double().mean().item(), abs=1e-12)
    # every item twice in its own window: the same windows drawn, the same item means
    twice = cluster_paired_drop(base.repeat(2), edit.repeat(2), clusters.repeat(2), strata.repeat(2),
                                n_resamples=200, seed=0)
    assert torch.allclose(twice.resamples, d.resamples, rtol=0, atol=1e-9)
    # windows whose items all agree (no change): a zero drop in every resample
    z = cluster_paired_drop(base, base, clusters, strata, n_resamples=50)
    assert z.point == 0.0 and bool((z.resamples == 0).all())


def test_cluster_bootstrap_refuses_bad_ids():
    base, edit, clusters, strata, cells = _data()
    with pytest.raises(PairedStatsError, match="clusters 119"):
        cluster_paired_drop(base, edit, clusters[:-1])
    bad = strata.clone()
    bad[0] = 1  # window 0 in both texts
    with pytest.raises(PairedStatsError, match="a cluster lies in two strata"):
        cluster_paired_drop(base, edit, clusters, bad)
    with pytest.raises(PairedStatsError, match="n_resamples=0"):
        cluster_paired_drop(base, edit, clusters, n_resamples=0)


def test_hard_distractors_are_the_top_wrong_tokens():
    items = [ClozeItem("kjv", 0, 5, (10, 11, 12, 13), 2), ClozeItem("kjv", 1, 7, (20, 21, 22, 23), 0)]
    # item 0: the truth (12) ranked first, distractors ranks 2-4; item 1: the truth (20) ranked third
    ranked = torch.tensor([[12, 40, 41, 42, 43], [50, 51, 20, 52, 53]])
    hard = hard_cloze_items(items, ranked, seed=0)
    assert [sorted(h.choices) for h in hard] == [[12, 40, 41, 42], [20, 50, 51, 52]]
    assert [h.choices[h.answer] for h in hard] == [12, 20]
    assert [(h.text, h.window, h.position, h.hard) for h in hard] == [("kjv", 0, 5, True), ("kjv", 1, 7, True)]
    assert hard_cloze_items(items, ranked, seed=0) == hard  # seeded
    # the JSON kind tells the twins apart and round-trips
    js = json.loads(json.dumps([h.to_json() for h in hard]))
    assert {j["kind"] for j in js} == {"cloze-hard"} and [ClozeItem.from_json(j) for j in js] == hard
    assert items[0].to_json()["kind"] == "cloze" and ClozeItem.from_json(items[0].to_json()) == items[0]
    with pytest.raises(AccuracySuiteError, match=r"ranked has shape \(2, 3\)"):
        hard_cloze_items(items, ranked[:, :3])
