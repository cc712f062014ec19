"""The one rank-statistics implementation (tl_directional.core.rank) and Holm's step-down
(tl_directional.core.paired.holm): ties decided once, checked against scipy where it is
installed and against the rank formula by hand everywhere."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tl_directional.core.paired import holm
from tl_directional.core.rank import RankError, average_ranks, spearman


def _ranks_by_hand(x):
    # rank r of a value = 1 + (# smaller) + (# equal - 1) / 2: the average of the ranks it spans
    return [1 + sum(v < xi for v in x) + (sum(v == xi for v in x) - 1) / 2 for xi in x]


def _spearman_by_hand(x, y):
    rx, ry = _ranks_by_hand(x), _ranks_by_hand(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den


def _cases(n_cases=60):
    rng = np.random.default_rng(0)
    for _ in range(n_cases):
        n = int(rng.integers(3, 25))
        yield rng.integers(0, 4, n).astype(float), rng.normal(size=n).round(1)


def test_average_ranks_share_ties():
    assert average_ranks([3.0, 1.0, 2.0, 2.0]).tolist() == [4.0, 1.0, 2.5, 2.5]
    rows = average_ranks([[3.0, 1.0, 2.0, 2.0], [0.5, 0.1, 0.2, 0.3]])
    assert rows.tolist() == [[4.0, 1.0, 2.5, 2.5], [4.0, 1.0, 2.0, 3.0]]
    for x, _ in _cases():
        assert average_ranks(x).tolist() == _ranks_by_hand(list(x))


def test_spearman_matches_the_rank_formula_and_broadcasts():
    for x, y in _cases():
        if len(set(x)) > 1:
            assert abs(spearman(x, y) - _spearman_by_hand(list(x), list(y))) < 1e-12
    x, y = np.array([[1.0, 2, 3, 4], [4, 3, 2, 1], [1, 1, 2, 2]]), np.array([1.0, 2, 3, 4])
    rho = spearman(x, y)
    assert rho.shape == (3,) and rho[0] == pytest.approx(1) and rho[1] == pytest.approx(-1)
    assert rho[2] == pytest.approx(_spearman_by_hand([1, 1, 2, 2], [1, 2, 3, 4]))


def test_spearman_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x, y in _cases():
        if len(set(x)) > 1 and len(set(y)) > 1:
            assert abs(spearman(x, y) - stats.spearmanr(x, y).statistic) < 1e-12


def test_constant_side_and_bad_shapes():
    assert math.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], if_constant=0.0) == 0.0
    with pytest.raises(RankError, match="x has 2 values"):
        spearman([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(RankError, match="at least one value"):
        average_ranks([])


def test_holm_tie_rule_and_step_down():
    # step-down: sorted p 0.01 <= 0.05/3, 0.02 <= 0.05/2, 0.04 <= 0.05/1 -> all rejected
    assert holm({"a": 0.04, "b": 0.01, "c": 0.02}) == {"a", "b", "c"}
    # the first failure stops: 0.03 > 0.05/2, so 0.04 is kept though 0.04 <= 0.05
    assert holm({"a": 0.01, "b": 0.03, "c": 0.04}) == {"a"}
    # tied p-values get one decision whichever order they are tested in (the set never
    # depends on the tie order; keys break ties only to make the order deterministic)
    assert holm({"x": 0.015, "y": 0.015, "z": 0.5}) == {"x", "y"}
    assert holm({"y": 0.03, "x": 0.03}) == set() and holm({"x": 0.025, "y": 0.025}) == {"x", "y"}
