"""Griffe extension for the API reference (``mkdocs.yml``: mkdocstrings -> python -> extensions).

Two jobs, done after the package is loaded; nothing in the package changes:

1. Sphinx roles become mkdocstrings cross-references. The package's docstrings use Sphinx roles (``:func:`decompose```, ``:class:`~a.b.C```,
``:meth:`Profile.save```). Markdown has no such syntax, so this extension rewrites each role,
after the package is loaded, into an autorefs link ``[`decompose`][tl_directional.core.geometry.decompose]``
when the name resolves to an object the API reference renders (the face and the extension
points, ``docs/hooks.py:rendered_paths``), and into plain code otherwise (internal modules,
private helpers, names imported only inside functions).
2. Instance attributes that are only assigned in ``__init__`` and have no docstring
   (``self.eps = _check_eps(eps)``) are dropped: they repeat the constructor's
   arguments, which the class signature already shows.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import griffe


def _hooks():
    spec = importlib.util.spec_from_file_location("tl_directional_docs_hooks", Path(__file__).with_name("hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):`(~?)([\w.]+)`")


def _lookup(pkg: griffe.Module, path: str) -> griffe.Object | griffe.Alias | None:
    if path == pkg.path:
        return pkg
    if not path.startswith(pkg.path + "."):
        return None
    try:
        return pkg[path[len(pkg.path) + 1:]]
    except (KeyError, ValueError, griffe.AliasResolutionError):
        return None


def _target(obj: griffe.Object, pkg: griffe.Module, name: str, rendered: set[str]) -> str | None:
    """Canonical path of ``name`` as seen from ``obj`` when the reference renders it, or None."""
    head, _, rest = name.partition(".")
    candidates = []
    try:
        candidates.append(obj.resolve(head) + (f".{rest}" if rest else ""))
    except (griffe.NameResolutionError, AttributeError, KeyError):
        pass
    candidates += [name, f"{pkg.path}.{name}"]
    for path in candidates:
        found = _lookup(pkg, path)
        if found is None:
            continue
        if found.is_alias:
            try:
                path = found.final_target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
        else:
            path = found.path
        if any(part.startswith("_") for part in path.split(".")):
            return None
        return path if path in rendered else None
    return None


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield from _walk(member)


class DocsCleanup(griffe.Extension):
    """Rewrite Sphinx roles and drop undocumented instance attributes."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:  # noqa: ARG002
        rendered = _hooks().rendered_paths(pkg)
        for obj in list(_walk(pkg)):
            if obj.is_class:
                for name, member in list(obj.members.items()):
                    if (not member.is_alias and member.is_attribute and member.docstring is None
                            and "instance-attribute" in member.labels):
                        del obj.members[name]
            if obj.docstring is None:
                continue

            def replace(match: re.Match, obj=obj) -> str:
                tilde, name = match.groups()
                shown = name.rsplit(".", 1)[-1] if tilde else name
                path = _target(obj, pkg, name, rendered)
                return f"[`{shown}`][{path}]" if path else f"`{shown}`"

            obj.docstring.value = ROLE.sub(replace, obj.docstring.value)
