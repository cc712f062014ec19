"""Non-finite weights, found before anything runs: a damaged or diverged checkpoint makes every
activation downstream NaN, and an analysis would otherwise return NaN rows beside plausible
ones. One home for the scan, read by every analysis verb (:func:`~.sites.analysis_sites`), the
sweep, the site verification and the compression gate."""

from __future__ import annotations

import math
import weakref

import torch

from .lanes.bridge import hf_state_key

#: model -> the parameters' (storage address, version counter, shape, dtype) when a scan last
#: found every one finite. A parameter written in place since (``weight[0, 0] = nan``, an optimiser
#: step, ``load_state_dict``) bumps its version counter, and a replaced one has another address,
#: so either is scanned again; a write through ``.data`` (which keeps no shared version counter)
#: is not seen until another change does.
_FINITE_AT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _scan_key(params: list) -> tuple | None:
    """What :data:`_FINITE_AT` compares, or None where a tensor keeps no version counter (an
    inference tensor): such a model is scanned at every call."""
    try:
        return tuple((t.data_ptr(), t._version, tuple(t.shape), t.dtype) for _, t in params)
    except RuntimeError:
        return None


def nonfinite_parameters(model) -> list[tuple[str, int]]:
    """``(name, count)`` of every floating parameter of ``model`` holding NaN or inf entries, in
    module order; empty when all are finite. Buffers are not read: some are infinite by design
    (``HookedTransformer``'s ``IGNORE`` mask fill is ``-inf``). Bridge names are given without the
    wrapper hops (``._original_component``), as the Hugging Face checkpoint names them.

    Every analysis verb calls this, so the common case is fast: one sum per parameter (a NaN or
    inf entry makes its sum non-finite; the reverse, a finite tensor whose sum overflows, only
    sends it to the exact count), about a tenth of ``torch.isfinite`` per tensor on CPU. A bfloat16
    tensor is summed in its own dtype (the reduction accumulates in float32, and bfloat16 has
    float32's range): ``sum(dtype=float32)`` would first copy every weight to float32, 4-7x the
    time, which on a 1.5B-parameter model costs more than a short forward. float16 (range 65504)
    is summed in float32, so that a finite tensor rarely takes the exact path.

    A model whose parameters are the very tensors, unchanged (same storage, same version counter),
    that the last scan found finite is not summed again (:data:`_FINITE_AT`): the scan read every
    weight at every ``profile`` call, about 5 % of a 128-token forward of SmolLM2 (issue 51)."""
    params = [(n, t) for n, t in model.named_parameters() if t.is_floating_point() or t.is_complex()]
    if not params:
        return []
    key = _scan_key(params)
    try:
        if key is not None and _FINITE_AT.get(model) == key:
            return []
    except TypeError:  # a model that cannot be weakly referenced: scanned every time
        key = None
    with torch.no_grad():
        sums = torch.stack([t.sum(dtype=torch.float32 if t.dtype == torch.float16 else None).abs().to(torch.float64)
                            for _, t in params])
        if bool(torch.isfinite(sums).all()):
            if key is not None:
                _FINITE_AT[model] = key
            return []
        _FINITE_AT.pop(model, None)
        out = []
        for (name, t), s in zip(params, sums.tolist(), strict=True):
            if not math.isfinite(s):
                bad = int((~torch.isfinite(t)).sum())
                if bad:
                    out.append((hf_state_key(name), bad))
    return out


def nonfinite_message(model) -> str | None:
    """One sentence naming ``model``'s non-finite weights and the fix, or None when all are finite."""
    bad = nonfinite_parameters(model)
    if not bad:
        return None
    listed = ", ".join(f"{n} ({c} entries)" for n, c in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return (f"the model's weights hold NaN or inf: {listed}; every activation downstream is NaN, so no "
            "number can be produced. Load an undamaged checkpoint (or find where training diverged)")
