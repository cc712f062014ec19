"""The notebooks in notebooks/: committed without outputs, and each runs top to bottom offline.

Execution uses nbclient with a kernel of the interpreter running the tests (a temporary
kernelspec whose ``argv`` is ``sys.executable -m ipykernel_launcher``, found first through
``JUPYTER_PATH``, so a ``python3`` kernelspec installed elsewhere cannot substitute another
Python; ipykernel must be installed: the ``dev`` extra has it), in a scratch directory, with the
test process's environment (so offline flags and ``PYTHONPATH`` carry over). The notebooks run on
the TransformerLens 4 bridge lane only; the legacy lane skips them (same code, twice the CI time).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tl_directional.models import tl_lane

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
REQUIRED = ("01_tour", "02_editing_and_sweeps", "03_compression_diagnostics", "04_training_suppression")
CELL_TIMEOUT_S = 600
KERNEL_NAME = "tl-directional-tests"


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


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    if tl_lane() != "bridge":
        pytest.skip("notebooks are executed on the TransformerLens 4 bridge lane only")
    nbformat = pytest.importorskip("nbformat", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    nbclient = pytest.importorskip("nbclient", reason="install the dev extra (nbformat, nbclient, ipykernel)")
    pytest.importorskip("ipykernel", reason="install the dev extra (ipykernel provides the python3 kernel)")
    book = nbformat.read(path, as_version=4)
    env_path = os.pathsep.join(p for p in (str(path.parent.parent), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", env_path)  # the kernel inherits the environment
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "1")
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
        from tl_directional.report import external_references

        assert external_references(o["data"]["text/html"]) == []
    print(f"{path.name}: {seconds:.1f} s")
