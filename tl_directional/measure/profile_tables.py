"""The tables of a :class:`~tl_directional.measure.Profile` (one job of :mod:`tl_directional.measure`):
built column by column from a finished accumulator (:mod:`tl_directional.measure.stream`), the
factorization columns masked where they do not apply, and the profile's metadata."""

from __future__ import annotations

import functools
import time

import numpy as np
import pandas as pd

from .stream import _Accumulator


@functools.cache  # a metadata scan per call costs about a millisecond at small shapes
def _tl_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformer-lens")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


def _quantiles_note(acc: _Accumulator) -> str:
    """How the profile's quantiles were computed (its metadata's ``"quantiles"``)."""
    summaries = [s for s in (acc.residual, acc.value, acc.value_excl, acc.value_ref) if s.count.sum() > 0]
    limit = acc.exact_quantiles
    if summaries and all(s.quantiles_exact for s in summaries):
        how = (f"exact: numpy's default (linear) quantiles of the values (at most {limit} "
               "per metric in every group)")
    elif limit == 0:
        how = ("approximate: linear interpolation in fixed histograms (tl_directional.core.stats.BIN_SCALES; "
               "exact_quantiles=0: no values kept)")
    else:
        how = (f"approximate: linear interpolation in fixed histograms (tl_directional.core.stats.BIN_SCALES; "
               f"above {limit} values per metric in a group)")
    return how + "; means, counts and energy ratios are exact sums"


def _value_table(acc: _Accumulator, sites, fact: np.ndarray, nan_layers: np.ndarray) -> pd.DataFrame:
    """The value table: one row per (layer, head), from the value summaries (the ``*_ref``
    columns too with a value reference)."""
    n_layers = sites.n_layers
    v_cols = acc.value.table()
    e_cols = acc.value_excl.table()
    n_heads = sites.n_heads
    vcols: dict = {
        "layer": np.repeat(np.arange(n_layers), n_heads),
        "head": np.tile(np.arange(n_heads), n_layers),
        "kv_head": np.tile(np.array([sites.kv_head(h) for h in range(n_heads)]), n_layers),
    }
    for k, v in v_cols.items():
        vcols["energy_ratio_full" if k == "energy_ratio" else k] = v.numpy()
    for k, v in e_cols.items():
        if k == "energy_ratio":
            vcols["energy_ratio_exclusive"] = v.numpy()
        elif k == "degenerate":
            vcols["degenerate_exclusive"] = v.numpy()
        elif k != "count":
            vcols[k] = v.numpy()
    vcols["factorization_error_max"] = np.repeat(
        fact if sites.factorization_applicable else nan_layers, n_heads)
    if acc.value_reference is not None:
        _value_reference_columns(vcols, acc)
    value = pd.DataFrame(vcols)
    for c in ("count", "degenerate", "degenerate_exclusive") + (
            ("degenerate_ref",) if acc.value_reference is not None else ()):
        value[c] = value[c].astype("int64")
    return value


def _finish(acc: _Accumulator, model, sites, components, eps, positions, exclude_first_token) -> dict:
    """The keyword arguments of :class:`~tl_directional.measure.Profile` (tables and metadata)."""
    # Tables are built column by column from the summaries' per-group tensors.
    acc.flush()
    n_layers, comps = sites.n_layers, acc.components
    fact = acc.factorization_error.cpu().numpy()
    nan_layers = np.full(n_layers, np.nan)
    residual = pd.DataFrame()
    if comps:
        res_cols = acc.residual.table()
        units = [sites.units[c][L] for c in comps for L in range(n_layers)]  # row order of row_of
        cols: dict = {
            "layer": np.tile(np.arange(n_layers), len(comps)),
            "component": np.repeat(np.array(comps, dtype=object), n_layers),
            "update_hook": np.array([u.update_name for u in units], dtype=object),
            "reference_hook": np.array([u.reference_hook for u in units], dtype=object),
        }
        cols.update({k: v.numpy() for k, v in res_cols.items()})
        cols["factorization_error_max"] = np.concatenate(
            [fact if (c == "attn" and acc.with_value) else nan_layers for c in comps])
        if acc.reference is not None:  # what each share is measured against, and its random level
            cols["reference"] = np.full(len(units), acc.reference.describe(), dtype=object)
            cols["random_energy_share"] = np.full(len(units), acc.reference.random_energy_share)
        residual = pd.DataFrame(cols)
        for c in ("count", "degenerate"):
            residual[c] = residual[c].astype("int64")

    value = _value_table(acc, sites, fact, nan_layers) if acc.with_value else pd.DataFrame()

    tokens = value_tokens = None
    if acc.per_token:
        tokens = _rows_to_frame(acc.token_rows)
        value_tokens = _rows_to_frame(acc.value_token_rows)
    if not sites.factorization_applicable:
        residual, value, value_tokens = _mask_factorization(residual, value, value_tokens)
    metadata = {
        "model_name": sites.model_name,
        "lane": sites.lane,
        "transformer_lens_version": _tl_version(),
        "architecture": sites.arch,
        "weight_processing": sites.weights.as_dict(),
        "weights_processed": sites.weights.any,
        "tokens_seen": acc.tokens_seen,
        "sequences_seen": acc.sequences_seen,
        "components": list(components),
        "positions": None if positions is None else str(positions),
        "exclude_first_token": exclude_first_token,
        "eps": eps,
        "drop_cosine": acc.drop_cosine,
        "dtype": str(getattr(model.cfg, "dtype", "")),
        "quantiles": _quantiles_note(acc),
        "notes": list(sites.notes),
        "factorization_applicable": sites.factorization_applicable,
        "created_unix": time.time(),
    }
    if acc.reference is not None:
        metadata.update(reference=acc.reference.describe(), reference_k=acc.reference.k,
                        random_energy_share=acc.reference.random_energy_share)
    if acc.value_reference is not None:
        metadata.update(value_reference=acc.value_reference.describe(), value_reference_k=acc.value_reference.k,
                        value_random_energy_share=acc.value_reference.random_energy_share)
    return dict(residual=residual, value=value, metadata=metadata, tokens=tokens, value_tokens=value_tokens)


def _value_reference_columns(vcols: dict, acc: _Accumulator) -> None:
    """The value table's ``*_ref`` columns (each head's ``z_h`` against ``value_reference``): the
    summary's metrics, ``energy_ratio_ref`` / ``degenerate_ref``, the reference and its random
    level ``k / d_head``."""
    for k, v in acc.value_ref.table().items():
        if k in ("energy_ratio", "degenerate"):
            vcols[f"{k}_ref"] = v.numpy()
        elif k != "count":
            vcols[k] = v.numpy()
    n = len(vcols["layer"])
    vcols["value_reference"] = np.full(n, acc.value_reference.describe(), dtype=object)
    vcols["value_random_energy_share"] = np.full(n, acc.value_reference.random_energy_share)


#: Value-table metrics that belong to the METHOD sec. 3 factorization through W_O (NaN where
#: the attention update is not linear in z, see sites.SANDWICH_ARCHITECTURES).
FACTORIZATION_METRICS = ("phi", "alpha_head", "self_term", "cross_term")


def _mask_factorization(residual: pd.DataFrame, value: pd.DataFrame, value_tokens):
    """NaN every factorization column (``phi`` / ``alpha_head`` / ``self_term`` /
    ``cross_term`` statistics and ``factorization_error_max``) of the three tables; the other
    columns (beta, A_tt, gamma, the splits) are defined on any architecture and stay."""
    def mask(df):
        if df is None or df.empty:
            return df
        cols = [c for c in df.columns
                if c == "factorization_error_max"
                or any(c == m or c.startswith(m + "_") for m in FACTORIZATION_METRICS)]
        df = df.copy()
        df[cols] = float("nan")
        return df

    return mask(residual), mask(value), mask(value_tokens)


def _rows_to_frame(rows: list[dict]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame()
    frames = []
    for r in rows:
        n = len(r["sequence"])
        frames.append(pd.DataFrame({k: (v if hasattr(v, "__len__") and not isinstance(v, str) else [v] * n) for k, v in r.items()}))
    return pd.concat(frames, ignore_index=True)


__all__ = ["FACTORIZATION_METRICS"]
