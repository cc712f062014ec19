"""tl_directional.edit.hf on the two real models (where installed): the same edit installed on the HF
model and on the TransformerLens model gives the same next-token loss, and scale 1 is a bit-exact
no-op (the tiny-model checks: tests/integration/test_hf_edits.py, whose loss these share; the
float32 tolerance is the round-off bound of tl_directional.core.roundoff)."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tests.integration.test_hf_edits import _loss
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.edit import DiagonalRemoval, EffectiveDiagonal, ResidualScale, ValueScale
from tl_directional.model.load import catalog, load_hf_model, load_model


@pytest.mark.parametrize("name", ("smollm2-135m", "gemma-3-270m"))
def test_real_models_equal_transformerlens_edit(name):
    if not catalog.is_installed(name) and not catalog.entry_dir(name).exists():
        pytest.skip(f"{name}: not installed; install with `{catalog.REAL_MODELS[name].install}` (or `make models`)")
    tl = load_model(name).eval()
    hf = load_hf_model(catalog.entry_dir(name))
    from tl_directional.io.corpus import heldout_text

    ids = tl.tokenizer(heldout_text()[:400], return_tensors="pt").input_ids[:, :16]
    # both lanes round differently (the legacy HookedTransformer re-implements the layers, the
    # bridge runs the HF modules under other hooks): a float32 forward's round-off, d_model terms
    # per layer, bounds the loss gap against the loss's own size
    terms = tl.cfg.d_model * tl.cfg.n_layers
    with torch.no_grad():
        gap = abs(float(_loss(tl(ids), ids)) - float(_loss(hf(ids).logits, ids)))
    # the last: a pattern edit and value edits sharing layers, composed as on the TL lanes
    composed = (DiagonalRemoval(layers=[2, 5]), ValueScale(0.0, mode="exclusive", layers=[2, 5]),
                EffectiveDiagonal(0.5, layers=[5]))
    for edits in ((ValueScale(0.0, mode="exclusive"),), (ResidualScale("attn", 0.0),), (ValueScale(0.0),), composed):
        with torch.no_grad():
            with tld.apply_edits(tl, *edits):
                a = _loss(tl(ids), ids)
            with tld.apply_edits(hf, *edits):
                b = _loss(hf(ids).logits, ids)
        tol = roundoff_tolerance(torch.float32, abs(float(b)), terms)
        assert abs(float(a) - float(b)) <= tol, (name, edits, float(a), float(b), "unedited gap", gap)
    with torch.no_grad():
        base = hf(ids).logits
        with tld.apply_edits(hf, ValueScale(1.0, mode="exclusive"), ResidualScale("mlp")):
            assert torch.equal(hf(ids).logits, base)
