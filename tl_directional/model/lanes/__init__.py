"""The three lanes, one object per kind of model, chosen once per model.

:func:`lane_of` returns the :class:`~tl_directional.model.lanes.base.Lane` of a model:
:data:`BRIDGE` (TL 4 ``TransformerBridge``, :mod:`tl_directional.model.lanes.bridge`),
:data:`LEGACY` (TL 2.x / 3.x ``HookedTransformer``, :mod:`tl_directional.model.lanes.legacy`) or
:data:`TRANSFORMERS` (a plain ``transformers`` model with no TransformerLens hook points,
:mod:`tl_directional.model.lanes.transformers`). The lane owns everything that differs between
them: linear weights and their inputs, hook-point attachment and hook-handle removal, partial
forwards, the unembedding, cloning, HF export, loading, the ``generate`` fix and how edits attach
(:attr:`~tl_directional.model.lanes.base.Lane.hook_kind`). No module outside this package
compares lane names or TransformerLens class names; callers ask the lane.

Lanes are frozen singletons and ``str`` subclasses whose value is the name (``"bridge"`` /
``"legacy"`` / ``"transformers"``), so records that store ``lane_of(model)`` keep writing the
plain name.
"""

from __future__ import annotations

import importlib.util

from .base import BlockInput, Lane, LinearSpec, Unembedding, quiet_transformers
from .bridge import BridgeLane
from .legacy import LegacyLane
from .transformers import NoHookPointsError, TransformersLane

#: The TL 4 ``TransformerBridge`` lane.
BRIDGE: Lane = BridgeLane("bridge")
#: The TL 2.x / 3.x ``HookedTransformer`` lane.
LEGACY: Lane = LegacyLane("legacy")
#: A plain ``transformers`` model (no TransformerLens): edits as torch module hooks.
TRANSFORMERS: Lane = TransformersLane("transformers")
#: Every lane, by name, in the order :func:`lane_of` asks them.
LANES: dict[str, Lane] = {BRIDGE.name: BRIDGE, LEGACY.name: LEGACY, TRANSFORMERS.name: TRANSFORMERS}


def lane_named(name: str, argument: str = "lane") -> Lane:
    """The lane called ``name`` (``"bridge"``, ``"legacy"`` or ``"transformers"``; a lane is
    returned as is).

    Raises:
        ValueError: ``name`` is not a lane's name.
    """
    if isinstance(name, Lane):
        return name
    try:
        return LANES[name]
    except (KeyError, TypeError):
        names = ", ".join(repr(n) for n in LANES)
        raise ValueError(f"{argument} must be one of {names}, got {name!r}.") from None


def _claiming(model) -> Lane | None:
    """The first lane of :data:`LANES` that claims ``model``, None if none does."""
    return next((lane for lane in LANES.values() if lane.claims(model)), None)


def lane_of(model, argument: str = "model") -> Lane:
    """The lane of ``model``: :data:`BRIDGE` for a TL 4 ``TransformerBridge`` (told from the class
    hierarchy), :data:`LEGACY` for anything else with TransformerLens's hook API
    (``HookedTransformer``, ``HookedEncoder``: ``run_with_hooks``), :data:`TRANSFORMERS` for a
    plain ``transformers`` model (an ``nn.Module`` with a ``config`` and no hook API). Nothing is
    imported.

    Raises:
        TypeError: ``model`` is none of the three (``argument`` names it in the message).
    """
    lane = _claiming(model)
    if lane is not None:
        return lane
    raise TypeError(
        f"{argument} must be a TransformerLens model (a TL 4 TransformerBridge or a TL 2.x / 3.x "
        "HookedTransformer) or a plain transformers model (an nn.Module with a .config, e.g. "
        f"AutoModelForCausalLM), got {type(model).__name__}. Load one with "
        "tl_directional.load_model(path_or_name) (TransformerLens) or "
        "tl_directional.model.load.load_hf_model(path) (plain transformers).")


def is_plain_transformers(model) -> bool:
    """Whether ``model`` is on the :data:`TRANSFORMERS` lane (``lane_of(model) is TRANSFORMERS``,
    and False, not an error, for an object that is on no lane): a plain ``transformers`` model
    with no TransformerLens hook points, whose edits go on as torch module hooks
    (:mod:`tl_directional.edit.hf`)."""
    return _claiming(model) is TRANSFORMERS


def is_bridge(model) -> bool:
    """Whether ``model`` is on the bridge lane (``lane_of(model) is BRIDGE``; False for an object
    that is on no lane)."""
    return _claiming(model) is BRIDGE


def installed_lane() -> Lane:
    """Which TransformerLens API is installed: :data:`LEGACY` when
    ``transformer_lens.HookedTransformer`` exists (TL 2.x / 3.x), else :data:`BRIDGE` (TL >= 4).

    Raises:
        ImportError: ``transformer_lens`` is not installed.
    """
    # find_spec, not hasattr: on TL >= 4, touching transformer_lens.HookedTransformer raises
    # ImportError (a migration message) rather than returning False.
    if importlib.util.find_spec("transformer_lens") is None:
        raise ImportError("transformer_lens is not installed: pip install transformer-lens.")
    if importlib.util.find_spec("transformer_lens.HookedTransformer") is not None:
        return LEGACY
    return BRIDGE


__all__ = [
    "BRIDGE",
    "LANES",
    "LEGACY",
    "BlockInput",
    "BridgeLane",
    "Lane",
    "LegacyLane",
    "LinearSpec",
    "NoHookPointsError",
    "TRANSFORMERS",
    "TransformersLane",
    "Unembedding",
    "installed_lane",
    "is_bridge",
    "is_plain_transformers",
    "lane_named",
    "lane_of",
    "quiet_transformers",
]
