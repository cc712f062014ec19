"""How far apart two floating-point computations of the same quantity may land.

Two runs of one computation in one dtype differ when their reductions add in another order:
a batched call against one example at a time, another CPU kernel (AVX2 against AVX-512 / AMX),
another process with another thread count. Neither result is wrong; a test or a benchmark check
that compares them needs a tolerance founded on the dtype, the size of what is compared, and how
many rounded terms went into it, not a constant that held on one CPU.

The model: each rounded addition errs by at most ``eps / 2`` of the running magnitude, and the
errors of ``terms`` additions behave like a random walk, so the accumulated error of a value of
size ``scale`` grows like ``eps * scale * sqrt(terms)`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, sec. 3.1, the probabilistic bound; the worst case grows with ``terms``).
``safety`` covers what the model leaves out (cancellation, nonlinearities that amplify a small
input error by a bounded factor). Where exactness is the claim, compare in float64 instead: the
same bound is then about nine orders of magnitude tighter.
"""

from __future__ import annotations

import math

import torch

DEFAULT_SAFETY = 4.0


def roundoff_tolerance(
    dtype: torch.dtype, scale: float, terms: int = 1, *, safety: float = DEFAULT_SAFETY
) -> float:
    """Largest expected ``|a - b|`` between two computations of one value that differ only in
    the order of their floating-point reductions (module docstring).

    Args:
        dtype: the floating dtype both computations ran in (``torch.float32``, ``torch.float64``,
            ``torch.bfloat16``, ...).
        scale: the magnitude of the values the result was accumulated from (for example the
            largest ``|score|`` compared, or the largest activation a difference is taken of);
            must be finite and >= 0.
        terms: the number of rounded terms along the longest chain of reductions that produced
            it (for a model's output, about ``d_model * n_layers``; for a gradient, twice that).
        safety: the factor over the random-walk estimate (default 4).

    Returns:
        ``safety * eps(dtype) * scale * sqrt(terms)``, as a float.

    Raises:
        ValueError: a non-floating dtype, a negative or non-finite ``scale``, ``terms < 1`` or
            ``safety <= 0``.
    """
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype={dtype!r} is not a floating torch dtype; pass e.g. torch.float32")
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale={scale!r} must be a finite number >= 0 (the compared magnitude)")
    if int(terms) != terms or terms < 1:
        raise ValueError(f"terms={terms!r} must be an integer >= 1 (rounded terms accumulated)")
    if not (math.isfinite(safety) and safety > 0):
        raise ValueError(f"safety={safety!r} must be a finite number > 0")
    return float(safety * torch.finfo(dtype).eps * scale * math.sqrt(terms))


__all__ = ["DEFAULT_SAFETY", "roundoff_tolerance"]
