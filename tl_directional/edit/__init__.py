"""Edit: component-scaling hook functions for TransformerLens workflows (METHOD.md sec. 4).

Every edit is an object with ``.fwd_hooks(model)``, a list of
``(hook_name, hook_fn)`` pairs for ``model.run_with_hooks(..., fwd_hooks=...)``
or ``with model.hooks(fwd_hooks=...)``; :func:`apply_edits` is a context
manager doing the latter for several edits, always removing its hooks.

One scaling form everywhere: ``y~ = s_par * y_par + s_perp * y_perp``, applied
as ``y + (s_par - 1) y_par + (s_perp - 1) y_perp`` so scale 1 is a bit-exact
no-op. Edits are differentiable (nothing is detached) so training can use them.

Scopes: ``layers`` (None = all), ``heads`` (value space and pattern edits; query
heads, GQA-aware), ``positions`` (absolute query positions: int, list, slice, or
bool mask ``[pos]`` / ``[batch, pos]``; right during KV-cached generation).
Scales: a float; a ``[n_layers]`` tensor (per layer); a ``[n_layers, n_heads]``
tensor (per layer and head); or :func:`scales` with named axes, e.g.
``scales(t, "batch")`` to stack settings along the batch.

The modules, by job: :mod:`~tl_directional.edit.forms` (each edit's math, once, as tensor
functions), :mod:`~tl_directional.edit.tensors` (scale arguments, scopes, the checked cast back),
:mod:`~tl_directional.edit.base` (:class:`Edit`, hook state), :mod:`~tl_directional.edit.residual`,
:mod:`~tl_directional.edit.value`, :mod:`~tl_directional.edit.pattern` (the edits' TransformerLens
hooks), :mod:`~tl_directional.edit.steering` (:class:`ActivationAddition`, a steering vector split
against the stream), :mod:`~tl_directional.edit.spaces` (the named edit spaces), :mod:`~tl_directional.edit.strength`
(:func:`edit_strength`, how much of each edited update an edit changes), :mod:`~tl_directional.edit.apply`
(:func:`apply_edits`, on every lane) and :mod:`tl_directional.edit.hf` (the plain ``transformers`` lane's
module hooks).
"""

from __future__ import annotations

from .apply import apply_edits, edit_hooks
from .base import Edit, restore_instance_dict, track_attention_mask
from .carrier import MLPCarrierScale
from .pattern import DiagonalRemoval, EffectiveDiagonal
from .residual import ResidualScale
from .spaces import EDIT_SPACES, EditSpace, edit_space, edits_for_space
from .steering import STEERING_SITES, ActivationAddition, SteeringReport
from .strength import STRENGTH_EPS, EditStrength, edit_strength
from .tensors import NonFiniteEditError, Scales, scales
from .value import ValueScale

__all__ = [
    "ActivationAddition",
    "DiagonalRemoval",
    "EDIT_SPACES",
    "Edit",
    "EditSpace",
    "EditStrength",
    "EffectiveDiagonal",
    "MLPCarrierScale",
    "NonFiniteEditError",
    "ResidualScale",
    "STEERING_SITES",
    "STRENGTH_EPS",
    "Scales",
    "SteeringReport",
    "ValueScale",
    "apply_edits",
    "edit_hooks",
    "edit_space",
    "edit_strength",
    "edits_for_space",
    "restore_instance_dict",
    "scales",
    "track_attention_mask",
]
