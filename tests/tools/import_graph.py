"""The package's import graph, parsed from the source with ``ast`` (nothing is imported).

Run ``python -m tests.tools.import_graph [ROOT ...]`` for the counts (modules, edges,
cycles: strongly connected components of more than one module, plus self-imports)
and the members of every cycle, of the library (``tl_directional/``) and the studies
(``studies/``) by default. ``tests/unit/test_layering.py`` holds both packages to their
rules with the same parser.

An edge goes from the importing module to the most specific module its statement
names (``from .a import b`` points at ``a.b`` when ``b`` is a module, else at ``a``),
and to every package ``__init__`` the import runs on the way that the importer's own
packages have not run already (``from ..load.hf import x`` in ``model/lanes/legacy.py``
also points at ``model.load``). A package's ``__init__`` is a node of its own.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "tl_directional"
#: the other package of the repository the rules cover: the studies (``python -m studies``)
STUDIES = "studies"
#: folders of a package that hold data, not modules (``studies/data/`` is code: data preparation)
DATA_FOLDERS = {PACKAGE: ("data", "results")}


@dataclass(frozen=True)
class Import:
    """One import of a package module by another.

    ``source`` / ``target`` are dotted module names, ``names`` the names the
    statement takes from ``target`` (empty for ``import x``), ``line`` its line,
    ``deferred`` whether it sits inside a function, ``type_only`` whether it sits
    under ``if TYPE_CHECKING:``.
    """

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    deferred: bool
    type_only: bool

    def where(self, root: Path) -> str:
        path = module_path(root, self.source)
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{path.relative_to(root.parent) if path else self.source}:{self.line}: {what}"


def module_path(root: Path, module: str) -> Path | None:
    parts = module.split(".")[1:]
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the package folder), data folders left out."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or rel.parts[0] in DATA_FOLDERS.get(root.name, ()):
            continue
        parts = [root.name, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = source.split(".") if is_package else source.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *(node.module.split(".") if node.module else [])])


def imports(root: Path, of: str | None = None) -> list[Import]:
    """Every import of one package module by another, in source order; with ``of`` (another
    package's name, e.g. ``tl_directional`` read from ``studies/``), every import of that
    package's modules instead (``target`` as the statement names it)."""
    known = modules(root)
    package = of or root.name
    found: list[Import] = []
    for source, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def visit(node: ast.AST, deferred: bool, type_only: bool, source=source, is_package=is_package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        if alias.name == package or alias.name.startswith(package + "."):
                            target = alias.name
                            while of is None and target not in known and "." in target:
                                target = target.rsplit(".", 1)[0]
                            found.append(Import(source, target, (), child.lineno, deferred, type_only))
                elif isinstance(child, ast.ImportFrom):
                    target = _resolve(source, is_package, child)
                    if target is None or not (target == package or target.startswith(package + ".")):
                        continue
                    plain: list[str] = []
                    for alias in child.names:
                        sub = f"{target}.{alias.name}"
                        if of is None and sub in known:
                            found.append(Import(source, sub, (), child.lineno, deferred, type_only))
                        else:
                            plain.append(alias.name)
                    if plain:
                        found.append(Import(source, target, tuple(plain), child.lineno, deferred, type_only))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True, type_only)
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.body:
                        visit(ast.Module(body=[stmt], type_ignores=[]), deferred, True)
                    for stmt in child.orelse:
                        visit(ast.Module(body=[stmt], type_ignores=[]), deferred, type_only)
                else:
                    visit(child, deferred, type_only)

        visit(tree, False, False)
    return found


def cycles(nodes: list[str], edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules that import themselves."""
    graph: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        # iterative Tarjan: (node, iterator over its successors)
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or (node, node) in edges:
                    out.append(sorted(component))
    return sorted(out, key=lambda c: (-len(c), c))


def parents_run(source: str, target: str) -> list[str]:
    """The packages a Python import of ``target`` from ``source`` runs on the way: every package
    above ``target`` that is not the root and not above ``source`` (those already ran)."""
    parts = target.split(".")
    above_source = {".".join(source.split(".")[:k]) for k in range(1, source.count(".") + 2)}
    return [p for p in (".".join(parts[:k]) for k in range(2, len(parts))) if p not in above_source]


def graph(root: Path) -> tuple[list[str], set[tuple[str, str]], list[Import]]:
    """Modules, edges and the imports behind them. Besides each import's own target, an edge goes
    to every package whose ``__init__`` the import runs on the way (:func:`parents_run`): a
    cycle through a package's ``__init__`` breaks an import as surely as a direct one."""
    found = imports(root)
    edges = {(i.source, i.target) for i in found if i.source != i.target or i.names}
    edges |= {(i.source, p) for i in found for p in parents_run(i.source, i.target)}
    return sorted(modules(root)), edges, found


def report(root: Path) -> None:
    """Print the counts of the package at ``root`` and the members of every cycle."""
    nodes, edges, found = graph(root)
    found_cycles = cycles(nodes, edges)
    deferred = [i for i in found if i.deferred]
    print(f"modules: {len(nodes)}")
    print(f"edges: {len(edges)}")
    print(f"cycles: {len(found_cycles)} (modules in cycles: {sum(len(c) for c in found_cycles)})")
    print(f"package imports inside functions: {len(deferred)}")
    for component in found_cycles:
        print(f"  cycle of {len(component)}: {' '.join(m.removeprefix(root.name + '.') for m in component)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.tools.import_graph", description=__doc__.split("\n")[0])
    top = Path(__file__).resolve().parents[2]
    parser.add_argument("roots", nargs="*", default=[str(top / PACKAGE), str(top / STUDIES)],
                        help="package folders (default: this checkout's tl_directional/ and studies/; "
                             "benchmarks/ works too)")
    args = parser.parse_args(argv)
    for i, r in enumerate(args.roots):
        root = Path(r).resolve()
        if len(args.roots) > 1:
            print(("\n" if i else "") + f"== {root.name}/")
        report(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
