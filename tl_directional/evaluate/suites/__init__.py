"""Suites: accuracy of an edited model on fixed item sets.

:mod:`~tl_directional.evaluate.suites.accuracy` builds cloze and continuation items from held-out
text and scores them on the model; :mod:`~tl_directional.evaluate.suites.lm_eval_task` runs an
edited ``transformers`` model through lm-evaluation-harness (:func:`evaluate_edited`, the bundled
task in :func:`task_dir`). :mod:`~tl_directional.evaluate.suites.lm_eval_model` (lm-eval's model
class, registered as ``tl-directional`` when imported) is not imported here: it imports
``lm_eval`` at module level, an optional dependency.
"""

from .accuracy import (
    N_CHOICES,
    AccuracySuiteError,
    ClozeItem,
    ContinuationItem,
    build_cloze_items,
    build_continuation_items,
    cloze_choice_logits,
    cloze_choices,
    continuation_choice_scores,
    continuation_requests,
    frequency_bands,
    loglikelihoods,
)
from .lm_eval_task import TASK_NAME, check_task_dir, evaluate_edited, task_dir

__all__ = [
    "N_CHOICES",
    "TASK_NAME",
    "AccuracySuiteError",
    "ClozeItem",
    "ContinuationItem",
    "build_cloze_items",
    "build_continuation_items",
    "check_task_dir",
    "cloze_choice_logits",
    "cloze_choices",
    "continuation_choice_scores",
    "continuation_requests",
    "evaluate_edited",
    "frequency_bands",
    "loglikelihoods",
    "task_dir",
]
