"""The discriminativeness study's statistics (``studies/compression_study/``): the
label-free diagnostics from pooled local-error sums, and Spearman's rho vectorised over
bootstrap draws (the library's, :mod:`tl_directional.core.rank`, on tensors).

Imported by :mod:`compression_study` (the entry point, which re-exports these names).
"""

from __future__ import annotations

import torch

from tl_directional.compression.accumulate import STAT_INDEX
from tl_directional.core import rank

UNITS = ("attn", "mlp", "block")
# name -> (function of pooled sums [..., K], description); bigger = more damage for all of them
DIAGNOSTICS = {
    "perp_energy": "sqrt(sum ||e_perp||^2 / sum ||u||^2)  (headline)",
    "par_energy": "sqrt(sum ||e_par||^2 / sum ||u||^2)",
    "one_minus_cos": "1 - mean cos(u', u)",
    "mse_energy": "sum ||e||^2 / sum ||u||^2",
    "perp_mean": "mean ||e_perp|| / ||u|| (per token)",
    "par_mean": "mean ||e_par|| / ||u|| (per token)",
    "perp_share_energy": "sum ||e_perp||^2 / sum ||e||^2",
    "perp_energy_vs_resid": "sqrt(sum ||e_perp,r||^2 / sum ||u||^2), split against the residual",
}


def diagnostics(sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every diagnostic from pooled sums ``[..., K]`` (vectorised over leading axes)."""
    g = {k: sums[..., i] for k, i in STAT_INDEX.items()}
    u = g["u_sq"].clamp_min(1e-300)
    n = g["n"].clamp_min(1.0)
    return {
        "perp_energy": (g["e_perp_sq"] / u).sqrt(),
        "par_energy": (g["e_par_sq"] / u).sqrt(),
        "one_minus_cos": 1.0 - g["t_cos"] / n,
        "mse_energy": g["e_sq"] / u,
        "perp_mean": g["t_err_perp"] / n,
        "par_mean": g["t_err_par"] / n,
        "perp_share_energy": g["e_perp_sq"] / g["e_sq"].clamp_min(1e-300),
        "perp_energy_vs_resid": (g["e_perp_r_sq"] / u).sqrt(),
    }


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rho along the last axis, as a float64 tensor: :func:`tl_directional.core.rank.spearman`
    (average ranks for ties), a constant side reading 0 (no rank agreement)."""
    rho = rank.spearman(x.detach().cpu().numpy(), y.detach().cpu().numpy(), if_constant=0.0)
    return torch.as_tensor(rho, dtype=torch.float64)
