"""The docs site: it builds strictly, documents every public name, and its code runs (the checks
that need neither the doc toolchain nor a model: tests/unit/test_docs_static.py).

* The strict build needs the doc toolchain (``pip install -r docs/requirements.txt``); without
  it those tests skip and say so.
* The pages' ```python blocks run on a tiny seeded GPT-2 (``tiny_model_dir("gpt2")``) in place
  of the default model (``DEFAULT_MODEL_PAGES``, whose code names the bundled model's layers,
  heads and single-token words, run on that model, as written): ``docs/run_snippets.py`` swaps the value of each page's single
  ``MODEL = "default"`` line. The claims the pages make in words (exact no-op at scale 1,
  halving exactly the perpendicular part, ...) are checked on that model's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tl_directional
from tests.unit.test_docs_static import (
    DEFAULT_MODEL_PAGES,
    DOCS,
    ROOT,
    RUN_PAGES,
    doc_hooks,
    snippets,
)

# -- the strict build --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -r docs/requirements.txt")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's end-of-life banner, not a warning
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_site_builds_strictly(site):
    for page in ("index.html", "quickstart/index.html", "method/index.html", "api/index.html",
                 "api/edit/index.html", "search/search_index.json"):
        assert (site / page).is_file(), page


def test_every_public_name_is_documented_in_the_built_api_reference(site):
    api = site / "api"
    html = "\n".join(p.read_text(encoding="utf-8") for p in api.rglob("*.html"))
    index = (api / "index.html").read_text(encoding="utf-8")
    for name in tl_directional.__all__:
        assert f'id="{doc_hooks.PACKAGE}.{name}"' in html, f"tl_directional.{name} has no entry in the API reference"
        assert f"<code>{name}</code>" in index, f"tl_directional.{name} is missing from api/index's list"
    errors = (api / "errors" / "index.html").read_text(encoding="utf-8")
    assert "SiteResolutionError" in errors and "ArtefactError" in errors, "the errors table is not filled in"


# -- the pages' code ---------------------------------------------------------------------------



@pytest.fixture
def run_docs_page(tiny_model_dir, tmp_path, monkeypatch):
    """Run a page's python blocks (in a scratch directory) on the tiny GPT-2."""
    monkeypatch.chdir(tmp_path)

    def run(page: str) -> list[str]:
        return snippets.run_page(DOCS / page, model=str(tiny_model_dir("gpt2")))

    return run


def test_quickstart_runs_on_a_tiny_model(run_docs_page):
    outputs = run_docs_page("quickstart.md")
    assert "Profile(" in outputs[1] and "attn_energy_ratio" in outputs[1]
    assert "baseline loss" in outputs[3] and "V-Para removal" in outputs[3]
    # the page says this edit halves exactly the perpendicular part and leaves the parallel part
    assert "edited / plain: 0.5000" in outputs[4] and "edited / plain: 1.0000" in outputs[4]


@pytest.mark.parametrize("page", [p for p in RUN_PAGES if p != "quickstart.md"])
def test_page_code_runs_on_a_tiny_model(run_docs_page, page):
    out = "".join(run_docs_page(page))
    claims = {
        "method.md": ["delta form is bit-exact: True"],
        "edit.md": ["scale 1 is exact: True", "positions 0-3 unchanged: True", "position 4 changed:      True",
                    "per-head tensor == scoped scalar: True", "8 new tokens"],
        "measure.md": [" hooks; True", "['manifest.json', 'metadata.json', 'residual.parquet', 'tokens.parquet', 'value.parquet', 'value_tokens.parquet']"],
    }
    for claim in claims.get(page, []):
        assert claim in out, f"{page}: expected {claim!r} in the output"


@pytest.mark.parametrize("page", DEFAULT_MODEL_PAGES)
def test_page_code_runs_as_written_on_the_bundled_model(tmp_path, monkeypatch, page):
    """Issue 47: docs/sweeps.md's snippets never defined their inputs and named heads and layers
    the bundled model does not have, and neither it nor lm_eval.md ran in the suite; every block
    now runs as written, in order (compression.md and views.md run on the tiny model above)."""
    if page == "lm_eval.md":
        pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'tl-directional[hf]')")
    if page == "hf_training.md":
        pytest.importorskip("accelerate", reason="Trainer needs accelerate (pip install 'tl-directional[hf]')")
    monkeypatch.chdir(tmp_path)
    outputs = snippets.run_page(DOCS / page)
    assert len(outputs) == len(snippets.python_blocks((DOCS / page).read_text(encoding="utf-8")))
    claims = {  # what the pages say in words, checked on the output
        "hf_training.md": ["V-Para removal moves the logits: True", "unedited after remove(): True",
                           "step 2: s_par 0.50", "2 global steps"],
    }
    out = "".join(outputs)
    for claim in claims.get(page, []):
        assert claim in out, f"{page}: expected {claim!r} in the output"
