"""The compression claims pages (claim 3, protocol sec. 6) are a pure function of the committed
data (docs/results/data/compression_*): rebuilt here byte for byte; a corrupt or missing data file
or a hand-edited page is refused with an error that names the file, and no page is written."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from studies import pages as page_writer
from studies.compression import layout
from tests.studies._sandbox import redirect


@pytest.fixture(scope="module")
def comp():
    """The compression study's data layout and the page writer restricted to its pages."""
    return SimpleNamespace(DATA=layout.DATA, PAGES=layout.PAGES, load_data=lambda stem: layout.load_data(stem),
                           merge=lambda into, other: layout.merge(into, other),
                           write_data=lambda *a: layout.write_data(*a),
                           build=lambda check: page_writer.build(check, groups=("compression",)))


def _stems(comp):
    return sorted(p.name[: -len(".manifest.json")] for p in comp.DATA.glob("compression_*.manifest.json"))


def test_committed_pages_rebuild_byte_identical(comp, capsys):
    assert _stems(comp), "no compression data committed under docs/results/data/"
    rc = comp.build(check=True)
    assert rc == 0, capsys.readouterr().err


@pytest.fixture
def sandbox(comp, tmp_path, monkeypatch):
    """A copy of one run's data and its page, with the page writer pointed at it."""
    stem = _stems(comp)[0]
    data, pages = tmp_path / "data", tmp_path / "pages"
    data.mkdir()
    pages.mkdir()
    for p in comp.DATA.glob(f"{stem}.*"):
        shutil.copy(p, data / p.name)
    shutil.copy(comp.PAGES / f"claims_{stem}.md", pages / f"claims_{stem}.md")
    redirect(monkeypatch, data, pages, tmp_path)
    return stem, data, pages


def test_sandbox_rebuilds(comp, sandbox):
    assert comp.build(check=True) == 0


@pytest.mark.parametrize("kind", ["records", "layers"])
def test_corrupt_data_file_is_named_and_no_page_written(comp, sandbox, capsys, kind):
    stem, data, pages = sandbox
    f = data / f"{stem}.{kind}.csv"
    f.write_bytes(f.read_bytes().replace(b"\n", b"\n0", 1))
    page = pages / f"claims_{stem}.md"
    page.unlink()  # a build that fails must not write it back
    assert comp.build(check=False) == 2
    err = capsys.readouterr().err
    assert f"{stem}.{kind}.csv" in err and "sha256" in err
    assert not page.exists()


def test_corrupt_data_file_leaves_the_old_page(comp, sandbox, capsys):
    stem, data, pages = sandbox
    f = data / f"{stem}.records.csv"
    f.write_bytes(f.read_bytes()[:-100])
    before = (pages / f"claims_{stem}.md").read_bytes()
    assert comp.build(check=False) == 2
    assert f"{stem}.records.csv" in capsys.readouterr().err
    assert (pages / f"claims_{stem}.md").read_bytes() == before


def test_missing_data_file_is_named(comp, sandbox, capsys):
    stem, data, _ = sandbox
    (data / f"{stem}.layers.csv").unlink()
    assert comp.build(check=True) == 2
    assert f"{stem}.layers.csv" in capsys.readouterr().err


def test_corrupt_manifest_is_named(comp, sandbox, capsys):
    stem, data, _ = sandbox
    (data / f"{stem}.manifest.json").write_text("{not json")
    assert comp.build(check=True) == 2
    assert f"{stem}.manifest.json" in capsys.readouterr().err


def test_data_from_another_model_is_refused(comp, sandbox, capsys):
    stem, data, _ = sandbox
    mpath = data / f"{stem}.manifest.json"
    m = json.loads(mpath.read_text())
    m["model"]["source_sha256"] = "0" * 64
    mpath.write_text(json.dumps(m))
    assert comp.build(check=True) == 2
    assert "another model" in capsys.readouterr().err


def test_hand_edited_page_fails_the_check(comp, sandbox, capsys):
    stem, _, pages = sandbox
    page = pages / f"claims_{stem}.md"
    page.write_text(page.read_text().replace("Spearman", "Pearson", 1))
    assert comp.build(check=True) == 1
    assert f"claims_{stem}.md" in capsys.readouterr().err


def test_merge_of_a_split_run_gives_the_same_results(comp, sandbox):
    """A run split over two processes (two parts of the grid) and joined by ``merge`` builds the
    same tables as one run; the page then lists both runs."""
    stem, data, pages = sandbox
    m, rec, lay = comp.load_data(stem)
    first = [s["label"] for s in m["settings"]][: len(m["settings"]) // 2]
    before = (pages / f"claims_{stem}.md").read_text()
    for name, keep in ((stem, True), (f"{stem}_b", False)):
        part = dict(m, settings=[s for s in m["settings"] if (s["label"] in first) == keep])
        comp.write_data(name, rec[rec.setting.isin(first) == keep], lay[lay.setting.isin(first) == keep], part)
    assert comp.merge(stem, f"{stem}_b") == 0
    assert not list(data.glob(f"{stem}_b.*"))
    assert comp.build(check=False) == 0
    after = (pages / f"claims_{stem}.md").read_text()
    assert "Runs (2 processes" in after
    assert after.split("## Verdict", 1)[1] == before.split("## Verdict", 1)[1]
