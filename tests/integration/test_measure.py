"""Streaming profile: agrees with the cache-based computation, excludes padding, saves."""

import math

import pandas as pd
import pytest
import torch

import tl_directional as tld

from ._families import ALL, CAUSAL

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "And God said, Let there be light: and there was light.",
]


@pytest.mark.parametrize("family", ALL)
def test_streaming_profile_equals_profile_from_cache(tiny_model, family):
    model = tiny_model(family)
    prof = tld.profile(model, TEXTS, batch_size=2, progress=False)
    batch = tld.prepare_inputs(model, TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    ref = tld.Profile.from_cache(model, cache, attention_mask=batch.attention_mask)
    for name in ("residual", "value"):
        a, b = getattr(prof, name), getattr(ref, name)
        num = a.select_dtypes("number").columns
        pd.testing.assert_frame_equal(a[num], b[num], check_exact=False, rtol=1e-5, atol=1e-6)
    assert prof.metadata["tokens_seen"] == batch.n_tokens - len(batch)  # first token left out by default


def test_profile_numbers_match_a_direct_computation(tiny_model):
    model = tiny_model("gpt2")
    batch = tld.prepare_inputs(model, TEXTS)
    prof = tld.profile(model, batch.tokens, attention_mask=batch.attention_mask, batch_size=3, progress=False,
                       exclude_first_token=False)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    mask = batch.attention_mask.bool()
    u = cache["blocks.1.hook_mlp_out"][mask].double()
    r = cache["blocks.1.hook_resid_mid"][mask].double()
    cos = ((u * r).sum(-1) / (u.norm(dim=-1) * r.norm(dim=-1))).abs()
    par = (u * r).sum(-1, keepdim=True) / (r * r).sum(-1, keepdim=True) * r
    energy = math.sqrt(float((par**2).sum() / ((u - par) ** 2).sum()))
    row = prof.residual.query("layer == 1 and component == 'mlp'").iloc[0]
    assert row["count"] == int(mask.sum())
    assert row["par_frac_mean"] == pytest.approx(float(cos.mean()), rel=1e-5)
    assert row["energy_ratio"] == pytest.approx(energy, rel=1e-5)
    assert row["par_frac_median"] == pytest.approx(float(cos.median()), abs=2e-3)
    # value space: beta = A_tt + gamma per token, so the means add up too
    v = prof.value
    assert torch.allclose(torch.tensor(v["beta_mean"].values), torch.tensor((v["A_tt_mean"] + v["gamma_mean"]).values), atol=1e-5)


@pytest.mark.parametrize("family", ALL)
def test_factorization_reconstructs_attention_alpha(tiny_model, family):
    prof = tld.profile(tiny_model(family), TEXTS, progress=False)
    errs = prof.value.groupby("layer")["factorization_error_max"].first()
    assert (errs < 1e-5).all(), errs
    attn_rows = prof.residual.query("component == 'attn'")
    assert (attn_rows["factorization_error_max"] < 1e-5).all()


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_is_excluded(tiny_model, side):
    model = tiny_model("gpt2")
    singles = [tld.prepare_inputs(model, [t]) for t in TEXTS]
    seqs = [s.tokens[0].tolist() for s in singles]
    from tl_directional.model.inputs import pad_sequences

    padded = pad_sequences(seqs, pad_id=0, padding_side=side)
    prof = tld.profile(model, padded.tokens, attention_mask=padded.attention_mask, batch_size=3, progress=False)
    one_by_one = tld.profile(model, padded.tokens, attention_mask=padded.attention_mask, batch_size=1, progress=False)
    assert prof.residual["count"].iloc[0] == sum(len(s) - 1 for s in seqs)  # first token left out by default
    cols = ["count", "par_frac_mean", "alpha_mean", "energy_ratio"]
    pd.testing.assert_frame_equal(prof.residual[cols], one_by_one.residual[cols], rtol=1e-4)
    vcols = ["count", "beta_mean", "A_tt_mean", "phi_mean"]
    pd.testing.assert_frame_equal(prof.value[vcols], one_by_one.value[vcols], rtol=1e-4)


def test_first_token_and_position_exclusion(tiny_model):
    model = tiny_model("llama")
    full = tld.profile(model, TEXTS, exclude_first_token=False, progress=False)
    no_bos = tld.profile(model, TEXTS, progress=False)  # the default leaves the first token out
    assert (full.residual["count"] - no_bos.residual["count"] == len(TEXTS)).all()
    only_3 = tld.profile(model, TEXTS, positions=[3], progress=False)
    assert (only_3.residual["count"] == len(TEXTS)).all()
    # at the first token o_0 = v_0: beta = 1 exactly there
    first = tld.profile(model, TEXTS, positions=[0], components=["value"], progress=False)
    assert first.value["beta_mean"].tolist() == pytest.approx([1.0] * len(first.value), abs=1e-5)
    assert first.value["A_tt_mean"].tolist() == pytest.approx([1.0] * len(first.value), abs=1e-6)


def test_components_subset_and_per_token_tables(tiny_model):
    model = tiny_model("neox")
    prof = tld.profile(model, TEXTS[:2], components=("attn", "value"), per_token=True, progress=False,
                       exclude_first_token=False)
    assert set(prof.residual["component"]) == {"attn"}
    n_tok = tld.prepare_inputs(model, TEXTS[:2]).n_tokens
    assert len(prof.tokens) == n_tok * model.cfg.n_layers
    assert len(prof.value_tokens) == n_tok * model.cfg.n_layers * model.cfg.n_heads
    assert prof.residual["factorization_error_max"].max() < 1e-5


def test_output_names_are_familiar_tl_names(tiny_model, lane):
    prof = tld.profile(tiny_model("gpt2"), TEXTS[:1], progress=False)
    names = set(prof.residual["update_hook"]) | set(prof.residual["reference_hook"])
    assert "blocks.0.hook_resid_pre" in names
    assert not any(".hook_in" in n or ".hook_out" in n for n in names)
    md = prof.metadata
    assert md["lane"] == lane and md["architecture"] == "sequential"
    assert md["weights_processed"] is False and md["transformer_lens_version"] != "unknown"


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_save_and_load_roundtrip(tiny_model, tmp_path, fmt):
    prof = tld.profile(tiny_model("gpt2"), TEXTS[:2], progress=False)
    out = prof.save(tmp_path / "prof", format=fmt)
    assert not list(out.glob(".*tmp"))  # no temp files left behind
    back = tld.Profile.load(out)
    pd.testing.assert_frame_equal(prof.residual, back.residual, check_dtype=False)
    pd.testing.assert_frame_equal(prof.value, back.value, check_dtype=False)
    assert back.metadata["tokens_seen"] == prof.metadata["tokens_seen"]
    with pytest.raises(ValueError, match="metadata.json"):
        tld.Profile.load(tmp_path)


@pytest.mark.parametrize("family", CAUSAL)
def test_bad_input_errors(tiny_model, family):
    model = tiny_model(family)
    with pytest.raises(ValueError, match="inputs is empty"):
        tld.profile(model, [], progress=False)
    with pytest.raises(ValueError, match=r"row\(s\) \[1\] have only padding"):
        tld.profile(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]), progress=False)
    with pytest.raises(ValueError, match="components has unknown entry 'residual'"):
        tld.profile(model, TEXTS, components=["residual"], progress=False)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tld.profile(model, TEXTS, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        tld.profile(model, torch.tensor([[1, 2, 3]]), attention_mask=torch.tensor([[1, 1]]), progress=False)
    with pytest.raises(TypeError, match="integer token ids"):
        tld.profile(model, torch.randn(2, 3), progress=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1e-12])
def test_profile_refuses_an_eps_that_is_not_finite_and_positive(tiny_model, bad):
    # issue 23 item 4: a NaN eps made every token degenerate and every phi_* silently 0
    with pytest.raises(ValueError, match=r"eps must be a finite float > 0.*got"):
        tld.profile(tiny_model(ALL[0]), TEXTS, eps=bad, progress=False)


def test_profile_tokens_seen_is_the_attribute_its_repr_shows(tiny_model):
    # issue 23 item 10: the repr showed tokens_seen but prof.tokens_seen raised AttributeError
    model = tiny_model(ALL[0])
    prof = tld.profile(model, TEXTS, exclude_first_token=False, progress=False)
    batch = tld.prepare_inputs(model, TEXTS)
    assert prof.tokens_seen == prof.metadata["tokens_seen"] == int(batch.attention_mask.sum())
    assert f"tokens_seen={prof.tokens_seen}" in repr(prof)


def test_profile_names_the_index_of_a_text_that_is_not_a_string(tiny_model):
    # issue 23 item 10: profile(model, ["ok", None]) did not say which item was wrong
    with pytest.raises(TypeError, match=r"inputs\[1\] is NoneType .*not a string"):
        tld.profile(tiny_model(ALL[0]), ["ok", None], progress=False)
