"""The page shell: one offline HTML document around views, with their JavaScript inlined.

A :class:`Report` inlines each JavaScript library its views need exactly once
(plotly.js about 4.8 MB, circuitsvis's bundle about 1.3 MB) in the page head and
then only the views' own markup and data, so the page opens from disk with no
network. The libraries are read from the installed ``plotly`` and ``circuitsvis``
packages, never from the network. In notebooks the views' and reports' outputs carry them
once per notebook (or in every output): :mod:`tl_directional.figures.notebook_output`.

This module sits below :mod:`tl_directional.views` (whose views render themselves
with it) and :mod:`tl_directional.views.report` (the standard report); it knows a view
only by its interface (``title``, ``data``, ``libraries``, ``caption``, ``name``,
``body_html(titled=)``), so it imports neither.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from .libraries import library_script
from .notebook_output import notebook_html


def _is_view(obj) -> bool:
    """Whether ``obj`` has the interface of a :class:`tl_directional.views.View`."""
    return callable(getattr(obj, "body_html", None)) and all(
        hasattr(obj, a) for a in ("title", "data", "libraries", "caption", "name"))


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 16px 24px; color: #222; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 6px; }
.tld-meta { font-size: 13px; color: #555; } .tld-meta td { padding: 1px 12px 1px 0; }
.tld-caption { font-size: 13px; color: #444; margin: 4px 0 8px; max-width: 1100px; }
.tld-section { border-top: 1px solid #e5e5e5; padding-top: 4px; }
.tld-csv { font-size: 12px; }
.tld-note { background: #fff6e0; border: 1px solid #f0d080; padding: 6px 10px; font-size: 13px; }
"""


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s[:48] or "view"


class Report:
    """An ordered list of views (and text) rendered as one offline HTML page.

    Example::

        rep = Report("My model")
        rep.add(depth_profile(prof), caption="...").add(head_heatmaps(prof))
        rep.save("out/")          # out/index.html + one CSV per view
    """

    def __init__(self, title: str = "tl-directional report", metadata: dict | None = None):
        self.title = title
        self.metadata = dict(metadata or {})
        self.items: list[tuple[str, object, str, str]] = []  # (kind, view|html, caption, csv name)

    def add(self, view, *, caption: str | None = None, name: str | None = None) -> Report:
        """Append a view (a :class:`tl_directional.views.View`); ``name`` is the stem of its CSV
        file (default: ``view.name``, else from the title; repeated names get ``_2``, ``_3``, ...)."""
        if not _is_view(view):
            raise TypeError(f"Report.add takes a tl_directional.views.View, got {type(view).__name__}")
        used = {it[3] for it in self.items}
        stem = name or view.name or _slug(view.title)
        base, i = stem, 2
        while stem in used:
            stem, i = f"{base}_{i}", i + 1
        self.items.append(("view", view, view.caption if caption is None else caption, stem))
        return self

    def add_html(self, fragment: str) -> Report:
        """Append trusted HTML (a note, a table); it must not reference external resources."""
        self.items.append(("html", fragment, "", ""))
        return self

    def add_text(self, text: str, *, note: bool = False) -> Report:
        """Append a paragraph of plain text (escaped); ``note=True`` highlights it."""
        cls = "tld-note" if note else "tld-caption"
        return self.add_html(f'<p class="{cls}">{html.escape(text)}</p>')

    @property
    def views(self) -> list:
        return [it[1] for it in self.items if it[0] == "view"]

    def libraries(self) -> list[str]:
        needed = {lib for v in self.views for lib in v.libraries}
        return [lib for lib in ("plotly", "circuitsvis") if lib in needed]

    def to_html(self, *, csv_links: bool = False) -> str:
        """The page. Each library its views need is inlined once, in the head."""
        head = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(self.title)}</title>",
            f"<style>{_CSS}</style>",
            "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>",
        ]
        head += [library_script(lib) for lib in self.libraries()]
        head.append("</head><body>")
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        if self.metadata:
            rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>"
                           for k, v in self.metadata.items())
            body.append(f'<table class="tld-meta">{rows}</table>')
        for kind, item, caption, stem in self.items:
            if kind == "html":
                body.append(item)
                continue
            view = item
            body.append(f'<section class="tld-section" data-view="{html.escape(type(view).__name__)}" '
                        f'id="{html.escape(stem)}">')
            if view.title != self.title:
                body.append(f"<h2>{html.escape(view.title)}</h2>")
            if caption:
                body.append(f'<p class="tld-caption">{html.escape(caption)}</p>')
            body.append(view.body_html(titled=False))
            if csv_links and not view.data.empty:
                body.append(f'<p class="tld-csv">Data: <a href="{html.escape(stem)}.csv">{html.escape(stem)}.csv</a></p>')
            body.append("</section>")
        body.append("</body></html>")
        return "\n".join(head + body)

    def save(self, path: str | Path) -> Path:
        """``path`` ending in ``.html``: write that page only. Otherwise ``path`` is a directory:
        write ``index.html`` and ``<name>.csv`` per view (linked from the page). Returns the page."""
        path = Path(path)
        if path.suffix.lower() in (".html", ".htm"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.to_html(), encoding="utf-8")
            return path
        path.mkdir(parents=True, exist_ok=True)
        for kind, view, _, stem in self.items:
            if kind == "view" and not view.data.empty:
                view.data.to_csv(path / f"{stem}.csv", index=False)
        page = path / "index.html"
        page.write_text(self.to_html(csv_links=True), encoding="utf-8")
        return page

    def _repr_html_(self) -> str:
        # as a view's output: the libraries once per notebook or in every output (notebook_output)
        return notebook_html(self.libraries(), "\n".join(v.body_html() for v in self.views))


__all__ = ["Report"]
