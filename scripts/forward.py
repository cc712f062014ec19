"""The thin entry points of ``scripts/``: the committed result pages cite the commands that made
them (``python scripts/claims.py run ...``), and those pages are a pure function of their data,
so the commands stay and forward to the studies' one command line (``python -m studies``).

Each entry point names its routes: the first argument picks the ``python -m`` command that the
rest of the arguments are handed to, with the repository root put on ``PYTHONPATH`` (the studies
package is not installed; nothing is put on ``sys.path``)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def forward(routes: dict[str, list[str]], argv: list[str] | None = None) -> int:
    """Run ``python -m ROUTE ARGS`` for ``argv = [name, *ARGS]``; 2 with the routes for another name."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in routes:
        script = os.path.basename(sys.argv[0])
        print(f"usage: python scripts/{script} {{{','.join(routes)}}} ...\n"
              + "\n".join(f"  {name}: python -m {' '.join(route)} ..." for name, route in routes.items()),
              file=sys.stderr)
        return 2
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.call([sys.executable, "-m", *routes[argv[0]], *argv[1:]], env=dict(os.environ, PYTHONPATH=path))
