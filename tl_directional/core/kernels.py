"""Fused per-token statistics of one layer (METHOD.md sec. 1 and 3), for measuring only.

:func:`tl_directional.core.geometry.decompose` returns the parallel and perpendicular parts
themselves (``[*batch, d]``) for edits and plots. Measuring needs only scalars per token:
the projection coefficient, the two squared norms and the ratios built from them. The
functions here compute exactly those and nothing else, and they are the one home of that
computation for both streaming :func:`tl_directional.measure.profile` and
:meth:`tl_directional.measure.Profile.from_cache`.

Exactness comes first: every scalar is the one :func:`~tl_directional.core.geometry.decompose`
defines, formed from the same vectors (the perpendicular norm from ``u - a r`` itself, never from
the Gram closed form ``||u||^2 - a^2 ||r||^2``, which loses digits when ``u`` is nearly parallel
to ``r``), so the tables equal those of the unfused path to rounding. What differs is how the
passes over ``[n, d]`` are made (issue 51): a squared norm is one reduction (:func:`row_norm`), a
dot product a matrix product on Intel CPUs and a product written into a reused buffer and summed
on others (:func:`row_dot`), ``u - a r`` one pass; the sums then add in another order than ``(x * y).sum(-1)``, within the
round-off of a ``d``-term sum (:mod:`tl_directional.core.roundoff`; tests/unit/test_kernels.py).
Everything is pure tensor math: no model, hook or host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from jaxtyping import Float
from torch import Tensor

from .geometry import DEFAULT_EPS, PERP_VANISH_ULPS, SplitStats, compute_dtype


class Scratch:
    """Reusable buffers for the ``[n, d]``-sized temporaries of :func:`split_stats` and
    :func:`value_stats` (one per name, dtype and device, grown as needed).

    The kernels write their elementwise products into these with ``out=`` instead of
    allocating a fresh tensor each time: the same kernels on the same contiguous layout, so
    the same values bit for bit, without the allocation and first-touch cost of a new
    activation-sized tensor (most of the cost of an elementwise product on a CPU). A
    profile keeps one per call; a buffer's content is only valid until the next kernel call.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple, Tensor] = {}

    def get(self, name: str, shape: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
        """A contiguous tensor of ``shape`` (uninitialised), reused across calls."""
        numel = 1
        for k in shape:
            numel *= int(k)
        key = (name, dtype, device)
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._bufs[key] = buf
        return buf[:numel].view(shape)


def _fits(scratch: Scratch | None, *tensors: Tensor) -> bool:
    """Whether the ``out=`` path applies: a scratch and inputs of one shape, all contiguous
    (a fresh product of contiguous inputs is contiguous, so the reduction reads the same layout)."""
    if scratch is None:
        return False
    shape = tensors[0].shape
    return all(t.is_contiguous() and t.shape == shape for t in tensors)


#: Row width from which :func:`row_dot` forms its products as block-diagonal GEMMs (below it, one
#: ``1 x d`` by ``d x 1`` product per row): measured on one thread of an Intel Xeon, float32, ``n = 1024`` rows
#: (AVX-512 and AVX2 kernels alike): ``d = 576``: 0.41-0.46 ms against 0.9-1.1 ms for
#: ``(x * y).sum(-1)``; ``d = 64`` (a head), 9216 rows: 0.46 ms per-row against 0.67 ms.
_BLOCK_DOT_MIN_WIDTH = 256
#: Rows per block of the block-diagonal product: ``B`` rows of ``x`` against ``B`` rows of ``y`` give a
#: ``B x B`` block whose diagonal is the ``B`` dot products (``B`` times the multiply-adds of the dots
#: themselves, still a small share of the one read of ``x`` and ``y``).
_DOT_BLOCK = 8


def _cpu_vendor() -> str:
    """The CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``; empty where ``/proc/cpuinfo``
    is not readable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


#: Whether :func:`row_dot` forms its dot products as batched GEMMs on the CPU (else as one
#: product pass into a reused buffer and one sum). MKL's small-matrix kernels are tuned for Intel
#: CPUs, where the GEMMs won (session 22, Xeon: see :data:`_BLOCK_DOT_MIN_WIDTH`); on an AMD EPYC
#: (Zen 4; issue 51, session 23, one thread, a loaded machine, so ratios only) one layer's
#: measuring kernels took 0.873 [0.771, 0.941] (AVX-512) and 0.943 [0.888, 0.955] (AVX2) of the
#: GEMM form's time with the product and sum (``python -m benchmarks.dot_paths --pairs 30``,
#: ``benchmarks/results/issue51_dot_paths_s23_shared*.json``). Fixed per machine at import, so a
#: process always sums the same way; ``python -m benchmarks.dot_paths`` times both paths where it runs.
_GEMM_DOTS = _cpu_vendor() in ("GenuineIntel", "")


def row_dot(x: Float[Tensor, "*batch d"], y: Float[Tensor, "*ybatch d"], scratch: Scratch | None = None,
            ) -> Float[Tensor, "*batch"]:
    """``sum_k x[..., k] * y[..., k]`` (one dtype): on an Intel CPU as matrix products (batched
    GEMMs, accumulating in the dtype, no ``[..., d]`` product written); on other CPUs
    (:data:`_GEMM_DOTS`) and other devices ``(x * y).sum(-1)``, the product written into
    ``scratch``'s buffer ``"dot"`` when given and ``x`` is contiguous (no fresh activation-sized
    tensor). The same value up to the order of the additions (the round-off of a ``d``-term sum,
    :mod:`tl_directional.core.roundoff`).

    ``y`` has ``x``'s shape, or size 1 in its second-to-last dimension: one row of ``y`` for each
    group of rows of ``x`` (the key-value head shared by a group of query heads, ``[n, n_kv, 1,
    d_head]`` against ``[n, n_kv, group, d_head]``), with no copy of ``y`` per row."""
    d = x.shape[-1]
    lead = x.shape[:-1]
    if x.device.type != "cpu" or x.numel() == 0 or d == 0:
        return _product_sum(x, y, scratch)
    if y.shape != x.shape:  # broadcast along dim -2: a group's rows against its one row of y
        if x.ndim < 2 or y.shape != (*x.shape[:-2], 1, d):
            raise ValueError(f"row_dot: y of shape {tuple(y.shape)} neither has x's shape {tuple(x.shape)} "
                             f"nor size 1 in its second-to-last dimension; pass tensors of one shape")
        if not _GEMM_DOTS:
            return _product_sum(x, y, scratch)
        return torch.bmm(x.reshape(-1, x.shape[-2], d), y.reshape(-1, d, 1)).view(lead)
    if not _GEMM_DOTS:
        return _product_sum(x, y, scratch)
    xf, yf = x.reshape(-1, d), y.reshape(-1, d)
    n = xf.shape[0]
    if d < _BLOCK_DOT_MIN_WIDTH:
        return torch.bmm(xf.unsqueeze(1), yf.unsqueeze(2)).view(lead)
    m = n - n % _DOT_BLOCK
    blocks = torch.bmm(xf[:m].view(-1, _DOT_BLOCK, d), yf[:m].view(-1, _DOT_BLOCK, d).transpose(1, 2))
    out = blocks.diagonal(dim1=1, dim2=2).reshape(m)
    if m < n:  # the rows that fill no block
        out = torch.cat([out, (xf[m:] * yf[m:]).sum(-1)])
    return out.view(lead)


def _product_sum(x: Tensor, y: Tensor, scratch: Scratch | None) -> Tensor:
    """``(x * y).sum(-1)``, ``y`` broadcasting over ``x``'s shape; the product goes into
    ``scratch``'s buffer ``"dot"`` when ``x`` is contiguous (the same kernels and layout as a
    fresh product, so the same values, without the allocation and first touch of a new tensor)."""
    if scratch is not None and x.is_contiguous():
        buf = scratch.get("dot", tuple(x.shape), torch.promote_types(x.dtype, y.dtype), x.device)
        return torch.mul(x, y, out=buf).sum(-1)
    return (x * y).sum(-1)


def row_norm(x: Float[Tensor, "*batch d"]) -> Float[Tensor, "*batch"]:
    """``||x||`` over the last dimension, in ``x``'s dtype: one read of ``x`` (a reduction kernel, no
    ``[..., d]`` square written); its square is the squared norm up to the round-off of a ``d``-term
    sum and one rounding."""
    return torch.linalg.vector_norm(x, dim=-1)


def _perp(u: Tensor, a: Tensor, r: Tensor, scratch: Scratch | None, name: str = "split") -> Tensor:
    """``u - a r`` (``a`` one scale per row; ``r`` may broadcast over ``u``) in one pass, written
    into ``scratch``'s buffer ``name`` when ``u`` is contiguous: the explicit perpendicular part,
    never the Gram closed form."""
    if _fits(scratch, u):
        buf = scratch.get(name, tuple(u.shape), u.dtype, u.device)
        return torch.addcmul(u, a.unsqueeze(-1), r, value=-1.0, out=buf)
    return torch.addcmul(u, a.unsqueeze(-1), r, value=-1.0)


def _split(u: Tensor, r: Tensor, eps: float, r_sq: Tensor | None, scratch: Scratch | None) -> tuple[SplitStats, Tensor]:
    """:func:`split_stats` of ``u`` against ``r`` (both already in the compute dtype), and
    ``r_sq`` (computed when not given).

    Three reads of ``u`` and ``r`` and one written ``[n, d]`` tensor: ``||u||`` and the
    perpendicular norm by :func:`row_norm`, ``u . r`` by :func:`row_dot`, ``u - a r`` in one
    pass (:func:`_perp`)."""
    u_norm = row_norm(u)
    u_sq = u_norm * u_norm
    if r_sq is None:
        r_norm = row_norm(r)
        r_sq = r_norm * r_norm
    dot = row_dot(u, r, scratch)
    degenerate = (r_sq <= eps) | (u_sq <= eps)
    a = torch.where(degenerate, 0.0, dot / torch.where(degenerate, 1.0, r_sq))
    perp_norm = row_norm(_perp(u, a, r, scratch))
    perp_sq = perp_norm * perp_norm
    par_sq = a * a * r_sq
    par_norm = par_sq.sqrt()
    par_frac = torch.where(
        degenerate, 0.0, (par_norm / torch.where(degenerate, 1.0, u_norm)).clamp(0.0, 1.0))
    machine_eps = torch.finfo(u.dtype).eps
    perp_vanishes = perp_sq <= eps + (PERP_VANISH_ULPS * machine_eps) ** 2 * u_sq
    par_perp_ratio = torch.where(
        degenerate, 0.0,
        torch.where(perp_vanishes, float("inf"),
                    par_norm / torch.where(perp_vanishes, 1.0, perp_norm)))
    r_vanishes = r_sq <= eps
    rel_update = torch.where(
        r_vanishes, torch.where(u_sq <= eps, 0.0, torch.full_like(u_sq, float("inf"))),
        u_norm / torch.where(r_vanishes, 1.0, r_sq.sqrt()))
    return SplitStats(alpha=a, par_frac=par_frac, par_perp_ratio=par_perp_ratio,
                      rel_update=rel_update, degenerate=degenerate,
                      par_sq=torch.where(degenerate, 0.0, par_sq), perp_sq=perp_sq), r_sq


def split_stats(
    update: Float[Tensor, "*batch d"],
    reference: Float[Tensor, "*batch d"],
    eps: float = DEFAULT_EPS,
    *,
    reference_sq: Float[Tensor, "*batch"] | None = None,
    scratch: Scratch | None = None,
) -> SplitStats:
    """Scalars of the split of ``update`` against ``reference`` (same shapes), METHOD.md sec. 1.

    ``alpha = (u . r) / ||r||^2``, ``par_frac = ||u_par|| / ||u||``, ``par_perp_ratio =
    ||u_par|| / ||u_perp||`` (``inf`` where ``u_perp`` vanishes), ``rel_update = ||u|| /
    ||r||``; degenerate tokens (``||r||^2 <= eps`` or ``||u||^2 <= eps``) get the values
    METHOD.md sec. 1 defines. Same values as :func:`~tl_directional.core.geometry.decompose`
    without forming ``u_par``; computed in the compute dtype (float64 stays float64).

    ``reference_sq``: ``(r * r).sum(-1)`` of this reference in the compute dtype, when the
    caller has it already (several updates split against one stream); ``scratch``: reusable
    buffers (:class:`Scratch`). Neither changes a value.
    """
    dtype = compute_dtype(torch.promote_types(update.dtype, reference.dtype))
    if reference_sq is not None and reference_sq.dtype != dtype:
        reference_sq = None  # computed in another dtype: not this split's
    return _split(update.to(dtype), reference.to(dtype), eps, reference_sq, scratch)[0]


def squared_norm(x: Float[Tensor, "*batch d"], scratch: Scratch | None = None) -> Float[Tensor, "*batch"]:
    """``(x * x).sum(-1)`` in the compute dtype: the ``reference_sq`` / ``x_sq`` that
    :func:`split_stats` and :func:`value_stats` would compute for ``x`` themselves."""
    norm = row_norm(x.to(compute_dtype(x.dtype)))
    return norm * norm


def _heads(s: SplitStats, n: int, n_heads: int) -> SplitStats:
    """``s`` computed per (token, key-value head, query head of its group), as ``[n, n_heads]``."""
    return SplitStats(**{f.name: getattr(s, f.name).reshape(n, n_heads) for f in fields(s)})


@dataclass(frozen=True)
class ValueStats:
    """Value-space scalars of every head at ``n`` query tokens (METHOD.md sec. 3), compute dtype.

    ``full`` splits ``o_t`` against ``v_t`` (``beta`` is its ``alpha``), ``exclusive`` splits
    the cross part ``o_t - A_tt v_t`` against ``v_t`` (``gamma``); ``alpha_head`` is
    ``o_t . W_O x_t / ||x_t||^2``, ``phi`` is ``v_t . W_O x_t / ||x_t||^2`` (0 where
    ``||x_t||^2 <= eps``); ``recon`` is ``sum_h alpha_head + b_O . x_t / ||x_t||^2``, the
    attention update's residual ``alpha`` when the factorization applies.
    """

    full: SplitStats
    exclusive: SplitStats
    a_tt: Float[Tensor, "n n_heads"]
    alpha_head: Float[Tensor, "n n_heads"]
    phi: Float[Tensor, "n n_heads"]
    self_term: Float[Tensor, "n n_heads"]
    cross_term: Float[Tensor, "n n_heads"]
    recon: Float[Tensor, " n"]


def value_stats(
    z: Float[Tensor, "n n_heads d_head"],
    v: Float[Tensor, "n n_kv_heads d_head"],
    a_tt: Float[Tensor, "n n_heads"],
    x: Float[Tensor, "n d_model"],
    W_O: Float[Tensor, "n_heads d_head d_model"],
    b_O: Float[Tensor, " d_model"] | None,
    eps: float = DEFAULT_EPS,
    *,
    x_sq: Float[Tensor, " n"] | None = None,
    scratch: Scratch | None = None,
) -> ValueStats:
    """Value-space statistics of one attention layer (METHOD.md sec. 3).

    Args:
        z: per-head outputs ``o_t`` at the query tokens.
        v: the query token's own value ``v_t`` per key-value head (``hook_v``'s heads; query head
            ``h`` reads head ``h // (n_heads // n_kv_heads)``), or already expanded to ``n_heads``.
        a_tt: the attention pattern's diagonal ``A[h, t, t]``.
        x: the residual reference ``x_t`` of the attention update.
        W_O, b_O: the layer's output weights and bias (``b_O`` may be None).
        eps: degeneracy threshold on squared norms.
        x_sq: :func:`squared_norm` of ``x``, when the caller has it already.
        scratch: reusable buffers (:class:`Scratch`); changes no value.

    The only matrix product is ``W_O[h] x_t`` (``n x d_model x n_heads d_head`` multiply-adds,
    one GEMM); the rest is dot products over ``d_head``.
    """
    dtype = compute_dtype(torch.promote_types(z.dtype, v.dtype))
    n, n_heads, d_head = z.shape
    n_kv = v.shape[-2]
    if n_kv < 1 or n_heads % n_kv:
        raise ValueError(f"value_stats: v has {n_kv} heads, which do not divide z's {n_heads}; pass each "
                         "layer's hook_v heads (n_kv_heads) or the query heads they serve (n_heads)")
    # a query head's group shares one key-value head (head h reads KV head h // group): the
    # heads as [n, n_kv, group, d_head] against [n, n_kv, 1, d_head], no copy of v per query head
    o = z.to(dtype).reshape(n, n_kv, n_heads // n_kv, d_head)
    vt = v.to(dtype).reshape(n, n_kv, 1, d_head)
    full, v_sq = _split(o, vt, eps, None, scratch)
    att = a_tt.to(dtype)
    # o - A_tt v in one pass, in its own buffer (the split below reuses "split")
    cross = _perp(o, att.view(o.shape[:-1]), vt, scratch, "cross")
    # the same reference as the full split: its squared norm is reused
    exclusive = _split(cross, vt, eps, v_sq, scratch)[0]
    full, exclusive = _heads(full, n, n_heads), _heads(exclusive, n, n_heads)
    x_t = x.to(dtype)
    d_model = W_O.shape[-1]
    # W_O[h] x_t for every head as one GEMM: [n, d] @ [d, h * e] -> [n, h, e]
    w = W_O.to(dtype).reshape(n_heads * d_head, d_model).T
    if _fits(scratch, o) and x_t.is_contiguous():
        wx = torch.matmul(x_t, w, out=scratch.get("wx", (x_t.shape[0], n_heads * d_head), dtype, o.device))
    else:
        wx = x_t @ w
    wx = wx.view(o.shape)
    if x_sq is None or x_sq.dtype != dtype:
        x_norm = row_norm(x_t)
        x_sq = x_norm * x_norm
    x_ok = x_sq > eps
    safe = torch.where(x_ok, x_sq, 1.0).unsqueeze(-1)
    ok = x_ok.unsqueeze(-1)
    alpha_head = torch.where(ok, row_dot(o, wx, scratch).reshape(n, n_heads) / safe, 0.0)
    phi = torch.where(ok, row_dot(wx, vt, scratch).reshape(n, n_heads) / safe, 0.0)
    self_term = att * phi
    recon = alpha_head.sum(-1)
    if b_O is not None:
        recon = recon + torch.where(x_ok, (x_t @ b_O.to(dtype)) / safe.squeeze(-1), 0.0)
    return ValueStats(full=full, exclusive=exclusive, a_tt=att, alpha_head=alpha_head, phi=phi,
                      self_term=self_term, cross_term=alpha_head - self_term, recon=recon)


__all__ = ["Scratch", "ValueStats", "row_dot", "row_norm", "split_stats", "squared_norm", "value_stats"]
