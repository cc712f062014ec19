"""Patching: directional activation patching, attribution patching, path patching and the split
direct logit attribution, with the one result type they share.

:func:`directional_patch` (:mod:`~tl_directional.evaluate.patching.patching`; its hooks in
:mod:`~tl_directional.evaluate.patching.patch_hooks`) patches the parallel / perpendicular part of
one site at a time from a clean run into a corrupted one; :func:`attribution_patch`
(:mod:`~tl_directional.evaluate.patching.attribution`, the scores in
:mod:`~tl_directional.evaluate.patching.attribution_scores`) is its first-order estimate from one
backward pass; :func:`path_patch` (:mod:`~tl_directional.evaluate.patching.path_patching`, its
nodes and hooks in :mod:`~tl_directional.evaluate.patching.path_nodes` /
:mod:`~tl_directional.evaluate.patching.path_hooks`) patches along one sender -> receiver path;
:func:`split_logit_attribution` (:mod:`~tl_directional.evaluate.patching.logit_attribution`)
splits each head's direct logit attribution. All but the last return a
:class:`DirectionalResult` (:mod:`~tl_directional.evaluate.patching.result`); the cache and
metric checks they share live in :mod:`~tl_directional.evaluate.patching.cache_input`, and the
stacked forward of several patched copies (with how many fit in one) that directional and path
patching both run in :mod:`~tl_directional.evaluate.patching.stacked`.
"""

from .attribution import NODE_TYPES, attribution_hooks, attribution_patch
from .attribution_scores import AttributionError
from .cache_input import PatchingInputError
from .logit_attribution import split_logit_attribution
from .patching import WHICH, directional_patch
from .path_nodes import PathPatchError, Receiver, Sender
from .path_patching import path_patch
from .result import DirectionalResult, ResultError

__all__ = [
    "NODE_TYPES",
    "WHICH",
    "AttributionError",
    "DirectionalResult",
    "PathPatchError",
    "PatchingInputError",
    "Receiver",
    "ResultError",
    "Sender",
    "attribution_hooks",
    "attribution_patch",
    "directional_patch",
    "path_patch",
    "split_logit_attribution",
]
