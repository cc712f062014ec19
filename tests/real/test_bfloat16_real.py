"""bfloat16 models end to end on the real models (issue 51): the profile of a bfloat16 model
is exact about that model's own activations (its statistics accumulate in float32 at least),
and it agrees with the float32 model's profile within the bound stated here.

Two separate claims, because they fail for different reasons:

* **Exact on its own activations.** ``par_frac = |cos(u, r)|`` (METHOD.md sec. 1) of each
  residual-space update against its stream, computed here in float64 from the bfloat16 model's
  own cached hooks, equals the profile's mean within float32's round-off of a ``d_model``-long
  dot product: the split upcasts bfloat16 to float32 before it multiplies anything.
* **Close to the float32 model.** The bfloat16 model's activations differ from the float32
  model's (8 bits of mantissa per activation, compounded over the layers), so its profile does
  too. Stated bound: every layer's ``par_frac_mean`` within 0.05 of the float32 model's, and
  the median over rows within 0.005. Measured on these two sentences (bridge lane): SmolLM2-135M
  max 0.033 / median 0.00063; Gemma-3-270M max 0.0047 / median 0.00071 (values range 0.02-0.91).

Skipped without the models (``make models``)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.measure.profiler import profile
from tl_directional.model.load import catalog, load_model

TEXTS = ["The cat sat on the mat and looked at the bird in the tree",
         "A dog ran in the park and barked at a man with a hat"]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-3-270m"])
def test_bfloat16_profile_is_exact_on_its_own_activations_and_close_to_float32(name):
    if not catalog.is_installed(name):
        pytest.skip(f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`")
    m32 = load_model(name).eval()
    m16 = load_model(name, dtype=torch.bfloat16).eval()
    assert next(m16.parameters()).dtype == torch.bfloat16
    rows = [m32.to_tokens(t)[0] for t in TEXTS]
    n = min(len(r) for r in rows)
    tokens = torch.stack([r[:n] for r in rows])  # cut to one length: no padding
    p32 = profile(m32, tokens, progress=False).residual
    p16 = profile(m16, tokens, progress=False).residual
    gap = (p32["par_frac_mean"] - p16["par_frac_mean"]).abs()
    assert float(gap.max()) <= 0.05 and float(gap.median()) <= 0.005, gap.describe()

    hooks = {h for name in set(p16["update_hook"]) | set(p16["reference_hook"]) for h in name.split(" - ")}
    with torch.no_grad():
        _, cache = m16.run_with_cache(tokens, names_filter=lambda n: n in hooks)
    d = int(m16.cfg.d_model)
    for row in p16.itertuples():
        # an update named "a - b" is the difference of two streams (a block's whole update)
        parts = [cache[h].double() for h in row.update_hook.split(" - ")]
        u = parts[0] - parts[1] if len(parts) == 2 else parts[0]
        r = cache[row.reference_hook].double()
        cos = (torch.linalg.vecdot(u, r) / (u.norm(dim=-1) * r.norm(dim=-1))).abs()
        cos = cos[:, 1:]  # the profile leaves the first token out by default (its attention sink)
        assert row.count == cos.numel()
        tol = roundoff_tolerance(torch.float32, 1.0, d)
        assert abs(float(cos.mean()) - row.par_frac_mean) <= tol, (row.layer, row.component)
