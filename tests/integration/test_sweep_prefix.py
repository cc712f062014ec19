"""sweep(shared_prefix=True): runs the unedited prefix once and equals full forwards."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional.evaluate.sweeps import BaselineStats, grid, sweep

from ._families import CAUSAL

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
]
NUM = ["loss", "delta_loss", "ppl", "kl", "top1_agree"]


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("stack", [1, 3])
def test_shared_prefix_equals_full_forwards(tiny_model, family, stack):
    model = tiny_model(family)
    settings = (grid("value", s_par=(0.0, 0.5, 2.0), layers=[[1]])
                + grid(["resid-mlp", "block"], s_par=(0.0, 1.5), layers=[[1]]))
    full = sweep(model, TEXTS, settings, batch_size=2, stack=stack, progress=False)
    fired = []
    with model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda t, hook: fired.append(1))]):
        shared = sweep(model, TEXTS, settings, batch_size=2, stack=stack, progress=False,
                       shared_prefix=True)
    # block 0 ran only in the two baseline forwards (one per batch), never per setting
    assert len(fired) == 2
    assert (full["delta_loss"].abs().iloc[1:] > 1e-6).any()  # the edits do something
    pd.testing.assert_frame_equal(full[NUM], shared[NUM], check_exact=False, rtol=1e-5, atol=1e-6)
    # and blocks are restored afterwards: a plain forward is unchanged
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        a = model(batch.tokens, attention_mask=batch.attention_mask)
    assert "forward" not in model.blocks[0].__dict__
    assert torch.isfinite(a).all()


def test_prefix_is_ignored_when_a_setting_edits_layer_0(tiny_model):
    model = tiny_model("gpt2")
    settings = grid("value", s_par=(0.0,), layers=[[0, 1]])
    a = sweep(model, TEXTS, settings, batch_size=3, progress=False)
    b = sweep(model, TEXTS, settings, batch_size=3, progress=False, shared_prefix=True)
    pd.testing.assert_frame_equal(a[NUM], b[NUM])


def test_chunked_metrics_equal_one_chunk(tiny_model, monkeypatch):
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS)
    with torch.no_grad():
        base = model(batch.tokens, attention_mask=batch.attention_mask)
        with tld.apply_edits(model, tld.ValueScale(s_par=0.0)):
            edited = model(batch.tokens, attention_mask=batch.attention_mask)
    one = BaselineStats(base, batch.tokens, batch.attention_mask).compare(edited)
    monkeypatch.setattr(BaselineStats, "CHUNK_ELEMENTS", 3 * base.shape[-1])  # 3 rows a chunk
    monkeypatch.setattr(BaselineStats, "KEEP_PROBS_ELEMENTS", 0)  # recompute p per chunk
    stats = BaselineStats(base, batch.tokens, batch.attention_mask)
    assert len(stats.ranges) > 3
    many = stats.compare(edited)
    for k in ("tokens", "nll", "base_nll", "kl", "top1_agree"):
        assert getattr(many, k) == pytest.approx(getattr(one, k), rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("family", CAUSAL)
def test_forward_from_block_equals_the_full_forward(tiny_model, family):
    from tl_directional.model.handle import forward_from_block, forward_recording_block_input

    model = tiny_model(family)
    batch = tld.prepare_inputs(model, TEXTS)
    assert not batch.attention_mask.bool().all()  # padded rows: masks and positions matter
    with torch.no_grad():
        full, block_input = forward_recording_block_input(model, batch.tokens, batch.attention_mask, 1)
        fired = []
        with model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda t, hook: fired.append(1))]):
            again = forward_from_block(model, batch.tokens, batch.attention_mask, block_input)
            stacked = forward_from_block(model, batch.tokens.repeat(2, 1), batch.attention_mask.repeat(2, 1),
                                         block_input, repeat=2)
    assert fired == []  # block 0 did not run
    real = batch.attention_mask.bool()
    torch.testing.assert_close(again[real], full[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stacked[: len(batch)][real], full[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stacked[len(batch):][real], full[real], rtol=1e-5, atol=1e-5)
    assert "forward" not in model.blocks[0].__dict__  # pass-throughs removed
