"""Where the edit spaces live on a plain Hugging Face decoder (:mod:`tl_directional.edit.hf.edits`
has the full account, METHOD.md sec. 2-4), looked up from the family records: each family file
says where its modules are (:class:`~tl_directional.model.families.HFModules`, the family's
``hf_modules``); this module finds the family of one model by ``config.model_type`` and resolves
its sites (:class:`HFSites`, :func:`resolve_hf_sites`), and tells the attention implementation a
model runs (the edits that need the pattern check it in :mod:`tl_directional.edit.hf.edits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

from ..core.errors import TLDirectionalError
from .families import REGISTRY, HFModules
from .sites import PARALLEL, SEQUENTIAL, ModelSites
from .structure import WeightProcessing


class UnsupportedModelError(TLDirectionalError, TypeError):
    """The HF edit path does not know this model's architecture."""


class AttentionPatternUnavailableError(TLDirectionalError, RuntimeError):
    """An edit needs the attention pattern, which this attention implementation does not return."""


#: ``config.model_type`` -> where the family's edit sites live (:class:`HFModules`), read from the
#: family records (:data:`tl_directional.model.families.REGISTRY`): a family with ``hf_modules`` is
#: on the plain ``transformers`` lane under each of its ``model_types``.
MODEL_TYPES: Mapping[str, HFModules] = MappingProxyType(
    {t: f.hf_modules for f in REGISTRY.values() if f.hf_modules is not None for t in f.model_types})


def _supported_text() -> str:
    """The families the plain ``transformers`` lane edits, as ``label (model types)``, in the
    registry's order."""
    return "; ".join(f"{f.hf_modules.label} ({', '.join(f.model_types)})" for f in REGISTRY.values()
                     if f.hf_modules is not None)


@dataclass
class HFSites:
    """What the HF edit path resolved on one model: shapes and, per layer, the modules."""

    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    parallel: bool
    sandwich: bool
    layout: HFModules
    layers: list[torch.nn.Module] = field(default_factory=list)

    def model_sites(self) -> ModelSites:
        """The shapes as a :class:`~tl_directional.model.sites.ModelSites` (no hook names), which the
        edit objects' scale and scope helpers take."""
        return ModelSites(
            model_name=self.model_type, lane="transformers", arch=PARALLEL if self.parallel else SEQUENTIAL,
            n_layers=self.n_layers, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, d_model=self.d_model,
            d_head=self.d_head, causal=True, factorization_applicable=not self.sandwich,
            weights=WeightProcessing(False, False, False), sandwich=self.sandwich)

    def module(self, layer: int, name: str | None, under_attn: bool = False) -> torch.nn.Module | None:
        if name is None:
            return None
        root = self.layers[layer]
        if under_attn:
            root = _child(root, self.layout.attn)
        return _child(root, name)


def _child(module: torch.nn.Module, dotted: str) -> torch.nn.Module:
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def resolve_hf_sites(model: Any) -> HFSites:
    """Resolve the edit sites of a plain ``transformers`` causal LM.

    Raises:
        UnsupportedModelError: ``model`` is not a ``torch.nn.Module`` with a ``config``, or its
            ``config.model_type`` is not one of :data:`MODEL_TYPES` (the message names the class,
            its model type and the supported families).
    """
    if hasattr(model, "run_with_hooks") and hasattr(model, "hook_dict"):
        raise UnsupportedModelError(
            f"model is a TransformerLens {type(model).__name__}; use tl_directional.apply_edits for "
            "it (the module hooks here are for plain transformers models)")
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise UnsupportedModelError(
            f"model must be a transformers PreTrainedModel (an nn.Module with a .config), got "
            f"{type(model).__name__}")
    model_type = getattr(config, "model_type", None)
    layout = MODEL_TYPES.get(model_type)
    if layout is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} (config.model_type={model_type!r}) is not supported by the "
            f"tl_directional HF edit path; supported families: {_supported_text()}. Load the model "
            "with tl_directional.load_model and use tl_directional.apply_edits, or open an issue")
    layers = None
    for path in layout.layers:
        try:
            layers = _child(model, path)
            break
        except AttributeError:
            continue
    if layers is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} (model_type {model_type!r}) has none of {layout.layers}: pass the "
            "causal-LM model (e.g. AutoModelForCausalLM), not a bare backbone or a wrapper")
    n_heads = int(getattr(config, "num_attention_heads", None) or config.n_head)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    d_model = int(getattr(config, "hidden_size", None) or config.n_embd)
    attn0 = _child(layers[0], layout.attn)
    d_head = int(getattr(attn0, "head_dim", None) or getattr(attn0, "head_size", None) or d_model // n_heads)
    parallel = layout.mlp_norm is None and bool(getattr(config, "use_parallel_residual", True))
    if layout.mlp_norm is None and not parallel:
        layout = replace(layout, mlp_norm=layout.sequential_mlp_norm)
    return HFSites(model_type=model_type, n_layers=len(layers), n_heads=n_heads, n_kv_heads=n_kv,
                   d_head=d_head, d_model=d_model, parallel=parallel, sandwich=layout.sandwich,
                   layout=layout, layers=list(layers))


def attention_implementation(model: Any) -> str:
    """``model.config._attn_implementation`` (``"eager"``, ``"sdpa"``, ...; ``"eager"`` if unset)."""
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


