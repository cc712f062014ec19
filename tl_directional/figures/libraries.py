"""The JavaScript libraries the views need (plotly.js, circuitsvis's bundle), read from the
installed ``plotly`` and ``circuitsvis`` packages, never from the network, and made safe to
inline in a ``<script>`` element. Used by the page shell (:mod:`.page`) and by notebook outputs
(:mod:`.notebook_output`)."""

from __future__ import annotations

import functools
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# JavaScript libraries, read from the installed packages (never from the network)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as shipped inside the installed ``plotly`` package."""
    from plotly.offline import get_plotlyjs

    return _script_safe(get_plotlyjs())


@functools.lru_cache(maxsize=1)
def circuitsvis_js() -> str:
    """circuitsvis's browser bundle (``dist/cdn/iife.js``, about 1.3 MB), which defines the
    global ``CircuitsVis`` with ``CircuitsVis.render(id, Component, props)``."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not path.is_file():  # pragma: no cover - broken install
        raise FileNotFoundError(f"circuitsvis bundle not found at {path}; reinstall circuitsvis")
    text = path.read_text(encoding="utf-8")
    # The source-map comment would make devtools ask for iife.js.map next to the page.
    text = "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL="))
    return _script_safe(text)


LIBRARIES = {"plotly": plotly_js, "circuitsvis": circuitsvis_js}


def _script_safe(js: str) -> str:
    """Make JavaScript safe to inline in ``<script>``: ``</script`` would end the element.
    Inside JS string and regex literals ``<\\/`` means the same as ``</``."""
    return js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def library_script(name: str) -> str:
    """A ``<script>`` element that inlines library ``name`` ("plotly" or "circuitsvis")."""
    return f'<script type="text/javascript" data-tld-lib="{name}">\n{LIBRARIES[name]()}\n</script>'


__all__ = ["LIBRARIES", "circuitsvis_js", "library_script", "plotly_js"]
