"""Benchmark harness of tl-directional: cost ratios of measuring and editing.

Run from the repository root::

    python -m benchmarks.run [--quick] [--json OUT] [--device cpu|cuda]

Modules:

* :mod:`benchmarks.timing`   paired, interleaved timing; median of paired ratios; bootstrap CI.
* :mod:`benchmarks.registry` the record registry (``@register``) and the per-measurement context.
* :mod:`benchmarks.records`  records of features that exist (profile, edits).
* :mod:`benchmarks.planned`  records of features not built yet (sweep, train, compress);
  emitted as ``not_available`` until their module lands.
* :mod:`benchmarks.patching` ``directional_patch`` against ``transformer_lens.patching``.
* :mod:`benchmarks.attribution` ``attribution_patch`` against TransformerLens 4.3's ``attribution_patch``.
* :mod:`benchmarks.memory`   peak-memory worker, one subprocess per corpus size.
* :mod:`benchmarks.training` standalone training-step timing (:func:`step_time_ratio`).
* :mod:`benchmarks.run`      the command line: settings, table, JSON.
* :mod:`benchmarks.shapes`   a decoder's shape, the one description :mod:`benchmarks.floors`,
  :mod:`benchmarks.memory_model` and :mod:`benchmarks.scaling` read.

See ``docs/performance.md`` for the latest numbers and what they mean.
"""
