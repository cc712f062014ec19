"""Applying edits to a model: :func:`apply_edits` (a context manager, on every lane) and
:func:`edit_hooks` (the TransformerLens forward hooks of some edits).

The lane is read once per call and the edits go on the way it says
(:attr:`~tl_directional.model.lanes.base.Lane.hook_kind`, one installer per kind in
``_INSTALLERS``): a TransformerLens model (a TL 4 ``TransformerBridge`` or a TL 2.x
``HookedTransformer``, ``"transformer_lens"``) takes the edits as TransformerLens hooks (each
edit's ``fwd_hooks``); a plain ``transformers`` model (``"module"``) takes the same edit objects
as torch module hooks (:func:`tl_directional.edit.hf.install_edits`). Both call the same tensor
functions (:mod:`tl_directional.edit.forms`), so one edit gives the same numbers on every lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from ..model.lanes import NoHookPointsError, lane_of
from .base import Edit, HookList, restore_instance_dict, track_attention_mask
from .carrier import MLPCarrierScale
from .hf.carrier import install_carrier_edits
from .hf.edits import stacked_edits


def edit_hooks(model, *edits: Any) -> HookList:
    """All TransformerLens forward hooks of ``edits`` for ``model``, in order (so they compose in
    order), for ``model.run_with_hooks(..., fwd_hooks=...)`` or ``model.hooks(fwd_hooks=...)``.

    Raises:
        TypeError: an item of ``edits`` is not an :class:`Edit`, or ``model`` is not a
            TransformerLens model (:func:`tl_directional.model.lanes.lane_of`).
        tl_directional.model.lanes.NoHookPointsError: ``model`` is a plain ``transformers`` model
            (it has no TransformerLens hook points: use :func:`apply_edits` or
            :func:`tl_directional.edit.hf.install_edits`).
    """
    if lane_of(model).hook_kind != "transformer_lens":
        raise NoHookPointsError(
            f"model is a plain transformers {type(model).__name__}, which has no TransformerLens hook "
            "points; use tl_directional.apply_edits(model, ...) (a context) or "
            "tl_directional.edit.hf.install_edits(model, ...) (until handle.remove())")
    hooks: HookList = []
    for i, e in enumerate(edits):
        if not isinstance(e, Edit):
            raise TypeError(
                f"edits[{i}] is a {type(e).__name__}, not an edit; pass ResidualScale, ValueScale, "
                "DiagonalRemoval, EffectiveDiagonal or ActivationAddition objects"
            )
        hooks += e.fwd_hooks(model)
    track_attention_mask(model)
    return hooks


@contextmanager
def apply_edits(model, *edits: Any) -> Iterator[Any]:
    """Context manager: ``with apply_edits(model, ValueScale(0.0)): model(tokens)``.

    ``model``: a TransformerLens 4 ``TransformerBridge``, a TransformerLens 2.x
    ``HookedTransformer`` or a plain ``transformers`` causal LM (e.g.
    ``AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")``, see
    :func:`tl_directional.edit.hf.install_edits` for the supported families); the same edit
    objects give the same numbers on each.

    Edits are installed in order (they compose in order, each taking its reference from the
    live, already edited stream) and always removed on exit, also when the body raises. The
    model itself is not changed: on a TransformerLens model its ``__dict__`` is restored exactly
    on exit, normal or raising (what the block set on the instance, such as the attention-mask
    tracking ``forward`` of :func:`~tl_directional.edit.base.track_attention_mask`, goes; what it
    replaced comes back); on a plain ``transformers`` model every module hook and the handle the
    edits installed go. Blocks nest on every lane: an inner block's edits compose after the outer
    block's (on a plain ``transformers`` model through
    :func:`tl_directional.edit.hf.stacked_edits`). ``model.generate`` inside the block gives a manual greedy loop's tokens
    when it was fixed at load (:func:`~tl_directional.model.load.load_model`) or by
    :func:`tl_directional.model.generation.fix_generate`.

    Raises:
        TypeError: an item of ``edits`` is not an edit, or ``model`` is none of the three kinds of
            model above (:func:`tl_directional.model.lanes.lane_of`).
        tl_directional.edit.hf.UnsupportedModelError: a plain ``transformers`` model of a family
            the module hooks do not know.
    """
    with _INSTALLERS[lane_of(model).hook_kind](model, edits):
        yield model


@contextmanager
def _as_transformer_lens_hooks(model, edits: tuple) -> Iterator[None]:
    """The edits as TransformerLens hooks (``model.hooks``); the instance ``__dict__`` restored."""
    before = dict(model.__dict__)
    try:
        hooks = edit_hooks(model, *edits)
        with model.hooks(fwd_hooks=hooks):
            yield
    finally:
        restore_instance_dict(model, before)


@contextmanager
def _as_module_hooks(model, edits: tuple) -> Iterator[None]:
    """The edits as torch module hooks on a plain ``transformers`` model (:mod:`.hf`)."""
    # The carrier edits act inside the MLP, on modules the other edits never hook, so
    # installing them as a second group keeps the composition order that matters.
    carrier = [e for e in edits if isinstance(e, MLPCarrierScale)]
    others = [e for e in edits if not isinstance(e, MLPCarrierScale)]
    with ExitStack() as stack:
        if others:  # on top of edits already installed: nested blocks compose as on TL
            stack.enter_context(stacked_edits(model, *others))
        if carrier:
            stack.callback(install_carrier_edits(model, *carrier).remove)
        yield


#: ``Lane.hook_kind`` -> how :func:`apply_edits` installs edits on a model of that kind, for the
#: block: ``installer(model, edits)`` is a context manager.
_INSTALLERS: dict[str, Callable[[Any, tuple], AbstractContextManager[None]]] = {
    "transformer_lens": _as_transformer_lens_hooks,
    "module": _as_module_hooks,
}


__all__ = ["apply_edits", "edit_hooks"]
