"""Issue 47: every analysis verb makes the same checks of its model and its mask before it runs
anything (tl_directional.model.sites.analysis_sites, tl_directional.model.inputs.
check_attention_mask_values): a model in training mode is refused (dropout would make two identical
calls differ), a mask entry other than 0 / 1 is refused (``.long()`` used to turn 0.5 into 0 and
keep 2 or -1, each a different, silently wrong result), and processed weights give a
``WeightProcessingWarning``. Each case failed on at least one verb before the change."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

import tl_directional as tld

CLEAN = torch.tensor([[1, 5, 9, 13, 17, 21], [2, 6, 10, 14, 18, 22]])
CORRUPT = torch.tensor([[1, 5, 9, 30, 17, 21], [2, 6, 10, 31, 18, 22]])


def _metric(logits):
    return logits[:, -1, 3] - logits[:, -1, 4]


PATCHES = ("directional_patch", "attribution_patch", "path_patch")


def _patch(verb, model, first, second, metric=_metric, **kw):
    """One patching verb on ``(clean, corrupted)`` tokens, or TransformerLens's shape
    ``(corrupted, clean_cache)``; ``metric`` is per pair (directional_patch gets its mean)."""
    if verb == "directional_patch":
        return tld.directional_patch(model, first, second, lambda lg: metric(lg).mean(),
                                     components=("attn",), layers=[0], **kw)
    if verb == "attribution_patch":
        return tld.attribution_patch(model, first, second, metric, **kw)
    return tld.path_patch(model, first, second, metric, sender=("head", 0, 0), receivers="q", **kw)


VERBS = {
    **{verb: (lambda m, verb=verb, **kw: _patch(verb, m, CLEAN, CORRUPT, **kw)) for verb in PATCHES},
    "split_logit_lens": lambda m, **kw: tld.split_logit_lens(m, CLEAN, targets=7, **kw),
    "split_logit_attribution": lambda m, **kw: tld.split_logit_attribution(m, CLEAN, 5, **kw),
    "profile": lambda m, **kw: tld.profile(m, CLEAN, progress=False, **kw),
    "sweep": lambda m, **kw: tld.sweep(m, CLEAN, tld.grid("value", s_par=[0.0]), progress=False, **kw),
    "find_safe_scale": lambda m, **kw: tld.find_safe_scale(m, CLEAN, "value", grid_points=2, refine_steps=0, **kw),
    # the model against itself: the checks run before any comparison (a clone would be refused first)
    "compression_geometry": lambda m, **kw: tld.compression_geometry(m, m, CLEAN, progress=False, **kw),
}
#: verbs without an ``attention_mask`` argument (they take token ids of one length, or a metric)
MASKED = [v for v in VERBS if v not in ("split_logit_attribution", "find_safe_scale")]


def _live_dropout(model, p=0.1):
    """``model`` in training mode with every dropout module at rate ``p`` (the tiny models are
    built with rate 0); None on the legacy lane, whose ``HookedTransformer`` has no dropout."""
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for m in drops:
        m.p = p
    return model.train() if drops else None


@pytest.mark.parametrize("verb", VERBS)
def test_training_mode_with_live_dropout_is_refused_by_every_verb(tiny_model, verb):
    model = _live_dropout(tiny_model("gpt2", fresh=True))
    if model is None:
        pytest.skip("HookedTransformer has no dropout: training mode cannot change its numbers")
    with pytest.raises(ValueError, match=rf"{verb}.*: model is in training mode with live dropout "
                                         r"\(\S*dropout, rate 0\.1, and \d+ more modules\).*call model\.eval\(\) first"):
        VERBS[verb](model)


def test_live_dropout_is_what_the_refusal_prevents(tiny_model):
    """The refusal is not ceremony: with dropout live, two identical forwards differ."""
    model = _live_dropout(tiny_model("gpt2", fresh=True), p=0.5)
    if model is None:
        pytest.skip("HookedTransformer has no dropout")
    torch.manual_seed(0)
    with torch.no_grad():
        assert not torch.equal(model(CLEAN), model(CLEAN))


@pytest.mark.parametrize("verb", ["split_logit_lens", "profile", "attribution_patch", "split_logit_attribution"])
def test_training_mode_without_a_random_module_changes_nothing_and_is_accepted(tiny_model, verb):
    """A ``HookedTransformer`` (no dropout at all; ``from_pretrained`` returns it in training mode)
    or a checkpoint with dropout 0 gives the same numbers in either mode: accepted, bit for bit."""
    model = tiny_model("gpt2", fresh=True)
    evaluated = VERBS[verb](model.eval())
    trained = VERBS[verb](model.train())
    if verb == "profile":
        evaluated, trained = evaluated.residual, trained.residual
    elif verb == "split_logit_lens":
        evaluated, trained = evaluated.full, trained.full
    elif verb == "attribution_patch":
        evaluated, trained = evaluated.to_frame(), trained.to_frame()
    if isinstance(evaluated, torch.Tensor):
        assert torch.equal(evaluated, trained)
    else:
        assert evaluated.equals(trained)


@pytest.mark.parametrize("verb", MASKED)
@pytest.mark.parametrize(
    ("entry", "needle"),
    [(0.5, r"dtype torch\.float32; it must be bool or integer"), (2, r"holds \[2\]"), (-1, r"holds \[-1\]")],
)
def test_mask_entries_other_than_0_or_1_are_refused(tiny_model, verb, entry, needle):
    model = tiny_model("gpt2")
    mask = torch.ones_like(CLEAN).to(torch.float32 if isinstance(entry, float) else torch.long)
    mask[0, 2] = entry
    with pytest.raises(ValueError, match=needle):
        VERBS[verb](model, attention_mask=mask)


@pytest.mark.parametrize("verb", VERBS)
def test_a_nan_weight_is_named_by_every_verb(tiny_model, verb):
    """Issue 47: a NaN weight gave NaN lens and DLA tables, an 'unedited model exceeds the budget'
    safe-scale result, and blamed the hook layout in profile; every verb now names the weight."""
    model = tiny_model("gpt2", fresh=True)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "mlp" in n and p.ndim == 2)[0, 0] = float("nan")
    with pytest.raises(ValueError, match=rf"{verb}.*: the model's weights hold NaN or inf: \S*mlp\S* \(1 entries\)"):
        VERBS[verb](model)


@pytest.mark.parametrize("verb", VERBS)
def test_processed_weights_warn_on_every_verb(tiny_model, lane, verb):
    model = tiny_model("gpt2", fresh=True)
    if lane == "bridge":
        model.enable_compatibility_mode(disable_warnings=True)
    else:  # fold_ln=False: the lens and DLA read ln_final.hook_scale, which folding removes
        model.process_weights_(fold_ln=False, center_writing_weights=True, center_unembed=True)
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        VERBS[verb](model)
    hits = [w for w in log if issubclass(w.category, tld.WeightProcessingWarning)]
    assert hits and "processed" in str(hits[0].message)
    # pointed at the user's line (here: the VERBS entry), not into the package, contextlib or torch
    assert hits[0].filename == __file__, (hits[0].filename, hits[0].lineno)


@pytest.mark.parametrize("verb", PATCHES)
def test_a_nan_metric_is_refused(tiny_model, verb):
    """A metric that is NaN (here on every run: log of a negative number) used to come back as NaN
    rows beside plausible ones; every patching verb now stops and says so."""
    with pytest.raises(ValueError, match=r"metric returned nan .*NaN or inf metric would sit in the result"):
        _patch(verb, tiny_model("gpt2"), CLEAN, CORRUPT, lambda lg: torch.log(-_metric(lg).abs() - 1))


@pytest.mark.parametrize("verb", PATCHES)
def test_a_nan_in_a_clean_cache_is_refused(tiny_model, verb):
    model = tiny_model("gpt2")
    _, cache = model.run_with_cache(CLEAN)
    cache = {k: v.clone() for k, v in cache.items()}
    for v in cache.values():
        if v.is_floating_point() and v.ndim >= 3:
            v[0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"clean_cache\['.*'\] holds \d+ NaN or inf entries"):
        _patch(verb, model, CORRUPT, cache)


def test_a_nan_weight_is_named_by_profile_and_sweep(tiny_model):
    """A NaN weight used to make ``profile`` blame the hook layout and dropout, and ``sweep``
    record an ``ok`` baseline row with an empty loss; both now name the weight."""
    from tl_directional.evaluate.sweeps import grid, sweep

    model = tiny_model("gpt2", fresh=True)
    with torch.no_grad():
        weight = next(p for n, p in model.named_parameters() if "mlp" in n and p.ndim == 2)
        weight[0, 0] = float("nan")
    with pytest.raises(tld.SiteResolutionError, match=r"weights hold NaN or inf: \S*mlp\S* \(1 entries\)"):
        tld.profile(model, CLEAN, progress=False)
    with pytest.raises(ValueError, match=r"weights hold NaN or inf: \S*mlp\S* \(1 entries\)"):
        sweep(model, CLEAN, grid("value", s_par=[0.0]), progress=False)


@pytest.mark.parametrize(("verb", "old", "new"), [
    ("split_logit_lens", "target_tokens", "targets"),
    ("split_logit_attribution", "wrong_tokens", "incorrect_tokens"),
])
def test_transformerlens_names_and_the_old_keyword_named(tiny_model, verb, old, new):
    """Issue 48: TransformerLens 4.3 says ``targets`` (``logit_lens``) and ``incorrect_tokens``
    (``direct_logit_attribution``); ours take those names, and the old keyword is one clear
    renamed-argument error (the project's convention), not a TypeError or a silent default."""
    model = tiny_model("gpt2")
    call = (lambda **kw: tld.split_logit_lens(model, CLEAN, **kw)) if verb == "split_logit_lens" else (
        lambda **kw: tld.split_logit_attribution(model, CLEAN, 5, **kw))
    call(**{new: 7})
    with pytest.raises(tld.TLDirectionalError, match=rf"{verb}\(\) has no argument '{old}'; it is called '{new}' now"):
        call(**{old: 7})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_weight_scan_in_every_dtype(tiny_model_dir, dtype):
    """Issue 51: a bfloat16 model's scan sums each weight in bfloat16 (a float32 copy of every
    weight cost more than a short forward at 1.5B parameters); NaN, +-inf and a finite weight
    whose sum overflows are each told right in every dtype."""
    from tl_directional.model.finite import nonfinite_parameters
    from tl_directional.model.load import load_model

    model = load_model(tiny_model_dir("llama"), dtype=dtype).eval()
    assert nonfinite_parameters(model) == []
    weight = next(p for n, p in model.named_parameters() if "mlp" in n and p.ndim == 2)
    big = torch.finfo(dtype).max
    with torch.no_grad():
        weight.fill_(big)  # finite, but its sum overflows: the exact count says 0, nothing reported
        assert nonfinite_parameters(model) == []
        weight[0, 0], weight[1, 1], weight[2, 2] = float("nan"), float("inf"), float("-inf")
    ((name, count),) = nonfinite_parameters(model)
    assert "mlp" in name and count == 3


def test_a_write_through_data_is_seen_by_the_next_scan(tiny_model_dir):
    """The weight scan runs at every call: a cache keyed on the parameters' version counters
    (tried for issue 51, about 4 % of a profile) misses a write through ``.data``, which pruning
    code uses, so a NaN written that way would pass silently."""
    from tl_directional.model import finite
    from tl_directional.model.load import load_model

    model = load_model(tiny_model_dir("llama")).eval()
    assert finite.nonfinite_parameters(model) == []
    weight = next(p for n, p in model.named_parameters() if "mlp" in n and p.ndim == 2)
    weight.data[0, 0] = float("nan")  # no version bump on the parameter
    ((name, count),) = finite.nonfinite_parameters(model)
    assert "mlp" in name and count == 1


def _embedding(model):
    """The token embedding matrix ``[d_vocab, d_model]`` of either lane."""
    vocab = int(model.cfg.d_vocab)
    return next(p for n, p in model.named_parameters()
                if p.ndim == 2 and p.shape[0] == vocab and ("embed" in n or "wte" in n) and "pos" not in n)


def test_profile_scans_the_weights_when_its_statistics_hold_a_nan(tiny_model):
    """Issue 51: ``profile`` scans the weights after its forwards, only when its statistics hold a
    NaN (the scan before every call cost about 0.03 of a profile of SmolLM2-135M). A NaN weight
    that reaches the stream is still named, with verification off and with a verification the
    model passed while it was clean (kept per model, so no forward of it runs again), including a
    write through ``.data``, which bumps no version counter."""
    model = tiny_model("gpt2", fresh=True)
    tld.profile(model, CLEAN, progress=False)  # verified (and kept) while every weight is finite
    weight = next(p for n, p in model.named_parameters() if "mlp" in n and p.ndim == 2)
    weight.data[0, 0] = float("nan")
    for verify in (False, True):
        with pytest.raises(tld.SiteResolutionError,
                           match=r"^profile: the model's weights hold NaN or inf: \S*mlp\S* \(1 entries\)"):
            tld.profile(model, CLEAN, progress=False, verify=verify)


def test_profile_of_a_nan_weight_no_counted_token_reaches_equals_the_clean_one(tiny_model):
    """A NaN in the embedding row of a token the inputs never use changes no activation that
    ``profile`` reads: the tables are exactly the clean model's, and no error is raised (the
    up-front scan refused such a model although every number it would give is right)."""
    model = tiny_model("gpt2", fresh=True)
    clean = tld.profile(model, CLEAN, progress=False, verify=False)
    unused = int(model.cfg.d_vocab) - 1
    assert unused not in CLEAN
    with torch.no_grad():
        _embedding(model)[unused, :3] = float("nan")
    damaged = tld.profile(model, CLEAN, progress=False, verify=False)
    pd.testing.assert_frame_equal(damaged.residual, clean.residual)
    pd.testing.assert_frame_equal(damaged.value, clean.value)
    # the same row read by a counted token: named
    with pytest.raises(tld.SiteResolutionError, match=r"^profile: the model's weights hold NaN or inf: \S+ \(3 entries\)"):
        tld.profile(model, torch.cat([CLEAN, torch.tensor([[unused] * 6])]), progress=False, verify=False)
