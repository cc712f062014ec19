"""Half-precision models (issue 51): a block's update is the difference of two streams, and the
split takes it in the compute dtype (float32), not in the model's bfloat16 / float16, where it
would be rounded to 8 / 11 bits before anything is measured. Checked on the profile (streaming
and from a cache) and on the block edit, against float64 computed here from the model's own
cached streams. Measured before the fix on SmolLM2-135M in bfloat16: a block row's
``par_frac_mean`` off by up to 1.9e-4 (after: 5e-8; tests/real/test_bfloat16_real.py)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.edit import ResidualScale
from tl_directional.measure.profiler import Profile, profile
from tl_directional.model.load import load_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_update_is_differenced_in_the_compute_dtype(tiny_model_dir, dtype):
    model = load_model(tiny_model_dir("llama"), dtype=dtype).eval()
    tokens = torch.randint(1, int(model.cfg.d_vocab), (2, 12), generator=torch.Generator().manual_seed(0))
    d = int(model.cfg.d_model)
    names = [f"blocks.{L}.hook_resid_{w}" for L in range(model.cfg.n_layers) for w in ("pre", "post")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    streaming = profile(model, tokens, components=("block",), progress=False).residual
    cached = Profile.from_cache(model, cache, components=("block",)).residual
    for table in (streaming, cached):
        for row in table.itertuples():
            u = cache[f"blocks.{row.layer}.hook_resid_post"].double() - cache[f"blocks.{row.layer}.hook_resid_pre"].double()
            r = cache[f"blocks.{row.layer}.hook_resid_pre"].double()
            cos = (torch.linalg.vecdot(u, r) / (u.norm(dim=-1) * r.norm(dim=-1))).abs()[:, 1:]
            assert abs(float(cos.mean()) - row.par_frac_mean) <= roundoff_tolerance(torch.float32, 1.0, d), row.layer

    # the block edit at s_par = 0 removes the float32 parallel part of the float32 difference
    L = 0
    seen = {}
    hooks = ResidualScale("block", s_par=0.0, layers=[L]).fwd_hooks(model)
    hooks.append((f"blocks.{L}.hook_resid_post", lambda t, hook: seen.__setitem__("post", t.detach().clone())))
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    pre = cache[f"blocks.{L}.hook_resid_pre"].float()
    u = cache[f"blocks.{L}.hook_resid_post"].float() - pre
    a = torch.linalg.vecdot(u, pre) / torch.linalg.vecdot(pre, pre)
    expected = (pre + u - a.unsqueeze(-1) * pre).to(dtype)
    # one rounding to the model's dtype apart at most (the cast back)
    gap = (seen["post"].float() - expected.float()).abs()
    assert float(gap.max()) <= 2 * torch.finfo(dtype).eps * float(expected.float().abs().max())
