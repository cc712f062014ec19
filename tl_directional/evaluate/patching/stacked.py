"""The step every patching variant shares: several patched copies of the corrupted batch stacked
into one forward that starts at a block, and how many copies fit in one forward.

:func:`~tl_directional.evaluate.patching.patching.directional_patch` stacks one copy per patch
(a component, layer, head, position and part); :func:`~tl_directional.evaluate.patching.path_patching.path_patch`
stacks its path runs and their *shadow* copies. Each builds its block input and hooks; this module
runs the forward (:func:`~tl_directional.model.handle.from_block`) and sizes the stack.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext

from torch import Tensor

from ...model.handle import from_block
from ...model.lanes import BlockInput

#: Default bound on one stacked forward's logits (elements), when the caller gives no batch size.
AUTO_LOGIT_ELEMENTS = 2**26
#: Default bound on the copies in one stacked forward (on small models a forward's fixed cost dominates).
AUTO_MAX_RUNS = 64


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


__all__ = ["AUTO_LOGIT_ELEMENTS", "AUTO_MAX_RUNS", "copies_per_forward", "stacked_forward"]
