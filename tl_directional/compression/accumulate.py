"""Per-token accumulation and forward plumbing of :func:`~tl_directional.compression.geometry.compression_geometry`.

The exact float64 sums of the per-token statistics (:data:`STAT_NAMES`), the hooked dense /
compressed forwards that produce them (local and global mode, the side MLP call of a
sequential block), and their reduction over the ranks of a process group. The public
tables (:func:`~tl_directional.compression.geometry.compression_geometry`,
:func:`~tl_directional.compression.geometry.summarize`) live in
:mod:`tl_directional.compression.geometry`, which re-exports these names.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.components import RESIDUAL_COMPONENTS, check_components
from ..core.errors import TLDirectionalError
from ..core.geometry import compute_dtype, dtype_tolerance
from ..model.handle import capture_hooks, run_hooked
from ..model.inputs import TokenBatch, iter_batches
from ..model.sites import SEQUENTIAL, ModelSites, UnitSite, resolve_sites
from ..model.weights import mlp_branch
from .compressors import CompressionRecord

# Per-token statistics accumulated as exact float64 sums (columns of the accumulator).
_STATS = (
    "n", "degenerate", "u_sq", "e_sq", "e_par_sq", "e_perp_sq", "e_dot_u", "e_par_r_sq", "e_perp_r_sq",
    "up_sq", "t_err_par", "t_err_perp", "t_share", "n_err", "t_alpha", "t_err_par_r", "t_err_perp_r",
    "t_share_r", "t_alpha_r", "t_cos", "t_rel_mse",
    "h_sq", "d_sq", "d_par_sq", "d_perp_sq", "t_stream_rel", "t_stream_cos",
)
_IDX = {k: i for i, k in enumerate(_STATS)}
#: The names of the accumulated sums (last axis of ``df.attrs["per_sequence"]`` tensors) and
#: each one's index, for scripts that pool the sums themselves (see :func:`pooled_sums`).
STAT_NAMES: tuple[str, ...] = _STATS
STAT_INDEX: dict[str, int] = _IDX


@dataclass
class _Target:
    name: str
    model: object
    record: CompressionRecord | None
    total: Tensor  # [rows, K]
    per_seq: Tensor | None  # [n_seq, rows, K]
    seconds: float = 0.0
    plan: list | None = None


def _dot(x: Tensor, y: Tensor) -> Tensor:
    return torch.linalg.vecdot(x, y, dim=-1)


def _split_stats(e: Tensor, ref: Tensor, eps: float, r_sq: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(e . r) / ||r||^2``, ``||e_par||^2`` and ``||e_perp||^2`` of ``e`` against ``ref``
    (``a = 0`` where ``||r||^2 <= eps``). Written out instead of calling ``decompose`` so
    that ``e = 0`` gives exact zeros and no ``[.., d]`` intermediates are kept; the
    perpendicular part is formed explicitly (no cancellation in ``||e||^2 - ||e_par||^2``)."""
    dot = _dot(e, ref)
    if r_sq is None:
        r_sq = _dot(ref, ref)
    ok = r_sq > eps
    a = torch.where(ok, dot / torch.where(ok, r_sq, torch.ones_like(r_sq)), torch.zeros_like(dot))
    par_sq = a * a * r_sq
    perp = e - a.unsqueeze(-1) * ref
    return a, par_sq, _dot(perp, perp)


def _token_stats(u: Tensor, up: Tensor, ref: Tensor, eps: float,
                 stream: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """``[n, K]`` per-token statistics (see ``_STATS``) from masked ``[n, d]`` tensors."""
    dtype = compute_dtype(u.dtype)
    u, up, ref = u.to(dtype), up.to(dtype), ref.to(dtype)
    e = up - u
    u_sq = _dot(u, u)
    e_sq = _dot(e, e)
    up_sq = _dot(up, up)
    valid = u_sq > eps
    one = torch.ones_like(u_sq)
    zero = torch.zeros_like(u_sq)
    safe_u = torch.where(valid, u_sq, one)
    a, par_sq, perp_sq = _split_stats(e, u, eps, u_sq)
    a_r, par_r_sq, perp_r_sq = _split_stats(e, ref, eps)
    has_err = valid & (e_sq > 0)
    safe_e = torch.where(has_err, e_sq, one)
    norm_u = safe_u.sqrt()
    up_pos = up_sq > 0
    # u' . u = e . u + ||u||^2
    cos = torch.where(up_pos, (a * u_sq + u_sq) / (norm_u * torch.where(up_pos, up_sq, one).sqrt()), zero)
    cols = [
        valid.to(dtype), (~valid).to(dtype),
        u_sq, e_sq, par_sq, perp_sq, a * u_sq, par_r_sq, perp_r_sq, up_sq,
        par_sq.sqrt() / norm_u, perp_sq.sqrt() / norm_u,
        torch.where(has_err, perp_sq / safe_e, zero), has_err.to(dtype), a,
        par_r_sq.sqrt() / norm_u, perp_r_sq.sqrt() / norm_u,
        torch.where(has_err, perp_r_sq / safe_e, zero), a_r, cos, e_sq / safe_u,
    ]
    if stream is not None:
        h, hp = (t.to(dtype) for t in stream)
        d = hp - h
        h_sq = _dot(h, h)
        _, d_par_sq, d_perp_sq = _split_stats(d, h, eps, h_sq)
        d_sq = _dot(d, d)
        safe_h = torch.where(h_sq > eps, h_sq, one)
        hp_sq = _dot(hp, hp)
        s_cos = torch.where(hp_sq > 0, _dot(hp, h) / (safe_h.sqrt() * torch.where(hp_sq > 0, hp_sq, one).sqrt()),
                            zero)
        cols += [h_sq, d_sq, d_par_sq, d_perp_sq, (d_sq / safe_h).sqrt(), s_cos]
    else:
        cols += [zero] * 6
    out = torch.stack(cols, -1)
    # degenerate tokens contribute only to the degenerate count
    out = out * valid.to(dtype).unsqueeze(-1)
    out[:, _IDX["degenerate"]] = (~valid).to(dtype)
    return out


def _components(components, sites: ModelSites, argument: str = "components") -> tuple[str, ...]:
    """The residual components to measure (default: all the model defines), repeats dropped."""
    return check_components(components, sites.components, allowed=RESIDUAL_COMPONENTS, argument=argument,
                            arch=sites.arch, dedupe=True)


def _plan(sites: ModelSites, units: tuple[str, ...], mode: str, side_mlp: bool) -> list[dict]:
    """The compressed forwards per batch: each measures some units, replacing the
    reference streams of those units (local mode); ``side`` units are computed by calling
    the MLP branch on the dense ``resid_mid`` from inside the pass."""
    conflict = mode == "local" and sites.arch == SEQUENTIAL and "block" in units and "mlp" in units
    if not conflict:
        return [{"units": units, "side": ()}]
    if side_mlp:
        return [{"units": tuple(u for u in units if u != "mlp"), "side": ("mlp",)}]
    return [{"units": tuple(u for u in units if u != "block"), "side": ()}, {"units": ("block",), "side": ()}]


class _SideCallMismatch(TLDirectionalError, RuntimeError):
    pass


class _Runner:
    def __init__(self, dense, sites: ModelSites, units, layers, mode, eps):
        self.dense = dense
        self.sites = sites
        self.units = units
        self.layers = layers
        self.mode = mode
        self.eps = eps
        self.rows = [(L, u) for u in units for L in layers]
        self.row_of = {k: i for i, k in enumerate(self.rows)}

    def site(self, unit, layer) -> UnitSite:
        return self.sites.units[unit][layer]

    # -- dense -----------------------------------------------------------------------------
    def dense_hooks(self, store: dict):
        names = set()
        for (L, u) in self.rows:
            s = self.site(u, L)
            names |= {s.update_hook, s.reference_hook}
            if self.mode == "global":
                names.add(s.sum_hook)

        return capture_hooks(names, store)

    # -- compressed ------------------------------------------------------------------------
    def compressed_hooks(self, model, step: dict, dense_store: dict, state: dict, target, *, check_side=False):
        """Hooks for one compressed forward. ``target=None`` with ``check_side=True`` only
        checks the MLP branch against the block's own MLP output (raises on mismatch)."""
        rows = [(L, u) for (L, u) in self.rows if u in step["units"]]
        side_rows = [(L, u) for (L, u) in self.rows if u in step["side"]]
        replace = set()
        if self.mode == "local" and not check_side:
            replace = {self.site(u, L).reference_hook for (L, u) in rows}
        # each row is measured once every hook it needs has fired, whatever the firing order
        needs: dict[tuple, set] = {}
        waiting: dict[str, list] = {}
        for (L, u) in rows if target is not None else []:
            s = self.site(u, L)
            need = {s.update_hook, s.reference_hook}
            if self.mode == "global":
                need.add(s.sum_hook)
            needs[(L, u)] = need
            for n in need:
                waiting.setdefault(n, []).append((L, u))
        side_at: dict[str, list] = {}
        for (L, u) in side_rows:
            side_at.setdefault(self.site(u, L).reference_hook, []).append(L)
            if check_side:
                waiting.setdefault(self.site(u, L).update_hook, [])

        def arrive(name, t):
            state[name] = t.detach()
            for key in waiting.get(name, ()):
                if all(n in state for n in needs[key]):
                    self._measure(target, key, dense_store, state)
            for L in side_at.get(name, ()):
                self._side(model, target, L, t, dense_store, state, check_side)
            if check_side:
                for L in [L for L in state.get("side_expect", {}) if self.site("mlp", L).update_hook == name]:
                    expect = state["side_expect"].pop(L)
                    err = float((expect.double() - t.double()).abs().max()) / (float(t.abs().max()) + 1.0)
                    if not err <= dtype_tolerance(t.dtype):
                        raise _SideCallMismatch(f"layer {L}: MLP branch differs from hook_mlp_out by {err:.3g}")

        # Hook functions are bound to the name they were registered under: on the bridge,
        # hook.name is the canonical name (blocks.0.attn.hook_out), not the alias asked for.
        # While the MLP branch is being called from inside a hook, every hook passes through.
        def replace_hook(name):
            def hook(t, hook):  # noqa: ARG001
                if state.get("side"):
                    return t
                new = dense_store[name].clone().to(t.dtype)
                arrive(name, new)
                return new
            return hook

        def read_hook(name):
            def hook(t, hook):  # noqa: ARG001
                if not state.get("side"):
                    arrive(name, t)
                return t
            return hook

        names = sorted(set(waiting) | set(side_at))
        return [(n, replace_hook(n) if n in replace else read_hook(n)) for n in names]

    def _side(self, model, target, L, own_mid, dense_store, state, check_side):
        """Local MLP error of a sequential block from inside the pass: the compressed MLP
        branch applied to the dense ``resid_mid`` (the pass itself keeps the compressed
        ``resid_mid``, which the block unit needs)."""
        branch = mlp_branch(model, L)
        s = self.site("mlp", L)
        state["side"] = True
        try:
            if check_side:
                state.setdefault("side_expect", {})[L] = branch(own_mid).detach()
                return
            up = branch(dense_store[s.reference_hook])
        finally:
            state["side"] = False
        self._accumulate(target, L, "mlp", dense_store[s.update_hook], up, dense_store[s.reference_hook], state, None)

    def _measure(self, target: _Target, key, dense_store, state):
        L, u = key
        s = self.site(u, L)
        up = state[s.update_hook]
        dense_u = dense_store[s.update_hook]
        if s.update_is_difference:  # in the compute dtype: a half-precision difference is rounded
            up = up.to(compute_dtype(up.dtype)) - state[s.reference_hook].to(compute_dtype(up.dtype))
            dense_u = dense_u.to(compute_dtype(dense_u.dtype)) - dense_store[s.reference_hook].to(
                compute_dtype(dense_u.dtype))
        stream = (dense_store[s.sum_hook], state[s.sum_hook]) if self.mode == "global" else None
        self._accumulate(target, L, u, dense_u, up, dense_store[s.reference_hook], state, stream)

    def _accumulate(self, target: _Target, L, u, dense_u, up, ref, state, stream):
        """Queue one row's tensors; :meth:`flush` computes every queued row in one batch of
        tensor ops after the forward (many small ops per row cost more than the math)."""
        state.setdefault("pending", []).append((self.row_of[(L, u)], dense_u, up.detach(), ref, stream))

    @torch.no_grad()
    def flush(self, target: _Target, state):
        pending = state.pop("pending", [])
        if not pending:
            return
        mask = state["mask"]
        d = pending[0][1].shape[-1]
        if state.get("all_tokens"):  # no padding: flatten views instead of masked copies
            def pick(t):
                return t.reshape(-1, d)
        else:
            def pick(t):
                return t[mask]
        for glob in (True, False):
            group = [p for p in pending if (p[4] is not None) == glob]
            if not group:
                continue
            rows = [p[0] for p in group]
            cat = [torch.cat([pick(p[i]) for p in group]) for i in (1, 2, 3)]
            stream = None
            if glob:
                stream = (torch.cat([pick(p[4][0]) for p in group]), torch.cat([pick(p[4][1]) for p in group]))
            stats = _token_stats(cat[0], cat[1], cat[2], self.eps, stream).double()
            n = stats.shape[0] // len(rows)
            stats = stats.view(len(rows), n, -1)
            idx = torch.tensor(rows, device=stats.device)
            target.total.index_add_(0, idx.to(target.total.device), stats.sum(1).to(target.total.device))
            if target.per_seq is not None:
                seq = state["seq_index"].reshape(-1) if state.get("all_tokens") else state["seq_index"][mask]
                n_rows = target.per_seq.shape[1]
                flat = target.per_seq.view(-1, stats.shape[-1])  # [n_seq * rows, K], a view
                where = (seq.unsqueeze(0) * n_rows + idx.unsqueeze(1)).reshape(-1)
                flat.index_add_(0, where.to(flat.device), stats.reshape(-1, stats.shape[-1]).to(flat.device))


# model -> {layers: whether its MLP branch reproduced hook_mlp_out} (checked once per model)
_BRANCH_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _run(model, tokens, attention_mask, hooks, stop_at: str | None):
    """A forward with ``hooks`` that ends after ``stop_at`` (nothing after the last measured
    block is needed)."""
    run_hooked(model, tokens, attention_mask, hooks, stop_at)


def _choose_plan(runner: _Runner, sites, units, mode, target: _Target, part: TokenBatch, stop_at) -> list[dict]:
    """One compressed forward per batch when the MLP branch can be called on its own (checked
    once, on a short slice, against the block's own MLP output), else two."""
    side_ok = all(mlp_branch(target.model, L) is not None for L in runner.layers)
    plan = _plan(sites, units, mode, side_ok)
    if not any(step["side"] for step in plan):
        return plan
    key = tuple(runner.layers)
    checked = _BRANCH_CHECKED.get(target.model, {})
    if key in checked:
        return plan if checked[key] else _plan(sites, units, mode, False)
    probe = next(iter_batches(part.slice(0, 2), 2))
    probe = TokenBatch(probe.tokens[:, :32], probe.attention_mask[:, :32])
    state = {"mask": probe.attention_mask.bool()}
    try:
        _run(target.model, probe.tokens, probe.attention_mask,
             runner.compressed_hooks(target.model, plan[0], {}, state, None, check_side=True), stop_at)
        if state.get("side_expect"):
            raise _SideCallMismatch("hook_mlp_out never fired")
    except _SideCallMismatch:
        _BRANCH_CHECKED.setdefault(target.model, {})[key] = False
        return _plan(sites, units, mode, False)
    _BRANCH_CHECKED.setdefault(target.model, {})[key] = True
    return plan


def _sites_of(model) -> tuple[ModelSites, bool]:
    """The model's sites (resolved once per model by :func:`resolve_sites`) and whether the
    last block's ``hook_resid_post`` exists (to stop the forward there)."""
    sites = resolve_sites(model, warn=False)
    return sites, sites.resid_post_hook(sites.n_layers - 1) in model.hook_dict


def _all_reduce_sums(targets: list[_Target], n_tokens: int) -> int:
    """Sum every target's exact float64 sums (and per-sequence sums) and the token count over
    the ranks of the default process group; returns the global token count."""
    import torch.distributed as dist

    for target in targets:
        for name in ("total", "per_seq"):
            t = getattr(target, name)
            if t is None:
                continue
            # reduce on the backend's device (NCCL needs CUDA tensors), copy back
            dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else t.device
            buf = t.to(dev)
            dist.all_reduce(buf)
            t.copy_(buf.to(t.device))
    count = torch.tensor([n_tokens], dtype=torch.long)
    if dist.get_backend() == "nccl":
        count = count.cuda()
    dist.all_reduce(count)
    return int(count[0])
