"""studies/explore/ioi_attribution.py's statistics, on synthetic records: Spearman's rank correlation
against a hand-written one, and the summary's per-pair correlations, their mean and the library's
bootstrap interval over pairs. When the committed data exist, their summary is rebuilt from the
records (to 1e-6) and the manifest's sha256s hold."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
STEM = "ioi_attribution_smollm2-135m"


@pytest.fixture(scope="module")
def ioi():
    from studies.explore import ioi_attribution

    return ioi_attribution


def _ranks(x):
    """Average ranks (1-based), ties sharing the mean of their positions."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def test_spearman_equals_pearson_of_average_ranks(ioi):
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    x[:5] = 0.0  # ties
    want = np.corrcoef(_ranks(x), _ranks(y))[0, 1]
    assert abs(ioi.spearman(x, y) - want) < 1e-12
    assert ioi.spearman(x, x) == pytest.approx(1.0)
    assert ioi.spearman(x, -x) == pytest.approx(-1.0)
    assert np.isnan(ioi.spearman(np.zeros(5), np.arange(5)))


def test_summary_is_the_mean_of_per_pair_correlations_with_the_library_interval(ioi):
    from tl_directional import bootstrap_mean_interval

    rng = np.random.default_rng(1)
    rows = []
    for pair in range(5):
        for node in ioi.NODE_TYPES:
            for layer in range(6):
                est = {w: rng.normal() for w in ioi.PARTS}
                row = {"pair": pair, "node_type": node, "layer": layer, "pos": -1, "head": -1}
                row.update({f"est_{w}": v for w, v in est.items()})
                row.update({f"patch_{w}": v + 0.5 * rng.normal() for w, v in est.items()})
                rows.append(row)
    rec = pd.DataFrame(rows)
    summary = ioi.summarise(rec)
    assert len(summary) == len(ioi.NODE_TYPES) * len(ioi.PARTS)
    for r in summary.itertuples():
        sub = rec[rec.node_type == r.node_type]
        per_pair = [
            ioi.spearman(g[f"est_{r.part}"], g[f"patch_{r.part}"]) for _, g in sub.groupby("pair")
        ]
        assert r.pairs == 5 and r.nodes == 6
        assert r.spearman_mean == pytest.approx(np.mean(per_pair), abs=1e-12)
        lo, hi = bootstrap_mean_interval(np.array(per_pair), n_resamples=ioi.N_RESAMPLES, seed=0)
        assert (r.low, r.high) == (pytest.approx(float(lo)), pytest.approx(float(hi)))
        assert r.low <= r.spearman_mean <= r.high


def test_committed_data_rebuild(ioi):
    data = ROOT / "docs" / "results" / "data"
    mpath = data / f"{STEM}.manifest.json"
    if not mpath.is_file():
        pytest.skip(f"no committed {STEM} data (python -m studies.explore.ioi_attribution run)")
    manifest = json.loads(mpath.read_text())
    assert manifest["complete"] and "+dirty" not in manifest["commit"]
    for name, sha in manifest["files"].items():
        assert hashlib.sha256((data / name).read_bytes()).hexdigest() == sha, name
    rec = pd.read_csv(data / f"{STEM}.records.csv")
    got = ioi.summarise(rec)
    want = pd.read_csv(data / f"{STEM}.summary.csv")
    assert got[["node_type", "part", "nodes", "pairs"]].equals(
        want[["node_type", "part", "nodes", "pairs"]]
    )
    # the records are written to 10 significant digits: ranks of near-ties may move, so not bitwise
    cols = ["spearman_mean", "low", "high", "spearman_of_pair_means"]
    np.testing.assert_allclose(got[cols].to_numpy(), want[cols].to_numpy(), atol=1e-6)


def test_the_patching_page_quotes_the_committed_summary():
    """docs/sweeps.md's rank-correlation table says what the committed summary says (2 decimals)."""
    summary = ROOT / "docs" / "results" / "data" / f"{STEM}.summary.csv"
    if not summary.is_file():
        pytest.skip(f"no committed {STEM} data")
    want = pd.read_csv(summary)
    page = (ROOT / "docs" / "sweeps.md").read_text()
    rows = {ln.split("|")[1].strip().split("`")[1]: ln for ln in page.splitlines() if ln.startswith("| `")}
    for node, grp in want.groupby("node_type"):
        cells = [c.strip() for c in rows[node].strip("|").split("|")[2:]]
        for cell, part in zip(cells, ("full", "par", "perp"), strict=True):
            r = grp[grp.part == part].iloc[0]
            assert cell == f"{r.spearman_mean:.2f} [{r.low:.2f}, {r.high:.2f}]", (node, part)
