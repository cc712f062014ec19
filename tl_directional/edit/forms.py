"""Each edit's math, written once, as functions of tensors (METHOD.md sec. 2-4).

Every lane calls these: the TransformerLens hooks (:mod:`tl_directional.edit.residual`,
:mod:`~tl_directional.edit.value`, :mod:`~tl_directional.edit.pattern`) and the module hooks on
plain ``transformers`` models (:mod:`tl_directional.edit.hf`); a lane only says where the tensors
come from (which hook or module) and casts the result back (:func:`~tl_directional.edit.tensors.cast_back`).
Scales arrive already resolved to tensors (:func:`~tl_directional.edit.tensors.row_scale`: 1
outside the edit's head and position scope), so nothing here knows about edits, layers or lanes.

One scaling form everywhere: ``y~ = s_par y_par + s_perp y_perp``, applied as
``y + (s_par - 1) y_par + (s_perp - 1) y_perp`` so that scale 1 is a bit-exact no-op. The results
are in the compute dtype (:func:`~tl_directional.core.geometry.compute_dtype`); nothing is
detached, so gradients flow through every form.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.geometry import component_delta, compute_dtype, projection_coefficient
from ..model.sites import expand_kv_heads

# ---------------------------------------------------------------------------------------------
# residual space: an update against the stream it is added to (ResidualScale)
# ---------------------------------------------------------------------------------------------


def residual_parts(output: Float[Tensor, "batch pos d_model"], stream: Float[Tensor, "batch pos d_model"],
                   reference: Tensor | None, is_difference: bool) -> tuple[Tensor, Tensor]:
    """``(update, reference)`` of a residual-space edit.

    Args:
        output: ``[batch, pos, d_model]``, what the edited site carries: the update itself
            (``hook_attn_out``), or the stream after it when ``is_difference`` (``hook_resid_post``:
            the block update is ``output - stream``).
        stream: ``[batch, pos, d_model]``, the residual the update is added to (``resid_pre`` /
            ``resid_mid``).
        reference: a fixed direction (``[d_model]`` or broadcastable to ``output``) to split
            against instead of the stream, or None.
    """
    ref = stream if reference is None else reference.to(output.device, output.dtype)
    # a block update is a difference of two streams: taken in the compute dtype, or a half-precision
    # model would round it to 8 (bf16) / 11 (fp16) bits before the split (float32: unchanged)
    cd = compute_dtype(output.dtype)
    update = output.to(cd) - stream.to(cd) if is_difference else output
    return update, ref


def residual_scaled(output: Float[Tensor, "batch pos d_model"], update: Float[Tensor, "batch pos d_model"],
                    reference: Tensor | None, s_par: Tensor, s_perp: Tensor, eps: float,
                    positions: Tensor | None = None, *,
                    basis: Float[Tensor, "k d_model"] | None = None) -> Float[Tensor, "batch pos d_model"]:
    """``output + (s_par - 1) update_par + (s_perp - 1) update_perp``, the update split against
    ``reference`` per token (residual space, METHOD.md sec. 2), or against the span of ``basis``.

    Args:
        output, update, reference: from :func:`residual_parts` (``reference`` unused with ``basis``).
        s_par, s_perp: ``[batch|1, 1]`` scales in the compute dtype.
        positions: ``[batch|1, pos]`` bool, the query positions in scope (None: all); the
            scales are 1 elsewhere.
        eps: the degeneracy threshold on squared norms.
        basis: orthonormal rows ``Q`` ``[k, d_model]`` (float64, from
            :func:`~tl_directional.core.subspace.orthonormal_basis`): ``update_par = (u Q^T) Q``,
            the orthogonal projection onto their span, computed in the compute dtype.
    """
    if positions is not None:
        s_par = torch.where(positions, s_par, torch.ones_like(s_par))
        s_perp = torch.where(positions, s_perp, torch.ones_like(s_perp))
    if basis is None:
        delta = component_delta(update, reference, s_par, s_perp, eps)
    else:
        dtype = compute_dtype(update.dtype)
        u = update.to(dtype)
        q = basis.to(device=u.device, dtype=dtype)
        par = (u @ q.T) @ q
        delta = (s_par.to(dtype).unsqueeze(-1) - 1.0) * par + (s_perp.to(dtype).unsqueeze(-1) - 1.0) * (u - par)
    return output.to(delta.dtype) + delta


# ---------------------------------------------------------------------------------------------
# steering: a fixed vector added to the stream, split against it (ActivationAddition)
# ---------------------------------------------------------------------------------------------


def steering_delta(stream: Float[Tensor, "batch pos d_model"], vector: Float[Tensor, " d_model"], alpha: Tensor,
                   s_par: Tensor | None, s_perp: Tensor | None, eps: float,
                   positions: Tensor | None = None) -> Float[Tensor, "#batch #pos d_model"]:
    """What the steering edit adds to the stream: ``alpha * v~`` with
    ``v~ = v + (s_par - 1) v_par + (s_perp - 1) v_perp``, the vector ``v`` split per token against
    the stream it is added to (METHOD.md sec. 1 with ``u = v``, ``r = stream``): ``v_par`` only
    rescales the stream, ``v_perp`` turns it.

    Args:
        stream: ``[batch, pos, d_model]``, the live residual stream at the hook.
        vector: ``[d_model]``, already in ``stream``'s dtype and device.
        alpha: ``[batch|1, 1]`` multiplier in ``stream``'s dtype.
        s_par, s_perp: ``[batch|1, 1]`` scales in the compute dtype, or both None for plain
            addition: no split is computed and the result is ``alpha * v`` in ``stream``'s dtype
            (``[batch|1, 1, d_model]``), so that ``stream + delta`` is bit for bit what a
            hand-written hook adding ``alpha * v`` gives.
        positions: ``[batch|1, pos]`` bool, where the vector is added (None: everywhere); the
            delta is 0 elsewhere.

    Returns the delta in ``stream``'s dtype when plain, else in the compute dtype. Degenerate
    tokens (``||stream||^2 <= eps``) have ``v_par = 0``, so only ``s_perp`` acts there. Nothing
    is detached.
    """
    if s_par is None:
        delta = alpha.unsqueeze(-1) * vector
    else:
        v = vector.to(s_par.dtype)  # [d_model], broadcast against every token
        delta = alpha.to(s_par.dtype).unsqueeze(-1) * (v + component_delta(v, stream, s_par, s_perp, eps))
    if positions is None:
        return delta
    return torch.where(positions.unsqueeze(-1), delta, torch.zeros((), dtype=delta.dtype, device=delta.device))


def steered(stream: Float[Tensor, "batch pos d_model"], vector: Float[Tensor, " d_model"], alpha: Tensor,
            s_par: Tensor | None, s_perp: Tensor | None, eps: float,
            positions: Tensor | None = None) -> Float[Tensor, "batch pos d_model"]:
    """``stream + steering_delta(...)`` (:func:`steering_delta`): in ``stream``'s dtype for plain
    addition (``s_par``, ``s_perp`` None), else in the compute dtype (the caller casts back)."""
    delta = steering_delta(stream, vector, alpha, s_par, s_perp, eps, positions)
    return stream.to(delta.dtype) + delta


def steering_shares(stream: Float[Tensor, "batch pos d_model"], vector: Float[Tensor, " d_model"],
                    eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(coef, par_share, stream_norm)``, each ``[batch, pos]`` in the compute dtype, of the added
    vector ``v`` against the stream: ``coef = (v . h) / ||h||^2`` (adding ``alpha v`` turns ``h``
    into ``(1 + alpha coef) h`` plus the turning part), ``par_share = ||v_par||^2 / ||v||^2 =
    cos^2(v, h)`` (0 where degenerate), ``stream_norm = ||h||``. Read without gradients."""
    with torch.no_grad():
        h = stream.detach()
        v = vector.detach().to(compute_dtype(h.dtype))
        a, degenerate, v_sq, h_sq = projection_coefficient(v, h, eps)
        share = torch.where(degenerate, torch.zeros_like(a), a * a * h_sq / torch.where(degenerate, 1.0, v_sq))
        return a, share, h_sq.sqrt()


# ---------------------------------------------------------------------------------------------
# value space: a head's aggregate against each token's own value vector (ValueScale)
# ---------------------------------------------------------------------------------------------


def self_weights(pattern: Float[Tensor, "batch n_heads query key"],
                 offset: int) -> Float[Tensor, "batch query n_heads"]:
    """``A_tt``, each query's weight on its own key, ``[batch, query, n_heads]``; ``offset``: the
    number of cached keys before the first query (absolute query ``t`` is key ``offset + t``)."""
    idx = torch.arange(pattern.shape[-2], device=pattern.device)
    return pattern[:, :, idx, offset + idx].transpose(1, 2)


def cross_aggregate(z: Float[Tensor, "batch query n_heads d_head"], v: Float[Tensor, "batch query n_heads d_head"],
                    a_tt: Float[Tensor, "batch query n_heads"], dtype: torch.dtype) -> Tensor:
    """``c_t = o_t - A_tt v_t`` (the aggregate without the self message) in ``dtype``; ``v``: the
    own values with the KV heads expanded to the query heads."""
    return z.to(dtype) - a_tt.to(dtype).unsqueeze(-1) * v.to(dtype)


def value_scaled(z: Float[Tensor, "batch query n_heads d_head"], y: Tensor,
                 v: Float[Tensor, "batch query n_heads d_head"], s_par: Tensor, s_perp: Tensor,
                 eps: float) -> Float[Tensor, "batch query n_heads d_head"]:
    """``z + (s_par - 1) y_par + (s_perp - 1) y_perp``, ``y`` split against its own head's value
    per token and head (value space, one split per head).

    Args:
        z: ``[batch, query, n_heads, d_head]``, the head outputs (``hook_z``, o_proj's input).
        y: what is split: ``z`` (``mode="full"``, V-Para) or :func:`cross_aggregate`
            (``mode="exclusive"``, the self message kept).
        v: ``[batch, query, n_heads, d_head]``, the own values, KV heads expanded.
        s_par, s_perp: ``[batch|1, query|1, n_heads|1]`` scales in the compute dtype.
    """
    delta = component_delta(y, v, s_par, s_perp, eps)
    return z.to(delta.dtype) + delta


def joint_value_delta(y: Float[Tensor, "*lead n_heads d_head"], v: Float[Tensor, "*lead n_heads d_head"],
                      s_par: Tensor | float, s_perp: Tensor | float, eps: float) -> Float[Tensor, "*lead n_heads d_head"]:
    """The value-space edit of the paper's revision (appendix, "Forward-hook implementation"):
    one split per token of the *concatenated* heads, ``y`` (every head's aggregate, or cross
    aggregate) flattened to ``n_heads * d_head`` against the concatenated own values ``v``
    (KV heads already expanded to the query-head layout), in the compute dtype.

    Returns ``(s_par - 1) y_par + (s_perp - 1) y_perp`` shaped like ``y``; ``s_par`` / ``s_perp``
    broadcast to ``y``'s leading axes ``[*lead]`` (one scale per token: the joint split has no
    per-head scale). Exactly zero at ``s_par = s_perp = 1``.
    """
    flat = component_delta(y.flatten(-2), v.flatten(-2), s_par, s_perp, eps)
    return flat.view(*y.shape[:-2], y.shape[-2], y.shape[-1])


def joint_value_scaled(z: Float[Tensor, "batch query n_heads d_head"], y: Tensor,
                       v: Float[Tensor, "batch query n_heads d_head"], s_par: Tensor, s_perp: Tensor,
                       eps: float) -> Float[Tensor, "batch query n_heads d_head"]:
    """``z + (s_par - 1) y_par + (s_perp - 1) y_perp`` with one split per token over the
    concatenated heads (:func:`joint_value_delta`); ``s_par`` / ``s_perp``: ``[batch|1, query|1]``."""
    delta = joint_value_delta(y, v, s_par, s_perp, eps)
    return z.to(delta.dtype) + delta


def value_split_scaled(y: Float[Tensor, "*lead n_heads d_head"], v: Float[Tensor, "*lead n_kv_heads d_head"],
                       sp_minus_one: Tensor | None, sq_minus_one: Tensor | None,
                       eps: float) -> Float[Tensor, "*lead n_heads d_head"]:
    """``y + (s_par - 1) y_par + (s_perp - 1) y_perp``, ``y`` split against its own head's value
    (``v``, one per KV head: query head ``h`` reads KV head ``h // (n_heads // n_kv_heads)``),
    in the compute dtype: V-Para's arithmetic (METHOD.md sec. 4) in fewer passes.

    Bit-identical to ``y + component_delta(y, expand_kv_heads(v), s_par, s_perp, eps)`` (the
    same products, sums and divisions in the same order; only the sign of a zero can differ):
    GQA heads are split against their KV head by broadcasting instead of a copy per query
    head (without autograd; with autograd, one value per query head, so the gradients are those
    of :func:`value_scaled` bit for bit); a perpendicular factor that is exactly 0 (``sq_minus_one=None``, ``s_perp = 1``)
    skips its term (``x + 0 * y_perp == x``), a parallel factor that is exactly -1
    (``sp_minus_one=None``, ``s_par = 0``) is a subtraction (``x + (-1) y_par == x - y_par``),
    and without autograd the temporaries are updated in place.

    Args:
        y: ``[..., n_heads, d_head]``, the head outputs (``hook_z``).
        v: ``[..., n_kv_heads, d_head]``, the values of the same positions (``hook_v``).
        sp_minus_one, sq_minus_one: ``s - 1`` (:func:`~tl_directional.edit.tensors.scale_minus_one`),
            ``[..., n_heads|1, 1]`` in the compute dtype; None: exactly -1 (parallel) / exactly 0
            (perpendicular).
        eps: the degeneracy threshold on squared norms.
    """
    dtype = compute_dtype(torch.promote_types(y.dtype, v.dtype))
    u, r = y.to(dtype), v.to(dtype)
    sp, sq = sp_minus_one, sq_minus_one
    inplace = not torch.is_grad_enabled() or not any(
        t is not None and t.requires_grad for t in (u, r, sp, sq))
    n_heads, n_kv = u.shape[-2], r.shape[-2]
    grouped = n_kv != n_heads
    if grouped and not inplace:
        # with autograd, one value per query head: the gradient of a broadcast value would be
        # summed over its query heads in another order (float tolerance, not bitwise)
        r, grouped = expand_kv_heads(r, n_heads), False
    if grouped:  # [..., kv, group, d] against [..., kv, 1, d]
        group = n_heads // n_kv
        u, r = u.unflatten(-2, (n_kv, group)), r.unsqueeze(-2)
        sp = None if sp is None else _group_heads(sp, n_kv, group)
        sq = None if sq is None else _group_heads(sq, n_kv, group)
    u_sq = (u * u).sum(-1)
    r_sq = (r * r).sum(-1)
    dot = (u * r).sum(-1)
    degenerate = (r_sq <= eps) | (u_sq <= eps)
    a = torch.where(degenerate, 0.0, dot / torch.where(degenerate, 1.0, r_sq))
    y_par = a.unsqueeze(-1) * r
    if sq is None:
        if sp is None:
            out = u - y_par
        elif inplace:
            out = y_par.mul_(sp).add_(u)
        else:
            out = u + sp * y_par
    else:
        sp = -torch.ones((), dtype=dtype, device=u.device) if sp is None else sp
        out = u + (sp * y_par + sq * (u - y_par))
    return out.flatten(-3, -2) if grouped else out


def _group_heads(s: Tensor, n_kv: int, group: int) -> Tensor:
    """A ``[..., n_heads|1, 1]`` factor laid out as ``[..., n_kv|1, group|1, 1]``."""
    if s.shape[-2] == 1:
        return s.unsqueeze(-2)
    return s.unflatten(-2, (n_kv, group))


# ---------------------------------------------------------------------------------------------
# the attention pattern: hard diagonal removal (DiagonalRemoval)
# ---------------------------------------------------------------------------------------------


def diagonal_removal_factors(pattern: Float[Tensor, "batch n_heads query key"], offset: int,
                             scope: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(selected, factor, diag)``, each ``[batch, n_heads, query]``, of hard diagonal removal.

    ``diag`` is ``A_tt``; ``selected`` the rows that are edited: in ``scope`` (bool, broadcastable
    to ``[batch, n_heads, query]``; None: all) and with off-diagonal mass ``> eps`` (the first
    real token has none and is left as it is); ``factor`` is ``row_sum / off_mass`` there (the
    row keeps its sum) and 1 elsewhere. ``offset``: cached keys before the first query."""
    n_q = pattern.shape[-2]
    idx = torch.arange(n_q, device=pattern.device)
    diag = pattern[:, :, idx, offset + idx]
    row_sum = pattern.sum(-1)
    off_mass = row_sum - diag
    selected = off_mass > eps
    if scope is not None:
        selected = selected & scope
    factor = torch.where(selected, row_sum / torch.where(selected, off_mass, torch.ones_like(off_mass)),
                         torch.ones_like(off_mass))
    return selected, factor, diag


def diagonal_removed(pattern: Float[Tensor, "batch n_heads query key"], offset: int, scope: Tensor | None,
                     eps: float) -> Float[Tensor, "batch n_heads query key"]:
    """The pattern with ``A_tt := 0`` and each edited row renormalised over ``s != t`` so it keeps
    its sum (:func:`diagonal_removal_factors`); in ``pattern``'s dtype. Not V-Para removal."""
    selected, factor, _ = diagonal_removal_factors(pattern, offset, scope, eps)
    n_q, k_len = pattern.shape[-2:]
    idx = torch.arange(n_q, device=pattern.device)
    is_diag = torch.zeros((n_q, k_len), dtype=torch.bool, device=pattern.device)
    is_diag[idx, offset + idx] = True
    edited = pattern * factor.unsqueeze(-1)
    return torch.where(selected.unsqueeze(-1) & is_diag, torch.zeros_like(edited), edited)


def diagonal_removed_aggregate(z: Float[Tensor, "batch query n_heads d_head"],
                               v: Float[Tensor, "batch query n_heads d_head"],
                               pattern: Float[Tensor, "batch n_heads query key"], offset: int,
                               scope: Tensor | None, eps: float) -> Float[Tensor, "batch query n_heads d_head"]:
    """Hard diagonal removal written on the head output, for when only the new positions' values
    are at hand (KV-cached generation): ``z' = factor (z - A_tt v_t)`` on the edited rows, ``z``
    elsewhere (:func:`diagonal_removal_factors`); ``pattern`` in the compute dtype, ``v`` the own
    values with KV heads expanded. Equal to aggregating :func:`diagonal_removed`'s pattern."""
    dtype = pattern.dtype
    selected, factor, diag = (t.transpose(1, 2) for t in diagonal_removal_factors(pattern, offset, scope, eps))
    z32 = z.to(dtype)
    edited = factor.unsqueeze(-1) * (z32 - diag.unsqueeze(-1) * v.to(dtype))
    return torch.where(selected.unsqueeze(-1), edited, z32)


# ---------------------------------------------------------------------------------------------
# the attention pattern: V-Para as a change of A_tt (EffectiveDiagonal)
# ---------------------------------------------------------------------------------------------


def effective_diagonal_pattern(pattern: Float[Tensor, "batch n_heads query key"],
                               v: Float[Tensor, "batch key n_heads d_head"], s_par: Tensor,
                               eps: float) -> Float[Tensor, "batch n_heads query key"]:
    """V-Para in pattern form: ``A_tt += (s_par - 1) beta_t`` with ``beta_t = (o_t . v_t) / ||v_t||^2``
    from the unedited row (``o_t = sum_s A_ts v_s``), in the compute dtype; the row is not renormalised.

    Args:
        pattern: ``[batch, n_heads, query, key]`` with every key of the row (no KV cache).
        v: ``[batch, key, n_heads, d_head]``, the values, KV heads expanded, in the compute dtype.
        s_par: ``[batch|1, query|1, n_heads|1]`` scale in the compute dtype.
    """
    dtype = v.dtype
    o = torch.einsum("bhqk,bkhe->bqhe", pattern.to(dtype), v)
    return diagonal_shifted(pattern.to(dtype), 0, effective_diagonal_shift(o, v, s_par, eps))


def effective_diagonal_shift(o: Float[Tensor, "batch query n_heads d_head"],
                             v: Float[Tensor, "batch query n_heads d_head"], s_par: Tensor,
                             eps: float) -> Float[Tensor, "batch query n_heads"]:
    """``(s_par - 1) beta_t``, the change of ``A_tt`` that V-Para makes, with
    ``beta_t = (o_t . v_t) / ||v_t||^2`` from the unedited aggregate ``o``; in the compute dtype."""
    beta, _, _, _ = projection_coefficient(o, v, eps)  # [batch, q, heads]
    return (s_par - 1.0) * beta


def diagonal_shifted(pattern: Float[Tensor, "batch n_heads query key"], offset: int,
                     add: Float[Tensor, "batch query n_heads"]) -> Float[Tensor, "batch n_heads query key"]:
    """``pattern`` with ``A_tt += add`` (absolute query ``t`` is key ``offset + t``), in the dtype
    of ``pattern`` and ``add`` promoted; the row is not renormalised."""
    n_q, k_len = pattern.shape[-2:]
    idx = torch.arange(n_q, device=pattern.device)
    dtype = torch.promote_types(pattern.dtype, add.dtype)
    shift = torch.zeros((*add.shape[:1], add.shape[2], n_q, k_len), dtype=dtype, device=pattern.device)
    shift[:, :, idx, offset + idx] = add.transpose(1, 2).to(dtype)
    return pattern.to(dtype) + shift


def effective_diagonal_aggregate(z: Float[Tensor, "batch query n_heads d_head"],
                                 v: Float[Tensor, "batch query n_heads d_head"], s_par: Tensor,
                                 eps: float) -> Float[Tensor, "batch query n_heads d_head"]:
    """The same edit on the head output: ``z + (s_par - 1) beta_t v_t`` (``beta_t`` from ``z``,
    the unedited aggregate), in the compute dtype; ``v`` the own values with KV heads expanded,
    ``s_par`` ``[batch|1, query|1, n_heads|1]``."""
    return diagonal_shifted_aggregate(z, v, effective_diagonal_shift(z, v, s_par, eps))


def diagonal_shifted_aggregate(z: Float[Tensor, "batch query n_heads d_head"],
                               v: Float[Tensor, "batch query n_heads d_head"],
                               add: Float[Tensor, "batch query n_heads"]) -> Float[Tensor, "batch query n_heads d_head"]:
    """:func:`diagonal_shifted` written on the head output: ``z + add_t v_t`` (``A_tt += add_t``
    changes the aggregate by ``add_t`` times the own value), in the compute dtype of ``z``."""
    dtype = compute_dtype(z.dtype)
    return z.to(dtype) + add.unsqueeze(-1) * v.to(dtype)


__all__ = [
    "cross_aggregate",
    "diagonal_removal_factors",
    "diagonal_removed",
    "diagonal_removed_aggregate",
    "diagonal_shifted",
    "diagonal_shifted_aggregate",
    "effective_diagonal_aggregate",
    "effective_diagonal_pattern",
    "effective_diagonal_shift",
    "joint_value_delta",
    "joint_value_scaled",
    "residual_parts",
    "residual_scaled",
    "self_weights",
    "steered",
    "steering_delta",
    "steering_shares",
    "value_scaled",
    "value_split_scaled",
]
