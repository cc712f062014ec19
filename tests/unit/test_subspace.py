"""tl_directional.core.subspace: a reference that is a direction or a subspace (METHOD.md sec. 1
generalised from a line to a span), its float64 basis, the split and the ``k / d`` baseline."""

from __future__ import annotations

import math

import pytest
import torch

import tl_directional as tld
from tl_directional.core.subspace import (
    SubspaceError,
    orthonormal_basis,
    random_energy_share,
    split_against,
)

EPS64 = torch.finfo(torch.float64).eps


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _sum_bound(par, perp, u):
    """``perp = fl(u - par)`` and ``fl(par + perp)`` each round once: the sum is ``u`` to within
    two roundings of the largest of the three (bit for bit on most elements)."""
    return 2 * EPS64 * torch.maximum(torch.maximum(par.abs(), perp.abs()), u.abs())


@pytest.mark.parametrize("k", [1, 3, 8])
def test_parts_add_up_and_perp_is_orthogonal_to_every_basis_vector(k):
    u, rows = _randn(5, 7, 32, seed=1), _randn(k, 32, seed=2)
    par, perp = split_against(u, rows)
    assert par.dtype == perp.dtype == torch.float64
    assert ((par + perp - u).abs() <= _sum_bound(par, perp, u)).all()
    assert torch.equal(perp, u - par)
    q = orthonormal_basis(rows)
    assert torch.allclose(q @ q.T, torch.eye(k, dtype=torch.float64), atol=1e-14, rtol=0)
    scale = u.norm(dim=-1, keepdim=True)
    assert ((perp @ q.T).abs() <= 1e-13 * scale).all()
    assert ((perp @ rows.T).abs() <= 1e-12 * scale * rows.norm(dim=-1)).all()


def test_one_direction_is_method_sec1_and_tld_decompose_bit_for_bit():
    """k = 1: ``a = (u . r) / ||r||^2``, ``u_par = a r`` written out here, and the library's
    :func:`tld.decompose`, equal bit for bit in float64 (a [d] and a [1, d] reference alike)."""
    u, r = _randn(4, 6, 32, seed=3), _randn(32, seed=4)
    a = (u * r).sum(-1) / (r * r).sum(-1)
    by_hand = a.unsqueeze(-1) * r
    dec = tld.decompose(u, r)
    for reference in (r, r[None]):
        par, perp = split_against(u, reference)
        assert torch.equal(par, by_hand)
        assert torch.equal(par, dec.par) and torch.equal(perp, dec.perp)


def test_float32_and_half_inputs_are_computed_in_float32():
    r = _randn(3, 16, seed=5, dtype=torch.float32)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        par, perp = split_against(_randn(2, 16, seed=6).to(dtype), r)
        assert par.dtype == perp.dtype == torch.float32


def test_a_rotated_spanning_set_gives_the_same_split():
    """The split depends on the span only: rows mixed by an invertible ``[k, k]`` matrix, or
    rescaled, give the same parts (float64 round-off)."""
    u, rows = _randn(10, 24, seed=7), _randn(4, 24, seed=8)
    mix = _randn(4, 4, seed=9) + 4 * torch.eye(4, dtype=torch.float64)
    assert abs(float(torch.linalg.det(mix))) > 1.0
    par, perp = split_against(u, rows)
    for other in (mix @ rows, 1e3 * rows.flip(0), orthonormal_basis(rows)):
        p2, q2 = split_against(u, other)
        assert torch.allclose(p2, par, atol=1e-12, rtol=0)
        assert torch.allclose(q2, perp, atol=1e-12, rtol=0)


@pytest.mark.parametrize("k", [1, 5])
def test_projection_is_idempotent(k):
    u, rows = _randn(8, 16, seed=10), _randn(k, 16, seed=11)
    par, perp = split_against(u, rows)
    par_par, par_perp = split_against(par, rows)
    assert torch.allclose(par_par, par, atol=1e-13, rtol=0)
    assert par_perp.abs().max() <= 1e-13
    perp_par, _ = split_against(perp, rows)
    assert perp_par.abs().max() <= 1e-13


def test_basis_rows_follow_the_given_order_and_sign():
    rows = _randn(3, 10, seed=12)
    q = orthonormal_basis(rows)
    assert q.dtype == torch.float64
    assert torch.allclose(q[0], rows[0] / rows[0].norm(), atol=1e-15, rtol=0)
    assert float(q[1] @ rows[1]) > 0


@pytest.mark.parametrize("bad, words", [
    (_randn(33, seed=0), ["reference", "width 33", "width 32"]),
    (torch.zeros(32, dtype=torch.float64), ["reference", "zero row", "[0]"]),
    (torch.stack([_randn(32, seed=1), torch.zeros(32, dtype=torch.float64)]), ["zero row", "[1]"]),
    (torch.full((32,), float("nan")), ["reference", "NaN or inf"]),
    (torch.tensor([float("inf")] + [1.0] * 31), ["NaN or inf"]),
    (torch.stack([_randn(32, seed=1), 2 * _randn(32, seed=1), _randn(32, seed=2)]),
     ["reference", "rank 2", "3 rows", "Drop the dependent rows"]),
    (_randn(2, 3, 32, seed=1), ["[d]", "[k, d]", "shape (2, 3, 32)"]),
    (torch.ones(32, dtype=torch.int64), ["floating"]),
    ([1.0] * 32, ["floating torch tensor", "list"]),
])
def test_each_bad_reference_gets_one_clear_error(bad, words):
    with pytest.raises(SubspaceError) as info:
        split_against(_randn(4, 32, seed=3), bad)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert isinstance(info.value, ValueError) and isinstance(info.value, tld.TLDirectionalError)


def test_errors_name_the_callers_argument_and_more_rows_than_width():
    with pytest.raises(SubspaceError, match=r"^steering_vector .*rank 4.*at most d=4"):
        orthonormal_basis(_randn(5, 4, seed=0), argument="steering_vector")
    with pytest.raises(SubspaceError, match="sae_rows has width 16.*width 32"):
        orthonormal_basis(_randn(2, 16), argument="sae_rows", width=32)
    with pytest.raises(SubspaceError, match="rtol"):
        orthonormal_basis(_randn(2, 16), rtol=0.0)
    with pytest.raises(ValueError, match="eps"):
        split_against(_randn(2, 16), _randn(16), eps=float("nan"))


def test_nearly_dependent_rows_respect_rtol():
    a = _randn(16, seed=1)
    rows = torch.stack([a, a + 1e-12 * _randn(16, seed=2)])
    with pytest.raises(SubspaceError, match="rank 1"):
        orthonormal_basis(rows)
    assert orthonormal_basis(rows, rtol=1e-14).shape == (2, 16)


@pytest.mark.parametrize("k, d", [(1, 32), (3, 32), (8, 64)])
def test_random_energy_share_is_k_over_d_monte_carlo(k, d):
    """Seeded Monte Carlo: the parallel energy share ``||u_par||^2 / ||u||^2`` of 20000 Gaussian
    vectors against a fixed k-subspace (by symmetry the same law as a fixed vector against a
    random subspace: Beta(k/2, (d-k)/2), mean k/d) lands within 5 standard errors of k / d,
    and the interval is narrow enough to tell k / d from (k +- 1) / d."""
    u = _randn(20000, d, seed=100 + k)
    par, _ = split_against(u, _randn(k, d, seed=200 + k))
    share = (par * par).sum(-1) / (u * u).sum(-1)
    mean, se = float(share.mean()), float(share.std()) / math.sqrt(len(share))
    expected = random_energy_share(k, d)
    assert expected == k / d
    assert abs(mean - expected) <= 5 * se
    assert 5 * se < 0.5 / d
    # the Beta law's own standard deviation, as a check on the sample's
    beta_sd = math.sqrt(2 * k * (d - k) / (d * d * (d + 2)))
    assert float(share.std()) == pytest.approx(beta_sd, rel=0.05)


@pytest.mark.parametrize("k, d", [(0, 4), (5, 4), (1, 0), (True, 4)])
def test_random_energy_share_refuses_bad_dimensions(k, d):
    with pytest.raises(ValueError):
        random_energy_share(k, d)
