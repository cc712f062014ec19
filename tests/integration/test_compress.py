"""Compressors (tl_directional.compression.compressors) and compression error geometry (METHOD.md sec. 6).

Runs on whichever TransformerLens lane is installed, on the tiny seeded models of conftest.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.integration._families import CAUSAL
from tl_directional.compression import (
    CompatibilityError,
    compress_check,
    compression_geometry,
    summarize,
)
from tl_directional.compression.accumulate import _token_stats
from tl_directional.compression.compressors import (
    compress,
    drop_layers,
    identity,
    linear_weights,
    low_rank,
    prune_magnitude,
    prune_wanda,
    quantize_awq,
    quantize_rtn,
)
from tl_directional.compression.methods import low_rank_matrix, magnitude_mask, nm_mask, rtn_matrix
from tl_directional.compression.save import save_compressed
from tl_directional.compression.specs import parse_spec
from tl_directional.model.handle import clone_model
from tl_directional.model.inputs import TokenBatch
from tl_directional.model.lanes.bridge import hf_module
from tl_directional.model.sites import lane_of, resolve_sites
from tl_directional.model.weights import linear_input_hooks


@pytest.fixture(autouse=True)
def _no_grad():
    """Gradients off inside this module's tests only (a module-level
    torch.set_grad_enabled(False) would leak into every later test file)."""
    with torch.no_grad():
        yield


def _tokens(n=4, length=12, seed=0, vocab=400):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (n, length), generator=g)


@pytest.fixture(scope="module")
def gpt2(tiny_model):
    return tiny_model("gpt2")


@pytest.fixture(scope="module")
def toks():
    return _tokens()


@pytest.fixture(scope="module")
def ident(gpt2):
    return identity(gpt2)


@pytest.fixture(scope="module")
def rtn3(gpt2):
    """Shared 3-bit per-channel model (compressing clones the model, which costs a boot)."""
    return quantize_rtn(gpt2, 3)


# ------------------------------------------------------------------------------------------
# matrix-level methods
# ------------------------------------------------------------------------------------------


def test_rtn_levels_and_error_order():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    errs = {}
    for bits in (8, 4, 3):
        for sym in (True, False):
            for g in (None, 32):
                q = rtn_matrix(w, bits, g, sym)
                groups = q.reshape(16, -1, g or 64)
                n_levels = max(len(torch.unique(row)) for row in groups.reshape(-1, g or 64))
                assert n_levels <= 2**bits
                errs[(bits, sym, g)] = float((q - w).norm())
    for sym in (True, False):
        for g in (None, 32):
            assert errs[(8, sym, g)] < errs[(4, sym, g)] < errs[(3, sym, g)]
    # smaller groups never hurt much and usually help
    assert errs[(4, True, 32)] <= errs[(4, True, None)] * 1.05
    # a partial last group keeps the shape and the per-group level count
    q = rtn_matrix(w[:, :40], 3, 32, True)
    assert q.shape == (16, 40) and len(torch.unique(q[0, 32:])) <= 8


def test_rtn_asymmetric_represents_offset_weights_better():
    w = torch.rand(8, 64, generator=torch.Generator().manual_seed(1)) + 2.0  # all positive
    assert (rtn_matrix(w, 3, None, False) - w).norm() < (rtn_matrix(w, 3, None, True) - w).norm()


def test_pruning_masks_exact():
    s = torch.rand(8, 16, generator=torch.Generator().manual_seed(0))
    m = magnitude_mask(s, 0.25, per_row=True)
    assert (m.sum(1) == 12).all()
    kept_min = torch.where(m, s, torch.inf).min(1).values
    dropped_max = torch.where(~m, s, -torch.inf).max(1).values
    assert (kept_min >= dropped_max).all()  # kept beat dropped in each row
    m = magnitude_mask(s, 0.5, per_row=False)
    assert int(m.sum()) == 64
    m = nm_mask(s, 2, 4)
    assert (m.reshape(8, 4, 4).sum(-1) == 2).all()
    with pytest.raises(ValueError, match="multiple of M"):
        nm_mask(torch.rand(4, 10), 2, 4)


def test_low_rank_matrix_rank():
    w = torch.randn(24, 16, generator=torch.Generator().manual_seed(0))
    approx, k = low_rank_matrix(w, 0.25)
    assert k == 4 and int(torch.linalg.matrix_rank(approx.double(), atol=1e-4)) == 4
    full, k = low_rank_matrix(w, 1.0)
    torch.testing.assert_close(full, w, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# the [out, in] adapter and the calibration hooks
# ------------------------------------------------------------------------------------------

# Output hook of each linear, per lane (what the weight must reproduce from its input).
_OUT_HOOKS = {
    "bridge": {"attn.q": "attn.q.hook_out", "attn.o": "attn.o.hook_out", "mlp.in": "mlp.in.hook_out",
               "mlp.out": "mlp.out.hook_out"},
    "legacy": {"attn.q": "attn.hook_q", "attn.o": "hook_attn_out", "mlp.in": "mlp.hook_pre",
               "mlp.out": "hook_mlp_out"},
}


def _bias(model, lane, key):
    if lane == "bridge":
        unit, name = key.split(".")
        return hf_module(getattr(getattr(model.blocks[0], unit), name)).bias
    blk = model.blocks[0]
    b = {"attn.q": blk.attn.b_Q, "attn.o": blk.attn.b_O, "mlp.in": blk.mlp.b_in, "mlp.out": blk.mlp.b_out}[key]
    return b.reshape(-1)


@pytest.mark.parametrize("family", CAUSAL)
def test_adapter_orientation_reproduces_each_linear(tiny_model, lane, family):
    """input (from linear_input_hooks) @ W[out, in]^T + b == the linear's output, per key."""
    model = tiny_model(family)
    ins = linear_input_hooks(model, 0)
    weights = {lw.key: lw for lw in linear_weights(model, layers=0)}
    keys = [k for k in ("attn.q", "attn.o", "mlp.in", "mlp.out") if k in weights]
    out_hooks = dict(_OUT_HOOKS[lane])
    if lane == "legacy" and "mlp.gate" in weights:
        out_hooks["mlp.in"] = "mlp.hook_pre_linear"  # gated: hook_pre is the gate's output
    got = {}

    def keep(name):
        def hook(t, hook):  # noqa: ARG001
            got[name] = t.detach().clone()
        return hook

    hooks = [(ins[k].hook, keep("in." + k)) for k in keys]
    hooks += [(f"blocks.0.{out_hooks[k]}", keep("out." + k)) for k in keys]
    model.run_with_hooks(_tokens(2, 7), return_type=None, fwd_hooks=hooks)
    for k in keys:
        x = got["in." + k]
        x = x.reshape(*x.shape[:2], -1) if x.ndim == 4 else x
        if ins[k].scale is not None:
            x = x * ins[k].scale
        y = got["out." + k]
        y = y.reshape(*y.shape[:2], -1) if y.ndim == 4 else y
        b = _bias(model, lane, k)
        pred = x @ weights[k].get().T + (0 if b is None else b)
        torch.testing.assert_close(pred, y, atol=1e-4, rtol=1e-4, msg=f"{family} {k}")
    assert {lw.shape for lw in weights.values() if lw.key == "attn.k"}  # GQA k rows differ in llama


def test_clone_is_independent_and_identical(tiny_model, lane):
    model = tiny_model("gpt2")
    toks = _tokens(2, 9)
    base = model(toks)
    model(toks.clone())  # a forward with grad off; clones must work after forwards too
    clone = clone_model(model)
    assert torch.equal(clone(toks), base)
    for lw in linear_weights(clone, keys=["mlp.out"]):
        lw.set(torch.zeros(lw.shape))
    assert not torch.equal(clone(toks), base)
    assert torch.equal(model(toks), base)  # the dense model never changes


@pytest.mark.bridge  # post-LN models are supported on the bridge only
def test_clone_bert_hooks_fire_on_the_copy(tiny_model):
    model = tiny_model("bert")
    clone = clone_model(model)
    fired = []
    clone.run_with_hooks(_tokens(1, 6), return_type=None,
                         fwd_hooks=[("blocks.0.mlp.hook_out", lambda t, hook: fired.append(1))])
    assert fired, "a deep-copied bridge fires the original's hook points; clone_model must not"


def test_compressors_record_and_scope(gpt2, toks):  # one clone per compressor: ~5 boots
    r = quantize_rtn(gpt2, 4, group_size=16, symmetric=False, layers=[1], units=["mlp"])
    assert r.record.method == "rtn" and r.record.layers == [1]
    assert r.record.weights == ["blocks.1.mlp.in", "blocks.1.mlp.out"]
    assert r.record.label == "rtn w4 g16 asym"
    untouched = {lw.name: lw.get() for lw in linear_weights(gpt2)}
    for lw in linear_weights(r.model):
        changed = not torch.equal(lw.get(), untouched[lw.name])
        assert changed == (lw.name in r.record.weights)
    p = prune_magnitude(gpt2, 0.5)
    assert abs(p.record.stats["zero_fraction"] - 0.5) < 1e-3
    w = prune_wanda(gpt2, toks, n_m=(2, 4))
    assert w.record.label == "wanda 2:4"
    for lw in linear_weights(w.model):
        assert ((lw.get() != 0).reshape(lw.shape[0], -1, 4).sum(-1) <= 2).all()
    s = low_rank(gpt2, 0.5)
    for lw in linear_weights(s.model):
        assert int(torch.linalg.matrix_rank(lw.get().double(), atol=1e-4)) == min(lw.shape) // 2
    a = quantize_awq(gpt2, toks, 3, group_size=16)
    assert 0.0 <= a.record.stats["alpha_mean"] <= 1.0


def test_wanda_uses_input_norms(gpt2, toks):
    """Wanda's keep-mask is the per-row top half of |W| * rms(x_j); it differs from magnitude
    pruning exactly because the input norms reorder |W| within rows."""
    from tl_directional.compression.compressors import collect_input_stats

    stats = collect_input_stats(gpt2, toks, layers=[0])
    (lw,) = linear_weights(gpt2, layers=0, keys=["attn.o"])
    w = lw.get()
    rms = stats.rms["blocks.0.attn.o"]
    assert rms.shape == (w.shape[1],) and (rms > 0).all()
    kept_w = magnitude_mask(w.abs() * rms, 0.5, per_row=True)
    kept_m = magnitude_mask(w.abs(), 0.5, per_row=True)
    assert (kept_w.sum(1) == kept_m.sum(1)).all() and not torch.equal(kept_w, kept_m)
    # the same statistic, computed by hand from the input hook of W_O (heads flattened)
    got = {}
    hook = linear_input_hooks(gpt2, 0)["attn.o"].hook
    gpt2.run_with_hooks(toks, return_type=None,
                        fwd_hooks=[(hook, lambda t, hook: got.setdefault("x", t.detach().clone()))])
    x = got["x"].reshape(-1, w.shape[1])
    torch.testing.assert_close(rms, x.pow(2).mean(0).sqrt(), rtol=1e-5, atol=1e-6)


def test_bad_settings_raise(gpt2, toks):
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match="sparsity"):
            prune_magnitude(gpt2, bad)
    with pytest.raises(ValueError, match="sparsity"):
        prune_wanda(gpt2, toks, 1.0)
    for bits in (1, 16, 4.0, True):
        with pytest.raises(ValueError, match="bits"):
            quantize_rtn(gpt2, bits)
    with pytest.raises(ValueError, match="group_size"):
        quantize_rtn(gpt2, 4, group_size=0)
    with pytest.raises(ValueError, match="n_m"):
        prune_wanda(gpt2, toks, n_m=(4, 2))
    with pytest.raises(ValueError, match="rank_fraction"):
        low_rank(gpt2, 0.0)
    with pytest.raises(ValueError, match="unknown compression method"):
        parse_spec("gptq:bits=4")
    with pytest.raises(ValueError, match="calibration"):
        compress(gpt2, "wanda:sparsity=0.5")


def test_spec_strings():
    assert parse_spec("rtn:bits=4,group=128,sym=0") == ("rtn", {"bits": 4, "group_size": 128, "symmetric": False})
    assert parse_spec("wanda:nm=2:4") == ("wanda", {"n_m": (2, 4)})
    assert parse_spec("magnitude:sparsity=50%") == ("magnitude", {"sparsity": 0.5})
    assert parse_spec("svd:rank=0.25") == ("low_rank", {"rank_fraction": 0.25})
    assert parse_spec("drop:layers=0+1") == ("drop", {"layers": [0, 1]})


# ------------------------------------------------------------------------------------------
# geometry
# ------------------------------------------------------------------------------------------


def _updates(model, toks, sites, L):
    got = {}
    names = set()
    for c in sites.components:
        u = sites.units[c][L]
        names |= {u.update_hook, u.reference_hook}

    def keep(n):
        def hook(t, hook):  # noqa: ARG001
            got[n] = t.detach().clone()
        return hook

    model.run_with_hooks(toks, return_type=None, fwd_hooks=[(n, keep(n)) for n in sorted(names)])
    out = {}
    for c in sites.components:
        u = sites.units[c][L]
        out[c] = (got[u.update_hook] - got[u.reference_hook]) if u.update_is_difference else got[u.update_hook]
        out[c + ".ref"] = got[u.reference_hook]
    return out


@pytest.mark.parametrize("family", ["gpt2", "neox"])
def test_local_one_pass_equals_one_layer_at_a_time(tiny_model, family):
    """One compressed forward with every layer's input replaced == a hybrid model per layer
    (dense weights except the unit under test), for attn, mlp and block."""
    dense = tiny_model(family)
    toks = _tokens(3, 10, seed=3)
    comp = quantize_rtn(dense, 3)
    df = compression_geometry(dense, comp, toks)
    sites = resolve_sites(dense, warn=False)
    hybrid = clone_model(dense)
    dense_w = {lw.name: lw.get() for lw in linear_weights(dense)}
    comp_w = {lw.name: lw.get() for lw in linear_weights(comp.model)}
    for L in range(sites.n_layers):
        ref = _updates(dense, toks, sites, L)
        for unit in sites.components:
            units = ("attn", "mlp") if unit == "block" else (unit,)
            for lw in linear_weights(hybrid):
                lw.set(comp_w[lw.name] if (lw.layer == L and lw.unit in units) else dense_w[lw.name])
            up = _updates(hybrid, toks, sites, L)[unit]
            u = ref[unit]
            stats = _token_stats(u.reshape(-1, u.shape[-1]), up.reshape(-1, u.shape[-1]),
                                 ref[unit + ".ref"].reshape(-1, u.shape[-1]), 1e-12).double().sum(0)
            want = summarize(stats, "local")
            row = df[(df.layer == L) & (df.unit == unit)].iloc[0]
            for k in ("err_perp_energy", "err_par_energy", "alpha_err", "cos_sim", "err_perp_over_update",
                      "err_perp_energy_vs_resid"):
                assert math.isclose(row[k], want[k], rel_tol=1e-4, abs_tol=1e-6), (family, L, unit, k)


@pytest.mark.parametrize("mode", ["local", "global"])
def test_identical_model_gives_exact_zero(gpt2, toks, mode, ident):
    df = compression_geometry(gpt2, ident, toks, mode=mode)
    assert not df.isna().any().any()
    for c in ("err_par_over_update", "err_perp_over_update", "err_perp_share", "alpha_err", "rel_mse",
              "err_perp_energy", "err_par_energy", "err_perp_energy_vs_resid", "rel_mse_energy"):
        assert (df[c] == 0).all(), c
    assert (df.zero_error_tokens == df.tokens).all()
    # the same object as both models is allowed too
    df2 = compression_geometry(gpt2, gpt2, toks, mode=mode, components="attn")
    assert (df2.err_perp_energy == 0).all()


def test_units_is_refused_with_the_new_name(gpt2, toks):
    from tl_directional.core.errors import RenamedArgumentError

    with pytest.raises(RenamedArgumentError, match=r"compression_geometry\(\) has no argument 'units'.*components="):
        compression_geometry(gpt2, gpt2, toks, units=("attn", "attn"))
    new = compression_geometry(gpt2, gpt2, toks, components="attn")
    assert list(new.unit.unique()) == ["attn"]
    with pytest.raises(ValueError, match="components has unknown entry 'value'"):
        compression_geometry(gpt2, gpt2, toks, components="value")


def test_quantization_8_bits_beats_3_bits(gpt2, toks, rtn3):
    df = compression_geometry(gpt2, {"w8": quantize_rtn(gpt2, 8), "w3": rtn3}, toks)
    w8 = df[df.compressed == "w8"].set_index(["unit", "layer"])
    w3 = df[df.compressed == "w3"].set_index(["unit", "layer"])
    for c in ("err_perp_energy", "err_par_energy", "rel_mse_energy", "err_perp_over_update"):
        assert (w8[c] < w3[c]).all(), c
    assert (w8.cos_sim > w3.cos_sim).all()


@pytest.mark.parametrize("method", ["magnitude", "wanda"])
def test_higher_sparsity_gives_larger_perpendicular_error(gpt2, toks, method):
    levels = (0.2, 0.5, 0.8)
    models = {}
    for s in levels:
        models[s] = (prune_magnitude(gpt2, s) if method == "magnitude" else prune_wanda(gpt2, toks, s))
    df = compression_geometry(gpt2, {str(s): m for s, m in models.items()}, toks)
    for unit in ("attn", "mlp", "block"):
        per = [df[(df.compressed == str(s)) & (df.unit == unit)].err_perp_energy.mean() for s in levels]
        assert per[0] < per[1] < per[2], (unit, per)
        first = df[(df.unit == unit) & (df.layer == 0)].set_index("compressed").err_perp_energy
        assert first["0.2"] < first["0.5"] < first["0.8"]


def test_layer_drop_is_purely_parallel(gpt2, toks):
    df = compression_geometry(gpt2, drop_layers(gpt2, [1]), toks)
    dropped = df[df.layer == 1]
    assert dropped.by_construction_parallel.all()
    assert (dropped.err_perp_energy == 0).all() and (dropped.err_par_energy == 1).all()
    assert (dropped.alpha_err == -1).all() and (dropped.cos_sim == 0).all()
    kept = df[df.layer == 0]
    assert not kept.by_construction_parallel.any() and (kept.err_perp_energy == 0).all()


def test_global_mode_layer0_attention_matches_local(gpt2, toks, rtn3):
    comp = rtn3
    loc = compression_geometry(gpt2, comp, toks, mode="local")
    glo = compression_geometry(gpt2, comp, toks, mode="global")
    a, b = (x[(x.unit == "attn") & (x.layer == 0)].iloc[0] for x in (loc, glo))
    assert math.isclose(a.err_perp_energy, b.err_perp_energy, rel_tol=1e-6)
    assert {"stream_err_energy", "stream_err_perp_energy", "stream_cos_sim"} <= set(glo.columns)
    assert "stream_err_energy" not in loc.columns
    # later layers see compounded error end to end
    assert glo[glo.unit == "block"].err_perp_energy.iloc[-1] >= loc[loc.unit == "block"].err_perp_energy.iloc[-1]


def test_padding_excluded_and_per_sequence_sums(gpt2, rtn3):
    comp = rtn3
    a, b = _tokens(1, 10, seed=5)[0], _tokens(1, 6, seed=6)[0]
    tokens = torch.zeros(2, 10, dtype=torch.long)
    mask = torch.zeros(2, 10, dtype=torch.long)
    tokens[0], mask[0] = a, 1
    tokens[1, :6], mask[1, :6] = b, 1
    padded = compression_geometry(gpt2, comp, TokenBatch(tokens, mask), per_sequence=True)
    assert (padded.tokens == 16).all()
    sep = [compression_geometry(gpt2, comp, x.unsqueeze(0), per_sequence=True) for x in (a, b)]
    per = padded.attrs["per_sequence"]["rtn w3 per-ch sym"]
    for i, s in enumerate(sep):
        torch.testing.assert_close(per[i], s.attrs["per_sequence"]["rtn w3 per-ch sym"][0], rtol=1e-4, atol=1e-6)
    assert torch.allclose(per.sum(0)[:, 0], torch.tensor(padded.tokens.values, dtype=torch.float64))


def test_incompatible_models_raise(tiny_model, gpt2, toks, tiny_model_dir, tmp_path):
    with pytest.raises(CompatibilityError, match="architectures differ"):
        compression_geometry(gpt2, tiny_model("llama"), toks)
    from tl_directional.model.load import build_tiny_hf_model, load_model

    other = load_model(build_tiny_hf_model("gpt2", tmp_path / "v", seed=0, vocab_size=300))
    with pytest.raises(CompatibilityError, match="vocabularies differ"):
        compression_geometry(gpt2, other, toks)
    with pytest.raises(ValueError, match="mode"):
        compression_geometry(gpt2, gpt2, toks, mode="both")


def test_mismatched_tokenizers_raise(gpt2, toks, tiny_model_dir, tmp_path):
    import shutil

    from tl_directional.io.corpus import heldout_text
    from tl_directional.model.load import load_model, train_tokenizer

    # the same weights shipped with another tokenizer of the same size (trained on other text)
    d = tmp_path / "other-tok"
    shutil.copytree(tiny_model_dir("gpt2"), d)
    for f in d.glob("*token*"):
        f.unlink()
    train_tokenizer(heldout_text()[-40000:], vocab_size=len(gpt2.tokenizer)).save_pretrained(d)
    other = load_model(d)
    assert other.tokenizer.get_vocab() != gpt2.tokenizer.get_vocab()
    with pytest.raises(CompatibilityError, match="tokenizers differ"):
        compression_geometry(gpt2, other, toks)


# ------------------------------------------------------------------------------------------
# the gate
# ------------------------------------------------------------------------------------------


def test_compress_check_python(gpt2, toks, tmp_path, rtn3):
    comp = rtn3
    geo = compression_geometry(gpt2, comp, toks)
    worst = geo[geo.unit == "block"].err_perp_energy.max()
    ok = compress_check(gpt2, comp, toks, max_perp_error=worst * 1.01, geometry=geo)
    bad = compress_check(gpt2, comp, toks, max_perp_error=worst * 0.99, geometry=geo)
    assert ok.passed and ok.exit_code == 0 and not bad.passed and bad.exit_code == 1
    assert "FAIL" in bad.summary() and len(bad.summary().splitlines()) < 25
    page = bad.write_report(tmp_path / "rep")
    assert page.read_text().count("<svg") == 1 and (tmp_path / "rep" / "geometry.csv").is_file()
    drop = drop_layers(gpt2, [0])
    dropped = compress_check(gpt2, drop, toks, max_perp_error=10.0)
    assert not dropped.passed and "exactly zero" in dropped.reasons[0]
    assert compress_check(gpt2, drop, toks, max_perp_error=10.0, fail_on_removed_update=False).passed
    with pytest.raises(ValueError, match="max_perp_error"):
        compress_check(gpt2, comp, toks, max_perp_error=float("nan"))


def _hf_compressed_dir(src, dst, bits):
    """A compressed HF directory made with plain transformers (as any external tool would)."""
    from tl_directional.model.load import load_hf_model

    hf = load_hf_model(src)
    with torch.no_grad():
        for block in hf.transformer.h:
            for mod in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                mod.weight.copy_(rtn_matrix(mod.weight.T, bits).T)  # Conv1D stores [in, out]
    hf.save_pretrained(dst)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def test_cli_gate_exit_code_follows_threshold(tiny_model_dir, tmp_path, capsys):
    from tl_directional.cli import main

    dense = tiny_model_dir("gpt2")
    comp = _hf_compressed_dir(dense, tmp_path / "w3", 3)
    text = tmp_path / "t.txt"
    text.write_text("In the beginning was the word, and the word was with God. " * 20)
    args = ["compress-check", "--dense", str(dense), "--compressed", str(comp), "--text", str(text),
            "--max-sequences", "4", "--seq-len", "32"]
    assert main(args + ["--max-perp-error", "5"]) == 0
    assert main(args + ["--max-perp-error", "0.01", "--report", str(tmp_path / "rep")]) == 1
    out = capsys.readouterr().out
    assert "compress-check FAIL" in out and (tmp_path / "rep" / "report.html").is_file()
    # --quiet: the verdict line alone (and any reasons), for a CI log
    assert main(args + ["--max-perp-error", "0.01", "--quiet"]) == 1
    quiet = capsys.readouterr().out.strip().splitlines()
    assert quiet[0].startswith("compress-check FAIL: max ") and all(ln.startswith("reason: ") for ln in quiet[1:])
    assert main(["compress-check", "--dense", str(dense), "--compressed", str(dense), "--text", str(text),
                 "--max-sequences", "2", "--seq-len", "32", "--max-perp-error", "0"]) == 0
    assert main(["compress-check", "--dense", str(dense), "--compressed", str(tiny_model_dir("llama")),
                 "--text", str(text), "--max-perp-error", "1"]) == 2
    assert "architectures differ" in capsys.readouterr().err


def test_save_compressed_roundtrip(tiny_model, lane, tmp_path, toks):
    from tl_directional.model.load import load_model

    dense = tiny_model("neox")
    comp = prune_wanda(dense, toks, n_m=(2, 4))
    if lane != "bridge":
        with pytest.raises(NotImplementedError, match="bridge"):
            save_compressed(comp.model, tmp_path / "x")
        return
    path = save_compressed(comp.model, tmp_path / "w24", comp.record)
    back = load_model(path)
    torch.testing.assert_close(back(toks), comp.model(toks), atol=1e-5, rtol=1e-5)
    assert json.loads((path / "tl_directional_compression.json").read_text())["label"] == "wanda 2:4"
    assert lane_of(back) == "bridge"
