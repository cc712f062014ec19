"""The one resolver of every ``reference=`` argument: what an analysis verb splits an update
against, checked once against the model it runs on (METHOD.md sec. 1, generalised to a subspace
in :mod:`tl_directional.core.subspace`).

:func:`resolve_reference` turns what a user passes into a :class:`Reference`:

* ``None`` or ``"input"`` (the default of every verb): the live stream each update is added to
  (METHOD sec. 2), read by the verb itself; a line, so the random level is ``1 / d``;
* a ``[d]`` tensor (or ``[1, d]``): one direction for every layer (an SAE decoder row, a
  steering vector, a probe's weights, a logit-difference direction);
* a ``[n_layers, d]`` tensor with ``per_layer=True``: row ``L`` for layer ``L``;
* a ``[k, d]`` tensor (``per_layer`` False or not given): the subspace its rows span,
  orthonormalised in float64; the random level of the energy share is ``k / d``. A 2-D tensor
  with exactly ``n_layers`` rows is ambiguous and needs ``per_layer=True`` or ``per_layer=False``;
* a :class:`~tl_directional.core.direction.Direction`: its vectors, read as above (its own
  ``per_layer`` decides), after checking that its ``space`` is the verb's and that the model it
  came from had its weights processed the same way as this model (TransformerLens issue #642:
  folding LayerNorm and centring the writing weights change the stream's coordinates, so a
  direction from a processed model means something else in an unprocessed one).

``d`` is ``d_model`` for ``space="resid"`` and ``d_head`` for ``space="value"``. Every error is a
:class:`~tl_directional.core.subspace.SubspaceError` (a ``ValueError``) naming the argument, the
bad value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from ..core.direction import Direction, check_processing_matches
from ..core.geometry import (
    DEFAULT_EPS,
    Decomposition,
    SplitStats,
    compute_dtype,
    decompose,
    parallel_part,
)
from ..core.kernels import split_stats
from ..core.subspace import (
    SubspaceError,
    check_directions,
    orthonormal_basis,
    random_energy_share,
    subspace_stats,
)
from .structure import detect_weight_processing

#: The default reference: each update against the stream it is added to.
INPUT = "input"
#: What a resolved reference can be.
KINDS = ("stream", "direction", "per_layer", "subspace")
_SPACE_WIDTH = {"resid": "d_model", "value": "d_head"}


@dataclass(frozen=True, eq=False)
class Reference:
    """A resolved ``reference=``: per layer, what an update is split against.

    Attributes:
        kind: ``"stream"`` (the live stream, the default), ``"direction"`` (one ``[d]`` row for
            every layer), ``"per_layer"`` (row ``L`` for layer ``L``) or ``"subspace"`` (the span
            of ``k`` rows).
        d: the width of the space (``d_model`` or ``d_head``).
        k: the dimension of the span per layer (1 for the stream, a direction or a per-layer set).
        space: ``"resid"`` or ``"value"``.
        argument: the user's name of the argument (used in messages).
        rows: ``[1, d]`` (direction) or ``[n_layers, d]`` (per layer) as given (detached), or the
            float64 orthonormal basis ``Q`` ``[k, d]`` (subspace); None for the stream.
        direction: the :class:`~tl_directional.core.direction.Direction` it came from, if any.
    """

    kind: str
    d: int
    k: int = 1
    space: str = "resid"
    argument: str = "reference"
    rows: Tensor | None = None
    direction: Direction | None = None

    @property
    def is_stream(self) -> bool:
        """Whether this is the default: the live stream each update is added to."""
        return self.kind == "stream"

    @property
    def random_energy_share(self) -> float:
        """``k / d``: a random update's expected parallel energy share against a span of this
        dimension (``1 / d`` for the stream and for a direction)."""
        return random_energy_share(self.k, self.d)

    def describe(self) -> str:
        """A short text for tables and metadata: ``"stream"``, ``"direction"``,
        ``"per_layer"`` or ``"subspace(k=3)"`` (with the Direction's source, if any)."""
        text = f"subspace(k={self.k})" if self.kind == "subspace" else self.kind
        return text if self.direction is None else f"{text} from {self.direction.source}"

    def vector(self, layer: int) -> Float[Tensor, " d"]:
        """The ``[d]`` direction used at ``layer`` (a direction or a per-layer set only)."""
        if self.kind == "direction":
            return self.rows[0]
        if self.kind == "per_layer":
            return self.rows[layer]
        raise SubspaceError(f"{self.argument} is a {self.describe()}, not one direction per layer")

    def parallel(
        self,
        u: Float[Tensor, "*#batch d"],
        stream: Float[Tensor, "*#batch d"] | None,
        layer: int,
        eps: float = DEFAULT_EPS,
    ) -> Float[Tensor, "*#batch d"]:
        """``u_par``, in ``u``'s compute dtype: against ``stream`` (the stream kind, bit for bit
        :func:`~tl_directional.core.geometry.parallel_part`), the layer's direction (``a r``),
        or the subspace's orthogonal projection ``(u Q^T) Q``."""
        if self.kind == "stream":
            return parallel_part(u, stream, eps)
        dtype = compute_dtype(u.dtype)
        if self.kind == "subspace":
            x = u.to(dtype)
            q = self.rows.to(device=x.device, dtype=dtype)
            return (x @ q.T) @ q
        return parallel_part(u, self.vector(layer).to(device=u.device, dtype=dtype), eps)

    def split(self, u, stream, layer: int, eps: float = DEFAULT_EPS) -> tuple[Tensor, Tensor]:
        """``(u_par, u_perp)`` (see :meth:`parallel`), ``u_perp = u - u_par`` in the compute dtype."""
        par = self.parallel(u, stream, layer, eps)
        return par, u.to(par.dtype) - par

    def decompose(self, u, stream, layer: int, eps: float = DEFAULT_EPS) -> Decomposition:
        """The parts and the per-token scalars together: bit for bit
        :func:`~tl_directional.core.geometry.decompose` against the stream; against a direction or
        subspace :meth:`stats` with :meth:`split`'s parts."""
        if self.kind == "stream":
            return decompose(u, stream, eps)
        par, perp = self.split(u, stream, layer, eps)
        s = self.stats(u, stream, layer, eps)
        return Decomposition(alpha=s.alpha, par_frac=s.par_frac, par_perp_ratio=s.par_perp_ratio,
                             rel_update=s.rel_update, degenerate=s.degenerate, par_sq=s.par_sq,
                             perp_sq=s.perp_sq, par=par, perp=perp)

    def stats(self, u, stream, layer: int, eps: float = DEFAULT_EPS) -> SplitStats:
        """Per-token scalars of the split (:func:`~tl_directional.core.kernels.split_stats`
        against the stream or the layer's direction; for a subspace
        :func:`~tl_directional.core.subspace.subspace_stats`, whose ``alpha`` / ``rel_update``
        are NaN)."""
        if self.kind == "stream":
            return split_stats(u, stream, eps)
        dtype = compute_dtype(u.dtype)
        if self.kind == "subspace":
            return subspace_stats(u, self.rows, eps)
        r = self.vector(layer).to(device=u.device, dtype=dtype)
        return split_stats(u, r.expand(u.shape), eps)


def _model_width(model, space: str) -> int:
    return int(getattr(model.cfg, _SPACE_WIDTH[space]))


def _check_direction(model, direction: Direction, *, argument: str, space: str, per_layer) -> bool:
    """Refuse a Direction for another space or from a model whose weights were processed
    differently; returns how to read its rows (its own ``per_layer``)."""
    if direction.space != space:
        raise SubspaceError(
            f"{argument} is a Direction in {direction.space!r} space (width {direction.width}), but "
            f"this verb splits {space!r} vectors (width {_SPACE_WIDTH[space]}="
            f"{_model_width(model, space)}); pass a Direction(space={space!r}) taken from that space")
    if per_layer is not None and bool(per_layer) != direction.per_layer:
        raise SubspaceError(
            f"per_layer={per_layer!r} contradicts {argument}'s own per_layer={direction.per_layer} "
            f"({direction!r}); leave per_layer unset (the Direction decides) or rebuild the Direction")
    if direction.weights_processed is not None:
        check_processing_matches(direction, detect_weight_processing(model).any, argument=argument)
    return direction.per_layer


def resolve_reference(
    model,
    reference: object = None,
    *,
    per_layer: bool | None = None,
    argument: str = "reference",
    space: str = "resid",
) -> Reference:
    """Resolve and check a verb's ``reference=`` against ``model`` (see the module docstring).

    Args:
        model: the TransformerLens model (bridge or legacy) the verb runs on; its
            ``cfg.d_model`` / ``cfg.d_head`` / ``cfg.n_layers`` and weight processing are read.
        reference: None / ``"input"`` (the stream), a ``[d]`` / ``[k, d]`` / ``[n_layers, d]``
            floating tensor, or a :class:`~tl_directional.core.direction.Direction`.
        per_layer: read a 2-D tensor as one row per layer (True) or as a subspace (False);
            needed only when it has exactly ``n_layers`` rows. A Direction's own flag decides.
        argument: the user's name of the argument, used in every message.
        space: ``"resid"`` (width ``d_model``) or ``"value"`` (width ``d_head``).

    Returns:
        A :class:`Reference`.

    Raises:
        SubspaceError: (a ``ValueError``) an unknown string or type; wrong width (a direction
            for another space or another model); a zero row; NaN / inf; a degenerate span (rank
            below its rows); an ambiguous ``[n_layers, d]`` tensor without ``per_layer``; a
            per-layer set with the wrong number of rows; a Direction for another space or from
            a model whose weights were processed differently.
    """
    if space not in _SPACE_WIDTH:
        raise SubspaceError(f"space must be one of {tuple(_SPACE_WIDTH)}, got {space!r}")
    d = _model_width(model, space)
    n_layers = int(model.cfg.n_layers)
    if reference is None or (isinstance(reference, str) and reference == INPUT):
        return Reference("stream", d=d, space=space, argument=argument)
    direction = None
    if isinstance(reference, Direction):
        direction = reference
        per_layer = _check_direction(model, reference, argument=argument, space=space, per_layer=per_layer)
        reference = reference.vectors
    if isinstance(reference, str) or not isinstance(reference, Tensor) or not reference.is_floating_point():
        raise SubspaceError(
            f"{argument} must be None or {INPUT!r} (each update against the stream it is added to), a "
            f"floating tensor ([{_SPACE_WIDTH[space]}], [k, {_SPACE_WIDTH[space]}] or [n_layers, "
            f"{_SPACE_WIDTH[space]}] with per_layer=True) or a tld.Direction, got "
            + (repr(reference) if isinstance(reference, str) else type(reference).__name__
               + (f" of dtype {reference.dtype}" if isinstance(reference, Tensor) else "")))
    if per_layer is not None and not isinstance(per_layer, bool):
        raise SubspaceError(f"per_layer must be None, True or False, got {per_layer!r}")
    ref = reference.detach()
    if ref.ndim == 2 and per_layer is None and ref.shape[0] == n_layers and n_layers > 1:
        raise SubspaceError(
            f"{argument} has shape {tuple(ref.shape)}: {n_layers} rows is both a per-layer set "
            f"([n_layers, {_SPACE_WIDTH[space]}]) and a {n_layers}-dimensional subspace; pass "
            "per_layer=True (row L for layer L) or per_layer=False (their span)")
    if per_layer:
        if ref.ndim != 2 or ref.shape[0] != n_layers:
            raise SubspaceError(
                f"{argument} with per_layer=True must be [n_layers={n_layers}, {_SPACE_WIDTH[space]}={d}], "
                f"got shape {tuple(ref.shape)}; one row per layer")
        rows = check_directions(ref, argument=argument, width=d)
        return Reference("per_layer", d=d, space=space, argument=argument, rows=rows, direction=direction)
    rows = check_directions(ref, argument=argument, width=d)  # rank, width, finite, no zero row
    if rows.shape[0] == 1:
        return Reference("direction", d=d, space=space, argument=argument, rows=rows, direction=direction)
    q = orthonormal_basis(rows, argument=argument, width=d)
    return Reference("subspace", d=d, k=int(q.shape[0]), space=space, argument=argument, rows=q,
                     direction=direction)


__all__ = ["INPUT", "KINDS", "Reference", "resolve_reference"]
