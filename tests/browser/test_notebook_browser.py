"""Notebook outputs in mode "once" (tl_directional.figures.notebook_output) rendered in a real headless
Chromium, offline: the outputs of one kernel session are put on one page in order, as JupyterLab,
Notebook 7 and VS Code show a notebook, and every figure must be drawn although only the first
output carries each library. Also when a later output comes first (a front end that renders
outputs lazily): it waits for the library. Without Chromium these tests skip and say why."""

from __future__ import annotations

import re

import pytest

import tl_directional as tld
from tl_directional import views
from tl_directional.figures import notebook_output as nbo

from ._browser import chromium_path, run_chromium
from .test_report_browser import _Tree

CHROMIUM = chromium_path()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: install Debian's 'chromium' package (apt-get install -y chromium; .ci/run does) "
           "or set TLD_CHROMIUM to a Chromium/Chrome binary",
)
TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void."


@pytest.fixture(scope="module")
def outputs(tiny_model):
    """The notebook outputs of one kernel session: plotly, circuitsvis, then more of each."""
    model = tiny_model("gpt2")
    nbo._reset()
    previous = views.set_notebook_libraries("once")
    try:
        prof = tld.profile(model, [TEXT], progress=False)
        shown = [views.depth_profile(prof), views.colored_tokens(model, TEXT, 1, "attn", "par_frac"),
                 views.head_heatmaps(prof), views.attention_triptych(model, TEXT, 1, 0, max_tokens=10)]
        return [v._repr_html_() for v in shown]
    finally:
        views.set_notebook_libraries(previous)
        nbo._reset()


def _page(outs: list[str]) -> str:
    cells = "".join(f'<div class="jp-OutputArea-output">{o}</div>' for o in outs)
    return f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{cells}</body></html>'


def test_only_the_first_outputs_carry_the_libraries(outputs):
    assert [o.count('data-tld-lib="plotly"') for o in outputs] == [1, 0, 0, 0]
    assert [o.count('data-tld-lib="circuitsvis"') for o in outputs] == [0, 1, 0, 0]


def _drawn(dom: str) -> tuple[dict, dict]:
    tree = _Tree()
    tree.feed(dom)
    plots = {k: v for k, v in tree.roots.items() if k.startswith("tld-plotly-")}
    cvs = {k: v for k, v in tree.roots.items() if k.startswith("tld-cv-")}
    return plots, cvs


@needs_chromium
@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 3, 0, 1]], ids=["in-order", "later-outputs-first"])
def test_every_figure_is_drawn(outputs, order, tmp_path):
    page = tmp_path / "notebook.html"
    page.write_text(_page([outputs[i] for i in order]), encoding="utf-8")
    got = run_chromium(page, tmp_path / "chromium", mode="dom", height=3000)
    plots, cvs = _drawn(got["dom"])
    assert len(plots) == 2 and len(cvs) == 1 + 3
    for rid, desc in plots.items():
        assert any(t == "svg" and "main-svg" in c for t, c in desc), f"{rid}: plotly drew no svg"
    for rid, desc in cvs.items():
        assert len(desc) >= 3, f"{rid}: circuitsvis root left empty"
    assert '<p class="tld-missing"' not in got["dom"]  # no "library not loaded" note
    errors = [ln for ln in got["stderr"].splitlines() if "CONSOLE" in ln and ("Uncaught" in ln or "Error" in ln)]
    assert not errors, errors


@needs_chromium
def test_an_output_whose_carrier_is_gone_says_so(outputs, tmp_path):
    page = tmp_path / "cleared.html"
    page.write_text(_page([outputs[2]]), encoding="utf-8")  # a later plotly output alone
    got = run_chromium(page, tmp_path / "chromium", mode="dom", height=1200)
    note = re.search(r'<p class="tld-missing"[^>]*>([^<]*)</p>', got["dom"])
    assert note is not None, "no note in the output whose library never arrived"
    assert "needs plotly.js" in note.group(1) and 'set_notebook_libraries("inline")' in note.group(1)
    plots, _ = _drawn(got["dom"])
    assert plots and not any(t == "svg" for desc in plots.values() for t, _ in desc)
