"""tl_directional on plain Hugging Face ``transformers`` models (no TransformerLens needed).

* :func:`install_edits`: the package's edits (``ResidualScale``, ``ValueScale`` full / exclusive,
  ``DiagonalRemoval``, ``EffectiveDiagonal``, the steering edit ``ActivationAddition``:
  :mod:`tl_directional.edit.hf.steering`) as torch module hooks on an
  ``AutoModelForCausalLM`` until ``handle.remove()`` (:mod:`tl_directional.edit.hf.edits`);
  :func:`tl_directional.apply_edits` uses it for a context on these models.
* :func:`apply_carrier_edits` / :func:`install_carrier_edits`: the MLP carrier edits
  (``MLPCarrierScale``) as module hooks (:mod:`tl_directional.edit.hf.carrier`).

The ``transformers.Trainer`` callback that keeps an edit active during training is
:class:`tl_directional.training.hf_callback.DirectionalEditCallback`, and the lm-evaluation-harness
plug-in is :mod:`tl_directional.evaluate.suites.lm_eval_task` / :mod:`tl_directional.evaluate.suites.lm_eval_model`:
they build on this lane (training and evaluation depend on the edits, not the reverse).
"""

from __future__ import annotations

from ...model.hf_layout import (
    MODEL_TYPES,
    AttentionPatternUnavailableError,
    HFSites,
    UnsupportedModelError,
    attention_implementation,
    resolve_hf_sites,
)
from .carrier import apply_carrier_edits, install_carrier_edits
from .edits import (
    EditsAlreadyInstalledError,
    HFEditHandle,
    install_edits,
    installed_edits,
    remove_edits,
    stacked_edits,
)
from .value_chain import edit_label

__all__ = [
    "AttentionPatternUnavailableError",
    "EditsAlreadyInstalledError",
    "HFEditHandle",
    "HFSites",
    "MODEL_TYPES",
    "UnsupportedModelError",
    "apply_carrier_edits",
    "attention_implementation",
    "edit_label",
    "install_edits",
    "install_carrier_edits",
    "installed_edits",
    "remove_edits",
    "resolve_hf_sites",
    "stacked_edits",
]
