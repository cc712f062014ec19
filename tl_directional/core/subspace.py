"""A reference that is one direction or a subspace: its orthonormal basis and the split of an
update against it (METHOD.md sec. 1, generalised from a line to a span).

Pure torch, no model. Vectors live in one space of width ``d`` (``d_model`` for the residual
stream, ``d_head`` for a head's values) and sit on the last axis; ``u`` may have any leading
shape ``[*batch, d]``.

* A **direction** is a ``[d]`` vector ``r`` (an SAE decoder row, a steering vector, a probe's
  weights, a logit-difference direction). The split is METHOD sec. 1's, computed exactly as
  :func:`tl_directional.core.geometry.decompose` computes it::

      a = (u . r) / ||r||^2,   u_par = a * r,   u_perp = u - u_par

* A **subspace** is a ``[k, d]`` set of spanning vectors (``k >= 1`` rows, linearly
  independent). :func:`orthonormal_basis` turns it into ``k`` orthonormal rows ``Q`` (float64,
  QR, its rank checked by SVD), and the split is the orthogonal projection onto the span::

      u_par = (u Q^T) Q,   u_perp = u - u_par    (u_perp . q = 0 for every row q of Q)

  A ``[1, d]`` subspace is a direction: it takes the ``a * r`` path, bit for bit.

Compute dtype: float64 inputs stay float64; everything else is computed in float32 at least
(fp16 / bf16 are upcast), as METHOD sec. 1 says. ``u_perp`` is ``u - u_par``, so
``u_par + u_perp`` gives ``u`` back up to one rounding of the larger part.

Baseline: a random vector's parallel *energy* share ``||u_par||^2 / ||u||^2`` against a random
``k``-dimensional subspace of ``R^d`` has expectation ``k / d`` (:func:`random_energy_share`);
report it beside every share measured against a ``k``-subspace (``k = 1``: the random line's
``1 / d``).
"""

from __future__ import annotations

import functools
import inspect

import torch
from jaxtyping import Float
from torch import Tensor

from .errors import TLDirectionalError
from .geometry import (
    DEFAULT_EPS,
    PERP_VANISH_ULPS,
    SplitStats,
    check_eps,
    compute_dtype,
    parallel_part,
)

#: Default relative rank tolerance: a singular value below ``rtol * largest`` counts as zero.
DEFAULT_RTOL = 1e-10


class SubspaceError(TLDirectionalError, ValueError):
    """A reference direction or subspace that cannot be used (shape, zero, NaN, degenerate span)."""


def _describe(value: Tensor) -> str:
    return f"shape {tuple(value.shape)}, dtype {value.dtype}"


def check_directions(directions: object, *, argument: str = "reference",
                     width: int | None = None) -> Tensor:
    """``directions`` as a ``[k, d]`` floating tensor (a ``[d]`` vector becomes ``[1, d]``),
    after checking its type, rank, width (``width``, when given), that it is finite and that no
    row is zero. Raises :class:`SubspaceError` (a ``ValueError``) naming ``argument``."""
    if not isinstance(directions, Tensor) or not directions.is_floating_point():
        raise SubspaceError(
            f"{argument} must be a floating torch tensor of shape [d] (one direction) or [k, d] "
            f"(a subspace), got {type(directions).__name__}"
            + (f" of dtype {directions.dtype}" if isinstance(directions, Tensor) else "")
            + "; pass e.g. torch.as_tensor(vector, dtype=torch.float32)")
    if directions.ndim not in (1, 2) or directions.shape[-1] == 0 or (
            directions.ndim == 2 and directions.shape[0] == 0):
        raise SubspaceError(
            f"{argument} must be [d] (one direction) or [k, d] with k >= 1 (a subspace), got "
            f"{_describe(directions)}; stack the spanning vectors as rows")
    rows = directions.reshape(-1, directions.shape[-1])
    if width is not None and rows.shape[-1] != width:
        raise SubspaceError(
            f"{argument} has width {rows.shape[-1]} but the space it splits has width {width} "
            f"({_describe(directions)}): a direction for another space (d_model vs d_head) or "
            f"another model; take it from this model's width-{width} space")
    finite = torch.isfinite(rows)
    if not bool(finite.all()):
        bad = sorted({int(i) for i in (~finite).any(-1).nonzero().flatten()})
        raise SubspaceError(
            f"{argument} has NaN or inf entries in row(s) {bad[:8]} ({_describe(directions)}); "
            "a direction must be finite: check where it was computed (a 0/0 normalisation?)")
    norms = rows.detach().to(torch.float64).norm(dim=-1)
    zero = (norms == 0).nonzero().flatten()
    if len(zero):
        raise SubspaceError(
            f"{argument} has zero row(s) {[int(i) for i in zero[:8]]} ({_describe(directions)}); a "
            "zero vector spans no direction: drop it or pass the direction you meant")
    return rows


def _checks_first(fn):
    """Decorator: run this module's argument checks (:func:`check_directions` on ``directions`` /
    ``basis``, the update check on ``u``) before ``fn``, so that a user's mistake gets this
    module's error (naming the argument and the fix) also under a runtime type checker, which
    jaxtyping's import hook puts innermost, below this wrapper (as in ``core.geometry``)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # Python's own argument error
        bound.apply_defaults()
        values = bound.arguments
        name = values.get("argument", "reference")
        if "u" in values:
            _check_update(values["u"])
            width = values["u"].shape[-1]
        else:
            width = values.get("width")
        check_directions(values.get("basis", values.get("directions")), argument=name, width=width)
        return fn(*args, **kwargs)

    return checked


def _check_update(u: object) -> None:
    if not isinstance(u, Tensor) or not u.is_floating_point() or u.ndim == 0:
        raise SubspaceError(f"u must be a floating torch tensor [*batch, d], got "
                            f"{type(u).__name__}" + (f" {_describe(u)}" if isinstance(u, Tensor) else ""))


@_checks_first
def orthonormal_basis(
    directions: Float[Tensor, "*k d"],
    *,
    argument: str = "reference",
    width: int | None = None,
    rtol: float = DEFAULT_RTOL,
) -> Float[Tensor, "k d"]:
    """Orthonormal rows spanning ``directions`` (``[d]`` or ``[k, d]``), in float64.

    Args:
        directions: one direction ``[d]`` or ``k`` spanning vectors ``[k, d]``.
        argument: the user's name for it, used in every error message.
        width: the width ``d`` the directions must have (``d_model``), checked when given.
        rtol: relative rank tolerance: a singular value of the row-normalised ``[k, d]`` matrix
            below ``rtol * largest`` counts as zero.

    Returns:
        ``Q`` of shape ``[k, d]``, float64, ``Q Q^T = I_k`` to float64 round-off, spanning the
        same subspace (row ``i`` is the Gram-Schmidt order: row 0 is ``directions[0]`` normalised,
        up to sign).

    Raises:
        SubspaceError: (a ``ValueError``) not a floating tensor, wrong rank or width, NaN /
            inf, a zero row, or a span of rank below ``k`` (the rank found is named).
    """
    if not (isinstance(rtol, float | int) and 0 < rtol < 1):
        raise SubspaceError(f"rtol must be a number in (0, 1) (a relative rank tolerance), got "
                            f"{rtol!r}; pass e.g. rtol={DEFAULT_RTOL}")
    rows = check_directions(directions, argument=argument, width=width).detach().to(torch.float64)
    k, d = rows.shape
    # Normalise rows first so that the rank test does not depend on the vectors' lengths.
    unit = rows / rows.norm(dim=-1, keepdim=True)
    singular = torch.linalg.svdvals(unit)
    rank = int((singular > rtol * singular[0]).sum())
    if rank < k:
        raise SubspaceError(
            f"{argument} ({_describe(directions)}) spans a subspace of rank {rank}, below its "
            f"{k} rows" + (f" (at most d={d} directions are independent in width {d})" if k > d else "")
            + f": some rows are (nearly) linear combinations of others (rtol={rtol}). Drop the "
            "dependent rows, or pass an orthonormal basis of the span you mean")
    q, r = torch.linalg.qr(unit.T, mode="reduced")  # unit.T = q r, q: [d, k]
    # Fix QR's sign freedom so that row i points along directions[i]'s new component.
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return (q * signs).T.contiguous()


@_checks_first
def split_against(
    u: Float[Tensor, "*batch d"],
    basis: Float[Tensor, "*k d"],
    *,
    eps: float = DEFAULT_EPS,
    argument: str = "reference",
) -> tuple[Float[Tensor, "*batch d"], Float[Tensor, "*batch d"]]:
    """``(u_par, u_perp)``: ``u`` split against a direction ``[d]`` or a subspace ``[k, d]``.

    Args:
        u: the update, ``[*batch, d]``.
        basis: one direction ``[d]`` (or ``[1, d]``), split as METHOD sec. 1's ``a * r``
            (bit for bit :func:`~tl_directional.core.geometry.decompose`'s ``par`` / ``perp``,
            including its degenerate rule for tokens with ``||u||^2 <= eps``); or ``k >= 2``
            spanning rows ``[k, d]`` (orthonormal or not: :func:`orthonormal_basis` is applied,
            in float64), split by orthogonal projection onto their span.
        eps: the degeneracy threshold on squared norms of the direction path (METHOD sec. 1).
        argument: the name used in error messages for ``basis``.

    Returns:
        ``(u_par, u_perp)``, each ``[*batch, d]`` in the compute dtype (float64 stays float64,
        anything else float32); ``u_perp = u - u_par``.

    Raises:
        SubspaceError: (a ``ValueError``) ``basis`` is unusable (see :func:`orthonormal_basis`)
            or ``u``'s last axis does not have its width.
    """
    _check_update(u)
    eps = check_eps(eps)
    rows = check_directions(basis, argument=argument, width=u.shape[-1])
    dtype = compute_dtype(u.dtype)
    x = u.to(dtype)
    if rows.shape[0] == 1:
        r = rows[0].to(dtype)
        par = parallel_part(x, r, eps)
        return par, x - par
    q = orthonormal_basis(rows, argument=argument).to(device=x.device, dtype=dtype)
    par = (x @ q.T) @ q
    return par, x - par


def subspace_stats(
    u: Float[Tensor, "*batch d"],
    basis: Float[Tensor, "k d"],
    eps: float = DEFAULT_EPS,
) -> SplitStats:
    """Per-token scalars of ``u`` split against the span of the orthonormal rows ``basis``
    (``Q`` from :func:`orthonormal_basis`), METHOD.md sec. 1 generalised to a ``k``-subspace.

    ``u_par = (u Q^T) Q`` and ``u_perp = u - u_par`` in the compute dtype of ``u``;
    ``par_frac = ||u_par|| / ||u||``, ``par_perp_ratio = ||u_par|| / ||u_perp||`` (``inf`` where
    ``u_perp`` vanishes, as for a line), ``par_sq`` / ``perp_sq`` the two squared norms. A
    subspace has no single scale and no length, so ``alpha`` and ``rel_update`` are NaN. A
    token with ``||u||^2 <= eps`` is degenerate (``par_sq = 0``, ``par_frac = 0``). Shapes: every
    field ``[*batch]``.
    """
    dtype = compute_dtype(u.dtype)
    x = u.to(dtype)
    q = basis.to(device=x.device, dtype=dtype)
    par = (x @ q.T) @ q
    perp = x - par
    u_sq = (x * x).sum(-1)
    par_sq = (par * par).sum(-1)
    perp_sq = (perp * perp).sum(-1)
    degenerate = u_sq <= eps
    par_sq = torch.where(degenerate, 0.0, par_sq)
    par_norm = par_sq.sqrt()
    par_frac = torch.where(degenerate, 0.0,
                           (par_norm / torch.where(degenerate, 1.0, u_sq.sqrt())).clamp(0.0, 1.0))
    machine_eps = torch.finfo(dtype).eps
    perp_vanishes = perp_sq <= eps + (PERP_VANISH_ULPS * machine_eps) ** 2 * u_sq
    par_perp_ratio = torch.where(
        degenerate, 0.0, torch.where(perp_vanishes, float("inf"),
                                     par_norm / torch.where(perp_vanishes, 1.0, perp_sq.sqrt())))
    nan = torch.full_like(u_sq, float("nan"))
    return SplitStats(alpha=nan, par_frac=par_frac, par_perp_ratio=par_perp_ratio, rel_update=nan.clone(),
                      degenerate=degenerate, par_sq=par_sq, perp_sq=perp_sq)


def random_energy_share(k: int, d: int) -> float:
    """``k / d``: the expected parallel energy share ``E ||u_par||^2 / ||u||^2`` of a fixed vector
    against a uniformly random ``k``-dimensional subspace of ``R^d`` (equivalently, of a uniformly
    random vector against a fixed one); the baseline to report beside every share measured
    against a ``k``-subspace. ``k = 1`` is the random line's ``1 / d``."""
    for name, value in (("k", k), ("d", d)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if k > d:
        raise ValueError(f"k={k} must be at most d={d}: a subspace of R^{d} has at most {d} dimensions")
    return k / d


__all__ = [
    "DEFAULT_RTOL",
    "SubspaceError",
    "check_directions",
    "orthonormal_basis",
    "random_energy_share",
    "split_against",
    "subspace_stats",
]
