"""The accuracy suite's scorer (protocol sec. 9.4) against two independent ones on the bundled
default model: a plain per-request torch log-softmax written here, and the project's lm-eval
integration's loglikelihood path (``TLDirectionalLM``, i.e. lm-eval's ``HFLM``)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.evaluate.accuracy import (
    build_cloze_items,
    build_continuation_items,
    cloze_choice_logits,
    continuation_choice_scores,
    continuation_requests,
    frequency_bands,
    loglikelihoods,
)
from tl_directional.model.inputs import load_text_sequences
from tl_directional.model.load import load_model


@pytest.fixture(scope="module")
def suite():
    torch.manual_seed(0)
    model = load_model("default").eval()
    batch = load_text_sequences(model, None, max_sequences=4, seq_len=48)
    items = build_continuation_items(
        batch.tokens, text="kjv", per_window=1, context_len=12, continuation_len=6, seed=0
    )
    return model, batch, items


def _plain(forward, ctx, cont):
    ids = torch.tensor([list(ctx) + list(cont)])
    lp = torch.log_softmax(forward(ids)[0].double(), -1)
    return sum(float(lp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))


def test_scorer_equals_plain_log_softmax(suite):
    model, _, items = suite
    reqs = continuation_requests(items)
    with torch.no_grad():
        got = loglikelihoods(model, reqs, batch_size=5)  # batches mix lengths: padding is exercised
        want = torch.tensor([_plain(model, c, x) for c, x in reqs], dtype=torch.float64)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    sc = continuation_choice_scores(got, items)
    torch.testing.assert_close(sc, want.view(-1, 4) / 6)


def test_cloze_read_equals_plain_argmax(suite):
    model, batch, _ = suite
    bands = frequency_bands(batch.tokens[:, 1:].flatten().tolist(), 4)
    items = build_cloze_items(batch.tokens, bands, text="kjv", per_window=5, seed=0)
    with torch.no_grad():
        logits = model(batch.tokens)
        got = cloze_choice_logits(logits, items).argmax(-1)
        for k, it in enumerate(items):  # one window at a time, log-softmax, then the four
            lp = torch.log_softmax(
                model(batch.tokens[it.window : it.window + 1])[0, it.position].double(), -1
            )
            assert int(got[k]) == int(lp[list(it.choices)].argmax())


def test_scorer_equals_lm_eval_loglikelihood(suite):
    pytest.importorskip(
        "lm_eval", reason="lm-eval is not installed on this lane (pip install 'tl-directional[hf]')"
    )
    from tl_directional.evaluate.lm_eval_model import TLDirectionalLM

    _, _, items = suite
    lm = TLDirectionalLM(pretrained="default", batch_size=4)
    reqs = continuation_requests(items)
    res = lm._loglikelihood_tokens(
        [(("", ""), list(c), list(x)) for c, x in reqs], disable_tqdm=True
    )
    theirs = torch.tensor([r[0] for r in res], dtype=torch.float64)
    with torch.no_grad():
        ours = loglikelihoods(lambda ids: lm.model(ids).logits, reqs)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    with torch.no_grad():  # the TransformerLens model the runs use, on the same requests
        tl = loglikelihoods(suite[0], reqs)
    torch.testing.assert_close(tl, theirs, atol=1e-3, rtol=0)
    # the choice each item makes is the same
    assert torch.equal(
        continuation_choice_scores(ours, items).argmax(-1),
        continuation_choice_scores(theirs, items).argmax(-1),
    )
