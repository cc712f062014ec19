"""The MLP carrier split's tensor math (tl_directional.core.carrier) against an independent
implementation written here: an explicit loop over the width-d blocks, in float64."""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.carrier import (
    CarrierShapeError,
    block_contributions,
    carrier_block_delta,
    carrier_blocks,
    carrier_input_delta,
    carrier_split_energy,
    n_carrier_blocks,
)
from tl_directional.core.errors import TLDirectionalError


def _data(d_mlp: int, d: int, seed: int = 0, lead=(3, 5)):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, d_mlp, generator=g, dtype=torch.float64)
    x = torch.randn(*lead, d, generator=g, dtype=torch.float64)
    w = torch.randn(d_mlp, d, generator=g, dtype=torch.float64) / d_mlp ** 0.5
    return h, x, w


def _proj(u, r):
    """(u . r / r . r) r over the last axis."""
    return (u * r).sum(-1, keepdim=True) / (r * r).sum(-1, keepdim=True) * r


def _ref_input_output(h, x, w, s_par, s_perp):
    """The paper's site 1, written out: y~ = sum_g W_down[:, I_g] (s_par P_par + s_perp P_perp)(h_g; x),
    the last partial block read as zero-padded to width d (its extra coordinates meet zero columns)."""
    d_mlp, d = w.shape
    out = torch.zeros(*h.shape[:-1], d, dtype=torch.float64)
    for start in range(0, d_mlp, d):
        stop = min(start + d, d_mlp)
        hg = torch.zeros(*h.shape[:-1], d, dtype=torch.float64)
        hg[..., : stop - start] = h[..., start:stop]
        par = _proj(hg, x)
        edited = s_par * par + s_perp * (hg - par)
        out = out + edited[..., : stop - start] @ w[start:stop]
    return out


def _ref_block_output(h, w, s_par, s_perp):
    """The paper's site 2, written out: y~ = sum_g (s_par P_par + s_perp P_perp)(y_g; h_g)."""
    d_mlp, d = w.shape
    out = torch.zeros(*h.shape[:-1], d, dtype=torch.float64)
    for start in range(0, d_mlp, d):
        stop = min(start + d, d_mlp)
        yg = h[..., start:stop] @ w[start:stop]
        hg = torch.zeros(*h.shape[:-1], d, dtype=torch.float64)
        hg[..., : stop - start] = h[..., start:stop]
        par = _proj(yg, hg)
        out = out + s_par * par + s_perp * (yg - par)
    return out


@pytest.mark.parametrize("d_mlp,d", [(64, 16), (40, 16), (16, 16), (10, 16)])
@pytest.mark.parametrize("s_par,s_perp", [(0.0, 1.0), (1.0, 0.0), (0.5, 2.0), (-1.0, 1.5)])
def test_both_sites_equal_the_explicit_block_loop(d_mlp, d, s_par, s_perp):
    h, x, w = _data(d_mlp, d)
    got_in = (h + carrier_input_delta(h, x, s_par, s_perp)) @ w
    torch.testing.assert_close(got_in, _ref_input_output(h, x, w, s_par, s_perp), rtol=1e-12, atol=1e-12)
    got_blk = h @ w + carrier_block_delta(h, w, s_par, s_perp)
    torch.testing.assert_close(got_blk, _ref_block_output(h, w, s_par, s_perp), rtol=1e-12, atol=1e-12)


def test_blocks_sum_to_the_down_projection_and_pad_with_zeros():
    h, _, w = _data(40, 16)
    assert n_carrier_blocks(40, 16) == 3 and n_carrier_blocks(48, 16) == 3
    blocks = carrier_blocks(h, 16)
    assert blocks.shape == (3, 5, 3, 16)
    assert torch.equal(blocks[..., 2, 8:], torch.zeros_like(blocks[..., 2, 8:]))
    assert torch.equal(blocks.flatten(-2)[..., :40], h)
    torch.testing.assert_close(block_contributions(h, w).sum(-2), h @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_scale_one_is_an_exact_zero_change(dtype):
    h, x, w = (t.to(dtype) for t in _data(48, 16))
    assert not carrier_input_delta(h, x, 1.0, 1.0).any()
    assert not carrier_block_delta(h, w, 1.0, 1.0).any()
    s = torch.ones(3, 5, dtype=torch.float64)  # per-token scales, all 1
    assert not carrier_input_delta(h, x, s, s).any()


def test_per_token_scales_broadcast_over_blocks():
    h, x, w = _data(48, 16)
    s = torch.tensor([0.0, 0.5, 2.0], dtype=torch.float64).view(3, 1)  # one per leading row
    got = carrier_input_delta(h, x, s, 1.0)
    for i, si in enumerate(s.flatten().tolist()):
        torch.testing.assert_close(got[i], carrier_input_delta(h[i], x[i], si, 1.0), rtol=1e-12, atol=1e-12)


def test_removal_leaves_each_block_orthogonal_to_its_reference():
    h, x, w = _data(48, 16)
    edited = (h + carrier_input_delta(h, x, 0.0, 1.0)).unflatten(-1, (3, 16))
    assert (edited * x.unsqueeze(-2)).sum(-1).abs().max() < 1e-10
    y = block_contributions(h, w)
    y_new = y + torch.stack([carrier_block_delta(h[..., g * 16:(g + 1) * 16], w[g * 16:(g + 1) * 16], 0.0, 1.0)
                             for g in range(3)], -2)
    assert (y_new * carrier_blocks(h, 16)).sum(-1).abs().max() < 1e-10


def test_degenerate_blocks_have_no_parallel_part():
    """As everywhere in the library (METHOD.md sec. 1): a = 0, u_par = 0, u_perp = u; never NaN."""
    h, x, w = _data(48, 16)
    h[..., 16:32] = 0.0  # the middle block is zero
    x[0, 0] = 0.0  # a zero input: every block of that token is all perpendicular
    assert not carrier_input_delta(h, x, 0.0, 1.0)[0, 0].any()  # parallel removal: nothing to remove
    torch.testing.assert_close(carrier_input_delta(h, x, 0.0, 0.5)[0, 0], -0.5 * h[0, 0])
    assert not carrier_input_delta(h, x, 0.0, 0.5)[..., 16:32].any()
    assert torch.isfinite(carrier_block_delta(h, w, 0.0, 0.5)).all()


def test_gradients_flow_to_every_input():
    h, x, w = _data(40, 16, lead=(2, 3))
    s = torch.tensor(0.3, dtype=torch.float64)
    for t in (h, x, w, s):
        t.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda h, x, s: carrier_input_delta(h, x, s, 1.2), (h, x, s))
    assert torch.autograd.gradcheck(lambda h, w, s: carrier_block_delta(h, w, s, 0.7), (h, w, s))


def test_energy_share_matches_the_loop_and_lies_in_unit_interval():
    h, x, w = _data(40, 16)
    par, tot = carrier_split_energy(h, reference=x)
    want_par = sum((_proj(torch.nn.functional.pad(h[..., s:s + 16], (0, 16 - h[..., s:s + 16].shape[-1])), x) ** 2
                    ).sum(-1) for s in range(0, 40, 16))
    torch.testing.assert_close(par, want_par, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tot, (h * h).sum(-1), rtol=1e-12, atol=1e-12)
    par_b, tot_b = carrier_split_energy(h, w_down=w)
    assert bool(((par_b <= tot_b + 1e-12) & (par_b >= 0)).all())
    with pytest.raises(ValueError, match="exactly one of reference"):
        carrier_split_energy(h)


def test_remainder_error_names_the_argument_and_the_fix():
    h, x, w = _data(40, 16)
    with pytest.raises(CarrierShapeError, match=r"d_mlp=40 is not a multiple of d_model=16.*remainder='pad'") as e:
        carrier_input_delta(h, x, 0.0, 1.0, remainder="error")
    assert isinstance(e.value, TLDirectionalError) and isinstance(e.value, ValueError)
    with pytest.raises(CarrierShapeError, match="remainder='error'"):
        carrier_block_delta(h, w, 0.0, 1.0, remainder="error")
    h64, x64, w64 = _data(64, 16)  # a multiple: "error" is no restriction
    assert torch.equal(carrier_input_delta(h64, x64, 0.0, 1.0, remainder="error"),
                       carrier_input_delta(h64, x64, 0.0, 1.0))
    with pytest.raises(ValueError, match=r"remainder must be one of \('pad', 'error'\).*got 'truncate'"):
        carrier_blocks(h, 16, remainder="truncate")
    with pytest.raises(CarrierShapeError, match=r"w_down must be \[d_mlp, d_model\] = \[40, d_model\]"):
        block_contributions(h, w.T)
