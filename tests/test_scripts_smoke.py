"""Smoke tests of the real-model experiment scripts at a tiny size (seconds each).

Each script runs end to end on a seeded tiny Llama-GQA directory (passed as ``--model PATH``,
as the real runs pass a model directory or name) on both held-out texts, and the outputs are
checked for what the pages rely on: one row per layer x component / head / setting, intervals
that contain their point value, provenance in the meta JSON, and a page whose first lines are
the computed reading.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"_smoke_{name}", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llama_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def _check_meta(meta: dict, model_dir: str):
    assert meta["model_path"] == model_dir
    assert len(meta["model_safetensors_sha256"]) == 64
    for key in ("commit", "device", "tokens_total", "seconds", "command"):
        assert key in meta, key
    assert meta["tokens_total"] > 0


@pytest.fixture(autouse=True)
def _restore_grad_mode():
    # the scripts' mains turn autograd off for the whole process (they are command-line
    # scripts); run in-process here, that must not leak into the rest of the suite
    import torch

    was = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(was)


def test_prose_slice_is_pinned_and_licensed():
    from tl_directional.corpus import heldout_paths, prose_heldout_text

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
