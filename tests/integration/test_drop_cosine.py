"""The layer-drop cosine link (tl_directional.measure.cosine): 1 - cos(x, x + Delta) is a monotone
function of rho = beta / |1 + alpha|, checked on a tiny model's real streams and in the profile."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.measure.cosine import drop_cosine, stream_beta

from ._families import CAUSAL

TEXTS = ["In the beginning God created the heaven and the earth.", "And the earth was without form, and void."]


def _stream_and_update(model, layer):
    batch = tld.prepare_inputs(model, TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.attention_mask.bool()
    x = cache[f"blocks.{layer}.hook_resid_pre"][mask].double()
    delta = cache[f"blocks.{layer}.hook_resid_post"][mask].double() - x
    return x, delta, mask


@pytest.mark.parametrize("family", CAUSAL)
def test_identity_on_real_block_updates(tiny_model, family):
    """alpha and beta from the split, fed to the closed form, give 1 - cos(x, x + Delta) computed
    directly (float64), token by token, at every layer of the block unit."""
    model = tiny_model(family)
    for layer in range(int(model.cfg.n_layers)):
        x, delta, _ = _stream_and_update(model, layer)
        xx = (x * x).sum(-1)
        alpha = (delta * x).sum(-1) / xx
        perp = delta - alpha[:, None] * x
        rho, dist = drop_cosine(alpha, stream_beta((perp * perp).sum(-1), xx))
        direct = 1 - torch.nn.functional.cosine_similarity(x, x + delta, dim=-1)
        torch.testing.assert_close(dist, direct, rtol=1e-10, atol=1e-12)
        # the monotone link: among tokens whose stream is not reversed (1 + alpha > 0), sorting by
        # rho sorts 1 - cos; a random tiny model reverses some, where 1 - cos exceeds 1
        fwd = 1 + alpha > 0
        assert bool(fwd.any())
        order = torch.argsort(rho[fwd])
        assert bool((dist[fwd][order].diff() >= -1e-12).all())
        assert bool((dist[~fwd] >= 1).all())


def test_closed_form_edge_cases_are_finite():
    alpha = torch.tensor([0.0, -1.0, -1.0, -3.0, 0.5, 0.0], dtype=torch.float64)
    beta = torch.tensor([0.0, 0.0, 2.0, 1.0, 1e-4, float("inf")], dtype=torch.float64)
    rho, dist = drop_cosine(alpha, beta)
    assert not bool(torch.isnan(dist).any())
    assert dist[0] == 0 and dist[1] == 1 and dist[2] == 1 and dist[5] == 1
    assert dist[3] == pytest.approx(1 + 2 / (4 + 1) ** 0.5)  # reversed stream: cos < 0
    assert dist[4] == pytest.approx(0.5 * float(rho[4]) ** 2, rel=1e-6)  # the small-angle form
    assert stream_beta(torch.tensor([1.0]), torch.tensor([0.0])).isinf().all()


def test_profile_column_matches_direct_cosine(tiny_model):
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS)
    prof = tld.profile(model, batch.tokens, attention_mask=batch.attention_mask, progress=False,
                       exclude_first_token=False, components=["block"], drop_cosine=True)
    x, delta, mask = _stream_and_update(model, 1)
    direct = 1 - torch.nn.functional.cosine_similarity(x, x + delta, dim=-1)
    row = prof.residual.query("layer == 1 and component == 'block'").iloc[0]
    assert row["count"] == int(mask.sum())
    assert row["drop_cos_distance_mean"] == pytest.approx(float(direct.mean()), rel=1e-5)
    xx = (x * x).sum(-1)
    alpha = (delta * x).sum(-1) / xx
    rho = ((delta - alpha[:, None] * x).norm(dim=-1) / xx.sqrt()) / (1 + alpha).abs()
    assert row["drop_rho_mean"] == pytest.approx(float(rho.mean()), rel=1e-5)


def test_drop_columns_are_opt_in_and_change_no_other_column(tiny_model):
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS)
    kw = dict(attention_mask=batch.attention_mask, progress=False, exclude_first_token=False,
              components=["attn", "mlp", "block"])
    off = tld.profile(model, batch.tokens, **kw)
    on = tld.profile(model, batch.tokens, drop_cosine=True, **kw)
    drop = [c for c in on.residual.columns if c.startswith(("drop_rho", "drop_cos_distance"))]
    assert len(drop) == 2 * len([c for c in on.residual.columns if c.startswith("alpha_")])
    assert not any(c.startswith("drop_") for c in off.residual.columns)
    assert off.metadata["drop_cosine"] is False and on.metadata["drop_cosine"] is True
    # every other column is the same computation, bit for bit
    pd.testing.assert_frame_equal(off.residual, on.residual.drop(columns=drop), check_exact=True)
    with pytest.raises(TypeError, match="drop_cosine"):
        tld.profile(model, batch.tokens, drop_cosine="yes", **kw)
