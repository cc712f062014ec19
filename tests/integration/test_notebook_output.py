"""Notebook outputs carry plotly.js and circuitsvis once per notebook (tl_directional.figures.notebook_output):
a notebook of 20 figures saved with its outputs stays small, later outputs refer to the library the
first one loaded, and mode "inline" keeps the per-output libraries. Rendering in a real browser:
tests/browser/test_notebook_browser.py."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tl_directional.figures import notebook_output as nbo
from tl_directional.views.report import external_references

N_FIGURES = 20
KERNEL_NAME = "tl-directional-tests"
# 20 cells, each displaying one view: plotly and circuitsvis, tables in and model runs
SETUP = """
import tl_directional as tld
from tl_directional import views
from tl_directional.model.load import load_model
model = load_model("default")
text = "In the beginning God created the heaven and the earth. And the earth was without form, and void."
prof = tld.profile(model, [text], progress=False)
"""
FIGURES = [
    "views.depth_profile(prof)",
    "views.head_heatmaps(prof)",
    "views.colored_tokens(model, text, 1, 'attn', 'par_frac')",
    "views.attention_triptych(model, text, 1, 0, max_tokens=12)",
    "views.attention_triptych_figure(model, text, 1, 0, max_tokens=12)",
]


def _lib_count(page: str, lib: str) -> int:
    return page.count(f'data-tld-lib="{lib}"')


def build_notebook(path, tmp_path, monkeypatch, *, setup: str = SETUP, cells=None):
    """Execute a notebook of ``SETUP`` + 20 figure cells with nbclient (a kernel of this
    interpreter, as tests/integration/test_notebooks_run.py does), save it with its outputs."""
    nbformat = pytest.importorskip("nbformat", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    nbclient = pytest.importorskip("nbclient", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    pytest.importorskip("ipykernel", reason="install the dev extra (ipykernel provides the python3 kernel)")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TLD_NOTEBOOK_LIBRARIES", raising=False)
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"tl-directional tests ({sys.executable})", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    cells = cells if cells is not None else [FIGURES[i % len(FIGURES)] for i in range(N_FIGURES)]
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(setup)] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbclient.NotebookClient(book, timeout=600, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(book, str(path))
    outputs = [o["data"]["text/html"] for c in book.cells[1:] for o in c.get("outputs", [])
               if "text/html" in o.get("data", {})]
    errors = [o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return outputs


@pytest.mark.slow
@pytest.mark.bridge  # a kernel per run: once on the TL 4 bridge lane, as the notebooks themselves
def test_twenty_figures_saved_with_outputs_are_under_10_mb(tmp_path, monkeypatch):
    path = tmp_path / "twenty.ipynb"
    outputs = build_notebook(path, tmp_path, monkeypatch)
    size = path.stat().st_size
    print(f"{N_FIGURES} figures, saved with outputs: {size / 1e6:.2f} MB")
    assert len(outputs) == N_FIGURES
    assert size < 10e6, f"{size / 1e6:.1f} MB"
    for lib in ("plotly", "circuitsvis"):
        carriers = [i for i, o in enumerate(outputs) if _lib_count(o, lib)]
        users = [i for i, o in enumerate(outputs) if re.search(rf'data-tld-needs="[^"]*\b{lib}\b', o)]
        assert carriers == users[:1], (lib, carriers, users[:3])  # the first output that needs it carries it
        glob = {"plotly": "Plotly", "circuitsvis": "CircuitsVis"}[lib]
        for i in users[1:]:  # later ones: no library, the loader waits for the first one's global
            assert _lib_count(outputs[i], lib) == 0 and len(outputs[i]) < 200_000
            assert f'globals = ["{glob}"' in outputs[i] or f'"{glob}"]' in outputs[i]
            assert outputs[i].count(f'type="{nbo.DEFERRED_TYPE}"') >= 1
    for o in outputs:
        assert external_references(o) == []


# -- the mode switch and the carrying rule, without a kernel -------------------------------------


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv("TLD_NOTEBOOK_LIBRARIES", raising=False)
    nbo._reset()
    yield
    nbo._reset()


def test_inline_mode_is_the_per_output_behaviour(fresh):
    body = '<div id="x"></div><script type="text/javascript">Plotly.newPlot("x", [], {});</script>'
    assert nbo.set_notebook_libraries("inline") == "once"
    outs = [nbo.notebook_html(["plotly"], body) for _ in range(3)]
    assert all(_lib_count(o, "plotly") == 1 and o.endswith(body) for o in outs)


def test_once_mode_first_carries_later_refer(fresh):
    body = '<div id="x"></div><script type="text/javascript">Plotly.newPlot("x", [], {});</script>'
    first, second = nbo.notebook_html(["plotly"], body), nbo.notebook_html(["plotly"], body)
    assert _lib_count(first, "plotly") == 1 and _lib_count(second, "plotly") == 0
    assert 'data-tld-needs="plotly"' in second and "window.__tldWaiting" in second
    assert '<script type="text/x-tld-deferred">Plotly.newPlot("x", [], {});</script>' in second
    mixed = nbo.notebook_html(["plotly", "circuitsvis"], body)  # circuitsvis not carried yet
    assert _lib_count(mixed, "circuitsvis") == 1 and _lib_count(mixed, "plotly") == 0
    assert nbo.notebook_html([], "<p>plain</p>") == "<p>plain</p>"


def test_rerunning_the_carrying_cell_carries_again(fresh):
    # (cell id, execution count): the first output of cell A carries; a second output in the same
    # run of A does not; A run again (new count) carries again; another cell never does
    assert nbo._carries("plotly", ("A", 1)) and not nbo._carries("plotly", ("A", 1))
    assert not nbo._carries("plotly", ("B", 2))
    assert nbo._carries("plotly", ("A", 3)) and not nbo._carries("plotly", ("B", 4))
    assert not nbo._carries("plotly", (None, 5))


def test_deferral_changes_opening_tags_only(fresh):
    data = '{"tok": "<script>alert(1)<\\/script>"}'
    body = f"<script type='text/javascript' id=\"a\">var d = {data};</script><p>x</p><SCRIPT>f()</SCRIPT>"
    out = nbo._defer(body)
    assert out == (f'<script type="{nbo.DEFERRED_TYPE}" id="a">var d = {data};</script><p>x</p>'
                   f'<script type="{nbo.DEFERRED_TYPE}">f()</SCRIPT>')


def test_mode_from_the_environment_and_bad_values(fresh, monkeypatch):
    monkeypatch.setenv("TLD_NOTEBOOK_LIBRARIES", "inline")
    assert nbo.notebook_libraries() == "inline"
    monkeypatch.setenv("TLD_NOTEBOOK_LIBRARIES", "twice")
    with pytest.raises(ValueError, match=r"TLD_NOTEBOOK_LIBRARIES='twice': choose one of once, inline"):
        nbo.notebook_libraries()
    with pytest.raises(ValueError, match=r"mode='all': choose one of once, inline"):
        nbo.set_notebook_libraries("all")


def test_reports_and_views_share_the_carried_library(fresh):
    import pandas as pd

    from tl_directional import views
    from tl_directional.figures.page import Report

    curves = pd.DataFrame({"variant": ["baseline"] * 3, "seed": 0, "step": [0, 10, 20], "val_loss": [6.0, 5.1, 4.8]})
    rep = Report("r").add(views.training_curves(curves))
    first, view_out = rep._repr_html_(), views.training_curves(curves)._repr_html_()
    assert _lib_count(first, "plotly") == 1 and _lib_count(view_out, "plotly") == 0
    assert "Plotly.newPlot(" in view_out and external_references(view_out) == []
