"""Compression diagnostics, one job per module.

- :mod:`~tl_directional.compression.geometry`: the error geometry of a compressed model
  against its dense original (:func:`compression_geometry`, :func:`summarize`,
  :func:`pooled_sums`; METHOD.md sec. 6);
- :mod:`~tl_directional.compression.accumulate`: the per-token sums and the hooked
  forwards behind :func:`compression_geometry` (re-exported by ``geometry``);
- :mod:`~tl_directional.compression.methods`: the compressors' math on one ``[out, in]``
  matrix (RTN, the AWQ search, magnitude / Wanda / N:M masks, truncated SVD; re-exported
  by :mod:`tl_directional.compression.compressors`);
- :mod:`~tl_directional.compression.gate`: the label-free gate (:func:`compress_check`,
  :class:`CheckResult`);
- :mod:`~tl_directional.compression.weighted`: component-weighted Wanda
  (:func:`prune_wanda_weighted`; spec methods ``wanda_perp`` / ``wanda_par``);
- :mod:`~tl_directional.compression.ranking`: the total-vs-perpendicular ranking overlap
  beside its norm-matched isotropic null (:func:`ranking_overlap`);

The compressors themselves live in :mod:`tl_directional.compression.compressors` (re-exported here);
the commands ``compress`` and ``compress-check`` in :mod:`tl_directional.cli`.
"""

from .compressors import (
    CompressionRecord,
    CompressionResult,
    compress,
    drop_layers,
    low_rank,
    prune_magnitude,
    prune_wanda,
    quantize_awq,
    quantize_rtn,
)
from .gate import (
    GATE_COMPONENTS,
    GATE_METRICS,
    CheckResult,
    compress_check,
)
from .geometry import (
    MODES,
    CompatibilityError,
    check_compatible,
    compression_geometry,
    pooled_sums,
    summarize,
)
from .ranking import ranking_overlap
from .save import save_compressed
from .weighted import (
    WEIGHTINGS,
    CalibrationRequiredError,
    ErrorEnergy,
    WeightingError,
    collect_error_energy,
    prune_wanda_weighted,
)

__all__ = [
    # error geometry
    "MODES",
    "CompatibilityError",
    "check_compatible",
    "compression_geometry",
    "pooled_sums",
    "summarize",
    # the gate
    "GATE_METRICS",
    "GATE_COMPONENTS",
    "CheckResult",
    "compress_check",
    # compressors (tl_directional.compression.compressors)
    "CompressionRecord",
    "CompressionResult",
    "compress",
    "drop_layers",
    "low_rank",
    "prune_magnitude",
    "prune_wanda",
    "quantize_awq",
    "quantize_rtn",
    "save_compressed",
    # component-weighted Wanda and its ranking diagnostic
    "WEIGHTINGS",
    "CalibrationRequiredError",
    "ErrorEnergy",
    "WeightingError",
    "collect_error_energy",
    "prune_wanda_weighted",
    "ranking_overlap",
]
