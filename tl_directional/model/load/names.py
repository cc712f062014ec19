"""Which model names load offline: the catalogue, TransformerLens' names, the nearest match.

:func:`check_model_name` refuses, at once and offline, a name that is neither a catalogue name
(``"default"``, the real models of :data:`~tl_directional.model.load.catalog.REAL_MODELS`) nor a
TransformerLens model name, naming the closest known one (:class:`UnknownModelError`).
"""

from __future__ import annotations

import difflib
import functools

from ...core.errors import TLDirectionalError
from .catalog import REAL_MODELS


def _real_model_names() -> tuple[str, ...]:
    return tuple(REAL_MODELS)


def catalogue_names() -> tuple[str, ...]:
    """The names :func:`load_model` resolves offline: ``"default"`` and the real models of
    :data:`tl_directional.model.load.catalog.REAL_MODELS`."""
    return ("default", *_real_model_names())


@functools.lru_cache(maxsize=1)
def tl_model_names() -> frozenset[str]:
    """TransformerLens' official model names and their aliases, lower-cased.

    ``OFFICIAL_MODEL_NAMES`` / ``MODEL_ALIASES`` live in ``transformer_lens.loading_from_pretrained``
    on the legacy lane (TransformerLens 2.x / 3.x) and in ``transformer_lens.supported_models`` on
    the bridge lane (TransformerLens >= 4); whichever exists is read. Nothing goes to the hub.
    """
    import importlib

    names: set[str] = set()
    for module in ("transformer_lens.supported_models", "transformer_lens.loading_from_pretrained"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        names.update(getattr(mod, "OFFICIAL_MODEL_NAMES", ()))
        for official, aliases in getattr(mod, "MODEL_ALIASES", {}).items():
            names.add(official)
            names.update(aliases)
    return frozenset(n.lower() for n in names)


def _is_bridge_registry_model(name: str) -> bool:
    """Whether the TransformerLens >= 4 bridge registry lists ``name`` (a Hugging Face id such as
    ``"Qwen/Qwen2.5-0.5B"``) as supported; False where there is no registry."""
    try:
        from transformer_lens.tools.model_registry.api import is_model_supported

        return bool(is_model_supported(name))
    except Exception:  # noqa: BLE001 - no registry (legacy lane) or an unreadable one
        return False


class UnknownModelError(TLDirectionalError, ValueError):
    """A model name that is neither an existing directory, a catalogue name (``"default"``,
    ``"smollm2-135m"``, ...) nor a TransformerLens model name: :func:`load_model` raises this at
    once, offline, instead of trying the hub. ``closest`` is the nearest known name (or None)."""

    def __init__(self, name: str):
        self.name = name
        self.catalogue = catalogue_names()
        self.closest = _closest_name(name)
        super().__init__(self.describe(f"name_or_path={name!r}"))

    def describe(self, subject: str) -> str:
        """The message with ``subject`` (e.g. ``"--model smollm2"``) in front."""
        hint = f" Did you mean {self.closest!r}?" if self.closest else ""
        return (
            f"{subject} is not an existing directory, a catalogue model "
            f"({', '.join(repr(n) for n in self.catalogue)}) or a TransformerLens model name "
            f"(transformer_lens OFFICIAL_MODEL_NAMES, e.g. 'gpt2').{hint} Pass one of those names "
            "or the path of a local Hugging Face model directory; `tl-directional models` lists "
            "what loads offline."
        )


def _closest_name(name: str) -> str | None:
    """The catalogue or TransformerLens name nearest to ``name`` (difflib), catalogue first:
    a catalogue name that begins with ``name`` (``"smollm2"`` -> ``"smollm2-135m"``) wins."""
    key = name.lower()
    catalogue = {n.lower(): n for n in catalogue_names()}
    prefixed = [n for lo, n in catalogue.items() if lo.startswith(key)]
    if prefixed:
        return prefixed[0]
    for pool in (catalogue, {n: n for n in sorted(tl_model_names())}):
        match = difflib.get_close_matches(key, list(pool), n=1, cutoff=0.6)
        if match:
            return pool[match[0]]
    return None


def check_model_name(name: str) -> None:
    """Raise :class:`UnknownModelError` unless ``name`` is a TransformerLens model name (official
    name or alias, case-insensitive) or, on the bridge lane, a model of TransformerLens' bridge
    registry. Directories and catalogue names are resolved before this check."""
    if name.lower() in tl_model_names() or _is_bridge_registry_model(name):
        return
    raise UnknownModelError(name)
