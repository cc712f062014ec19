"""Pure tensor math of the MLP-internal carrier split (METHOD.md sec. 4, "MLP carrier").

The MLP's post-activation carrier ``h`` (``phi(W_gate x) * (W_up x)`` for a gated MLP,
``phi(W_in x)`` for a plain one such as GPT-2's) has width ``d_mlp``, wider than the stream
width ``d``, so it cannot be split against a width-``d`` vector directly. Following the paper's
revision (appendix "MLP-Internal Geometry"), its coordinates are cut into ``G = ceil(d_mlp / d)``
consecutive blocks ``I_g`` of width ``d``; ``h_g = h[I_g]`` and the block's contribution to the
MLP output ``y_g = W_down[:, I_g] h_g`` both have width ``d``, and ``y = sum_g y_g``.

Two edit sites, both in this library's one scaling form
(``u + (s_par - 1) u_par + (s_perp - 1) u_perp``, a bit-exact no-op at scale 1):

* **input** (the paper's site 1, "grouped h relative to x"): each block ``h_g`` split against
  the MLP's input ``x`` (the normalised stream the MLP reads, width ``d``), before the down
  projection: ``y~ = sum_g W_down[:, I_g] (s_par P_par(h_g; x) + s_perp P_perp(h_g; x))``.
  :func:`carrier_input_delta` returns the change of ``h``.
* **block** (site 2, "grouped y_g relative to h_g"): each contribution ``y_g`` split against its
  own block ``h_g``, before the sum: ``y~ = sum_g (s_par P_par(y_g; h_g) + s_perp P_perp(y_g; h_g))``.
  :func:`carrier_block_delta` returns the change of ``y``.

When ``d_mlp`` is not a multiple of ``d`` (``remainder``):

* ``"pad"``: the MLP is read as if it had ``G * d - d_mlp`` more hidden units whose carrier and
  ``W_down`` columns are zero, which leaves its output unchanged, and the definition above is
  applied to that extended MLP: the last block is ``h_G`` zero-padded to width ``d``. At the
  block site this is an ordinary split of ``y_G`` against the padded ``h_G``. At the input site
  the padded block is split against the whole ``x`` and the padded coordinates of the result are
  dropped (their ``W_down`` columns are zero), so for that block the two parts need not be
  orthogonal within its ``r = d_mlp - (G - 1) d`` real coordinates; their sum is still ``h_G``.
* ``"error"``: refuse (:class:`CarrierShapeError`), naming the fix.

Nothing here knows about models or hooks. Every function takes plain tensors with any leading
axes ``*lead`` and computes in at least float32 (float64 stays float64).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from .errors import TLDirectionalError
from .geometry import DEFAULT_EPS, component_delta, compute_dtype, projection_coefficient

REMAINDERS = ("pad", "error")
"""The rules for ``d_mlp`` not a multiple of ``d``: zero-pad the last block, or refuse."""

CARRIER_SITES = ("input", "block")
"""The carrier edit sites: ``h_g`` against ``x``, and ``y_g`` against ``h_g``."""


class CarrierShapeError(TLDirectionalError, ValueError):
    """The carrier cannot be cut into width-``d`` blocks as asked (``d_mlp`` not a multiple of
    ``d`` with ``remainder="error"``, or tensors whose widths do not fit)."""


def check_remainder(remainder, argument: str = "remainder") -> str:
    """``remainder`` if it is one of :data:`REMAINDERS`; a ValueError naming it otherwise."""
    if remainder not in REMAINDERS:
        raise ValueError(f"{argument} must be one of {REMAINDERS} (what to do when d_mlp is not a multiple of "
                         f"d_model: zero-pad the last carrier block, or refuse), got {remainder!r}")
    return remainder


def n_carrier_blocks(d_mlp: int, d: int, remainder: str = "pad") -> int:
    """``G``, the number of width-``d`` carrier blocks: ``d_mlp / d``, or ``ceil(d_mlp / d)`` with
    ``remainder="pad"``. Raises :class:`CarrierShapeError` for a partial block with ``"error"``."""
    check_remainder(remainder)
    if d <= 0 or d_mlp <= 0:
        raise CarrierShapeError(f"d_mlp and d must be positive, got d_mlp={d_mlp}, d={d}")
    if d_mlp % d and remainder == "error":
        raise CarrierShapeError(
            f"d_mlp={d_mlp} is not a multiple of d_model={d} (the carrier would end in a partial block of "
            f"width {d_mlp % d}) and remainder='error'; pass remainder='pad' to zero-pad the last block "
            "(the MLP read as if it had extra zero hidden units, output unchanged)")
    return math.ceil(d_mlp / d)


def carrier_blocks(h: Float[Tensor, "*lead d_mlp"], d: int,
                   remainder: str = "pad") -> Float[Tensor, "*lead G d"]:
    """``h`` cut into ``G`` consecutive blocks of width ``d`` (the last zero-padded under
    ``remainder="pad"``), ``[*lead, G, d]``, in ``h``'s dtype; differentiable."""
    d_mlp = h.shape[-1]
    g = n_carrier_blocks(d_mlp, d, remainder)
    pad = g * d - d_mlp
    if pad:
        h = torch.nn.functional.pad(h, (0, pad))
    return h.unflatten(-1, (g, d))


def down_blocks(w_down: Float[Tensor, "d_mlp d_out"], d: int,
                remainder: str = "pad") -> Float[Tensor, "G d d_out"]:
    """``W_down`` in TransformerLens orientation (``[d_mlp, d_out]``, ``y = h @ W_down``) cut into
    the ``G`` row blocks matching :func:`carrier_blocks` (zero rows pad the last)."""
    d_mlp = w_down.shape[0]
    g = n_carrier_blocks(d_mlp, d, remainder)
    pad = g * d - d_mlp
    if pad:
        w_down = torch.nn.functional.pad(w_down, (0, 0, 0, pad))
    return w_down.unflatten(0, (g, d))


def block_contributions(h: Float[Tensor, "*lead d_mlp"], w_down: Float[Tensor, "rows d_out"],
                        remainder: str = "pad") -> Float[Tensor, "*lead G d_out"]:
    """``y_g = W_down[:, I_g] h_g`` for every block, ``[*lead, G, d_out]`` (``d_out`` must be the
    block width ``d``), in the compute dtype of ``h`` and ``w_down``; ``sum_g y_g = h @ W_down``."""
    _check_down(h, w_down)
    d = w_down.shape[1]
    dtype = compute_dtype(torch.promote_types(h.dtype, w_down.dtype))
    hb = carrier_blocks(h.to(dtype), d, remainder)
    wb = down_blocks(w_down.to(dtype), d, remainder)
    return torch.einsum("...gi,gio->...go", hb, wb)


def _check_down(h: Tensor, w_down: Tensor) -> None:
    # checked here rather than by the shape annotation (rows, not d_mlp), so that the error names the fix

    if w_down.ndim != 2 or w_down.shape[0] != h.shape[-1]:
        raise CarrierShapeError(
            f"w_down must be [d_mlp, d_model] = [{h.shape[-1]}, d_model] (TransformerLens orientation, "
            f"y = h @ W_down), got shape {tuple(w_down.shape)}")


def _block_scale(s: float | Tensor) -> float | Tensor:
    """A scale for ``[*lead]`` tokens made to broadcast over ``[*lead, G]`` (one scale per token,
    the same for every block)."""
    return s.unsqueeze(-1) if isinstance(s, Tensor) and s.ndim else s


def carrier_input_delta(h: Float[Tensor, "*lead d_mlp"], x: Float[Tensor, "*lead d"],
                        s_par: float | Tensor = 1.0, s_perp: float | Tensor = 1.0,
                        eps: float = DEFAULT_EPS, remainder: str = "pad") -> Float[Tensor, "*lead d_mlp"]:
    """The change of the carrier at the **input** site: per block,
    ``(s_par - 1) P_par(h_g; x) + (s_perp - 1) P_perp(h_g; x)``, blocks concatenated back to width
    ``d_mlp`` (a padded block's extra coordinates dropped), in the compute dtype.

    ``h + carrier_input_delta(...)`` is the edited carrier; ``@ W_down`` gives the paper's
    ``sum_g W_down[:, I_g] P(h_g; x)``. Exactly zero at ``s_par = s_perp = 1``.

    Args:
        h: ``[*lead, d_mlp]``, the post-activation carrier (TransformerLens ``mlp.hook_post``).
        x: ``[*lead, d]``, the input the MLP reads (the normalised stream), broadcastable.
        s_par, s_perp: floats or tensors broadcastable to ``[*lead]`` (one scale per token).
        eps: degeneracy threshold on squared norms (a block with ``||h_g||^2 <= eps``, or every
            block of a token with ``||x||^2 <= eps``, has no parallel part: it is all perpendicular,
            as for every split of the library, METHOD.md sec. 1).
        remainder: see the module docstring.
    """
    d = x.shape[-1]
    dtype = compute_dtype(torch.promote_types(h.dtype, x.dtype))
    hb = carrier_blocks(h.to(dtype), d, remainder)  # [*lead, G, d]
    delta = component_delta(hb, x.to(dtype).unsqueeze(-2), _block_scale(s_par), _block_scale(s_perp), eps)
    return delta.flatten(-2)[..., : h.shape[-1]]


def carrier_block_delta(h: Float[Tensor, "*lead d_mlp"], w_down: Float[Tensor, "rows d"],
                        s_par: float | Tensor = 1.0, s_perp: float | Tensor = 1.0,
                        eps: float = DEFAULT_EPS, remainder: str = "pad") -> Float[Tensor, "*lead d"]:
    """The change of the MLP output at the **block** site:
    ``sum_g (s_par - 1) P_par(y_g; h_g) + (s_perp - 1) P_perp(y_g; h_g)`` with
    ``y_g = W_down[:, I_g] h_g``, in the compute dtype (``[*lead, d]``; exactly zero at scale 1).

    Args:
        h: ``[*lead, d_mlp]``, the carrier.
        w_down: ``[d_mlp, d]``, the down projection in TransformerLens orientation (``W_out``).
        s_par, s_perp, eps, remainder: as in :func:`carrier_input_delta`.
    """
    y = block_contributions(h, w_down, remainder)  # [*lead, G, d]
    hb = carrier_blocks(h.to(y.dtype), w_down.shape[1], remainder)
    delta = component_delta(y, hb, _block_scale(s_par), _block_scale(s_perp), eps)
    return delta.sum(-2)


def carrier_split_energy(h: Float[Tensor, "*lead d_mlp"], reference: Float[Tensor, "*lead d"] | None = None,
                         w_down: Float[Tensor, "rows d"] | None = None, eps: float = DEFAULT_EPS,
                         remainder: str = "pad") -> tuple[Float[Tensor, "*lead"], Float[Tensor, "*lead"]]:
    """Per token, the parallel and total squared norms summed over the carrier blocks, in the
    compute dtype: ``(sum_g ||u_g,par||^2, sum_g ||u_g||^2)``.

    With ``reference`` (``x``, ``[*lead, d]``): ``u_g = h_g`` split against ``x`` (input site).
    With ``w_down``: ``u_g = y_g`` split against ``h_g`` (block site). Exactly one must be given.
    Their ratio over many tokens is the carrier's parallel energy share (``profile``'s carrier
    columns); degenerate blocks count in the total, not in the parallel part.
    """
    if (reference is None) == (w_down is None):
        raise ValueError("pass exactly one of reference (x: the input site) and w_down (the block site)")
    if reference is not None:
        dtype = compute_dtype(torch.promote_types(h.dtype, reference.dtype))
        u = carrier_blocks(h.to(dtype), reference.shape[-1], remainder)
        r = reference.to(dtype).unsqueeze(-2)
    else:
        u = block_contributions(h, w_down, remainder)
        r = carrier_blocks(h.to(u.dtype), w_down.shape[1], remainder)
    a, degenerate, u_sq, r_sq = projection_coefficient(u, r, eps)
    par_sq = torch.where(degenerate, torch.zeros_like(a), a * a * r_sq)
    return par_sq.sum(-1), u_sq.sum(-1)


__all__ = [
    "CARRIER_SITES",
    "REMAINDERS",
    "CarrierShapeError",
    "block_contributions",
    "carrier_block_delta",
    "carrier_blocks",
    "carrier_input_delta",
    "carrier_split_energy",
    "check_remainder",
    "down_blocks",
    "n_carrier_blocks",
]
