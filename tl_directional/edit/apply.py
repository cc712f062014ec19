"""Applying edits to a model: :func:`edit_hooks` (TransformerLens forward hooks) and
:func:`apply_edits` (a context manager, on any lane).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from .base import Edit, HookList, restore_instance_dict, track_attention_mask


def edit_hooks(model, *edits: Any) -> HookList:
    """All forward hooks of ``edits`` for ``model``, in order (so they compose in order)."""
    hooks: HookList = []
    for i, e in enumerate(edits):
        if not isinstance(e, Edit):
            raise TypeError(
                f"edits[{i}] is a {type(e).__name__}, not an edit; pass ResidualScale, ValueScale, "
                "DiagonalRemoval or EffectiveDiagonal objects"
            )
        hooks += e.fwd_hooks(model)
    track_attention_mask(model)
    return hooks


@contextmanager
def apply_edits(model, *edits: Any):
    """Context manager: ``with apply_edits(model, ValueScale(0.0)): model(tokens)``.

    Hooks are added in order (edits compose in order, each taking its reference
    from the live, already edited stream) and always removed on exit, also when
    the body raises. The model itself is not changed: on exit, normal or raising, its
    ``__dict__`` is restored exactly (what the block set on the instance, such as the
    attention-mask tracking ``forward`` of :func:`track_attention_mask`, goes; what it replaced
    comes back). ``model.generate`` inside the block gives a manual greedy loop's tokens when it
    was fixed at load (:func:`~tl_directional.model.load.load_model`) or by
    :func:`tl_directional.model.generation.fix_generate`.
    """
    before = dict(model.__dict__)
    try:
        hooks = edit_hooks(model, *edits)
        with model.hooks(fwd_hooks=hooks):
            yield model
    finally:
        restore_instance_dict(model, before)


__all__ = ["apply_edits", "edit_hooks"]
