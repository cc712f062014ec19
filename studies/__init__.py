"""The project's studies: the paper's claims measured on real models, as committed data and the
result pages built from it alone (``docs/results/``), beside the library (``tl_directional``),
which they use through its public faces.

``python -m studies {list, run NAME [ARGS], build [--check]}`` (:mod:`studies.cli`). Layout:

* :mod:`studies.registry`: the registry of studies (``@study(...)`` on each study's ``main``);
* :mod:`studies.runner`: the one run pipeline of a measuring study (dirty-tree check, provenance,
  stem, manifest, ``--resume``, the per-text window loop, atomic write);
* :mod:`studies.pages`: the one page writer (every page and the marker blocks of ``README.md`` /
  ``docs/results.md``), ``make results``;
* :mod:`studies.common` (paths, git state, hashing, data manifests, the error exit) and
  :mod:`studies.realrun` (held-out text windows, per-window records, provenance);
* one sub-package per study (``claims``, ``accuracy``, ``instruments``, ``depth``, ``training``,
  ``pass_training``, ``compression``, ``compression_study``), each with ``run.py`` (measuring),
  ``stats.py`` (statistics), ``page.py`` (rendering) and ``cli.py`` (its registered command
  line) as it needs; the statistics themselves (Spearman, Holm) are the library's,
  :mod:`tl_directional.core.rank` and :mod:`tl_directional.core.paired`;
* :mod:`studies.data`: corpus and model preparation (``python -m studies.data.NAME``);
* :mod:`studies.explore`: one-off explorations (``python -m studies.explore.NAME``).

Adding a study: ``docs/adding_a_study.md``. Linted with the library (``make lint``).
"""
