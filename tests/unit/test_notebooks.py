"""The notebooks in notebooks/ as files: committed without outputs, each a lesson (learning goals,
exercises with check cells, worked solutions in ``notebooks/solutions/``), and the rendered
real-model pages of lessons 05, 06 and 07 (``docs/notebooks/``, by ``notebooks/_render.py``) bounded.
Running each notebook top to bottom offline: tests/integration/test_notebooks_run.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
REQUIRED = ("01_tour", "02_editing_and_sweeps", "03_compression_diagnostics", "04_training_suppression",
            "05_directional_patching", "06_head_analysis", "07_directions")
LESSONS = REQUIRED  # every notebook is a lesson: goals, exercises with checks, what to try next
ROOT = Path(__file__).resolve().parents[2]
# rendered real-model pages of the lessons (docs/notebooks/), each with its <stem>_files/ figures
RENDERED = ("05_directional_patching", "06_head_analysis_smollm2-135m", "06_head_analysis_gemma-3-270m",
            "07_directions")
PAGE_LIMIT_BYTES = 2_000_000


def test_required_notebooks_exist():
    stems = {p.stem for p in NOTEBOOKS}
    assert set(REQUIRED) <= stems, f"missing: {set(REQUIRED) - stems}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    book = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(book["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs; strip them before committing"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"
    assert book["metadata"].get("kernelspec", {}).get("name") == "python3"


def _exercise_count(path: Path) -> int:
    book = json.loads(path.read_text(encoding="utf-8"))
    return sum("check_exercise(solutions," in "".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("stem", LESSONS)
def test_lesson_form(stem):
    """Learning goals, at least 3 exercises each with a check cell and a worked solution, and a
    'what to try next'."""
    path = ROOT / "notebooks" / f"{stem}.ipynb"
    book = json.loads(path.read_text(encoding="utf-8"))
    markdown = "\n".join("".join(c["source"]) for c in book["cells"] if c["cell_type"] == "markdown")
    assert "Learning goals" in markdown and "What to try next" in markdown
    n = _exercise_count(path)
    assert n >= 3, f"{stem}: {n} exercises with a check cell"
    for i in range(1, n + 1):
        assert f"**Exercise {i}.**" in markdown, f"{stem}: exercise {i} is not stated"
        assert any(f"answer_{i} = ..." in "".join(c["source"]) for c in book["cells"] if c["cell_type"] == "code"), \
            f"{stem}: exercise {i} has no answer cell left for the reader"
    solutions = (ROOT / "notebooks" / "solutions" / f"{stem[:2]}_solutions.py").read_text(encoding="utf-8")
    for i in range(1, n + 1):
        assert f"def solve_{i}(" in solutions and f"def expected_{i}(" in solutions


@pytest.mark.parametrize("stem", RENDERED)
def test_rendered_lesson_page(stem):
    """The rendered real-model pages: present, in the docs nav, bounded in size, no plotly.js,
    no machine paths, every figure they point to present."""
    page = ROOT / "docs" / "notebooks" / f"{stem}.md"
    text = page.read_text(encoding="utf-8")
    files = sorted((page.parent / f"{stem}_files").glob("*.svg"))
    assert files, f"{stem}: no figures"
    assert page.stat().st_size + sum(f.stat().st_size for f in files) < PAGE_LIMIT_BYTES
    for body in [text] + [f.read_text(encoding="utf-8") for f in files]:
        assert "Plotly.newPlot" not in body and "<script" not in body
        for marker in ("/work/", "/root/", "/home/", "/tmp/", "/Users/"):
            assert marker not in body, f"{stem}: machine path {marker!r} in the rendered page"
    for ref in re.findall(r"\]\(([^)]+\.svg)\)", text):
        assert (page.parent / ref).exists(), ref
    assert "Rendered run" in text and "notebooks/_render.py" in text
    assert f"notebooks/{stem}.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_render_draws_plotly_figures_as_static_svg():
    """notebooks/_render.py's figure_svg: numpy-encoded heatmap cells and scatter points are drawn,
    NaN cells are left out, and the SVG has no script."""
    import importlib.util

    import numpy as np
    import plotly.graph_objects as go

    spec = importlib.util.spec_from_file_location("_render", ROOT / "notebooks" / "_render.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    z = np.arange(12, dtype=float).reshape(3, 4)
    z[0, 0] = np.nan
    heat = go.Figure(go.Heatmap(z=z, x=list(range(4)), y=["L0", "L1", "L2"], colorscale="RdBu", zmid=0))
    fig = json.loads(heat.to_json())
    assert "bdata" in json.dumps(fig)  # plotly stores the array base64-encoded: the renderer decodes it
    svg = render.figure_svg(fig)
    cells = re.findall(r'<rect x="[\d.-]+" y="[\d.-]+" width="[\d.]+" height="[\d.]+" fill="rgb', svg)
    assert len(cells) >= 11 + 40 - 1  # 11 finite cells plus the colour bar's 40 steps (its first may match)
    assert "<script" not in svg and svg.startswith("<svg")
    line = json.loads(go.Figure(go.Scatter(x=[0, 1, 2], y=[0.5, 0.1, 0.9], mode="lines+markers", name="a")).to_json())
    svg = render.figure_svg(line)
    assert svg.count("<circle") == 3 and "<polyline" in svg
