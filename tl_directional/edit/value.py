"""Value-space edits: :class:`ValueScale` splits a head's aggregate against each token's own value
vector at ``attn.hook_z`` (METHOD.md sec. 4), per head or over the concatenated heads; the math is
:mod:`tl_directional.edit.forms` (``value_scaled``, ``value_split_scaled``, ``joint_value_scaled``).
"""

from __future__ import annotations

import torch
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
    _query_offset,
    _store_first,
    _store_pattern,
    track_attention_mask,
)
from .forms import (
    cross_aggregate,
    joint_value_scaled,
    self_weights,
    value_scaled,
    value_split_scaled,
)
from .tensors import (
    ScaleSpec,
    cast_back,
    heads_mask,
    row_scale,
    scale_minus_one,
    scale_specs,
)


class ValueScale(_HeadScoped):
    """Scale a head's aggregate against each token's own value vector, at ``attn.hook_z``.

    ``mode="full"`` (V-Para): ``y = o_t`` split against ``v_t``.
    ``mode="exclusive"`` (self kept): ``y = c_t = o_t - A_tt v_t`` split against ``v_t``,
    result ``A_tt v_t + y~``. Works during KV-cached generation (``hook_v`` then holds
    the new positions, which are exactly the query positions ``hook_z`` sees).

    ``joint=False``: one split per head (``y`` and ``v_t`` of width ``d_head``). ``joint=True``:
    the paper's inference edit (its revision's appendix, "Forward-hook implementation"): one
    split per token of all heads concatenated (width ``n_heads * d_head``, grouped KV heads
    expanded to the query heads first); scales are then per layer at most (a float, a
    ``[n_layers]`` tensor or a batch scale) and ``heads`` must be None (METHOD.md sec. 4).
    """

    def __init__(self, s_par=1.0, s_perp=1.0, mode: str = "full", layers=None, heads=None,
                 positions=None, eps: float = DEFAULT_EPS, joint: bool = False):
        if mode not in ("full", "exclusive"):
            raise ValueError(f"mode must be 'full' (V-Para) or 'exclusive' (self kept), got {mode!r}")
        if not isinstance(joint, bool):
            raise TypeError(f"joint must be True (one split over the concatenated heads, the paper's form) "
                            f"or False (one split per head), got {joint!r}")
        if joint and heads is not None:
            raise ValueError(f"heads={heads!r} with joint=True: the joint split covers every head at once; "
                             "pass heads=None, or joint=False to edit single heads")
        self.s_par, self.s_perp, self.mode, self.joint = s_par, s_perp, mode, joint
        self.layers, self.heads, self.positions = layers, heads, positions
        self.eps = _check_eps(eps)

    def __repr__(self) -> str:
        joint = ", joint=True" if self.joint else ""
        return (f"ValueScale(s_par={self.s_par}, s_perp={self.s_perp}, mode={self.mode!r}, layers={self.layers}, "
                f"heads={self.heads}{joint})")

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        s_par, s_perp = scale_specs(self, sites.n_layers, sites.n_heads, allow_heads=not self.joint)
        head_mask = heads_mask(self.heads, sites.n_heads)
        hooks: HookList = []
        for L in self._layers(sites):
            vs = sites.value[L]
            state: dict = {}
            hooks.append((vs.v_hook, _store_first(state, "v")))
            need_pattern = self.mode == "exclusive" or self.positions is not None
            if need_pattern:
                hooks.append((vs.pattern_hook, _store_pattern(state)))
            hooks.append((vs.z_hook, self._edit_hook(L, sites, state, s_par, s_perp, head_mask, need_pattern)))
        return hooks

    def _edit_hook(self, layer, sites, state, s_par, s_perp, head_mask, need_pattern):
        def hook(z: Float[Tensor, "batch pos n_heads d_head"], hook):  # noqa: ARG001
            v = state.get("v")
            if v is None or v.shape[1] != z.shape[1]:
                raise RuntimeError(
                    f"ValueScale at layer {layer}: hook_v did not fire with the same positions "
                    "as hook_z in this forward pass; this model's attention is not supported"
                )
            pattern = state.pop("pattern", None)
            if need_pattern and pattern is None:
                raise RuntimeError(
                    f"ValueScale(mode={self.mode!r}) at layer {layer}: hook_pattern fires after "
                    "hook_z on this model, so A_tt / absolute positions are unknown at hook_z. "
                    "Use mode='full' without positions on this architecture."
                )
            batch, n_q = z.shape[:2]
            dtype = compute_dtype(z.dtype)
            offset = 0 if pattern is None else _query_offset(pattern, n_q)
            if self.joint:
                sp = row_scale(self, s_par, layer, batch, n_q, offset, None, z.device, dtype)[..., 0]
                sq = row_scale(self, s_perp, layer, batch, n_q, offset, None, z.device, dtype)[..., 0]
                v_full = sites.expand_kv(v).to(dtype)
                y = z.to(dtype) if self.mode == "full" else \
                    cross_aggregate(z, v_full, self_weights(pattern, offset), dtype)
                return cast_back(joint_value_scaled(z, y, v_full, sp, sq, self.eps), z, self, layer)
            if self.mode == "full":
                # V-Para in fewer passes (forms.value_split_scaled): the same numbers as
                # forms.value_scaled, with the scale factors kept between forward passes
                spm1, sqm1 = factors(batch, n_q, offset, z.device, dtype, compute_dtype(torch.promote_types(z.dtype, v.dtype)))
                return cast_back(value_split_scaled(z, v, spm1, sqm1, self.eps), z, self, layer)
            sp = row_scale(self, s_par, layer, batch, n_q, offset, head_mask, z.device, dtype)
            sq = row_scale(self, s_perp, layer, batch, n_q, offset, head_mask, z.device, dtype)
            v_full = sites.expand_kv(v)
            y = cross_aggregate(z, v_full, self_weights(pattern, offset), dtype)
            return cast_back(value_scaled(z, y, v_full, sp, sq, self.eps), z, self, layer)

        factors = _ScaleFactors(self, layer, s_par, s_perp, head_mask)
        return hook


class _ScaleFactors:
    """``(s_par - 1, s_perp - 1)`` of a head-scoped edit at one layer as
    :func:`~tl_directional.edit.tensors.value_split_scaled` takes them (None where exactly -1 /
    exactly 0), from :func:`~tl_directional.edit.tensors.row_scale`. Without a position scope or a
    scale that needs gradients they do not change from one forward pass to the next, so they
    are kept per ``(batch, device, dtype)`` (and the scale tensors' in-place versions)."""

    def __init__(self, edit, layer: int, s_par: ScaleSpec, s_perp: ScaleSpec, head_mask):
        self.edit, self.layer, self.s_par, self.s_perp, self.head_mask = edit, layer, s_par, s_perp, head_mask
        self.keep = edit.positions is None and not (s_par.tensor.requires_grad or s_perp.tensor.requires_grad)
        self.kept: dict = {}

    def __call__(self, batch: int, n_q: int, offset: int, device, dtype, split_dtype):
        """The factors for a forward pass of ``batch`` rows and ``n_q`` query positions after
        ``offset`` cached ones: the scales formed in ``dtype`` (the head output's compute
        dtype), then ``s - 1`` in ``split_dtype`` (the split's), as ``component_delta`` forms them."""
        key = (batch, device, dtype, split_dtype, self.s_par.tensor._version, self.s_perp.tensor._version)
        got = self.kept.get(key) if self.keep else None
        if got is None:
            e, L, hm = self.edit, self.layer, self.head_mask
            sp = row_scale(e, self.s_par, L, batch, n_q, offset, hm, device, dtype)
            sq = row_scale(e, self.s_perp, L, batch, n_q, offset, hm, device, dtype)
            spm1, sqm1 = scale_minus_one(sp.to(split_dtype)), scale_minus_one(sq.to(split_dtype))
            exact = not (spm1.requires_grad or sqm1.requires_grad)
            got = (None if exact and bool((spm1 == -1).all()) else spm1,
                   None if exact and bool((sqm1 == 0).all()) else sqm1)
            if self.keep:
                if len(self.kept) > 8:
                    self.kept.clear()
                self.kept[key] = got
        return got


__all__ = ["ValueScale"]
