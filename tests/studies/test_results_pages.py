"""Every results page is a pure function of the committed data (docs/results/data/): rebuilt
here byte for byte (``python -m studies build --check``, the page writer :mod:`studies.pages`),
and a corrupt data file, data from another model or a hand-edited page is refused with an error
that names the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from studies import pages as page_writer
from studies.claims import data as claims_data
from studies.training import page as training_page
from tests.studies._sandbox import redirect

ROOT = Path(__file__).resolve().parents[2]
DATA, PAGES = claims_data.DATA, claims_data.PAGES


@pytest.fixture(scope="module")
def claims():
    """The page writer (``build(check)``) and the real data folder (``DATA``, ``PAGES``)."""
    return page_writer


def _stems(claims):
    return sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("claims_*.manifest.json"))


def test_committed_pages_rebuild_byte_identical(claims):
    """``python -m studies build --check`` (the command ``make results`` runs without ``--check``)
    passes on the checkout: every page and marker block is byte for byte what the data build."""
    assert _stems(claims), "no claims data committed under docs/results/data/"
    proc = subprocess.run([sys.executable, "-m", "studies", "build", "--check"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _redirect(monkeypatch, data: Path, pages: Path, root: Path) -> None:
    """:func:`tests.studies._sandbox.redirect`, with the compression runs copied into the sandbox
    too (the page writer builds their pages as well)."""
    for p in DATA.glob("compression_*"):
        shutil.copy(p, data / p.name)
    for p in PAGES.glob("claims_compression_*.md"):
        shutil.copy(p, pages / p.name)
    redirect(monkeypatch, data, pages, root)


@pytest.fixture
def sandbox(claims, tmp_path, monkeypatch):
    """A copy of one run's data and its page, with the page writer pointed at it."""
    stem = _stems(claims)[0]
    data, pages = tmp_path / "data", tmp_path / "pages"
    data.mkdir()
    pages.mkdir()
    for p in DATA.glob(f"{stem}.*"):
        shutil.copy(p, data / p.name)
    shutil.copy(PAGES / f"{stem}.md", pages / f"{stem}.md")
    _redirect(monkeypatch, data, pages, tmp_path)
    return stem, data, pages


def test_sandbox_rebuilds(claims, sandbox):
    assert claims.build(check=True) == 0


def test_corrupt_data_file_is_named_and_no_page_written(claims, sandbox, capsys):
    stem, data, pages = sandbox
    rec = data / f"{stem}.records.csv"
    rec.write_bytes(rec.read_bytes().replace(b"\n", b"\n0", 1))
    before = (pages / f"{stem}.md").read_bytes()
    assert claims.build(check=False) == 2
    err = capsys.readouterr().err
    assert f"{stem}.records.csv" in err and "sha256" in err
    assert (pages / f"{stem}.md").read_bytes() == before


def test_missing_data_file_is_named(claims, sandbox, capsys):
    stem, data, _ = sandbox
    (data / f"{stem}.profile.csv").unlink()
    assert claims.build(check=True) == 2
    assert f"{stem}.profile.csv" in capsys.readouterr().err


def test_data_from_another_model_is_refused(claims, sandbox, capsys):
    stem, data, _ = sandbox
    mpath = data / f"{stem}.manifest.json"
    m = json.loads(mpath.read_text())
    m["model"]["source_sha256"] = "0" * 64
    mpath.write_text(json.dumps(m))
    assert claims.build(check=True) == 2
    assert "another model" in capsys.readouterr().err


def test_hand_edited_page_fails_the_check(claims, sandbox, capsys):
    stem, _, pages = sandbox
    page = pages / f"{stem}.md"
    page.write_text(page.read_text().replace("held", "hold", 1))
    assert claims.build(check=True) == 1
    assert f"{stem}.md" in capsys.readouterr().err


def _run_sandbox(claims, tmp_path, monkeypatch, kind: str, page_prefix: str = ""):
    """A copy of one claims run and the first ``kind_*`` run, with the page writer pointed at it."""
    runs = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob(f"{kind}_*.manifest.json"))
    assert runs, f"no {kind} data committed under docs/results/data/"
    data, pages = tmp_path / "docs" / "results" / "data", tmp_path / "docs" / "results"
    data.mkdir(parents=True)
    stem = _stems(claims)[0]
    for s, page in ((stem, stem), (runs[0], page_prefix + runs[0])):
        for p in DATA.glob(f"{s}.*"):
            shutil.copy(p, data / p.name)
        shutil.copy(PAGES / f"{page}.md", pages / f"{page}.md")
    _redirect(monkeypatch, data, pages, tmp_path)
    return runs[0], data, pages


@pytest.fixture
def depth_sandbox(claims, tmp_path, monkeypatch):
    """A claims run and one depth run (claim D)."""
    return _run_sandbox(claims, tmp_path, monkeypatch, "depth")


def test_depth_pages_rebuild_and_a_corrupt_file_is_named(claims, depth_sandbox, capsys):
    stem, data, pages = depth_sandbox
    assert claims.build(check=True) == 0, capsys.readouterr().err
    rec = data / f"{stem}.records.csv"
    rec.write_bytes(rec.read_bytes().replace(b"\n", b"\n0", 1))
    before = (pages / f"{stem}.md").read_bytes()
    assert claims.build(check=False) == 2
    err = capsys.readouterr().err
    assert f"{stem}.records.csv" in err and "sha256" in err
    assert (pages / f"{stem}.md").read_bytes() == before


def test_depth_data_from_another_model_is_refused(claims, depth_sandbox, capsys):
    stem, data, _ = depth_sandbox
    mpath = data / f"{stem}.manifest.json"
    m = json.loads(mpath.read_text())
    m["model"]["source_sha256"] = "0" * 64
    mpath.write_text(json.dumps(m))
    assert claims.build(check=True) == 2
    assert "another model" in capsys.readouterr().err


@pytest.fixture
def training_sandbox(claims, tmp_path, monkeypatch):
    """A claims run and the training run (claim 4)."""
    return _run_sandbox(claims, tmp_path, monkeypatch, "training", page_prefix="claims_")


def test_training_page_rebuilds_and_a_corrupt_file_is_named(claims, training_sandbox, capsys):
    stem, data, pages = training_sandbox
    assert claims.build(check=True) == 0, capsys.readouterr().err
    final = data / f"{stem}.final.csv"
    final.write_bytes(final.read_bytes().replace(b"\n", b"\n0", 1))
    before = (pages / f"claims_{stem}.md").read_bytes()
    assert claims.build(check=False) == 2
    err = capsys.readouterr().err
    assert f"{stem}.final.csv" in err and "sha256" in err
    assert (pages / f"claims_{stem}.md").read_bytes() == before


def test_training_verdict_follows_the_protocol_rule():
    tc = training_page
    assert tc.verdict({"ci95_low": -0.03, "ci95_high": -0.01}) == "**held**"
    assert tc.verdict({"ci95_low": 0.01, "ci95_high": 0.03}) == "**failed**"
    assert tc.verdict({"ci95_low": -0.01, "ci95_high": 0.03}) == "**not decided**"
    assert tc.verdict(None).startswith("not decided")
