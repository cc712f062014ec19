"""MkDocs hooks for the API reference (``hooks:`` in ``mkdocs.yml``).

* Every public module of ``tl_directional`` gets an API page: modules without a
  hand-written ``docs/api/<module>.md`` get a generated one, appended to the
  "API reference" section of the nav, so a new module is never left out.
* ``docs/api/index.md`` gets the package's public names (its ``__all__``),
  grouped by module, each linked to the page where it is documented, in place
  of the marker ``<!-- public-names -->``.

The package is read with griffe's static parser, like mkdocstrings does: building
the docs imports neither torch nor TransformerLens.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = "tl_directional"
API_SECTION = "API reference"
MARKER = "<!-- public-names -->"
ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(rf"^:::\s*({PACKAGE}(?:\.\w+)*)\s*$", re.M)
ROLE = re.compile(r":\w+:`~?([\w.]+)`")

_generated: list[str] = []


def api_modules(root: Path = ROOT) -> list[str]:
    """Public modules (and subpackages, dotted: ``models.load``) of the package, from its source
    files (nothing is imported)."""
    out = []
    for p in (root / PACKAGE).rglob("*.py"):
        parts = list(p.relative_to(root / PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":  # a subpackage (tl_directional/model/load/) is a module too
            parts = parts[:-1]
        if parts and not any(x.startswith("_") for x in parts):
            out.append(".".join(parts))
    return sorted(out)


def documented_modules(docs_dir: Path) -> set[str]:
    """Dotted module paths that a hand-written page under ``docs/api`` renders with ``:::``."""
    found: set[str] = set()
    for page in (docs_dir / "api").rglob("*.md"):
        found.update(DIRECTIVE.findall(page.read_text(encoding="utf-8")))
    return found


def modules_without_page(docs_dir: Path, root: Path = ROOT) -> list[str]:
    documented = documented_modules(docs_dir)
    return [m for m in api_modules(root) if f"{PACKAGE}.{m}" not in documented]


def on_config(config, **kwargs):  # noqa: ARG001 - mkdocs hook signature
    _generated[:] = modules_without_page(Path(config["docs_dir"]))
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and API_SECTION in entry:
            entry[API_SECTION].extend({m: f"api/{m}.md"} for m in _generated)
    return config


def on_files(files, config, **kwargs):  # noqa: ARG001
    from mkdocs.structure.files import File

    for m in _generated:
        content = (
            f"# {PACKAGE}.{m}\n\n"
            "This page is generated from the module's docstrings (no hand-written page yet).\n\n"
            f"::: {PACKAGE}.{m}\n"
        )
        files.append(File.generated(config, f"api/{m}.md", content=content))
    return files


def public_names() -> list[tuple[str, str, str, str]]:
    """``(name, canonical path, kind, summary)`` for each name of the package's ``__all__``."""
    import griffe

    pkg = griffe.load(PACKAGE, search_paths=[str(ROOT)], resolve_aliases=True)
    out = []
    for name in sorted((str(n) for n in (pkg.exports or [])), key=str.lower):
        obj = pkg[name]
        target = obj.final_target if obj.is_alias else obj
        # `from .sweep import sweep` rebinds the name to the function at run time, while
        # griffe keeps the submodule: follow the module to its same-named member.
        if target.is_module and name in target.members:
            member = target.members[name]
            target = member.final_target if member.is_alias else member
        doc = target.docstring.value if target.docstring else ""
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        out.append((name, target.path, target.kind.value, ROLE.sub(r"`\1`", summary)))
    return out


def public_names_markdown() -> str:
    """The public names as one bullet list per module, each name linked to its documentation."""
    by_module: dict[str, list[str]] = {}
    for name, path, kind, summary in public_names():
        module = path.rsplit(".", 1)[0]
        by_module.setdefault(module, []).append(f"- [`{name}`][{path}] ({kind}): {summary}")
    parts = []
    for module in sorted(by_module):
        parts.append(f"### `{module}`\n\n" + "\n".join(by_module[module]) + "\n")
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files, **kwargs):  # noqa: ARG001
    if page.file.src_uri == "api/index.md" and MARKER in markdown:
        return markdown.replace(MARKER, public_names_markdown())
    return markdown
