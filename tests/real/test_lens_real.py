"""The split logit lens on the real SmolLM2-135M (GQA) and Gemma-3-270M (GQA, sandwich norms):
TransformerLens 4.3's ``logit_lens`` parity, the last entry equal to the model's own logit, and
the parts adding up to the lens's change; the text and ``cache=`` ways in. Skipped without the models (``make models``)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.evaluate.lens import split_logit_lens
from tl_directional.model.load import catalog, load_model, tl_lane

REAL = ("smollm2-135m", "gemma-3-270m")


@pytest.mark.parametrize("name", REAL)
def test_split_lens_on_real_models(name):
    if not catalog.is_installed(name):
        pytest.skip(
            f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}`"
        )
    model = load_model(name).eval()
    tokens = model.to_tokens("The Eiffel Tower is in the city of")
    result = split_logit_lens(model, tokens, targets=" Paris")
    target = int(result.targets[0, 0])
    with torch.no_grad():
        own = model(tokens)[0, :, target].double()
    # float32 logits (Gemma-3 reads ~200 at the embedding): a few ulps
    torch.testing.assert_close(result.lens_logits[-1, 0], own, atol=1e-5, rtol=1e-6)
    parts = result.parallel() + result.perpendicular()
    torch.testing.assert_close(parts, result.full, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        result.full.sum(0), result.lens_logits[-1] - result.lens_logits[0], atol=1e-12, rtol=0
    )
    # the TransformerLens 4.3 ways in (issue 48): the cache of run_with_cache read without a forward
    # (bit for bit), the text itself at its last position (the unembedding's product rounds by rows)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    cached = split_logit_lens(model, cache=cache, targets=" Paris")
    for field in ("lens_logits", "parallel_if_first", "parallel_if_last", "step_full"):
        assert torch.equal(getattr(cached, field), getattr(result, field)), field
    last = split_logit_lens(model, "The Eiffel Tower is in the city of", targets=" Paris", positions=-1)
    assert last.positions.tolist() == [tokens.shape[1] - 1]
    limit = roundoff_tolerance(torch.float32, float(result.lens_logits.abs().max()), int(model.cfg.d_model))
    assert float((last.lens_logits[..., 0] - result.lens_logits[..., -1]).abs().max()) <= limit
    if tl_lane() == "bridge":
        from transformer_lens.tools.analysis.logit_lens import logit_lens

        theirs = logit_lens(model, tokens, positions=None, targets=target).values[..., 0].double()
        torch.testing.assert_close(result.lens_logits, theirs, atol=1e-5, rtol=1e-6)
