"""Pure tensor math: split an update against a reference (METHOD.md sec. 1).

Nothing in this module knows about models or hooks. Every function takes plain
tensors whose last axis is the vector axis (``d``) and any number of leading
axes (``*batch``), and computes in at least float32 whatever the input dtype
(float64 stays float64, which is how equivalence tests run).

For an update ``u`` and a reference ``r``::

    a      = (u . r) / ||r||^2
    u_par  = a * r
    u_perp = u - u_par

Degenerate tokens (``||r||^2 <= eps`` or ``||u||^2 <= eps``, absolute ``eps``
on squared norms) get ``a = 0``, ``u_par = 0``, ``u_perp = u`` and are flagged,
never NaN.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

DEFAULT_EPS = 1e-12


def check_eps(eps, name: str = "eps") -> float:
    """Return ``eps`` as a float after checking it is a finite number > 0.

    A NaN threshold makes every ``|s|^2 > eps`` test false, so every token reads as
    degenerate and the numbers come out silently zero; refuse it at the call.
    """
    import math
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"{name} must be a finite float > 0 (a degeneracy threshold on squared norms, "
                         f"default {DEFAULT_EPS}), got {eps!r}; pass e.g. {name}={DEFAULT_EPS}")
    return float(eps)

# A perpendicular part this small relative to the update is rounding noise of a
# parallel update (e.g. value space at the first token, where o_0 = v_0):
# ||u_perp||^2 <= eps + (PERP_VANISH_ULPS * machine_eps)^2 * ||u||^2 counts as zero.
PERP_VANISH_ULPS = 64.0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype decompositions are computed in: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class SplitStats:
    """Per-token scalars of the split of ``u`` against ``r`` (METHOD.md sec. 1), compute dtype.

    Every field is ``[*batch]``. ``par_sq`` / ``perp_sq`` are the squared norms of the two
    parts, kept so that streaming summaries can form energy ratios without recomputing them;
    ``par_sq`` is 0 on degenerate tokens and ``perp_sq`` is ``||u - a r||^2`` (``||u||^2``
    there). :func:`tl_directional.core.kernels.split_stats` returns these alone (for measuring);
    :func:`decompose` returns them with the parts themselves (a :class:`Decomposition`).
    """

    alpha: Float[Tensor, "*batch"]
    par_frac: Float[Tensor, "*batch"]
    par_perp_ratio: Float[Tensor, "*batch"]
    rel_update: Float[Tensor, "*batch"]
    degenerate: Bool[Tensor, "*batch"]
    par_sq: Float[Tensor, "*batch"]
    perp_sq: Float[Tensor, "*batch"]


@dataclass(frozen=True)
class Decomposition(SplitStats):
    """Result of :func:`decompose`: the :class:`SplitStats` scalars (``[*batch]``) and the
    parts ``par`` and ``perp`` themselves (``[*batch, d]``); every field is in the compute dtype.
    """

    par: Float[Tensor, "*batch d"]
    perp: Float[Tensor, "*batch d"]


def _check_pair(update: object, reference: object, *, names=("update", "reference")) -> None:
    if not isinstance(update, Tensor) or not isinstance(reference, Tensor):
        raise TypeError(
            f"{names[0]} and {names[1]} must be torch tensors, got "
            f"{type(update).__name__} and {type(reference).__name__}"
        )
    if update.ndim == 0 or reference.ndim == 0:
        raise ValueError(f"{names[0]} and {names[1]} need a vector axis (the last axis)")
    if update.shape[-1] != reference.shape[-1]:
        raise ValueError(
            f"{names[0]} has vector size {update.shape[-1]} but {names[1]} has "
            f"{reference.shape[-1]}: both must share the last axis (d_model or d_head)"
        )
    if not (update.is_floating_point() and reference.is_floating_point()):
        raise TypeError(f"{names[0]} and {names[1]} must be floating point tensors")


def _checks_vectors(*names: str):
    """Decorator: check the tensor arguments ``names`` against the last of them (the
    reference) with :func:`_check_pair` before the function runs.

    The public functions below check their input this way rather than in their body, so that
    a user's mistake gets this module's error (naming the argument and the fix) also under a
    runtime type checker: jaxtyping's import hook puts its checker innermost, below this
    wrapper, so the annotations are checked only once the input is known to be usable.
    """
    *vectors, ref = names

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            if len(args) >= len(names):
                values = args[:len(names)]
            else:
                bound = signature.bind_partial(*args, **kwargs).arguments
                if not all(n in bound for n in names):
                    return fn(*args, **kwargs)  # Python's own missing-argument error
                values = [bound[n] for n in names]
            for name, value in zip(vectors, values[:-1], strict=True):
                _check_pair(value, values[-1], names=(name, ref))
            return fn(*args, **kwargs)

        return checked

    return decorate


@_checks_vectors("update", "reference")
def projection_coefficient(
    update: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    eps: float = DEFAULT_EPS,
) -> tuple[Float[Tensor, "*#batch"], Bool[Tensor, "*#batch"], Float[Tensor, "*#batch"], Float[Tensor, "*#batch"]]:
    """Signed scale ``a = (u . r) / ||r||^2`` along the reference, in the compute dtype.

    Returns ``(a, degenerate, ||u||^2, ||r||^2)``; ``a`` is 0 where degenerate.
    ``update`` and ``reference`` broadcast against each other.
    """
    dtype = compute_dtype(torch.promote_types(update.dtype, reference.dtype))
    u = update.to(dtype)
    r = reference.to(dtype)
    u_sq = (u * u).sum(-1)
    r_sq = (r * r).sum(-1)
    dot = (u * r).sum(-1)
    u_sq, r_sq, dot = torch.broadcast_tensors(u_sq, r_sq, dot)
    degenerate = (r_sq <= eps) | (u_sq <= eps)
    # where() keeps the division's gradient finite: the denominator is never ~0 where used.
    safe_r_sq = torch.where(degenerate, torch.ones_like(r_sq), r_sq)
    a = torch.where(degenerate, torch.zeros_like(dot), dot / safe_r_sq)
    return a, degenerate, u_sq, r_sq


@_checks_vectors("update", "reference")
def decompose(
    update: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    eps: float = DEFAULT_EPS,
) -> Decomposition:
    """Split ``update`` into the part along ``reference`` and the part orthogonal to it.

    Args:
        update: the vector added (``u``), any leading shape.
        reference: the vector it is added to or compared with (``r``); broadcasts
            against ``update``.
        eps: absolute threshold on squared norms below which a token is degenerate.

    Returns:
        A :class:`Decomposition` with ``alpha``, ``par``, ``perp``, ``par_frac``
        (``|cos(u, r)|``), ``par_perp_ratio`` (``||u_par|| / ||u_perp||``, ``inf``
        where the perpendicular part vanishes), ``rel_update`` (``||u|| / ||r||``,
        ``inf`` when only ``r`` vanishes) and the ``degenerate`` flag.

    Raises:
        ValueError: ``eps`` is not a finite number > 0, as at every other entry point.
    """
    eps = check_eps(eps)
    a, degenerate, u_sq, r_sq = projection_coefficient(update, reference, eps)
    dtype = a.dtype
    u = update.to(dtype)
    r = reference.to(dtype)
    par = a.unsqueeze(-1) * r
    perp = u - par
    # Broadcast so that the metrics have the full leading shape.
    par, perp = torch.broadcast_tensors(par, perp)
    par_sq = a * a * r_sq
    perp_sq = (perp * perp).sum(-1)

    u_norm = u_sq.sqrt()
    par_norm = par_sq.sqrt()
    zero = torch.zeros_like(a)
    inf = torch.full_like(a, float("inf"))

    safe_u = torch.where(degenerate, torch.ones_like(u_norm), u_norm)
    par_frac = torch.where(degenerate, zero, (par_norm / safe_u).clamp(0.0, 1.0))

    machine_eps = torch.finfo(dtype).eps
    perp_vanishes = perp_sq <= eps + (PERP_VANISH_ULPS * machine_eps) ** 2 * u_sq
    safe_perp = torch.where(perp_vanishes, torch.ones_like(perp_sq), perp_sq.sqrt())
    par_perp_ratio = torch.where(
        degenerate, zero, torch.where(perp_vanishes, inf, par_norm / safe_perp)
    )

    r_vanishes = r_sq <= eps
    u_vanishes = u_sq <= eps
    safe_r = torch.where(r_vanishes, torch.ones_like(r_sq), r_sq.sqrt())
    rel_update = torch.where(
        r_vanishes, torch.where(u_vanishes, zero, inf), u_norm / safe_r
    )
    return Decomposition(
        alpha=a,
        par=par,
        perp=perp,
        par_frac=par_frac,
        par_perp_ratio=par_perp_ratio,
        rel_update=rel_update,
        degenerate=degenerate,
        par_sq=torch.where(degenerate, zero, par_sq),
        perp_sq=perp_sq,
    )


@_checks_vectors("y", "reference")
def parallel_part(
    y: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    eps: float = DEFAULT_EPS,
) -> Float[Tensor, "*#batch d"]:
    """``y_par = a * r`` in the compute dtype (0 where degenerate); ``y_perp = y - y_par``."""
    a, _, _, _ = projection_coefficient(y, reference, eps)
    return a.unsqueeze(-1) * reference.to(a.dtype)


def _as_scale(s: float | Tensor, dtype: torch.dtype, device) -> Tensor:
    t = torch.as_tensor(s, dtype=dtype, device=device)
    return t.unsqueeze(-1) if t.ndim else t


@_checks_vectors("y", "reference")
def component_delta(
    y: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    s_par: float | Tensor = 1.0,
    s_perp: float | Tensor = 1.0,
    eps: float = DEFAULT_EPS,
) -> Float[Tensor, "*#batch d"]:
    """``(s_par - 1) * y_par + (s_perp - 1) * y_perp`` in the compute dtype.

    Adding this to a tensor that contains ``y`` rescales ``y``'s components; at
    ``s_par = s_perp = 1`` it is exactly zero, so the edit is a bit-exact no-op.
    ``s_par`` / ``s_perp`` broadcast to ``[*batch]`` (no vector axis).
    """
    y_par = parallel_part(y, reference, eps)
    dtype = y_par.dtype
    y_perp = y.to(dtype) - y_par
    return (_as_scale(s_par, dtype, y.device) - 1.0) * y_par + (
        _as_scale(s_perp, dtype, y.device) - 1.0
    ) * y_perp


@_checks_vectors("y", "reference")
def scale_components(
    y: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    s_par: float | Tensor = 1.0,
    s_perp: float | Tensor = 1.0,
    eps: float = DEFAULT_EPS,
) -> Float[Tensor, "*#batch d"]:
    """``s_par * y_par + s_perp * y_perp`` (METHOD.md sec. 4), returned in ``y``'s dtype.

    Written as ``y + (s_par - 1) * y_par + (s_perp - 1) * y_perp`` so that
    ``s_par = s_perp = 1`` returns ``y`` bit-exactly. ``s_par`` / ``s_perp`` are
    scalars or tensors broadcastable to ``[*batch]`` (no vector axis). Fully
    differentiable: nothing is detached.
    """
    delta = component_delta(y, reference, s_par, s_perp, eps)
    return (y.to(delta.dtype) + delta).to(y.dtype)


@_checks_vectors("source", "target", "reference")
def patch_components(
    source: Float[Tensor, "*#batch d"],
    target: Float[Tensor, "*#batch d"],
    reference: Float[Tensor, "*#batch d"],
    which: str,
    eps: float = DEFAULT_EPS,
) -> Float[Tensor, "*#batch d"]:
    """Directional patch (METHOD.md sec. 5): take ``which`` component from ``source``.

    ``which="par"`` gives ``P_r source + (I - P_r) target``; ``which="perp"``
    gives ``P_r target + (I - P_r) source``; ``which="full"`` gives ``source``.
    Returned in ``target``'s dtype.
    """
    if which == "full":
        return source.to(target.dtype)
    if which not in ("par", "perp"):
        raise ValueError(f"which must be 'par', 'perp' or 'full', got {which!r}")
    src_par = parallel_part(source, reference, eps)
    tgt_par = parallel_part(target, reference, eps)
    dtype = src_par.dtype
    if which == "par":
        out = target.to(dtype) - tgt_par + src_par
    else:
        out = source.to(dtype) - src_par + tgt_par
    return out.to(target.dtype)


def dtype_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance for identities computed by the model in ``dtype``."""
    if dtype == torch.float64:
        return 1e-10
    if dtype == torch.float32:
        return 1e-5
    return 2e-2
