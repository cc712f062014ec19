"""The accuracy suite's scorer (protocol sec. 9.4) against two independent ones on the bundled
default model: a plain per-request torch log-softmax written here, and the project's lm-eval
integration's loglikelihood path (``TLDirectionalLM``, i.e. lm-eval's ``HFLM``)."""

from __future__ import annotations

import pytest
import torch

from tl_directional.evaluate.suites.accuracy import (
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
    from tl_directional.evaluate.suites.lm_eval_model import TLDirectionalLM

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


def test_scored_rows_only_equal_the_full_forward(suite):
    """``loglikelihoods(model, ...)`` and ``cloze_choices`` unembed only the positions they read
    (``logits_at``); they equal the full forward's numbers, also under an edit's hooks."""
    import tl_directional as tld
    from tl_directional.evaluate.suites.accuracy import cloze_choices
    from tl_directional.model.handle import logits_at

    model, batch, items = suite
    reqs = continuation_requests(items)
    bands = frequency_bands(batch.tokens[:, 1:].flatten().tolist(), 4)
    cloze = build_cloze_items(batch.tokens, bands, text="kjv", per_window=5, seed=0)
    edit = tld.ValueScale(s_par=0.0, mode="exclusive")
    for ctx in (None, edit):
        with torch.no_grad(), (tld.apply_edits(model, ctx) if ctx else _nothing()):
            full = model(batch.tokens)
            b, p = torch.tensor([0, 3, 3, 1]), torch.tensor([0, 47, 5, 20])
            torch.testing.assert_close(logits_at(model, batch.tokens, b, p), full[b, p], atol=1e-5, rtol=0)
            got = cloze_choices(model, batch.tokens, cloze)
            torch.testing.assert_close(got, cloze_choice_logits(full, cloze), atol=1e-5, rtol=0)
            rows = loglikelihoods(model, reqs, batch_size=5)
            whole = loglikelihoods(lambda ids: model(ids), reqs, batch_size=5)
            torch.testing.assert_close(rows, whole, atol=1e-5, rtol=0)
    # the edit changes the numbers (the comparison above is not between two baselines)
    with torch.no_grad():
        with tld.apply_edits(model, edit):
            edited = loglikelihoods(model, reqs, batch_size=5)
        assert float((edited - loglikelihoods(model, reqs, batch_size=5)).abs().max()) > 1e-3


def test_cloze_choices_refuses_items_of_other_windows(suite):
    from tl_directional.evaluate.suites.accuracy import AccuracySuiteError, cloze_choices

    model, batch, _ = suite
    bands = frequency_bands(batch.tokens[:, 1:].flatten().tolist(), 4)
    cloze = build_cloze_items(batch.tokens, bands, text="kjv", per_window=2, seed=0)
    with pytest.raises(AccuracySuiteError, match="pass the items of this batch only"):
        cloze_choices(model, batch.tokens[:2], cloze)


def _nothing():
    import contextlib

    return contextlib.nullcontext()
