"""Two scans of the package's source with ``ast`` (nothing is imported): long functions and
re-exported names.

Run ``python -m tests.tools.code_shape [ROOT] [--limit N]`` for the functions longer than ``N``
code lines (default 80) and the public names re-exported away from their canonical homes.
``tests/unit/test_layering.py`` holds the package to both with the same functions.

*Code lines* of a function: the lines of its body that hold code, so its docstring (and the
docstrings of functions and classes nested in it), blank lines and comment-only lines are left
out. A nested function is counted inside its outer one and also on its own
(``outer.<locals>.inner``).

*Canonical homes* of a public name: the module that defines it and the package faces
(``__init__.py``) on the way from that module up to the top face ``tl_directional``. Any other
module that imports the name and either lists it in its ``__all__`` or never uses it is a
re-export for old imports.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

from tests.tools.import_graph import PACKAGE, modules

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _docstring_lines(node: ast.AST) -> set[int]:
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr):
        return set()
    value = body[0].value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return set()
    return set(range(body[0].lineno, body[0].end_lineno + 1))


def _code_lines(source: str) -> set[int]:
    """Lines that hold a token other than a comment or a line break."""
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def function_lengths(path: Path, module: str) -> dict[str, int]:
    """``{qualified name: code lines of its body}`` for every function and method in ``path``;
    names are ``module.Class.method`` / ``module.outer.<locals>.inner``."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    code = _code_lines(source)
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (*FunctionNode.__args__, ast.ClassDef)):
            docs |= _docstring_lines(node)
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FunctionNode.__args__):
                name = f"{prefix}.{child.name}"
                body = range(child.body[0].lineno, child.end_lineno + 1)
                found[name] = len([n for n in body if n in code and n not in docs])
                visit(child, f"{name}.<locals>")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(tree, module)
    return found


def long_functions(root: Path, limit: int) -> dict[str, int]:
    """Every function of the package under ``root`` with more than ``limit`` code lines."""
    out: dict[str, int] = {}
    for module, path in modules(root).items():
        out.update({q: n for q, n in function_lengths(path, module).items() if n > limit})
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (*FunctionNode.__args__, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                and isinstance(node.value, (ast.List, ast.Tuple))):
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    return set()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _faces_above(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def reexports(root: Path) -> list[tuple[str, str, str]]:
    """``(name, defining module, re-exporting module)`` for every public name a module passes on
    that is neither its defining module nor a face above it (see the module docstring)."""
    paths = modules(root)
    trees = {m: ast.parse(p.read_text(encoding="utf-8")) for m, p in paths.items()}
    defined = {m: _defined_names(t) for m, t in trees.items()}

    def home(module: str, name: str, seen: int = 0) -> str | None:
        """The module that defines ``name`` as it is reached from ``module`` (following imports)."""
        if name in defined.get(module, ()) or seen > 10:
            return module
        for node in trees.get(module, ast.Module(body=[])).body:
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, paths[module].name == "__init__.py", node)
                for alias in node.names:
                    if (alias.asname or alias.name) == name and target in trees:
                        return home(target, alias.name, seen + 1)
        return None

    out = []
    for module, tree in trees.items():
        is_face = paths[module].name == "__init__.py"
        listed = _all_names(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(module, is_face, node)
            if target is None or not target.startswith(PACKAGE):
                continue
            for alias in node.names:
                name = alias.asname or alias.name
                if name.startswith("_") or f"{target}.{alias.name}" in paths:
                    continue  # private names and submodules are not re-exports of a public name
                passed_on = name in listed or name not in used
                where = home(target, alias.name)
                if not passed_on or where is None or where == module:
                    continue
                if module not in _faces_above(where):
                    out.append((name, where, module))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[2] / PACKAGE))
    parser.add_argument("--limit", type=int, default=80)
    args = parser.parse_args(argv)
    root = Path(args.root)
    long = long_functions(root, args.limit)
    print(f"functions over {args.limit} code lines: {len(long)}")
    for name, n in long.items():
        print(f"  {n:4d}  {name}")
    found = reexports(root)
    print(f"re-exports away from a canonical home: {len(found)} ({len({n for n, _, _ in found})} names)")
    for name, where, module in found:
        print(f"  {name}  (defined in {where})  re-exported by {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
