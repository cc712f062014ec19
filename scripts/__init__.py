"""The project's experiment and result-page scripts, run as ``python scripts/NAME.py ...``
(documented in docs/ and called by the tests that way; none needs installing).

Shared plumbing: :mod:`scripts._common` (the repository root and this directory on
``sys.path``, git state, sha256, data manifests, the page writer ``write_pages``, the exit-2
error path ``run_main``) and :mod:`scripts._realrun` (provenance, held-out text windows, the
per-sequence sums by the sweep's own metric registry, the sequence bootstrap, atomic page
publishing). A study too large for one module keeps its entry point and CLI in ``NAME.py`` and
its other jobs beside it (``NAME_run.py`` measuring, ``NAME_stats.py`` statistics,
``NAME_page.py`` rendering), re-exported by the entry point. The package is linted with the
library (``make lint``: ``ruff check tl_directional tests benchmarks scripts``).
"""
