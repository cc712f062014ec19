"""The split logit lens: each layer's residual stream read through the unembedding, split into the
part parallel to the stream before it and the perpendicular rest.

:func:`split_logit_lens` and :class:`SplitLensResult` live in
:mod:`~tl_directional.evaluate.lens.lens`; its input checks (:class:`LensInputError`, the
:data:`ORDERINGS` of the additive split) in :mod:`~tl_directional.evaluate.lens.lens_inputs`.
"""

from .lens import SplitLensResult, split_logit_lens
from .lens_inputs import ORDERINGS, LensInputError

__all__ = ["ORDERINGS", "LensInputError", "SplitLensResult", "split_logit_lens"]
