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
# itself): run on it, as written; the README's example too (a path relative to docs/, as the others)
DEFAULT_MODEL_PAGES = ("sweeps.md", "lm_eval.md", "hf_training.md", "coming_from_transformerlens.md", "../README.md")
# pages that load a real pretrained model or a hub name: run as written in the real tier
# (tests/real/test_docs_real.py, hub names against an offline cache of tiny stand-ins)
REAL_MODEL_PAGES = ("models.md",)
# rendered notebook runs (notebooks/_render.py), not pages of their own: the notebooks run in
# tests/integration/test_notebooks_run.py and the renders are bounded in tests/unit/test_notebooks.py
RENDERED_PAGES = "notebooks/"


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


def test_every_page_with_python_code_runs_in_the_suite():
    """Issue 47: pages whose code never ran drifted from the library. Every ```python block of
    every docs page belongs to a page that one of the suite's runners executes."""
    ran = set(RUN_PAGES + DEFAULT_MODEL_PAGES + REAL_MODEL_PAGES)
    missing = []
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).as_posix()
        if rel.startswith(RENDERED_PAGES) or rel in ran:
            continue
        if snippets.python_blocks(path.read_text(encoding="utf-8")):
            missing.append(rel)
    assert not missing, (f"docs pages with ```python blocks that no test runs: {missing}; add each to "
                         "RUN_PAGES (tiny model), DEFAULT_MODEL_PAGES or REAL_MODEL_PAGES")


def test_nav_pages_exist():
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = re.findall(r":\s*([\w/.-]+\.md)\s*$", text, re.M)
    assert "quickstart.md" in pages and "api/index.md" in pages
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"


def test_every_results_page_is_in_the_nav():
    """Every page the results builder writes (``docs/results/*.md``, ``python -m studies build``) is
    named in mkdocs.yml's nav, so a page built from newly committed data (e.g. a RULER main run's
    ``ruler_<model>.md`` / ``ruler-cpu_<model>.md``) cannot be silently missing from the site."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", text, re.M))
    built = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "results").glob("*.md"))
    assert "results/protocol.md" in built and "results/protocol.md" in nav  # the glob and the parser read
    missing = [p for p in built if p not in nav]
    assert not missing, (f"docs/results pages not in mkdocs.yml's nav: {missing}; add each under nav: Results "
                         "(e.g. '      - <title>, <model>: " + (missing[0] if missing else "") + "'), next to "
                         "its study's other pages")


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


# -- the README: it starts with the library (issue 49) ------------------------------------------

README = ROOT / "README.md"
PAPER_TITLE = "Disentangling Representation Evolution in Transformers through Directional Decomposition"
PAPER_REPOSITORY = "https://github.com/Shwai-He/Transformer-Geometry"
# a fence's opening line and its info string (```bash, ```python, ...)
FENCE_OPEN = re.compile(r"^```([\w-]*)[ \t]*$", re.M)
# a Markdown link or image target: ](path) or ](path#anchor), up to the first space or ')'
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_short_and_starts_with_a_command():
    """The README is a front page (at most 120 lines; it was 240, half of it results and a copy of
    docs/architecture.md), and its first command (a bash or python fence) opens within its first
    30 lines (it was at line 60)."""
    text = README.read_text(encoding="utf-8")
    n_lines = len(text.splitlines())
    assert n_lines <= 120, f"README.md has {n_lines} lines; keep it at most 120 and move detail to docs/"
    commands = [text[: m.start()].count("\n") + 1 for m in FENCE_OPEN.finditer(text)
                if m.group(1) in ("bash", "sh", "shell", "console", "python")]
    assert commands, "README.md has no ```bash or ```python block"
    assert commands[0] <= 30, f"README.md's first command block opens at line {commands[0]}; bring it within 30 lines"


def test_the_readme_names_and_links_the_paper():
    """The paper the project tests is named (title and first author) and its repository linked."""
    text = " ".join(README.read_text(encoding="utf-8").split())  # line breaks inside the title
    assert PAPER_TITLE in text, "README.md does not name the paper (its title)"
    assert "Shwai He" in text, "README.md does not name the paper's authors"
    assert f"]({PAPER_REPOSITORY})" in text, f"README.md does not link the paper's repository {PAPER_REPOSITORY}"


def test_the_readme_links_resolve_to_files():
    """Every relative link and image of the README names a file or folder of the repository."""
    targets = [t for t in LINK.findall(README.read_text(encoding="utf-8"))
               if not t.startswith(("http://", "https://", "mailto:", "#"))]
    assert len(targets) >= 8, f"too few links found in README.md ({targets}): is LINK right?"
    missing = [t for t in targets if not (ROOT / t.split("#", 1)[0]).exists()]
    assert not missing, f"README.md links to paths that do not exist: {missing}"


def test_the_paper_vs_ours_table_lives_in_the_results_page():
    """The generated paper-vs-ours block (``make results`` rewrites it between its markers) is in
    docs/results.md, not in the README, which links the results page instead."""
    start, end = "<!-- paper-vs-ours -->", "<!-- /paper-vs-ours -->"
    readme = README.read_text(encoding="utf-8")
    assert start not in readme and end not in readme, "the paper-vs-ours block belongs in docs/results.md"
    results = (DOCS / "results.md").read_text(encoding="utf-8")
    assert results.count(start) == 1 and results.count(end) == 1, "docs/results.md lacks the paper-vs-ours block"
    assert "(docs/results.md)" in readme, "README.md does not link docs/results.md"


def test_the_glossary_names_every_edit_space_and_node_type():
    """docs/glossary.md lists every edit space the parser accepts (``EDIT_SPACES``, the names of
    ``--space`` and of edit specs) and every attribution node type, and the README and the home
    page link it."""
    from tl_directional.edit import EDIT_SPACES

    glossary = (DOCS / "glossary.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w-]+)`", glossary))
    missing = sorted(set(EDIT_SPACES) - named)
    assert not missing, f"docs/glossary.md does not name the edit spaces {missing}"
    node_types = inspect.signature(tl_directional.attribution_patch).parameters["node_types"].default
    assert set(node_types) <= named, f"docs/glossary.md does not name the node types {sorted(set(node_types) - named)}"
    assert "(docs/glossary.md)" in README.read_text(encoding="utf-8"), "README.md does not link the glossary"
    assert "(glossary.md)" in (DOCS / "index.md").read_text(encoding="utf-8"), "docs/index.md does not link the glossary"
