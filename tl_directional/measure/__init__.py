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
``stack_head_results`` stacks split against the stream or any direction or subspace),
:mod:`~tl_directional.measure.sae_weights` (an SAE's weights read without SAELens) and
:mod:`~tl_directional.measure.sae` (SAE decoder rows as directions, an SAE's reconstruction and
error term split against the stream) and :mod:`~tl_directional.measure.directions` (directions from the unembedding, a probe, or a mean
difference of two prompt sets).
"""

from .cache_hooks import required_hooks
from .carrier import CARRIER_COLUMNS, carrier_profile
from .directions import mean_difference_direction, probe_direction, unembedding_direction
from .profile_tables import FACTORIZATION_METRICS
from .profiler import Profile, profile
from .sae import SAESplit, sae_directions, sae_split
from .sae_weights import SAEError, SAEWeights, bundled_sae_path, load_sae_weights
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
    "SAEError",
    "SAESplit",
    "SAEWeights",
    "StackSplit",
    "StackSplitError",
    "bundled_sae_path",
    "carrier_profile",
    "load_sae_weights",
    "mean_difference_direction",
    "probe_direction",
    "profile",
    "required_hooks",
    "sae_directions",
    "sae_split",
    "split_decompose_resid",
    "split_stack_head_results",
    "unembedding_direction",
]
