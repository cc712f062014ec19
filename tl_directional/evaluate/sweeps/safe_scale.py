"""The safe-scale search: the widest scale interval around 1 whose damage (the sweep's
``delta_loss`` or ``kl``) stays within a budget (:func:`find_safe_scale`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from ...edit import EDIT_SPACES, Edit, NonFiniteEditError, apply_edits
from ...figures.sweep import safe_scale_figure
from ...model.handle import device_of
from ...model.inputs import iter_batches, prepare_inputs
from ...model.sites import analysis_sites
from .metrics import BaselineStats, MetricSums
from .random_draws import RandomScaleError
from .setting import Setting


def _forward(model, batch):
    return model(batch.tokens, attention_mask=batch.attention_mask)




class _Evaluator:
    """Damage of an edit on a small token set, with the baseline cached once."""

    def __init__(self, model, inputs, batch_size: int, attention_mask=None):
        self.model = model
        batch = prepare_inputs(model, inputs, attention_mask, min_tokens=2)
        device = device_of(model)
        self.batches = [b.to(device) for b in iter_batches(batch, batch_size)]
        with torch.no_grad():
            self.base = [BaselineStats(_forward(model, b), b.tokens, b.attention_mask) for b in self.batches]
        self.n_evals = 0

    def damage(self, edits: Sequence[Edit]) -> dict:
        total = MetricSums()
        with torch.no_grad(), apply_edits(self.model, *edits):
            for b, base in zip(self.batches, self.base, strict=True):
                total.add_(base.compare(_forward(self.model, b)))
        self.n_evals += 1
        return total.row()


@dataclass
class SafeScaleResult:
    """Outcome of :func:`find_safe_scale` for one layer group and one scale."""

    which: str  # "s_par" or "s_perp"
    layers: tuple[int, ...] | None
    interval: tuple[float, float]
    budget: float
    metric: str
    evaluations: pd.DataFrame
    hit_bounds: tuple[bool, bool]
    note: str = ""

    def figure(self):
        """Plotly figure of the evaluated damage with the budget and the interval
        (:func:`tl_directional.views.safe_scale_figure`)."""
        return safe_scale_figure(self)


def find_safe_scale(
    model,
    inputs,
    edit_factory: Callable[..., Edit | Sequence[Edit]] | str | Setting,
    budget: float = 0.05,
    *,
    metric: str = "delta_loss",
    which: str = "s_par",
    bounds: tuple[float, float] = (-1.0, 3.0),
    grid_points: int = 9,
    refine_steps: int = 4,
    layer_groups: Sequence[Sequence[int] | None] | None = None,
    batch_size: int = 8,
) -> list[SafeScaleResult]:
    """Widest interval ``[lo, hi]`` containing 1 for one scale whose damage stays within ``budget``.

    Args:
        edit_factory: a scaled space name from :data:`~tl_directional.edit.EDIT_SPACES` or a callable
            ``f(s_par=..., s_perp=..., layers=...) -> Edit | [Edit]``. A :class:`Setting` is refused
            (its scales are fixed); a random per-layer one (``random_setting``) with a
            :class:`~tl_directional.evaluate.sweeps.random_draws.RandomScaleError` that gives the callable
            searching the draw's amplitude, ``s_par_L = 1 + (s - 1) * (draw_L - 1)`` (``s = 2``
            is the draw).
        budget: the largest allowed ``metric`` (``delta_loss`` in nats, or ``kl``).
        which: ``"s_par"`` or ``"s_perp"`` (the other scale stays 1).
        bounds: the search range; the interval never leaves it.
        grid_points: coarse grid over ``bounds`` (1 is always added).
        refine_steps: bisection steps per boundary between the last passing and the
            first failing grid point.
        layer_groups: search separately per group (e.g. ``[[0], [1], [2, 3]]``);
            None searches all layers at once.

    Evaluations: ``grid_points + 1 + 2 * refine_steps`` per group at most.

    What it can miss: the loss need not be monotonic in the scale. The interval is
    bounded by the first failing *evaluated* point on each side of 1; a failure
    narrower than the grid spacing between two passing points is not seen, and a
    second safe region beyond a failing point is not reported.
    """
    if metric not in ("delta_loss", "kl"):
        raise ValueError(f"metric must be 'delta_loss' or 'kl', got {metric!r}")
    if which not in ("s_par", "s_perp"):
        raise ValueError(f"which must be 's_par' or 's_perp', got {which!r}")
    lo_b, hi_b = float(bounds[0]), float(bounds[1])
    if not (math.isfinite(lo_b) and math.isfinite(hi_b) and lo_b < 1.0 < hi_b):
        raise ValueError(f"bounds must be finite with lo < 1 < hi, got {bounds!r}")
    if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget >= 0):
        raise ValueError(f"budget must be a finite non-negative number, got {budget!r}")
    if grid_points < 2:
        raise ValueError(f"grid_points must be >= 2, got {grid_points}")
    if isinstance(edit_factory, str):
        space = edit_factory
        scaled = sorted(name for name, sp in EDIT_SPACES.items() if sp.scaled)  # hard-diag has no scale to search
        if space not in scaled:
            raise ValueError(f"edit_factory space must be one of {scaled}, got {space!r}")

        def factory(s_par=1.0, s_perp=1.0, layers=None):
            return Setting(space, s_par, s_perp, None if layers is None else tuple(layers)).edits()
    elif isinstance(edit_factory, Setting):
        _refuse_setting(edit_factory)
    elif callable(edit_factory):
        factory = edit_factory
    else:
        raise TypeError(f"edit_factory must be a space name or a callable f(s_par=, s_perp=, layers=), got "
                        f"{type(edit_factory).__name__}")

    analysis_sites(model, "find_safe_scale", ValueError, "dropout would make the damage at each scale random")
    evaluator = _Evaluator(model, inputs, batch_size)
    groups = [None] if layer_groups is None else [None if g is None else tuple(g) for g in layer_groups]
    return [
        _search_group(evaluator, factory, group, budget=float(budget), metric=metric, which=which,
                      bounds=(lo_b, hi_b), grid_points=grid_points, refine_steps=refine_steps)
        for group in groups
    ]


def _refuse_setting(setting: Setting) -> None:
    """A :class:`Setting` fixes its scales, so the search has nothing to vary: say what to pass instead.

    A random per-layer setting (``layer_s_par``, from ``random_setting``) is refused with a
    :class:`~tl_directional.evaluate.sweeps.random_draws.RandomScaleError`: its draw *is* every layer's
    ``s_par``, and a search over one scalar cannot be defined on it without choosing a path through
    the per-layer values. The path this library documents (docs/sweeps.md, "Safe-scale search")
    is the draw's amplitude, ``s_par_L = 1 + (s - 1) * (draw_L - 1)``, passed as a callable.
    """
    if setting.layer_s_par is not None:
        raise RandomScaleError(
            f"find_safe_scale(edit_factory={setting.label!r}): a random per-layer setting fixes every layer's "
            "s_par (its draw), so there is no single scale to search. To evaluate the draw, pass it to "
            "sweep(model, inputs, [setting]); to search how much of the draw stays within the budget, pass a "
            "callable along the draw's amplitude, e.g. edit_factory=lambda s_par=1.0, s_perp=1.0, layers=None: "
            f"Setting({setting.space!r}, layers=layers and tuple(layers)).edits(s_par=1 + (s_par - 1) * (draw - 1), "
            "s_perp=s_perp) with draw = torch.tensor(setting.layer_s_par) (s = 1 unedited, s = 2 the draw itself; "
            "docs/sweeps.md, 'Safe-scale search')")
    raise TypeError(
        f"find_safe_scale(edit_factory={setting.label!r}): a Setting fixes its scales, so there is nothing to "
        f"search; pass its space name, edit_factory={setting.space!r}"
        + ("" if setting.layers is None else f", with layer_groups=[{list(setting.layers)!r}]"))


def _search_group(evaluator: _Evaluator, factory, group, *, budget, metric, which, bounds, grid_points,
                  refine_steps) -> SafeScaleResult:
    """Grid over ``bounds``, walk outward from 1 while the cost stays within budget,
    then bisect each boundary between the last passing and first failing point."""
    evals: dict[float, float] = {}

    def cost(s: float) -> float:
        if s not in evals:
            edits = factory(**{which: s, "layers": None if group is None else list(group)})
            edits = [edits] if isinstance(edits, Edit) else list(edits)
            try:
                evals[s] = evaluator.damage(edits)[metric]
            except NonFiniteEditError:  # an overflowing scale is beyond any budget
                evals[s] = math.inf
        return evals[s]

    points = sorted(set(torch.linspace(bounds[0], bounds[1], grid_points).tolist()) | {1.0})
    for p in points:
        cost(p)
    ones = points.index(1.0)
    edges = []
    for direction in (-1, 1):
        i = ones
        while 0 <= i + direction < len(points) and cost(points[i + direction]) <= budget:
            i += direction
        passing = points[i]
        if not 0 <= i + direction < len(points):
            edges.append((passing, True))
            continue
        failing = points[i + direction]
        for _ in range(refine_steps):
            mid = 0.5 * (passing + failing)
            if cost(mid) <= budget:
                passing = mid
            else:
                failing = mid
        edges.append((passing, False))
    ev = pd.DataFrame({"scale": list(evals), "cost": list(evals.values())}).sort_values("scale")
    note = "the unedited model already exceeds the budget" if cost(1.0) > budget else ""
    return SafeScaleResult(
        which=which, layers=group, interval=(edges[0][0], edges[1][0]), budget=budget, metric=metric,
        evaluations=ev.reset_index(drop=True), hit_bounds=(edges[0][1], edges[1][1]), note=note,
    )




__all__ = ["SafeScaleResult", "find_safe_scale"]
