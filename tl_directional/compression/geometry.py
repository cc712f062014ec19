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
import weakref
from collections.abc import Mapping, Sequence

import pandas as pd
import torch
from torch import Tensor

from ..core.errors import TLDirectionalError, renamed_argument
from ..core.geometry import DEFAULT_EPS, check_eps
from ..io.distributed import rank_and_world
from ..model.handle import architecture_name, device_of
from ..model.indices import check_hook_api, normalize_layers
from ..model.inputs import iter_batches, prepare_inputs
from ..model.positions import first_token_mask
from ..model.sites import analysis_sites, lane_of
from ..model.verify import verify_sites
from .accumulate import (
    _IDX,
    _STATS,
    _all_reduce_sums,
    _choose_plan,
    _components,
    _run,
    _Runner,
    _sites_of,
    _Target,
)
from .compressors import CompressionRecord, CompressionResult

MODES = ("local", "global")



class CompatibilityError(TLDirectionalError, ValueError):
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

    ``compressed`` is one model, a :class:`~tl_directional.compression.compressors.CompressionResult`, a
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
            :class:`~tl_directional.compression.compressors.CompressionResult`, or a list / dict of them
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
        units: the former name of ``components``: refused with a
            :class:`~tl_directional.core.errors.RenamedArgumentError` naming ``components``.

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
    for name, model in [("dense", dense)] + [(f"compressed {n!r}", m) for n, m, _ in targets_in]:
        analysis_sites(model, f"compression_geometry ({name})", ValueError,
                       "dropout would make the layer errors random")
    # Same lane, architecture class and shapes (checked above) mean the same hook names.
    sites, has_resid_post = _sites_of(dense)
    if units is not None:
        raise renamed_argument("compression_geometry", "units", "components")
    units = _components(components, sites, "components")
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
    n_tokens, dense_seconds = _stream_batches(
        dense, targets, runner, batch, batch_size=batch_size, units=units, mode=mode,
        stop_at=stop_at, exclude_first_token=exclude_first_token, progress=progress)
    out = _error_table(targets, runner, mode)
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


def _stream_batches(dense, targets: list[_Target], runner: _Runner, batch, *, batch_size: int,
                    units, mode: str, stop_at: str | None, exclude_first_token: bool,
                    progress: bool) -> tuple[int, float]:
    """Run the dense model, then every compressed one, batch by batch, adding each batch's
    per-token statistics into the targets' float64 sums. Returns ``(tokens measured, seconds
    of the dense forwards)``; under torchrun each rank takes every world-th batch and the sums
    are all-reduced at the end."""
    sites = runner.sites
    device = device_of(dense)
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
    return n_tokens, dense_seconds


def _error_table(targets: list[_Target], runner: _Runner, mode: str) -> pd.DataFrame:
    """One row per (layer, unit) and compressed model from the targets' sums (:func:`summarize`),
    sorted by model, unit (attn, mlp, block) and layer; a dropped layer's rows are parallel by
    construction."""
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
    return out.sort_values(([ "compressed"] if len(targets) > 1 else []) + ["unit", "layer"],
                           key=lambda c: c.map({"attn": 0, "mlp": 1, "block": 2}) if c.name == "unit" else c,
                           kind="stable").reset_index(drop=True)


def pooled_sums(sums: Tensor, rows: Sequence[tuple[int, str]], unit: str, layers=None) -> Tensor:
    """Sum the ``[..., rows, K]`` statistics over the layers of ``unit`` (pooling tokens across
    layers), keeping leading axes (e.g. sequences)."""
    idx = [i for i, (L, u) in enumerate(rows) if u == unit and (layers is None or L in layers)]
    if not idx:
        raise ValueError(f"no rows for unit {unit!r}")
    return sums[..., idx, :].sum(-2)



__all__ = [
    "MODES",
    "CompatibilityError",
    "check_compatible",
    "compression_geometry",
    "normalize_targets",
    "pooled_sums",
    "summarize",
]
