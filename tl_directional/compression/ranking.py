"""Ranking-overlap diagnostic: does ranking weights by perpendicular pruning error say anything
that ranking them by total error does not?

For each linear (``[out, in]``) the per-weight error energies ``total_ij`` and ``perp_ij`` of
:mod:`~tl_directional.compression.weighted` define two rankings. Within each output row (as
Wanda compares), take the ``k = round(sparsity * in)`` weights of lowest error under each (the
set pruning at ``sparsity`` would remove); the overlap is ``|A_total & A_perp| / |A_total|``,
pooled over rows (and over linears for the ``"all"`` row).

The overlap alone is not informative: in ``d`` dimensions a fixed axis has squared cosine about
``1 / d`` with a random direction, so ``perp_ij`` is close to ``total_ij (1 - 1/d)`` for *any*
reference and the two rankings agree almost everywhere whatever the stream does. The
norm-matched isotropic null answers that: each per-token reference ``r_t`` is replaced by a
random isotropic direction with the same norm (seeded), the perpendicular ranking is formed
again and its overlap with the total ranking measured, ``n_null`` times. An observed overlap
inside the null's range says the perpendicular ranking carries no information beyond the
total error at this sparsity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from .compressors import UNITS, linear_weights
from .methods import _check_sparsity, magnitude_mask
from .weighted import ErrorEnergy, collect_error_energy

COLUMNS = ("name", "layer", "key", "reference", "k_per_row", "pruned", "overlap", "null_mean", "null_sd",
           "null_min", "null_max", "n_null", "inside_null")
"""The columns of :func:`ranking_overlap`'s table."""


def _pruned(energy: Tensor, sparsity: float) -> Tensor:
    """The bool ``[out, in]`` set of the lowest-error ``sparsity`` fraction of each row."""
    return ~magnitude_mask(energy, sparsity, per_row=True)


def ranking_overlap(model, calibration=None, *, sparsity: Any = 0.5, n_null: int = 8, seed: int = 0,
                    batch_size: int = 8, layers=None, units: Sequence[str] = UNITS, keys=None,
                    energy: ErrorEnergy | None = None) -> pd.DataFrame:
    """Overlap of the total-error and perpendicular-error pruning sets, beside a norm-matched isotropic null.

    One row per linear in scope and a last row ``name="all"`` pooling them. ``overlap`` is the
    observed ``|A_total & A_perp| / |A_total|``; ``null_mean`` / ``null_sd`` / ``null_min`` /
    ``null_max`` describe the same overlap over ``n_null`` isotropic reference draws (module
    docstring); ``inside_null`` is True when ``null_min <= overlap <= null_max``.

    Args:
        calibration: calibration texts or tokens (required unless ``energy`` is given).
        sparsity: the pruned fraction per row, strictly between 0 and 1.
        n_null: null draws (>= 2, so the spread is defined); seeded by ``seed``.
        energy: a precomputed :class:`ErrorEnergy` holding at least ``n_null`` null draws.

    Raises:
        CalibrationRequiredError: neither ``calibration`` nor ``energy`` was given.
    """
    sparsity = _check_sparsity(sparsity)
    if isinstance(n_null, bool) or not isinstance(n_null, int) or n_null < 2:
        raise ValueError(f"n_null must be an int >= 2 (the null's spread needs two draws), got {n_null!r}; "
                         "8 is the default")
    if energy is None:
        energy = collect_error_energy(model, calibration, layers=layers, units=units, keys=keys,
                                      batch_size=batch_size, n_null=n_null, seed=seed)
    rows = []
    pooled = {"pruned": 0, "both": 0, "null": torch.zeros(n_null, dtype=torch.float64)}
    for lw in linear_weights(model, layers=layers, units=units, keys=keys):
        have = energy.null_par.get(lw.name)
        if have is None or have.shape[0] < n_null:
            raise ValueError(f"energy has {0 if have is None else have.shape[0]} null draws for {lw.name}, "
                             f"n_null={n_null} needs as many; collect it with collect_error_energy(..., "
                             f"n_null={n_null}) or leave energy=None")
        w = lw.get()
        total, _, perp = energy.energies(lw.name, w)
        a = _pruned(total, sparsity)
        n_pruned = int(a.sum())
        both = int((a & _pruned(perp, sparsity)).sum())
        w2 = w.double().pow(2).to(total.device)
        null = torch.tensor([float((a & _pruned((total - w2 * have[i]).clamp_min(0.0), sparsity)).sum())
                             for i in range(n_null)], dtype=torch.float64)
        pooled["pruned"] += n_pruned
        pooled["both"] += both
        pooled["null"] += null
        rows.append(_row(lw.name, lw.layer, lw.key, energy.reference[lw.name],
                         int(round(w.shape[1] * sparsity)), n_pruned, both, null))
    rows.append(_row("all", -1, "all", "per linear", -1, pooled["pruned"], pooled["both"], pooled["null"]))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _row(name, layer, key, reference, k, pruned, both, null_counts: Tensor) -> dict:
    frac = null_counts / max(pruned, 1)
    overlap = both / max(pruned, 1)
    lo, hi = float(frac.min()), float(frac.max())
    return {"name": name, "layer": layer, "key": key, "reference": reference, "k_per_row": k, "pruned": pruned,
            "overlap": overlap, "null_mean": float(frac.mean()), "null_sd": float(frac.std()),
            "null_min": lo, "null_max": hi, "n_null": int(frac.numel()), "inside_null": lo <= overlap <= hi}


__all__ = ["COLUMNS", "ranking_overlap"]
