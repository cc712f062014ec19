"""Measure: per-layer and per-head geometry of a model's updates (METHOD.md sec. 1-3).

:func:`profile` streams a corpus through the model with read-only hooks that
decompose each update inside the forward pass and add it to fixed-size
accumulators (:class:`~tl_directional.core.stats.StreamingSummary`), so memory does
not grow with the number of tokens and no ``ActivationCache`` is held.
:meth:`Profile.from_cache` computes the same tables from a cache a user already has.

The modules, by job: :mod:`~tl_directional.measure.profiler` (:func:`profile`, :class:`Profile`),
:mod:`~tl_directional.measure.stream` (the accumulator, the hook actions and the metric names),
:mod:`~tl_directional.measure.carrier` (the MLP-carrier columns), :mod:`~tl_directional.measure.cosine`
(the drop-cosine statistics), :mod:`~tl_directional.measure.cache_hooks` (:func:`required_hooks`)
and :mod:`~tl_directional.measure.stacks` (an ``ActivationCache``'s ``decompose_resid`` /
``stack_head_results`` stacks split against the stream or any direction or subspace).
"""

from .cache_hooks import required_hooks
from .carrier import CARRIER_COLUMNS, carrier_profile
from .profile_tables import FACTORIZATION_METRICS
from .profiler import Profile, profile
from .stacks import StackSplit, StackSplitError, split_decompose_resid, split_stack_head_results
from .stream import DROP_COSINE_METRICS, EXCLUSIVE_METRICS, RESIDUAL_METRICS, VALUE_METRICS

__all__ = [
    "CARRIER_COLUMNS",
    "DROP_COSINE_METRICS",
    "EXCLUSIVE_METRICS",
    "FACTORIZATION_METRICS",
    "RESIDUAL_METRICS",
    "VALUE_METRICS",
    "Profile",
    "StackSplit",
    "StackSplitError",
    "carrier_profile",
    "profile",
    "required_hooks",
    "split_decompose_resid",
    "split_stack_head_results",
]
