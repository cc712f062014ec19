"""Patching: directional activation patching, attribution patching, path patching and the split
direct logit attribution, with the one result type they share.

:func:`generic_directional_patch` (:mod:`~tl_directional.evaluate.patching.generic`) is the one
patching loop: the two call shapes, the patched runs chunked into stacked forwards that start at a
block (with how many fit in one), the metric of each copy, then the tabulator; a patcher gives it a
plan, a patch setter and a tabulator. :func:`directional_patch`
(:mod:`~tl_directional.evaluate.patching.patching`; its hooks in
:mod:`~tl_directional.evaluate.patching.patch_hooks`) is that loop patching the parallel /
perpendicular part of one site at a time from a clean run into a corrupted one, and
:func:`directional_patch_resid_pre`, :func:`directional_patch_attn`, :func:`directional_patch_mlp`
and :func:`directional_patch_value` are its one-component ``functools.partial`` s (as
TransformerLens's ``get_act_patch_*``); :func:`path_patch`
(:mod:`~tl_directional.evaluate.patching.path_patching`, its nodes and hooks in
:mod:`~tl_directional.evaluate.patching.path_nodes` /
:mod:`~tl_directional.evaluate.patching.path_hooks`) is the same loop patching along one sender ->
receiver path. :func:`attribution_patch` (:mod:`~tl_directional.evaluate.patching.attribution`,
the scores in :mod:`~tl_directional.evaluate.patching.attribution_scores`) is the first-order
estimate from one backward pass; :func:`split_logit_attribution`
(:mod:`~tl_directional.evaluate.patching.logit_attribution`) splits each head's direct logit
attribution. All but the last return a :class:`DirectionalResult`
(:mod:`~tl_directional.evaluate.patching.result`); the cache and metric checks they share live in
:mod:`~tl_directional.evaluate.patching.cache_input`.
"""

from .attribution import NODE_TYPES, attribution_hooks, attribution_patch
from .attribution_scores import AttributionError
from .cache_input import PatchingInputError
from .generic import generic_directional_patch
from .logit_attribution import split_logit_attribution
from .patching import (
    WHICH,
    directional_patch,
    directional_patch_attn,
    directional_patch_mlp,
    directional_patch_resid_pre,
    directional_patch_value,
)
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
    "directional_patch_attn",
    "directional_patch_mlp",
    "directional_patch_resid_pre",
    "directional_patch_value",
    "generic_directional_patch",
    "path_patch",
    "split_logit_attribution",
]
