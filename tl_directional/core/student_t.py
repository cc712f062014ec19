"""Student's t distribution without scipy: the upper tail and exact quantiles at any degrees of freedom.

The tail is the regularized incomplete beta function, ``P(T > t) = I_x(df/2, 1/2) / 2`` with
``x = df / (df + t^2)`` for ``t >= 0``, evaluated by its continued fraction (modified Lentz) with
``ln x``, ``ln(1 - x)`` and ``ln B(a, b)`` each computed without cancellation; the quantile
inverts that tail by bisection on doubles. The fraction needs ever more terms as ``df`` grows
and its rounding grows with them (the tail is good to 1e-13 relative up to ``df`` = 1e4, 1e-10
at 1e6), so above :data:`EXPANSION_DF` degrees of freedom the quantile is the Cornish-Fisher
expansion in ``1/df`` around the normal quantile instead (Abramowitz & Stegun 26.7.5, error
``O(df^-5)``). Checked against 40-digit mpmath from ``df`` = 0.3 to 1e15: every quantile within
3e-14 relative (tests/unit/test_student_t.py). Pure :mod:`math`; scipy is not a dependency.
"""

from __future__ import annotations

import math
from statistics import NormalDist

#: Degrees of freedom above which :func:`t_quantile` uses the 1/df expansion.
EXPANSION_DF = 3000
_TINY = 1e-300
_MAX_TERMS = 100_000


def _check_df(df) -> float:
    if isinstance(df, bool) or not isinstance(df, (int, float)) or math.isnan(df) or df <= 0:
        raise ValueError(f"df must be a positive number of degrees of freedom (math.inf for the normal "
                         f"limit), got {df!r}")
    return float(df)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (modified Lentz), for ``x < (a + 1) / (a + b + 2)``."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                    -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            step = c * d
            h *= step
        if abs(step - 1.0) <= 4e-16:  # a couple of ulps: the fraction has converged
            return h
    raise ArithmeticError(f"the incomplete beta fraction did not converge (a={a}, b={b}, x={x})")  # pragma: no cover


def _stirling_tail(x: float) -> float:
    # lgamma(x) - [(x - 1/2) ln x - x + ln(2 pi) / 2], the Stirling series (error < 2e-16 for x >= 20)
    r = 1.0 / (x * x)
    return (1.0 / 12.0 - r * (1.0 / 360.0 - r * (1.0 / 1260.0 - r * (1.0 / 1680.0 - r / 1188.0)))) / x


def _log_beta(a: float, b: float) -> float:
    """``ln B(a, b)``. When the larger argument is 20 or more, ``lgamma(a + b) - lgamma(a)`` is
    taken from the Stirling series as one difference: subtracting two large ``lgamma`` values
    would lose their common magnitude's digits (1e-11 relative at ``a`` = 1e5)."""
    big, small = (a, b) if a >= b else (b, a)
    if big < 20.0:
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    ratio = ((big - 0.5) * math.log1p(small / big) + small * math.log(big + small) - small
             + _stirling_tail(big + small) - _stirling_tail(big))  # lgamma(big + small) - lgamma(big)
    return math.lgamma(small) - ratio


def betainc(a: float, b: float, x: float, y: float | None = None) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``
    (``y``: ``1 - x`` if known more precisely than ``1 - x`` computes it)."""
    y = 1.0 - x if y is None else y
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    # ln x and ln y from whichever of x, y is small (log1p keeps the digits of the other)
    log_x = math.log(x) if x < 0.5 else math.log1p(-y)
    log_y = math.log(y) if y < 0.5 else math.log1p(-x)
    log_front = a * log_x + b * log_y - _log_beta(a, b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom (any positive real; ``math.inf``:
    the standard normal); relative precision as in the module docstring."""
    df = _check_df(df)
    if math.isinf(df):
        return NormalDist().cdf(-t)
    if t < 0:
        return 1.0 - t_sf(-t, df)
    t2 = t * t
    # x = df / (df + t^2) and 1 - x = t^2 / (df + t^2), each computed directly
    return 0.5 * betainc(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def _expansion(p: float, df: float) -> float:
    # Cornish-Fisher expansion of the t quantile in 1/df around the normal quantile (A&S 26.7.5)
    x = NormalDist().inv_cdf(p)
    x2 = x * x
    g1 = (x2 + 1.0) * x / 4.0
    g2 = ((5.0 * x2 + 16.0) * x2 + 3.0) * x / 96.0
    g3 = (((3.0 * x2 + 19.0) * x2 + 17.0) * x2 - 15.0) * x / 384.0
    g4 = ((((79.0 * x2 + 776.0) * x2 + 1482.0) * x2 - 1920.0) * x2 - 945.0) * x / 92160.0
    return x + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom: the ``t`` with
    ``P(T <= t) = p``, for ``0 < p < 1`` and any positive real ``df`` (``math.inf``: the
    standard normal), to about 3e-14 relative (see the module docstring)."""
    df = _check_df(df)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
        raise ValueError(f"p must be a probability strictly between 0 and 1, got {p!r}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if df > EXPANSION_DF:
        return _expansion(p, df)
    q = 1.0 - p  # upper tail to match; t_sf decreases in t
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > q:
        lo, hi = hi, 2.0 * hi
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            return hi if abs(t_sf(hi, df) - q) <= abs(t_sf(lo, df) - q) else lo
        if t_sf(mid, df) > q:
            lo = mid
        else:
            hi = mid


def t975(df) -> float:
    """The two-sided 95 % Student-t quantile ``t_{0.975, df}`` (NaN for ``df < 1``, the
    convention of the paired comparisons, where ``df = n - 1`` and one value gives no interval)."""
    if not isinstance(df, (int, float)) or isinstance(df, bool) or not df >= 1:
        return float("nan")
    return t_quantile(0.975, df)


__all__ = ["EXPANSION_DF", "betainc", "t975", "t_quantile", "t_sf"]
