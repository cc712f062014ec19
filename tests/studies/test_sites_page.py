"""The residual-sites page (protocol sec. 14) from a tiny synthetic data set: a pure function of the
files, each reading follows sec. 14.3's rule (explains, accounts for most, does not explain, not
decided, and a missing setting), and the ratio is computed inside each resample."""

from __future__ import annotations

import numpy as np
import pandas as pd

from studies import common
from studies.claims import sites
from studies.claims import stats as S
from tests.studies._sandbox import redirect

TEXTS, WINDOWS, TOKENS = ("kjv", "prose", "code"), 8, 127
#: per-token loss change of each setting (nats); the noise is far smaller than every margin but one
EFFECT = {
    "resid-mlp all s_par=0": 5.0,
    "resid-mlp spare0 s_par=0": 0.3,  # explains: upper bound <= 0.5
    "resid-mlp skip0 s_par=0": 4.9,  # does not explain: R ~ 0.98
    "resid-mlp skip0 spare0 s_par=0": 1.5,  # accounts for most: R ~ 0.3
    "resid-attn all s_par=0": 1.0,
    "resid-attn skip0 s_par=0": 0.5,  # R ~ 0.5 and delta ~ 0.5: not decided
    "resid-attn skip0 spare0 s_par=0": 0.9,
}


def _write(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    redirect(monkeypatch, data, tmp_path, tmp_path)
    rng = np.random.default_rng(0)
    rows = []
    for text in TEXTS:
        for w in range(WINDOWS):
            base = float(rng.uniform(2.5, 3.5)) * TOKENS
            rows.append(dict(text=text, window=w, setting="baseline", tokens=TOKENS, nll=base, base_nll=base,
                             kl=0.0, agree=TOKENS))
            for lab, eff in EFFECT.items():
                nll = base + TOKENS * (eff + float(rng.normal(0, 0.002)))
                rows.append(dict(text=text, window=w, setting=lab, tokens=TOKENS, nll=nll, base_nll=base,
                                 kl=0.01 * TOKENS, agree=0.9 * TOKENS))
    rec = pd.DataFrame(rows)
    prof = pd.DataFrame([dict(text=t, layer=0, component="mlp", count=1, energy_ratio=0.3, par_frac_mean=0.2,
                              par_frac_median=0.2) for t in TEXTS])
    manifest = {
        "commit": "abc1234", "command": "python -m studies run claims --model toy --settings sites",
        "date": "2026-12-06 00:00 UTC", "machine": "test", "seconds": 1.0, "seq_len": 128, "windows": WINDOWS,
        "complete": True,
        "model": {"name": "toy", "architecture": "toy", "source_file": "toy.gguf", "quantisation": "none",
                  "source_sha256": "0" * 64, "safetensors_sha256": None, "n_layers": 2, "n_heads": 2,
                  "n_kv_heads": 2, "d_model": 8, "sandwich_norm": False, "lane": "bridge", "dequantised": True},
        "texts": {t: {"sha256": "0" * 64, "windows": WINDOWS, "commit": "abc1234"} for t in TEXTS},
        "settings": [], "files": {},
    }
    files = {f"sites_toy.{k}.csv": v.to_csv(index=False, lineterminator="\n").encode()
             for k, v in (("records", rec), ("profile", prof))}
    common.write_data(data, files, manifest, "sites_toy.manifest.json")
    return data, rec


def _readings(page):
    rows = [ln.strip("|").split(" | ") for ln in page.split("## Every setting")[0].splitlines()
            if ln.startswith("| mlp |") or ln.startswith("| attn |")]
    return {(r[0].strip(), r[1]): r[-1].strip(" |*") for r in rows}


def test_readings_follow_the_rules_and_the_page_is_pure(tmp_path, monkeypatch):
    data, _ = _write(tmp_path, monkeypatch)
    assert sites.stems(data) == ["sites_toy"]
    page = sites.build_sites_page("sites_toy", data)
    assert page == sites.build_sites_page("sites_toy", data)
    assert _readings(page) == {
        ("mlp", "spare0"): "explains",
        ("mlp", "skip0"): "does not explain",
        ("mlp", "skip0 spare0"): "accounts for most",
        ("attn", "spare0"): "not decided",  # not measured
        ("attn", "skip0"): "not decided",
        ("attn", "skip0 spare0"): "does not explain",
    }
    assert "| attn | spare0 | not measured |" in page and "+0.1165" in page


def test_the_ratio_is_taken_inside_each_resample(tmp_path, monkeypatch):
    _, rec = _write(tmp_path, monkeypatch)
    st = S.setting_stats(rec, S.window_bootstrap(rec))
    ratio = st["resid-mlp skip0 spare0 s_par=0"]["pooled"] / st["resid-mlp all s_par=0"]["pooled"]

    def delta(label):
        g = rec[rec.setting == label]
        return float((g.nll - g.base_nll).sum() / g.tokens.sum())

    assert abs(ratio[0] - delta("resid-mlp skip0 spare0 s_par=0") / delta("resid-mlp all s_par=0")) < 1e-12
    # a reading at the boundary: an interval wholly above 0.5 of the `all` delta
    assert sites.reading(np.array([2.0, 1.9, 2.1]), np.array([0.6, 0.55, 0.65])) == "does not explain"
    assert sites.reading(np.array([0.4, 0.3, 0.5]), np.array([0.9, 0.8, 1.0])) == "**explains**"
