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

import json
import math
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from .adapter import hf_state_key
from .compress import CompressionRecord, CompressionResult
from .geometry import DEFAULT_EPS, compute_dtype
from .inputs import TokenBatch, first_token_mask, iter_batches, prepare_inputs
from .sites import (
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
    if lane_of(dense) != lane_of(compressed):
        raise CompatibilityError(
            f"dense is a {lane_of(dense)}-lane model but compressed is a {lane_of(compressed)}-lane "
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


def summarize(sums: Tensor, mode: str) -> dict[str, float]:
    """Metrics of one (layer, unit) row from its ``[K]`` sums (used for totals and bootstraps)."""
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


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover
        return torch.device("cpu")


def _normalize_targets(compressed) -> list[tuple[str, object, CompressionRecord | None]]:
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


def _units(units, sites: ModelSites) -> tuple[str, ...]:
    if units is None:
        return sites.components
    if isinstance(units, str):
        units = (units,)
    units = tuple(dict.fromkeys(units))
    for u in units:
        if u not in ("attn", "mlp", "block"):
            raise ValueError(f"units has unknown entry {u!r}; choose from ('attn', 'mlp', 'block')")
        if u not in sites.units:
            raise ValueError(f"unit {u!r} is not defined for this {sites.arch} model; available: {sites.components}")
    if not units:
        raise ValueError("units is empty")
    return units


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

        def keep(name):
            def hook(t, hook):  # noqa: ARG001
                store[name] = t.detach()
                return t
            return hook

        return [(n, keep(n)) for n in sorted(names)]

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


class _StopForward(Exception):
    """Raised by a hook after the last measured layer: the rest of the forward (later blocks,
    final norm, unembedding) is not needed."""


def _stop_hook(t, hook):  # noqa: ARG001
    raise _StopForward


def _run(model, tokens, attention_mask, hooks, stop_at: str | None):
    if stop_at is not None:
        hooks = list(hooks) + [(stop_at, _stop_hook)]
    try:
        model.run_with_hooks(tokens, attention_mask=attention_mask, return_type=None, fwd_hooks=hooks)
    except _StopForward:
        pass


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


_SITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sites_of(model) -> tuple[ModelSites, bool]:
    """``resolve_sites`` once per model object (hook names do not change with the weights;
    the bridge rebuilds its hook dictionary on every access, which costs a few ms)."""
    if model not in _SITES:
        sites = resolve_sites(model, warn=False)
        _SITES[model] = (sites, f"blocks.{sites.n_layers - 1}.hook_resid_post" in model.hook_dict)
    return _SITES[model]


def compression_geometry(
    dense,
    compressed,
    inputs,
    *,
    mode: str = "local",
    units=None,
    layers=None,
    batch_size: int = 8,
    attention_mask: Tensor | None = None,
    exclude_first_token: bool = False,
    eps: float = DEFAULT_EPS,
    per_sequence: bool = False,
    verify: bool = True,
    progress: bool = False,
) -> pd.DataFrame:
    """Per-layer, per-unit geometry of the compression error (METHOD.md sec. 6).

    Args:
        dense: the original TransformerLens model (bridge or legacy), eval mode.
        compressed: the compressed model (same architecture and tokenizer), a
            :class:`~tl_directional.compress.CompressionResult`, or a list / dict of them
            (the dense forward is then shared; a ``compressed`` column names each).
        inputs: strings, token-id lists, a ``[batch, pos]`` tensor or a ``TokenBatch``.
        mode: ``"local"`` (each unit fed the dense input) or ``"global"`` (end to end).
        units: any of ``"attn"``, ``"mlp"``, ``"block"``; default all the model defines.
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

    Returns:
        One row per (layer, unit) (and per compressed model), columns described in the
        module docstring; ``df.attrs`` holds metadata (mode, tokens, records, seconds).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be 'local' or 'global', got {mode!r}")
    targets_in = _normalize_targets(compressed)
    for _, model, _ in targets_in:
        check_compatible(dense, model)
    # Same lane, architecture class and shapes (checked above) mean the same hook names.
    sites, has_resid_post = _sites_of(dense)
    units = _units(units, sites)
    layers = normalize_layers(layers, sites.n_layers)
    batch = prepare_inputs(dense, inputs, attention_mask)
    device = _model_device(dense)
    if verify:
        first = next(iter_batches(batch.slice(0, 2), 2)).to(device)
        verify_sites(dense, sites, first.tokens[:, :64], first.attention_mask[:, :64])
    runner = _Runner(dense, sites, units, layers, mode, eps)
    # nothing after the last measured block is needed: stop both forwards there
    stop_at = f"blocks.{max(layers)}.hook_resid_post" if has_resid_post else None
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
    from .sweep import _dist_info

    rank, world = _dist_info()
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


# ---------------------------------------------------------------------------------------------
# The label-free gate
# ---------------------------------------------------------------------------------------------

GATE_METRICS = ("err_perp_energy", "err_perp_over_update", "err_perp_energy_vs_resid")
GATE_UNITS = ("attn", "mlp", "block", "all")


@dataclass
class CheckResult:
    """Outcome of :func:`compress_check`. ``passed`` is the verdict; ``table`` has every
    checked (layer, unit) row with a ``status`` column; ``reasons`` says why it failed."""

    passed: bool
    threshold: float
    metric: str
    units: tuple[str, ...]
    mode: str
    table: pd.DataFrame
    reasons: list[str]
    geometry: pd.DataFrame
    dense_name: str = "dense"
    compressed_name: str = "compressed"

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def worst(self, n: int = 10) -> pd.DataFrame:
        return self.table.sort_values(self.metric, ascending=False, kind="stable").head(n)

    def _summary_columns(self) -> list[str]:
        cols = ["unit", "layer", self.metric, "err_par_energy", "err_perp_share_energy", "cos_sim",
                "rel_mse_energy", "status"]
        return list(dict.fromkeys(c for c in cols if c in self.table))

    def summary(self, n: int = 10) -> str:
        """A one-screen text report: verdict, threshold, the ``n`` worst layers."""
        verdict = "PASS" if self.passed else "FAIL"
        worst = self.table[self.metric].max() if len(self.table) else math.nan
        head = (f"compress-check {verdict}: max {self.metric} = {worst:.4f} "
                f"(threshold {self.threshold:g}; units {', '.join(self.units)}; {self.mode} mode; "
                f"{self.geometry.attrs.get('tokens', 0)} tokens)")
        cols = self._summary_columns()
        with pd.option_context("display.width", 120, "display.max_columns", 12, "display.precision", 4):
            body = self.worst(n)[cols].to_string(index=False)
        lines = [head, f"dense: {self.dense_name}", f"compressed: {self.compressed_name}",
                 f"worst {min(n, len(self.table))} of {len(self.table)} (layer, unit) rows:", body]
        lines += [f"reason: {r}" for r in self.reasons]
        return "\n".join(lines)

    def write_report(self, directory) -> Path:
        """Write ``report.html`` (verdict, per-layer chart, tables) and ``geometry.csv``."""
        from html import escape

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.geometry.to_csv(out / "geometry.csv", index=False)
        series = {}
        for unit in self.units:
            sub = self.table[self.table.unit == unit].sort_values("layer")
            series[unit] = list(zip(sub.layer.tolist(), sub[self.metric].tolist(), strict=True))
        chart = svg_chart(series, title=f"{self.metric} per layer", xlabel="layer", ylabel=self.metric,
                          hline=(self.threshold, "threshold"))
        verdict = "PASS" if self.passed else "FAIL"
        color = "#1a7f37" if self.passed else "#cf222e"
        reasons = "".join(f"<li>{escape(r)}</li>" for r in self.reasons)
        html = f"""<!doctype html><html><head><meta charset="utf-8"><title>compress-check {verdict}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}h1 span{{color:{color}}}</style></head><body>
<h1>compress-check: <span>{verdict}</span></h1>
<p>metric <code>{escape(self.metric)}</code> (label-free: no labels or logits, only the layer updates),
threshold {self.threshold:g}, units {escape(", ".join(self.units))}, {escape(self.mode)} mode,
{self.geometry.attrs.get("tokens", 0)} tokens.<br>dense: <code>{escape(self.dense_name)}</code><br>
compressed: <code>{escape(self.compressed_name)}</code></p><ul>{reasons}</ul>
{chart}
<h2>Worst layers</h2>{self.worst(10)[self._summary_columns()].to_html(index=False, float_format=lambda x: f"{x:.4g}")}
<h2>All checked rows</h2>{self.table.to_html(index=False, float_format=lambda x: f"{x:.4g}")}
<p>Definitions: METHOD.md sec. 6; <code>err_perp_energy = sqrt(sum ||e_perp||^2 / sum ||u||^2)</code>
with <code>e = u' - u</code> split against the dense update <code>u</code>.</p></body></html>"""
        (out / "report.html").write_text(html, encoding="utf-8")
        return out / "report.html"


def nonfinite_parameters(model) -> list[tuple[str, int]]:
    """``(name, count)`` of every parameter of ``model`` holding NaN or inf values."""
    out = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() or p.is_complex():
                bad = int((~torch.isfinite(p)).sum())
                if bad:  # bridge names without the wrapper hops (adapter.hf_state_key)
                    out.append((hf_state_key(name), bad))
    return out


def compress_check(dense, compressed, inputs, *, max_perp_error: float, unit: str = "block", mode: str = "local",
                   metric: str = "err_perp_energy", batch_size: int = 8, fail_on_removed_update: bool = True,
                   dense_name: str = "dense", compressed_name: str = "compressed", progress: bool = False,
                   geometry: pd.DataFrame | None = None) -> CheckResult:
    """Label-free gate: pass when the perpendicular error of every checked (layer, unit) row
    stays within ``max_perp_error``.

    Args:
        unit: ``"attn"``, ``"mlp"``, ``"block"`` (default; post-LN models have no block, so
            their attention and MLP are checked) or ``"all"``.
        metric: ``"err_perp_energy"`` (headline), ``"err_perp_over_update"`` (per-token mean)
            or ``"err_perp_energy_vs_resid"``.
        fail_on_removed_update: also fail when a unit's compressed update is exactly zero (a
            dropped layer: its error is purely parallel, so a perpendicular threshold cannot
            see it).
        geometry: reuse a table from :func:`compression_geometry` instead of measuring.
    """
    if unit not in GATE_UNITS:
        raise ValueError(f"unit must be one of {GATE_UNITS}, got {unit!r}")
    # Checked before the metric: a NaN / inf weight is a FAIL even where no metric would see it
    # (``ln_f``, the unembedding) and it would otherwise turn the metrics into NaN.
    if metric not in GATE_METRICS:
        raise ValueError(f"metric must be one of {GATE_METRICS}, got {metric!r}")
    try:
        threshold = float(max_perp_error)
    except (TypeError, ValueError):
        raise ValueError(f"max_perp_error must be a number, got {max_perp_error!r}") from None
    if not (threshold >= 0 and threshold < float("inf")):
        raise ValueError(f"max_perp_error must be a finite number >= 0, got {max_perp_error!r}")
    sites = resolve_sites(dense, warn=False)
    if unit == "all":
        units = sites.components
    elif unit == "block" and "block" not in sites.units:
        units = ("attn", "mlp")
    else:
        units = (unit,)
    models = [("dense", dense)] + [(name, m) for name, m, _ in _normalize_targets(compressed)]
    bad_weights = [f"{which} {name} ({count} non-finite values)"
                   for which, model in models for name, count in nonfinite_parameters(model)]
    if bad_weights:
        empty = pd.DataFrame({"unit": pd.Series(dtype=str), "layer": pd.Series(dtype=int),
                              metric: pd.Series(dtype=float), "status": pd.Series(dtype=str)})
        reasons = ["non-finite (NaN / inf) weights, which no threshold can pass: " + ", ".join(bad_weights)]
        return CheckResult(False, threshold, metric, tuple(units), mode, empty, reasons, pd.DataFrame(),
                           dense_name, compressed_name)
    if geometry is None:
        geometry = compression_geometry(dense, compressed, inputs, mode=mode, units=units,
                                        batch_size=batch_size, progress=progress)
    table = geometry[geometry.unit.isin(units)].copy()
    finite = table["finite"].astype(bool) if "finite" in table else pd.Series(True, index=table.index)
    nonfinite = ~finite | ~table[metric].map(math.isfinite).astype(bool)
    over = (table[metric] > threshold) & ~nonfinite
    removed = table["by_construction_parallel"].astype(bool) & ~nonfinite
    table["status"] = "ok"
    table.loc[over, "status"] = "FAIL"
    table.loc[nonfinite, "status"] = "FAIL (non-finite)"
    reasons = []
    if nonfinite.any():
        which = ", ".join(f"{r.unit} layer {int(r.layer)}" for r in table[nonfinite].itertuples())
        reasons.append(f"non-finite (NaN / inf) activations or errors at {which}: the gate cannot "
                       "measure them, so they fail")
    if over.any():
        worst = table.loc[table[metric].idxmax()]
        reasons.append(f"{int(over.sum())} row(s) over the threshold; worst {worst.unit} layer "
                       f"{int(worst.layer)}: {metric} = {worst[metric]:.4f} > {threshold:g}")
    if removed.any():
        table.loc[removed, "status"] = "FAIL (update removed)" if fail_on_removed_update else "update removed"
        which = ", ".join(f"{r.unit} {int(r.layer)}" for r in table[removed].itertuples())
        msg = (f"compressed update is exactly zero at {which}: the error there is purely parallel "
               "(e = -u), which a perpendicular threshold cannot see")
        reasons.append(msg if fail_on_removed_update else "warning: " + msg)
    passed = not over.any() and not nonfinite.any() and not (fail_on_removed_update and removed.any())
    return CheckResult(passed, threshold, metric, tuple(units), mode, table.reset_index(drop=True), reasons,
                       geometry, dense_name, compressed_name)


# ---------------------------------------------------------------------------------------------
# Command line (registered in tl_directional.cli)
# ---------------------------------------------------------------------------------------------


def _load_checked(path, argument: str):
    """Load a model for the CLI; a missing, corrupt or truncated file is a user error
    (exit 2) naming the argument and the file, never the gate's FAIL status."""
    from .fileio import ArtefactError, check_model_dir
    from .models import load_model

    check_model_dir(path, argument)
    try:
        return load_model(path)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError):
        raise
    except Exception as err:  # transformers / safetensors / tokenizers raise their own types
        raise ArtefactError(f"{argument} {path} cannot be loaded ({type(err).__name__}: {err}); "
                            "check that it is a complete Hugging Face model directory") from None


def _cmd_compress_check(args) -> int:
    from .cli import USER_ERRORS, load_text_sequences, report_user_error

    try:
        dense = _load_checked(args.dense, "--dense")
        compressed = _load_checked(args.compressed, "--compressed")
        batch = load_text_sequences(dense, args.text, max_sequences=args.max_sequences, seq_len=args.seq_len)
        result = compress_check(dense, compressed, batch, max_perp_error=args.max_perp_error, unit=args.unit,
                                mode=args.mode, metric=args.metric, batch_size=args.batch_size,
                                fail_on_removed_update=not args.allow_removed_updates,
                                dense_name=str(args.dense), compressed_name=str(args.compressed))
    except USER_ERRORS as exc:  # the CLI's one error format (tl_directional.cli)
        return report_user_error(exc)
    print(result.summary(args.top))
    if args.report:
        page = result.write_report(args.report)
        print(f"wrote {page} and {Path(args.report) / 'geometry.csv'}")
    return result.exit_code


def _cmd_compress(args) -> int:
    from .cli import USER_ERRORS, load_text_sequences, report_user_error
    from .compress import compress, save_compressed

    try:
        model = _load_checked(args.model, "--model")
        calibration = None
        if args.spec.split(":")[0].strip().lower() in ("wanda", "awq"):
            calibration = load_text_sequences(model, args.calib_text, max_sequences=args.calib_sequences,
                                              seq_len=args.seq_len)
        result = compress(model, args.spec, calibration=calibration)
        path = save_compressed(result.model, args.out, result.record, force=args.force,
                               force_hint="pass --force")
    except USER_ERRORS as exc:  # the CLI's one error format (tl_directional.cli)
        return report_user_error(exc)
    print(f"{result.record.label}: {len(result.record.weights)} weights in layers {result.record.layers}; "
          f"stats {json.dumps({k: round(v, 4) for k, v in result.record.stats.items()})}")
    print(f"wrote {path}")
    return 0


def add_cli_commands(sub, positive_int) -> None:
    """Add ``compress-check`` and ``compress`` to the ``tl-directional`` sub-parsers."""
    from .compress import SPEC_HELP

    p = sub.add_parser(
        "compress-check",
        help="label-free CI gate: exit 0 when the compressed model's perpendicular layer error stays "
             "within a threshold, 1 when not (2 on bad input)")
    p.add_argument("--dense", required=True, help="dense model: HF directory (or 'default' / a TL name)")
    p.add_argument("--compressed", required=True, help="compressed model: HF directory")
    p.add_argument("--text", default=None, help="UTF-8 text file (default: bundled held-out KJV slice)")
    p.add_argument("--max-perp-error", type=float, required=True, help="threshold on the metric, e.g. 0.2")
    p.add_argument("--unit", choices=GATE_UNITS, default="block")
    p.add_argument("--mode", choices=MODES, default="local")
    p.add_argument("--metric", choices=GATE_METRICS, default="err_perp_energy")
    p.add_argument("--allow-removed-updates", action="store_true",
                   help="do not fail on units whose compressed update is exactly zero (dropped layers)")
    p.add_argument("--max-sequences", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--top", type=positive_int, default=10, help="worst rows shown")
    p.add_argument("--report", default=None, help="directory for report.html + geometry.csv")
    p.set_defaults(func=_cmd_compress_check)

    p = sub.add_parser("compress", help="compress a model's weights and save it as a HF directory (bridge lane)")
    p.add_argument("--model", default="default", help="'default', a local HF directory, or a TL model name")
    p.add_argument("--spec", required=True, help=SPEC_HELP)
    p.add_argument("--out", required=True, help="output directory (written beside it, then swapped in)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even when it holds files that are not a previous compress output")
    p.add_argument("--calib-text", default=None, help="calibration text for wanda / awq (default: bundled text)")
    p.add_argument("--calib-sequences", type=positive_int, default=32)
    p.add_argument("--seq-len", type=positive_int, default=128)
    p.set_defaults(func=_cmd_compress)


def _nice_step(raw: float) -> float:
    """The 1-2-5 x 10^k step at or above ``raw`` (axis ticks)."""
    if not raw > 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def svg_chart(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str = "", xlabel: str = "",
              ylabel: str = "", hline: tuple[float, str] | None = None, width: int = 640, height: int = 360,
              markers_only: bool = False, logx: bool = False, logy: bool = False) -> str:
    """A small self-contained SVG line chart (no plotting dependency): one line with markers
    per series (``markers_only``: a scatter plot), optional horizontal reference line,
    optional log10 axes (points <= 0 are left out there)."""
    from html import escape

    if logx or logy:
        def keep(x, y):
            return (not logx or x > 0) and (not logy or y > 0)

        series = {k: [(math.log10(x) if logx else x, math.log10(y) if logy else y)
                      for x, y in v if keep(x, y)] for k, v in series.items()}
        if hline is not None and logy:
            hline = (math.log10(hline[0]), hline[1]) if hline[0] > 0 else None
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]
    pts = [p for s in series.values() for p in s]
    xs = [p[0] for p in pts] or [0, 1]
    ys = [p[1] for p in pts if p[1] == p[1]] or [0, 1]
    if hline is not None:
        ys = ys + [hline[0]]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys) if logy else min(0.0, min(ys))), max(ys)
    if logx:
        x0, x1 = math.floor(x0), math.ceil(x1)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    step = 1.0 if logy else _nice_step((y1 - y0) / 5)
    y0 = step * math.floor(y0 / step)
    y1 = step * math.ceil((y1 if logy else y1 * 1.02) / step)
    left, right, top, bottom = 64, 170, 30, 44
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (x - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    for i in range(int(round((y1 - y0) / step)) + 1):
        yv = y0 + step * i
        parts.append(f'<line x1="{left - 4}" y1="{py(yv):.1f}" x2="{left + pw}" y2="{py(yv):.1f}" stroke="#eee"/>')
        label = f"{10 ** yv:g}" if logy else f"{yv:.3g}"
        parts.append(f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{label}</text>')
    if logx:
        xticks = list(range(int(x0), int(x1) + 1))
    elif len(set(xs)) <= 12 and not markers_only:
        xticks = sorted(set(xs))
    else:
        xticks = [x0 + (x1 - x0) * i / 5 for i in range(6)]
    for xv in xticks:
        label = f"{10 ** xv:g}" if logx else f"{xv:.3g}"
        parts.append(f'<text x="{px(xv):.1f}" y="{top + ph + 16}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>')
    parts.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
                 f'text-anchor="middle">{escape(ylabel)}</text>')
    if hline is not None:
        parts.append(f'<line x1="{left}" y1="{py(hline[0]):.1f}" x2="{left + pw}" y2="{py(hline[0]):.1f}" '
                     f'stroke="black" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{left + pw - 2}" y="{py(hline[0]) - 4:.1f}" text-anchor="end">'
                     f'{escape(hline[1])}</text>')
    for i, (name, s) in enumerate(series.items()):
        c = palette[i % len(palette)]
        s = sorted((x, y) for x, y in s if y == y)
        if s and not markers_only:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
            parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        if s:
            parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for x, y in s]
        ly = top + 12 + i * 15
        parts.append(f'<line x1="{left + pw + 10}" y1="{ly - 4}" x2="{left + pw + 28}" y2="{ly - 4}" '
                     f'stroke="{c}" stroke-width="2"/>')
        parts.append(f'<text x="{left + pw + 32}" y="{ly}">{escape(str(name))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


__all__ = [
    "CheckResult",
    "CompatibilityError",
    "GATE_METRICS",
    "add_cli_commands",
    "compress_check",
    "svg_chart",
    "MODES",
    "check_compatible",
    "compression_geometry",
    "pooled_sums",
    "summarize",
]
