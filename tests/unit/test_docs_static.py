"""The docs, read as files (no doc toolchain, no model): every public name gets an API page, the
API pages and the nav name what exists, the pages whose code runs have one ``MODEL`` line to
swap, and every test the docs cite (``tests/<folder>/test_x.py::test_name``) exists (the strict
build and the pages' code: tests/integration/test_docs.py)."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import tl_directional

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN_PAGES = ("index.md", "quickstart.md", "method.md", "measure.md", "edit.md", "compression.md", "views.md")
# pages whose code names layers, heads and single-token words of the bundled model (or loads it
# itself): run on it, as written
DEFAULT_MODEL_PAGES = ("sweeps.md", "lm_eval.md")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snippets = _load("tl_directional_docs_run_snippets", DOCS / "run_snippets.py")
doc_hooks = _load("tl_directional_docs_hooks", DOCS / "hooks.py")


def _resolve(path: str):
    """The object a ``::: path`` directive renders (import the longest module prefix, then
    follow attributes); AssertionError naming the directive when it does not exist."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"'::: {path}': {'.'.join(parts[:cut])} has no attribute {attr!r}"
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"'::: {path}' names no importable module")


# -- without the doc toolchain -----------------------------------------------------------------


def test_every_public_name_is_rendered_on_an_api_page():
    """The reference documents the face: each name of ``tl_directional.__all__`` is rendered by a
    page under docs/api (``::: tl_directional.<name>``), and the index lists it under that page."""
    where = doc_hooks.rendered_names()
    missing = [n for n in tl_directional.__all__ if n not in where]
    assert not missing, (
        f"public names with no API entry: {missing}; add '::: tl_directional.<name>' to the page of "
        "its job under docs/api"
    )


def test_rendered_names_reads_members_options(tmp_path):
    """The index's grouping follows the directives: a face name, and a member listed under a
    rendered face module, each map to their page; a name on no page is an error of the build."""
    (tmp_path / "a.md").write_text("# A\n\n::: tl_directional.profile\n", encoding="utf-8")
    (tmp_path / "b.md").write_text(
        "# B\n\n::: tl_directional.training\n    options:\n      members: [train, TrainConfig]\n",
        encoding="utf-8")
    assert doc_hooks.rendered_names(tmp_path) == {
        "profile": "a.md", "training": "b.md", "training.train": "b.md", "training.TrainConfig": "b.md"}


def test_api_pages_render_existing_objects():
    """Every ``:::`` directive of the reference names an object that exists, and the reference
    has no page per internal module (extension points are named objects, not modules' dumps)."""
    pages = doc_hooks.api_pages()
    for directives in pages.values():
        for path in directives:
            _resolve(path)
    assert len(pages) <= 16, f"{len(pages)} API pages: the reference is one page per job, not per module"


def test_every_error_class_is_in_the_errors_table():
    """Each class under the error base appears in the errors page's table (griffe, no import of
    torch), and the table holds nothing else."""
    import pkgutil

    pytest = importlib.import_module("pytest")
    pytest.importorskip("griffe")
    listed = {path.rsplit(".", 1)[-1] for path, _, _ in doc_hooks.error_classes()}
    imported = set()
    for info in pkgutil.walk_packages(tl_directional.__path__, "tl_directional."):
        if info.name.startswith("tl_directional.cli") or ".lm_eval" in info.name or "hf_callback" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and obj.__module__ == info.name
                    and issubclass(obj, tl_directional.TLDirectionalError) and obj is not tl_directional.TLDirectionalError):
                imported.add(name)
    assert imported <= listed, f"error classes missing from docs/api/errors.md's table: {sorted(imported - listed)}"


def test_nav_pages_exist():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = re.findall(r":\s*([\w/.-]+\.md)\s*$", text, re.M)
    assert "quickstart.md" in pages and "api/index.md" in pages
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"


def test_pages_that_swap_the_model_have_exactly_one_model_line():
    for page in RUN_PAGES + DEFAULT_MODEL_PAGES:
        text = (DOCS / page).read_text(encoding="utf-8")
        assert len(snippets.MODEL_LINE.findall(text)) == (0 if page in ("method.md", "lm_eval.md") else 1), page
        assert snippets.python_blocks(text), f"{page} has no python blocks to run"


# the files that cite tests by path; a moved or renamed test must take its citations with it
CITING = ["README.md", "Makefile", ".ci/run", "pyproject.toml", "mkdocs.yml", "constraints/*.txt",
          "docs/**/*.md", "docs/*.py", "notebooks/*.md", "notebooks/*.py", "benchmarks/**/*.py",
          "studies/**/*.py", "tl_directional/**/*.py", "tests/**/*.py"]
CITATION = re.compile(r"\btests/((?:[\w-]+/)*[\w-]+\.py)(?:::(\w+))?")


def test_every_test_the_docs_cite_exists():
    """Each ``tests/...py`` named in the docs, README, build files, notebooks, studies and the
    package exists, and each ``::test_name`` is defined in that file."""
    files = sorted({p for pattern in CITING for p in ROOT.glob(pattern) if p.is_file()})
    cited = []
    for path in files:
        for m in CITATION.finditer(path.read_text(encoding="utf-8")):
            cited.append((path.relative_to(ROOT).as_posix(), m.group(1), m.group(2)))
    assert len({c[1] for c in cited}) >= 20, f"too few citations found ({len(cited)}): is CITATION right?"
    bad = []
    for where, rel, name in cited:
        target = ROOT / "tests" / rel
        if not target.is_file():
            bad.append(f"{where}: tests/{rel} does not exist")
        elif name and not re.search(rf"^(?:async )?def {name}\(", target.read_text(encoding="utf-8"), re.M):
            bad.append(f"{where}: tests/{rel} defines no {name}")
    assert not bad, "citations of tests that are not there (fix the path):\n" + "\n".join(bad)


def test_the_cli_pages_help_copy_is_the_real_help(monkeypatch, capsys):
    """docs/cli.md quotes ``COLUMNS=100 tl-directional --help``: the quote must be what the
    command prints today (it once lacked a command)."""
    from tl_directional.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["--help"])
    real = capsys.readouterr().out.rstrip("\n")
    page = (ROOT / "docs" / "cli.md").read_text()
    quoted = re.search(r"```text\n(usage: tl-directional \[-h\].*?)\n```", page, re.S)
    assert quoted, "docs/cli.md has no quoted `tl-directional --help`"
    assert quoted.group(1) == real, "docs/cli.md's --help copy differs from the command's: paste it again"


def test_the_lm_eval_page_lists_every_edit_space():
    """docs/lm_eval.md names the spaces an edit spec takes: all of them (it once left out four)."""
    from tl_directional.edit import EDIT_SPACES

    page = (ROOT / "docs" / "lm_eval.md").read_text()
    sentence = page[page.index("`SPACE` is a `tl-directional sweep --space`"):][:600]
    listed = re.findall(r"`([a-z-]+)`", sentence[: sentence.index("LAYERS")])
    assert sorted(set(listed) - {"tl-directional"}) == sorted(EDIT_SPACES)
