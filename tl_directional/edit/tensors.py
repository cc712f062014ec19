"""The arguments every edit path shares: scale arguments, scopes, the cast back, the forward state.

(Each edit's math itself is in :mod:`tl_directional.edit.forms`.)

Both edit paths build on it: :mod:`tl_directional.edit` (TransformerLens hooks) and
:mod:`tl_directional.edit.hf.edits` (module hooks on plain ``transformers`` models), so one edit
object scales, scopes and casts the same way wherever it is installed.

- :class:`Scales` / :func:`scales`: a scale tensor with named axes; :class:`ScaleSpec` turns
  any scale argument (a float, a ``[n_layers]`` or ``[n_layers, n_heads]`` tensor, a
  :class:`Scales`) into one ``[B|1, L|1, H|1]`` tensor, with the argument named in its errors.
- :func:`scale_specs`, :func:`row_scale`: an edit's scales per ``(batch, query, head)``,
  1 outside its head and position scope; :func:`heads_mask`, :func:`query_mask`: the scopes.
- :func:`cast_back`: the edited tensor in the input's dtype, or :class:`NonFiniteEditError` when
  it is not finite (or its squared norm overflows), at every precision.
- :data:`~tl_directional.model.generation.FORWARD` (read here, kept in the model floor): what the hooks know about the forward pass in progress (its attention mask,
  whether ``generate`` runs); each path sets it around the model's forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.errors import TLDirectionalError
from ..model.generation import FORWARD
from ..model.indices import normalize_heads
from ..model.positions import check_positions_in_range, int_positions, position_mask

AXES = ("batch", "layer", "head")
"""The axes a scale tensor can have, in this order."""


class NonFiniteEditError(TLDirectionalError, ValueError):
    """An edit made a finite activation non-finite, or so large that a norm of it overflows:
    a scale beyond what the computation can represent (``s_par = 1e39`` in float32,
    ``s_par = 1e6`` in float16, ``s_par = 1e30`` on a residual update whose next LayerNorm would
    square it). The message names the edit, its scales and the layer."""


def _row_norms_sq(t: Tensor) -> Tensor:
    """``||row||^2`` over the last axis, accumulated in at least float32 (a float16 row's squared
    norm is routinely beyond float16's range; float32 is where the norms downstream compute).

    The norm is one reduction (no ``[..., d]`` square written; a head's rows are short, and a
    product per row, as ``einsum`` forms it, costs more on a CPU), squared in the
    row's dtype: a squared norm beyond that range is ``inf`` as before (the norm itself does not
    overflow where the squares would), a NaN row stays NaN."""
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    norm = torch.linalg.vector_norm(t, dim=-1)
    return norm * norm


def cast_back(edited: Tensor, original: Tensor, edit: Any, layer: int) -> Tensor:
    """``edited`` (computed in the compute dtype) in ``original``'s dtype, checked.

    Raises :class:`NonFiniteEditError` naming the edit, its scales and the layer when a finite
    ``original`` gives an output that is not finite in ``original``'s dtype (the cast of an
    overflowing value, or a scale beyond the compute dtype's range), or whose squared row norm
    (last axis) is not finite in float32 / float64: a LayerNorm or RMSNorm downstream squares
    the stream it reads, so such an output would turn into inf / NaN there or, worse, into a
    finite but meaningless forward. One reduction over the output per edited tensor."""
    out = edited.to(original.dtype)
    if bool(torch.isfinite(_row_norms_sq(out)).all()) or not bool(torch.isfinite(original).all()):
        return out
    if out.dtype != edited.dtype and not bool(torch.isfinite(out).all()):
        info = torch.finfo(original.dtype)
        raise NonFiniteEditError(
            f"{edit!r} at layer {layer}: the edited output is not finite in {original.dtype} "
            f"(largest value {info.max:.4g}); use smaller scales or run the model in float32"
        )
    what = (f"is not finite in {original.dtype}" if not bool(torch.isfinite(out).all()) else
            f"has a squared norm beyond {_row_norms_sq(out).dtype}'s range (a LayerNorm / RMSNorm "
            "downstream would divide by inf)")
    raise NonFiniteEditError(
        f"{edit!r} at layer {layer}: the edited output {what}; the scales are too large for this "
        "computation: use smaller scales"
    )


class Scales:
    """A scale tensor with named axes, a subset of ``"batch layer head"`` in that order.

    Example: ``scales(torch.tensor([0.0, 0.5, 1.0]), "batch")`` gives each batch row
    its own ``s_par``, so one forward evaluates three settings.
    """

    def __init__(self, values, dims: str):
        names = dims.split()
        if not names or any(n not in AXES for n in names) or names != sorted(names, key=AXES.index) or len(set(names)) != len(names):
            raise ValueError(
                f"dims must name distinct axes among {AXES}, in that order (e.g. 'batch', "
                f"'layer head', 'batch layer'); got {dims!r}"
            )
        t = torch.as_tensor(values, dtype=torch.float64)
        if t.ndim != len(names):
            raise ValueError(f"scales with dims {dims!r} need a {len(names)}-D tensor, got shape {tuple(t.shape)}")
        self.values = t
        self.dims = tuple(names)

    def __repr__(self) -> str:
        return f"Scales(shape={tuple(self.values.shape)}, dims={' '.join(self.dims)!r})"


def scales(values, dims: str) -> Scales:
    """Name the axes of a scale tensor: ``scales(t, "batch layer head")``."""
    return Scales(values, dims)


class ScaleSpec:
    """A scale argument normalised to a ``[B|1, L|1, H|1]`` float64 tensor.

    Args:
        value: a float, a 0-D / ``[n_layers]`` / ``[n_layers, n_heads]`` tensor, or :class:`Scales`.
        argument: the argument's name, for the errors (``"s_par"``).
        n_layers, n_heads: the model's shapes (query heads).
        allow_heads: whether a head axis is allowed (value-space and pattern edits).
    """

    def __init__(self, value, *, argument: str, n_layers: int, n_heads: int, allow_heads: bool):
        if isinstance(value, Scales):
            t, dims = value.values, value.dims
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            t, dims = torch.tensor(float(value), dtype=torch.float64), ()
        elif isinstance(value, Tensor):
            t = value.detach().to(torch.float64).cpu() if not value.requires_grad else value
            if t.ndim == 0:
                dims = ()
            elif t.ndim == 1 and t.shape[0] == n_layers:
                dims = ("layer",)
            elif t.ndim == 2 and tuple(t.shape) == (n_layers, n_heads):
                dims = ("layer", "head")
            else:
                hint = "a [n_layers, n_heads] tensor (value/pattern edits), " if allow_heads else ""
                raise ValueError(
                    f"{argument} has shape {tuple(value.shape)}; pass a float, a [n_layers]="
                    f"[{n_layers}] tensor, {hint}or tl_directional.scales(t, 'batch layer head') "
                    "to name the axes (per batch row: scales(t, 'batch'))"
                )
        else:
            raise TypeError(f"{argument} must be a float, a tensor or tl_directional.scales(...), got {type(value).__name__}")
        if "head" in dims and not allow_heads:
            raise ValueError(f"{argument} has a head axis, but residual-space edits act on the whole update; drop the head axis")
        if not bool(torch.isfinite(t.detach()).all()):
            raise ValueError(f"{argument} has non-finite values; scales must be finite numbers")
        shape = [1, 1, 1]
        for i, d in enumerate(dims):
            shape[AXES.index(d)] = t.shape[i]
        if "layer" in dims and shape[1] != n_layers:
            raise ValueError(f"{argument} has {shape[1]} layers but the model has {n_layers}")
        if "head" in dims and shape[2] != n_heads:
            raise ValueError(f"{argument} has {shape[2]} heads but the model has {n_heads} (query heads)")
        self.tensor = t.reshape(shape)
        self.argument = argument
        self.is_one = (not self.tensor.requires_grad) and bool((self.tensor == 1).all())

    def at(self, layer: int, batch: int, device, dtype) -> Float[Tensor, "B_or_1 H_or_1"]:
        """The scale at ``layer`` for a forward pass of ``batch`` rows, ``[B|1, H|1]``."""
        s = self.tensor[:, min(layer, self.tensor.shape[1] - 1)]
        if s.shape[0] not in (1, batch):
            raise ValueError(
                f"{self.argument} has {s.shape[0]} batch rows but the forward pass has batch {batch}"
            )
        return s.to(device=device, dtype=dtype)


def scale_specs(edit: Any, n_layers: int, n_heads: int, names: Sequence[str] = ("s_par", "s_perp"),
                allow_heads: bool = True) -> list[ScaleSpec]:
    """The :class:`ScaleSpec` of each of ``edit``'s scale attributes ``names``, in order."""
    kw = dict(n_layers=n_layers, n_heads=n_heads, allow_heads=allow_heads)
    return [ScaleSpec(getattr(edit, n), argument=n, **kw) for n in names]


def heads_mask(heads, n_heads: int) -> Tensor | None:
    """A ``[n_heads]`` bool mask of the query heads ``heads`` (None: all heads)."""
    heads = normalize_heads(heads, n_heads, "heads")
    if heads is None:
        return None
    m = torch.zeros(n_heads, dtype=torch.bool)
    m[heads] = True
    return m


def query_mask(edit: Any, batch: int, n_q: int, offset: int, device) -> Tensor | None:
    """The query positions ``edit.positions`` touches, ``[batch|1, n_q]`` (None: all).

    ``positions`` is checked against the sequence length once per length (a clear error
    for ``[500]``, ``[-500]``, ``slice(500, None)``, ``[1.5]``). Negative ints count from
    each row's last real token where the forward pass has an attention mask (right
    padding, :data:`FORWARD`), else from the end of the sequence. ``offset``: the number of
    earlier (cached) positions."""
    positions = edit.positions
    if positions is None:
        return None
    total = offset + n_q
    key = (total, id(positions))
    if getattr(edit, "_checked_for", None) != key:
        if not FORWARD.generating:  # during generate, later positions are reached later
            check_positions_in_range(positions, total)
        elif not (isinstance(positions, Tensor) and positions.dtype == torch.bool):
            check_positions_in_range(positions, max(total, 1 << 30))
        # (a bool mask over the prompt leaves the generated positions unselected)
        edit._checked_for = key
    pm = position_mask(positions, batch=batch, n_query=n_q, offset=offset, device=device)
    mask = FORWARD.attention_mask
    if (mask is None or isinstance(positions, slice) or (isinstance(positions, Tensor) and positions.dtype == torch.bool) or tuple(mask.shape) != (batch, total)):
        return pm
    ints = int_positions(positions, "positions")
    neg = [p for p in ints if p < 0]
    if not neg:
        return pm
    real = mask.to(device).bool()
    ends = total - real.flip(-1).long().argmax(-1)  # one past each row's last real token
    if bool((ends == total).all()):
        return pm  # no row padded at the end: the plain count from the end is right
    keep = [p for p in ints if p >= 0]
    pm = position_mask(keep, batch=batch, n_query=n_q, offset=offset, device=device) if keep else \
        torch.zeros((1, n_q), dtype=torch.bool, device=device)
    abs_pos = torch.arange(offset, total, device=device).unsqueeze(0)  # [1, n_q]
    targets = ends.unsqueeze(-1) + torch.tensor(neg, device=device).unsqueeze(0)  # [batch, n_neg]
    return pm | (abs_pos.unsqueeze(-1) == targets.unsqueeze(1)).any(-1)


def row_scale(edit: Any, spec: ScaleSpec, layer: int, batch: int, n_q: int, offset: int,
              head_mask: Tensor | None, device, dtype) -> Float[Tensor, "B_or_1 q_or_1 H_or_1"]:
    """``spec``'s scale per (batch, query, head) at ``layer``; 1 outside ``head_mask`` (:func:`heads_mask`) and
    outside ``edit``'s position scope (:func:`query_mask`)."""
    s = spec.at(layer, batch, device, dtype).unsqueeze(1)  # [B|1, 1, H|1]
    one = torch.ones((), dtype=dtype, device=device)
    if head_mask is not None:
        s = torch.where(head_mask.to(device).view(1, 1, -1), s, one)
    pm = query_mask(edit, batch, n_q, offset, device)
    if pm is not None:
        s = torch.where(pm.unsqueeze(-1), s, one)
    return s


def pattern_scope(head_mask: Tensor | None, query: Tensor | None, device) -> Tensor | None:
    """The rows of an attention pattern an edit touches, a bool ``[batch|1, n_heads|1, query|1]``
    (None: all): ``head_mask`` (``[n_heads]``, :func:`heads_mask`) and ``query``
    (``[batch|1, query]``, :func:`query_mask`) together."""
    scope = None if head_mask is None else head_mask.to(device).view(1, -1, 1)
    if query is not None:
        scope = query.unsqueeze(1) if scope is None else scope & query.unsqueeze(1)
    return scope


def scale_minus_one(s: Tensor) -> Tensor:
    """``s - 1`` with a trailing vector axis: ``[B|1, q|1, H|1]`` -> ``[B|1, q|1, H|1, 1]``, in
    ``s``'s dtype (the factor :func:`tl_directional.core.geometry.component_delta` forms from a scale)."""
    return s.unsqueeze(-1) - 1.0


__all__ = [
    "AXES",
    "NonFiniteEditError",
    "ScaleSpec",
    "Scales",
    "cast_back",
    "heads_mask",
    "pattern_scope",
    "query_mask",
    "row_scale",
    "scale_specs",
    "scale_minus_one",
    "scales",
]
