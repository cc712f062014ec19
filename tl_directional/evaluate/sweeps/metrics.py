"""The sweep's next-token metrics: one registry of the per-position sums and one of the
reported metrics, and :class:`BaselineStats`, which forms them in one fused pass per setting.

Adding a metric is one entry: a :class:`Quantity` in :data:`QUANTITIES` (what is summed over
the predicted tokens, its formula on one chunk of positions, its value for the baseline
against itself) and a :class:`Metric` in :data:`METRIC_REGISTRY` (the columns it reports from
the sums, and their baseline values). :func:`tl_directional.evaluate.sweeps.runner.sweep` (its ``metrics=``,
checkpoints, the baseline row) and the per-sequence sums of the real-model scripts
(``studies/realrun.py``) both read these registries, so they count every metric, top-1
agreement included, by the same rule (:func:`top1_agreement`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from ...model.lanes import Unembedding


def prediction_mask(attention_mask: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos-1"]:
    """Positions ``t`` whose next token ``t + 1`` is a real token of the same sequence."""
    m = attention_mask.bool()
    return m[:, :-1] & m[:, 1:]


def top1_agreement(base_top1: Int[Tensor, "*rows"], logits: Float[Tensor, "*rows vocab"]) -> Bool[Tensor, "*rows"]:
    """The sweep's top-1 rule: the baseline's top-1 token (its argmax) holds the largest edited
    logit; an exact tie for the largest counts as agreement. Shift-invariant, so log-probs
    give the same answer as logits. (``amax`` is one vectorised pass, ``argmax`` is not.)"""
    return logits.gather(-1, base_top1.unsqueeze(-1)).squeeze(-1) == logits.amax(-1)


@dataclass(frozen=True)
class Chunk:
    """What a :class:`Quantity`'s formula sees for one slice of positions (rows)."""

    logits: Tensor  # the edited logits [rows, vocab] (or log-probs: the rules are shift-invariant)
    log_probs: Tensor  # log_softmax of the edited logits, in the metrics' precision
    target: Tensor  # [rows, 1] the next tokens
    base_top1: Tensor  # [rows] the baseline's argmax
    base_p_log_p: Tensor  # [rows] sum_v p log p of the baseline
    base_probs: Callable[[], Tensor]  # [rows, vocab] the baseline's probabilities (formed on demand)
    base_log_probs: Callable[[], Tensor]  # [rows, vocab] the baseline's log-probs (formed on demand)


@dataclass(frozen=True)
class Quantity:
    """One per-position quantity summed over the predicted tokens (an entry of :data:`QUANTITIES`).

    ``per_position`` gives its values on a :class:`Chunk`. ``of_baseline`` is its sum for the
    baseline compared with itself (from :class:`BaselineStats`). ``own``: the baseline's own
    quantity (token count, baseline NLL), the same for every setting, so :class:`BaselineStats`
    takes ``of_baseline`` instead of a pass per setting. ``count``: an integer count, stored
    exactly in checkpoints."""

    name: str
    per_position: Callable[[Chunk], Tensor]
    of_baseline: Callable[[BaselineStats], float]
    own: bool = False
    count: bool = False


def _row_dot(x: Float[Tensor, "rows vocab"], y: Float[Tensor, "rows vocab"]) -> Float[Tensor, " rows"]:
    """``(x * y).sum(-1)`` per row without a ``[rows, vocab]`` product tensor."""
    return torch.linalg.vecdot(x, y)


#: The per-position sums, in their order in checkpoints and in ``studies/realrun.py``'s
#: per-sequence tables (``[n, len(QUANTITIES)]``).
QUANTITIES: Mapping[str, Quantity] = MappingProxyType({q.name: q for q in (
    Quantity("tokens", lambda c: torch.ones_like(c.base_p_log_p), lambda b: b.tokens, own=True, count=True),
    Quantity("nll", lambda c: -c.log_probs.gather(-1, c.target).squeeze(-1), lambda b: float(b.base_nll)),
    Quantity("base_nll", lambda c: -c.base_log_probs().gather(-1, c.target).squeeze(-1), lambda b: float(b.base_nll),
             own=True),
    # KL(base || edited) = sum p log p - p . log q
    Quantity("kl", lambda c: c.base_p_log_p - _row_dot(c.base_probs(), c.log_probs), lambda b: 0.0),
    Quantity("top1_agree", lambda c: top1_agreement(c.base_top1, c.logits), lambda b: b.tokens, count=True),
)})


def _exp(x):
    return x.exp() if isinstance(x, Tensor) else math.exp(x)


@dataclass(frozen=True)
class Metric:
    """One reported metric (an entry of :data:`METRIC_REGISTRY`): the ``columns`` it adds to a
    sweep's table, computed by ``compute(sums, tokens)`` from the :data:`QUANTITIES` sums (floats,
    or tensors of bootstrap resamples), ``baseline``: their values on the baseline row, and
    ``interval``: the columns the real-model scripts bootstrap."""

    name: str
    columns: tuple[str, ...]
    compute: Callable[[Mapping, object], tuple]
    baseline: Mapping[str, float]
    interval: tuple[str, ...] = ()


METRIC_REGISTRY: Mapping[str, Metric] = MappingProxyType({m.name: m for m in (
    Metric("loss", ("loss", "base_loss", "delta_loss"),
           lambda s, n: (s["nll"] / n, s["base_nll"] / n, s["nll"] / n - s["base_nll"] / n),
           {"delta_loss": 0.0}, interval=("delta_loss",)),
    Metric("ppl", ("ppl", "base_ppl", "delta_ppl"),
           lambda s, n: (_exp(s["nll"] / n), _exp(s["base_nll"] / n), _exp(s["nll"] / n) - _exp(s["base_nll"] / n)),
           {"delta_ppl": 0.0}, interval=("delta_ppl",)),
    Metric("kl", ("kl",), lambda s, n: (s["kl"] / n,), {"kl": 0.0}, interval=("kl",)),
    Metric("top1_agree", ("top1_agree",), lambda s, n: (s["top1_agree"] / n,), {"top1_agree": 1.0},
           interval=("top1_agree",)),
)})

#: The names ``sweep(metrics=...)`` accepts (the registry's keys).
METRICS = tuple(METRIC_REGISTRY)


def metric_columns(sums: Mapping, tokens) -> dict:
    """Every registered metric's columns from the sums (``tokens`` already clamped to >= 1)."""
    out = {}
    for m in METRIC_REGISTRY.values():
        out.update(zip(m.columns, m.compute(sums, tokens), strict=True))
    return out


class MetricSums:
    """Exact sums over predicted tokens (one per :data:`QUANTITIES` entry, as attributes), to be
    added across batches and ranks. ``MetricSums(tokens, nll, base_nll, kl, top1_agree)``."""

    def __init__(self, *values: float, **named: float):
        if len(values) > len(QUANTITIES):
            raise TypeError(f"MetricSums takes at most {len(QUANTITIES)} sums ({', '.join(QUANTITIES)})")
        given = dict(zip(QUANTITIES, values, strict=False))
        for k, v in named.items():
            if k not in QUANTITIES or k in given:
                raise TypeError(f"MetricSums got an unknown or repeated sum {k!r}")
            given[k] = v
        for k in QUANTITIES:
            setattr(self, k, float(given.get(k, 0.0)))

    def values(self) -> list[float]:
        return [getattr(self, k) for k in QUANTITIES]

    def __eq__(self, other) -> bool:
        return isinstance(other, MetricSums) and self.values() == other.values()

    def __repr__(self) -> str:
        return "MetricSums(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in QUANTITIES) + ")"

    @classmethod
    def of_baseline(cls, base: BaselineStats) -> MetricSums:
        """The sums of the baseline compared with itself."""
        return cls(*[q.of_baseline(base) for q in QUANTITIES.values()])

    def add_(self, other: MetricSums) -> MetricSums:
        for k in QUANTITIES:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self

    def as_tensor(self) -> Tensor:
        return torch.tensor(self.values(), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor) -> MetricSums:
        return cls(*[float(x) for x in t.tolist()])

    def to_disk(self) -> list:
        """Exact form for a checkpoint: token and agreement counts as ints, sums as float64."""
        return [int(getattr(self, k)) if q.count else getattr(self, k) for k, q in QUANTITIES.items()]

    @classmethod
    def from_disk(cls, values) -> MetricSums:
        n = len(QUANTITIES)
        if not isinstance(values, list) or len(values) != n or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ValueError(f"sums must be a list of {n} numbers, got {values!r}")
        return cls(*[float(v) for v in values])

    def row(self) -> dict:
        return {"tokens": int(self.tokens),
                **metric_columns({k: getattr(self, k) for k in QUANTITIES}, max(self.tokens, 1.0))}


class BaselineStats:
    """What every setting is compared with on one batch, computed once: the unedited
    next-token probabilities at every position, ``sum_v p log p`` per position (for the
    KL), the baseline NLL sum and the baseline's top-1 (argmax of its logits).

    :meth:`compare` then needs, per setting, three vocabulary-sized passes: one fused
    ``log_softmax`` of each position's logits ``z`` (then the target's log-prob, a gather),
    the dot product of its result with the baseline probabilities (``KL(base || edited) =
    sum p log p - p . log q``) and the largest logit (``amax``: top-1 agreement is
    ``z[top1_base] == max z``, so an exact tie for the largest counts as agreement).

    Vocabulary-sized passes run over chunks of positions (``ranges``) of at most
    :data:`CHUNK_ELEMENTS` logits, small enough that a chunk's log-probs are still in the
    CPU's cache when the next pass reads them; the log-probs go into one scratch buffer
    reused across chunks. :meth:`compare_hidden` forms the logits themselves in ``blocks`` of
    whole chunks of at most :data:`BLOCK_ELEMENTS` logits, one unembedding matmul each (a
    matmul of a few rows reads the whole ``[d_model, vocab]`` matrix for little work), so no
    ``[batch, pos, vocab]`` tensor is formed beside the baseline's. The baseline
    probabilities are kept when they have at most :data:`KEEP_PROBS_ELEMENTS` elements, else
    recomputed per chunk. Per-position values are formed in the logits' precision (float32,
    or float64 for a float64 model); the sums over positions are float64.
    """

    #: logits per chunk of metric passes (1 MiB in float32, a core's share of the L2 cache:
    #: 32 positions of an 8192-token vocabulary, 5 of SmolLM2's 49k, 1 of Gemma-3's 262k)
    CHUNK_ELEMENTS = 1 << 18
    #: logits per unembedding call in :meth:`compare_hidden` (256 MiB in float32: 256
    #: positions of a 262k vocabulary, so its unembedding matrix is read 4 times at 8 x 128)
    BLOCK_ELEMENTS = 1 << 26
    #: keep the baseline probabilities when they have at most this many elements (8 x 128
    #: positions of SmolLM2's 49k vocabulary: 200 MiB in float32)
    KEEP_PROBS_ELEMENTS = 1 << 26

    @torch.no_grad()
    def __init__(self, base_logits: Float[Tensor, "batch pos vocab"], tokens: Int[Tensor, "batch pos"],
                 attention_mask: Int[Tensor, "batch pos"]):
        self.mask = prediction_mask(attention_mask)
        batch, pos, vocab = base_logits.shape
        dev = base_logits.device
        self.target = tokens[:, 1:][self.mask][:, None]
        self.dtype = torch.float64 if base_logits.dtype == torch.float64 else torch.float32
        # Row b * pos + t of the flat [batch * pos, vocab] logits predicts token t + 1. Rows are
        # processed in contiguous slices (views, no gather); rows that predict nothing (the
        # last position, padding) are computed and weighted out, 1 / pos extra work.
        weight = torch.zeros(batch, pos, dtype=torch.bool, device=dev)
        weight[:, :-1] = self.mask.to(dev)
        self._weight = weight.reshape(-1)
        tgt = torch.zeros(batch, pos, dtype=torch.long, device=dev)
        tgt[:, :-1] = tokens[:, 1:].to(dev)
        self._tgt = tgt.reshape(-1, 1)
        self._base = base_logits.reshape(-1, vocab)
        n_rows = batch * pos
        step = max(1, self.CHUNK_ELEMENTS // vocab)
        self._scratch_shape = (min(step, n_rows), vocab)
        self.ranges = [(a, min(a + step, n_rows)) for a in range(0, n_rows, step)]
        per_block = max(1, self.BLOCK_ELEMENTS // (step * vocab))  # whole chunks per block
        self.blocks = [range(c, min(c + per_block, len(self.ranges))) for c in range(0, len(self.ranges), per_block)]
        keep = n_rows * vocab <= self.KEEP_PROBS_ELEMENTS
        self._p: list[Tensor] = []
        plp = torch.empty(n_rows, dtype=self.dtype, device=dev)
        tgt_lp = torch.empty(n_rows, dtype=self.dtype, device=dev)
        self._top1 = torch.empty(n_rows, dtype=torch.long, device=dev)
        for a, e in self.ranges:
            z = self._base[a:e]
            base_lp = F.log_softmax(z.to(self.dtype), dim=-1)
            p = base_lp.exp()
            plp[a:e] = _row_dot(p, base_lp)
            tgt_lp[a:e] = base_lp.gather(-1, self._tgt[a:e]).squeeze(-1)
            self._top1[a:e] = z.argmax(-1)
            if keep:
                self._p.append(p)
        self._plp_rows = plp
        self.p_log_p = _weighted_sum(plp, self._weight)
        self.base_nll = -_weighted_sum(tgt_lp, self._weight)
        self.tokens = float(self.mask.sum())

    def _probs(self, c: int) -> Tensor:
        """The baseline probabilities of chunk ``c`` (kept, or recomputed from the logits by
        the operations that formed ``sum p log p``, so a setting equal to the baseline has a
        KL of exactly 0)."""
        if self._p:
            return self._p[c]
        a, e = self.ranges[c]
        return F.log_softmax(self._base[a:e].to(self.dtype), dim=-1).exp_()

    @torch.no_grad()
    def compare(self, logits: Float[Tensor, "batch pos vocab"]) -> MetricSums:
        """The :data:`QUANTITIES` sums (edited and base NLL, ``KL(base || edited)``, top-1
        agreement by :func:`top1_agreement`, ...) over the predicted tokens."""
        flat = logits.reshape(-1, logits.shape[-1])
        return self._compare(lambda a, e: flat[a:e], flat.device)

    @torch.no_grad()
    def compare_hidden(self, hidden: Float[Tensor, "batch pos d_model"], unembed: Unembedding) -> MetricSums:
        """:meth:`compare` from the unembedding's input (``hidden`` at ``unembed.hook``): the
        logits are formed a block of chunks at a time (:data:`BLOCK_ELEMENTS`), reduced and
        dropped, so no ``[batch, pos, vocab]`` tensor is ever formed."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return self._compare(lambda a, e: unembed.logits(flat[a:e]), flat.device)

    def _reduce_block(self, zb: Tensor, start: int, block: range, edited: Mapping, rows: dict[str, Tensor],
                      scratch: Tensor) -> None:
        """The per-position values of the chunks ``block`` from their logits ``zb`` (rows from
        ``start``), into ``rows``."""
        for c in block:
            a, e = self.ranges[c]
            z = zb[a - start:e - start]
            # the one vocabulary-sized temporary, in the reused scratch buffer
            lq = torch.log_softmax(z.to(self.dtype), dim=-1, out=scratch[: e - a])
            chunk = Chunk(logits=z, log_probs=lq, target=self._tgt[a:e], base_top1=self._top1[a:e],
                          base_p_log_p=self._plp_rows[a:e], base_probs=lambda c=c: self._probs(c),
                          base_log_probs=lambda a=a, e=e: F.log_softmax(self._base[a:e].to(self.dtype), dim=-1))
            for k, formula in edited.items():
                v = formula(chunk)
                if k not in rows:
                    rows[k] = torch.empty(self._base.shape[0], dtype=v.dtype, device=scratch.device)
                rows[k][a:e] = v

    def _compare(self, block_logits: Callable[[int, int], Tensor], device) -> MetricSums:
        edited = {k: q.per_position for k, q in QUANTITIES.items() if not q.own}
        rows: dict[str, Tensor] = {}
        scratch = torch.empty(self._scratch_shape, dtype=self.dtype, device=device)
        for block in self.blocks:
            start, stop = self.ranges[block[0]][0], self.ranges[block[-1]][1]
            # one function call per block, so no view of the block's logits outlives it and the
            # next block's logits reuse its memory (one block alive at a time)
            self._reduce_block(block_logits(start, stop), start, block, edited, rows, scratch)
        w = self._weight
        sums = dict(zip(edited, torch.stack([_weighted_sum(rows[k], w) for k in edited]).tolist(), strict=True))
        return MetricSums(**{k: sums[k] if k in sums else q.of_baseline(self) for k, q in QUANTITIES.items()})


def _weighted_sum(values: Shaped[Tensor, " rows"], weight) -> Tensor:
    """Sum of ``values`` (floats, or bools counted as 0 / 1) over the rows where ``weight`` is True, in float64."""
    return torch.where(weight, values.to(torch.float64), 0.0).sum()


def batch_metric_sums(
    base_logits: Float[Tensor, "batch pos vocab"],
    logits: Float[Tensor, "batch pos vocab"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"],
) -> MetricSums:
    """One-off comparison of ``logits`` with ``base_logits`` (see :class:`BaselineStats`)."""
    return BaselineStats(base_logits, tokens, attention_mask).compare(logits)


@torch.no_grad()
def per_position_sums(base_log_probs: Float[Tensor, "batch pos vocab"], log_probs: Float[Tensor, "batch pos vocab"],
                      target: Int[Tensor, "batch pos 1"], mask: Bool[Tensor, "batch pos"]) -> Tensor:
    """Per-sequence sums ``[batch, len(QUANTITIES)]`` (float64) of every quantity by the registry's
    own formulas, from materialised log-probs (the real-model scripts keep these per sequence
    for their bootstrap; the columns follow :data:`QUANTITIES`)."""
    m = mask.to(log_probs.dtype)
    flat = log_probs.reshape(-1, log_probs.shape[-1])
    base_flat = base_log_probs.reshape(-1, base_log_probs.shape[-1])
    base_p = base_flat.exp()
    chunk = Chunk(logits=flat, log_probs=flat, target=target.reshape(-1, 1), base_top1=base_flat.argmax(-1),
                  base_p_log_p=_row_dot(base_p, base_flat), base_probs=lambda: base_p,
                  base_log_probs=lambda: base_flat)
    shape = log_probs.shape[:-1]
    cols = [(q.per_position(chunk).reshape(shape).to(m.dtype) * m).sum(-1) for q in QUANTITIES.values()]
    return torch.stack(cols, -1).double()


__all__ = ["METRICS", "METRIC_REGISTRY", "QUANTITIES", "BaselineStats", "Chunk", "Metric", "MetricSums", "Quantity",
           "batch_metric_sums", "metric_columns", "per_position_sums", "prediction_mask", "top1_agreement"]
