"""Hugging Face config -> ``HookedTransformerConfig`` fields for the legacy lane (TL 2.x / 3.x).

Read from the local config only (TransformerLens' own ``convert_hf_model_config`` resolves
names on the hub). Each family's fields come from its file in :mod:`tl_directional.model.families`
(``Family.legacy_config``); a family the legacy lane cannot load says why
(``Family.legacy_refusal``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..families import BY_ARCH, Family, rope_type
from ..families.hf import hf_architecture


def legacy_refusal(family: Family) -> str:
    """Why the legacy lane refuses ``family`` ("" if it loads): a family loads there iff its
    file gives a legacy config (built from the local HF config)."""
    return family.legacy_refusal if family.legacy_config is None else ""


def check_rope_scaling(hf_config: Any, arg_path: Path) -> None:
    kind = rope_type(hf_config)
    if kind not in (None, "default"):
        raise NotImplementedError(
            f"{arg_path}: rope scaling type {kind!r} is not supported on the legacy lane; "
            "use TransformerLens >= 4 (bridge lane)."
        )


def legacy_family(hf_config: Any) -> Family:
    """The registered family of ``hf_config`` if the legacy lane loads it, else ``ValueError``
    naming what is missing (an unknown architecture, or the family's refusal)."""
    arch = hf_architecture(hf_config)
    family = BY_ARCH.get(arch)
    if family is None:
        raise ValueError(
            f"architecture {arch!r} is not supported on the legacy lane; supported: "
            f"{sorted(BY_ARCH[a].hf_class for a in BY_ARCH if not legacy_refusal(BY_ARCH[a]))}. "
            "Add a family file (docs/adding_a_family.md) or use TransformerLens >= 4 (bridge lane)."
        )
    if family.legacy_config is None:
        raise ValueError(family.legacy_refusal)
    return family


def legacy_config_dict(hf_config: Any, *, device: Any = "cpu", dtype: Any = torch.float32) -> dict:
    """``HookedTransformerConfig`` fields for a Hugging Face config (legacy lane).

    Mirrors TransformerLens' own ``convert_hf_model_config`` for each registered family (its
    ``legacy_config`` function), but reads every field from the local config (that function
    resolves names on the hub, hard-codes some families by name, and e.g. ignores GPT-2's
    ``n_inner``).

    Args:
        hf_config: A ``transformers`` config of a registered family
            (:data:`tl_directional.model.families.REGISTRY`).
        device: Recorded as ``cfg.device``.
        dtype: Recorded as ``cfg.dtype``.

    Returns:
        A dict for ``HookedTransformerConfig(**d)``.
    """
    family = legacy_family(hf_config)
    d = family.legacy_config(hf_config)
    d.update(
        original_architecture=family.hf_class,
        device=str(device),
        dtype=dtype,
        default_prepend_bos=family.prepend_bos,
        # TL's own loader records the name AutoTokenizer can load; ours is the directory.
        tokenizer_name=None,
    )
    return d


__all__ = ["check_rope_scaling", "legacy_config_dict",
           "legacy_family", "legacy_refusal"]
