"""A reference direction (or subspace) together with where it came from.

Pure data, no model. :class:`Direction` is what the direction constructors return (an SAE's
decoder rows, an unembedding difference, a probe's weights, a mean difference of two prompt
sets) and what every ``reference=`` argument accepts beside a plain tensor. The vectors live in
one space of width ``d`` on the last axis (``d_model`` for the residual stream, ``d_head`` for a
head's values):

* ``[d]``: one direction;
* ``[k, d]`` with ``per_layer=False``: the subspace the ``k`` rows span
  (:mod:`tl_directional.core.subspace` orthonormalises it in float64);
* ``[n_layers, d]`` with ``per_layer=True``: row ``L`` is layer ``L``'s direction.

Provenance is kept so that a mismatch can be named before anything runs: the space and width,
the hook point and layer it was read at, and whether the model it came from had its weights
processed (TransformerLens's ``fold_ln`` / ``center_writing_weights`` / ``center_unembed``
change the stream's coordinates, so a direction from a processed model does not mean the same
thing in an unprocessed one: TransformerLens issue #642).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor

from .errors import TLDirectionalError
from .subspace import SubspaceError

#: The spaces a direction can live in.
SPACES = ("resid", "value")


class DirectionError(TLDirectionalError, ValueError):
    """A :class:`Direction` built from bad parts (not a tensor, wrong rank, unknown space)."""


class DirectionMismatchError(DirectionError, SubspaceError):
    """A direction taken from a model whose weights were processed differently from the model it
    is applied to (both a :class:`DirectionError` and a :class:`SubspaceError`: the edits and the
    reference resolver raise this one error)."""


@dataclass(frozen=True)
class Direction:
    """A direction or subspace to split against, with its provenance.

    Attributes:
        vectors: ``[d]``, ``[k, d]`` or (``per_layer=True``) ``[n_layers, d]`` floating tensor.
        source: where it came from, e.g. ``"sae_decoder"``, ``"unembedding"``, ``"probe"``,
            ``"mean_difference"``, ``"tensor"``.
        space: ``"resid"`` (width ``d_model``) or ``"value"`` (width ``d_head``).
        hook_name: the TransformerLens hook point it was read at or is meant for (None: any).
        layer: the layer it belongs to (None: any, or per-layer).
        per_layer: read a 2-D ``vectors`` as one row per layer rather than a subspace.
        weights_processed: whether the model it was taken from had processed weights (folded
            LayerNorm or centred writing weights); None when unknown (a hand-made tensor).
        details: free-form provenance (feature ids, token ids, file path, SAE id, norms).
    """

    vectors: Tensor
    source: str = "tensor"
    space: str = "resid"
    hook_name: str | None = None
    layer: int | None = None
    per_layer: bool = False
    weights_processed: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        v = self.vectors
        if not isinstance(v, Tensor) or not v.is_floating_point():
            raise DirectionError(
                f"Direction.vectors must be a floating torch tensor, got {type(v).__name__}"
                + (f" of dtype {v.dtype}" if isinstance(v, Tensor) else "")
                + "; pass e.g. torch.as_tensor(vector, dtype=torch.float32)")
        if v.ndim not in (1, 2):
            raise DirectionError(f"Direction.vectors must be [d] or [k, d], got shape {tuple(v.shape)}")
        if self.per_layer and v.ndim != 2:
            raise DirectionError(f"Direction(per_layer=True) needs [n_layers, d] vectors, got shape {tuple(v.shape)}")
        if self.space not in SPACES:
            raise DirectionError(f"Direction.space must be one of {SPACES}, got {self.space!r}")

    @property
    def width(self) -> int:
        """``d``: the width of the space the vectors live in."""
        return int(self.vectors.shape[-1])

    @property
    def k(self) -> int:
        """Rows: 1 for a direction, ``k`` for a subspace, ``n_layers`` for a per-layer set."""
        return 1 if self.vectors.ndim == 1 else int(self.vectors.shape[0])

    def to(self, *args, **kwargs) -> Direction:
        """The same direction with ``vectors.to(*args, **kwargs)`` (device / dtype)."""
        return replace(self, vectors=self.vectors.to(*args, **kwargs))

    def __repr__(self) -> str:
        where = ", ".join(f"{k}={v!r}" for k, v in (("hook_name", self.hook_name), ("layer", self.layer))
                          if v is not None)
        shape = list(self.vectors.shape)
        return (f"Direction({self.source!r}, space={self.space!r}, shape={shape}"
                + (", per_layer=True" if self.per_layer else "") + (f", {where}" if where else "")
                + f", weights_processed={self.weights_processed})")


def check_processing_matches(direction: Direction, weights_processed: bool, *, argument: str) -> None:
    """Refuse ``direction`` on a model whose weights are ``weights_processed`` when the direction
    records the other state (TransformerLens issue #642: folding LayerNorm and centring the writing
    weights change the stream's coordinates). Unknown provenance (None) passes.

    Raises:
        DirectionMismatchError: the two states differ; the message names the fix.
    """
    if direction.weights_processed is None or bool(direction.weights_processed) == bool(weights_processed):
        return
    was, now = ("processed", "unprocessed") if direction.weights_processed else ("unprocessed", "processed")
    raise DirectionMismatchError(
        f"{argument} was taken from a model with {was} weights ({direction!r}), but this model's weights "
        f"are {now}: weight processing (folded LayerNorm, centred writing weights) changes the residual "
        "stream's coordinates, so the direction means something else here (TransformerLens issue #642). "
        "Load this model the same way the direction's model was loaded (tl_directional.load_model gives "
        "unprocessed weights; HookedTransformer.from_pretrained processes them, "
        "from_pretrained_no_processing does not; a TransformerBridge processes them in "
        "enable_compatibility_mode), or re-take the direction from this model; to apply it anyway, pass "
        "direction.vectors as a plain tensor")


def reference_tensor(reference: object) -> tuple[object, Direction | None]:
    """``(tensor_or_value, direction)``: a :class:`Direction`'s vectors and the direction itself,
    or ``reference`` unchanged and None (a plain tensor, a string such as ``"input"``, None)."""
    if isinstance(reference, Direction):
        return reference.vectors, reference
    return reference, None


__all__ = ["SPACES", "Direction", "DirectionError", "DirectionMismatchError", "check_processing_matches",
           "reference_tensor"]
