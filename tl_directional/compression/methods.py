"""The compression methods' matrix math: pure functions of one ``[out, in]`` weight matrix.

Round-to-nearest quantize-dequantize (:func:`rtn_matrix`), the AWQ scale search
(:func:`awq_matrix`), magnitude / Wanda keep-masks (:func:`magnitude_mask`,
:func:`wanda_score`, :func:`nm_mask`) and the truncated SVD (:func:`low_rank_matrix`),
with the argument checks they share. Rows are output channels; groups and N:M blocks run
along the input axis. Nothing here knows about models: the model-level compressors
(:func:`~tl_directional.compression.compressors.quantize_rtn`, :func:`~tl_directional.compression.compressors.prune_wanda`,
:func:`~tl_directional.compression.compressors.compress`, ...) live in :mod:`tl_directional.compression.compressors`,
which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

SUPPORTED_BITS = (2, 3, 4, 5, 6, 7, 8)




def _check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be an int in {SUPPORTED_BITS[0]}..{SUPPORTED_BITS[-1]}, got {bits!r} "
                         "(8/4/3 are the usual settings)")
    return bits


def _check_group(group_size) -> int | None:
    if group_size is None:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be None (per output channel) or a positive int, got {group_size!r}")
    return group_size


def _check_sparsity(sparsity) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 < float(sparsity) < 1.0:
        raise ValueError(f"sparsity must be a number strictly between 0 and 1, got {sparsity!r}")
    return float(sparsity)


def _check_nm(n_m) -> tuple[int, int]:
    try:
        n, m = (int(x) for x in n_m)
    except (TypeError, ValueError):
        raise ValueError(f"n_m must be a pair (N, M) like (2, 4), got {n_m!r}") from None
    if not 0 < n < m:
        raise ValueError(f"n_m=(N, M) needs 0 < N < M, got {n_m!r}")
    return n, m


def _grouped(w: Tensor, group_size: int | None) -> tuple[Tensor, int]:
    """``[out, in] -> [out, n_groups, g]``; a partial last group is padded with copies of the
    row's last value (which lies in that group, so its min / max / absmax are unchanged)."""
    out_dim, in_dim = w.shape
    g = in_dim if group_size is None else min(group_size, in_dim)
    pad = (-in_dim) % g
    if pad:
        w = torch.cat([w, w[:, -1:].expand(out_dim, pad)], dim=1)
    return w.reshape(out_dim, -1, g), in_dim


def rtn_matrix(w: Tensor, bits: Any, group_size: Any = None, symmetric: bool = True) -> Tensor:
    """Round-to-nearest quantize-dequantize of an ``[out, in]`` matrix.

    Symmetric: ``scale = absmax / (2^(b-1) - 1)``, integers in ``[-2^(b-1), 2^(b-1) - 1]``.
    Asymmetric: ``scale = (max - min) / (2^b - 1)``, integer zero point, integers in
    ``[0, 2^b - 1]``. Statistics per output row (``group_size=None``) or per group of
    ``group_size`` consecutive input channels within a row.
    """
    _check_bits(bits)
    group_size = _check_group(group_size)
    x, in_dim = _grouped(w, group_size)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scale = x.abs().amax(-1, keepdim=True) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.clamp(torch.round(x / scale), -qmax - 1, qmax)
        deq = q * scale
    else:
        qmax = 2**bits - 1
        lo = x.amin(-1, keepdim=True)
        hi = x.amax(-1, keepdim=True)
        scale = (hi - lo) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = torch.round(-lo / scale)
        q = torch.clamp(torch.round(x / scale) + zero, 0, qmax)
        deq = (q - zero) * scale
    return deq.reshape(w.shape[0], -1)[:, :in_dim]


def magnitude_mask(score: Tensor, sparsity: Any, *, per_row: bool) -> Tensor:
    """Keep-mask (True = kept) removing the ``sparsity`` fraction of smallest scores,
    per matrix or per row. Ties are broken by position, so the count is exact."""
    _check_sparsity(sparsity)
    if per_row:
        k = int(round(score.shape[1] * sparsity))
        idx = torch.argsort(score, dim=1, stable=True)[:, :k]
        mask = torch.ones_like(score, dtype=torch.bool)
        mask.scatter_(1, idx, False)
        return mask
    flat = score.reshape(-1)
    k = int(round(flat.numel() * sparsity))
    idx = torch.argsort(flat, stable=True)[:k]
    mask = torch.ones_like(flat, dtype=torch.bool)
    mask[idx] = False
    return mask.reshape(score.shape)


def nm_mask(score: Tensor, n: int, m: int) -> Tensor:
    """Keep-mask with exactly ``n`` of every ``m`` consecutive input channels kept per row."""
    out_dim, in_dim = score.shape
    if in_dim % m:
        raise ValueError(f"N:M pruning with M={m} needs the input size to be a multiple of M; "
                         f"a weight has {in_dim} input channels")
    s = score.reshape(out_dim, in_dim // m, m)
    idx = torch.argsort(s, dim=-1, descending=True, stable=True)[..., :n]
    mask = torch.zeros_like(s, dtype=torch.bool)
    mask.scatter_(-1, idx, True)
    return mask.reshape(out_dim, in_dim)


def low_rank_matrix(w: Tensor, rank_fraction: float) -> tuple[Tensor, int]:
    """Best rank-``k`` approximation (truncated SVD), ``k = max(1, round(f * min(out, in)))``."""
    k = max(1, int(round(rank_fraction * min(w.shape))))
    u, s, vh = torch.linalg.svd(w.double(), full_matrices=False)
    return ((u[:, :k] * s[:k]) @ vh[:k]).to(w.dtype), k


def awq_matrix(w: Tensor, x: Tensor, mean_abs: Tensor, bits: Any, group_size: Any, symmetric: bool,
               alphas: Sequence[float]) -> tuple[Tensor, float]:
    """AWQ-style scaled RTN of one ``[out, in]`` matrix: input-channel scales
    ``s = mean|x|^a / sqrt(max * min)``, ``W' = Q(W diag(s)) diag(s)^-1``, with ``a`` the
    first of ``alphas`` minimising ``||x W'^T - x W^T||`` on the calibration inputs ``x``
    (``[n, in]``). Returns ``(W', a)``."""
    x = x.to(w.device, w.dtype)
    mag = mean_abs.to(w.device, w.dtype).clamp_min(1e-8)
    ref = x @ w.T
    best, best_err, best_a = None, float("inf"), 0.0
    for a in alphas:
        s = mag**a
        s = s / (s.max() * s.min()).sqrt()
        cand = rtn_matrix(w * s, bits, group_size, symmetric) / s
        err = float(((x @ cand.T) - ref).pow(2).sum())
        if err < best_err:
            best, best_err, best_a = cand, err, a
    return best, best_a


def wanda_score(w: Tensor, input_rms: Tensor) -> Tensor:
    """Wanda's pruning score ``|W_ij| * ||x_j||_2`` of an ``[out, in]`` matrix, from the
    per-input-channel norms ``input_rms`` (``[in]``)."""
    return w.abs() * input_rms.to(w.device, w.dtype)[None, :]


__all__ = [
    "SUPPORTED_BITS",
    "awq_matrix",
    "low_rank_matrix",
    "magnitude_mask",
    "nm_mask",
    "rtn_matrix",
    "wanda_score",
]
