"""tl_directional.core.roundoff: the round-off bound the parity tests and benchmark checks use."""

from __future__ import annotations

import math

import pytest
import torch

from tl_directional.core.roundoff import roundoff_tolerance


def test_bound_is_safety_eps_scale_sqrt_terms():
    eps32 = torch.finfo(torch.float32).eps
    assert roundoff_tolerance(torch.float32, 2.0, 100) == pytest.approx(4 * eps32 * 2.0 * 10)
    assert roundoff_tolerance(torch.float32, 1.0, 1, safety=1.0) == pytest.approx(eps32)
    # float64 is 2**29 times tighter than float32 at the same scale and length
    ratio = roundoff_tolerance(torch.float32, 3.0, 64) / roundoff_tolerance(torch.float64, 3.0, 64)
    assert ratio == pytest.approx(2.0**29)


def test_bound_covers_a_reordered_float32_sum_and_is_not_vacuous():
    """A long float32 dot product summed in two orders: the gap is inside the bound, and the
    bound is far below the size of the sum (a real error would exceed it)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    terms = x * y
    a = terms.sum()
    b = terms.flip(0).reshape(64, 64).sum(0).sum()
    exact = float((x.double() * y.double()).sum())
    scale = float(terms.abs().sum())  # the magnitude accumulated
    limit = roundoff_tolerance(torch.float32, scale, terms.numel())
    assert abs(float(a) - float(b)) <= limit and abs(float(a) - exact) <= limit
    assert limit < 1e-2 * scale


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": torch.int64, "scale": 1.0}, "dtype=torch.int64 is not a floating"),
        ({"dtype": torch.float32, "scale": -1.0}, r"scale=-1.0 must be a finite number >= 0"),
        ({"dtype": torch.float32, "scale": math.nan}, "scale=nan"),
        ({"dtype": torch.float32, "scale": 1.0, "terms": 0}, "terms=0 must be an integer >= 1"),
        ({"dtype": torch.float32, "scale": 1.0, "safety": 0.0}, "safety=0.0 must be"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        roundoff_tolerance(**kwargs)
