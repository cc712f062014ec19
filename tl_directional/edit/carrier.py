"""MLP-internal carrier edits (METHOD.md sec. 4, "MLP carrier"; the paper's revision, appendix
"MLP-Internal Geometry").

:class:`MLPCarrierScale` scales the parallel / perpendicular parts of the MLP's carrier blocks at
one of two sites (the math: :mod:`tl_directional.core.carrier`; the hook points and ``W_down``:
:mod:`tl_directional.model.mlp_carrier`):

* ``site="input"``: each width-``d_model`` block ``h_g`` of the post-activation carrier
  (``mlp.hook_post``) split against the MLP's input ``x`` (the normalised stream it reads),
  edited at the carrier before the down projection, so the MLP outputs
  ``sum_g W_down[:, I_g] (s_par P_par(h_g; x) + s_perp P_perp(h_g; x)) + b_down``;
* ``site="block"``: each block's contribution ``y_g = W_down[:, I_g] h_g`` split against ``h_g``,
  edited at the down projection's output, which becomes
  ``sum_g (s_par P_par(y_g; h_g) + s_perp P_perp(y_g; h_g)) + b_down``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.carrier import (
    CARRIER_SITES,
    carrier_block_delta,
    carrier_input_delta,
    check_remainder,
    n_carrier_blocks,
)
from ..core.geometry import DEFAULT_EPS, compute_dtype
from ..model.mlp_carrier import CarrierUnavailableError, carrier_site, down_weight
from ..model.sites import resolve_sites
from .base import Edit, HookList, _track_key_length
from .tensors import cast_back, query_mask, scale_specs


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"eps must be a finite float >= 0 (a degeneracy threshold on squared norms), got "
                         f"{eps!r}; leave it out for the default or pass e.g. eps=1e-12")
    return float(eps)


class MLPCarrierScale(Edit):
    """Scale the parallel / perpendicular parts of the MLP's carrier blocks (one scaling form:
    ``u + (s_par - 1) u_par + (s_perp - 1) u_perp``, so scale 1 is a bit-exact no-op).

    The carrier ``h`` (``[batch, pos, d_mlp]``: ``phi(W_gate x) * (W_up x)`` for a gated MLP,
    ``phi(W_in x)`` for a plain one such as GPT-2's) is cut into ``G = d_mlp / d_model`` blocks
    ``h_g`` of width ``d_model``.

    Args:
        s_par, s_perp: a float, a ``[n_layers]`` tensor or :func:`~tl_directional.scales` with
            ``batch`` / ``layer`` axes (no head axis: the carrier has no heads); one scale per
            token, the same for every block.
        site: ``"input"`` (``h_g`` against the MLP input ``x``, before ``W_down``) or
            ``"block"`` (``y_g = W_down[:, I_g] h_g`` against ``h_g``, before the sum over blocks).
        layers: None (all) or layer indices.
        positions: absolute query positions (as in the other edits), or None for all.
        eps: degeneracy threshold on squared norms (such a block has no parallel part).
        remainder: ``"pad"`` (default) zero-pads the last block when ``d_mlp`` is not a multiple
            of ``d_model`` (the MLP read with extra zero hidden units; METHOD.md), ``"error"``
            refuses such a model.

    Raises (at ``fwd_hooks``): :class:`~tl_directional.model.mlp_carrier.CarrierUnavailableError`
    on a mixture-of-experts MLP (or ``site="block"`` on a legacy sandwich-norm model, whose MLP
    output hook follows a norm); :class:`~tl_directional.core.carrier.CarrierShapeError` for a
    partial block with ``remainder="error"``.
    """

    def __init__(self, s_par=1.0, s_perp=1.0, site: str = "input", layers=None, positions=None,
                 eps: float = DEFAULT_EPS, remainder: str = "pad"):
        if site not in CARRIER_SITES:
            raise ValueError(f"site must be one of {CARRIER_SITES} ('input': carrier blocks h_g against the MLP "
                             f"input x; 'block': contributions W_down[:, I_g] h_g against h_g), got {site!r}")
        self.s_par, self.s_perp, self.site = s_par, s_perp, site
        self.layers, self.positions = layers, positions
        self.eps = _check_eps(eps)
        self.remainder = check_remainder(remainder)

    def __repr__(self) -> str:
        return (f"MLPCarrierScale(s_par={self.s_par}, s_perp={self.s_perp}, site={self.site!r}, "
                f"layers={self.layers})")

    def fwd_hooks(self, model) -> HookList:
        sites = resolve_sites(model)
        s_par, s_perp = scale_specs(self, sites.n_layers, sites.n_heads, allow_heads=False)
        hooks: HookList = []
        for L in self._layers(sites):
            cs = carrier_site(model, L)
            n_carrier_blocks(cs.d_mlp, sites.d_model, self.remainder)  # refuse before any forward
            if self.site == "block" and cs.output_hook is None:
                raise CarrierUnavailableError(
                    f"MLPCarrierScale(site='block') at layer {L}: this model's MLP output hook follows a "
                    "norm (legacy sandwich-norm model), so the down projection's own output cannot be "
                    "edited; use site='input', or the TransformerLens 4 bridge")
            state: dict = {}
            if self.positions is not None:
                hooks.append((sites.value[L].pattern_hook, _track_key_length(state)))
            if self.site == "input":
                hooks.append((cs.input_hook, _keep(state, "x", cs.input_scale)))
                hooks.append((cs.carrier_hook, self._input_hook(L, state, s_par, s_perp)))
            else:
                hooks.append((cs.carrier_hook, _keep(state, "h", None)))
                hooks.append((cs.output_hook, self._block_hook(model, L, state, s_par, s_perp)))
        return hooks

    def _scales(self, layer, state, s_par, s_perp, t: Tensor, dtype):
        batch, n_q = t.shape[:2]
        sp = s_par.at(layer, batch, t.device, dtype)[:, :1]  # [B|1, 1]
        sq = s_perp.at(layer, batch, t.device, dtype)[:, :1]
        pm = query_mask(self, batch, n_q, state.get("k_len", n_q) - n_q, t.device)
        if pm is not None:
            sp = torch.where(pm, sp, torch.ones_like(sp))
            sq = torch.where(pm, sq, torch.ones_like(sq))
        return sp, sq

    def _input_hook(self, layer, state, s_par, s_perp):
        def hook(h: Float[Tensor, "batch pos d_mlp"], hook):  # noqa: ARG001
            x = state.pop("x", None)
            if x is None or x.shape[:2] != h.shape[:2]:
                raise RuntimeError(f"MLPCarrierScale at layer {layer}: the MLP input hook did not fire before "
                                   "the carrier hook with the same positions; this MLP is not supported")
            dtype = compute_dtype(torch.promote_types(h.dtype, x.dtype))
            sp, sq = self._scales(layer, state, s_par, s_perp, h, dtype)
            delta = carrier_input_delta(h, x, sp, sq, self.eps, self.remainder)
            return cast_back(h.to(delta.dtype) + delta, h, self, layer)

        return hook

    def _block_hook(self, model, layer, state, s_par, s_perp):
        def hook(y: Float[Tensor, "batch pos d_model"], hook):  # noqa: ARG001
            h = state.pop("h", None)
            if h is None or h.shape[:2] != y.shape[:2]:
                raise RuntimeError(f"MLPCarrierScale at layer {layer}: the carrier hook did not fire before "
                                   "the MLP output hook with the same positions; this MLP is not supported")
            w = down_weight(model, layer)
            dtype = compute_dtype(torch.promote_types(h.dtype, w.dtype))
            sp, sq = self._scales(layer, state, s_par, s_perp, y, dtype)
            delta = carrier_block_delta(h, w, sp, sq, self.eps, self.remainder)
            return cast_back(y.to(delta.dtype) + delta, y, self, layer)

        return hook


def _keep(state: dict, key: str, scale: Tensor | None):
    """Read-only hook keeping its tensor (times ``scale`` along the last axis, when given) as
    ``state[key]`` for the edit hook that fires after it in the same layer."""

    def hook(t, hook):  # noqa: ARG001
        state[key] = t if scale is None else t * scale.to(t.device, t.dtype)
        return t

    return hook




__all__ = ["MLPCarrierScale"]
