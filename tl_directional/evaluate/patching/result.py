"""One result type for directional patching and attribution: per-example values, means, intervals.

:class:`DirectionalResult` holds, per node type (``"attn"``, ``"mlp"``, ``"head"``, ``"value"``,
``"resid"`` / ``"resid_pre"``, ``"block"``) and per part (``"full"``, ``"par"``, ``"perp"``), a
float64 array whose first axis is the example (the pair; one row when the metric reduces the
batch) and whose other axes are named in ``dims`` (``layer``, ``pos``, ``head``). It gives the
mean over examples, seeded percentile bootstrap intervals (:func:`~tl_directional.core.bootstrap.
bootstrap_mean_interval`), a tidy :meth:`to_frame`, and a heat map (:meth:`figure`).

Beside each parallel share it carries ``random_share``: what a uniformly random line of the same
space carries of a difference (about ``sqrt(2 / (pi d))``), the level a share such as "3% parallel,
97% perpendicular" must be read against.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ...core.bootstrap import bootstrap_mean_interval
from ...core.errors import TLDirectionalError
from ...figures.directional import directional_heatmap

PARTS = ("full", "par", "perp")


class ResultError(TLDirectionalError, KeyError):
    """A node type or part that the result does not hold was asked for."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class DirectionalResult:
    """Per-example directional patching or attribution values (see the module docstring).

    Attributes:
        kind: ``"attribution"`` (first-order estimates) or ``"patch"`` (real patched runs:
            effects, metric minus the corrupted metric).
        values: ``values[node][part]``, float64 ``[example, *dims[node][1:]]``; NaN where a node was
            not computed (a layer left out).
        dims: axis names of each node type's arrays, starting with ``"example"``.
        par_frac: per node type, ``|cos(delta, r)|`` of each difference against its reference,
            shaped like ``values`` (the share of the difference along the reference).
        random_share: per node type, what a random line carries (``E |cos|``) in that space.
        clean_metric, corrupted_metric: per-example metric of the two runs (NaN when unknown).
        notes: what a reader must know (sandwich norms, cache-only runs, ...).
    """

    kind: str
    values: dict[str, dict[str, np.ndarray]]
    dims: dict[str, tuple[str, ...]]
    par_frac: dict[str, np.ndarray] = field(default_factory=dict)
    random_share: dict[str, float] = field(default_factory=dict)
    clean_metric: np.ndarray = field(default_factory=lambda: np.zeros(0))
    corrupted_metric: np.ndarray = field(default_factory=lambda: np.zeros(0))
    notes: tuple[str, ...] = ()

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.values)

    @property
    def n_examples(self) -> int:
        first = next(iter(self.values.values()), {})
        arr = next(iter(first.values()), None)
        return 0 if arr is None else int(arr.shape[0])

    def _get(self, node: str, part: str) -> np.ndarray:
        if node not in self.values:
            raise ResultError(f"node={node!r} is not in this result; it holds {self.node_types}")
        if part not in self.values[node]:
            raise ResultError(
                f"part={part!r} is not in this result for {node!r}; it holds {tuple(self.values[node])}"
            )
        return self.values[node][part]

    def mean(self, node: str | None = None, part: str | None = None):
        """Mean over examples (NaN-aware). ``mean(node, part)`` is one array shaped ``dims[node][1:]``;
        ``mean(node)`` a ``{part: array}``; ``mean()`` a ``{node: {part: array}}``."""
        if node is None:
            return {n: self.mean(n) for n in self.values}
        if part is None:
            return (
                {p: self.mean(node, p) for p in self.values[node]}
                if node in self.values
                else self._get(node, "")
            )
        # a node not computed (NaN for every example, e.g. a path into an earlier layer) has a NaN mean
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            arr = self._get(node, part)
            return (
                np.nanmean(arr, axis=0)
                if np.isfinite(arr).any()
                else np.full(arr.shape[1:], np.nan)
            )

    def tensor(self, node: str, part: str = "full", *, mean: bool = False) -> torch.Tensor:
        """``values[node][part]`` as a float64 torch tensor ``[example, *dims[node][1:]]`` (the
        array's own memory, no copy), or its NaN-aware mean over examples (``mean=True``, shaped
        ``dims[node][1:]``): TransformerLens's patching helpers return tensors, so a result can go
        where theirs went (``imshow``, ``einops``, ``torch`` arithmetic)."""
        return torch.from_numpy(np.ascontiguousarray(self.mean(node, part) if mean else self._get(node, part)))

    def interval(
        self,
        node: str,
        part: str = "full",
        *,
        n_resamples: int = 2000,
        level: float = 0.95,
        seed: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Percentile bootstrap interval of the mean over examples, ``(low, high)`` shaped
        ``dims[node][1:]``, seeded (same seed, same interval)."""
        return bootstrap_mean_interval(
            self._get(node, part), n_resamples=n_resamples, level=level, seed=seed
        )

    def to_frame(
        self, *, intervals: bool = True, n_resamples: int = 2000, level: float = 0.95, seed: int = 0
    ) -> pd.DataFrame:
        """One row per node: ``node_type``, ``layer``, ``pos``, ``head`` (``<NA>`` where the node type
        has no such axis), the mean of ``full`` / ``par`` / ``perp`` over examples, their bootstrap
        ``*_low`` / ``*_high`` (when ``intervals``), ``par_frac`` (mean share of the difference along
        the reference) and ``random_share`` beside it, and ``n_examples``."""
        frames = []
        for node in self.values:
            names = self.dims[node][1:]
            shape = next(iter(self.values[node].values())).shape[1:]
            # shape () (one number per example) has one node: reshape(0, -1) cannot say so
            grid = np.indices(shape).reshape(len(shape), int(np.prod(shape)))
            cols: dict[str, object] = {"node_type": node}
            for axis in ("layer", "pos", "head"):
                cols[axis] = (
                    grid[names.index(axis)] if axis in names else np.full(grid.shape[1], -1)
                )
            for part in self.values[node]:
                cols[part] = self.mean(node, part).reshape(-1)
                if intervals:
                    lo, hi = self.interval(
                        node, part, n_resamples=n_resamples, level=level, seed=seed
                    )
                    cols[f"{part}_low"], cols[f"{part}_high"] = lo.reshape(-1), hi.reshape(-1)
            if node in self.par_frac:
                with np.errstate(invalid="ignore"):
                    frac = self.par_frac[node]
                    cols["par_frac"] = (
                        np.nanmean(frac, axis=0)
                        if np.isfinite(frac).any()
                        else np.full(shape, np.nan)
                    ).reshape(-1)
            cols["random_share"] = self.random_share.get(node, np.nan)
            cols["n_examples"] = self.n_examples
            frames.append(pd.DataFrame(cols))
        table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        for axis in ("layer", "pos", "head"):
            if axis in table:
                table[axis] = table[axis].astype("Int64").mask(table[axis] < 0)
        table.attrs["kind"] = self.kind
        table.attrs["notes"] = list(self.notes)
        return table

    def figure(self, node: str, *, reduce_pos: str | None = "sum", title: str | None = None):
        """Heat map of the mean ``full`` / ``par`` / ``perp`` of one node type side by side (layer x
        position, or layer x head with ``reduce_pos="sum"`` for head / value nodes); see
        :func:`tl_directional.figures.directional.directional_heatmap`."""
        return directional_heatmap(
            self.to_frame(intervals=False),
            node,
            reduce_pos=reduce_pos,
            title=title or f"{self.kind}: {node}",
        )


__all__ = ["PARTS", "DirectionalResult", "ResultError"]
