"""Exact Student-t quantiles at every degree of freedom (tl_directional.core.student_t), without scipy:
published values, closed forms, symmetry and, where scipy happens to be installed, scipy itself."""

from __future__ import annotations

import math

import pytest

from tl_directional.core.student_t import EXPANSION_DF, betainc, t975, t_quantile, t_sf

# t_{0.975, df} to 7 significant digits (standard tables; 1.96 is the normal limit)
PUBLISHED_975 = {1: 12.706205, 2: 4.302653, 4: 2.776445, 10: 2.228139, 30: 2.042272, 31: 2.039513,
                 40: 2.021075, 60: 2.000298, 100: 1.983972, 120: 1.979930, 1000: 1.962339}


@pytest.mark.parametrize("df,value", sorted(PUBLISHED_975.items()))
def test_published_two_sided_95_quantiles(df, value):
    assert t975(df) == pytest.approx(value, abs=5e-7)


def test_no_normal_fallback_past_30_df():
    # the old table returned 1.96 for every df > 30; the exact quantile decreases towards z_0.975
    z = 1.959963984540054
    values = [t975(df) for df in (31, 40, 100, 1000, 10_000, 10**6)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert all(v > z for v in values) and values[-1] == pytest.approx(z, abs=1e-5)
    assert t975(math.inf) == pytest.approx(z, rel=1e-15)


@pytest.mark.parametrize("p", [0.55, 0.8, 0.975, 0.999, 1 - 1e-9])
def test_closed_forms_at_one_and_two_df(p):
    assert t_quantile(p, 1) == pytest.approx(1 / math.tan(math.pi * (1 - p)), rel=1e-12)  # cot(pi q)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)


@pytest.mark.parametrize("df", [0.5, 3, 7.5, 29, 31, 250, EXPANSION_DF])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_quantile_inverts_the_tail_and_is_antisymmetric(df, p):
    t = t_quantile(p, df)
    assert t_sf(t, df) == pytest.approx(1 - p, rel=1e-12)
    assert t_quantile(1 - p, df) == -t
    assert t_sf(-t, df) == pytest.approx(p, rel=1e-12)


def test_quantiles_against_40_digit_mpmath():
    # mpmath comes with torch (through sympy); the error in t is (tail(t) - q) / (pdf(t) t), in 40 digits
    mp = pytest.importorskip("mpmath", reason="mpmath is not installed")
    mp.mp.dps = 40
    worst = 0.0
    for df in (0.3, 1, 2, 3, 5, 30, 31, 100, 1000, EXPANSION_DF - 1, EXPANSION_DF + 1, 1e4, 1e6, 1e9, 1e15):
        for p in (0.55, 0.9, 0.975, 0.999, 1 - 1e-9):
            t, v, q = mp.mpf(t_quantile(p, df)), mp.mpf(df), 1 - mp.mpf(p)
            tail = mp.betainc(v / 2, mp.mpf(1) / 2, 0, v / (v + t**2), regularized=True) / 2
            pdf = mp.gamma((v + 1) / 2) / mp.gamma(v / 2) / mp.sqrt(v * mp.pi) * (1 + t**2 / v) ** (-(v + 1) / 2)
            worst = max(worst, abs(float((tail - q) / (pdf * t))))
    assert worst < 1e-13


def test_betainc_known_values():
    assert betainc(1.0, 1.0, 0.3) == pytest.approx(0.3, rel=1e-14)       # uniform
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, rel=1e-13)    # polynomial closed form
    assert betainc(0.5, 0.5, 0.5) == pytest.approx(0.5, rel=1e-14)       # arcsine, symmetric
    assert betainc(3.0, 2.0, 0.0) == 0.0 and betainc(3.0, 2.0, 1.0) == 1.0


def test_agrees_with_scipy_where_installed():
    # scipy's own t.ppf is good to about 1e-11 here (it is the less precise of the two at large df)
    stats = pytest.importorskip("scipy.stats", reason="scipy is not installed (not a dependency)")
    dfs = [*range(1, 61), 0.3, 1.5, 99, 500, 1000, EXPANSION_DF - 1, EXPANSION_DF, EXPANSION_DF + 1, 1e4, 1e6, 1e12]
    ps = [0.55, 0.6, 0.75, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999, 1 - 1e-7, 1 - 1e-10, 0.025]
    worst = max(abs(t_quantile(p, df) / float(stats.t.ppf(p, df)) - 1) for df in dfs for p in ps)
    assert worst < 1e-11


@pytest.mark.parametrize("bad", [0, -1, math.nan, -math.inf])
def test_bad_df_is_named(bad):
    with pytest.raises(ValueError, match=r"df must be a positive number"):
        t_quantile(0.975, bad)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_bad_p_is_named(bad):
    with pytest.raises(ValueError, match=r"p must be a probability strictly between 0 and 1"):
        t_quantile(bad, 5)


def test_t975_below_one_df_is_nan():
    assert math.isnan(t975(0)) and math.isnan(t975(-3))
