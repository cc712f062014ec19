"""Issue 23 item 5: quantiles are numpy's (linear) while the sample is small, and the histogram's,
within its stated resolution, beyond :data:`~tl_directional.core.stats.EXACT_QUANTILE_LIMIT` (the same
on a profile of a tiny model: tests/integration/test_quantiles_profile.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tl_directional.core.quantiles import BIN_SCALES, QUANTILES
from tl_directional.core.stats import EXACT_QUANTILE_LIMIT, StreamingSummary

NAMES = {0.05: "q05", 0.25: "q25", 0.5: "median", 0.75: "q75", 0.95: "q95"}
SAMPLERS = {
    "unit": lambda g, n: torch.rand(n, generator=g, dtype=torch.float64) ** 2,
    "positive": lambda g, n: torch.exp(torch.randn(n, generator=g, dtype=torch.float64) * 2),
    "signed": lambda g, n: torch.randn(n, generator=g, dtype=torch.float64) * 3,
}


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_small_sample_quantiles_equal_np_quantile(kind):
    g = torch.Generator().manual_seed(3)
    x = SAMPLERS[kind](g, 3000)
    groups = torch.randint(0, 4, (x.numel(),), generator=g)
    groups[groups == 3] = 2  # group 3 stays empty
    s = StreamingSummary(4, {"m": kind})
    for start in range(0, x.numel(), 700):  # streamed in chunks
        s.update(groups[start:start + 700], {"m": x[start:start + 700]})
    table = s.table()
    assert s.quantiles_exact
    for gi in range(3):
        xs = x[groups == gi].numpy()
        for q, name in NAMES.items():
            assert table[f"m_{name}"][gi].item() == pytest.approx(np.quantile(xs, q), rel=1e-12, abs=1e-6)
        assert s.quantile("m", 0.3)[gi].item() == pytest.approx(np.quantile(xs, 0.3), rel=1e-12, abs=1e-6)
    assert torch.isnan(table["m_median"][3])


def test_the_limit_exact_at_it_histogram_above_within_the_stated_resolution():
    g = torch.Generator().manual_seed(4)
    n = EXACT_QUANTILE_LIMIT
    x = SAMPLERS["unit"](g, n + 1)
    at, above = StreamingSummary(1, {"m": "unit"}), StreamingSummary(1, {"m": "unit"})
    at.update(torch.zeros(n, dtype=torch.long), {"m": x[:n]})
    above.update(torch.zeros(n + 1, dtype=torch.long), {"m": x})
    assert at.quantiles_exact and not above.quantiles_exact
    width = 1.0 / BIN_SCALES["unit"].n_bins  # the unit grid's stated resolution, 0.001
    ta, tb = at.table(), above.table()
    for q, name in NAMES.items():
        assert ta[f"m_{name}"][0].item() == pytest.approx(np.quantile(x[:n].numpy(), q), abs=1e-12)
        assert abs(tb[f"m_{name}"][0].item() - np.quantile(x.numpy(), q)) <= width, name


@pytest.mark.parametrize("kind", sorted(SAMPLERS))
def test_large_sample_histogram_quantiles_within_the_stated_resolution(kind):
    g = torch.Generator().manual_seed(5)
    x = SAMPLERS[kind](g, 4 * EXACT_QUANTILE_LIMIT)
    s = StreamingSummary(1, {"m": kind})
    s.update(torch.zeros(x.numel(), dtype=torch.long), {"m": x})
    assert not s.quantiles_exact
    table = s.table()
    for q in QUANTILES:
        exact = float(np.quantile(x.numpy(), q))
        got = table[f"m_{NAMES[q]}"][0].item()
        # docs/method.md: unit 0.001 absolute; positive a bin spans a factor 1.012; signed
        # 0.84% relative above |x| ~ 1e-2 (8.4e-6 absolute near 0)
        tol = {"unit": 1e-3, "positive": 0.012 * exact, "signed": 0.0085 * abs(exact) + 1e-5}[kind]
        assert abs(got - exact) <= tol, (kind, q, got, exact)


def test_infinities_and_left_out_tokens_in_a_small_sample():
    s = StreamingSummary(1, {"r": "positive"})
    x = torch.tensor([1.0, 2.0, float("inf"), float("inf"), float("nan"), 5.0])
    keep = torch.tensor([True, True, True, True, True, False])
    s.update(torch.zeros(6, dtype=torch.long), {"r": x}, keep=keep)
    t = s.table()
    assert t["r_q05"][0].item() == pytest.approx(np.quantile([1.0, 2.0, np.inf, np.inf], 0.05))
    assert t["r_q95"][0].item() == float("inf") and t["r_median"][0].item() == float("inf")


def test_merge_keeps_exact_quantiles_and_exact_limit_zero_gives_the_histogram():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(900, generator=g, dtype=torch.float64)
    a, b = StreamingSummary(1, {"m": "signed"}), StreamingSummary(1, {"m": "signed"})
    zeros = torch.zeros(450, dtype=torch.long)
    a.update(zeros, {"m": x[:450]})
    b.update(zeros, {"m": x[450:]})
    merged = a.merge_(b).table()
    assert merged["m_median"][0].item() == pytest.approx(np.median(x.numpy()), rel=1e-12)
    hist_only = StreamingSummary(1, {"m": "signed"}, exact_limit=0)
    hist_only.update(torch.zeros(900, dtype=torch.long), {"m": x})
    assert not hist_only.quantiles_exact
    with pytest.raises(ValueError, match="exact_limit must be an int >= 0"):
        StreamingSummary(1, {"m": "signed"}, exact_limit=-1)
