"""Error geometry of a compressed model against its dense original (METHOD.md sec. 6).

:func:`compression_geometry` streams a token set through both models and, per
(layer, unit), splits the compression error ``e = u' - u`` of each unit's update
against the dense update ``u`` (and against the unit's residual reference):

- ``mode="local"``: every unit of the compressed model is fed the *dense* input of
  that unit. One dense forward records the inputs and updates; the compressed
  model then runs with hooks that replace each unit's input stream
  (``hook_resid_pre`` for attention / block, the MLP's reference stream for the
  MLP) by the dense one, so a single compressed forward gives every layer's local
  error at once (blocks are independent given their input). In a sequential block
  the MLP's local input (dense ``resid_mid``) and the block's local input (its
  own attention output added to the dense ``resid_pre``) conflict, so when both
  ``"mlp"`` and ``"block"`` are asked for the compressed model runs twice.
- ``mode="global"``: both models run end to end on the same tokens; the update
  error and the stream error (stream after the unit, compressed minus dense,
  split against the dense stream) are reported per layer.

Nothing holds full caches: per batch, the dense activations of that batch only;
across batches, exact float64 sums per (layer, unit) (and per sequence when
``per_sequence=True``, for bootstrap intervals). Padding never counts.

Metrics (all per token, then aggregated):

==================================  ============================================
``err_par_over_update``             ``||e_par|| / ||u||`` (``e`` split against ``u``)
``err_perp_over_update``            ``||e_perp|| / ||u||``
``err_perp_share``                  ``||e_perp||^2 / ||e||^2`` (tokens with ``e != 0``)
``alpha_err``                       ``(e . u) / ||u||^2``; negative = update shrank
``*_vs_resid``                      the same, with ``e`` split against the unit's
                                    residual reference ``r`` (still over ``||u||``)
``cos_sim``                         ``cos(u', u)`` (0 where ``u' = 0``)
``rel_mse``                         ``||e||^2 / ||u||^2``
==================================  ============================================

Each is reported as a per-token mean (the column named as above) and, where it
is a ratio of norms, in energy form (``*_energy``, e.g.
``err_perp_energy = sqrt(sum ||e_perp||^2 / sum ||u||^2)``), which is the
headline: per-token means are dominated by tokens whose update is tiny, the
energy form is not (METHOD.md sec. 1, "Aggregation"). Tokens with
``||u||^2 <= eps`` are counted in ``degenerate`` and left out of every metric.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from ..adapter import capture_hooks, device_of, run_hooked
from ..components import RESIDUAL_COMPONENTS, check_components
from ..compress import CompressionRecord, CompressionResult
from ..distributed import rank_and_world
from ..geometry import DEFAULT_EPS, check_eps, compute_dtype
from ..inputs import TokenBatch, first_token_mask, iter_batches, prepare_inputs
from ..sites import (
    SEQUENTIAL,
    ModelSites,
    UnitSite,
    architecture_name,
    check_hook_api,
    dtype_tolerance,
    lane_of,
    mlp_branch,
    normalize_layers,
    resolve_sites,
    verify_sites,
)

MODES = ("local", "global")

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


class CompatibilityError(ValueError):
    """Dense and compressed models cannot be compared (architecture, vocabulary, tokenizer)."""


_VOCABS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab_fingerprint(tok) -> int:
    """Hash of a tokenizer's token -> id table (cached per tokenizer object)."""
    try:
        return _VOCABS[tok]
    except (KeyError, TypeError):
        pass
    fp = hash(frozenset(tok.get_vocab().items()))
    try:
        _VOCABS[tok] = fp
    except TypeError:  # pragma: no cover - not weak-referenceable
        pass
    return fp


def check_compatible(dense, compressed) -> None:
    """Raise :class:`CompatibilityError` unless the two models can be compared layer by layer."""
    check_hook_api(dense, "dense")
    check_hook_api(compressed, "compressed")
    if lane_of(dense) is not lane_of(compressed):
        raise CompatibilityError(
            f"dense is a {lane_of(dense).name}-lane model but compressed is a {lane_of(compressed).name}-lane "
            "model; load both the same way (tl_directional.load_model)")
    a, b = architecture_name(dense), architecture_name(compressed)
    if a != b:
        raise CompatibilityError(f"architectures differ: dense is {a!r}, compressed is {b!r}")
    for attr in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab"):
        x, y = getattr(dense.cfg, attr, None), getattr(compressed.cfg, attr, None)
        if x != y:
            what = "vocabularies" if attr == "d_vocab" else "shapes"
            raise CompatibilityError(f"{what} differ: dense has {attr}={x}, compressed has {attr}={y}")
    ta, tb = getattr(dense, "tokenizer", None), getattr(compressed, "tokenizer", None)
    if ta is not None and tb is not None and ta is not tb:
        if len(ta) != len(tb) or _vocab_fingerprint(ta) != _vocab_fingerprint(tb):
            raise CompatibilityError(
                f"tokenizers differ (dense: {len(ta)} tokens, compressed: {len(tb)} tokens, or the same "
                "size with different ids): the models would not read the same token ids")
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if getattr(ta, attr, None) != getattr(tb, attr, None):
                raise CompatibilityError(f"tokenizers differ in {attr}: {getattr(ta, attr, None)} vs "
                                         f"{getattr(tb, attr, None)}")


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


def _safe_div(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.nan  # never let a NaN / inf sum read as a zero error
    return a / b if b > 0 else 0.0


def summarize(sums: Tensor, mode: str) -> dict[str, float | int]:
    """Metrics of one (layer, unit) row from its ``[K]`` sums (used for totals and bootstraps):
    counts (``tokens``, ``degenerate``, ``zero_error_tokens``) as ints, metrics as floats."""
    s = {k: float(sums[i]) for k, i in _IDX.items()}
    n, n_err = s["n"], s["n_err"]
    out = {
        "tokens": int(round(n)),
        "degenerate": int(round(s["degenerate"])),
        "zero_error_tokens": int(round(n - n_err)),
        "err_par_over_update": _safe_div(s["t_err_par"], n),
        "err_perp_over_update": _safe_div(s["t_err_perp"], n),
        "err_perp_share": _safe_div(s["t_share"], n_err),
        "alpha_err": _safe_div(s["t_alpha"], n),
        "err_par_over_update_vs_resid": _safe_div(s["t_err_par_r"], n),
        "err_perp_over_update_vs_resid": _safe_div(s["t_err_perp_r"], n),
        "err_perp_share_vs_resid": _safe_div(s["t_share_r"], n_err),
        "alpha_err_vs_resid": _safe_div(s["t_alpha_r"], n),
        "cos_sim": _safe_div(s["t_cos"], n),
        "rel_mse": _safe_div(s["t_rel_mse"], n),
        "err_par_energy": _safe_div(s["e_par_sq"], s["u_sq"]) ** 0.5,
        "err_perp_energy": _safe_div(s["e_perp_sq"], s["u_sq"]) ** 0.5,
        "err_perp_share_energy": _safe_div(s["e_perp_sq"], s["e_sq"]),
        "alpha_err_energy": _safe_div(s["e_dot_u"], s["u_sq"]),
        "rel_mse_energy": _safe_div(s["e_sq"], s["u_sq"]),
        "err_par_energy_vs_resid": _safe_div(s["e_par_r_sq"], s["u_sq"]) ** 0.5,
        "err_perp_energy_vs_resid": _safe_div(s["e_perp_r_sq"], s["u_sq"]) ** 0.5,
        "err_perp_share_energy_vs_resid": _safe_div(s["e_perp_r_sq"], s["e_sq"]),
        "update_norm_ratio": _safe_div(s["up_sq"], s["u_sq"]) ** 0.5,
        # u' == 0 on every token: e = -u exactly, zero perpendicular error by construction
        "by_construction_parallel": bool(n > 0 and s["up_sq"] == 0.0),
        # NaN / inf activations or errors anywhere in this row's sums (a gate must fail on them)
        "finite": bool(torch.isfinite(sums).all()),
    }
    if mode == "global":
        out.update({
            "stream_rel_err": _safe_div(s["t_stream_rel"], n),
            "stream_cos_sim": _safe_div(s["t_stream_cos"], n),
            "stream_err_energy": _safe_div(s["d_sq"], s["h_sq"]) ** 0.5,
            "stream_err_par_energy": _safe_div(s["d_par_sq"], s["h_sq"]) ** 0.5,
            "stream_err_perp_energy": _safe_div(s["d_perp_sq"], s["h_sq"]) ** 0.5,
        })
    return out


def normalize_targets(compressed) -> list[tuple[str, object, CompressionRecord | None]]:
    """The compressed models of a ``compressed`` argument as ``(name, model, record)`` rows.

    ``compressed`` is one model, a :class:`~tl_directional.compress.CompressionResult`, a
    list / tuple of them or a mapping ``name -> model or result``. A result is named by its
    record's label (a plain model: ``"compressed"``), a mapping by its keys; repeated names of
    a list get their position as a suffix (``"rtn #1"``). ``record`` is None for plain models.
    Raises ValueError for an empty list or mapping. Shared by :func:`compression_geometry`
    and :func:`~tl_directional.compression.gate.compress_check`.
    """
    def one(name, obj):
        if isinstance(obj, CompressionResult):
            return (name or obj.record.label, obj.model, obj.record)
        return (name or "compressed", obj, None)

    if isinstance(compressed, Mapping):
        if not compressed:
            raise ValueError("compressed is an empty mapping")
        return [one(str(k), v) for k, v in compressed.items()]
    if isinstance(compressed, (list, tuple)) and not isinstance(compressed, CompressionResult):
        if not compressed:
            raise ValueError("compressed is an empty list")
        out = [one(None, c) for c in compressed]
        names = [n for n, _, _ in out]
        # unnamed models get their position as a suffix so rows stay distinguishable
        return [(f"{n} #{i}" if names.count(n) > 1 else n, m, r) for i, (n, m, r) in enumerate(out)]
    return [one(None, compressed)]


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


class _SideCallMismatch(RuntimeError):
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
        if s.update_is_difference:
            up = up - state[s.reference_hook]
            dense_u = dense_u - dense_store[s.reference_hook]
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


def compression_geometry(
    dense,
    compressed,
    inputs,
    *,
    mode: str = "local",
    components=None,
    layers=None,
    batch_size: int = 8,
    attention_mask: Tensor | None = None,
    exclude_first_token: bool = False,
    eps: float = DEFAULT_EPS,
    per_sequence: bool = False,
    verify: bool = True,
    progress: bool = False,
    units=None,
) -> pd.DataFrame:
    """Per-layer, per-unit geometry of the compression error (METHOD.md sec. 6).

    Args:
        dense: the original TransformerLens model (bridge or legacy), eval mode.
        compressed: the compressed model (same architecture and tokenizer), a
            :class:`~tl_directional.compress.CompressionResult`, or a list / dict of them
            (the dense forward is then shared; a ``compressed`` column names each).
        inputs: strings, token-id lists, a ``[batch, pos]`` tensor or a ``TokenBatch``.
        mode: ``"local"`` (each unit fed the dense input) or ``"global"`` (end to end).
        components: any of ``"attn"``, ``"mlp"``, ``"block"``; default all the model defines
            (the result's ``unit`` column names them).
        layers: None (all), an int or a list.
        batch_size: sequences per forward.
        attention_mask: with token-id tensors; padding is excluded from every statistic.
        exclude_first_token: leave each sequence's first real token out.
        eps: tokens with ``||u||^2 <= eps`` are degenerate (counted, not measured).
        per_sequence: also return per-sequence sums (``df.attrs["per_sequence"]``, a
            ``[n_seq, rows, K]`` float64 tensor per model, with ``df.attrs["stat_names"]``
            and ``df.attrs["rows"]``), for bootstrap intervals via :func:`summarize`.
        verify: check the additive identity of the dense model's sites first.
        progress: tqdm bar.
        units: deprecated alias of ``components`` (warns).

    Returns:
        One row per (layer, unit) (and per compressed model), columns described in the
        module docstring; ``df.attrs`` holds metadata (mode, tokens, records, seconds).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be 'local' or 'global', got {mode!r}")
    eps = check_eps(eps)
    targets_in = normalize_targets(compressed)
    for _, model, _ in targets_in:
        check_compatible(dense, model)
    # Same lane, architecture class and shapes (checked above) mean the same hook names.
    sites, has_resid_post = _sites_of(dense)
    if units is not None:
        if components is not None:
            raise TypeError("pass components= only (units= is its deprecated alias)")
        warnings.warn("compression_geometry(units=...) is deprecated; pass components=...",
                      DeprecationWarning, stacklevel=2)
        components, argument = units, "units"
    else:
        argument = "components"
    units = _components(components, sites, argument)
    layers = normalize_layers(layers, sites.n_layers)
    batch = prepare_inputs(dense, inputs, attention_mask)
    device = device_of(dense)
    if verify:
        first = next(iter_batches(batch.slice(0, 2), 2)).to(device)
        verify_sites(dense, sites, first.tokens[:, :64], first.attention_mask[:, :64])
    runner = _Runner(dense, sites, units, layers, mode, eps)
    # nothing after the last measured block is needed: stop both forwards there
    stop_at = sites.resid_post_hook(max(layers)) if has_resid_post else None
    K = len(_STATS)
    targets = [
        _Target(name, model, record, torch.zeros(len(runner.rows), K, dtype=torch.float64),
                torch.zeros(len(batch), len(runner.rows), K, dtype=torch.float64) if per_sequence else None)
        for name, model, record in targets_in
    ]
    batches = list(iter_batches(batch, batch_size))
    iterator = batches
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(batches, desc=f"compression geometry ({mode})", unit="batch")
    dense_seconds = 0.0
    n_tokens = 0
    seq_offset = 0
    # under torchrun each rank takes every world-th batch (as sweep does); sums are all-reduced
    rank, world = rank_and_world()
    with torch.no_grad():
        for bi, part in enumerate(iterator):
            if bi % world != rank:
                seq_offset += len(part)
                continue
            part = part.to(device)
            mask = part.attention_mask.bool()
            if exclude_first_token:
                mask = mask & ~first_token_mask(part.attention_mask)
            seq_index = (torch.arange(len(part), device=device) + seq_offset).unsqueeze(1).expand_as(mask)
            all_tokens = bool(mask.all())
            store: dict = {}
            t0 = time.perf_counter()
            _run(dense, part.tokens, part.attention_mask, runner.dense_hooks(store), stop_at)
            dense_seconds += time.perf_counter() - t0
            for target in targets:
                t0 = time.perf_counter()
                if target.plan is None:
                    target.plan = _choose_plan(runner, sites, units, mode, target, part, stop_at)
                for step in target.plan:
                    state = {"mask": mask, "seq_index": seq_index, "all_tokens": all_tokens}
                    _run(target.model, part.tokens, part.attention_mask,
                         runner.compressed_hooks(target.model, step, store, state, target), stop_at)
                    runner.flush(target, state)
                target.seconds += time.perf_counter() - t0
            n_tokens += int(mask.sum())
            seq_offset += len(part)
            del store
    if world > 1:
        n_tokens = _all_reduce_sums(targets, n_tokens)
    frames = []
    for target in targets:
        rows = []
        dropped = set(target.record.layers) if target.record is not None and target.record.method == "drop" else set()
        for i, (L, u) in enumerate(runner.rows):
            row = {"layer": L, "unit": u, "mode": mode}
            row.update(summarize(target.total[i], mode))
            row["by_construction_parallel"] = bool(row["by_construction_parallel"] or L in dropped)
            rows.append(row)
        df = pd.DataFrame(rows)
        if len(targets) > 1:
            df.insert(0, "compressed", target.name)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    out = out.sort_values(([ "compressed"] if len(targets) > 1 else []) + ["unit", "layer"],
                          key=lambda c: c.map({"attn": 0, "mlp": 1, "block": 2}) if c.name == "unit" else c,
                          kind="stable").reset_index(drop=True)
    out.attrs.update({
        "mode": mode,
        "tokens": n_tokens,
        "sequences": len(batch),
        "units": list(units),
        "layers": list(layers),
        "architecture": sites.arch,
        "lane": sites.lane,
        "headline": "err_perp_energy",
        "dense_seconds": dense_seconds,
        "compressed_seconds": {t.name: t.seconds for t in targets},
        "compressed_forwards_per_batch": {t.name: len(t.plan or ()) for t in targets},
        "records": {t.name: (t.record.as_dict() if t.record is not None else None) for t in targets},
        "rows": list(runner.rows),
        "stat_names": list(_STATS),
    })
    if per_sequence:
        out.attrs["per_sequence"] = {t.name: t.per_seq for t in targets}
    return out


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


def pooled_sums(sums: Tensor, rows: Sequence[tuple[int, str]], unit: str, layers=None) -> Tensor:
    """Sum the ``[..., rows, K]`` statistics over the layers of ``unit`` (pooling tokens across
    layers), keeping leading axes (e.g. sequences)."""
    idx = [i for i, (L, u) in enumerate(rows) if u == unit and (layers is None or L in layers)]
    if not idx:
        raise ValueError(f"no rows for unit {unit!r}")
    return sums[..., idx, :].sum(-2)



__all__ = [
    "MODES",
    "STAT_INDEX",
    "STAT_NAMES",
    "CompatibilityError",
    "check_compatible",
    "compression_geometry",
    "normalize_targets",
    "pooled_sums",
    "summarize",
]
