"""Each edit's math, written once (tl_directional.edit.forms), against independent formulas: the
two placements of one edit agree (on the pattern and on the head output), the fast V-Para form
equals the general one bit for bit, and scale 1 is an exact no-op."""

from __future__ import annotations

import torch

from tl_directional.edit.forms import (
    cross_aggregate,
    diagonal_removed,
    diagonal_removed_aggregate,
    diagonal_shifted,
    diagonal_shifted_aggregate,
    effective_diagonal_aggregate,
    effective_diagonal_pattern,
    residual_parts,
    residual_scaled,
    self_weights,
    value_scaled,
    value_split_scaled,
)
from tl_directional.edit.tensors import scale_minus_one

B, H, Q, D = 2, 4, 6, 8


def _pattern(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(B, H, Q, Q, generator=g, dtype=torch.float64)
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def _values(seed: int = 1) -> torch.Tensor:
    return torch.randn(B, Q, H, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _aggregate(pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bhqk,bkhe->bqhe", pattern, v)


def test_diagonal_removal_by_hand_and_on_the_aggregate():
    a, v = _pattern(), _values()
    got = diagonal_removed(a, 0, None, 1e-9)
    want = a.clone()
    for t in range(Q):
        off = a[:, :, t].sum(-1) - a[:, :, t, t]
        keep = off > 1e-9
        row = a[:, :, t] * torch.where(keep, a[:, :, t].sum(-1) / torch.where(keep, off, 1.0), 1.0).unsqueeze(-1)
        row[..., t] = torch.where(keep, 0.0, row[..., t])
        want[:, :, t] = row
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.equal(got[:, :, 0], a[:, :, 0])  # the first token has no off-diagonal mass
    assert torch.allclose(got.sum(-1), a.sum(-1), atol=1e-12)  # rows keep their sums
    # the same edit written on the head output: aggregating the edited pattern
    z = _aggregate(a, v)
    assert torch.allclose(diagonal_removed_aggregate(z, v, a, 0, None, 1e-9), _aggregate(got, v), atol=1e-12)
    # scoped to one head: the others are untouched
    scope = torch.tensor([False, True, False, False]).view(1, -1, 1)
    scoped = diagonal_removed(a, 0, scope, 1e-9)
    assert torch.equal(scoped[:, [0, 2, 3]], a[:, [0, 2, 3]]) and torch.equal(scoped[:, 1], got[:, 1])


def test_effective_diagonal_on_the_pattern_equals_it_on_the_output_and_v_para():
    a, v = _pattern(), _values()
    z = _aggregate(a, v)
    s = torch.full((1, 1, H), 0.3, dtype=torch.float64)
    on_pattern = _aggregate(effective_diagonal_pattern(a, v, s, 1e-12), v)
    on_output = effective_diagonal_aggregate(z, v, s, 1e-12)
    v_para = value_scaled(z, z, v, s, torch.ones_like(s), 1e-12)
    assert torch.allclose(on_pattern, on_output, atol=1e-12) and torch.allclose(on_output, v_para, atol=1e-12)
    one = torch.ones_like(s)
    assert torch.equal(effective_diagonal_aggregate(z, v, one, 1e-12), z)


def test_a_shifted_diagonal_by_hand_on_the_output_and_behind_a_cache():
    """``A_tt += add_t`` on the pattern (key ``offset + t``) and ``z + add_t v_t`` on the output
    agree, also for queries behind cached keys, and leave every other entry as it was."""
    a, v = _pattern(), _values()
    add = torch.randn(B, Q, H, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = diagonal_shifted(a, 0, add)
    want = a.clone()
    for t in range(Q):
        want[:, :, t, t] += add[:, t]
    assert torch.equal(got, want)
    assert torch.allclose(_aggregate(got, v), diagonal_shifted_aggregate(_aggregate(a, v), v, add), atol=1e-12)
    # the last two queries against all Q keys (the first Q - 2 cached): the diagonal is at offset + t
    tail, off = a[:, :, -2:], Q - 2
    shifted = diagonal_shifted(tail, off, add[:, -2:])
    for t in range(2):
        assert torch.equal(shifted[:, :, t, off + t], tail[:, :, t, off + t] + add[:, Q - 2 + t])
    untouched = torch.ones_like(tail, dtype=torch.bool)
    untouched[:, :, [0, 1], [off, off + 1]] = False
    assert torch.equal(shifted[untouched], tail[untouched])


def test_value_forms_by_hand_and_the_fast_form_bit_for_bit():
    a, v = _pattern(), _values()
    z = _aggregate(a, v)
    a_tt = self_weights(a, 0)
    assert torch.equal(a_tt, torch.diagonal(a, dim1=-2, dim2=-1).transpose(1, 2))
    c = cross_aggregate(z, v, a_tt, torch.float64)
    assert torch.allclose(c, _aggregate(a - torch.diag_embed(torch.diagonal(a, dim1=-2, dim2=-1)), v), atol=1e-12)
    sp = torch.full((1, 1, H), 0.25, dtype=torch.float64)
    sq = torch.full((1, 1, H), 1.5, dtype=torch.float64)
    coef = (c * v).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True)
    want = z + (0.25 - 1) * coef * v + (1.5 - 1) * (c - coef * v)
    assert torch.allclose(value_scaled(z, c, v, sp, sq, 1e-12), want, atol=1e-12)
    with torch.no_grad():
        fast = value_split_scaled(z, v, scale_minus_one(sp), scale_minus_one(sq), 1e-12)
    slow = value_scaled(z, z, v, sp, sq, 1e-12)
    assert torch.equal(fast, slow)


def test_residual_form_and_position_scope():
    g = torch.Generator().manual_seed(2)
    stream, out = torch.randn(B, Q, D, generator=g), torch.randn(B, Q, D, generator=g)
    update, ref = residual_parts(out, stream, None, is_difference=True)
    assert torch.equal(update, out - stream) and ref is stream
    sp, sq = torch.zeros(1, 1), torch.ones(1, 1)
    pos = torch.zeros(1, Q, dtype=torch.bool)
    pos[0, 2] = True
    got = residual_scaled(out, update, ref, sp, sq, 1e-12, pos)
    coef = (update * ref).sum(-1, keepdim=True) / (ref * ref).sum(-1, keepdim=True)
    assert torch.allclose(got[:, 2], (out - coef * ref)[:, 2], atol=1e-5)
    assert torch.equal(got[:, [0, 1, 3, 4, 5]], out[:, [0, 1, 3, 4, 5]])
    assert torch.equal(residual_scaled(out, update, ref, torch.ones(1, 1), torch.ones(1, 1), 1e-12), out)
