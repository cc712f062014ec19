"""The base of every edit: :class:`Edit`, the hook-state helpers its TransformerLens hooks share,
the attention-mask tracking of the forward pass and the restoring of a model's instance dict.

Each edit's hooks only say where the tensors come from; the math is :mod:`tl_directional.edit.forms`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from ..model.generation import FORWARD, past_length
from ..model.indices import normalize_layers
from ..model.sites import ModelSites

HookList = list[tuple[str, Callable]]


_MISSING = object()


class _MaskTrackingForward:
    """The instance ``forward`` that :func:`track_attention_mask` installs: the class's own
    forward, with the call's ``attention_mask`` and the length of its KV cache
    (:func:`~tl_directional.model.generation.past_length`) visible to the edits. An object, not a
    closure, so ``copy.deepcopy`` / pickling of the model carry it to the copy."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        m = kwargs.get("attention_mask")
        before = FORWARD.attention_mask, FORWARD.past_length
        FORWARD.attention_mask = m if isinstance(m, Tensor) and m.ndim == 2 else None
        FORWARD.past_length = past_length(kwargs)
        try:
            return type(self.module).forward(self.module, *args, **kwargs)
        finally:
            FORWARD.attention_mask, FORWARD.past_length = before


def track_attention_mask(model) -> None:
    """Let the edits see the ``attention_mask`` keyword of each forward pass (idempotent).

    :func:`edit_hooks` calls it, and the tracking stays on the model after that call (the hooks
    it returns are run later, by ``run_with_hooks`` or ``model.hooks``); :func:`apply_edits`
    removes it again on exit.

    Sets the instance's ``forward`` (not a module pre-hook: TL 2's ``run_with_hooks`` and
    ``generate`` call ``model.forward`` directly, which module hooks do not see); the mask
    is set for the duration of the call and restored after it, also on errors."""
    if not isinstance(model, torch.nn.Module) or isinstance(model.__dict__.get("forward"), _MaskTrackingForward):
        return
    if "forward" in model.__dict__:
        return  # someone else's instance forward: leave it (negative positions count from the end)
    object.__setattr__(model, "forward", _MaskTrackingForward(model))


class Edit:
    """Base class: an edit turns into TransformerLens forward hooks for one model."""

    positions = None

    def fwd_hooks(self, model) -> HookList:  # pragma: no cover - abstract
        raise NotImplementedError

    def _layers(self, sites: ModelSites) -> list[int]:
        return normalize_layers(self.layers, sites.n_layers, "layers")

def _check_eps(eps) -> float:
    if not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite float >= 0 (a degeneracy threshold on squared norms), got "
                         f"{eps!r}; leave it out for the default or pass e.g. eps=1e-12")
    return float(eps)


def _store_first(state: dict, key: str):
    """Hook storing the tensor under ``key``; it is the first of the edit's hooks to fire
    in a layer, so it also clears what the previous forward pass left."""

    def hook(tensor, hook):  # noqa: ARG001
        state.clear()
        state[key] = tensor
        return tensor

    return hook


def _track_key_length(state: dict):
    def hook(pattern, hook):  # noqa: ARG001
        state["k_len"] = pattern.shape[-1]
        return pattern

    return hook


def _query_offset(pattern_or_klen, n_query: int) -> int:
    k_len = pattern_or_klen if isinstance(pattern_or_klen, int) else pattern_or_klen.shape[-1]
    return k_len - n_query


class _HeadScoped(Edit):
    """Shared scoping for per-head edits (value space and pattern form)."""


def _store_pattern(state: dict):
    def hook(pattern, hook):  # noqa: ARG001
        state["pattern"] = pattern
        return pattern

    return hook


def _pattern_order_guard(state: dict, layer: int, edit_name: str):
    """Read-only hook at hook_z: the pattern edit must have run before z was formed."""

    def hook(z, hook):  # noqa: ARG001
        if not state.pop("pattern_seen", False):
            raise RuntimeError(
                f"{edit_name} at layer {layer}: hook_pattern did not fire before hook_z, so an edit "
                "of the pattern would not reach the head output on this model. Use ValueScale "
                "(hook_z form) instead."
            )
        return z

    return hook


def restore_instance_dict(obj, before: dict) -> None:
    """Put ``obj.__dict__`` back to the snapshot ``before`` (``dict(obj.__dict__)`` taken
    earlier): keys added since go, keys changed or removed get their old object back."""
    now = obj.__dict__
    for key in [k for k in now if k not in before]:
        del now[key]
    for key, value in before.items():
        if now.get(key, _MISSING) is not value:
            now[key] = value


__all__ = ["Edit", "HookList", "restore_instance_dict", "track_attention_mask"]
