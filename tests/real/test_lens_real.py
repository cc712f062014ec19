"""The split logit lens on the real SmolLM2-135M (GQA) and Gemma-3-270M (GQA, sandwich norms):
TransformerLens 4.3's ``logit_lens`` parity, the last entry equal to the model's own logit, and
the parts adding up to the lens's change. Skipped without the models (``make models``)."""

from __future__ import annotations

import pytest
import torch

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
    if tl_lane() == "bridge":
        from transformer_lens.tools.analysis.logit_lens import logit_lens

        theirs = logit_lens(model, tokens, positions=None, targets=target).values[..., 0].double()
        torch.testing.assert_close(result.lens_logits, theirs, atol=1e-5, rtol=1e-6)
