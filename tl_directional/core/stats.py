"""Streaming summaries of per-token metrics (METHOD.md sec. 1, "Aggregation").

A :class:`StreamingSummary` keeps, per group (a (layer, component) or a
(layer, head) pair) and per metric:

- exact sums: token count, degenerate count, sum and sum of squares of each
  metric over its finite values, sums of ``||u_par||^2`` and ``||u_perp||^2``
  (for the energy ratio), in float64;
- a fixed histogram per metric, from which quantiles are read. Quantiles are
  therefore approximate: linear interpolation inside a bin of a fixed grid
  (see :data:`BIN_SCALES` for the grids and their resolution);
- while the sample is small (at most :data:`EXACT_QUANTILE_LIMIT` values per metric in
  every group), the values themselves, so that the quantiles are exact: numpy's default
  (``method="linear"``) quantiles, as ``np.quantile`` / pandas give them.

Memory is ``O(groups x metrics x bins)``, independent of the number of tokens, plus at most
``groups x metrics x EXACT_QUANTILE_LIMIT`` kept values (dropped once a group holds more).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .quantiles import BIN_SCALES, QUANTILES, histogram_quantiles, linear_quantiles

#: Up to this many values per metric in every group, a summary keeps the values and reports
#: exact quantiles (numpy's default, linear); beyond it, only the histograms (the values are
#: dropped, so memory stays bounded).
EXACT_QUANTILE_LIMIT = 16_384


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


def _group_chunks(sizes, rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges ``[g0, g1)`` of groups whose padded rows (groups x the widest group)
    hold about ``rows`` values each, at least one group a range: the quantile table's chunks."""
    chunks, g0, n_g = [], 0, len(sizes)
    while g0 < n_g:
        g1, widest = g0 + 1, max(int(sizes[g0]), 1)
        while g1 < n_g and (g1 + 1 - g0) * max(widest, int(sizes[g1])) <= rows:
            widest = max(widest, int(sizes[g1]))
            g1 += 1
        chunks.append((g0, g1))
        g0 = g1
    return chunks


class StreamingSummary:
    """Exact sums and histogram quantiles of several metrics over ``n_groups`` groups.

    Args:
        n_groups: number of groups (rows of the final table).
        metrics: mapping metric name -> bin scale name in :data:`BIN_SCALES`.
        device: where the accumulators live (the model's device, so that
            accumulating never copies activations to the host).

    Layout: the per-metric sums are columns of ``[n_groups, n_metrics]`` float64 tensors
    (``sums[m]`` etc. are views of them), and all histograms share one flat int64 tensor
    (``hist[m]`` is a ``[n_groups, n_bins + 2]`` view) with one spare bin at the end that
    collects tokens left out (degenerate, masked, non-finite). An :meth:`update` only
    computes bin indices; they are counted in one pass by :meth:`flush` (called by every
    reader), so a batch of many layers costs one counting kernel, and nothing synchronises
    with the host.
    """

    #: pending bin indices above which :meth:`update` counts them at once (bounds memory)
    FLUSH_AT = 1 << 24

    def __init__(self, n_groups: int, metrics: dict[str, str], device: torch.device | str = "cpu",
                 exact_limit: int = EXACT_QUANTILE_LIMIT):
        if isinstance(exact_limit, bool) or not isinstance(exact_limit, int) or exact_limit < 0:
            raise ValueError(f"exact_limit must be an int >= 0 (0: histogram quantiles only), got {exact_limit!r}")
        self.n_groups = n_groups
        self.exact_limit = exact_limit
        self.metrics = dict(metrics)
        self.device = torch.device(device)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.count = torch.zeros(n_groups, **f64)
        self.degenerate = torch.zeros(n_groups, **f64)
        self.par_sq = torch.zeros(n_groups, **f64)
        self.perp_sq = torch.zeros(n_groups, **f64)
        names = list(self.metrics)
        n_m = len(names)
        self._sums = torch.zeros(n_groups, n_m, **f64)
        self._sumsq = torch.zeros(n_groups, n_m, **f64)
        self._finite = torch.zeros(n_groups, n_m, **f64)
        self.sums = {m: self._sums[:, j] for j, m in enumerate(names)}
        self.sumsq = {m: self._sumsq[:, j] for j, m in enumerate(names)}
        self.finite = {m: self._finite[:, j] for j, m in enumerate(names)}
        # two extra bins per group: underflow (index 0) and overflow (index n_bins + 1)
        self._offsets: dict[str, int] = {}
        total = 0
        for m, s in self.metrics.items():
            self._offsets[m] = total
            total += n_groups * (BIN_SCALES[s].n_bins + 2)
        self._spare = total
        # The histograms are built only when needed (_materialize): while the values themselves
        # are kept (small samples) they are what the quantiles come from, and the histograms
        # are replayed from them on first use, so a small profile never allocates or fills
        # them (groups x metrics x ~4000 bins of int64: 60 MB on a 30-layer model).
        self._hist: Tensor | None = None
        self._hist_views: dict[str, Tensor] | None = None
        # metrics sharing a grid are binned together: scale -> (metric columns, offsets)
        self._by_scale: dict[str, tuple[list[int], Tensor]] = {}
        for s in dict.fromkeys(self.metrics.values()):
            cols = [j for j, m in enumerate(names) if self.metrics[m] == s]
            offs = torch.tensor([self._offsets[names[j]] for j in cols], dtype=torch.long,
                                device=self.device)
            self._by_scale[s] = (cols, offs.unsqueeze(-1))
        self._staged: list[tuple] = []
        self._pending: list[Tensor] = []
        self._pending_n = 0
        # Values counted in the histograms, per group and metric, and (while every count is at
        # most exact_limit) the values themselves as (group [n] int32, x [n_metrics, n]), one
        # entry per flush, NaN where a value does not count (a counted value is never NaN).
        self._kept = torch.zeros(n_groups, n_m, dtype=torch.int64, device=self.device)
        self._exact: list[tuple[Tensor, Tensor]] | None = [] if exact_limit > 0 else None
        if self._exact is None:
            self._materialize()

    @property
    def hist(self) -> dict[str, Tensor]:
        """Metric -> ``[n_groups, n_bins + 2]`` int64 histogram (a view of one flat tensor;
        built on first access, see :meth:`_materialize`)."""
        self._materialize()
        return self._hist_views

    def _materialize(self) -> None:
        """Allocate the histograms and count into them every value accumulated so far (the
        kept values: before this, every accumulated value is kept). Later accumulations bin
        their values as they come. Counts are integers, so the result is the same as binning
        every update as it came."""
        if self._hist is not None:
            return
        self._hist = torch.zeros(self._spare + 1, dtype=torch.int64, device=self.device)
        self._hist_views = {
            m: self._hist[off:off + self.n_groups * (BIN_SCALES[s].n_bins + 2)].view(self.n_groups, -1)
            for (m, s), off in zip(self.metrics.items(), self._offsets.values(), strict=True)
        }
        # one kept entry at a time, counted before the next is binned: binning them all first
        # held an int64 index per kept value (more than the values themselves) at once
        for group, x in self._exact or ():
            self._bin(group.long(), x.double(), ~torch.isnan(x))
            self._count_pending()
        self._count_pending()

    def _bin(self, group: Tensor, x: Tensor, use: Tensor) -> None:
        """Queue the histogram bin of every value of ``x`` (``[n_metrics, n]`` float64) where
        ``use`` (NaN and left-out tokens go to the spare bin); counted by :meth:`_count_pending`."""
        for scale_name, (cols, offs) in self._by_scale.items():
            scale = BIN_SCALES[scale_name]
            xs = x[cols]  # [k, n]
            lo, hi = scale.edges
            pos = (scale.transform(xs) - lo) / (hi - lo) * scale.n_bins
            # inf -> overflow, -inf -> underflow; NaN (and tokens left out) -> the spare bin
            idx = torch.where(
                xs == float("inf"), torch.full_like(pos, scale.n_bins + 1),
                torch.where(xs == float("-inf"), torch.zeros_like(pos),
                            torch.nan_to_num(pos, nan=0.0).floor() + 1),
            ).clamp(0, scale.n_bins + 1).long()
            flat = offs + group * (scale.n_bins + 2) + idx
            self._pending.append(torch.where(use[cols], flat, self._spare).reshape(-1))

    def _count_pending(self) -> None:
        """Count the queued bin indices into the histograms (one kernel for all of them)."""
        if not self._pending:
            return
        idx = torch.cat(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending.clear()
        if self.device.type == "cpu":
            self._hist += torch.bincount(idx, minlength=self._hist.numel())
        else:  # bincount on CUDA reads its size back to the host; index_add_ does not
            self._hist.index_add_(0, idx, torch.ones_like(idx))

    def update(
        self,
        group: Int[Tensor, "..."],
        values: dict[str, Float[Tensor, "*tokens"]],
        *,
        degenerate: Bool[Tensor, "*tokens"] | None = None,
        par_sq: Float[Tensor, "*tokens"] | None = None,
        perp_sq: Float[Tensor, "*tokens"] | None = None,
        keep: Bool[Tensor, "*tokens"] | None = None,
    ) -> None:
        """Add ``n`` tokens. Degenerate tokens are counted but excluded from every statistic;
        tokens where ``keep`` is False are ignored entirely (as if not passed), so callers can
        pass whole ``[batch * pos]`` blocks with a mask instead of gathering.

        Shapes: the values and flags share one shape of ``n`` elements (e.g. ``[n]`` or
        ``[n_query, n_heads]``); ``group``, the group of each, has any shape of ``n`` elements
        (all are read flattened, in row-major order).

        The tokens are staged and summed by :meth:`flush` together with the other updates
        of the batch (every reader flushes first), so many small updates cost one pass."""
        group = group.to(self.device).long().reshape(-1)
        n = group.numel()
        if n == 0:
            return

        def flat(t, fill, dtype):
            if t is None:
                return torch.full((n,), fill, dtype=dtype, device=self.device)
            return t.reshape(-1).to(self.device)

        x = torch.stack([values[m].reshape(-1).to(self.device) for m in self.metrics])
        self._staged.append((group, x, flat(degenerate, False, torch.bool),
                             flat(par_sq, 0.0, x.dtype), flat(perp_sq, 0.0, x.dtype),
                             flat(keep, True, torch.bool)))
        self._pending_n += n * len(self.metrics)
        if self._pending_n >= self.FLUSH_AT:
            self.flush()

    def _accumulate(self, group: Tensor, x: Tensor, degenerate: Tensor, par_sq: Tensor,
                    perp_sq: Tensor, keep: Tensor) -> None:
        """Add staged tokens: ``x`` is ``[n_metrics, n]`` in the order of ``self.metrics``."""
        deg = degenerate & keep
        self.degenerate.index_add_(0, group, deg.double())
        ok = keep & ~degenerate
        self.count.index_add_(0, group, ok.double())
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        self.par_sq.index_add_(0, group, torch.where(ok, par_sq.double(), zero))
        self.perp_sq.index_add_(0, group, torch.where(ok, perp_sq.double(), zero))
        use_all = ok & ~torch.isnan(x)  # what the histograms count
        self._kept.index_add_(0, group, use_all.long().T)
        if self._exact is not None:
            # x is this summary's own stack (update): NaN where a value does not count, which
            # changes none of the sums below (they count finite, kept, non-degenerate values)
            x.masked_fill_(~use_all, float("nan"))
            self._exact.append((group.to(torch.int32), x))
        x = x.double()
        fin = torch.isfinite(x) & ok
        xf = torch.where(fin, x, zero)
        self._sums.index_add_(0, group, xf.T)
        self._sumsq.index_add_(0, group, (xf * xf).T)
        self._finite.index_add_(0, group, fin.double().T)
        if self._hist is not None:  # else the kept values are binned if ever needed
            self._bin(group, x, use_all)

    def flush(self) -> None:
        """Sum the staged tokens and count their bin indices into the histograms (one
        kernel for all of them)."""
        if self._staged:
            staged = self._staged
            self._staged = []
            first = len(self._exact) if self._exact is not None else 0
            if len(staged) == 1 or self.device.type == "cpu":
                for entry in staged:
                    self._accumulate(*entry)
            else:
                self._accumulate(torch.cat([s[0] for s in staged]),
                                 torch.cat([s[1] for s in staged], dim=1),
                                 *(torch.cat([s[k] for s in staged]) for k in range(2, 6)))
            self._join_kept(first)
        self._pending_n = 0
        self._check_exact_limit()
        if self._hist is not None:
            self._count_pending()

    def _join_kept(self, first: int) -> None:
        """Join the kept entries from index ``first`` on (this flush's) into one: a batch's many
        small entries, each under glibc's mmap threshold, otherwise stay on the C heap between
        freed temporaries, and resident memory grew 1.1-1.7x faster than the values
        (docs/performance.md, "The profile's memory against corpus length at scale")."""
        if self._exact is None or len(self._exact) - first < 2:
            return
        new = self._exact[first:]
        del self._exact[first:]
        self._exact.append((torch.cat([e[0] for e in new]), torch.cat([e[1] for e in new], dim=1)))

    def _check_exact_limit(self) -> None:
        """Drop the kept values once a group holds more than ``exact_limit`` of a metric (one
        read of the counts per flush, only while values are kept), binning them first."""
        if self._exact is not None and self._exact and int(self._kept.max()) > self.exact_limit:
            self._materialize()
            self._exact = None

    def _exact_valid(self) -> bool:
        """Whether the kept values are exactly what the histograms count (so exact quantiles
        can replace the histogram's). True by construction while the histograms are not built
        (they would be binned from exactly the kept values)."""
        if self._exact is None:
            return False
        if self._hist is None:
            return True
        totals = torch.stack([self.hist[m].sum(-1) for m in self.metrics], -1)
        return bool(torch.equal(totals.cpu(), self._kept.cpu()))

    def merge_(self, other: StreamingSummary) -> StreamingSummary:
        """Add another summary's sums in place (e.g. from another process)."""
        self.flush()
        other.flush()
        attrs = ["count", "degenerate", "par_sq", "perp_sq", "_sums", "_sumsq", "_finite", "_kept"]
        if not (self._hist is None and other._hist is None and other._exact is not None):
            self._materialize()
            other._materialize()
            attrs.append("_hist")
        for attr in attrs:
            getattr(self, attr).add_(getattr(other, attr).to(self.device))
        if self._exact is not None and other._exact is not None:
            self._exact += [tuple(t.to(self.device) for t in e) for e in other._exact]
            self._check_exact_limit()
        else:
            self._exact = None
        return self

    def all_reduce_(self) -> StreamingSummary:
        """Sum this summary over every process of the default ``torch.distributed`` group
        (in place; a no-op when no group is initialised). Exact: sums are float64 and
        histograms int64."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self
        self.flush()
        self._materialize()  # every rank takes part in the histograms' all_reduce
        floats = torch.cat([self.count, self.degenerate, self.par_sq, self.perp_sq,
                            self._sums.reshape(-1), self._sumsq.reshape(-1),
                            self._finite.reshape(-1)])
        dist.all_reduce(floats)
        dist.all_reduce(self._hist)
        self._all_gather_exact()
        g, k = self.n_groups, self._sums.numel()
        for i, t in enumerate((self.count, self.degenerate, self.par_sq, self.perp_sq)):
            t.copy_(floats[i * g:(i + 1) * g])
        rest = floats[4 * g:]
        self._sums.copy_(rest[:k].view_as(self._sums))
        self._sumsq.copy_(rest[k:2 * k].view_as(self._sumsq))
        self._finite.copy_(rest[2 * k:].view_as(self._finite))
        return self

    def _all_gather_exact(self) -> None:
        """all_reduce_'s part for the kept values: every rank ends with all of them (in rank
        order) while every rank still keeps them and the summed counts are within the limit."""
        import torch.distributed as dist

        keeping = torch.tensor([0 if self._exact is None else 1], dtype=torch.int64, device=self._kept.device)
        dist.all_reduce(keeping, op=dist.ReduceOp.MIN)
        dist.all_reduce(self._kept)
        if not int(keeping) or int(self._kept.max()) > self.exact_limit:
            self._exact = None
            return
        mine = [tuple(t.cpu() for t in e) for e in self._exact]
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        self._exact = [tuple(t.to(self.device) for t in e) for part in gathered for e in part]

    def _exact_quantiles(self, metric: str, qs) -> list[Tensor]:
        """numpy's default (linear) quantiles of the kept values, per group (NaN when empty):
        with the group's ``n`` values sorted, ``q`` reads position ``h = (n - 1) q`` and
        interpolates linearly between its two neighbours; an infinite neighbour gives that
        infinity (numpy's arithmetic can give NaN there)."""
        return self._exact_quantile_table(qs, (metric,))[metric]

    def _exact_quantile_table(self, qs, metrics=None) -> dict[str, list[Tensor]]:
        """:meth:`_exact_quantiles` of several metrics (default: all) at once.

        The kept values are put in group order once (a stable sort of the group ids, shared
        by every metric); a batch of metrics' values then fill, a chunk of groups at a time
        (about 2^19 values: the temporaries stay bounded on a long corpus), one ``[n_metrics,
        chunk's groups, max count]`` array (NaN-padded: NaN sorts last, and counted values are
        never NaN) whose rows are sorted in one call. The sorted values are those ``np.lexsort((x, group))`` orders, so
        the same two neighbours are read for every quantile; all quantiles are read at once."""
        import numpy as np

        names = list(self.metrics)
        metrics = names if metrics is None else list(metrics)
        if not self._exact:  # nothing accumulated: every group is empty
            return {m: [torch.full((self.n_groups,), float("nan"), dtype=torch.float64) for _ in qs]
                    for m in metrics}
        group = torch.cat([e[0] for e in self._exact]).cpu().numpy()
        # the same stable order either way; group ids below 2^15 sort as int16, which numpy's
        # stable argsort orders by a radix sort (one counting pass) instead of a merge sort
        small = self.n_groups <= np.iinfo(np.int16).max
        by_group = np.argsort(group.astype(np.int16) if small else group, kind="stable")
        n_g = self.n_groups
        sizes = np.bincount(group, minlength=n_g)
        del group  # a chunk's sorted ids are rebuilt from the sizes
        starts = np.concatenate([[0], np.cumsum(sizes)])
        # as many metrics at a time as keep a batch's values within 2^19 (all metrics on small
        # inputs, one on large ones), and groups in chunks of about 2^19 rows of values: the
        # temporaries (values in group order, their mask, the padded rows) stay bounded however
        # long the corpus, beside the kept values, the order and one metric's values
        per = max(1, (1 << 19) // max(int(starts[-1]), 1))
        out = {m: np.full((len(qs), n_g), np.nan) for m in metrics}
        for first in range(0, len(metrics), per):
            batch = metrics[first:first + per]
            cols = [names.index(m) for m in batch]
            if cols == list(range(cols[0], cols[0] + len(cols))):  # a slice: views, not copies per entry
                cols = slice(cols[0], cols[0] + len(cols))
            # in the staged dtype (float32 or float64; others as float64): linear_quantiles sorts
            # float32 as float32, which gives the same neighbours
            x_all = torch.cat([e[1][cols] for e in self._exact], dim=1)
            if x_all.dtype not in (torch.float32, torch.float64):
                x_all = x_all.double()
            x_all = x_all.cpu().numpy()
            for g0, g1 in _group_chunks(sizes, (1 << 19) // len(batch)):
                x = x_all[:, by_group[starts[g0]:starts[g1]]]
                use = ~np.isnan(x)  # a kept value that does not count is NaN
                group = np.repeat(np.arange(g1 - g0), sizes[g0:g1])
                counts = np.stack([np.bincount(group[use[j]], minlength=g1 - g0) for j in range(len(batch))])
                width = max(int(counts.max()), 1)
                v = linear_quantiles(group, x, use, counts, width, qs, g1 - g0)
                for j, m in enumerate(batch):
                    out[m][:, g0:g1] = v[:, j]
            del x_all
        return {m: [torch.from_numpy(np.ascontiguousarray(out[m][k])) for k in range(len(qs))] for m in metrics}

    def quantile(self, metric: str, q: float) -> Float[Tensor, " n_groups"]:
        """``q``-quantile per group (NaN for empty groups).

        Exact while the sample is small (at most ``exact_limit`` values in every group, see
        :data:`EXACT_QUANTILE_LIMIT`): numpy's default linear quantile. Beyond, approximate,
        from the histogram: linear interpolation inside the bin holding the ``q * count``-th
        value, on the grid's transformed axis; values in the underflow / overflow bins are
        reported as the grid's edge (``0`` / ``inf`` for the positive grid).
        """
        self.flush()
        if self._exact_valid():
            return self._exact_quantiles(metric, (q,))[0]
        return histogram_quantiles(BIN_SCALES[self.metrics[metric]], (q,), self.hist[metric].cpu().double())[0]

    def saw_nonfinite(self) -> bool:
        """Whether a counted token (kept, not degenerate) held a NaN metric, or the energy sums
        are not finite: what a NaN or inf activation leaves behind (a NaN metric goes to the
        histograms' spare bin and out of the means, so the sums alone would not show it). One
        read of the ``[n_groups]`` / ``[n_groups, n_metrics]`` sums, never of the tokens."""
        self.flush()
        if not bool(torch.isfinite(self.par_sq).all() & torch.isfinite(self.perp_sq).all()):
            return True
        return bool((self._kept < self.count.round().long().unsqueeze(-1)).any())

    @property
    def quantiles_exact(self) -> bool:
        """Whether :meth:`quantile` and :meth:`table` report exact quantiles (small sample)."""
        self.flush()
        return self._exact_valid()

    def table(self) -> dict[str, Tensor]:
        """Column name -> per-group values (float64, CPU): count, degenerate,
        energy_ratio, and ``<metric>_mean/_std/_q05/_q25/_median/_q75/_q95``."""
        self.flush()
        count = self.count.cpu()
        cols: dict[str, Tensor] = {"count": count, "degenerate": self.degenerate.cpu()}
        perp = self.perp_sq.cpu()
        par = self.par_sq.cpu()
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        cols["energy_ratio"] = energy_ratio(par, perp)
        sums, sumsq, finite = self._sums.cpu(), self._sumsq.cpu(), self._finite.cpu()
        exact = self._exact_valid()
        if exact:
            exact_qs = self._exact_quantile_table(QUANTILES)
        else:
            hist = self._hist.cpu().double()
        names = [("median" if q == 0.5 else f"q{int(round(q * 100)):02d}") for q in QUANTILES]
        for j, m in enumerate(self.metrics):
            fin, s, ss = finite[:, j], sums[:, j], sumsq[:, j]
            safe = fin.clamp_min(1)
            mean = torch.where(fin > 0, s / safe, nan)
            var = torch.where(fin > 1, (ss - s * s / safe) / (fin - 1).clamp_min(1), nan)
            cols[f"{m}_mean"] = mean
            cols[f"{m}_std"] = var.clamp_min(0).sqrt()
            if exact:
                qs = exact_qs[m]
            else:
                off = self._offsets[m]
                h = hist[off:off + self.hist[m].numel()].view(self.n_groups, -1)
                qs = histogram_quantiles(BIN_SCALES[self.metrics[m]], QUANTILES, h)
            for name, v in zip(names, qs, strict=True):
                cols[f"{m}_{name}"] = v
        return cols
