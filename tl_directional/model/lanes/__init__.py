"""The two TransformerLens lanes, one object each, chosen once per model (and
:func:`is_plain_transformers`, which tells the third: a plain ``transformers`` model).

:func:`lane_of` returns the :class:`~tl_directional.model.lanes.base.Lane` of a model:
:data:`BRIDGE` (TL 4 ``TransformerBridge``, :mod:`tl_directional.model.lanes.bridge`) or
:data:`LEGACY` (TL 2.x / 3.x ``HookedTransformer``, :mod:`tl_directional.model.lanes.legacy`). The
lane owns everything that differs between them: linear weights and their inputs, hook-point
attachment and hook-handle removal, partial forwards, the unembedding, cloning, HF export,
loading and the ``generate`` fix. No module outside this package compares lane names or
TransformerLens class names; callers ask the lane.

Lanes are frozen singletons and ``str`` subclasses whose value is the name (``"bridge"`` /
``"legacy"``), so records that store ``lane_of(model)`` keep writing the plain name.
"""

from __future__ import annotations

import importlib.util

import torch

from .base import BlockInput, Lane, LinearSpec, Unembedding, quiet_transformers
from .bridge import BridgeLane
from .legacy import LegacyLane

#: The TL 4 ``TransformerBridge`` lane.
BRIDGE: Lane = BridgeLane("bridge")
#: The TL 2.x / 3.x ``HookedTransformer`` lane.
LEGACY: Lane = LegacyLane("legacy")
#: Every lane, by name.
LANES: dict[str, Lane] = {BRIDGE.name: BRIDGE, LEGACY.name: LEGACY}


def lane_named(name: str, argument: str = "lane") -> Lane:
    """The lane called ``name`` (``"bridge"`` or ``"legacy"``; a lane is returned as is).

    Raises:
        ValueError: ``name`` is not a lane's name.
    """
    if isinstance(name, Lane):
        return name
    try:
        return LANES[name]
    except (KeyError, TypeError):
        raise ValueError(f"{argument} must be 'bridge' or 'legacy', got {name!r}.") from None


def lane_of(model) -> Lane:
    """:data:`BRIDGE` for a TL 4 ``TransformerBridge``, :data:`LEGACY` for a ``HookedTransformer``
    (told from the class hierarchy; nothing is imported)."""
    return BRIDGE if BRIDGE.claims(model) else LEGACY


def is_plain_transformers(model) -> bool:
    """Whether ``model`` is on the third lane: a plain ``transformers`` model (an ``nn.Module``
    with a ``config``) with no TransformerLens hook points, neither a bridge nor a
    ``HookedTransformer``; the edits go on it as torch module hooks (:mod:`tl_directional.edit.hf`)."""
    return (isinstance(model, torch.nn.Module) and getattr(model, "config", None) is not None
            and not BRIDGE.claims(model) and not hasattr(model, "run_with_hooks"))


def is_bridge(model) -> bool:
    """Whether ``model`` is on the bridge lane (see :func:`lane_of`)."""
    return lane_of(model) is BRIDGE


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
    "Unembedding",
    "installed_lane",
    "is_bridge",
    "is_plain_transformers",
    "lane_named",
    "lane_of",
    "quiet_transformers",
]
