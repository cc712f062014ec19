"""Edits of the attention pattern at ``attn.hook_pattern``: :class:`DiagonalRemoval` (hard removal
of ``A_tt``, row renormalised) and :class:`EffectiveDiagonal` (V-Para as a change of ``A_tt``); the
math is :mod:`tl_directional.edit.forms` (``diagonal_removed``, ``effective_diagonal_pattern``).
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from ..core.geometry import DEFAULT_EPS, compute_dtype
from ..model.sites import (
    resolve_sites,
)
from .base import (
    HookList,
    _check_eps,
    _HeadScoped,
    _pattern_order_guard,
    _store_first,
    track_attention_mask,
)
from .forms import (
    diagonal_removed,
    effective_diagonal_pattern,
)
from .tensors import (
    cast_back,
    heads_mask,
    pattern_scope,
    query_mask,
    row_scale,
    scale_specs,
)


class DiagonalRemoval(_HeadScoped):
    """Hard diagonal removal at ``attn.hook_pattern``: ``A_tt := 0``, renormalise the row
    over ``s != t`` so it keeps its sum. Rows with no off-diagonal mass (``<= eps``; the
    first real token) are left unchanged. This is *not* V-Para removal."""

    def __init__(self, layers=None, heads=None, positions=None, eps: float = 1e-9):
        self.layers, self.heads, self.positions = layers, heads, positions
        self.eps = _check_eps(eps)

    def __repr__(self) -> str:
        return f"DiagonalRemoval(layers={self.layers}, heads={self.heads})"

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        head_mask = heads_mask(self.heads, sites.n_heads)
        hooks: HookList = []
        for L in self._layers(sites):
            vs = sites.value[L]
            state: dict = {}
            hooks.append((vs.pattern_hook, self._edit_hook(L, state, head_mask)))
            hooks.append((vs.z_hook, _pattern_order_guard(state, L, "DiagonalRemoval")))
        return hooks

    def _edit_hook(self, layer, state, head_mask):
        def hook(pattern: Float[Tensor, "batch n_heads query key"], hook):  # noqa: ARG001
            state["pattern_seen"] = True
            batch, n_heads, n_q, k_len = pattern.shape
            offset = k_len - n_q
            scope = pattern_scope(head_mask, query_mask(self, batch, n_q, offset, pattern.device), pattern.device)
            return diagonal_removed(pattern, offset, scope, self.eps)

        return hook


class EffectiveDiagonal(_HeadScoped):
    """V-Para in pattern form, at ``attn.hook_pattern``: ``A_tt += (s_par - 1) * beta_t``
    with ``beta_t = (o_t . v_t) / ||v_t||^2`` from the unedited row. Equals
    ``ValueScale(s_par, mode="full")`` exactly; at ``s_par = 0`` the diagonal becomes
    ``-gamma_t`` (possibly negative: the row is not renormalised). Needs every value of
    the row, so not usable during KV-cached generation (use ValueScale there)."""

    def __init__(self, s_par=1.0, layers=None, heads=None, positions=None, eps: float = DEFAULT_EPS):
        self.s_par = s_par
        self.layers, self.heads, self.positions = layers, heads, positions
        self.eps = _check_eps(eps)

    def __repr__(self) -> str:
        return f"EffectiveDiagonal(s_par={self.s_par}, layers={self.layers}, heads={self.heads})"

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        (s_par,) = scale_specs(self, sites.n_layers, sites.n_heads, names=("s_par",))
        head_mask = heads_mask(self.heads, sites.n_heads)
        hooks: HookList = []
        for L in self._layers(sites):
            vs = sites.value[L]
            state: dict = {}
            hooks.append((vs.v_hook, _store_first(state, "v")))
            hooks.append((vs.pattern_hook, self._edit_hook(L, sites, state, s_par, head_mask)))
            hooks.append((vs.z_hook, _pattern_order_guard(state, L, "EffectiveDiagonal")))
        return hooks

    def _edit_hook(self, layer, sites, state, s_par, head_mask):
        def hook(pattern: Float[Tensor, "batch n_heads query key"], hook):  # noqa: ARG001
            state["pattern_seen"] = True
            v = state.get("v")
            batch, n_heads, n_q, k_len = pattern.shape
            if v is None or v.shape[1] != k_len or k_len != n_q:
                raise RuntimeError(
                    f"EffectiveDiagonal at layer {layer} needs the value of every key of the row, "
                    f"but hook_v holds {None if v is None else v.shape[1]} positions for {k_len} keys "
                    "(KV-cached generation?). Use ValueScale(mode='full') there: it is the same edit."
                )
            dtype = compute_dtype(pattern.dtype)
            v_full = sites.expand_kv(v).to(dtype)  # [batch, key, heads, e]
            s = row_scale(self, s_par, layer, batch, n_q, 0, head_mask, pattern.device, dtype)
            return cast_back(effective_diagonal_pattern(pattern, v_full, s, self.eps), pattern, self, layer)

        return hook


__all__ = ["DiagonalRemoval", "EffectiveDiagonal"]
