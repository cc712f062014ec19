"""Residual-space edits: :class:`ResidualScale` splits a sub-layer's update against the stream it
is added to (METHOD.md sec. 2), on TransformerLens hook points; the math is
:func:`tl_directional.edit.forms.residual_scaled`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.direction import Direction
from ..core.geometry import DEFAULT_EPS, compute_dtype
from ..core.subspace import check_directions
from ..model.reference import resolve_reference
from ..model.sites import (
    check_component,
    resolve_sites,
)
from .base import Edit, HookList, _check_eps, _store_first, _track_key_length, track_attention_mask
from .forms import (
    residual_parts,
    residual_scaled,
)
from .tensors import (
    ScaleSpec,
    cast_back,
    query_mask,
)


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
    the already edited stream, or against ``reference``:

    * a ``[d_model]`` direction (e.g. a probe vector or a steering vector), or any tensor of 3
      or more axes broadcastable to ``[batch, pos, d_model]`` (one direction per token);
    * a ``[k, d_model]`` tensor: the subspace its rows span (orthonormalised in float64;
      ``update_par`` is the orthogonal projection onto it);
    * a ``[n_layers, d_model]`` tensor with ``per_layer=True``: row ``L`` at layer ``L`` (a 2-D
      tensor with exactly ``n_layers`` rows needs ``per_layer=True`` or ``per_layer=False``);
    * a :class:`~tl_directional.core.direction.Direction` (``space="resid"``, its own
      ``per_layer``; one from a model whose weights were processed differently is refused).

    2-D and Direction references are resolved against the model when the hooks are built
    (:func:`~tl_directional.model.reference.resolve_reference`).
    Edited at the unit's update hook (``hook_attn_out`` / ``hook_mlp_out`` /
    ``hook_resid_post``; ``attn.o.hook_out`` / ``mlp.hook_out`` on post-LN bridges).
    """

    def __init__(self, component: str, s_par=1.0, s_perp=1.0, layers=None, positions=None,
                 reference: Tensor | Direction | None = None, eps: float = DEFAULT_EPS, *,
                 per_layer: bool | None = None):
        check_component(component)
        if reference is not None and not isinstance(reference, Tensor | Direction):
            raise TypeError(f"reference must be a tensor (a [d_model] direction, a [k, d_model] subspace, "
                            f"a [n_layers, d_model] per-layer set) or a tld.Direction, got {type(reference).__name__}")
        self.component = component
        self.s_par, self.s_perp = s_par, s_perp
        self.layers, self.positions, self.reference = layers, positions, reference
        self.per_layer = per_layer
        self.eps = _check_eps(eps)
        if isinstance(reference, Tensor) and reference.ndim == 2:
            check_directions(reference, argument="reference")  # zero rows, NaN: before any model
        elif isinstance(reference, Tensor):
            _check_reference(reference, self.eps)

    def __repr__(self) -> str:
        return f"ResidualScale({self.component!r}, s_par={self.s_par}, s_perp={self.s_perp}, layers={self.layers})"

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        track_attention_mask(model)
        check_component(self.component, sites)
        resolved = None
        if isinstance(self.reference, Direction) or (isinstance(self.reference, Tensor) and self.reference.ndim == 2):
            resolved = resolve_reference(model, self.reference, per_layer=self.per_layer)
        elif self.reference is not None and self.reference.shape[-1] != sites.d_model:
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
            fixed, basis = self.reference, None
            if resolved is not None:  # a subspace: its basis; a direction / per-layer set: this layer's row
                fixed, basis = (None, resolved.rows) if resolved.kind == "subspace" else (resolved.vector(L), None)
            hooks.append((unit.update_hook, self._edit_hook(L, unit.update_is_difference, state, s_par, s_perp,
                                                            fixed, basis)))
        return hooks

    def _edit_hook(self, layer, is_difference, state, s_par, s_perp, fixed, basis):
        def hook(tensor: Float[Tensor, "batch pos d_model"], hook):  # noqa: ARG001
            update, ref = residual_parts(tensor, state["ref"], fixed, is_difference)
            batch, n_q = tensor.shape[:2]
            dtype = compute_dtype(tensor.dtype)
            sp = s_par.at(layer, batch, tensor.device, dtype)[:, :1]  # [B|1, 1]
            sq = s_perp.at(layer, batch, tensor.device, dtype)[:, :1]
            offset = state.get("k_len", n_q) - n_q
            pm = query_mask(self, batch, n_q, offset, tensor.device)
            out = residual_scaled(tensor, update, ref, sp, sq, self.eps, pm, basis=basis)
            return cast_back(out, tensor, self, layer)

        return hook


__all__ = ["ResidualScale"]
