"""Component-weighted Wanda: pruning scores weighted by the perpendicular (or parallel) part of
each weight's pruning error against the update it perturbs.

Definition (also in docs/method.md, "Component-weighted Wanda"). A linear ``y = W x`` with
``W`` ``[out, in]`` (the ``[out, in]`` view of :func:`~tl_directional.compression.compressors.linear_weights`)
and calibration tokens ``t = 1..n`` (padding excluded). Removing the single weight ``W_ij``
changes the linear's output at token ``t`` by

    e_t = -W_ij x_tj e_i                       (e_i the i-th unit vector of the output space)

Each ``e_t`` is split against a per-token reference ``r_t`` of the output space (METHOD.md
sec. 1): ``||e_par||^2 = W_ij^2 x_tj^2 c_ti`` and ``||e_perp||^2 = W_ij^2 x_tj^2 (1 - c_ti)`` with
``c_ti = r_ti^2 / ||r_t||^2`` (the squared cosine between axis ``i`` and ``r_t``; ``c_t = 0``
where ``||r_t||^2 <= eps``, the degenerate convention: the whole error is perpendicular). The
reference is the vector the error perturbs:

- the writing linears ``attn.o`` and ``mlp.out`` output the unit's update, which is added to the
  residual stream, so ``r_t`` is that unit's residual reference (METHOD.md sec. 2:
  ``hook_resid_pre`` for attention, ``hook_resid_mid`` for a sequential MLP, ...);
- every other linear (``attn.q/k/v``, ``mlp.in``, ``mlp.gate``) outputs an intermediate
  vector, so ``r_t = W x_t`` is that linear's own dense output (bias excluded).

Averaged over the calibration tokens, the three error energies of weight ``(i, j)`` are

    total_ij = W_ij^2 T_j,   T_j  = mean_t x_tj^2                 (Wanda's score, squared)
    par_ij   = W_ij^2 P_ij,  P_ij = mean_t c_ti x_tj^2
    perp_ij  = total_ij - par_ij

and the scores are their square roots: ``weighting="none"`` is standard Wanda
(``|W_ij| * ||x_j||_2`` up to the constant ``sqrt(n)``), ``"perp"`` ranks by the perpendicular
error, ``"par"`` (a control) by the parallel error. As in Wanda, scores are compared within
each output row and the lowest are pruned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..core.errors import TLDirectionalError
from ..model.handle import device_of
from ..model.inputs import iter_batches, prepare_inputs
from ..model.sites import resolve_sites
from ..model.weights import linear_input_hooks
from .compressors import (
    UNITS,
    CompressionResult,
    LinearWeight,
    _apply,
    linear_weights,
)
from .methods import _check_nm, _check_sparsity, magnitude_mask, nm_mask, wanda_score
from .specs import REGISTERED_METHODS

WEIGHTINGS = ("none", "perp", "par")
"""The component weightings of :func:`prune_wanda_weighted`."""

WRITING_KEYS = {"attn.o": "attn", "mlp.out": "mlp"}
"""Linears whose output is a residual update: their reference is the unit's residual stream."""

DEFAULT_EPS = 1e-12


class CalibrationRequiredError(TLDirectionalError, ValueError):
    """A calibration-aware method was called without calibration data."""


class WeightingError(TLDirectionalError, ValueError):
    """An unknown component weighting was asked for."""


def check_weighting(weighting: Any, argument: str = "weighting") -> str:
    """``weighting`` if it is one of :data:`WEIGHTINGS`, else a :class:`WeightingError`."""
    if not isinstance(weighting, str) or weighting not in WEIGHTINGS:
        raise WeightingError(f"{argument} must be one of {WEIGHTINGS} ('none' = standard Wanda, 'perp' = "
                             f"perpendicular-error weighted, 'par' = the parallel control), got {weighting!r}")
    return weighting


@dataclass
class ErrorEnergy:
    """Per-linear calibration sums behind the component-weighted scores (see the module docstring).

    ``total[name]``: ``T`` ``[in]``, mean over tokens of ``x_j^2`` (float64);
    ``par[name]``: ``P`` ``[out, in]``, mean over tokens of ``c_ti x_tj^2`` (float64);
    ``null_par[name]``: ``[n_null, out, in]``, the same as ``par`` with each ``r_t`` replaced by
    an isotropic random direction of the same norm (the norm-matched null of
    :func:`~tl_directional.compression.ranking.ranking_overlap`; empty unless asked for);
    ``reference[name]``: where ``r_t`` came from (a hook name, or ``"own output"``);
    ``rms[name]``: ``sqrt(T)`` in float32, the same per-channel norm Wanda uses.
    """

    total: dict[str, Tensor]
    par: dict[str, Tensor]
    reference: dict[str, str]
    n_tokens: int
    null_par: dict[str, Tensor] = field(default_factory=dict)
    seed: int = 0

    @property
    def rms(self) -> dict[str, Tensor]:
        return {k: v.sqrt().float() for k, v in self.total.items()}

    def energies(self, name: str, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(total, par, perp)`` error energies ``[out, in]`` (float64) of the ``[out, in]`` weight ``w``."""
        w2 = w.double().pow(2)
        total = w2 * self.total[name][None, :].to(w2.device)
        par = w2 * self.par[name].to(w2.device)
        return total, par, (total - par).clamp_min(0.0)


def _cos2(r: Tensor, eps: float) -> Tensor:
    """``c_ti = r_ti^2 / ||r_t||^2`` for ``r`` ``[n, out]``; 0 on rows with ``||r_t||^2 <= eps``."""
    r2 = r * r
    n2 = r2.sum(-1, keepdim=True)
    ok = n2 > eps
    return torch.where(ok, r2 / torch.where(ok, n2, torch.ones_like(n2)), torch.zeros_like(r2))


@torch.no_grad()
def collect_error_energy(model, calibration, *, layers=None, units: Sequence[str] = UNITS, keys=None,
                         batch_size: int = 8, n_null: int = 0, seed: int = 0,
                         eps: float = DEFAULT_EPS) -> ErrorEnergy:
    """Stream ``calibration`` through ``model`` and collect :class:`ErrorEnergy` for every linear in scope.

    Args:
        calibration: anything :func:`tl_directional.prepare_inputs` accepts (text, token lists,
            a ``[batch, pos]`` tensor, a :class:`TokenBatch`); required.
        layers, units, keys: the linears (as :func:`~tl_directional.compression.compressors.linear_weights`).
        n_null: how many norm-matched isotropic reference draws to accumulate as well
            (``null_par``; seeded by ``seed``, deterministic).
        eps: squared-norm threshold below which a reference is degenerate.

    Raises:
        CalibrationRequiredError: ``calibration`` is None or empty.
    """
    if calibration is None or (isinstance(calibration, (list, tuple, str)) and len(calibration) == 0):
        raise CalibrationRequiredError(
            f"calibration is {calibration!r}: component-weighted Wanda needs calibration data (the input "
            "norms and the references come from it); pass calibration=<texts or tokens>, e.g. "
            "tl_directional.io.corpus.heldout_text()")
    if isinstance(n_null, bool) or not isinstance(n_null, int) or n_null < 0:
        raise ValueError(f"n_null must be a non-negative int (0 = no null draws), got {n_null!r}")
    batch = prepare_inputs(model, calibration, argument="calibration")
    lws = linear_weights(model, layers=layers, units=units, keys=keys)
    sites = resolve_sites(model, warn=False)
    device = device_of(model)
    inputs: dict[str, tuple[str, Tensor | None]] = {}
    refs: dict[str, str | None] = {}
    weights: dict[str, Tensor] = {}
    for lw in lws:
        li = linear_input_hooks(model, lw.layer)[lw.key]
        inputs[lw.name] = (li.hook, li.scale)
        if lw.key in WRITING_KEYS:
            refs[lw.name] = sites.units[WRITING_KEYS[lw.key]][lw.layer].reference_hook
        else:
            refs[lw.name] = None
            weights[lw.name] = lw.get().double().to(device)
    wanted = sorted({h for h, _ in inputs.values()} | {h for h in refs.values() if h is not None})
    seen: dict[str, Tensor] = {}

    def grab(name):
        def hook(t, hook):  # noqa: ARG001 - keyed by the name asked for: the bridge's aliases differ
            seen[name] = t.detach()
            return t

        return hook

    gen = torch.Generator().manual_seed(int(seed))
    total: dict[str, Tensor] = {}
    par: dict[str, Tensor] = {}
    null: dict[str, Tensor] = {}
    count = 0
    for part in iter_batches(batch, batch_size):
        part = part.to(device)
        seen.clear()
        with model.hooks(fwd_hooks=[(h, grab(h)) for h in wanted]):
            model(part.tokens, attention_mask=part.attention_mask, return_type=None)
        mask = part.attention_mask.bool()
        count += int(mask.sum())
        for lw in lws:
            hook, scale = inputs[lw.name]
            t = seen[hook]
            x = (t.reshape(*t.shape[:2], -1) if t.ndim == 4 else t)[mask].double()
            if scale is not None:
                x = x * scale.double().to(x.device)
            x2 = x * x
            r = seen[refs[lw.name]][mask].double() if refs[lw.name] is not None else x @ weights[lw.name].T
            if lw.name not in total:
                total[lw.name] = torch.zeros(x.shape[-1], dtype=torch.float64, device=x.device)
                par[lw.name] = torch.zeros(r.shape[-1], x.shape[-1], dtype=torch.float64, device=x.device)
                if n_null:
                    null[lw.name] = torch.zeros(n_null, r.shape[-1], x.shape[-1], dtype=torch.float64,
                                                device=x.device)
            total[lw.name] += x2.sum(0)
            par[lw.name] += _cos2(r, eps).T @ x2
            for k in range(n_null):
                # an isotropic direction with r_t's norm: only the direction enters c_t, the norm
                # keeps degenerate tokens degenerate
                g = torch.randn(r.shape, generator=gen, dtype=torch.float64).to(r.device)
                g = g * (r.norm(dim=-1, keepdim=True) / g.norm(dim=-1, keepdim=True).clamp_min(1e-300))
                null[lw.name][k] += _cos2(g, eps).T @ x2
    n = max(count, 1)
    # divided in place: the null sums are n_null x out x in float64 per linear (about 7 GB for a
    # 135M model at n_null = 8), and a divided copy would hold them twice at the peak
    for sums in (total, par, null):
        for v in sums.values():
            v.div_(n)
    return ErrorEnergy(
        total=total,
        par=par,
        reference={k: (refs[k] or "own output") for k in inputs},
        n_tokens=count,
        null_par=null,
        seed=int(seed),
    )


def weighted_score(energy: ErrorEnergy, name: str, w: Tensor, weighting: str) -> Tensor:
    """The ``[out, in]`` pruning score of weight matrix ``w`` (``name`` in ``energy``) under ``weighting``.

    ``"none"``: :func:`~tl_directional.compression.methods.wanda_score` with ``rms = sqrt(T)``
    (exactly what standard Wanda ranks); ``"perp"``: ``sqrt(perp_ij)``; ``"par"``: ``sqrt(par_ij)``.
    """
    check_weighting(weighting)
    if weighting == "none":
        return wanda_score(w, energy.rms[name])
    _, par, perp = energy.energies(name, w)
    return (perp if weighting == "perp" else par).sqrt()


def _mask(score: Tensor, sparsity: float | None, n_m: tuple[int, int] | None) -> Tensor:
    return nm_mask(score, *n_m) if n_m is not None else magnitude_mask(score, sparsity, per_row=True)


def prune_wanda_weighted(model, calibration=None, sparsity: Any = 0.5, *, weighting: str = "perp",
                         n_m: Any = None, batch_size: int = 8, layers=None, units: Sequence[str] = UNITS,
                         keys=None, energy: ErrorEnergy | None = None) -> CompressionResult:
    """Component-weighted Wanda pruning of a copy of ``model`` (the model itself is untouched).

    Scores (module docstring): ``weighting="none"`` standard Wanda (the same masks as
    :func:`~tl_directional.compression.compressors.prune_wanda`), ``"perp"`` the perpendicular
    error energy, ``"par"`` the parallel error energy (a control). Compared within each output
    row: unstructured at ``sparsity``, or N:M (``n_m=(2, 4)``).

    The record's ``stats`` hold, besides the usual ``zero_fraction`` / ``weight_rel_error_mean``:
    ``flipped_vs_wanda`` (the fraction of pruned weights that standard Wanda at the same
    sparsity would have kept; 0 for ``"none"``), ``flipped_weights``, ``pruned_weights`` and
    ``calibration_tokens``. ``record.notes`` lists the reference used per linear.

    Args:
        calibration: calibration texts or tokens (required unless ``energy`` is given).
        energy: a precomputed :class:`ErrorEnergy` (from :func:`collect_error_energy`) to reuse.

    Raises:
        CalibrationRequiredError: neither ``calibration`` nor ``energy`` was given.
        WeightingError: ``weighting`` is not one of :data:`WEIGHTINGS`.
    """
    check_weighting(weighting)
    if n_m is not None:
        n_m = _check_nm(n_m)
        params = {"sparsity": 1 - n_m[0] / n_m[1], "n_m": list(n_m), "score": f"wanda-{weighting}"}
        sparsity = None
    else:
        sparsity = _check_sparsity(sparsity)
        params = {"sparsity": sparsity, "n_m": None, "score": f"wanda-{weighting}"}
    params["weighting"] = weighting
    if energy is None:
        energy = collect_error_energy(model, calibration, layers=layers, units=units, keys=keys,
                                      batch_size=batch_size)
    flips = {"flipped": 0, "pruned": 0}

    def transform(lw: LinearWeight, w: Tensor) -> Tensor:
        if lw.name not in energy.total:
            raise ValueError(f"energy has no statistics for {lw.name}; collect it with the same layers / "
                             "units / keys, or pass calibration=... instead of energy=")
        mask = _mask(weighted_score(energy, lw.name, w, weighting), sparsity, n_m)
        base = _mask(wanda_score(w, energy.rms[lw.name]), sparsity, n_m)
        flips["pruned"] += int((~base).sum())
        flips["flipped"] += int((~mask & base).sum())
        return w * mask

    res = _apply(model, "wanda" if weighting == "none" else f"wanda_{weighting}", params, transform,
                 layers=layers, units=units, keys=keys)
    st = res.record.stats
    st["calibration_tokens"] = float(energy.n_tokens)
    st["pruned_weights"] = float(flips["pruned"])
    st["flipped_weights"] = float(flips["flipped"])
    st["flipped_vs_wanda"] = flips["flipped"] / max(flips["pruned"], 1)
    refs = sorted({f"{k.split('.', 2)[2]}: {v.split('.', 2)[-1] if v != 'own output' else v}"
                   for k, v in energy.reference.items()})
    res.record.notes.append("error split against: " + "; ".join(refs))
    return res


def _from_spec(weighting: str):
    def run(model, calibration=None, **kw) -> CompressionResult:
        if kw.get("n_m") is not None:
            kw.setdefault("sparsity", None)
        return prune_wanda_weighted(model, calibration, weighting=weighting, **kw)

    return run


# the spec strings "wanda_perp:sparsity=0.5" / "wanda_par:nm=2:4" of compress() and the CLI
REGISTERED_METHODS.update({"wanda_perp": _from_spec("perp"), "wanda_par": _from_spec("par")})

__all__ = [
    "WEIGHTINGS",
    "WRITING_KEYS",
    "CalibrationRequiredError",
    "ErrorEnergy",
    "WeightingError",
    "check_weighting",
    "collect_error_energy",
    "prune_wanda_weighted",
    "weighted_score",
]
