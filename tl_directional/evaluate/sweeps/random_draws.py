"""Random per-layer scales: each layer draws its own ``s_par`` (seeded), for any scaled edit space.

The paper's revision ("random layerwise value-space scaling") asks whether a model tolerates a
*different* parallel scale at every layer as well as one fixed scale. :func:`random_scales` draws
the ``[n_layers]`` tensor of ``s_par`` values that every edit already accepts as a per-layer scale
(:class:`~tl_directional.edit.ValueScale`, :class:`~tl_directional.edit.ResidualScale`, ...);
:func:`random_setting` wraps it as a sweep :class:`~tl_directional.evaluate.sweeps.setting.Setting`, so
:func:`~tl_directional.evaluate.sweeps.runner.sweep` runs it beside fixed scales (seeded, named in the
setting's label, its exact scales in the checkpoint's fingerprint, resumable like any setting).

Distributions, on ``[low, high]`` (default ``[0, 2]``, the revision's range):

- ``"uniform"``: ``s ~ U(low, high)``;
- ``"gaussian"``: ``N(mean, sd^2)`` (default mean 1, sd 1/3) truncated to ``[low, high]``, drawn
  exactly by the inverse CDF (no rejection loop, so a seed always gives the same draw).

Prefill only (generation): pass ``positions=prefill_positions(prompt_length)`` to the edit, which
scopes it to absolute query positions ``< prompt_length`` (positions are absolute during KV-cached
generation, METHOD.md sec. 4), so the generated tokens run unedited.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ...core.errors import TLDirectionalError
from ...model.indices import normalize_layers
from .setting import Setting

DISTRIBUTIONS = ("uniform", "gaussian")
"""The distributions :func:`random_scales` draws from."""


class RandomScaleError(TLDirectionalError, ValueError):
    """A random-scale distribution that cannot be drawn (unknown name, range, width)."""


def _number(value, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RandomScaleError(f"{argument} must be a finite number, got {value!r}")
    return float(value)


def random_scales(n_layers: Any, dist: Any = "uniform", *, seed: Any, low: Any = 0.0, high: Any = 2.0,
                  mean: Any = 1.0, sd: Any = 1.0 / 3.0) -> Tensor:
    """A ``[n_layers]`` float64 tensor of per-layer ``s_par`` drawn from ``dist`` with ``seed``.

    Args:
        n_layers: the model's layer count (``model.cfg.n_layers``); the result is the per-layer
            scale tensor the edits take.
        dist: ``"uniform"`` on ``[low, high]`` or ``"gaussian"`` (``mean``, ``sd``) truncated to it.
        seed: the draw's seed (required: an unseeded draw could not be reproduced or resumed).
        low, high: the range, ``0 <= low < high <= 2``.
        mean, sd: the Gaussian's centre and width (``sd > 0``); ignored by ``"uniform"``.

    Raises:
        RandomScaleError: unknown ``dist``, a range outside ``[0, 2]`` or of non-positive width,
            ``sd <= 0``, or a non-integer ``seed`` / ``n_layers``.
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise RandomScaleError(f"n_layers must be a positive int (model.cfg.n_layers), got {n_layers!r}")
    if dist not in DISTRIBUTIONS:
        raise RandomScaleError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RandomScaleError(f"seed must be an int (the draw is seeded so it can be reproduced), got {seed!r}")
    if not 0 <= seed < 2**63:  # torch's generator takes a 64-bit seed
        raise RandomScaleError(f"seed {seed} is out of range; pass a seed in [0, 2**63 - 1], e.g. 0, 1, 2")
    low, high = _number(low, "low"), _number(high, "high")
    if not 0.0 <= low < high <= 2.0:
        raise RandomScaleError(f"the range [low, high] = [{low:g}, {high:g}] must lie inside [0, 2] with positive "
                               "width (0 <= low < high <= 2); the revision draws on [0, 2]")
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n_layers, generator=gen, dtype=torch.float64)
    if dist == "uniform":
        return low + (high - low) * u
    mean, sd = _number(mean, "mean"), _number(sd, "sd")
    if sd <= 0:
        raise RandomScaleError(f"sd must be positive (the Gaussian's width), got {sd!r}; the revision uses 1/3")
    a = torch.special.ndtr(torch.tensor((low - mean) / sd, dtype=torch.float64))
    b = torch.special.ndtr(torch.tensor((high - mean) / sd, dtype=torch.float64))
    if not float(b - a) > 0:
        raise RandomScaleError(f"the Gaussian N({mean:g}, {sd:g}^2) has no mass on [{low:g}, {high:g}] in float64; "
                               "move mean inside the range or widen sd")
    # the inverse CDF of the truncated normal: exact and one uniform per layer
    return (mean + sd * torch.special.ndtri(a + (b - a) * u)).clamp(low, high)


def random_setting(space: str, n_layers: int, dist: str = "uniform", *, seed: int, s_perp: float = 1.0,
                   layers=None, **range_args) -> Setting:
    """A sweep :class:`Setting` whose ``s_par`` is drawn per layer (:func:`random_scales`).

    The setting's ``s_par`` is the draw's mean over the edited layers (a summary for tables),
    ``layer_s_par`` the draw itself, and its label names the distribution and seed
    (``"value[random=uniform,seed=3,s_perp=1,L=all]"``), so each draw is its own sweep row.
    """
    values = random_scales(n_layers, dist, seed=seed, **range_args)
    if layers is not None:  # checked against n_layers: an index past it was a raw IndexError
        try:
            layers = normalize_layers(layers, n_layers, "layers")
        except (TypeError, ValueError) as exc:
            raise RandomScaleError(f"random_setting: {exc}") from None
    edited = values if layers is None else values[layers]
    extra = "".join(f",{k}={v:g}" for k, v in sorted(range_args.items()))
    return Setting(space, float(edited.mean()), float(s_perp), None if layers is None else tuple(layers),
                   layer_s_par=tuple(float(v) for v in values), tag=f"random={dist},seed={seed}{extra}")


def prefill_positions(prompt_length: Any) -> slice:
    """``slice(0, prompt_length)``: the edits' ``positions`` that scope them to the prompt (prefill)
    during generation; absolute positions, so cached decoding steps past the prompt are unedited."""
    if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 1:
        raise RandomScaleError(f"prompt_length must be a positive int (the prompt's token count), got {prompt_length!r}")
    return slice(0, prompt_length)


__all__ = ["DISTRIBUTIONS", "RandomScaleError", "prefill_positions", "random_scales", "random_setting"]
