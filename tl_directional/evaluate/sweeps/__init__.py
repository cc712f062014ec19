"""Sweeps: run a model under a grid of component scalings and compare it with the unedited one.

:func:`grid` builds the settings (:class:`Setting`: one edit space, ``s_par``, ``s_perp``, a layer
set), :func:`sweep` evaluates them batch by batch against the baseline (the metric registries of
:mod:`~tl_directional.evaluate.sweeps.metrics`, the resumable progress file of
:mod:`~tl_directional.evaluate.sweeps.sweep_store`), :func:`find_safe_scale` searches the widest
scale that keeps a metric within bounds, :func:`random_setting` / :func:`random_scales` draw
per-layer scales (:mod:`~tl_directional.evaluate.sweeps.random_draws`) and :func:`parse_edit_spec`
reads a ``sweep.csv`` row label back into edits (:mod:`~tl_directional.evaluate.sweeps.edit_spec`).
The sweep loop itself lives in :mod:`~tl_directional.evaluate.sweeps.runner`.
"""

from .edit_spec import GRAMMAR, EditSpecError, layer_sets, parse_edit_spec, spec_edits
from .metrics import (
    METRIC_REGISTRY,
    METRICS,
    QUANTITIES,
    BaselineStats,
    Metric,
    MetricSums,
    Quantity,
    batch_metric_sums,
    prediction_mask,
    top1_agreement,
)
from .random_draws import (
    DISTRIBUTIONS,
    RandomScaleError,
    prefill_positions,
    random_scales,
    random_setting,
)
from .runner import grid, sweep
from .safe_scale import SafeScaleResult, find_safe_scale
from .setting import Setting
from .sweep_store import CheckpointMismatch, SweepProgress

__all__ = [
    "DISTRIBUTIONS",
    "GRAMMAR",
    "METRICS",
    "METRIC_REGISTRY",
    "QUANTITIES",
    "BaselineStats",
    "CheckpointMismatch",
    "EditSpecError",
    "Metric",
    "MetricSums",
    "Quantity",
    "RandomScaleError",
    "SafeScaleResult",
    "Setting",
    "SweepProgress",
    "batch_metric_sums",
    "find_safe_scale",
    "grid",
    "layer_sets",
    "parse_edit_spec",
    "prediction_mask",
    "prefill_positions",
    "random_scales",
    "random_setting",
    "spec_edits",
    "sweep",
    "top1_agreement",
]
