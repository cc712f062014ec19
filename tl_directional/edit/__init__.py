"""Edit: component-scaling hook functions for TransformerLens workflows (METHOD.md sec. 4).

Every edit is an object with ``.fwd_hooks(model)``, a list of
``(hook_name, hook_fn)`` pairs for ``model.run_with_hooks(..., fwd_hooks=...)``
or ``with model.hooks(fwd_hooks=...)``; :func:`apply_edits` is a context
manager doing the latter for several edits, always removing its hooks.

One scaling form everywhere: ``y~ = s_par * y_par + s_perp * y_perp``, applied
as ``y + (s_par - 1) y_par + (s_perp - 1) y_perp`` so scale 1 is a bit-exact
no-op. Edits are differentiable (nothing is detached) so training can use them.

Scopes: ``layers`` (None = all), ``heads`` (value space and pattern edits; query
heads, GQA-aware), ``positions`` (absolute query positions: int, list, slice, or
bool mask ``[pos]`` / ``[batch, pos]``; right during KV-cached generation).
Scales: a float; a ``[n_layers]`` tensor (per layer); a ``[n_layers, n_heads]``
tensor (per layer and head); or :func:`scales` with named axes, e.g.
``scales(t, "batch")`` to stack settings along the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.geometry import DEFAULT_EPS, component_delta, compute_dtype, projection_coefficient
from ..model.generation import FORWARD
from ..model.sites import (
    COMPONENTS,
    check_component,
    resolve_sites,
)
from .base import Edit, HookList
from .carrier import MLPCarrierScale
from .tensors import (
    NonFiniteEditError,
    Scales,
    ScaleSpec,
    cast_back,
    heads_mask,
    joint_value_delta,
    query_mask,
    row_scale,
    scale_minus_one,
    scale_specs,
    scales,
    value_split_scaled,
)

_MISSING = object()


class _MaskTrackingForward:
    """The instance ``forward`` that :func:`track_attention_mask` installs: the class's own
    forward, with the call's ``attention_mask`` visible to the edits. An object, not a
    closure, so ``copy.deepcopy`` / pickling of the model carry it to the copy."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        m = kwargs.get("attention_mask")
        before = FORWARD.attention_mask
        FORWARD.attention_mask = m if isinstance(m, Tensor) and m.ndim == 2 else None
        try:
            return type(self.module).forward(self.module, *args, **kwargs)
        finally:
            FORWARD.attention_mask = before


def track_attention_mask(model) -> None:
    """Let the edits see the ``attention_mask`` keyword of each forward pass (idempotent).

    :func:`edit_hooks` calls it, and the tracking stays on the model after that call (the hooks
    it returns are run later, by ``run_with_hooks`` or ``model.hooks``); :func:`apply_edits`
    removes it again on exit.

    Sets the instance's ``forward`` (not a module pre-hook: TL 2's ``run_with_hooks`` and
    ``generate`` call ``model.forward`` directly, which module hooks do not see); the mask
    is set for the duration of the call and restored after it, also on errors."""
    if not isinstance(model, torch.nn.Module) or isinstance(model.__dict__.get("forward"), _MaskTrackingForward):
        return
    if "forward" in model.__dict__:
        return  # someone else's instance forward: leave it (negative positions count from the end)
    object.__setattr__(model, "forward", _MaskTrackingForward(model))


def _check_eps(eps) -> float:
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite float >= 0 (a degeneracy threshold on squared norms), got "
                         f"{eps!r}; leave it out for the default or pass e.g. eps=1e-12")
    return float(eps)


def _check_reference(reference: Tensor, eps: float) -> None:
    """Refuse a fixed reference that is not finite or has a zero direction anywhere (squared norm
    ``<= eps`` over its last axis): the split treats such a token as degenerate and leaves its
    update unscaled, so a zero probe direction would read as "this part does not matter"."""
    if reference.ndim == 0 or reference.numel() == 0:
        raise ValueError(f"reference must be a [d_model] direction (or broadcastable to [batch, pos, d_model]), "
                         f"got shape {tuple(reference.shape)}")
    r = reference.detach()
    if not bool(torch.isfinite(r).all()):
        raise ValueError("reference has non-finite values; pass a finite [d_model] direction")
    sq = r.to(torch.float64).square().sum(-1)
    zero = int((sq <= eps).sum())
    if zero:
        where = "it is" if sq.numel() == 1 else f"{zero} of its {sq.numel()} directions are"
        raise ValueError(
            f"reference has a zero direction ({where} zero, squared norm <= eps={eps:g}): the split leaves "
            "an update with no reference direction unscaled, so the edit would silently do nothing there; "
            "pass a nonzero direction (e.g. a probe's weight vector), or reference=None to split against "
            "the stream")


class ResidualScale(Edit):
    """Scale the parallel / perpendicular parts of a residual-space update.

    ``component``: ``"attn"``, ``"mlp"`` or ``"block"``. The update is split against
    the stream it is added to (METHOD.md sec. 2), read live so composed edits see
    the already edited stream, or against ``reference`` (a ``[d_model]`` direction
    or any tensor broadcastable to ``[batch, pos, d_model]``, e.g. a probe vector).
    Edited at the unit's update hook (``hook_attn_out`` / ``hook_mlp_out`` /
    ``hook_resid_post``; ``attn.o.hook_out`` / ``mlp.hook_out`` on post-LN bridges).
    """

    def __init__(self, component: str, s_par=1.0, s_perp=1.0, layers=None, positions=None,
                 reference: Tensor | None = None, eps: float = DEFAULT_EPS):
        check_component(component)
        if reference is not None and not isinstance(reference, Tensor):
            raise TypeError(f"reference must be a tensor (a [d_model] direction), got {type(reference).__name__}")
        self.component = component
        self.s_par, self.s_perp = s_par, s_perp
        self.layers, self.positions, self.reference = layers, positions, reference
        self.eps = _check_eps(eps)
        if reference is not None:
            _check_reference(reference, self.eps)

    def __repr__(self) -> str:
        return f"ResidualScale({self.component!r}, s_par={self.s_par}, s_perp={self.s_perp}, layers={self.layers})"

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        check_component(self.component, sites)
        if self.reference is not None and self.reference.shape[-1] != sites.d_model:
            raise ValueError(f"reference has size {self.reference.shape[-1]} but d_model is {sites.d_model}")
        kw = dict(n_layers=sites.n_layers, n_heads=sites.n_heads, allow_heads=False)
        s_par = ScaleSpec(self.s_par, argument="s_par", **kw)
        s_perp = ScaleSpec(self.s_perp, argument="s_perp", **kw)
        hooks: HookList = []
        for L in self._layers(sites):
            unit = sites.unit(self.component, L)
            state: dict = {}
            hooks.append((unit.reference_hook, _store_first(state, "ref")))
            if self.positions is not None:
                hooks.append((sites.value[L].pattern_hook, _track_key_length(state)))
            hooks.append((unit.update_hook, self._edit_hook(L, unit.update_is_difference, state, s_par, s_perp)))
        return hooks

    def _edit_hook(self, layer, is_difference, state, s_par, s_perp):
        def hook(tensor: Float[Tensor, "batch pos d_model"], hook):  # noqa: ARG001
            stream = state["ref"]
            ref = stream if self.reference is None else self.reference.to(tensor.device, tensor.dtype)
            update = tensor - stream if is_difference else tensor
            batch, n_q = tensor.shape[:2]
            dtype = compute_dtype(tensor.dtype)
            sp = s_par.at(layer, batch, tensor.device, dtype)[:, :1]  # [B|1, 1]
            sq = s_perp.at(layer, batch, tensor.device, dtype)[:, :1]
            offset = state.get("k_len", n_q) - n_q
            pm = query_mask(self, batch, n_q, offset, tensor.device)
            if pm is not None:
                sp = torch.where(pm, sp, torch.ones_like(sp))
                sq = torch.where(pm, sq, torch.ones_like(sq))
            delta = component_delta(update, ref, sp, sq, self.eps)
            return cast_back(tensor.to(delta.dtype) + delta, tensor, self, layer)

        return hook


def _store_first(state: dict, key: str):
    """Hook storing the tensor under ``key``; it is the first of the edit's hooks to fire
    in a layer, so it also clears what the previous forward pass left."""

    def hook(tensor, hook):  # noqa: ARG001
        state.clear()
        state[key] = tensor
        return tensor

    return hook


def _track_key_length(state: dict):
    def hook(pattern, hook):  # noqa: ARG001
        state["k_len"] = pattern.shape[-1]
        return pattern

    return hook


def _query_offset(pattern_or_klen, n_query: int) -> int:
    k_len = pattern_or_klen if isinstance(pattern_or_klen, int) else pattern_or_klen.shape[-1]
    return k_len - n_query


class _HeadScoped(Edit):
    """Shared scoping for per-head edits (value space and pattern form)."""


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
                y = z.to(dtype)
                if self.mode == "exclusive":
                    idx = torch.arange(n_q, device=z.device)
                    y = y - pattern[:, :, idx, offset + idx].transpose(1, 2).to(dtype).unsqueeze(-1) * v_full
                delta = joint_value_delta(y, v_full, sp, sq, self.eps)
                return cast_back(z.to(delta.dtype) + delta, z, self, layer)
            if self.mode == "full":
                # V-Para in fewer passes (edit_math.value_split_scaled): the same numbers as the
                # general form below, which it was
                spm1, sqm1 = factors(batch, n_q, offset, z.device, dtype, compute_dtype(torch.promote_types(z.dtype, v.dtype)))
                return cast_back(value_split_scaled(z, v, spm1, sqm1, self.eps), z, self, layer)
            sp = row_scale(self, s_par, layer, batch, n_q, offset, head_mask, z.device, dtype)
            sq = row_scale(self, s_perp, layer, batch, n_q, offset, head_mask, z.device, dtype)
            v_full = sites.expand_kv(v)
            idx = torch.arange(n_q, device=z.device)
            a_tt = pattern[:, :, idx, offset + idx].transpose(1, 2)  # [batch, q, heads]
            y = z.to(dtype) - a_tt.to(dtype).unsqueeze(-1) * v_full.to(dtype)
            delta = component_delta(y, v_full, sp, sq, self.eps)
            return cast_back(z.to(delta.dtype) + delta, z, self, layer)

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


def _store_pattern(state: dict):
    def hook(pattern, hook):  # noqa: ARG001
        state["pattern"] = pattern
        return pattern

    return hook


def _pattern_order_guard(state: dict, layer: int, edit_name: str):
    """Read-only hook at hook_z: the pattern edit must have run before z was formed."""

    def hook(z, hook):  # noqa: ARG001
        if not state.pop("pattern_seen", False):
            raise RuntimeError(
                f"{edit_name} at layer {layer}: hook_pattern did not fire before hook_z, so an edit "
                "of the pattern would not reach the head output on this model. Use ValueScale "
                "(hook_z form) instead."
            )
        return z

    return hook


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
            idx = torch.arange(n_q, device=pattern.device)
            is_diag = torch.zeros((n_q, k_len), dtype=torch.bool, device=pattern.device)
            is_diag[idx, offset + idx] = True
            diag = pattern[:, :, idx, offset + idx]  # [batch, heads, q]
            row_sum = pattern.sum(-1)
            off_mass = row_sum - diag
            selected = off_mass > self.eps
            if head_mask is not None:
                selected = selected & head_mask.to(pattern.device).view(1, -1, 1)
            pm = query_mask(self, batch, n_q, offset, pattern.device)
            if pm is not None:
                selected = selected & pm.unsqueeze(1)
            factor = torch.where(selected, row_sum / torch.where(selected, off_mass, torch.ones_like(off_mass)),
                                 torch.ones_like(off_mass))
            edited = pattern * factor.unsqueeze(-1)
            return torch.where(selected.unsqueeze(-1) & is_diag, torch.zeros_like(edited), edited)

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
            o = torch.einsum("bhqk,bkhe->bqhe", pattern.to(dtype), v_full)
            beta, _, _, _ = projection_coefficient(o, v_full, self.eps)  # [batch, q, heads]
            s = row_scale(self, s_par, layer, batch, n_q, 0, head_mask, pattern.device, dtype)
            add = ((s - 1.0) * beta).transpose(1, 2)  # [batch, heads, q]
            return cast_back(pattern.to(dtype) + torch.diag_embed(add), pattern, self, layer)

        return hook


# ---------------------------------------------------------------------------------------------
# Named edit spaces: one vocabulary for sweeps, training variants, views and the CLI
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EditSpace:
    """A named way to turn ``(s_par, s_perp)`` and a scope into edits.

    ``description`` says in which space the split is made and against which reference;
    ``build(s_par, s_perp, layers=..., positions=...[, heads=...])`` returns the edits (a
    list: ``resid-both`` is two). ``scaled``: False where the edit has no scale (``hard-diag``:
    ``s_par`` / ``s_perp`` are ignored); ``perp``: False where only the parallel part is
    scaled (``s_perp`` must be 1); ``heads``: whether the edit can be scoped to heads (value
    space and the pattern; not a residual-stream update).
    """

    name: str
    description: str
    build: Callable[..., list[Edit]]
    scaled: bool = True
    perp: bool = True
    heads: bool = True

    def check_scales(self, s_perp) -> None:
        """Raise where ``s_perp`` is not 1 (or None) in a space that scales only the parallel part."""
        # pattern-form V-Para has no perpendicular scale; a silently ignored s_perp would lie
        if self.scaled and not self.perp and s_perp is not None and not (
                isinstance(s_perp, (int, float)) and s_perp == 1.0):
            raise ValueError(f"space {self.name!r} scales only the parallel part: s_perp must be 1, got {s_perp!r}")


def _value(mode: str, joint: bool = False):
    return lambda sp, sq, **scope: [ValueScale(sp, sq, mode=mode, joint=joint, **scope)]


def _residual(*components: str):
    return lambda sp, sq, **scope: [ResidualScale(c, sp, sq, **scope) for c in components]


def _carrier(site: str):
    return lambda sp, sq, **scope: [MLPCarrierScale(sp, sq, site=site, **scope)]


_SPACE_LIST = (
    EditSpace("value", "value space, full aggregate vs own value (V-Para), attn.hook_z", _value("full")),
    EditSpace("value-exclusive", "value space, cross aggregate vs own value, self message kept, attn.hook_z",
              _value("exclusive")),
    EditSpace("value-joint", "value space, full aggregate vs own value, one split over the concatenated heads "
              "(the paper's form), attn.hook_z", _value("full", joint=True), heads=False),
    EditSpace("value-exclusive-joint", "value space, cross aggregate vs own value, self message kept, one split "
              "over the concatenated heads (the paper's form), attn.hook_z", _value("exclusive", joint=True),
              heads=False),
    EditSpace("resid-attn", "residual space, attention update vs resid_pre", _residual("attn"), heads=False),
    EditSpace("resid-mlp", "residual space, MLP update vs its reference", _residual("mlp"), heads=False),
    EditSpace("resid-both", "residual space, attention and MLP updates", _residual("attn", "mlp"), heads=False),
    EditSpace("block", "residual space, block update (resid_post - resid_pre) vs resid_pre", _residual("block"),
              heads=False),
    EditSpace("hard-diag", "hard diagonal removal in the pattern (A_tt := 0, renormalised); scales ignored",
              lambda sp, sq, **scope: [DiagonalRemoval(**scope)], scaled=False, perp=False),
    EditSpace("eff-diag", "effective diagonal in the pattern, A_tt += (s_par - 1) beta_t (s_perp must be 1)",
              lambda sp, sq, **scope: [EffectiveDiagonal(sp, **scope)], perp=False),
    EditSpace("mlp-carrier-input", "MLP carrier, each d_model-wide block of the carrier h split against the MLP "
              "input x, before W_down (mlp.hook_post)", _carrier("input"), heads=False),
    EditSpace("mlp-carrier-block", "MLP carrier, each block's contribution W_down[:, I_g] h_g split against "
              "h_g, before the sum (the down projection's output)", _carrier("block"), heads=False),
)

#: The named edit spaces (read-only), by name: the sweep's spaces, the training variants' edits,
#: the attention triptych's edits and the CLI's ``--space`` choices.
EDIT_SPACES: Mapping[str, EditSpace] = MappingProxyType({s.name: s for s in _SPACE_LIST})


def edit_space(name: str, argument: str = "edit space") -> EditSpace:
    """The :class:`EditSpace` called ``name``; a ValueError naming ``argument``, the value and
    the valid names otherwise."""
    space = EDIT_SPACES.get(name) if isinstance(name, str) else None
    if space is None:
        raise ValueError(f"{argument} must be one of {', '.join(EDIT_SPACES)}, got {name!r}")
    return space


def edits_for_space(name: str, s_par=1.0, s_perp=1.0, layers=None, *, heads=None, positions=None) -> list[Edit]:
    """The edits of edit space ``name`` (a key of :data:`EDIT_SPACES`) at these scales.

    ``s_par`` / ``s_perp`` take anything the edits take (a float, a per-layer tensor,
    :func:`scales`); ``layers`` is None (all) or a list of layer indices; ``heads`` (query
    heads, value and pattern spaces only) and ``positions`` scope the edits as in the edit
    classes. ``hard-diag`` ignores the scales; ``eff-diag`` needs ``s_perp`` 1 (or None).
    """
    space = edit_space(name)
    space.check_scales(s_perp)
    scope = {"layers": None if layers is None else list(layers), "positions": positions}
    if space.heads:
        scope["heads"] = heads
    elif heads is not None:
        raise ValueError(f"space {name!r} edits a residual-stream update, which has no heads: heads must be None, "
                         f"got {heads!r}; use a value or pattern space ('value', 'hard-diag', 'eff-diag') for heads")
    return space.build(s_par, s_perp, **scope)


def edit_hooks(model, *edits: Any) -> HookList:
    """All forward hooks of ``edits`` for ``model``, in order (so they compose in order)."""
    hooks: HookList = []
    for i, e in enumerate(edits):
        if not isinstance(e, Edit):
            raise TypeError(
                f"edits[{i}] is a {type(e).__name__}, not an edit; pass ResidualScale, ValueScale, "
                "DiagonalRemoval or EffectiveDiagonal objects"
            )
        hooks += e.fwd_hooks(model)
    track_attention_mask(model)
    return hooks


@contextmanager
def apply_edits(model, *edits: Any):
    """Context manager: ``with apply_edits(model, ValueScale(0.0)): model(tokens)``.

    Hooks are added in order (edits compose in order, each taking its reference
    from the live, already edited stream) and always removed on exit, also when
    the body raises. The model itself is not changed: on exit, normal or raising, its
    ``__dict__`` is restored exactly (what the block set on the instance, such as the
    attention-mask tracking ``forward`` of :func:`track_attention_mask`, goes; what it replaced
    comes back). ``model.generate`` inside the block gives a manual greedy loop's tokens when it
    was fixed at load (:func:`~tl_directional.model.load.load_model`) or by
    :func:`tl_directional.model.generation.fix_generate`.
    """
    before = dict(model.__dict__)
    try:
        hooks = edit_hooks(model, *edits)
        with model.hooks(fwd_hooks=hooks):
            yield model
    finally:
        restore_instance_dict(model, before)


def restore_instance_dict(obj, before: dict) -> None:
    """Put ``obj.__dict__`` back to the snapshot ``before`` (``dict(obj.__dict__)`` taken
    earlier): keys added since go, keys changed or removed get their old object back."""
    now = obj.__dict__
    for key in [k for k in now if k not in before]:
        del now[key]
    for key, value in before.items():
        if now.get(key, _MISSING) is not value:
            now[key] = value


__all__ = [
    "COMPONENTS",
    "DiagonalRemoval",
    "EDIT_SPACES",
    "Edit",
    "EditSpace",
    "EffectiveDiagonal",
    "MLPCarrierScale",
    "NonFiniteEditError",
    "ResidualScale",
    "Scales",
    "ValueScale",
    "apply_edits",
    "edit_hooks",
    "edit_space",
    "edits_for_space",
    "restore_instance_dict",
    "scales",
    "track_attention_mask",
]
