"""The HF edit path's per-forward state and the edits of value space and of the attention
pattern as functions of the o_proj input ``z``, the own values ``v`` and the attention weights
(METHOD.md sec. 4): where those tensors come from; the math is :mod:`tl_directional.edit.forms`'s,
the same functions the TransformerLens hooks call. :mod:`tl_directional.edit.hf.edits` installs
them as module hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...core.geometry import compute_dtype, projection_coefficient
from ...model.hf_layout import HFSites
from ..base import Edit
from ..forms import (
    cross_aggregate,
    diagonal_removed,
    diagonal_removed_aggregate,
    diagonal_shifted,
    diagonal_shifted_aggregate,
    effective_diagonal_shift,
    joint_value_scaled,
    self_weights,
    value_scaled,
)
from ..pattern import DiagonalRemoval, EffectiveDiagonal
from ..residual import ResidualScale
from ..tensors import cast_back, heads_mask, pattern_scope, query_mask, row_scale, scale_specs
from ..value import ValueScale


class _Run:
    """Per-forward facts for the hooks: the KV-cache offset, whether the edits are on for this
    call (``when``), and the parallel-share meter (energy sums per edit and layer)."""

    def __init__(self, when: Callable[[], bool] | None = None) -> None:
        self.offset = 0
        self.saved: list[Any] = []
        self.when = when
        self.on = True
        self.measure = False
        self.meter: dict[str, list[float]] = {}

    def record(self, key: str, y: Tensor, ref: Tensor, eps: float) -> None:
        """Add ``sum ||y_par||^2`` and ``sum ||y||^2`` over tokens (and heads) to ``key``; the
        first absolute position (the attention sink / BOS) is left out."""
        if not self.measure:
            return
        with torch.no_grad():
            a, degenerate, u_sq, r_sq = projection_coefficient(y.detach(), ref.detach(), eps)
            par_sq = a * a * r_sq
            keep = ~degenerate
            if self.offset == 0 and keep.shape[1] > 1:
                keep[:, 0] = False
            sums = self.meter.setdefault(key, [0.0, 0.0])
            sums[0] += float(par_sq[keep].sum())
            sums[1] += float(u_sq[keep].sum())


def edit_label(e: Edit) -> str:
    """The edit-space name of ``e`` (as in :data:`tl_directional.edit.EDIT_SPACES`): ``value``,
    ``value-exclusive``, ``resid-attn``, ``resid-mlp``, ``block``, ``hard-diag``, ``eff-diag``."""
    if isinstance(e, ValueScale):
        return ("value" if e.mode == "full" else "value-exclusive") + ("-joint" if e.joint else "")
    if isinstance(e, ResidualScale):
        return "block" if e.component == "block" else f"resid-{e.component}"
    return "hard-diag" if isinstance(e, DiagonalRemoval) else "eff-diag"


def _value_chain_fn(e: Edit, layer: int, sites: HFSites, run: _Run) -> Callable:
    """``(z, v, weights) -> z'`` for one value-space edit at ``layer``; for a pattern edit
    ``(z, v, weights, carry=True) -> (z', weights')``, the head output and the pattern after the
    edit (``weights'`` None when ``weights`` is; with ``carry=False``, when no later edit reads
    the pattern's values, ``weights`` itself, which still gives the key offset).

    ``z``: ``[batch, q, n_heads, d_head]`` (o_proj input); ``v``: ``[batch, q, n_heads, d_head]``
    (own values, KV heads expanded); ``weights``: ``[batch, n_heads, q, k]`` or None."""
    head_mask = heads_mask(e.heads, sites.n_heads)
    if isinstance(e, ValueScale):
        s_par, s_perp = scale_specs(e, sites.n_layers, sites.n_heads, allow_heads=not e.joint)
    else:
        (s_par,) = scale_specs(e, sites.n_layers, sites.n_heads, names=("s_par",)) if isinstance(e, EffectiveDiagonal) else (None,)
        s_perp = None

    key = f"{edit_label(e)}/L{layer}"

    def offset_of(z: Tensor, weights: Tensor | None) -> int:
        return run.offset if weights is None else weights.shape[-1] - z.shape[1]

    if isinstance(e, ValueScale):
        def fn(z, v, weights):
            batch, n_q = z.shape[:2]
            dtype = compute_dtype(z.dtype)
            off = offset_of(z, weights)
            sp = row_scale(e, s_par, layer, batch, n_q, off, head_mask, z.device, dtype)
            sq = row_scale(e, s_perp, layer, batch, n_q, off, head_mask, z.device, dtype)
            y = z if e.mode == "full" else cross_aggregate(z, v, self_weights(weights, off), dtype)
            if e.joint:  # one split over the concatenated heads (the scales are per token)
                run.record(key, y.flatten(-2), v.flatten(-2), e.eps)
                edited = joint_value_scaled(z, y.to(dtype), v.to(dtype), sp[..., 0], sq[..., 0], e.eps)
            else:
                run.record(key, y, v, e.eps)
                edited = value_scaled(z, y, v, sp, sq, e.eps)
            return cast_back(edited, z, e, layer)
    elif isinstance(e, EffectiveDiagonal):
        def fn(z, v, weights, carry=True):
            batch, n_q = z.shape[:2]
            dtype = compute_dtype(z.dtype)
            off = offset_of(z, weights)
            s = row_scale(e, s_par, layer, batch, n_q, off, head_mask, z.device, dtype)
            run.record(key, z, v, e.eps)
            add = effective_diagonal_shift(z, v, s, e.eps)
            z_new = cast_back(diagonal_shifted_aggregate(z, v, add), z, e, layer)
            return z_new, (diagonal_shifted(weights, off, add) if carry and weights is not None else weights)
    else:  # DiagonalRemoval: A_tt := 0, row renormalised over s != t
        def fn(z, v, weights, carry=True):
            batch, n_q = z.shape[:2]
            dtype = compute_dtype(z.dtype)
            off = offset_of(z, weights)
            w = weights.to(dtype)
            run.record(key, z, v, 1e-12)
            scope = pattern_scope(head_mask, query_mask(e, batch, n_q, off, z.device), z.device)
            if off == 0 and w.shape[-1] == n_q:
                # every key's value is here (no KV cache): aggregate the edited pattern again,
                # the TransformerLens lane's order of operations (A' v as eager attention does it)
                w_new = diagonal_removed(w, 0, scope, e.eps)
                z_new = torch.matmul(w_new, v.to(dtype).transpose(1, 2)).transpose(1, 2)
                return cast_back(z_new, z, e, layer), w_new
            z_new = cast_back(diagonal_removed_aggregate(z, v, w, off, scope, e.eps), z, e, layer)
            return z_new, (diagonal_removed(w, off, scope, e.eps) if carry else weights)
    return fn
