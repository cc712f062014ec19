"""The accuracy page (protocol sec. 9.4) from per-item data: built from the files alone, the
verdicts follow the rules, a dirty or altered data file is refused."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.studies._sandbox import load

ROOT = Path(__file__).resolve().parents[2]


_load = load


def _data(tmp_path, commit="abc1234", complete=None):
    C = _load("accuracy_claims")
    common = _load("_common")
    g = torch.Generator().manual_seed(0)
    n = 3000
    base = (torch.rand(n, generator=g) < 0.6).long()

    def drop(points):
        e = base.clone()
        right = (e == 1).nonzero().flatten()
        e[right[torch.randperm(len(right), generator=g)[: int(points / 100 * n)]]] = 0
        return e.tolist()

    rec = pd.DataFrame(
        {
            "text": ["kjv"] * n,
            "item": range(n),
            "kind": ["cloze"] * (n - 100) + ["continuation"] * 100,
            "window": [i // 64 for i in range(n)],
            "baseline": base.tolist(),
            "value-exclusive-joint all s_par=0": drop(0.0),
            "value-exclusive all s_par=0": drop(12.0),
            "value-full-joint skip0 s_par=0": drop(20.0),
            "hard-diag skip0": drop(0.0),
            "resid-mlp skip0 s_par=0": drop(5.0),
        }
    )
    stem = "accuracy_toy"
    files = {
        f"{stem}.records.csv": rec.to_csv(index=False, lineterminator="\n").encode(),
        f"{stem}.items.json": b"[]\n",
    }
    manifest = {
        "commit": commit,
        "command": "x",
        "model": {"name": "toy", "source_sha256": "0" * 64},
        "suite": {
            "seed": 0,
            "cloze_per_window": 64,
            "frequency_bands": 8,
            "continuation_per_window": 2,
            "context_len": 32,
            "continuation_len": 16,
        },
        "texts": {"kjv": {"windows": 47, "cloze_items": n - 100, "continuation_items": 100}},
        "files": {},
    }
    if complete is not None:
        manifest["complete"] = complete
    common.write_data(tmp_path, files, manifest, f"{stem}.manifest.json")
    return C, stem


def test_page_is_built_from_the_data_and_follows_the_rules(tmp_path):
    C, stem = _data(tmp_path)
    page = C.build_page(stem, tmp_path)
    assert page == C.build_page(stem, tmp_path)  # a pure function of the files
    line = {
        r.split(" | ")[0].strip("| "): r
        for r in page.splitlines()
        if r.startswith("| ") and " [" in r
    }
    assert line["value-exclusive-joint all s_par=0"].endswith("**held** |")
    assert line["value-exclusive all s_par=0"].endswith("**failed** |")
    assert line["value-full-joint skip0 s_par=0"].endswith("**held** |")
    assert line["hard-diag skip0"].endswith("**failed** |")
    assert line["resid-mlp skip0 s_par=0"].endswith("| - |")
    assert "exclude-self within 1.5 points: held in 1 of 2 settings, failed in 1" in page


def test_dirty_or_altered_data_is_refused(tmp_path):
    C, stem = _data(tmp_path, commit="abc1234+dirty")
    with pytest.raises(C.AccuracyDataError, match="dirty"):
        C.build_page(stem, tmp_path)
    C, stem = _data(tmp_path)
    (tmp_path / f"{stem}.items.json").write_text("[1]\n")
    with pytest.raises(C.AccuracyDataError):
        C.build_page(stem, tmp_path)


def test_summary_rows_and_the_lead_table_read_the_same_verdicts(tmp_path):
    C, stem = _data(tmp_path)
    rows = {claim: (stat, verdict) for claim, stat, verdict in C.verdict_rows(stem, tmp_path)}
    # only settings under a rule reach the summary table; the context row does not
    assert not any("resid-mlp" in c for c in rows)
    held = rows["accuracy (sec. 9.4): value-full-joint skip0 s_par=0 at least 3 points worse than baseline"]
    assert held[1] == "**held**" and held[0].startswith("baseline - edited = +20.")
    drops = C.drops(stem, tmp_path)
    pvo = _load("paper_vs_ours")
    acc = {"smollm2-135m": drops}
    d_hard, d_excl = drops["hard-diag skip0"][0], drops["value-exclusive all s_par=0"][0]
    diff = pvo._order(acc, "smollm2-135m", "hard-diag skip0", "value-exclusive all s_par=0")
    point, lo, hi = (float(x) for x in diff.replace("[", "").replace("]", "").replace(",", "").split())
    assert point == pytest.approx(d_hard.point - d_excl.point, abs=5e-3)
    assert lo < point < hi and hi < 0  # 0 vs 12 points dropped: hard diagonal loses less, surely
    assert pvo._drop(acc, "smollm2-135m", "hard-diag skip0").startswith("; accuracy drop +0.00 points")
    assert pvo._drop(acc, "gemma-3-270m", "hard-diag skip0") == ""
    # the lead table's reading follows the interval's side, per model
    assert "does not restore the paper's order" in pvo._order_reading(
        acc, "hard-diag skip0", "value-exclusive all s_par=0")
    assert "restores the paper's order." in pvo._order_reading(
        acc, "value-exclusive all s_par=0", "hard-diag skip0")
    both = {"smollm2-135m": drops, "gemma-3-270m": drops}
    mixed = pvo._order_reading(both, "hard-diag skip0", "value-exclusive-joint all s_par=0")
    assert mixed.endswith("does not settle the order on every model.") and "across zero" in mixed


def test_an_incomplete_run_decides_nothing(tmp_path):
    C, stem = _data(tmp_path, complete=False)
    page = C.build_page(stem, tmp_path)
    assert "**Incomplete run**: measured so far on kjv only" in page
    ruled = [r for r in page.splitlines() if r.startswith("| value-") or r.startswith("| hard-diag")]
    assert ruled and all(r.endswith(f"**{C.INCOMPLETE}** |") for r in ruled[:4])
    assert "held in" not in page
    assert {v for _, _, v in C.verdict_rows(stem, tmp_path)} == {f"**{C.INCOMPLETE}**"}
    C, stem = _data(tmp_path, complete=True)  # the same data, complete: the rules decide
    assert "**held**" in C.build_page(stem, tmp_path)
