"""Non-finite weights, found before anything runs: a damaged or diverged checkpoint makes every
activation downstream NaN, and an analysis would otherwise return NaN rows beside plausible
ones. One home for the scan, read by every analysis verb (:func:`~.sites.analysis_sites`), the
sweep, the site verification and the compression gate."""

from __future__ import annotations

import torch

from .lanes.bridge import hf_state_key


def nonfinite_parameters(model) -> list[tuple[str, int]]:
    """``(name, count)`` of every floating parameter of ``model`` holding NaN or inf entries, in
    module order; empty when all are finite. Buffers are not read: some are infinite by design
    (``HookedTransformer``'s ``IGNORE`` mask fill is ``-inf``). Bridge names are given without the
    wrapper hops (``._original_component``), as the Hugging Face checkpoint names them."""
    out = []
    with torch.no_grad():
        for name, t in model.named_parameters():
            if t.is_floating_point() or t.is_complex():
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
