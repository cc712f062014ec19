"""The discriminativeness study's statistics (``scripts/compression_study.py``): the
label-free diagnostics from pooled local-error sums, and average ranks and Spearman's rho
vectorised over bootstrap draws.

Imported by :mod:`compression_study` (the entry point, which re-exports these names).
"""

from __future__ import annotations

import torch

from tl_directional.compression.geometry import STAT_INDEX

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


def rankdata(x: torch.Tensor) -> torch.Tensor:
    """Average ranks along the last axis (ties share their mean rank)."""
    order = torch.argsort(x, dim=-1, stable=True)
    ranks = torch.empty_like(x, dtype=torch.float64)
    ar = torch.arange(x.shape[-1], dtype=torch.float64).expand_as(ranks)
    ranks.scatter_(-1, order, ar)
    # average ties
    xs = x.gather(-1, order)
    out = ranks.clone()
    flat_x, flat_o, flat_out = xs.reshape(-1, x.shape[-1]), order.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    tied = (flat_x[:, 1:] == flat_x[:, :-1]).any(-1)  # only rows with ties need the loop
    for r in torch.nonzero(tied).flatten().tolist():
        row = flat_x[r]
        i = 0
        while i < row.numel():
            j = i
            while j + 1 < row.numel() and row[j + 1] == row[i]:
                j += 1
            if j > i:
                flat_out[r, flat_o[r, i:j + 1]] = (i + j) / 2.0
            i = j + 1
    return flat_out.reshape(x.shape)


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rho along the last axis (Pearson correlation of average ranks)."""
    rx, ry = rankdata(x), rankdata(y)
    rx = rx - rx.mean(-1, keepdim=True)
    ry = ry - ry.mean(-1, keepdim=True)
    den = (rx.pow(2).sum(-1) * ry.pow(2).sum(-1)).sqrt()
    return torch.where(den > 0, (rx * ry).sum(-1) / den.clamp_min(1e-300), torch.zeros_like(den))
