"""Streaming summaries: exact sums, approximate quantiles, energy ratio."""

import numpy as np
import pytest
import torch

from tl_directional.core.stats import StreamingSummary


@pytest.mark.parametrize(
    "kind,sampler",
    [
        ("unit", lambda g, n: torch.rand(n, generator=g, dtype=torch.float64)),
        ("positive", lambda g, n: torch.exp(torch.randn(n, generator=g, dtype=torch.float64) * 2)),
        ("signed", lambda g, n: torch.randn(n, generator=g, dtype=torch.float64) * 3),
    ],
)
def test_exact_sums_and_quantiles_within_bin_resolution(kind, sampler):
    g = torch.Generator().manual_seed(0)
    x = sampler(g, 20000)
    groups = torch.randint(0, 3, (x.numel(),), generator=g)
    s = StreamingSummary(3, {"m": kind})
    for chunk in range(0, x.numel(), 4096):  # streamed in chunks
        s.update(groups[chunk:chunk + 4096], {"m": x[chunk:chunk + 4096]})
    table = s.table()
    for gi in range(3):
        xs = x[groups == gi].numpy()
        assert table["count"][gi] == len(xs)
        assert table["m_mean"][gi].item() == pytest.approx(xs.mean(), rel=1e-12, abs=1e-12)
        assert table["m_std"][gi].item() == pytest.approx(xs.std(ddof=1), rel=1e-9)
        for q, col in [(0.05, "m_q05"), (0.5, "m_median"), (0.95, "m_q95")]:
            exact = np.quantile(xs, q)
            got = table[col][gi].item()
            tol = {"unit": 2e-3, "positive": 0.02 * exact, "signed": 0.02 * abs(exact) + 1e-3}[kind]
            assert abs(got - exact) <= tol, (kind, q, got, exact)


def test_degenerate_tokens_counted_but_excluded():
    s = StreamingSummary(1, {"m": "unit"})
    x = torch.tensor([0.1, 0.9, 0.5])
    s.update(torch.zeros(3, dtype=torch.long), {"m": x}, degenerate=torch.tensor([False, True, False]),
             par_sq=torch.tensor([1.0, 100.0, 3.0]), perp_sq=torch.tensor([4.0, 100.0, 12.0]))
    t = s.table()
    assert t["count"][0] == 2 and t["degenerate"][0] == 1
    assert t["m_mean"][0].item() == pytest.approx(0.3)
    assert t["energy_ratio"][0].item() == pytest.approx((4.0 / 16.0) ** 0.5)


def test_infinite_values_go_to_overflow_and_are_left_out_of_means():
    s = StreamingSummary(1, {"r": "positive"})
    s.update(torch.zeros(4, dtype=torch.long), {"r": torch.tensor([1.0, 2.0, float("inf"), float("inf")])})
    t = s.table()
    assert t["r_mean"][0].item() == pytest.approx(1.5)
    assert t["r_q95"][0].item() == float("inf")


def test_merge_equals_one_pass():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1000, generator=g)
    grp = torch.randint(0, 2, (1000,), generator=g)
    a, b, both = (StreamingSummary(2, {"m": "signed"}) for _ in range(3))
    a.update(grp[:400], {"m": x[:400]})
    b.update(grp[400:], {"m": x[400:]})
    both.update(grp, {"m": x})
    merged = a.merge_(b).table()
    ref = both.table()
    for k in ref:
        assert torch.allclose(merged[k], ref[k], equal_nan=True), k


def test_empty_group_reports_nan_not_zero():
    s = StreamingSummary(2, {"m": "unit"})
    s.update(torch.zeros(2, dtype=torch.long), {"m": torch.tensor([0.2, 0.4])})
    t = s.table()
    assert t["count"][1] == 0 and torch.isnan(t["m_mean"][1]) and torch.isnan(t["m_median"][1])

