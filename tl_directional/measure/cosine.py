"""The layer-drop cosine link: ``1 - cos(x, x + Delta)`` as a function of the split's ``alpha`` and ``beta``.

Layer-dropping methods score a block by the cosine between the stream entering it and the stream
leaving it. With the split of METHOD.md sec. 1 against the stream ``x`` (``r = x``, ``u = Delta``):

    Delta  = alpha x + Delta_perp,          beta = ||Delta_perp|| / ||x||
    x + Delta = (1 + alpha) x + Delta_perp  (the two terms orthogonal)

so ``cos(x, x + Delta) = (1 + alpha) / sqrt((1 + alpha)^2 + beta^2) = sign(1 + alpha) / sqrt(1 + rho^2)``
with ``rho = beta / |1 + alpha|``: the tangent of the angle the update turns the stream by. Hence

    1 - cos(x, x + Delta) = 1 - sign(1 + alpha) / sqrt(1 + rho^2)

which for ``1 + alpha > 0`` (the stream is not reversed, the usual case) increases monotonically
with ``rho`` and is ``rho^2 / 2 + O(rho^4)`` for small ``rho``: the cosine score measures the
perpendicular update normalised by the parallel-shifted stream, and nothing else. Conventions
(never NaN): ``1 + alpha = 0`` gives ``rho = inf`` and ``1 - cos = 1`` (``x + Delta`` orthogonal
to ``x``, or zero, where the cosine is taken as 0); a degenerate stream (``||x||^2 <= eps``)
gives ``beta = inf``, ``rho = inf`` and ``1 - cos = 1``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from ..core.geometry import DEFAULT_EPS, compute_dtype


def drop_cosine(alpha: Float[Tensor, "*batch"], beta: Float[Tensor, "*batch"]) -> tuple[Tensor, Tensor]:
    """``(rho, 1 - cos(x, x + Delta))`` per token from ``alpha`` and ``beta = ||Delta_perp|| / ||x||``
    (same shapes, ``[*batch]``), by the closed form of the module docstring, in the compute dtype."""
    dtype = compute_dtype(torch.promote_types(alpha.dtype, beta.dtype))
    alpha, beta = alpha.to(dtype), beta.to(dtype)
    shift = 1.0 + alpha
    size = shift.abs()
    inf = torch.full_like(size, float("inf"))
    rho = torch.where(size > 0, beta / torch.where(size > 0, size, torch.ones_like(size)), inf)
    rho = torch.where((size > 0) & (beta == 0), torch.zeros_like(rho), rho)
    cos = torch.where(torch.isinf(rho), torch.zeros_like(rho), torch.sign(shift) / torch.sqrt(1.0 + rho * rho))
    return rho, 1.0 - cos


def stream_beta(perp_sq: Float[Tensor, "*batch"], reference_sq: Float[Tensor, "*batch"],
                eps: float = DEFAULT_EPS) -> Tensor:
    """``beta = ||Delta_perp|| / ||x||`` from the squared norms; ``inf`` where ``||x||^2 <= eps``."""
    ok = reference_sq > eps
    return torch.where(ok, (perp_sq / torch.where(ok, reference_sq, torch.ones_like(reference_sq))).sqrt(),
                       torch.full_like(perp_sq, float("inf")))


__all__ = ["drop_cosine", "stream_beta"]
