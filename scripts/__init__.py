"""The project's experiment and result-page scripts, run as ``python scripts/NAME.py ...``
(documented in docs/ and called by the tests that way; each script puts the repository root
and this directory on ``sys.path`` itself, so none needs installing).

Shared plumbing: :mod:`scripts._realrun` (provenance, held-out text windows, the per-sequence
sums by the sweep's own metric registry, the sequence bootstrap, atomic page publishing) and
``scripts/claims.py``'s ``write_pages`` (the page builders' one writer). The package is linted
with the library (``make lint``: ``ruff check tl_directional tests benchmarks scripts``).
"""
