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



def test_kept_values_are_one_block_per_flush_nan_where_they_do_not_count():
    """While quantiles are exact a summary keeps each counted value (4 bytes in float32) and an
    int32 group per token, one block per flush (many small entries fragment the C heap), NaN
    where a value does not count; the quantiles equal numpy's over the counted values, and the
    histograms replayed from the blocks past the limit count exactly what was kept."""
    gen = torch.Generator().manual_seed(3)
    s = StreamingSummary(4, {"a": "signed", "b": "unit"}, exact_limit=40)
    ref = {"a": [[] for _ in range(4)], "b": [[] for _ in range(4)]}
    for flush in range(2):
        for _ in range(3):
            g = torch.randint(0, 4, (6,), generator=gen)
            a, b = torch.randn(6, generator=gen), torch.rand(6, generator=gen)
            a[0] = float("nan")
            keep, deg = torch.rand(6, generator=gen) > 0.2, torch.rand(6, generator=gen) > 0.8
            s.update(g, {"a": a, "b": b}, keep=keep, degenerate=deg)
            for i in range(6):
                if keep[i] and not deg[i]:
                    for m, v in (("a", a), ("b", b)):
                        if not torch.isnan(v[i]):
                            ref[m][int(g[i])].append(float(v[i]))
        s.flush()
        assert len(s._exact) == flush + 1
    for group, x in s._exact:
        assert group.dtype == torch.int32 and x.dtype == torch.float32 and x.shape == (2, 18)
    assert s.quantiles_exact
    for m in ("a", "b"):
        got = s.quantile(m, 0.25)
        want = [np.quantile(v, 0.25) if v else np.nan for v in ref[m]]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, equal_nan=True)
    hist = {m: s.hist[m].sum(-1) for m in ("a", "b")}  # replayed block by block from the kept values
    assert [int(hist[m].sum()) for m in ("a", "b")] == [sum(map(len, ref[m])) for m in ("a", "b")]


def test_exact_quantiles_of_a_long_sample_read_in_group_chunks_equal_numpy():
    """Past 2^19 kept values the quantile table reads the groups in chunks (its temporaries stay
    bounded on a long corpus); every group's quantiles are still numpy's, groups of unequal
    sizes and NaN values included."""
    from tl_directional.core.stats import _group_chunks

    gen = torch.Generator().manual_seed(5)
    n = 700_000
    g = torch.randint(0, 37, (n,), generator=gen)
    g[g == 5] = 6  # an empty group
    a = torch.randn(n, generator=gen)
    a[::97] = float("nan")
    s = StreamingSummary(37, {"a": "signed"}, exact_limit=n)
    for lo in range(0, n, 100_000):
        s.update(g[lo:lo + 100_000], {"a": a[lo:lo + 100_000]})
    s.flush()
    sizes = torch.bincount(g, minlength=37).numpy()
    assert len(_group_chunks(sizes, 1 << 19)) > 1
    got = s._exact_quantile_table((0.05, 0.5, 0.95))["a"]
    for k, q in enumerate((0.05, 0.5, 0.95)):
        want = [np.quantile(a[g == i][~torch.isnan(a[g == i])].numpy(), q) if i != 5 else np.nan for i in range(37)]
        np.testing.assert_allclose(got[k].numpy(), want, rtol=1e-6, atol=1e-7, equal_nan=True)
