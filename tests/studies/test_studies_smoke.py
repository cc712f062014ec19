"""Smoke tests of the studies' real-model explorations (``studies.explore``, ``studies.compression_study``)
at a tiny size (seconds each).

Each script runs end to end on a seeded tiny Llama-GQA directory (passed as ``--model PATH``,
as the real runs pass a model directory or name) on both held-out texts, and the outputs are
checked for what the pages rely on: one row per layer x component / head / setting, intervals
that contain their point value, provenance in the meta JSON, and a page whose first lines are
the computed reading.
"""

from __future__ import annotations

import importlib
import json
import math

import pandas as pd
import pytest

MODULES = {"compression_study": "studies.compression_study.run"}


def _script(name):
    return importlib.import_module(MODULES.get(name, f"studies.explore.{name}"))


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def _check_meta(meta: dict, model_dir: str):
    assert meta["model_path"] == model_dir
    assert len(meta["model_safetensors_sha256"]) == 64
    for key in ("commit", "device", "tokens_total", "seconds", "command"):
        assert key in meta, key
    assert meta["tokens_total"] > 0


pytestmark = pytest.mark.usefixtures("restore_grad_mode")  # tests/studies/conftest.py


def test_prose_slice_is_pinned_and_licensed():
    from tl_directional.io.corpus import heldout_paths, prose_heldout_text

    text = prose_heldout_text()
    meta = json.loads((heldout_paths()[0].parent / "prose_heldout.json").read_text())
    assert len(text.encode()) == meta["bytes"] <= 200_000
    assert meta["license"].startswith("GPL-2+") and "Osamu Aoki" in meta["copyright_notice"]
    assert "Debian" in text


def test_depth_profile_smoke(llama_dir, tmp_path):
    mod = _script("depth_profile")
    page = tmp_path / "docs" / "depth.md"
    assert mod.main(["--model", llama_dir, "--sequences", "2", "--seq-len", "16", "--batch-size", "2",
                     "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    res = pd.read_csv(page.with_name("depth.residual.csv"))
    val = pd.read_csv(page.with_name("depth.value.csv"))
    meta = json.loads(page.with_name("depth.meta.json").read_text())
    _check_meta(meta, llama_dir)
    n_layers = meta["n_layers"]
    # 2 texts x BOS in/out x layers x (attn, mlp, block); per head likewise
    assert len(res) == 2 * 2 * n_layers * 3
    assert len(val) == 2 * 2 * n_layers * meta["n_heads"]
    # beta = A_tt + gamma holds for the per-token means
    assert (val.beta_mean - val.A_tt_mean - val.gamma_mean).abs().max() < 1e-4
    assert meta["texts"]["kjv"]["tokens_bos_in"] - meta["texts"]["kjv"]["tokens_bos_out"] == 2
    lv = meta["random_levels"]
    assert abs(lv["e_abs_cos"] - math.sqrt(2 / (math.pi * meta["d_model"]))) < 0.02
    assert page.read_text().splitlines()[2].startswith("**Reading")


def test_scaling_sweep_smoke(llama_dir, tmp_path):
    mod = _script("scaling_sweep")
    page = tmp_path / "sweep.md"
    assert mod.main(["--model", llama_dir, "--sequences", "3", "--seq-len", "16", "--batch-size", "3",
                     "--s-par", "-1", "0", "--s-perp", "0", "--bootstrap", "50",
                     "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    df = pd.read_csv(page.with_name("sweep.csv"))
    # per text: baseline + 5 spaces x (2 s_par + 1 s_perp) + hard-diag
    assert len(df) == 2 * (1 + 5 * 3 + 1)
    edited = df[df.space != "baseline"]
    assert (edited.delta_loss_lo <= edited.delta_loss + 1e-12).all()
    assert (edited.delta_loss <= edited.delta_loss_hi + 1e-12).all()
    assert (df[df.space == "baseline"].delta_loss == 0).all()
    _check_meta(json.loads(page.with_name("sweep.meta.json").read_text()), llama_dir)
    assert "least to most damaging" in page.read_text()
    # the BOS check re-runs the removals with the first position spared, on the same windows
    bos = _script("bos_check")
    bpage = tmp_path / "bos.md"
    assert bos.main(["--model", llama_dir, "--sweep-out", str(tmp_path / "out"), "--batch-size", "3",
                     "--out", str(tmp_path / "bos"), "--page", str(bpage)]) == 0
    b = pd.read_csv(bpage.with_name("bos.csv"))
    assert len(b) == 2 * 3
    assert (b.unspared_delta_loss - b.spared_delta_loss - b.bos_part).abs().max() < 1e-9
    # one text again, the other kept from the first run: the same rows and numbers
    b2page = tmp_path / "bos2.md"
    assert bos.main(["--model", llama_dir, "--sweep-out", str(tmp_path / "out"), "--batch-size", "3", "--texts",
                     "prose", "--keep-previous", str(tmp_path / "bos"), "--out", str(tmp_path / "bos2"),
                     "--page", str(b2page)]) == 0
    b2 = pd.read_csv(b2page.with_name("bos2.csv"))
    meta2 = json.loads(b2page.with_name("bos2.meta.json").read_text())
    assert meta2["previous"]["texts"] == ["kjv"] and set(meta2["texts"]) == {"kjv", "prose"}
    key = ["text", "space"]
    pd.testing.assert_frame_equal(b.sort_values(key).reset_index(drop=True),
                                  b2.sort_values(key).reset_index(drop=True), check_exact=False, rtol=1e-9)


def test_layer_sensitivity_smoke(llama_dir, tmp_path):
    mod = _script("layer_sensitivity")
    page = tmp_path / "layers.md"
    assert mod.main(["--model", llama_dir, "--texts", "prose", "--sequences", "2", "--seq-len", "16",
                     "--batch-size", "2", "--bootstrap", "50", "--spaces", "value", "hard-diag",
                     "--safe-scale", "--safe-sequences", "2", "--safe-grid-points", "3", "--safe-refine-steps", "1",
                     "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    meta = json.loads(page.with_name("layers.meta.json").read_text())
    _check_meta(meta, llama_dir)
    df = pd.read_csv(page.with_name("layers.csv"))
    assert sorted(set(df.layer)) == list(range(meta["n_layers"])) and len(df) == 2 * meta["n_layers"]
    safe = pd.read_csv(page.with_name("layers.safe.csv"))
    assert len(safe) == meta["n_layers"] and ((safe.lo <= 1) & (safe.hi >= 1)).all()
    assert "<svg" in page.with_name("layers.prose.svg").read_text()


def test_compression_study_real_mode_smoke(llama_dir, tmp_path):
    mod = _script("compression_study")
    page = tmp_path / "comp.md"
    grid = ["rtn:bits=8", "rtn:bits=4", "rtn:bits=3", "magnitude:sparsity=0.5", "drop:layers=LAST"]
    assert mod.main(["--model", llama_dir, "--text", "prose", "--calib-sequences", "2", "--eval-sequences", "3",
                     "--seq-len", "16", "--batch-size", "3", "--bootstrap", "30", "--modes", "local",
                     "--grid", *grid, "--out", str(tmp_path / "out"), "--page", str(page)]) == 0
    settings = pd.read_csv(page.with_name("comp.settings.csv"))
    assert len(settings) == len(grid) and settings.by_construction_parallel.sum() == 1
    sp = pd.read_csv(page.with_name("comp.spearman.csv"))
    assert set(sp["mode"]) == {"local", "data-free"}
    meta = json.loads(page.with_name("comp.meta.json").read_text())
    assert meta["text"] == "prose" and meta["model_path"] == llama_dir
    assert page.read_text().splitlines()[2].startswith("**Reading")


def test_compression_study_two_texts_smoke(llama_dir, tmp_path):
    """One compression per setting, evaluated on both texts; per-text tables, intervals on the
    per-layer errors, and the same outputs again from the partial file."""
    mod = _script("compression_study")
    page = tmp_path / "comp2.md"
    grid = ["rtn:bits=8", "rtn:bits=3", "wanda:nm=2:4", "magnitude:sparsity=0.5", "drop:layers=LAST"]
    args = ["--model", llama_dir, "--texts", "prose", "kjv", "--partial", str(tmp_path / "partial.pt"),
            "--calib-sequences", "2", "--eval-sequences", "3", "--seq-len", "16", "--batch-size", "3", "--bootstrap", "30", "--modes", "local",
            "--grid", *grid, "--out", str(tmp_path / "out"), "--page", str(page)]
    assert mod.main(args) == 0
    settings = pd.read_csv(page.with_name("comp2.settings.csv"))
    assert len(settings) == 2 * len(grid) and sorted(set(settings.text)) == ["kjv", "prose"]
    # the same compressed model per setting on both texts: the data-free weight error agrees
    per_text = settings.pivot(index="setting", columns="text", values="weight_rel_error")
    pd.testing.assert_series_equal(per_text.kjv, per_text.prose, check_names=False)
    pl = pd.read_csv(page.with_name("comp2.per_layer.csv"))
    ranked = pl[~pl.by_construction_parallel]
    assert (ranked.err_perp_energy_lo <= ranked.err_perp_energy * (1 + 1e-5) + 1e-12).all()
    assert (ranked.err_perp_energy <= ranked.err_perp_energy_hi * (1 + 1e-5) + 1e-12).all()
    meta = json.loads(page.with_name("comp2.meta.json").read_text())
    assert meta["calibration_text"] == "prose" and set(meta["texts"]) == {"kjv", "prose"}
    assert meta["texts"]["kjv"]["tokens"] == 3 * 15
    text = page.read_text()
    assert text.splitlines()[2].startswith("**Reading") and "## Text `kjv`" in text and "## Text `prose`" in text
    assert page.with_name("comp2.kjv.perp_per_layer_attn.svg").is_file()
    before = settings.copy()
    assert mod.main(args + ["--from-partial"]) == 0
    again = pd.read_csv(page.with_name("comp2.settings.csv"))
    pd.testing.assert_frame_equal(before, again)
    assert "Measured by `python -m studies run compression-study" in page.read_text()
    sp = pd.read_csv(page.with_name("comp2.spearman.csv"))
    head = sp[(sp["mode"] == "local") & (sp.unit == "block") & (sp.diagnostic == "perp_energy")]
    assert len(head) == 2 and (head.loo_min <= head.spearman + 1e-12).all() and (head.spearman <= head.loo_max + 1e-12).all()


def test_layer_sensitivity_extend_smoke(llama_dir, tmp_path):
    """A second run adds spaces to an earlier run's heat map on the same windows; the earlier
    cells re-measured as a check agree exactly (the same deterministic forwards)."""
    mod = _script("layer_sensitivity")
    common = ["--model", llama_dir, "--texts", "prose", "--sequences", "2", "--seq-len", "16", "--batch-size", "2",
              "--bootstrap", "50"]
    assert mod.main(common + ["--spaces", "value", "--out", str(tmp_path / "a")]) == 0
    page = tmp_path / "ext.md"
    assert mod.main(common + ["--spaces", "resid-mlp", "hard-diag", "--extend", str(tmp_path / "a"),
                              "--extend-check-layers", "0", "--out", str(tmp_path / "b"), "--page", str(page)]) == 0
    meta = json.loads(page.with_name("ext.meta.json").read_text())
    df = pd.read_csv(page.with_name("ext.csv"))
    assert meta["spaces"] == ["value", "resid-mlp", "hard-diag"] and len(df) == 3 * meta["n_layers"]
    assert max(meta["extends"]["check_max_abs_diff"].values()) < 1e-6
    assert "earlier runs on the same windows" in page.read_text()
    # the safe-scale search in two runs: the table keeps both, the page names both commands
    safe = ["--texts", "--safe-scale", "--safe-sequences", "2", "--safe-grid-points", "3", "--safe-refine-steps", "1"]
    base = common[:2] + ["--seq-len", "16", "--batch-size", "2"]
    assert mod.main(base + safe + ["--safe-layers", "0", "--out", str(tmp_path / "s1")]) == 0
    spage = tmp_path / "safe.md"
    assert mod.main(base + safe + ["--safe-layers", "1", "--safe-extend", str(tmp_path / "s1"),
                                   "--out", str(tmp_path / "s2"), "--page", str(spage)]) == 0
    smeta = json.loads(spage.with_name("safe.meta.json").read_text())
    assert [r["layers"] for r in smeta["safe"]["runs"]] == [[0], [1]]
    assert sorted(pd.read_csv(spage.with_name("safe.safe.csv")).layer) == [0, 1]
    assert "searched in several runs" in spage.read_text()


def test_compression_study_ranks_average_ties():
    import torch

    mod = _script("compression_study")
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert abs(float(mod.spearman(-y, y)) + 1.0) < 1e-12
