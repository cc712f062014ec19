"""The offline multiple-choice suite (protocol sec. 9.4): item builders (determinism, the
constraints on distractors), the paired bootstrap and the margin rules on synthetic data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tl_directional.core.paired import (
    FAILED,
    HELD,
    UNDECIDED,
    PairedStatsError,
    holm,
    one_sided_p,
    paired_drop,
    within_verdict,
    worse_verdict,
)
from tl_directional.evaluate.suites.accuracy import (
    AccuracySuiteError,
    ClozeItem,
    ContinuationItem,
    build_cloze_items,
    build_continuation_items,
    cloze_choice_logits,
    continuation_requests,
    frequency_bands,
)


def _windows(n=6, seq=40, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a skewed (Zipf-like) stream so the bands differ in frequency
    p = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    w = torch.multinomial(p, n * seq, replacement=True, generator=g).view(n, seq)
    w[:, 0] = vocab  # BOS
    return w


def test_bands_rank_by_frequency():
    stream = [1] * 10 + [2] * 5 + [3] * 5 + [4] * 1
    b = frequency_bands(stream, 2)
    assert b == {1: 0, 2: 0, 3: 1, 4: 1}
    with pytest.raises(AccuracySuiteError, match="n_bands=0"):
        frequency_bands(stream, 0)


def test_cloze_items_are_deterministic_and_well_formed():
    w = _windows()
    bands = frequency_bands(w[:, 1:].flatten().tolist(), 4)
    a = build_cloze_items(w, bands, text="t", per_window=10, seed=0)
    assert a == build_cloze_items(w, bands, text="t", per_window=10, seed=0)
    assert a != build_cloze_items(w, bands, text="t", per_window=10, seed=1)
    assert len(a) == 60
    for it in a:
        truth = int(w[it.window, it.position + 1])
        assert it.choices[it.answer] == truth
        assert len(set(it.choices)) == 4  # distinct, so the truth is never a distractor
        assert {bands[c] for c in it.choices} == {bands[truth]}  # one frequency band
        assert 1 <= it.position <= w.shape[1] - 2
        assert ClozeItem.from_json(json.loads(json.dumps(it.to_json()))) == it
    assert len({(it.window, it.position) for it in a}) == 60
    # the answer's slot is spread over the four (shuffled), not always first
    assert len({it.answer for it in a}) == 4
    with pytest.raises(AccuracySuiteError, match="per_window=100"):
        build_cloze_items(w, bands, text="t", per_window=100)


def test_continuation_items_are_deterministic_and_well_formed():
    w = _windows()
    a = build_continuation_items(
        w, text="t", per_window=3, context_len=8, continuation_len=5, seed=0
    )
    assert a == build_continuation_items(
        w, text="t", per_window=3, context_len=8, continuation_len=5, seed=0
    )
    assert len(a) == 18
    rows = w.tolist()
    for it in a:
        c = len(it.context)
        assert tuple(rows[it.window][:c]) == it.context and c >= 8
        assert it.choices[it.answer] == tuple(rows[it.window][c : c + 5])
        assert len(set(it.choices)) == 4 and {len(ch) for ch in it.choices} == {5}
        assert ContinuationItem.from_json(json.loads(json.dumps(it.to_json()))) == it
    assert len(continuation_requests(a)) == 4 * len(a)
    one = build_continuation_items(w[:1], text="t", per_window=4, context_len=8, continuation_len=5)
    assert all(
        len(set(it.choices)) == 4 for it in one
    )  # one window is enough: spans elsewhere in it
    with pytest.raises(AccuracySuiteError, match="continuation_len=50"):
        build_continuation_items(w, text="t", per_window=1, context_len=8, continuation_len=50)


def test_cloze_choice_logits_reads_the_position():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    items = [ClozeItem("t", 3, 2, (1, 4, 0, 6), 1), ClozeItem("t", 2, 0, (5, 2, 3, 1), 0)]
    got = cloze_choice_logits(logits, items, window_offset=2)
    want = torch.stack([logits[1, 2, [1, 4, 0, 6]], logits[0, 0, [5, 2, 3, 1]]])
    assert torch.equal(got, want)
    with pytest.raises(AccuracySuiteError, match="outside"):
        cloze_choice_logits(logits, items, window_offset=0)


def test_paired_bootstrap_matches_a_plain_resampling():
    g = torch.Generator().manual_seed(1)
    base = (torch.rand(500, generator=g) < 0.6).long()
    edit = torch.where(torch.rand(500, generator=g) < 0.1, 1 - base, base)
    d = paired_drop(base, edit, n_resamples=2000, seed=0)
    assert d.point == pytest.approx(100 * (base.double().mean() - edit.double().mean()).item())
    # independent: the same draws, the differences averaged per resample by a loop
    idx = torch.randint(0, 500, (2000, 500), generator=torch.Generator().manual_seed(0))
    diff = (base - edit).double() * 100
    rs = [diff[i].mean().item() for i in idx]
    lo, hi = np.percentile(rs, [2.5, 97.5])
    assert (d.lo, d.hi) == pytest.approx((lo, hi))
    assert d.lo <= d.point <= d.hi
    assert paired_drop(base, edit).resamples.equal(d.resamples)  # seeded
    with pytest.raises(PairedStatsError, match="same"):
        paired_drop(base, edit[:10])


def _drop(shift_points: float, n=4000, noise=0.02):
    """Synthetic items: baseline right on 60%, the edit flips a random ``noise`` share of them and
    loses ``shift_points`` more."""
    g = torch.Generator().manual_seed(7)
    base = (torch.rand(n, generator=g) < 0.6).long()
    flip = torch.rand(n, generator=g) < noise
    edit = torch.where(flip, 1 - base, base)
    right = (edit == 1).nonzero().flatten()
    k = int(round(shift_points / 100 * n))
    edit[right[torch.randperm(len(right), generator=g)[:k]]] = 0
    return paired_drop(base, edit)


def test_rules_held_failed_and_not_decided_both_sides():
    small, big = _drop(0.0), _drop(10.0)
    assert within_verdict(small, 1.5) == HELD and worse_verdict(small, 3.0) == FAILED
    assert within_verdict(big, 1.5) == FAILED and worse_verdict(big, 3.0) == HELD
    edge = _drop(1.0)  # its interval straddles 1.5
    assert edge.lo < 1.5 < edge.hi and within_verdict(edge, 1.5) == UNDECIDED
    edge3 = _drop(2.5)
    assert edge3.lo < 3.0 < edge3.hi and worse_verdict(edge3, 3.0) == UNDECIDED
    assert one_sided_p(small, 1.5, held_below=True) < 0.01
    assert one_sided_p(big, 3.0, held_below=False) < 0.01
    assert one_sided_p(big, 1.5, held_below=True) > 0.5


def test_holm_step_down():
    assert holm({"a": 0.01, "b": 0.02, "c": 0.04}) == {"a", "b", "c"}
    assert holm({"a": 0.01, "b": 0.03, "c": 0.04}) == {"a"}  # 0.03 > 0.05 / 2 stops the steps
    assert holm({"a": 0.02, "b": 0.001}) == {"b", "a"}
