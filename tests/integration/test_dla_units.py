"""split_logit_attribution in TransformerLens 4.3's ``direct_logit_attribution`` shape (issue 48):
``unit=`` picks the rows, ``cache=`` reads a user's ``run_with_cache`` instead of running again,
and both give exactly the rows of the default call."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld


def _setup(tiny_model, family="gpt2"):
    model = tiny_model(family)
    tokens = torch.randint(1, int(model.cfg.d_vocab), (2, 7), generator=torch.Generator().manual_seed(0))
    return model, tokens, tokens[:, 1], tokens[:, 2]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_unit_picks_the_rows_of_the_full_table(tiny_model, family):
    model, tokens, answer, wrong = _setup(tiny_model, family)
    full = tld.split_logit_attribution(model, tokens, answer, incorrect_tokens=wrong)
    for unit, kept in (("component", {"attn", "mlp"}), ("head", {"head"})):
        got = tld.split_logit_attribution(model, tokens, answer, incorrect_tokens=wrong, unit=unit)
        want = full[full["unit"].isin(kept)].reset_index(drop=True)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_exact=True)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_cache_gives_the_rows_of_a_run(tiny_model, family):
    """The same forward, once inside the function and once by ``run_with_cache``: the same rows,
    with ``inputs`` None (no padding: the last position) or the tokens the cache was run on."""
    model, tokens, answer, wrong = _setup(tiny_model, family)
    full = tld.split_logit_attribution(model, tokens, answer, incorrect_tokens=wrong)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for inputs in (None, tokens):
        got = tld.split_logit_attribution(model, inputs, answer, incorrect_tokens=wrong, cache=cache)
        pd.testing.assert_frame_equal(got, full, check_exact=False, rtol=0, atol=1e-6)


def test_bad_unit_and_cache_are_named(tiny_model):
    model, tokens, answer, _ = _setup(tiny_model)
    with pytest.raises(ValueError, match=r"unit must be one of .* split_logit_lens"):
        tld.split_logit_attribution(model, tokens, answer, unit="layer")
    with pytest.raises(ValueError, match="unit must be one of"):
        tld.split_logit_attribution(model, tokens, answer, unit="heads")
    with torch.no_grad():
        _, partial = model.run_with_cache(tokens, names_filter=lambda n: not n.endswith("hook_z"))
        _, short = model.run_with_cache(tokens[:, :5])
    with pytest.raises(ValueError, match=r"cache has no 'blocks.0.attn.hook_z'"):
        tld.split_logit_attribution(model, None, answer, cache=partial)
    with pytest.raises(ValueError, match=r"batch and positions \(2, 5\)"):
        tld.split_logit_attribution(model, tokens, answer, cache=short)
    with pytest.raises(ValueError, match="cache must be an ActivationCache"):
        tld.split_logit_attribution(model, tokens, answer, cache=torch.zeros(2))
    with pytest.raises(ValueError, match="with cache=, inputs must be None or the"):
        tld.split_logit_attribution(model, ["a text"], answer[:1], cache=short)
    with pytest.raises(ValueError, match="inputs is None and no cache"):
        tld.split_logit_attribution(model, None, answer)
