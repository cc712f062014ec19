"""Non-finite weights, found before anything runs: a damaged or diverged checkpoint makes every
activation downstream NaN, and an analysis would otherwise return NaN rows beside plausible
ones. One home for the scan, read by every analysis verb (:func:`~.sites.analysis_sites`), the
sweep, the site verification and the compression gate."""

from __future__ import annotations

import math

import torch

from .lanes.bridge import hf_state_key


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
    is summed in float32, so that a finite tensor rarely takes the exact path."""
    params = [(n, t) for n, t in model.named_parameters() if t.is_floating_point() or t.is_complex()]
    if not params:
        return []
    with torch.no_grad():
        sums = torch.stack([t.sum(dtype=torch.float32 if t.dtype == torch.float16 else None).abs().to(torch.float64)
                            for _, t in params])
        if bool(torch.isfinite(sums).all()):
            return []
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
