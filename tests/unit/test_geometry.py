"""METHOD.md sec. 1 and sec. 4 identities of the pure tensor math."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_directional import component_delta, decompose, patch_components, scale_components
from tl_directional.core.geometry import projection_coefficient

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=64)


def vec(d):
    return st.lists(finite, min_size=d, max_size=d).map(lambda xs: torch.tensor(xs, dtype=torch.float64))


pairs = st.integers(1, 12).flatmap(lambda d: st.tuples(vec(d), vec(d)))


@settings(max_examples=300, deadline=None)
@given(pairs)
def test_par_plus_perp_is_update_and_perp_orthogonal(pair):
    u, r = pair
    d = decompose(u, r)
    assert torch.allclose(d.par + d.perp, u, rtol=0, atol=1e-9 * (1 + u.abs().max()))
    if not d.degenerate:
        # perp . r == 0, relative to the sizes involved
        assert abs(float(d.perp @ r)) <= 1e-9 * float(u.norm() * r.norm()) + 1e-12


@settings(max_examples=300, deadline=None)
@given(pairs, st.floats(min_value=1e-3, max_value=1e3) | st.floats(min_value=-1e3, max_value=-1e-3))
def test_invariant_to_scaling_the_reference(pair, c):
    u, r = pair
    d1, d2 = decompose(u, r), decompose(u, c * r)
    if bool(d1.degenerate) or bool(d2.degenerate):
        return
    assert torch.allclose(d1.par, d2.par, atol=1e-7 * (1 + float(u.norm())))
    assert math.isclose(float(d1.alpha), float(d2.alpha) * c, rel_tol=1e-7, abs_tol=1e-9)
    assert math.isclose(float(d1.par_frac), float(d2.par_frac), abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(pairs)
def test_never_nan_and_metric_ranges(pair):
    u, r = pair
    d = decompose(u, r)
    for name in ("alpha", "par_frac", "par_perp_ratio", "rel_update"):
        assert not torch.isnan(getattr(d, name)).any(), name
    assert 0.0 <= float(d.par_frac) <= 1.0
    assert float(d.par_perp_ratio) >= 0.0
    if not d.degenerate:
        cos = float(u @ r) / float(u.norm() * r.norm())
        assert math.isclose(float(d.par_frac), abs(cos), abs_tol=1e-9)
        assert math.isclose(float(d.rel_update), float(u.norm() / r.norm()), rel_tol=1e-9)


def test_alpha_definition_h_plus_u():
    # h + u = (1 + a) h + u_perp when r = h
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 16, generator=g, dtype=torch.float64)
    u = torch.randn(5, 16, generator=g, dtype=torch.float64)
    d = decompose(u, h)
    assert torch.allclose(h + u, (1 + d.alpha).unsqueeze(-1) * h + d.perp)


def test_degenerate_tokens_defined_and_flagged():
    u = torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    r = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    d = decompose(u, r)
    assert d.degenerate.tolist() == [True, True, True, False]
    assert d.alpha[:3].tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(d.par[:3], torch.zeros(3, 2))
    assert torch.equal(d.perp[:3], u[:3])
    assert d.par_frac[:3].tolist() == [0.0, 0.0, 0.0]
    assert d.rel_update[0] == float("inf")  # only r vanishes
    assert d.rel_update[1] == 0.0  # only u vanishes
    assert d.rel_update[2] == 0.0  # both vanish: 0, not NaN
    assert not torch.isnan(d.par_perp_ratio).any()


def test_par_perp_ratio_inf_when_perp_vanishes():
    v = torch.tensor([0.3, -1.2, 2.5, 0.7])
    d = decompose(v.clone(), v)  # value space at t = 0: o_0 = v_0
    assert d.par_perp_ratio == float("inf")
    assert math.isclose(float(d.par_frac), 1.0, abs_tol=1e-6)


def test_eps_is_absolute_on_squared_norms():
    r = torch.tensor([1e-7, 0.0])  # ||r||^2 = 1e-14 <= 1e-12
    assert decompose(torch.tensor([1.0, 1.0]), r).degenerate
    assert not decompose(torch.tensor([1.0, 1.0]), r, eps=1e-16).degenerate


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_is_upcast_to_float32(dtype):
    u = torch.randn(3, 8).to(dtype)
    r = torch.randn(3, 8).to(dtype)
    d = decompose(u, r)
    assert d.alpha.dtype == torch.float32 and d.par.dtype == torch.float32
    ref = decompose(u.double(), r.double())
    assert torch.allclose(d.alpha.double(), ref.alpha, atol=1e-5)


def test_float64_stays_float64():
    d = decompose(torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64))
    assert d.alpha.dtype == torch.float64


def test_broadcast_reference_and_leading_shapes():
    u = torch.randn(2, 3, 5, 8)
    r = torch.randn(8)  # a fixed direction
    d = decompose(u, r)
    assert d.alpha.shape == (2, 3, 5) and d.perp.shape == u.shape
    assert torch.allclose(d.perp @ r, torch.zeros(2, 3, 5), atol=1e-4)


def test_scale_one_is_bit_exact_and_literal_sum_is_not():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(4096, 64, generator=g)
    r = torch.randn(4096, 64, generator=g)
    assert torch.equal(scale_components(y, r, 1.0, 1.0), y)
    d = decompose(y, r)
    literal = (1.0 * d.par + 1.0 * d.perp).to(y.dtype)
    # METHOD.md: the literal sum is not exact in a sizable share of float32 elements
    assert (literal != y).float().mean() > 0.01


def test_scale_components_formula():
    g = torch.Generator().manual_seed(2)
    y = torch.randn(10, 16, generator=g, dtype=torch.float64)
    r = torch.randn(10, 16, generator=g, dtype=torch.float64)
    d = decompose(y, r)
    for s_par, s_perp in [(0.0, 1.0), (1.0, 0.0), (-1.0, 2.0), (0.5, 0.5)]:
        out = scale_components(y, r, s_par, s_perp)
        assert torch.allclose(out, s_par * d.par + s_perp * d.perp)
    per_row = torch.linspace(0, 2, 10, dtype=torch.float64)
    out = scale_components(y, r, per_row, 1.0)
    assert torch.allclose(out, per_row[:, None] * d.par + d.perp)


def test_scaling_is_differentiable_through_reference_and_scale():
    y = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    r = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    out = scale_components(y, r, s, 1.0)
    out.sum().backward()
    assert y.grad is not None and r.grad is not None and s.grad is not None
    assert r.grad.abs().sum() > 0 and s.grad.abs() > 0
    assert torch.autograd.gradcheck(lambda y, r: component_delta(y, r, 0.3, 1.7), (y.detach().requires_grad_(), r.detach().requires_grad_()))


def test_degenerate_reference_gives_finite_gradients():
    y = torch.randn(3, 4, requires_grad=True)
    r = torch.zeros(3, 4, requires_grad=True)
    scale_components(y, r, 0.0, 1.0).sum().backward()
    assert torch.isfinite(y.grad).all() and torch.isfinite(r.grad).all()


def test_directional_patches_split_the_full_patch():
    g = torch.Generator().manual_seed(3)
    src, tgt, r = (torch.randn(7, 12, generator=g, dtype=torch.float64) for _ in range(3))
    par = patch_components(src, tgt, r, "par")
    perp = patch_components(src, tgt, r, "perp")
    assert torch.allclose(par + perp, src + tgt)
    assert torch.allclose(patch_components(src, tgt, r, "full"), src)
    # the parallel patch keeps target's perpendicular part and takes source's parallel part
    assert torch.allclose(decompose(par, r).perp, decompose(tgt, r).perp)
    assert torch.allclose(decompose(par, r).par, decompose(src, r).par)
    with pytest.raises(ValueError, match="which"):
        patch_components(src, tgt, r, "sideways")


def test_bad_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="last axis"):
        decompose(torch.randn(3, 4), torch.randn(3, 5))
    with pytest.raises(TypeError, match="torch tensors"):
        decompose([1.0, 2.0], torch.randn(2))
    with pytest.raises(TypeError, match="floating point"):
        decompose(torch.ones(3, dtype=torch.long), torch.ones(3))
    with pytest.raises(ValueError, match="vector axis"):
        projection_coefficient(torch.tensor(1.0), torch.tensor(2.0))


def test_joint_value_delta_is_the_split_of_the_concatenation():
    """METHOD sec. 4 (joint form): one split of the concatenated heads; its coefficient is the
    per-head coefficients' average weighted by ||v^h||^2, and one head reduces to the per-head form."""
    import torch

    from tl_directional.core.geometry import component_delta
    from tl_directional.edit.forms import joint_value_delta

    g = torch.Generator().manual_seed(0)
    y, v = torch.randn(3, 5, 4, 8, generator=g, dtype=torch.float64), torch.randn(3, 5, 4, 8, generator=g, dtype=torch.float64)
    d = joint_value_delta(y, v, 0.0, 1.0, 1e-12)  # removal: minus the joint parallel part
    per_head = (y * v).sum(-1) / (v * v).sum(-1)  # [3, 5, 4]
    w = (v * v).sum(-1)
    coef = (per_head * w).sum(-1) / w.sum(-1)  # the ||v^h||^2-weighted average
    torch.testing.assert_close(d, -coef[..., None, None] * v, rtol=1e-12, atol=1e-12)
    one = joint_value_delta(y[:, :, :1], v[:, :, :1], 0.3, 1.7, 1e-12)
    torch.testing.assert_close(one, component_delta(y[:, :, :1], v[:, :, :1], 0.3, 1.7, 1e-12), rtol=0, atol=0)
    assert torch.equal(joint_value_delta(y, v, 1.0, 1.0, 1e-12), torch.zeros_like(y))
