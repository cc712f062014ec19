"""The sweep's per-setting metrics (BaselineStats) against a straightforward float64 formula."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tl_directional as tld
from tl_directional.evaluate.sweeps import BaselineStats
from tl_directional.model.load import load_model

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light.",
]


def _reference(base, edited, tokens, attention_mask) -> dict:
    """Every vocabulary-sized quantity materialised, every sum in float64: the definitions."""
    real = attention_mask.bool()
    predicted = real[:, :-1] & real[:, 1:]  # position t predicts a real token t + 1
    target = tokens[:, 1:].unsqueeze(-1)
    lp = F.log_softmax(base.double(), dim=-1)[:, :-1]
    lq = F.log_softmax(edited.double(), dim=-1)[:, :-1]
    kl = (lp.exp() * (lp - lq)).sum(-1)
    agree = edited.argmax(-1)[:, :-1] == base.argmax(-1)[:, :-1]
    return {
        "tokens": float(predicted.sum()),
        "nll": float(-lq.gather(-1, target).squeeze(-1)[predicted].sum()),
        "base_nll": float(-lp.gather(-1, target).squeeze(-1)[predicted].sum()),
        "kl": float(kl[predicted].sum()),
        "top1_agree": float(agree[predicted].sum()),
    }


@pytest.fixture(scope="module")
def float64_logits(tiny_model_dir):
    model = load_model(tiny_model_dir("gpt2"), dtype=torch.float64).eval()
    batch = tld.prepare_inputs(model, TEXTS)
    assert not batch.attention_mask.bool().all()  # padded: the mask matters
    with torch.no_grad():
        base = model(batch.tokens, attention_mask=batch.attention_mask)
        with tld.apply_edits(model, tld.ValueScale(s_par=0.0)):
            edited = model(batch.tokens, attention_mask=batch.attention_mask)
    assert base.dtype == torch.float64
    return base, edited, batch


@pytest.mark.parametrize("chunk_rows, keep_probs", [(None, True), (3, True), (1, False), (5, False)])
def test_metric_sums_equal_the_definitions_in_float64(float64_logits, monkeypatch, chunk_rows, keep_probs):
    base, edited, batch = float64_logits
    if chunk_rows is not None:
        monkeypatch.setattr(BaselineStats, "CHUNK_ELEMENTS", chunk_rows * base.shape[-1])
    if not keep_probs:
        monkeypatch.setattr(BaselineStats, "KEEP_PROBS_ELEMENTS", 0)  # recomputed per chunk
    stats = BaselineStats(base, batch.tokens, batch.attention_mask)
    if chunk_rows is not None:
        assert len(stats.ranges) > 3
    got = stats.compare(edited)
    want = _reference(base, edited, batch.tokens, batch.attention_mask)
    assert want["kl"] > 1e-3 and want["top1_agree"] < want["tokens"]  # the edit does something
    for k, v in want.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-10, abs=1e-10), k
    # the baseline against itself: zero KL, full agreement, equal NLL
    same = stats.compare(base)
    assert same.kl == pytest.approx(0.0, abs=1e-10)
    assert same.top1_agree == same.tokens and same.nll == pytest.approx(same.base_nll, rel=1e-12)


def test_float32_logits_agree_with_the_float64_definitions(float64_logits):
    base, edited, batch = float64_logits
    got = BaselineStats(base.float(), batch.tokens, batch.attention_mask).compare(edited.float())
    want = _reference(base.float(), edited.float(), batch.tokens, batch.attention_mask)
    for k, v in want.items():
        assert getattr(got, k) == pytest.approx(v, rel=1e-5, abs=1e-5), k


@pytest.mark.parametrize("chunk_rows, block_chunks, keep_probs", [(None, None, True), (2, 3, False), (1, 1, True),
                                                                   (4, 2, False)])
def test_compare_hidden_forms_the_logits_in_blocks_and_equals_compare(tiny_model_dir, monkeypatch, chunk_rows,
                                                                      block_chunks, keep_probs):
    # the sweep's edited forwards stop at the unembedding's input; the blocks of chunks that
    # compare_hidden unembeds must give the sums compare gives on the model's own logits
    from tl_directional.model.handle import unembedding

    model = load_model(tiny_model_dir("gpt2"), dtype=torch.float64).eval()
    batch = tld.prepare_inputs(model, TEXTS)
    unembed = unembedding(model)
    assert unembed is not None
    got: dict = {}
    with torch.no_grad():
        base = model(batch.tokens, attention_mask=batch.attention_mask)
        with tld.apply_edits(model, tld.ValueScale(s_par=0.0)), model.hooks(
                fwd_hooks=[(unembed.hook, lambda t, hook: got.setdefault("hidden", t.clone()))]):
            edited = model(batch.tokens, attention_mask=batch.attention_mask)
    vocab = base.shape[-1]
    if chunk_rows is not None:
        monkeypatch.setattr(BaselineStats, "CHUNK_ELEMENTS", chunk_rows * vocab)
        monkeypatch.setattr(BaselineStats, "BLOCK_ELEMENTS", block_chunks * chunk_rows * vocab)
    if not keep_probs:
        monkeypatch.setattr(BaselineStats, "KEEP_PROBS_ELEMENTS", 0)
    calls = []
    real_logits = type(unembed).logits

    def counting(self, hidden):
        calls.append(hidden.shape[0])
        return real_logits(self, hidden)

    monkeypatch.setattr(type(unembed), "logits", counting)
    stats = BaselineStats(base, batch.tokens, batch.attention_mask)
    from_hidden = stats.compare_hidden(got["hidden"], unembed)
    from_logits = stats.compare(edited)
    n_rows = base.shape[0] * base.shape[1]
    assert sum(calls) == n_rows and len(calls) == len(stats.blocks)
    if chunk_rows is not None:
        assert len(stats.blocks) > 1 and max(calls) <= block_chunks * chunk_rows
    want = _reference(base, edited, batch.tokens, batch.attention_mask)
    for k, v in want.items():
        assert getattr(from_hidden, k) == pytest.approx(v, rel=1e-10, abs=1e-10), k
        assert getattr(from_hidden, k) == pytest.approx(getattr(from_logits, k), rel=1e-12, abs=1e-12), k

