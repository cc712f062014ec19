"""The direction constructors (tl_directional.measure.directions) against hand computations.

unembedding_direction: the stream direction through the final norm reproduces the model's own
logit difference, ``logit[a] - logit[b] = (x . r) / ln_final.hook_scale + offset`` on the final
stream ``x``, within float32 round-off (LayerNorm GPT-2, RMSNorm Llama, Gemma-3's ``1 + w`` norm);
probe_direction: each accepted form gives the probe's rows; mean_difference_direction: equals
means of ``run_with_cache`` activations taken one prompt at a time (no padding), in float64.
Bad input gets one clear DirectionError each.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tl_directional as tld
from tl_directional.core.roundoff import roundoff_tolerance

TEXTS_A = ["The cat sat on the mat", "A dog ran in the park today", "Birds"]
TEXTS_B = ["Rain fell on the old town", "The sea"]


@pytest.mark.parametrize("family", ("gpt2", "llama", "gemma3"))
def test_unembedding_direction_reads_the_logit_difference(tiny_model, family):
    model = tiny_model(family)
    n = model.cfg.n_layers
    tokens = tld.prepare_inputs(model, TEXTS_A[:1]).tokens
    final, scale = f"blocks.{n - 1}.hook_resid_post", "ln_final.hook_scale"
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=[final, scale])
    a, b = 5, 17
    d = tld.unembedding_direction(model, a, b)
    assert (d.source, d.hook_name, d.layer, d.weights_processed) == ("unembedding", final, n - 1, False)
    x = cache[final][0].double()  # [pos, d_model]
    got = (x @ d.vectors.double()) / cache[scale][0, :, 0].double() + d.details["offset"]
    want = (logits[0, :, a] - logits[0, :, b]).double()
    tol = roundoff_tolerance(torch.float32, float(logits.abs().max()), model.cfg.d_model * 4)
    assert float((got - want).abs().max()) <= tol, family
    raw = tld.unembedding_direction(model, a, b, through_final_norm=False)
    assert torch.equal(raw.vectors, model.W_U[:, a].float() - model.W_U[:, b].float())
    assert raw.hook_name is None and raw.details["through_final_norm"] is False
    single = tld.unembedding_direction(model, a)
    got1 = (x @ single.vectors.double()) / cache[scale][0, :, 0].double() + single.details["offset"]
    assert float((got1 - logits[0, :, a].double()).abs().max()) <= tol


def test_unembedding_direction_tokens_and_errors(tiny_model):
    model = tiny_model("gpt2")
    word = next(t for t in (" the", " cat", "the") if len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) == 1)
    tid = model.tokenizer(word, add_special_tokens=False)["input_ids"][0]
    assert torch.equal(tld.unembedding_direction(model, word, 3).vectors, tld.unembedding_direction(model, tid, 3).vectors)
    with pytest.raises(tld.DirectionError, match="outside the vocabulary"):
        tld.unembedding_direction(model, model.cfg.d_vocab + 3)
    with pytest.raises(tld.DirectionError, match="not one"):
        tld.unembedding_direction(model, "the cat sat on")
    with pytest.raises(tld.DirectionError, match="same token"):
        tld.unembedding_direction(model, tid, word)


class _Classifier:
    """A scikit-learn style fitted binary classifier (``coef_`` ``[1, d]``, ``intercept_`` ``[1]``)."""

    def __init__(self, coef, intercept):
        self.coef_, self.intercept_ = coef, intercept


def test_probe_direction_from_every_form(tiny_model):
    model = tiny_model("gpt2")
    d = model.cfg.d_model
    w = torch.randn(d, generator=torch.Generator().manual_seed(0))
    hook = "blocks.1.hook_resid_post"
    linear = torch.nn.Linear(d, 1)
    with torch.no_grad():
        linear.weight.copy_(w[None])
    forms = [w, w.numpy(), w[None], linear, _Classifier(w.double().numpy()[None], np.array([0.5]))]
    for form in forms:
        p = tld.probe_direction(form, hook_name=hook, model=model)
        assert p.vectors.shape == (d,) and torch.equal(p.vectors.double(), w.double()), type(form)
        assert (p.source, p.space, p.layer, p.hook_name, p.weights_processed) == ("probe", "resid", 1, hook, False)
    assert tld.probe_direction(forms[-1], hook_name=hook).details["intercept"].tolist() == [0.5]
    rows = torch.nn.Linear(d, 3)
    sub = tld.probe_direction(rows, hook_name=hook, layer=4)
    assert sub.vectors.shape == (3, d) and torch.equal(sub.vectors, rows.weight.detach()) and sub.layer == 4
    assert sub.weights_processed is None  # no model given: unknown
    value = tld.probe_direction(torch.randn(model.cfg.d_head), hook_name="blocks.0.attn.hook_z", model=model)
    assert value.space == "value"


def test_probe_direction_errors(tiny_model):
    model = tiny_model("gpt2")
    d = model.cfg.d_model
    hook = "blocks.0.hook_resid_pre"
    cases = [
        (dict(weights=torch.full((d,), float("nan")), hook_name=hook), "NaN"),
        (dict(weights=torch.zeros(2, d), hook_name=hook), "zero direction"),
        (dict(weights=torch.ones(2, 3, d), hook_name=hook), "must be \\[d\\] or \\[k, d\\]"),
        (dict(weights=torch.ones(d + 1), hook_name=hook, model=model), "width 33 but the model's d_model is 32"),
        (dict(weights=[1.0, 2.0], hook_name=hook), "numpy array, a torch.nn.Linear"),
        (dict(weights=torch.ones(d), hook_name=""), "hook_name must name"),
    ]
    for kwargs, match in cases:
        with pytest.raises(tld.DirectionError, match=match):
            tld.probe_direction(kwargs.pop("weights"), **kwargs)


def _one_by_one(model, texts, hook, pick):
    """Each text alone (no padding) through run_with_cache, ``pick(act[pos, d]) -> [d]``, float64 mean."""
    vecs = []
    for t in texts:
        tokens = tld.prepare_inputs(model, [t]).tokens
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=[hook])
        vecs.append(pick(cache[hook][0].double()))
    return torch.stack(vecs).mean(0)


@pytest.mark.parametrize("family", ("gpt2", "llama"))
def test_mean_difference_equals_a_hand_computation(tiny_model, family):
    model = tiny_model(family)
    hook = "blocks.1.hook_resid_pre"
    picks = {-1: lambda act: act[-1], "mean": lambda act: act[1:].mean(0) if len(act) > 1 else act[0],
             1: lambda act: act[1]}
    texts_a = TEXTS_A if family == "gpt2" else TEXTS_A[:2]  # position 1 needs two tokens everywhere
    for position, pick in picks.items():
        if position == 1:
            texts_a = [t for t in texts_a if len(tld.prepare_inputs(model, [t]).tokens[0]) > 1]
        d = tld.mean_difference_direction(model, texts_a, TEXTS_B, hook_name=hook, position=position, batch_size=2)
        mean_a, mean_b = _one_by_one(model, texts_a, hook, pick), _one_by_one(model, TEXTS_B, hook, pick)
        assert torch.allclose(d.vectors.double(), mean_a - mean_b, atol=1e-5, rtol=1e-5), position
        assert (d.source, d.hook_name, d.layer, d.weights_processed) == ("mean_difference", hook, 1, False)
        assert (d.details["n_a"], d.details["n_b"]) == (len(texts_a), len(TEXTS_B))
        assert d.details["norm_a"] == pytest.approx(float(mean_a.norm()), rel=1e-5)
        assert d.details["norm_b"] == pytest.approx(float(mean_b.norm()), rel=1e-5)
        assert d.details["norm"] == pytest.approx(float((mean_a - mean_b).norm()), rel=1e-5)
    # a mean difference is a steering vector read at its own site
    edit = tld.ActivationAddition(d, 2.0)
    assert (edit.hook, edit.layers) == ("resid_pre", [1])


def test_mean_difference_errors(tiny_model):
    model = tiny_model("gpt2")
    hook = "blocks.0.hook_resid_post"
    cases = [
        (([], TEXTS_B), dict(hook_name=hook), "prompts_a is empty"),
        ((TEXTS_A, ["  "]), dict(hook_name=hook), "prompts_b has an empty string"),
        ((TEXTS_A, TEXTS_B), dict(hook_name="blocks.0.hook_nothing"), "not a hook point"),
        ((TEXTS_A, TEXTS_B), dict(hook_name="blocks.0.attn.hook_z"), "\\[batch, pos, d_model\\]"),
        ((TEXTS_A, TEXTS_B), dict(hook_name=hook, position=40), "not a real token of prompts_a"),
        ((TEXTS_A, TEXTS_B), dict(hook_name=hook, position="last"), "int or 'mean'"),
        ((TEXTS_A, list(TEXTS_A)), dict(hook_name=hook), "same mean"),
    ]
    for (a, b), kwargs, match in cases:
        with pytest.raises(tld.DirectionError, match=match):
            tld.mean_difference_direction(model, a, b, **kwargs)


def test_processed_weights_are_recorded_and_a_mismatch_refused(tiny_model, lane):
    """TransformerLens issue #642: a direction read from a model with processed weights (centred
    writing weights, folded LayerNorm) is refused by an unprocessed model's steering edit, and the
    reverse; the logit-difference identity holds on the processed model too."""
    plain = tiny_model("gpt2")
    processed = tiny_model("gpt2", fresh=True)
    if lane == "bridge":
        processed.enable_compatibility_mode(disable_warnings=True)
    else:
        processed.process_weights_(fold_ln=True, center_writing_weights=True, center_unembed=True)
    hook = "blocks.1.hook_resid_pre"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tld.WeightProcessingWarning)
        from_processed = tld.mean_difference_direction(processed, TEXTS_A, TEXTS_B, hook_name=hook)
        logit_dir = tld.unembedding_direction(processed, 5, 17)
        tokens = tld.prepare_inputs(processed, TEXTS_A[:1]).tokens
        final = f"blocks.{processed.cfg.n_layers - 1}.hook_resid_post"
        with torch.no_grad():
            logits, cache = processed.run_with_cache(tokens, names_filter=[final])
        tld.edit_hooks(processed, tld.ActivationAddition(from_processed, 1.0))  # matching: accepted
        with pytest.raises(tld.DirectionError, match="unprocessed weights .* this model's weights are processed"):
            tld.edit_hooks(processed, tld.ActivationAddition(
                tld.mean_difference_direction(plain, TEXTS_A, TEXTS_B, hook_name=hook), 1.0))
    assert from_processed.weights_processed is True and logit_dir.weights_processed is True
    # the LayerNorm scale by hand (TL 2's process_weights_ swaps ln_final without re-registering
    # its hook points, so ln_final.hook_scale is not cached there)
    x = cache[final][0].double()
    scale = ((x - x.mean(-1, keepdim=True)).square().mean(-1) + processed.cfg.eps).sqrt()
    got = (x @ logit_dir.vectors.double()) / scale
    want = (logits[0, :, 5] - logits[0, :, 17]).double()
    tol = roundoff_tolerance(torch.float32, float(logits.abs().max()), processed.cfg.d_model * 4)
    assert float((got + logit_dir.details["offset"] - want).abs().max()) <= tol
    with pytest.raises(tld.DirectionError, match="processed weights .* this model's weights are unprocessed"):
        tld.edit_hooks(plain, tld.ActivationAddition(from_processed, 1.0))
    tld.edit_hooks(plain, tld.ActivationAddition(from_processed.vectors, 1.0, layers=[1]))  # the documented way round
