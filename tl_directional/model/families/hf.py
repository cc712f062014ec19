"""Which Hugging Face architecture is which model family, and ``transformers`` version shims.

Shared by the tiny-model factory (:mod:`.tiny`), the legacy-lane config conversion
(:mod:`.legacy_config`), the loaders (:mod:`.load`) and the real-model catalogue (:mod:`.catalog`).
"""

from __future__ import annotations

from typing import Any

import torch

from ..families import BY_ARCH, BY_MODEL_TYPE, REGISTRY

#: The model families :func:`build_tiny_hf_model` can build (the registry's order).
FAMILIES: tuple[str, ...] = tuple(REGISTRY)

# Hugging Face architecture name (config.architectures[0]) -> our family name.
ARCH_TO_FAMILY: dict[str, str] = {arch: f.name for arch, f in BY_ARCH.items()}
FAMILY_TO_ARCH: dict[str, str] = {v: k for k, v in ARCH_TO_FAMILY.items()}


# Whether TransformerLens prepends BOS by default, per family, as the TL 4 bridge adapters set it
# (the NeoX adapter turns it off: Pythia was trained without BOS). The legacy lane copies this so
# `to_tokens` agrees across lanes.
DEFAULT_PREPEND_BOS: dict[str, bool] = {f.name: f.prepend_bos for f in REGISTRY.values()}


def hf_architecture(hf_config: Any) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in ARCH_TO_FAMILY:
            return arch
    model_type = getattr(hf_config, "model_type", None)
    if not archs and model_type in BY_MODEL_TYPE:
        return BY_MODEL_TYPE[model_type].hf_class
    return archs[0] if archs else str(model_type)


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def from_pretrained_kwargs(dtype: torch.dtype) -> dict[str, Any]:
    """``from_pretrained`` kwargs for dtype + eager attention under transformers 4.x and 5.x."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    # transformers 4.56 renamed torch_dtype to dtype (the old name warns from then on).
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: dtype, "attn_implementation": "eager"}


__all__ = [
    "ARCH_TO_FAMILY",
    "DEFAULT_PREPEND_BOS",
    "FAMILIES",
    "FAMILY_TO_ARCH",
    "from_pretrained_kwargs",
    "hf_architecture",
    "transformers_major",
]
