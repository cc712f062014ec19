"""The pages of protocol sec. 16 from tiny constructed data sets: each a pure function of the
files; the applied-strength means are token-weighted means of per-update ratios (checked against
numbers computed here), the comparison, sign and atlas readings follow sec. 16's rules, and the
random-draw verdict V1 pairs residual with sec. 11.4's value records on the same windows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from studies import common
from studies.claims import sites_more
from studies.claims.residual import DRAWS, atlas_label, random_label
from tests.studies._sandbox import redirect

TEXTS, WINDOWS, TOKENS = ("kjv", "prose", "code"), 6, 127


def _manifest(n_layers=2, settings=()):
    return {
        "commit": "abc1234", "command": "python -m studies run claims --model toy", "date": "2026-12-06 00:00 UTC",
        "machine": "test", "seconds": 1.0, "seq_len": 128, "windows": WINDOWS, "complete": True,
        "model": {"name": "toy", "architecture": "toy", "source_file": "toy.gguf", "quantisation": "none",
                  "source_sha256": "0" * 64, "safetensors_sha256": None, "n_layers": n_layers, "n_heads": 2,
                  "n_kv_heads": 2, "d_model": 8, "sandwich_norm": False, "lane": "bridge", "dequantised": True},
        "texts": {t: {"sha256": "0" * 64, "windows": WINDOWS, "commit": "abc1234"} for t in TEXTS},
        "settings": list(settings), "files": {}}


def _save(data, stem, frames, manifest):
    files = {f"{stem}.{k}.csv": v.to_csv(index=False, lineterminator="\n").encode() for k, v in frames.items()}
    common.write_data(data, files, manifest, f"{stem}.manifest.json")


def _sandbox(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    redirect(monkeypatch, data, tmp_path, tmp_path)
    return data


def test_strength_page_means_comparison_and_signs(tmp_path, monkeypatch):
    data = _sandbox(tmp_path, monkeypatch)
    rng = np.random.default_rng(0)
    level = {"value-exclusive-joint skip0 s_par=0": 0.5, "resid-attn skip0 s_par=0": 0.25}
    rows, signs = [], []
    for text in TEXTS:
        for w in range(WINDOWS):
            for edit, mu in level.items():
                for layer in (1, 2):
                    r = mu + rng.normal(0, 0.01, TOKENS)  # per-update ratios of this window and layer
                    rows.append(dict(text=text, window=w, edit=edit, layer=layer, count=TOKENS, norm=r.sum(),
                                     energy=(r ** 2).sum(), retained=(1 - r / 4).sum(), diff_sq=(r ** 2).sum(),
                                     base_sq=float(TOKENS), count0=1, norm0=r[0], energy0=r[0] ** 2,
                                     retained0=1 - r[0] / 4, diff_sq0=r[0] ** 2, base_sq0=1.0))
            for form, pos in (("joint", 0), ("per-head", 30)):
                signs.append(dict(text=text, window=w, form=form, layer=1, n=100, neg=100 - pos, zero=0, pos=pos,
                                  big=0, sum=-10.0, min=-0.5, max=0.3 if pos else -0.01, degenerate=0))
    frame = pd.DataFrame(rows)
    _save(data, "strength_toy", {"strength": frame, "signs": pd.DataFrame(signs)}, _manifest())
    assert sites_more.stems(data, "strength") == ["strength_toy"]
    page = sites_more.build_strength_page("strength_toy", data)
    assert page == sites_more.build_strength_page("strength_toy", data)
    for edit in level:
        g = frame[frame.edit == edit]
        want = g.norm.sum() / g["count"].sum()
        row = next(ln for ln in page.splitlines() if ln.startswith(f"| {edit} |"))
        assert row.split(" | ")[1].startswith(f"{want * 100:.2f}%")
    assert "| the paper's ordering (exclude-self above the residual edit) | **holds on this model** |" in page
    assert "| norm ratio, the paper | 1.95 |" in page
    readings = {ln.split(" | ")[0].strip("| "): ln.rstrip(" |").split(" | ")[-1]
                for ln in page.split("## Sign")[1].splitlines() if ln.startswith(("| joint", "| per-head"))}
    assert readings == {"joint": "**non-positive in practice**", "per-head": "**signed**"}


def _records(effects: dict, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for text in TEXTS:
        for w in range(WINDOWS):
            base = 3.0 * TOKENS
            rows.append(dict(text=text, window=w, setting="baseline", tokens=TOKENS, nll=base, base_nll=base, kl=0.0,
                             agree=TOKENS))
            for lab, eff in effects.items():
                rows.append(dict(text=text, window=w, setting=lab, tokens=TOKENS,
                                 nll=base + TOKENS * (eff + float(rng.normal(0, 0.002))), base_nll=base,
                                 kl=0.01 * TOKENS, agree=0.9 * TOKENS))
    return pd.DataFrame(rows)


def _profile():
    return pd.DataFrame([dict(text=t, layer=0, component="mlp", count=1, energy_ratio=0.3) for t in TEXTS])


def test_residual_atlas_share_and_reading(tmp_path, monkeypatch):
    data = _sandbox(tmp_path, monkeypatch)
    eff = {atlas_label("mlp", 0): 3.0, atlas_label("mlp", 1): 1.0, atlas_label("mlp", 2): 0.5, atlas_label("mlp", 3): 0.5,
           atlas_label("attn", 0): 0.1, atlas_label("attn", 1): 0.1, atlas_label("attn", 2): 1.0,
           atlas_label("attn", 3): 1.0}
    _save(data, "residatlas_toy", {"records": _records(eff), "profile": _profile()}, _manifest(n_layers=4))
    page = sites_more.build_residatlas_page("residatlas_toy", data)
    assert page == sites_more.build_residatlas_page("residatlas_toy", data)
    mlp, attn = page.split("## resid-attn")
    assert "| share of that sum in layers 0 and 1 | +0.80 [" in mlp and "| reading (sec. 16.2): layers 0-1 | **carry most** |" in mlp
    assert "| share of that sum in layers 0 and 1 | +0.09 [" in attn and "**do not carry most**" in attn


def test_random_draws_verdict_pairs_with_the_value_records(tmp_path, monkeypatch):
    data = _sandbox(tmp_path, monkeypatch)
    draws = ["fixed s_par=0.5"] + [f"{d} seed={k}" for d, k in DRAWS]
    resid = {random_label(c, d): 1.0 + 0.1 * i for c in ("mlp", "attn") for i, d in enumerate(draws)}
    value = {d: 0.02 for d in draws}
    _save(data, "residrandom_toy", {"records": _records(resid), "profile": _profile()}, _manifest())
    longer = _records(value, seed=1)
    extra = longer[longer.window == 0].assign(window=WINDOWS)  # a window the residual run does not have
    _save(data, "instruments_toy", {"records": pd.concat([longer, extra]), "profile": _profile()}, _manifest())
    page = sites_more.build_residrandom_page("residrandom_toy", data)
    assert page == sites_more.build_residrandom_page("residrandom_toy", data)
    v1 = next(ln for ln in page.splitlines() if ln.startswith("| V1"))
    assert "min over 12 (draw, component) pairs" in v1 and v1.endswith("| **held** |")
    assert abs(float(v1.split(" | ")[-2].split()[0]) - 1.08) < 0.005  # the smallest pair: 1.1 - 0.02 (seed 0)
    assert "largest baseline NLL difference between the two runs: 0.00e+00" in page
    (data / "instruments_toy.manifest.json").unlink()
    assert sites_more.build_residrandom_page("residrandom_toy", data).count("| not measured | not decided |") == 1
