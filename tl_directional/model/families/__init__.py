"""One file per model family, registered in one table (:data:`REGISTRY`).

Each ``<family>.py`` defines ``FAMILY``, a :class:`Family`: its Hugging Face class and names,
its tiny offline config (:func:`tl_directional.model.load.build_tiny_hf_model`), its legacy-lane
config (HF config -> ``HookedTransformerConfig`` fields, read from the local config) and
TransformerLens weight converter, or why a lane refuses it, and its layout facts
(:class:`Layout`: pre-LN / post-LN / parallel / sandwich norms / soft-capping / MoE / GQA /
norm-gain form) and where its edit sites live on the plain ``transformers`` model
(:class:`HFModules`). Adding a family is one new file plus its row in ``_MODULES`` below; see
``docs/adding_a_family.md``.
"""

from __future__ import annotations

import importlib

from ._base import (
    HF_SHAPE,
    HF_SHAPE_GQA,
    LEGACY_MAX_CTX,
    Family,
    HFModules,
    Layout,
    llama_style_modules,
    rope_type,
)

#: The family modules, one row each (the order of FAMILIES and of docs/models.md).
_MODULES: tuple[str, ...] = (
    "gpt2",
    "llama",
    "neox",
    "bert",
    "gemma3",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mistral",
    "mixtral",
    "gemma",
    "gemma2",
    "olmo2",
    "phi3",
    "phi",
    "gptj",
    "gpt_neo",
    "opt",
    "bloom",
    "apertus",
    "gpt_oss",
)

#: family name -> :class:`Family`.
REGISTRY: dict[str, Family] = {}
for _module in _MODULES:
    _family = importlib.import_module(f"{__name__}.{_module}").FAMILY
    if _family.name in REGISTRY:
        raise RuntimeError(f"family {_family.name!r} is registered twice")
    REGISTRY[_family.name] = _family

#: Hugging Face architecture name (``config.architectures[0]``) -> family.
BY_ARCH: dict[str, Family] = {f.hf_class: f for f in REGISTRY.values()}
#: ``config.model_type`` -> family.
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in REGISTRY.values() for t in f.model_types}


def get_family(name: str) -> Family:
    """The registered family ``name``; ``ValueError`` naming the known families otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"family must be one of {tuple(REGISTRY)}, got {name!r}.")
    return REGISTRY[name]


def lane_families(lane, *, causal_only: bool = False) -> tuple[str, ...]:
    """The families that load on ``lane`` (a :class:`~tl_directional.model.lanes.base.Lane`;
    ``lanes.lane_named("bridge")`` for a name): the lane owns the rule (``Lane.family_refusal``)."""
    return tuple(n for n, f in REGISTRY.items() if not lane.family_refusal(f) and (f.causal or not causal_only))


__all__ = ["BY_ARCH", "BY_MODEL_TYPE", "HF_SHAPE", "HF_SHAPE_GQA", "LEGACY_MAX_CTX", "REGISTRY", "Family",
           "HFModules", "Layout", "llama_style_modules", "get_family", "lane_families", "rope_type"]
