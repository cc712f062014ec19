"""Streaming summaries of per-token metrics (METHOD.md sec. 1, "Aggregation").

A :class:`StreamingSummary` keeps, per group (a (layer, component) or a
(layer, head) pair) and per metric:

- exact sums: token count, degenerate count, sum and sum of squares of each
  metric over its finite values, sums of ``||u_par||^2`` and ``||u_perp||^2``
  (for the energy ratio), in float64;
- a fixed histogram per metric, from which quantiles are read. Quantiles are
  therefore approximate: linear interpolation inside a bin of a fixed grid
  (see :data:`BIN_SCALES` for the grids and their resolution).

Memory is ``O(groups x metrics x bins)``, independent of the number of tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)


def energy_ratio(par_sq: Tensor, perp_sq: Tensor) -> Tensor:
    """Energy ratio ``sqrt(sum ||u_par||^2 / sum ||u_perp||^2)`` from the two sums (any shape,
    float64 on the sums' device): ``inf`` when only the parallel sum is positive, NaN when both
    are 0 (no energy at all: no ratio)."""
    par, perp = par_sq.double(), perp_sq.double()
    with torch.no_grad():
        return torch.where(
            perp > 0, (par / perp.clamp_min(1e-300)).sqrt(),
            torch.where(par > 0, torch.tensor(float("inf"), dtype=torch.float64, device=par.device),
                        torch.tensor(float("nan"), dtype=torch.float64, device=par.device)),
        )


@dataclass(frozen=True)
class BinScale:
    """A fixed histogram grid on a transformed axis.

    ``kind``: ``"unit"`` linear on [0, 1]; ``"positive"`` log10-spaced on
    [lo, hi] (0 and tiny values go to the underflow bin, ``inf`` to the
    overflow bin); ``"signed"`` linear in ``asinh(x / scale)`` on [-hi, hi].
    """

    kind: str
    n_bins: int
    lo: float = 0.0
    hi: float = 1.0
    scale: float = 1e-3

    def transform(self, x: Tensor) -> Tensor:
        if self.kind == "unit":
            return x
        if self.kind == "positive":
            return torch.log10(x.clamp_min(self.lo * 0.5))
        return torch.asinh(x / self.scale)

    def inverse(self, t: float) -> float:
        if self.kind == "unit":
            return t
        if self.kind == "positive":
            return 10.0**t
        return math.sinh(t) * self.scale

    @property
    def edges(self) -> tuple[float, float]:
        """Bounds of the grid in transformed space."""
        if self.kind == "unit":
            return 0.0, 1.0
        if self.kind == "positive":
            return math.log10(self.lo), math.log10(self.hi)
        top = math.asinh(self.hi / self.scale)
        return -top, top


# unit: bin width 1/1000. positive: 1e-6..1e6 (12 decades) in 2400 bins = 0.005 decades, ~1.2% relative width.
# signed: asinh(x/1e-3) on |x| <= 1e4 (+-16.8) in 4000 bins: ~0.8% relative width
# above |x| ~ 1e-2, absolute width ~1e-5 near 0.
BIN_SCALES: dict[str, BinScale] = {
    "unit": BinScale("unit", 1000),
    "positive": BinScale("positive", 2400, lo=1e-6, hi=1e6),
    "signed": BinScale("signed", 4000, hi=1e4, scale=1e-3),
}


class StreamingSummary:
    """Exact sums and histogram quantiles of several metrics over ``n_groups`` groups.

    Args:
        n_groups: number of groups (rows of the final table).
        metrics: mapping metric name -> bin scale name in :data:`BIN_SCALES`.
        device: where the accumulators live (the model's device, so that
            accumulating never copies activations to the host).
    """

    def __init__(self, n_groups: int, metrics: dict[str, str], device: torch.device | str = "cpu"):
        self.n_groups = n_groups
        self.metrics = dict(metrics)
        self.device = torch.device(device)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.count = torch.zeros(n_groups, **f64)
        self.degenerate = torch.zeros(n_groups, **f64)
        self.par_sq = torch.zeros(n_groups, **f64)
        self.perp_sq = torch.zeros(n_groups, **f64)
        self.sums = {m: torch.zeros(n_groups, **f64) for m in self.metrics}
        self.sumsq = {m: torch.zeros(n_groups, **f64) for m in self.metrics}
        self.finite = {m: torch.zeros(n_groups, **f64) for m in self.metrics}
        # two extra bins: underflow (index 0) and overflow (index n_bins + 1)
        self.hist = {
            m: torch.zeros(n_groups, BIN_SCALES[s].n_bins + 2, **f64)
            for m, s in self.metrics.items()
        }

    def update(
        self,
        group: Int[Tensor, " n"],
        values: dict[str, Float[Tensor, " n"]],
        *,
        degenerate: Bool[Tensor, " n"] | None = None,
        par_sq: Float[Tensor, " n"] | None = None,
        perp_sq: Float[Tensor, " n"] | None = None,
    ) -> None:
        """Add ``n`` tokens. Degenerate tokens are counted but excluded from every statistic."""
        group = group.to(self.device).long().reshape(-1)
        n = group.numel()
        if n == 0:
            return
        if degenerate is None:
            keep = torch.ones(n, dtype=torch.bool, device=self.device)
        else:
            degenerate = degenerate.reshape(-1).to(self.device)
            self.degenerate += torch.bincount(group[degenerate], minlength=self.n_groups).double()
            keep = ~degenerate
        g = group[keep]
        self.count += torch.bincount(g, minlength=self.n_groups).double()
        if par_sq is not None:
            self.par_sq.index_add_(0, g, par_sq.reshape(-1)[keep].double())
        if perp_sq is not None:
            self.perp_sq.index_add_(0, g, perp_sq.reshape(-1)[keep].double())
        for name, scale_name in self.metrics.items():
            x = values[name].reshape(-1)[keep].double()
            fin = torch.isfinite(x)
            xf = torch.where(fin, x, torch.zeros_like(x))
            self.sums[name].index_add_(0, g, xf)
            self.sumsq[name].index_add_(0, g, xf * xf)
            self.finite[name].index_add_(0, g, fin.double())
            scale = BIN_SCALES[scale_name]
            lo, hi = scale.edges
            t = scale.transform(x)
            pos = (t - lo) / (hi - lo) * scale.n_bins
            # NaN never reaches here (decompose defines every value); inf -> overflow.
            idx = torch.where(
                x == float("inf"),
                torch.full_like(pos, scale.n_bins + 1),
                torch.where(x == float("-inf"), torch.zeros_like(pos), pos.floor() + 1),
            )
            idx = idx.clamp(0, scale.n_bins + 1).long()
            flat = g * (scale.n_bins + 2) + idx
            self.hist[name] += torch.bincount(
                flat, minlength=self.n_groups * (scale.n_bins + 2)
            ).double().view(self.n_groups, -1)

    def merge_(self, other: StreamingSummary) -> StreamingSummary:
        """Add another summary's sums in place (e.g. from another process)."""
        for attr in ("count", "degenerate", "par_sq", "perp_sq"):
            getattr(self, attr).add_(getattr(other, attr).to(self.device))
        for d in ("sums", "sumsq", "finite", "hist"):
            for k, v in getattr(other, d).items():
                getattr(self, d)[k].add_(v.to(self.device))
        return self

    def quantile(self, metric: str, q: float) -> Float[Tensor, " n_groups"]:
        """Approximate ``q``-quantile per group from the histogram (NaN for empty groups).

        Linear interpolation inside the bin holding the ``q * count``-th value, on the
        grid's transformed axis; values in the underflow / overflow bins are reported
        as the grid's edge (``0`` / ``inf`` for the positive grid).
        """
        scale = BIN_SCALES[self.metrics[metric]]
        hist = self.hist[metric].cpu()  # [groups, n_bins + 2]
        lo, hi = scale.edges
        width = (hi - lo) / scale.n_bins
        total = hist.sum(-1)
        cum = torch.cumsum(hist, -1)
        target = (q * total).unsqueeze(-1)
        b = torch.searchsorted(cum, target).squeeze(-1).clamp(max=scale.n_bins + 1)  # [groups]
        before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1),
                             torch.zeros_like(total))
        in_bin = hist.gather(-1, b.unsqueeze(-1)).squeeze(-1).clamp_min(1e-300)
        frac = ((target.squeeze(-1) - before) / in_bin).clamp(0.0, 1.0)
        t = lo + (b - 1 + frac) * width
        if scale.kind == "unit":
            values = t
        elif scale.kind == "positive":
            values = torch.pow(10.0, t)
        else:
            values = torch.sinh(t) * scale.scale
        under = 0.0 if scale.kind == "positive" else scale.inverse(lo)
        over = float("inf") if scale.kind == "positive" else scale.inverse(hi)
        values = torch.where(b == 0, torch.full_like(values, under), values)
        values = torch.where(b == scale.n_bins + 1, torch.full_like(values, over), values)
        return torch.where(total > 0, values, torch.full_like(values, float("nan")))

    def table(self) -> dict[str, Tensor]:
        """Column name -> per-group values (float64, CPU): count, degenerate,
        energy_ratio, and ``<metric>_mean/_std/_q05/_q25/_median/_q75/_q95``."""
        count = self.count.cpu()
        cols: dict[str, Tensor] = {"count": count, "degenerate": self.degenerate.cpu()}
        perp = self.perp_sq.cpu()
        par = self.par_sq.cpu()
        cols["energy_ratio"] = energy_ratio(par, perp)
        for m in self.metrics:
            fin = self.finite[m].cpu()
            s = self.sums[m].cpu()
            ss = self.sumsq[m].cpu()
            safe = fin.clamp_min(1)
            mean = torch.where(fin > 0, s / safe, torch.tensor(float("nan"), dtype=torch.float64))
            var = torch.where(fin > 1, (ss - s * s / safe) / (fin - 1).clamp_min(1),
                              torch.tensor(float("nan"), dtype=torch.float64))
            cols[f"{m}_mean"] = mean
            cols[f"{m}_std"] = var.clamp_min(0).sqrt()
            for q in QUANTILES:
                name = "median" if q == 0.5 else f"q{int(round(q * 100)):02d}"
                cols[f"{m}_{name}"] = self.quantile(m, q)
        return cols
