"""MkDocs hooks for the API reference (``hooks:`` in ``mkdocs.yml``).

The reference documents the package's face (the names of ``tl_directional.__all__``) and its
extension points, one page per job (measure, edit, evaluate, ...), not one page per internal
module. Two markers are filled at build time:

* ``<!-- public-names -->`` in ``docs/api/index.md``: every public name, grouped by the page that
  renders it (a ``::: tl_directional.<name>`` directive), linked to its entry, with the first
  sentence of its docstring;
* ``<!-- error-classes -->`` in ``docs/api/errors.md``: every class of the package that
  subclasses ``TLDirectionalError``, with its module and the built-in classes it also is.

The package is read with griffe's static parser, like mkdocstrings does: building the docs
imports neither torch nor TransformerLens.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = "tl_directional"
NAMES_MARKER = "<!-- public-names -->"
ERRORS_MARKER = "<!-- error-classes -->"
ERROR_BASE = f"{PACKAGE}.core.errors.TLDirectionalError"
ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(rf"^:::\s*({PACKAGE}(?:\.\w+)*)\s*$", re.M)
ROLE = re.compile(r":\w+:`~?([\w.]+)`")
TITLE = re.compile(r"^#\s+(.+)$", re.M)


def api_pages(api_dir: Path = API) -> dict[str, list[str]]:
    """``page -> [dotted paths its ::: directives render]`` for the pages under ``docs/api``."""
    return {
        p.relative_to(api_dir).as_posix(): DIRECTIVE.findall(p.read_text(encoding="utf-8"))
        for p in sorted(api_dir.rglob("*.md"))
    }


def _members_option(text: str, directive: str) -> list[str] | None:
    """The ``members: [...]`` list under ``::: directive`` (None when the option is absent)."""
    block = re.search(rf"^:::\s*{re.escape(directive)}\s*\n((?:[ \t]+.*\n?)*)", text, re.M)
    if block is None:
        return None
    found = re.search(r"members:\s*\[([^\]]*)\]", block.group(1))
    return None if found is None else [m.strip() for m in found.group(1).split(",") if m.strip()]


def rendered_names(api_dir: Path = API) -> dict[str, str]:
    """``public name -> page`` for the names of the package's face that a page renders, as
    ``::: tl_directional.<name>`` or as a member of a rendered face module."""
    out: dict[str, str] = {}
    for page, directives in api_pages(api_dir).items():
        text = (api_dir / page).read_text(encoding="utf-8")
        for d in directives:
            rest = d[len(PACKAGE) + 1:] if d != PACKAGE else ""
            if rest and "." not in rest:
                out.setdefault(rest, page)
                for m in _members_option(text, d) or []:
                    out.setdefault(f"{rest}.{m}", page)
    return out


def _lookup(pkg, path: str):
    """The griffe object at dotted ``path`` (aliases followed), or None."""
    if path == pkg.path:
        return pkg
    try:
        obj = pkg[path[len(pkg.path) + 1:]]
        return obj.final_target if obj.is_alias else obj
    except Exception:  # griffe's KeyError / alias resolution errors: not rendered
        return None


def rendered_paths(pkg=None, api_dir: Path = API) -> set[str]:
    """Every dotted path the reference renders an entry for: each directive's path and its
    canonical target, and their public members (the ``members`` option's, where given) with the
    members' canonical targets, one level into classes. Cross-references go only to these; the
    rest is shown as plain code (internal modules are not part of the API)."""
    pkg = pkg or _load()
    out: set[str] = set()

    def add(shown: str, obj, members: list[str] | None, depth: int) -> None:
        out.update((shown, obj.path))
        if depth > 1 or not (obj.is_module or obj.is_class):
            return
        if members is not None:
            names = members
        elif obj.is_module and obj.exports is not None:
            names = [str(n) for n in obj.exports]
        else:  # what mkdocstrings shows: the object's own public members, no imports or submodules
            names = [n for n, m in obj.members.items() if not n.startswith("_") and not m.is_alias and not m.is_module]
        for name in names:
            member = obj.members.get(name)
            if member is None or member.is_module:
                continue
            try:
                target = member.final_target if member.is_alias else member
            except Exception:  # an alias to outside the package
                continue
            if target.path.startswith(PACKAGE + ".") or target.path == PACKAGE:
                add(f"{shown}.{name}", target, None, depth + 1)

    for page in sorted(api_dir.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for d in DIRECTIVE.findall(text):
            obj = _lookup(pkg, d)
            if obj is not None:
                add(d, obj, _members_option(text, d), 0 if obj.is_module else 1)
    return out


def _load():
    import griffe

    return griffe.load(PACKAGE, search_paths=[str(ROOT)], resolve_aliases=True)


def public_names(pkg=None) -> list[tuple[str, str, str]]:
    """``(name, kind, summary)`` for each name of the package's ``__all__``."""
    pkg = pkg or _load()
    out = []
    for name in sorted((str(n) for n in (pkg.exports or [])), key=str.lower):
        obj = pkg[name]
        target = obj.final_target if obj.is_alias else obj
        doc = target.docstring.value if target.docstring else ""
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        out.append((name, target.kind.value, ROLE.sub(r"`\1`", summary)))
    return out


def public_names_markdown(api_dir: Path = API, pkg=None) -> str:
    """The public names as one bullet list per API page, each linked to its entry."""
    where = rendered_names(api_dir)
    by_page: dict[str, list[str]] = {}
    for name, kind, summary in public_names(pkg):
        page = where.get(name)
        if page is None:
            raise ValueError(f"tl_directional.{name} is public but no page under docs/api renders it; "
                             f"add '::: tl_directional.{name}' to the page of its job")
        by_page.setdefault(page, []).append(f"- [`{name}`][{PACKAGE}.{name}] ({kind}): {summary}")
    parts = []
    for page in sorted(by_page):
        title = TITLE.search((api_dir / page).read_text(encoding="utf-8")).group(1)
        parts.append(f"### [{title}]({page})\n\n" + "\n".join(by_page[page]) + "\n")
    return "\n".join(parts)


def error_classes(pkg=None) -> list[tuple[str, str, list[str]]]:
    """``(class path, summary, builtin bases)`` for every subclass of the package's error base."""
    pkg = pkg or _load()
    found: list[tuple[str, str, list[str]]] = []

    def walk(module) -> None:
        for member in module.members.values():
            if member.is_alias:
                continue
            if member.is_module:
                walk(member)
            elif member.is_class and member.path != ERROR_BASE:
                try:
                    mro = [c.path for c in member.mro()]
                except Exception:  # a base outside the package that griffe cannot resolve
                    continue
                if ERROR_BASE in mro:
                    doc = member.docstring.value if member.docstring else ""
                    builtins = [str(b) for b in member.bases if "." not in str(b) and str(b) != "TLDirectionalError"]
                    found.append((member.path, " ".join(doc.strip().split("\n\n")[0].split()), builtins))

    walk(pkg)
    return sorted(found)


def error_classes_markdown(pkg=None) -> str:
    rows = ["| error | also a | raised when |", "| --- | --- | --- |"]
    for path, summary, builtins in error_classes(pkg):
        also = ", ".join(f"`{b}`" for b in builtins) or "-"
        text = ROLE.sub(r"`\1`", summary)
        rows.append(f"| `{path}` | {also} | {text} |")
    return "\n".join(rows) + "\n"


LINK = re.compile(rf"\[([^\]]+)\]\[({PACKAGE}(?:\.\w+)*)\]")
_rendered: set[str] = set()


def unlink_internal(markdown: str, rendered: set[str]) -> str:
    """``[text][tl_directional.x.y]`` stays a link when the reference renders ``x.y``; a link to
    an internal object becomes its text (internal modules are not part of the API)."""
    return LINK.sub(lambda m: m.group(0) if m.group(2) in rendered else m.group(1), markdown)


def on_page_markdown(markdown, page, config, files, **kwargs):  # noqa: ARG001 - mkdocs hook signature
    api_dir = Path(config["docs_dir"]) / "api"
    if not _rendered:
        _rendered.update(rendered_paths(api_dir=api_dir))
    markdown = unlink_internal(markdown, _rendered)
    if page.file.src_uri == "api/index.md" and NAMES_MARKER in markdown:
        return markdown.replace(NAMES_MARKER, public_names_markdown(api_dir))
    if page.file.src_uri == "api/errors.md" and ERRORS_MARKER in markdown:
        return markdown.replace(ERRORS_MARKER, error_classes_markdown())
    return markdown
