"""tl_directional on plain Hugging Face ``transformers`` models (no TransformerLens needed).

* :func:`apply_edits` / :func:`install_edits`: the package's edits (``ResidualScale``,
  ``ValueScale`` full / exclusive, ``DiagonalRemoval``, ``EffectiveDiagonal``) as torch module
  hooks on an ``AutoModelForCausalLM`` (:mod:`tl_directional.hf.edits`).
* :class:`DirectionalEditCallback` (``tl_directional.hf.callback``): a ``transformers.Trainer``
  callback that keeps an edit active during training, with an ``s_par`` schedule and logging of
  the measured parallel share per layer. Imported lazily (it imports ``transformers``).
* :mod:`tl_directional.hf.lm_eval_task`: a local lm-evaluation-harness task on the bundled
  held-out texts. Imported lazily (it imports ``lm_eval`` only when evaluating).
* :mod:`tl_directional.hf.lm_eval_model`: the lm-eval model ``tl-directional`` (a local HF
  model with edits from a sweep label), registered when imported; ``tl-directional-lm-eval``
  (:mod:`tl_directional.hf.lm_eval_cli`) is lm-eval's command line with it. Imported lazily.
"""

from __future__ import annotations

import importlib

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

_LAZY = {
    "DirectionalEditCallback": "callback",
    "SparSchedule": "callback",
    "S_PAR_RANGE": "callback",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in ("callback", "lm_eval_task", "lm_eval_model", "lm_eval_cli"):
        return importlib.import_module(f".{name}", __name__)
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
    "apply_edits",
    "attention_implementation",
    "edit_label",
    "install_edits",
    "installed_edits",
    "remove_edits",
    "resolve_hf_sites",
]
