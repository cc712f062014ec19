"""The one patching loop that :func:`~tl_directional.evaluate.patching.patching.directional_patch`
and :func:`~tl_directional.evaluate.patching.path_patching.path_patch` specialise (as
TransformerLens's ``patching.generic_activation_patch`` is specialised by its ``get_act_patch_*``).

:func:`generic_directional_patch` owns the steps every patcher shares: the two call shapes
(``clean, corrupted`` or TransformerLens's ``corrupted_tokens, clean_cache``), chunking the planned
runs into stacked forwards, running each forward from its start block, reducing each copy's logits
to the metric, and handing the runs to the tabulator. A patcher gives three callables:

* ``plan(model, clean, corrupted, clean_cache, metric, **options) -> PatchJob``: checks the
  arguments, resolves the sites, runs (or reads) the clean and corrupted runs, and lists the
  patched runs in groups (a run whose ``value`` is already set, e.g. a patch that writes exactly
  the corrupted run's tensor, gets no forward);
* ``patch_setter(job, key, chunk) -> StackedPatch``: the stacked block input and the hooks of one
  forward of the runs ``chunk`` of the group ``key``;
* ``tabulate(job)``: the result, from the runs' values.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...model.handle import from_block
from ...model.lanes import BlockInput
from .cache_input import is_cache

#: Default bound on one stacked forward's logits (elements), when the caller gives no batch size.
AUTO_LOGIT_ELEMENTS = 2**26
#: Default bound on the copies in one stacked forward (on small models a forward's fixed cost dominates).
AUTO_MAX_RUNS = 64


@dataclass
class PatchJob:
    """What a plan hands the loop.

    Attributes:
        groups: ``(key, runs)`` pairs; each run has a ``value`` (None: to be run), and the runs of
            one group share forwards (``key`` is passed on to the patch setter).
        tokens, attention_mask: the corrupted batch ``[b, pos]`` (on the model's device).
        block0: the corrupted run's recorded block-0 input (its output form).
        metric_values: ``[b, pos, vocab]`` logits of one copy -> float64 metric values.
        d_vocab: the logits' last size (sizes the default stack).
        batch_size: patched runs stacked into one forward (None: :func:`copies_per_forward`).
        state: the patcher's own (what its setter and tabulator read).
    """

    groups: list[tuple[Any, list]]
    tokens: Tensor
    attention_mask: Tensor
    block0: BlockInput
    metric_values: Callable[[Tensor], np.ndarray]
    d_vocab: int
    batch_size: int | None
    state: Any


@dataclass
class StackedPatch:
    """One forward: it starts at block ``start`` from the stacked stream ``resid`` ``[copies * b,
    pos, d_model]`` with ``hooks`` on; the first ``len(chunk)`` copies are the chunk's runs in
    order (more copies are helpers, e.g. path patching's shadows). ``edits_norm_scale`` as in
    :func:`stacked_forward`."""

    start: int
    resid: Tensor
    hooks: list
    copies: int
    edits_norm_scale: bool = False


def check_batch_size(batch_size, error: type[Exception] = ValueError) -> int | None:
    """``batch_size`` (patched runs stacked into one forward), checked: a positive integer or None."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise error(f"batch_size must be a positive integer (patched runs stacked into one forward) "
                    f"or None (automatic), got {batch_size!r}")
    return batch_size


def generic_directional_patch(model, clean, corrupted, metric, *, plan: Callable[..., PatchJob],
                              patch_setter: Callable[[PatchJob, Any, list], StackedPatch],
                              tabulate: Callable[[PatchJob], Any], progress: bool = False, **options):
    """Plan the patched runs, run them in stacked forwards, tabulate (the module docstring).

    Args:
        model: a TransformerLens model (either lane), in eval mode.
        clean, corrupted: inputs of identical token shape; or ``corrupted_tokens, clean_cache``
            (TransformerLens's patching shape, ``clean_cache`` any mapping of clean activations).
        metric: ``logits -> number`` or per-example values; ``plan`` decides which it accepts.
        plan: ``(model, clean, corrupted, clean_cache, metric, **options) -> PatchJob``.
        patch_setter: ``(job, key, chunk) -> StackedPatch``, one forward of a group's runs.
        tabulate: ``job -> result``, read once every run has its value.
        progress: a progress bar over the groups of runs.
        **options: passed on to ``plan`` (e.g. ``components=``, ``sender=``, ``batch_size=``).

    Returns:
        What ``tabulate`` returns.
    """
    clean_cache = None
    if is_cache(corrupted):  # TransformerLens shape: (model, corrupted_tokens, clean_cache, metric)
        clean_cache, corrupted, clean = corrupted, clean, None
    job = plan(model, clean, corrupted, clean_cache, metric, **options)
    run_patches(model, job, patch_setter, progress)
    return tabulate(job)


def run_patches(model, job: PatchJob, patch_setter, progress: bool = False) -> None:
    """Every run of ``job`` whose value is unset, stacked up to ``job.batch_size`` per forward
    within its group; stores each run's metric in its ``value``."""
    b, n_pos = job.tokens.shape
    k_max = job.batch_size or copies_per_forward(b, n_pos, job.d_vocab)
    groups = job.groups
    if progress:
        from tqdm.auto import tqdm

        groups = tqdm(groups, desc="patch")
    with torch.no_grad():
        for key, runs in groups:
            todo = [run for run in runs if run.value is None]
            for start in range(0, len(todo), k_max):
                chunk = todo[start:start + k_max]
                patch = patch_setter(job, key, chunk)
                # each copy's logits are reduced to the metric at once and dropped, so one
                # [copies * b, pos, vocab] tensor is alive at a time (Gemma-3: 262k vocabulary)
                logits = stacked_forward(model, job.block0, patch.start, patch.resid, job.tokens,
                                         job.attention_mask, patch.hooks, patch.copies,
                                         edits_norm_scale=patch.edits_norm_scale)
                for i, run in enumerate(chunk):
                    run.value = job.metric_values(logits[i * b:(i + 1) * b])
                del logits


def copies_per_forward(b: int, n_pos: int, d_vocab: int) -> int:
    """How many patched copies of a ``[b, n_pos]`` batch one forward takes by default: as many as
    keep its ``[copies * b, n_pos, d_vocab]`` logits under :data:`AUTO_LOGIT_ELEMENTS`, at most
    :data:`AUTO_MAX_RUNS`, at least one."""
    return max(1, min(AUTO_MAX_RUNS, AUTO_LOGIT_ELEMENTS // max(1, b * n_pos * d_vocab)))


def stacked_forward(model, block0: BlockInput, start: int, resid: Tensor, tokens: Tensor, mask: Tensor,
                    hooks: list, copies: int, *, edits_norm_scale: bool = False) -> Tensor:
    """Logits ``[copies * b, pos, vocab]`` of one forward from block ``start`` whose input is the
    stacked stream ``resid`` ``[copies * b, pos, d_model]``, with ``hooks`` on; ``tokens`` /
    ``mask`` ``[b, pos]`` are repeated ``copies`` times (as is, for one copy). ``block0`` is the
    unpatched run's recorded block input (its output form).

    ``edits_norm_scale``: the hooks edit a norm's ``hook_scale`` on purpose (path patching with
    frozen norms); the bridge then rebuilds the norm's output from the hooked values and says so,
    which is expected here and not shown."""
    if copies > 1:
        tokens, mask = tokens.repeat(copies, 1), mask.repeat(copies, 1)
    with (
        from_block(model, type(block0)(start, resid, block0.output_form)) as run,
        model.hooks(fwd_hooks=hooks),
        warnings.catch_warnings() if edits_norm_scale else nullcontext(),
    ):
        if edits_norm_scale:
            warnings.filterwarnings("ignore", "A forward hook edited hook_scale", UserWarning)
        return run(tokens, mask)


__all__ = ["AUTO_LOGIT_ELEMENTS", "AUTO_MAX_RUNS", "PatchJob", "StackedPatch", "check_batch_size", "copies_per_forward",
           "generic_directional_patch", "run_patches", "stacked_forward"]
