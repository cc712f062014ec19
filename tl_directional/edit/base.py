"""The base every edit derives from (:class:`Edit`) and the hook list type, in a module of its own
so that edit modules beside :mod:`tl_directional.edit` (``edit/carrier.py``) can subclass it
without importing the package's ``__init__`` (which registers them: no import cycle)."""

from __future__ import annotations

from collections.abc import Callable

from ..model.sites import ModelSites, normalize_layers

HookList = list[tuple[str, Callable]]


class Edit:
    """Base class: an edit turns into TransformerLens forward hooks for one model."""

    positions = None

    def fwd_hooks(self, model) -> HookList:  # pragma: no cover - abstract
        raise NotImplementedError

    def _layers(self, sites: ModelSites) -> list[int]:
        return normalize_layers(self.layers, sites.n_layers, "layers")


__all__ = ["Edit", "HookList"]
