"""Fused per-token statistics of one layer (METHOD.md sec. 1 and 3), for measuring only.

:func:`tl_directional.geometry.decompose` returns the parallel and perpendicular parts
themselves (``[*batch, d]``) for edits and plots. Measuring needs only scalars per token:
the projection coefficient, the two squared norms and the ratios built from them. The
functions here compute exactly those and nothing else, and they are the one home of that
computation for both streaming :func:`tl_directional.measure.profile` and
:meth:`tl_directional.measure.Profile.from_cache`.

Exactness comes first: every scalar is formed by the same floating-point steps as
:func:`~tl_directional.geometry.decompose` (dot products as ``(x * y).sum(-1)``, the
perpendicular norm from ``u - a r`` itself, never from the Gram closed form
``||u||^2 - a^2 ||r||^2``, which loses digits when ``u`` is nearly parallel to ``r``), so the
tables equal those of the unfused path to rounding. Everything is pure tensor math: no
model, hook or host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from .geometry import DEFAULT_EPS, PERP_VANISH_ULPS, SplitStats, compute_dtype


def split_stats(
    update: Float[Tensor, "*batch d"],
    reference: Float[Tensor, "*batch d"],
    eps: float = DEFAULT_EPS,
) -> SplitStats:
    """Scalars of the split of ``update`` against ``reference`` (same shapes), METHOD.md sec. 1.

    ``alpha = (u . r) / ||r||^2``, ``par_frac = ||u_par|| / ||u||``, ``par_perp_ratio =
    ||u_par|| / ||u_perp||`` (``inf`` where ``u_perp`` vanishes), ``rel_update = ||u|| /
    ||r||``; degenerate tokens (``||r||^2 <= eps`` or ``||u||^2 <= eps``) get the values
    METHOD.md sec. 1 defines. Same values as :func:`~tl_directional.geometry.decompose`
    without forming ``u_par``; computed in the compute dtype (float64 stays float64).
    """
    dtype = compute_dtype(torch.promote_types(update.dtype, reference.dtype))
    u = update.to(dtype)
    r = reference.to(dtype)
    u_sq = (u * u).sum(-1)
    r_sq = (r * r).sum(-1)
    dot = (u * r).sum(-1)
    degenerate = (r_sq <= eps) | (u_sq <= eps)
    ones = torch.ones_like(r_sq)
    zero = torch.zeros_like(r_sq)
    a = torch.where(degenerate, zero, dot / torch.where(degenerate, ones, r_sq))
    perp = u - a.unsqueeze(-1) * r
    perp_sq = (perp * perp).sum(-1)
    par_sq = a * a * r_sq
    u_norm = u_sq.sqrt()
    par_norm = par_sq.sqrt()
    par_frac = torch.where(
        degenerate, zero, (par_norm / torch.where(degenerate, ones, u_norm)).clamp(0.0, 1.0))
    machine_eps = torch.finfo(dtype).eps
    perp_vanishes = perp_sq <= eps + (PERP_VANISH_ULPS * machine_eps) ** 2 * u_sq
    par_perp_ratio = torch.where(
        degenerate, zero,
        torch.where(perp_vanishes, torch.full_like(a, float("inf")),
                    par_norm / torch.where(perp_vanishes, ones, perp_sq.sqrt())))
    r_vanishes = r_sq <= eps
    rel_update = torch.where(
        r_vanishes, torch.where(u_sq <= eps, zero, torch.full_like(a, float("inf"))),
        u_norm / torch.where(r_vanishes, ones, r_sq.sqrt()))
    return SplitStats(alpha=a, par_frac=par_frac, par_perp_ratio=par_perp_ratio,
                      rel_update=rel_update, degenerate=degenerate,
                      par_sq=torch.where(degenerate, zero, par_sq), perp_sq=perp_sq)


@dataclass(frozen=True)
class ValueStats:
    """Value-space scalars of every head at ``n`` query tokens (METHOD.md sec. 3), compute dtype.

    ``full`` splits ``o_t`` against ``v_t`` (``beta`` is its ``alpha``), ``exclusive`` splits
    the cross part ``o_t - A_tt v_t`` against ``v_t`` (``gamma``); ``alpha_head`` is
    ``o_t . W_O x_t / ||x_t||^2``, ``phi`` is ``v_t . W_O x_t / ||x_t||^2`` (0 where
    ``||x_t||^2 <= eps``); ``recon`` is ``sum_h alpha_head + b_O . x_t / ||x_t||^2``, the
    attention update's residual ``alpha`` when the factorization applies.
    """

    full: SplitStats
    exclusive: SplitStats
    a_tt: Float[Tensor, "n n_heads"]
    alpha_head: Float[Tensor, "n n_heads"]
    phi: Float[Tensor, "n n_heads"]
    self_term: Float[Tensor, "n n_heads"]
    cross_term: Float[Tensor, "n n_heads"]
    recon: Float[Tensor, " n"]


def value_stats(
    z: Float[Tensor, "n n_heads d_head"],
    v: Float[Tensor, "n n_heads d_head"],
    a_tt: Float[Tensor, "n n_heads"],
    x: Float[Tensor, "n d_model"],
    W_O: Float[Tensor, "n_heads d_head d_model"],
    b_O: Float[Tensor, " d_model"] | None,
    eps: float = DEFAULT_EPS,
) -> ValueStats:
    """Value-space statistics of one attention layer (METHOD.md sec. 3).

    Args:
        z: per-head outputs ``o_t`` at the query tokens.
        v: the query token's own value ``v_t`` per head (GQA heads already expanded).
        a_tt: the attention pattern's diagonal ``A[h, t, t]``.
        x: the residual reference ``x_t`` of the attention update.
        W_O, b_O: the layer's output weights and bias (``b_O`` may be None).
        eps: degeneracy threshold on squared norms.

    The only matrix product is ``W_O[h] x_t`` (``n x d_model x n_heads d_head`` multiply-adds,
    one GEMM); the rest is dot products over ``d_head``.
    """
    full = split_stats(z, v, eps)
    dtype = full.alpha.dtype
    o = z.to(dtype)
    vt = v.to(dtype)
    att = a_tt.to(dtype)
    exclusive = split_stats(o - att.unsqueeze(-1) * vt, vt, eps)
    x_t = x.to(dtype)
    n_heads, d_head, d_model = W_O.shape
    # W_O[h] x_t for every head as one GEMM: [n, d] @ [d, h * e] -> [n, h, e]
    wx = (x_t @ W_O.to(dtype).reshape(n_heads * d_head, d_model).T).view(-1, n_heads, d_head)
    x_sq = (x_t * x_t).sum(-1)
    x_ok = x_sq > eps
    safe = torch.where(x_ok, x_sq, torch.ones_like(x_sq)).unsqueeze(-1)
    ok = x_ok.unsqueeze(-1)
    alpha_head = torch.where(ok, (o * wx).sum(-1) / safe, 0.0)
    phi = torch.where(ok, (vt * wx).sum(-1) / safe, 0.0)
    self_term = att * phi
    recon = alpha_head.sum(-1)
    if b_O is not None:
        recon = recon + torch.where(x_ok, (x_t @ b_O.to(dtype)) / safe.squeeze(-1), 0.0)
    return ValueStats(full=full, exclusive=exclusive, a_tt=att, alpha_head=alpha_head, phi=phi,
                      self_term=self_term, cross_term=alpha_head - self_term, recon=recon)


__all__ = ["SplitStats", "ValueStats", "split_stats", "value_stats"]
