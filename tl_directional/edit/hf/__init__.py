"""tl_directional on plain Hugging Face ``transformers`` models (no TransformerLens needed).

* :func:`apply_edits` / :func:`install_edits`: the package's edits (``ResidualScale``,
  ``ValueScale`` full / exclusive, ``DiagonalRemoval``, ``EffectiveDiagonal``) as torch module
  hooks on an ``AutoModelForCausalLM`` (:mod:`tl_directional.edit.hf.edits`).
* :func:`apply_carrier_edits` / :func:`install_carrier_edits`: the MLP carrier edits
  (``MLPCarrierScale``) as module hooks (:mod:`tl_directional.edit.hf.carrier`).
* :class:`DirectionalEditCallback` (``tl_directional.training.hf_callback``): a ``transformers.Trainer``
  callback that keeps an edit active during training, with an ``s_par`` schedule and logging of
  the measured parallel share per layer. Imported lazily (it imports ``transformers``).
* :mod:`tl_directional.evaluate.lm_eval_task`: a local lm-evaluation-harness task on the bundled
  held-out texts. Imported lazily (it imports ``lm_eval`` only when evaluating).
* :mod:`tl_directional.evaluate.lm_eval_model`: the lm-eval model ``tl-directional`` (a local HF
  model with edits from a sweep label), registered when imported; ``tl-directional-lm-eval``
  (:mod:`tl_directional.cli.lm_eval`) is lm-eval's command line with it. Imported lazily.
"""

from __future__ import annotations

import importlib

from .carrier import apply_carrier_edits, install_carrier_edits
from .edits import (
    MODEL_TYPES,
    AttentionPatternUnavailableError,
    EditsAlreadyInstalledError,
    HFEditHandle,
    HFSites,
    UnsupportedModelError,
    apply_edits,
    attention_implementation,
    edit_label,
    install_edits,
    installed_edits,
    remove_edits,
    resolve_hf_sites,
)

_CALLBACK = "tl_directional.training.hf_callback"
_LAZY = {
    "DirectionalEditCallback": _CALLBACK,
    "SparSchedule": _CALLBACK,
    "S_PAR_RANGE": _CALLBACK,
}
_LAZY_MODULES = {"callback": _CALLBACK, "lm_eval_task": "tl_directional.evaluate.lm_eval_task"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AttentionPatternUnavailableError",
    "DirectionalEditCallback",
    "EditsAlreadyInstalledError",
    "HFEditHandle",
    "HFSites",
    "MODEL_TYPES",
    "SparSchedule",
    "S_PAR_RANGE",
    "UnsupportedModelError",
    "apply_carrier_edits",
    "apply_edits",
    "attention_implementation",
    "edit_label",
    "install_edits",
    "install_carrier_edits",
    "installed_edits",
    "remove_edits",
    "resolve_hf_sites",
]
