"""Notebook outputs that carry plotly.js and circuitsvis once per notebook, offline.

A view's notebook output (``_repr_html_`` of :class:`tl_directional.views.View` and of
:class:`tl_directional.figures.page.Report`) needs plotly.js (about 4.8 MB) or circuitsvis's bundle
(about 1.3 MB). In mode ``"once"`` (the default) the first output of a kernel session that
needs a library carries it, inlined from the installed package as in a report, and later
outputs carry only their own markup and data plus a small loader that runs their scripts
once the library is defined on the page (``window.Plotly`` / ``window.CircuitsVis``): a
notebook of 20 figures saved with its outputs is a few MB instead of about 100. Nothing is
fetched from the network either way.

The outputs share one page where the front end renders them into one document (JupyterLab,
Notebook 7, VS Code, nbviewer). Where each output lives in its own frame (Google Colab) a later
output cannot see the first one's library, so there the default is mode ``"inline"``: every
output carries its libraries (the behaviour before this module). Choose explicitly with
:func:`set_notebook_libraries` or the environment variable ``TLD_NOTEBOOK_LIBRARIES``
(``once`` / ``inline``).

Which output carries a library: the first one of the kernel session; and again when the cell
that carried it runs again (the front end's cell id, which JupyterLab, Notebook 7 and VS Code
send), so re-running that cell never leaves the notebook without it. A later output whose
library never arrives (its carrier's output was cleared or deleted) says so after a few
seconds, with the fix: run the carrying cell again, or switch to ``"inline"``. After a kernel
restart the next output carries the libraries again.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections.abc import Sequence

from .libraries import library_script

MODES = ("once", "inline")
#: The global each library defines on the page, which the loader waits for.
_GLOBALS = {"plotly": "Plotly", "circuitsvis": "CircuitsVis"}
_ENV = "TLD_NOTEBOOK_LIBRARIES"
#: Scripts of a later output wait under this type (the browser does not run it) until the loader does.
DEFERRED_TYPE = "text/x-tld-deferred"

_mode: str | None = None
#: library -> (cell id or None, execution count) of the output that carried it in this kernel
_carried: dict[str, tuple[str | None, int | None]] = {}


def _default_mode() -> str:
    env = os.environ.get(_ENV, "").strip().lower()
    if env:
        if env not in MODES:
            raise ValueError(f"{_ENV}={env!r}: choose one of {', '.join(MODES)} (or unset it)")
        return env
    return "inline" if "google.colab" in sys.modules else "once"


def notebook_libraries() -> str:
    """The current mode: ``"once"`` or ``"inline"`` (see the module docstring)."""
    return _mode if _mode is not None else _default_mode()


def set_notebook_libraries(mode: str) -> str:
    """Set how notebook outputs carry their JavaScript libraries; returns the previous mode.

    ``"once"``: the first output of the kernel session that needs plotly.js / circuitsvis
    carries it, later ones refer to it (outputs sharing one page: JupyterLab, Notebook 7,
    VS Code). ``"inline"``: every output carries its libraries, a few MB each (front ends
    that isolate outputs in frames, e.g. Colab). Switching to ``"once"`` makes the next output
    carry its libraries again.
    """
    global _mode
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    previous = notebook_libraries()
    _mode = mode
    if mode == "once" and previous != "once":
        _carried.clear()
    return previous


def _cell() -> tuple[str | None, int | None]:
    """(cell id, execution count) of the cell running now, as far as IPython knows them."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with every notebook kernel
        return None, None
    shell = get_ipython()
    if shell is None:
        return None, None
    header = getattr(shell, "parent_header", None) or {}
    cell_id = (header.get("metadata") or {}).get("cellId")
    return (str(cell_id) if cell_id else None), getattr(shell, "execution_count", None)


def _carries(library: str, cell: tuple[str | None, int | None]) -> bool:
    """Whether the output being made now must carry ``library`` (and note it if so)."""
    previous = _carried.get(library)
    cell_id, count = cell
    if previous is None or (cell_id is not None and previous[0] == cell_id and previous[1] != count):
        _carried[library] = cell
        return True
    return False


def _defer(body: str) -> str:
    """``body`` with every ``<script>`` set to :data:`DEFERRED_TYPE` (only the opening tags: a
    script's content, data included, is left byte for byte)."""
    def retype(m: re.Match) -> str:
        attrs = re.sub(r"""\s+type\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", "", m.group(1))
        return f'<script type="{DEFERRED_TYPE}"{attrs}>{m.group(2)}{m.group(3)}'

    return re.sub(r"<script\b([^>]*)>(.*?)(</script\s*>)", retype, body, flags=re.S | re.I)


def _loader(root_id: str, needs: Sequence[str]) -> str:
    globals_ = ",".join(f'"{_GLOBALS[n]}"' for n in needs)
    names = " and ".join({"plotly": "plotly.js", "circuitsvis": "circuitsvis"}[n] for n in needs)
    note = json.dumps(
        f"tl-directional: this output needs {names}, which the first tl-directional output of this "
        "notebook carries, and it is not loaded on this page. Run the cell that displayed the first "
        "figure again, or run tl_directional.views.set_notebook_libraries(\"inline\") so that every "
        "output carries its libraries.").replace("</", "<\\/")
    return (
        '<script type="text/javascript">\n(function () {\n'
        f'  var root = document.getElementById("{root_id}"), globals = [{globals_}], done = false;\n'
        "  function ready() { return globals.every(function (g) { return typeof window[g] !== \"undefined\"; }); }\n"
        "  function run() {\n"
        "    if (done || !root) return true;\n"
        "    if (!ready()) return false;\n"
        "    done = true;\n"
        "    var missing = root.querySelector('.tld-missing'); if (missing) missing.remove();\n"
        f"    root.querySelectorAll('script[type=\"{DEFERRED_TYPE}\"]').forEach(function (old) {{\n"
        "      var s = document.createElement('script'); s.type = 'text/javascript'; s.text = old.text;\n"
        "      old.parentNode.replaceChild(s, old);\n"
        "    });\n"
        "    return true;\n"
        "  }\n"
        "  if (run()) return;\n"
        "  (window.__tldWaiting = window.__tldWaiting || []).push(run);\n"
        "  setTimeout(function () {\n"
        "    if (done || !root) return;\n"
        f"    var p = document.createElement('p'); p.className = 'tld-missing'; p.textContent = {note};\n"
        "    p.style.cssText = 'font:13px sans-serif;color:#8a4b00;background:#fff6e0;padding:4px 8px;';\n"
        "    root.insertBefore(p, root.firstChild);\n"
        "  }, 4000);\n"
        "})();\n</script>"
    )


_FLUSH = ('<script type="text/javascript">(function () { var w = window.__tldWaiting || []; '
          "window.__tldWaiting = []; w.forEach(function (run) { if (!run()) window.__tldWaiting.push(run); }); "
          "})();</script>")


def notebook_html(libraries: Sequence[str], body: str) -> str:
    """The notebook output of a view (or a report) whose markup is ``body`` and which needs
    ``libraries`` (``"plotly"``, ``"circuitsvis"``), in the current mode.

    ``"inline"``: the libraries' scripts, then ``body`` (self-contained). ``"once"``: the
    libraries this output carries (see :func:`notebook_libraries`), each marked
    ``data-tld-lib="NAME"`` and followed by a call that runs the outputs waiting for it; then
    ``body`` inside ``<div class="tld-output" data-tld-needs="...">`` with its scripts
    deferred (:data:`DEFERRED_TYPE`) and a loader that runs them once every library's global
    is defined.
    """
    libraries = [lib for lib in ("plotly", "circuitsvis") if lib in libraries]
    if not libraries:
        return body
    if notebook_libraries() == "inline":
        return "\n".join([library_script(n) for n in libraries] + [body])
    cell = _cell()
    carried = [lib for lib in libraries if _carries(lib, cell)]
    root = f"tld-out-{uuid.uuid4().hex[:12]}"
    parts = [library_script(n) for n in carried]
    if carried:
        parts.append(_FLUSH)
    parts.append(f'<div class="tld-output" id="{root}" data-tld-needs="{" ".join(libraries)}">'
                 f"{_defer(body)}</div>")
    parts.append(_loader(root, libraries))
    return "\n".join(parts)


def _reset() -> None:
    """Forget which libraries were carried and the mode set (a fresh kernel, for tests)."""
    global _mode
    _mode = None
    _carried.clear()


__all__ = ["DEFERRED_TYPE", "MODES", "notebook_html", "notebook_libraries", "set_notebook_libraries"]
