"""Each notebook in notebooks/ runs top to bottom offline (their form as files:
tests/unit/test_notebooks.py).

Execution uses nbclient with a kernel of the interpreter running the tests (a temporary
kernelspec whose ``argv`` is ``sys.executable -m ipykernel_launcher``, found first through
``JUPYTER_PATH``, so a ``python3`` kernelspec installed elsewhere cannot substitute another
Python; ipykernel must be installed: the ``dev`` extra has it), in a scratch directory, with the
test process's environment (so offline flags and ``PYTHONPATH`` carry over). The notebooks run on
the TransformerLens 4 bridge lane; the legacy lane skips them (same code, twice the CI time), except
the lessons in ``BOTH_LANES`` (lesson 7), which run on both.

Every notebook is a lesson (learning goals, exercises with check cells, worked solutions in
``notebooks/solutions/``). CI sets ``TLD_LESSON_SOLVE=1``, so each exercise takes its worked
solution and its check cell must pass. Lessons 05 and 06 switch model with
``TLD_NOTEBOOK_MODEL``; CI removes it, so they run on the bundled default model. Their real-model runs are
rendered to ``docs/notebooks/`` by ``notebooks/_render.py`` (bounded in tests/unit/test_notebooks.py).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from tests.unit.test_notebooks import LESSONS, NOTEBOOKS, _exercise_count

CELL_TIMEOUT_S = 600
KERNEL_NAME = "tl-directional-tests"


# Lessons also executed on the legacy lane: lesson 7 reads an SAE from its saved weights and adds a
# steering vector, code that takes a different route per lane (about 15 s on the bundled model).
BOTH_LANES = ("07_directions",)


def _lane_marks(path):
    # every other notebook on the TL 4 bridge lane only (same code, twice the CI time)
    return [] if path.stem in BOTH_LANES else [pytest.mark.bridge]


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=_lane_marks(p)) for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    nbclient = pytest.importorskip("nbclient", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    pytest.importorskip("ipykernel", reason="install the dev extra (ipykernel provides the python3 kernel)")
    book = nbformat.read(path, as_version=4)
    env_path = os.pathsep.join(p for p in (str(path.parent.parent), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel inherits the environment
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.delenv("TLD_NOTEBOOK_MODEL", raising=False)  # lessons: the bundled default model
    monkeypatch.setenv("TLD_LESSON_SOLVE", "1")  # unanswered exercises take their worked solutions
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"tl-directional tests ({sys.executable})", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    work = tmp_path / "work"
    work.mkdir()
    client = nbclient.NotebookClient(book, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL_NAME,
                                     resources={"metadata": {"path": str(work)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    html_outputs = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", [])
                    if "text/html" in o.get("data", {})]
    assert html_outputs, "no rich output: the views did not display"
    for o in html_outputs:  # offline by construction: nothing in a displayed view points off the machine
        from tl_directional.views.report import external_references

        assert external_references(o["data"]["text/html"]) == []
    if path.stem in LESSONS:  # every exercise's check cell ran and passed
        printed = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                          for o in c.get("outputs", []) if o.get("output_type") == "stream")
        n = _exercise_count(path)
        assert all(f"exercise {i}: correct" in printed for i in range(1, n + 1)), printed[-2000:]
    print(f"{path.name}: {seconds:.1f} s")
