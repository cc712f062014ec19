"""The package's floors (docs/architecture.md), held against its source.

Imports are read with ``ast`` (tests/tools/import_graph.py); nothing is imported, so a broken
floor is named even when the package would still import. Each failure lists every offending
import as ``path:line: from X import Y (why)``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.tools.code_shape import function_lengths, reexports
from tests.tools.import_graph import PACKAGE, STUDIES, Import, cycles, graph, imports, module_path
from tests.tools.import_graph import modules as module_paths

ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# Floors from the bottom up. A module may import its own floor and the floors its entry names;
# every other import of a package module is upward (or sideways) and fails the test.
FLOORS: dict[str, tuple[str, ...]] = {
    "core": (),
    "io": ("core",),
    "model": ("core", "io"),
    "figures": ("core",),
    # the analyses, in a fixed order: each may import the ones before it, never one after
    "measure": ("core", "io", "model"),
    "edit": ("core", "io", "model", "measure"),
    "evaluate": ("core", "io", "model", "figures", "measure", "edit"),
    "compression": ("core", "io", "model", "figures", "measure", "edit", "evaluate"),
    "training": ("core", "io", "model", "measure", "edit", "evaluate", "compression"),
    "views": ("core", "io", "model", "figures", "measure", "edit", "evaluate", "compression", "training"),
    "cli": ("core", "io", "model", "figures", "measure", "edit", "evaluate", "compression", "training", "views"),
}
#: Floors split into rooms (sub-packages, each with a face ``__init__.py``), in a fixed order: a
#: room may import its own modules and the rooms before it, never one after it nor its floor's face
#: (the face imports every room). A module of such a floor sits in one of its rooms.
ROOMS: dict[str, tuple[str, ...]] = {
    "evaluate": ("lens", "patching", "sweeps", "suites"),
}
FACE = PACKAGE  # tl_directional/__init__.py: may import every floor; no floor imports it
LAZY_FLOORS = {"cli"}

#: A module longer than this does more than one job: split it by job (issue 36, "smaller rooms").
MAX_MODULE_LINES = 500
#: Modules allowed over the limit, each with why. Remove an entry once its module is split (the
#: test fails on an entry that is no longer needed).
LONG_MODULES: dict[str, str] = {
}  # the only floor that imports package modules inside functions (start-up time)


#: A function longer than this many code lines (docstring, blank and comment lines left out;
#: tests/tools/code_shape.py) does several jobs: split it into named steps.
MAX_FUNCTION_LINES = 80
#: Functions allowed over the limit, each with why. Remove an entry once its function is short
#: enough (the test fails on an entry that is no longer needed).
LONG_FUNCTIONS: dict[str, str] = {
}

#: Faces that pass on the public names of another floor, each with why. Every other module may
#: pass a public name on only from below it: the defining module, then each ``__init__`` above it
#: up to the top face ``tl_directional``.
PUBLIC_FACES: dict[str, tuple[str, str]] = {
    f"{PACKAGE}.views": (f"{PACKAGE}.figures.",
                         "the figures floor has no face of its own: users take every figure from views"),
    f"{PACKAGE}.edit.hf": (f"{PACKAGE}.model.hf_layout",
                           "the plain-transformers lane's one face; its site layout sits in model because "
                           "model.load needs it too"),
}


def floor_of(module: str) -> str | None:
    if module == FACE:
        return FACE
    parts = module.split(".")
    if parts[-1] == "__main__":  # ``python -m`` entry points are commands
        return "cli"
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def room_of(module: str) -> str | None:
    """The room of ``module`` (``tl_directional.evaluate.sweeps.runner`` -> ``sweeps``), or None
    for a floor's face and for floors without rooms."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] in ROOMS else None


@pytest.fixture(scope="module")
def package():
    nodes, edges, found = graph(ROOT)
    return nodes, edges, found


def _fail(what: str, bad: list[str]) -> None:
    assert not bad, f"{what} ({len(bad)}):\n" + "\n".join(sorted(set(bad)))


def test_every_module_sits_on_a_floor(package):
    nodes, _, _ = package
    _fail("modules outside the floors (put each in one of "
          f"{', '.join(FLOORS)}; see docs/architecture.md)",
          [f"{m}: no floor" for m in nodes if floor_of(m) is None])


def test_no_import_cycle(package):
    nodes, edges, found = package
    bad = []
    for component in cycles(nodes, edges):
        members = set(component)
        ties = [i.where(ROOT) for i in found if i.source in members and i.target in members]
        bad.append(f"cycle of {len(component)} modules: {' '.join(component)}\n    " + "\n    ".join(ties))
    _fail("import cycles", bad)


def test_no_upward_import(package):
    _, _, found = package
    bad = []
    for imp in found:
        src, dst = floor_of(imp.source), floor_of(imp.target)
        if src is None or dst is None or src == FACE:
            continue
        if dst == FACE:
            bad.append(f"{imp.where(ROOT)} (imports the package face; import the module that defines it)")
        elif src != dst and dst not in FLOORS[src]:
            bad.append(f"{imp.where(ROOT)} ({src} may import only {', '.join((src, *FLOORS[src]))})")
    _fail("imports that go up or sideways", bad)


def test_rooms_import_in_their_order(package):
    nodes, _, found = package
    bad = [f"{m}: in no room of {floor_of(m)} (put it in one of {', '.join(ROOMS[floor_of(m)])})"
           for m in nodes if floor_of(m) in ROOMS and m != f"{PACKAGE}.{floor_of(m)}"
           and room_of(m) not in ROOMS[floor_of(m)]]
    for imp in found:
        floor = floor_of(imp.source)
        if floor not in ROOMS or floor_of(imp.target) != floor or room_of(imp.source) is None:
            continue
        src, dst, order = room_of(imp.source), room_of(imp.target), ROOMS[floor]
        if dst is None:
            bad.append(f"{imp.where(ROOT)} (a room imports its floor's face; import the room's module)")
        elif src != dst and (dst not in order or order.index(dst) > order.index(src)):
            bad.append(f"{imp.where(ROOT)} ({floor}/{src} may import only {', '.join(order[:order.index(src) + 1])})")
    _fail("rooms that import out of their order", bad)


def _folder(module: str, root: Path = ROOT) -> Path | None:
    path = module_path(root, module)
    return path.parent if path else None


def _private(imp: Import, root: Path = ROOT) -> list[str]:
    """The private names (``_x``, not dunders) ``imp`` takes across folders: the modules of one
    folder share their private helpers; another folder sees only public names. A private
    module (``families/_base.py``) is private to its folder the same way."""
    names = [n for n in imp.names if n.startswith("_") and not n.startswith("__")]
    names += [p for p in imp.target.split(".") if p.startswith("_") and not p.startswith("__")]
    if not names or _folder(imp.source, root) == _folder(imp.target, root):
        return []
    return names


def test_no_private_name_crosses_folders(package):
    _, _, found = package
    bad = [f"{imp.where(ROOT)} (private to its folder: {', '.join(_private(imp))}; make it public or move it)"
           for imp in found if _private(imp)]
    _fail("private names imported from another folder", bad)


def test_no_package_import_inside_a_function(package):
    _, _, found = package
    bad = [f"{imp.where(ROOT)} (inside a function; import it at the top, or move what it needs down a floor)"
           for imp in found if imp.deferred and floor_of(imp.source) not in LAZY_FLOORS]
    _fail("package imports deferred into functions", bad)


def test_the_rules_catch_what_they_name(tmp_path):
    """The parser sees every form the rules are about: a relative import at depth two, a module
    taken by ``from . import``, a deferred import, a private name, an upward import, a cycle."""
    pkg = tmp_path / PACKAGE
    for rel, text in {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": "from ..model import b\n",
        "model/__init__.py": "",
        "model/b.py": "from ..core.a import x\n\ndef f():\n    from ..core.a import _y\n",
        "cli/__init__.py": "from . import c\n",
        "cli/c.py": "def g():\n    from ..model.b import z\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    nodes, edges, found = graph(pkg)
    assert ("tl_directional.cli", "tl_directional.cli.c") in edges
    assert cycles(nodes, edges) == [["tl_directional.core.a", "tl_directional.model.b"]]
    up = [i for i in found if floor_of(i.target) not in (*FLOORS[floor_of(i.source)], floor_of(i.source))]
    assert [(i.source, i.target) for i in up] == [("tl_directional.core.a", "tl_directional.model.b")]
    deferred = {(i.source, i.deferred) for i in found if i.deferred}
    assert deferred == {("tl_directional.model.b", True), ("tl_directional.cli.c", True)}
    assert [_private(i, pkg) for i in found if _private(i, pkg)] == [["_y"]]


def test_benchmark_harness_has_no_import_cycle():
    """The benchmark registry, its runner and the peak-memory worker import one way."""
    bench = ROOT.parent / "benchmarks"
    nodes, edges, found = graph(bench)
    bad = [f"cycle of {len(c)}: {' '.join(c)}\n    " + "\n    ".join(
        i.where(bench) for i in found if i.source in c and i.target in c) for c in cycles(nodes, edges)]
    _fail("import cycles in benchmarks/", bad)


def test_no_name_shadows_a_module(package):
    """A package's ``__init__`` never binds a name of one of its own submodules to something else
    (the old face's ``from .sweep import sweep`` made ``import`` of its sweep module give the function)."""
    nodes, _, found = package
    known = set(nodes)
    bad = [f"{imp.where(ROOT)} (binds {imp.source}.{name}, a module, to something else)"
           for imp in found if imp.source in known and module_path(ROOT, imp.source).name == "__init__.py"
           for name in imp.names if f"{imp.source}.{name}" in known]
    _fail("names that shadow a module", bad)


def _over_limit(lengths: dict[str, int], limit: int, allowed: dict[str, str], allow_list: str, unit: str,
                fix: str) -> list[str]:
    """Entries of ``lengths`` over ``limit`` that ``allowed`` does not name, and entries of
    ``allowed`` no longer needed (now within the limit, or gone)."""
    bad = [f"{name}: {n} {unit} ({fix}, or name it in {allow_list} with why)"
           for name, n in lengths.items() if n > limit and name not in allowed]
    bad += [f"{name}: in {allow_list} but "
            + (f"{lengths[name]} {unit} now" if name in lengths else "no longer exists")
            + "; remove its entry"
            for name in allowed if lengths.get(name, 0) <= limit]
    return bad


def test_no_module_is_longer_than_the_limit():
    """No module of the package over :data:`MAX_MODULE_LINES` lines but those :data:`LONG_MODULES`
    names (with why); an entry whose module is now short enough (or gone) must be removed."""
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for path in module_paths(ROOT).values()}
    bad = _over_limit(lengths, MAX_MODULE_LINES, LONG_MODULES, "LONG_MODULES", "lines", "split it by job")
    _fail(f"modules over {MAX_MODULE_LINES} lines", [f"{PACKAGE}/{line}" for line in bad])


def test_no_function_is_longer_than_the_limit():
    """No library function over :data:`MAX_FUNCTION_LINES` code lines but those
    :data:`LONG_FUNCTIONS` names (with why); an entry now short enough (or gone) must be removed."""
    lengths = {}
    for module, path in module_paths(ROOT).items():
        lengths.update(function_lengths(path, module))
    _fail(f"functions over {MAX_FUNCTION_LINES} code lines",
          _over_limit(lengths, MAX_FUNCTION_LINES, LONG_FUNCTIONS, "LONG_FUNCTIONS", "code lines",
                      "split it into named steps"))


def test_every_public_name_has_one_home():
    """A public name is exported by the module that defines it and by the faces above that module
    (its room's, its floor's, the top face), nowhere else: a module that re-exports a name for old
    imports (in its ``__all__``, or imported and never used) fails; import the name from its home.
    :data:`PUBLIC_FACES` names the faces that serve another floor's names, with why."""
    bad = [f"{module}: re-exports {name} (defined in {home}; import it from there or from a face above it)"
           for name, home, module in reexports(ROOT)
           if not (module in PUBLIC_FACES and home.startswith(PUBLIC_FACES[module][0]))]
    used = {module for _, home, module in reexports(ROOT)
            if module in PUBLIC_FACES and home.startswith(PUBLIC_FACES[module][0])}
    bad += [f"{face}: in PUBLIC_FACES but passes on no name of {PUBLIC_FACES[face][0]}; remove its entry"
            for face in PUBLIC_FACES if face not in used]
    _fail("public names re-exported away from their home", bad)


def test_the_shape_scans_see_what_they_name(tmp_path):
    """The function-length count leaves out docstrings, blank and comment lines; the re-export
    scan flags an unused import and an ``__all__`` entry, not a face above the defining module."""
    path = tmp_path / "m.py"
    path.write_text('def f(x):\n    """Doc\n    string."""\n\n    # why\n    y = x\n    return (\n        y)\n'
                    "\n\nclass C:\n    def g(self):\n        def h():\n            return 1\n        return h\n")
    assert function_lengths(path, "m") == {"m.f": 3, "m.C.g": 3, "m.C.g.<locals>.h": 1}
    pkg = tmp_path / PACKAGE
    for rel, text in {
        "__init__.py": "from .core.a import x\n__all__ = ['x']\n",
        "core/__init__.py": "from .a import x\n",
        "core/a.py": "x = 1\n",
        "model/__init__.py": "",
        "model/b.py": "from ..core.a import x\n",
        "model/c.py": "from ..core.a import x\n\ny = x\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert reexports(pkg) == [("x", f"{PACKAGE}.core.a", f"{PACKAGE}.model.b")]


def test_rooms_are_told_from_the_module_name():
    assert room_of(f"{PACKAGE}.evaluate.sweeps.runner") == "sweeps"
    assert room_of(f"{PACKAGE}.evaluate.suites") == "suites"  # a room's face sits in its room
    assert room_of(f"{PACKAGE}.evaluate") is None  # the floor's face: no room
    assert room_of(f"{PACKAGE}.model.lanes.bridge") is None  # a floor without rooms


# ---------------------------------------------------------------------------------------------
# studies/: the experiments beside the library (python -m studies). They use the library through
# its public names; the library never imports them. The same parser reads them.
# ---------------------------------------------------------------------------------------------

STUDIES_ROOT = ROOT.parent / STUDIES
# (functions: the library's limit, MAX_FUNCTION_LINES)
#: Functions allowed over the limit, each with why. Remove an entry once its function is split
#: (the test fails on an entry that is no longer needed).
STUDIES_LONG_FUNCTIONS: dict[str, str] = {
    # settings tables: one entry per setting of the protocol's grid, in the grid's order
    "studies/claims/run.py::settings": "protocol sec. 3's grid, one entry per setting in its order",
    "studies/instruments/run.py::instrument_settings": "protocol sec. 11's grid, one entry per setting",
    # command lines and one-off explorations: argument parsing, then one straight run
    "studies/compression_study/run.py::main": "the study's arguments, then one run (a one-off, docs/compression.md)",
    "studies/compression_study/run.py::analyse": "one text's tables and bootstrap, in the page's order",
    "studies/explore/layer_sensitivity.py::main": "a one-off exploration's arguments and single run",
    "studies/explore/bos_check.py::main": "a one-off exploration's arguments and single run",
    "studies/data/build_pass_corpus.py::build": "the corpus build's steps in order, each checked against pass8m.expected.json",
}


@pytest.fixture(scope="module")
def studies():
    return graph(STUDIES_ROOT)


def _studies_trees():
    for path in sorted(STUDIES_ROOT.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_studies_have_no_import_cycle(studies):
    nodes, edges, found = studies
    bad = [f"cycle of {len(c)}: {' '.join(c)}\n    " + "\n    ".join(
        i.where(STUDIES_ROOT) for i in found if i.source in c and i.target in c) for c in cycles(nodes, edges)]
    _fail("import cycles in studies/ (move what both need into a module both import)", bad)


def _study_module_aliases(tree: ast.Module, known: set[str]) -> dict[str, str]:
    """Names a studies module binds to another studies module (``from studies.claims import stats as S``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == STUDIES:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in known:
                    out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    out[alias.asname] = alias.name
    return out


def test_studies_take_no_private_name_from_another_module(studies):
    """A study module's private helpers (``_x``) stay in it: no ``from studies.x import _y`` and
    no ``mod._y`` on another studies module (the old ``C._fmt``)."""
    nodes, _, found = studies
    bad = [f"{i.where(STUDIES_ROOT)} (private to {i.target}; make it public or move it)"
           for i in found if i.source != i.target and any(n.startswith("_") and not n.startswith("__") for n in i.names)]
    known = set(nodes)
    for path, tree in _studies_trees():
        aliases = _study_module_aliases(tree, known)
        bad += [f"{path.relative_to(ROOT.parent)}:{n.lineno}: {n.value.id}.{n.attr} (private to {aliases[n.value.id]})"
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
                and n.attr.startswith("_") and not n.attr.startswith("__")]
    _fail("private names used across studies modules", bad)


def test_studies_do_not_edit_sys_path():
    """``python -m studies`` runs from the checkout: no module puts folders on ``sys.path``."""
    bad = [f"{path.relative_to(ROOT.parent)}:{n.lineno}: sys.path"
           for path, tree in _studies_trees() for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and n.attr == "path" and isinstance(n.value, ast.Name) and n.value.id == "sys"]
    _fail("sys.path edits in studies/", bad)


def test_studies_use_only_the_librarys_public_names():
    """studies/ imports the library's public names and modules only (no ``_x``, no ``_module``)."""
    bad = [f"{i.where(STUDIES_ROOT)} (private to the library; use a public name or make one)"
           for i in imports(STUDIES_ROOT, of=PACKAGE)
           if any(p.startswith("_") and not p.startswith("__") for p in (*i.target.split("."), *i.names))]
    _fail("private library names imported by studies/", bad)


def test_the_library_never_imports_the_studies():
    bad = [i.where(ROOT) for i in imports(ROOT, of=STUDIES)]
    _fail("imports of studies/ from tl_directional/ (the library must not depend on its experiments)", bad)


def test_no_studies_module_is_longer_than_the_limit():
    lengths = {path.relative_to(STUDIES_ROOT.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for path in module_paths(STUDIES_ROOT).values()}
    _fail(f"studies/ modules over {MAX_MODULE_LINES} lines (split them by job: run / stats / page)",
          [f"{rel}: {n} lines" for rel, n in lengths.items() if n > MAX_MODULE_LINES])


def _code_lines(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of code of a function: blank lines, comment lines and its docstring not counted."""
    doc: set[int] = set()
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        doc = set(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i in range(node.lineno, node.end_lineno + 1)
               if i not in doc and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


def test_no_studies_function_is_longer_than_the_limit():
    """No function of studies/ over :data:`MAX_FUNCTION_LINES` lines of code but those
    :data:`STUDIES_LONG_FUNCTIONS` names (with why); an entry no longer needed must be removed."""
    lengths: dict[str, int] = {}
    for path, tree in _studies_trees():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(ROOT.parent).as_posix()}::{node.name}"
                lengths[key] = max(lengths.get(key, 0), _code_lines(lines, node))
    bad = [f"{key}: {n} lines of code (split it by job, or name it in STUDIES_LONG_FUNCTIONS with why)"
           for key, n in lengths.items() if n > MAX_FUNCTION_LINES and key not in STUDIES_LONG_FUNCTIONS]
    bad += [f"{key}: in STUDIES_LONG_FUNCTIONS but {lengths.get(key, 0)} lines of code now; remove its entry"
            for key in STUDIES_LONG_FUNCTIONS if lengths.get(key, 0) <= MAX_FUNCTION_LINES]
    _fail(f"studies/ functions over {MAX_FUNCTION_LINES} lines of code", bad)
