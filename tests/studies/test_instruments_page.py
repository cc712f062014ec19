"""The instruments page (protocol sec. 11) from a tiny synthetic data set: a pure function of the
files, each verdict follows its rule (held, failed, not decided, and missing settings), the
statistics equal a direct computation, and dirty or altered data are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.studies._sandbox import load

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ("kjv", "prose", "code")
WINDOWS, TOKENS = 8, 127


_load = load


#: per-token loss change of each setting (nats); the noise below is far smaller than every margin
EFFECT = {
    "resid-mlp s_par=0": 0.20,
    "carrier-input s_par=0": 0.01,
    "carrier-block s_par=0": 0.004,
    "carrier-input s_perp=0": 3.0,
    "carrier-block s_perp=0": 2.5,
    "wanda": 0.50,
    "wanda-perp": 0.501,
    "wanda-par": 0.80,
    "fixed s_par=0.5": 0.02,
    "uniform seed=0": 0.01,
    "uniform seed=1": 0.20,
    "uniform seed=2": 0.03,
    "gaussian seed=0": 0.00,
    "gaussian seed=1": 0.01,
    "gaussian seed=2": -0.01,
}


def _data(tmp_path, *, commit="abc1234", drop=(), effect=None, noise=0.001, model="toy"):
    run, common = _load("instruments_run"), _load("_common")
    effect = dict(EFFECT, **(effect or {}))
    rng = np.random.default_rng(0)
    rows = []
    for text in TEXTS:
        for w in range(WINDOWS):
            base = float(rng.uniform(2.5, 3.5)) * TOKENS
            rows.append(
                dict(
                    text=text,
                    window=w,
                    setting="baseline",
                    tokens=TOKENS,
                    nll=base,
                    base_nll=base,
                    kl=0.0,
                    agree=TOKENS,
                )
            )
            for label in run.setting_labels():
                if label in drop:
                    continue
                nll = base + TOKENS * (effect[label] + float(rng.normal(0, noise)))
                rows.append(
                    dict(
                        text=text,
                        window=w,
                        setting=label,
                        tokens=TOKENS,
                        nll=nll,
                        base_nll=base,
                        kl=0.01 * TOKENS,
                        agree=0.9 * TOKENS,
                    )
                )
    rec = pd.DataFrame(rows)
    prof = pd.DataFrame(
        [
            dict(
                text=t,
                layer=L,
                count=100,
                energy_ratio=0.3,
                par_frac_mean=0.2,
                carrier_blocks=3,
                carrier_input_par_share=0.01 * (L + 1),
                carrier_input_energy_ratio=0.1,
                carrier_block_par_share=0.02,
                carrier_block_energy_ratio=0.14,
            )
            for t in TEXTS
            for L in range(2)
        ]
    )
    ranking = pd.DataFrame(
        [
            dict(
                name="blocks.0.attn.q",
                layer=0,
                key="attn.q",
                reference="own output",
                k_per_row=8,
                pruned=64,
                overlap=0.99,
                null_mean=0.995,
                null_sd=0.001,
                null_min=0.993,
                null_max=0.997,
                n_null=8,
                inside_null=False,
            ),
            dict(
                name="all",
                layer=-1,
                key="all",
                reference="-",
                k_per_row=0,
                pruned=64,
                overlap=0.99,
                null_mean=0.995,
                null_sd=0.001,
                null_min=0.993,
                null_max=0.997,
                n_null=8,
                inside_null=False,
            ),
        ]
    )
    settings = [
        {
            "label": lab,
            "family": "x",
            "space": "x",
            "s_par": 1.0,
            "s_perp": "1",
            **({"extra": {"draw": [1.0, 0.5, 1.5]}} if "seed=" in lab else {}),
        }
        for lab in run.setting_labels()
    ]
    stem = f"instruments_{model}"
    manifest = {
        "commit": commit,
        "command": "python scripts/claims.py run --model toy --settings instruments",
        "date": "2026-12-04 00:00 UTC",
        "machine": "test",
        "seconds": 1.0,
        "seq_len": 128,
        "windows": WINDOWS,
        "complete": True,
        "model": {
            "name": model,
            "architecture": "toy",
            "source_sha256": _catalogue_sha(model),
            "n_layers": 2,
            "n_heads": 2,
            "n_kv_heads": 2,
            "d_model": 8,
            "sandwich_norm": False,
            "lane": "bridge",
            "dequantised": False,
        },
        "texts": {t: {"sha256": "0" * 64, "windows": WINDOWS, "commit": commit} for t in TEXTS},
        "carrier": {"d_mlp": 20, "d_model": 8, "remainder": "pad", "blocks": 3, "partial_width": 4},
        "calibration": {"first_window": 64, "windows_per_text": 4, "sparsity": 0.5, "tokens": 1536},
        "wanda": {
            lab: {"flipped_vs_wanda": f, "flipped_weights": f * 64, "pruned_weights": 64}
            for lab, f in (("wanda", 0.0), ("wanda-perp", 0.0001), ("wanda-par", 0.09))
        },
        "settings": settings,
        "files": {},
    }
    csv = {
        k: v.to_csv(index=False, lineterminator="\n").encode()
        for k, v in (("records", rec), ("profile", prof), ("ranking", ranking))
    }
    common.write_data(
        tmp_path, {f"{stem}.{k}.csv": b for k, b in csv.items()}, manifest, f"{stem}.manifest.json"
    )
    return _load("instruments_claims"), stem, rec


def _catalogue_sha(model):
    from tl_directional.model.load.catalog import REAL_MODELS

    return REAL_MODELS[model].source_sha256 if model in REAL_MODELS else None


def _verdicts(page):
    return {
        ln.split(" | ")[0].strip("| "): ln
        for ln in page.splitlines()
        if ln.startswith("| ") and ln.endswith("** |") and " = " in ln
    }


def test_page_is_a_pure_function_and_follows_the_rules(tmp_path):
    C, stem, rec = _data(tmp_path)
    page = C.build_page(stem, tmp_path)
    assert page == C.build_page(stem, tmp_path)
    v = _verdicts(page)
    expect = {
        "M1": "held",
        "M2": "held",
        "M3": "held",
        "W1": "held",
        "W2": "held",
        "R1u": "failed",
        "R2u": "failed",
        "R1g": "held",
        "R2g": "held",
    }
    assert {k: v[k].rsplit("**", 2)[-2] for k in expect} == expect
    assert "G = 3" in page and "4 real coordinates" in page and "+0.0301" in page
    assert "0.0100% (0 of 64)" in page and "inside their null's range: 0 of 1" in page
    # the sections' repeat checks say when the other study's data are absent
    assert "whose data are not in this directory: not compared" in page


def test_statistics_equal_a_direct_computation(tmp_path):
    C, stem, rec = _data(tmp_path)

    def delta(label):
        g = rec[rec.setting == label]
        return float((g.nll - g.base_nll).sum() / g.tokens.sum())

    st = C.statistics(rec)
    m1 = st["resid-mlp s_par=0"]["pooled"] - st["carrier-input s_par=0"]["pooled"]
    assert m1[0] == pytest.approx(
        delta("resid-mlp s_par=0") - delta("carrier-input s_par=0"), abs=1e-12
    )
    # the worst draw is taken inside each resample: never below any single draw's resampled value
    worst = np.max(
        [st[f"uniform seed={s}"]["pooled"] - st["fixed s_par=0.5"]["pooled"] for s in range(3)],
        axis=0,
    )
    one = st["uniform seed=1"]["pooled"] - st["fixed s_par=0.5"]["pooled"]
    assert bool((worst >= one).all()) and worst[0] == pytest.approx(
        max(delta(f"uniform seed={s}") for s in range(3)) - delta("fixed s_par=0.5"), abs=1e-12
    )


def test_not_decided_and_missing_settings(tmp_path):
    # W1's margin at the budget with wide noise: its interval straddles 0.05
    C, stem, _ = _data(tmp_path, effect={"wanda-perp": 0.55}, noise=0.05, drop=("gaussian seed=2",))
    v = _verdicts(C.build_page(stem, tmp_path))
    assert v["W1"].endswith("**not decided** |")
    page = C.build_page(stem, tmp_path)
    missing = [ln for ln in page.splitlines() if ln.startswith("| R1g |")][0]
    assert "settings missing: gaussian seed=2" in missing and missing.endswith("**not decided** |")


def test_dirty_or_altered_data_is_refused(tmp_path):
    C, stem, _ = _data(tmp_path, commit="abc1234+dirty")
    with pytest.raises(C.InstrumentsDataError, match="dirty"):
        C.build_page(stem, tmp_path)
    C, stem, _ = _data(tmp_path)
    path = tmp_path / f"{stem}.ranking.csv"
    path.write_bytes(path.read_bytes().replace(b"0.99", b"0.98", 1))
    with pytest.raises(C.InstrumentsDataError, match=f"{stem}.ranking.csv: sha256"):
        C.build_page(stem, tmp_path)


def test_lead_table_rows_appear_once_the_data_exist(tmp_path):
    pvo = _load("paper_vs_ours")
    assert pvo._instrument_rows(tmp_path) == []
    _data(tmp_path, model="smollm2-135m")
    rows = pvo._instrument_rows(tmp_path)
    assert len(rows) == 3 and all(r.startswith("| ") and r.endswith(" |") for r in rows)
    assert "M1 **held**" in rows[0] and "+0.1165" in rows[0] and "smollm2-135m: input" in rows[0]
    assert "W2 **held**" in rows[1] and "flips 0.0100%" in rows[1]
    assert "worst uniform draw (uniform seed=1)" in rows[2] and "R1u **failed**" in rows[2]
