"""End to end on the bundled default model (protocol sec. 11's runner at one window per text):
the records, the manifest's draws and Wanda statistics, a resumed run that keeps the finished
text bit for bit, the page built from the files, and the pruning masks restored exactly."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from tests.studies._sandbox import load

_script = load


pytestmark = pytest.mark.usefixtures("restore_grad_mode")  # tests/studies/conftest.py


@pytest.mark.slow
def test_instruments_run_resume_and_page(tmp_path):
    claims, run, page = _script("claims"), _script("instruments_run"), _script("instruments_claims")
    args = [
        "--model",
        "default",
        "--settings",
        "instruments",
        "--windows",
        "1",
        "--batch-size",
        "1",
        "--allow-dirty",
        "--data-dir",
        str(tmp_path),
    ]
    assert claims.main([*args, "--texts", "kjv"]) == 0
    stem = "instruments_default"
    first = pd.read_csv(tmp_path / f"{stem}.records.csv")
    m = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
    assert not m["complete"] and list(m["texts"]) == ["kjv"]
    assert claims.main([*args, "--resume"]) == 0
    rec = pd.read_csv(tmp_path / f"{stem}.records.csv")
    m = json.loads((tmp_path / f"{stem}.manifest.json").read_text())
    labels = run.setting_labels()
    assert m["complete"] and len(rec) == 3 * (1 + len(labels))
    pd.testing.assert_frame_equal(
        rec[rec.text == "kjv"].reset_index(drop=True), first, check_exact=True
    )
    assert [s["label"] for s in m["settings"]] == labels
    draws = {s["label"]: s["extra"]["draw"] for s in m["settings"] if "draw" in s.get("extra", {})}
    import tl_directional as tld

    for label, draw in draws.items():
        dist, seed = label.split(" seed=")
        assert draw == pytest.approx(
            tld.random_scales(len(draw), dist, seed=int(seed)).tolist(), abs=1e-11
        )
    assert (
        m["wanda"]["wanda"]["flipped_vs_wanda"] == 0.0
        and m["wanda"]["wanda-par"]["zero_fraction"] == 0.5
    )
    assert set(m["texts"]["code"]["setting_seconds"]) >= set(labels)
    # data from a dirty tree (as a smoke run in a working tree may be) are refused; clean ones build
    clean = m["commit"].replace("+dirty", "")
    for commit in (clean + "+dirty", clean):
        m["commit"] = commit
        for t in m["texts"].values():
            t["commit"] = commit
        (tmp_path / f"{stem}.manifest.json").write_text(json.dumps(m))
        if commit.endswith("+dirty"):
            with pytest.raises(page.InstrumentsDataError, match="dirty"):
                page.build_page(stem, tmp_path)
    text = page.build_page(stem, tmp_path)
    assert (
        "| M1 |" in text
        and "| R2g |" in text
        and "## (b) Component-weighted Wanda at 50% unstructured" in text
    )


def test_masked_weights_restore_the_model_exactly():
    run = _script("instruments_run")
    from tl_directional.compression.compressors import linear_weights
    from tl_directional.model.load import load_model

    model = load_model("default")
    lws = linear_weights(model)
    dense = {lw.name: lw.get() for lw in lws}
    gen = torch.Generator().manual_seed(0)
    mask = {k: torch.rand(v.shape, generator=gen) < 0.5 for k, v in dense.items()}
    with run.masked_weights(lws, dense, mask):
        for lw in lws:
            w = lw.get()
            assert bool((w[mask[lw.name]] == 0).all())
            assert torch.equal(w[~mask[lw.name]], dense[lw.name][~mask[lw.name]])
    for lw in lws:
        assert torch.equal(lw.get(), dense[lw.name])
