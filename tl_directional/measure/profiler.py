"""Profile: per-layer and per-head geometry of a model's updates (METHOD.md sec. 1-3).

:func:`profile` streams a corpus through the model with read-only hooks that
decompose each update inside the forward pass and add it to fixed-size
accumulators (:class:`~tl_directional.core.stats.StreamingSummary`), so memory does
not grow with the number of tokens and no ``ActivationCache`` is held.
:meth:`Profile.from_cache` computes the same tables from a cache a user already has.
The accumulator and the hook actions live in :mod:`tl_directional.measure.stream`.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core.components import check_components
from ..core.geometry import DEFAULT_EPS, check_eps, compute_dtype
from ..core.kernels import split_stats
from ..core.stats import EXACT_QUANTILE_LIMIT
from ..io.atomic import ArtefactError
from ..io.distributed import rank_and_world
from ..io.locks import recover_interrupted_swap
from ..io.outputs import replace_dir
from ..io.records import verify_manifest
from ..model.handle import StopForward, device_of
from ..model.inputs import TokenBatch, iter_batches, prepare_inputs
from ..model.mlp_carrier import carrier_site
from ..model.positions import (
    check_positions_select,
    first_token_mask,
    position_mask,
    resolve_exclude_first_token,
)
from ..model.sites import ModelSites, SiteResolutionError, analysis_sites, resolve_sites
from ..model.verify import verify_sites
from .carrier import add_carrier_columns, carrier_table
from .stream import (  # the per-token statistics collected while the model runs
    _Accumulator,
    _all_reduce_accumulator,
    _pattern_diagonal,
    _streaming_hooks,
    _with_stop,
    check_drop_cosine,
)


@functools.cache  # a metadata scan per call costs about a millisecond at small shapes
def _tl_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformer-lens")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        return "unknown"


@dataclass
class Profile:
    """Geometry tables of one model over one token set.

    Attributes:
        residual: one row per (layer, component): ``count``, ``degenerate``,
            ``energy_ratio`` (``sqrt(sum ||u_par||^2 / sum ||u_perp||^2)`` over
            non-degenerate tokens, the headline figure) and
            ``<metric>_{mean,std,q05,q25,median,q75,q95}`` for ``par_frac``,
            ``par_perp_ratio``, ``alpha``, ``rel_update``, and with ``drop_cosine=True`` the
            layer-drop cosine link (:mod:`~tl_directional.measure.cosine`): ``drop_rho``
            (``beta / |1 + alpha|``) and ``drop_cos_distance`` (``1 - cos(r, r + u)``; for
            ``block`` the cosine layer-dropping methods score).
        value: one row per (layer, head): ``beta``, ``A_tt``, ``gamma``, the full and
            exclusive splits' ``par_frac`` / ``par_perp_ratio`` and energy ratios,
            ``phi``, ``alpha_head``, ``self_term`` (``A_tt * phi``), ``cross_term``,
            and the layer's ``factorization_error_max``.
        metadata: model name, TL version, lane, architecture, weight processing,
            tokens seen, eps, quantile method, notes.
        tokens / value_tokens: per-token tables, only with ``per_token=True``.
    """

    residual: pd.DataFrame
    value: pd.DataFrame
    metadata: dict = field(default_factory=dict)
    tokens: pd.DataFrame | None = None
    value_tokens: pd.DataFrame | None = None

    _TABLES = ("residual", "value", "tokens", "value_tokens")

    @property
    def tokens_seen(self) -> int | None:
        """Non-padding tokens the profile was measured on (``metadata["tokens_seen"]``, shown by the repr)."""
        return self.metadata.get("tokens_seen")

    def __repr__(self) -> str:
        m = self.metadata
        return (
            f"Profile(model={m.get('model_name')!r}, tokens_seen={m.get('tokens_seen')}, "
            f"residual={len(self.residual)} rows, value={len(self.value)} rows)"
        )

    def summary(self, metric: str = "par_frac") -> pd.DataFrame:
        """Compact per-layer view: ``<metric>_median`` and ``energy_ratio`` per component."""
        if self.residual.empty:
            return self.residual
        wide = self.residual.pivot(index="layer", columns="component",
                                   values=[f"{metric}_median", "energy_ratio"])
        wide.columns = [f"{comp}_{stat}" for stat, comp in wide.columns]
        return wide

    # -- persistence ----------------------------------------------------
    def save(self, path: str | os.PathLike, format: str = "parquet", *, overwrite: bool = False) -> Path:
        """Write the tables, ``metadata.json`` and a ``manifest.json`` (sha256 and size of
        every file) into directory ``path``. ``format``: "parquet" or "csv".

        The directory is built beside ``path`` and swapped in under an exclusive lock
        (:func:`tl_directional.io.outputs.replace_dir`): an interrupted save leaves the previous
        profile, a second concurrent save is refused, no stale table survives, and a
        non-empty ``path`` that is not a previous profile is refused unless ``overwrite``."""
        if format not in ("parquet", "csv"):
            raise ValueError(f"format must be 'parquet' or 'csv', got {format!r}")
        out = Path(path)
        meta = dict(self.metadata, format=format)
        legacy = frozenset({"metadata.json"} | {f"{t}.{f}" for t in self._TABLES for f in ("parquet", "csv")})
        with replace_dir(path, "profile", force=overwrite, force_hint="pass overwrite=True (or remove it)",
                         command="Profile.save", legacy_names=legacy) as tmp:
            for name in self._TABLES:
                df = getattr(self, name)
                if df is None:
                    continue
                target = tmp / f"{name}.{format}"
                if format == "parquet":
                    import pyarrow as pa
                    import pyarrow.parquet as pq

                    table = pa.Table.from_pandas(df, preserve_index=False)
                    table = table.replace_schema_metadata(
                        {**(table.schema.metadata or {}), b"tl_directional": json.dumps(meta).encode()}
                    )
                    pq.write_table(table, target)
                else:
                    df.to_csv(target, index=False)
            (tmp / "metadata.json").write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> Profile:
        """Read a directory written by :meth:`save`, after verifying every file against
        its manifest (a changed, truncated or missing file raises naming it)."""
        src = Path(path)
        recover_interrupted_swap(src)  # a writer killed in the middle of its swap
        meta_file = src / "metadata.json"
        if not meta_file.is_file():
            raise ArtefactError(f"{src} has no metadata.json; is it a directory written by Profile.save?")
        fix = "re-run Profile.save (tl-directional profile) to write it again"
        manifest = verify_manifest(src, kind="profile", fix=fix)
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ArtefactError(f"{meta_file} is corrupt or truncated ({err}); {fix}") from None
        fmt = meta.get("format", "parquet")
        tables = {}
        for name in cls._TABLES:
            f = src / f"{name}.{fmt}"
            if f.name in manifest["files"]:  # only what this save wrote
                tables[name] = pd.read_parquet(f) if fmt == "parquet" else pd.read_csv(f)
        if "residual" not in tables or "value" not in tables:
            raise ArtefactError(f"{src} lacks residual.{fmt} or value.{fmt}; {fix}")
        return cls(metadata=meta, **tables)

    # -- from an existing cache ----------------------------------------
    @classmethod
    def from_cache(
        cls,
        model,
        cache,
        *,
        attention_mask: Tensor | None = None,
        positions=None,
        exclude_first_token: bool | None = None,
        components=None,
        eps: float = DEFAULT_EPS,
        per_token: bool = False,
        drop_cosine: bool = False,
    ) -> Profile:
        """Compute the same tables from an ``ActivationCache`` (or a dict of tensors)
        holding the needed hooks, e.g. from ``model.run_with_cache(tokens)``; ``drop_cosine``
        as in :func:`profile`."""
        drop_cosine = check_drop_cosine(drop_cosine)
        sites = resolve_sites(model)
        components = _check_components(components, sites)

        def get(name):
            try:
                return cache[name]
            except KeyError:
                raise ValueError(
                    f"cache has no {name!r}; run model.run_with_cache(...) with "
                    "names_filter=tl_directional.required_hooks(model, components=...) (the same "
                    "components as here) or without a names_filter"
                ) from None

        ref_any = get(sites.units["attn"][0].reference_hook)
        # computed where the cache lives (on the GPU for a GPU cache), never copied to the host
        device = ref_any.device
        acc = _Accumulator(sites, components, device, eps, per_token, drop_cosine)
        batch, pos = ref_any.shape[:2]
        am = torch.ones(batch, pos, dtype=torch.long) if attention_mask is None else attention_mask
        exclude_first_token = resolve_exclude_first_token(exclude_first_token, positions)
        check_positions_select(positions, TokenBatch(am, am))
        mask = _token_mask(am.to(device), positions, exclude_first_token)
        for L in range(sites.n_layers):
            alpha_attn = None
            for comp in acc.components:
                u = sites.units[comp][L]
                upd = get(u.update_hook).to(device)
                ref = get(u.reference_hook).to(device)
                if u.update_is_difference:  # in the compute dtype (half precision: see stream.py)
                    upd = upd.to(compute_dtype(upd.dtype)) - ref.to(compute_dtype(ref.dtype))
                a = acc.add_residual(L, comp, upd, ref, mask)
                if comp == "attn":
                    alpha_attn = a
            if acc.with_value:
                vs = sites.value[L]
                diag = _pattern_diagonal(get(vs.pattern_hook).to(device))
                recon = acc.add_value(L, get(vs.v_hook).to(device), diag,
                                      get(vs.z_hook).to(device), get(vs.resid_hook).to(device), mask, model)
                if alpha_attn is None:
                    u = sites.units["attn"][L]
                    alpha_attn = split_stats(acc._select(get(u.update_hook).to(device), mask),
                                             acc._select(get(u.reference_hook).to(device), mask), eps).alpha
                acc.add_factorization_check(L, alpha_attn, recon)
        acc.tokens_seen = int(mask.sum())
        acc.sequences_seen = batch
        return _finish(acc, model, sites, components, eps, positions, exclude_first_token)


def _check_components(components, sites: ModelSites) -> tuple[str, ...]:
    """``components`` checked by :func:`~tl_directional.core.components.check_components` against
    the residual components the model defines plus ``"value"`` (the default: all of them)."""
    return check_components(components, sites.components + ("value",), arch=sites.arch)


def _token_mask(attention_mask: Tensor, positions, exclude_first_token: bool) -> Tensor:
    mask = attention_mask.bool()
    pm = position_mask(positions, batch=mask.shape[0], n_query=mask.shape[1], device=mask.device)
    if pm is not None:
        mask = mask & pm
    if exclude_first_token:
        mask = mask & ~first_token_mask(attention_mask)
    return mask


def _quantiles_note(acc: _Accumulator) -> str:
    """How the profile's quantiles were computed (its metadata's ``"quantiles"``)."""
    summaries = [s for s in (acc.residual, acc.value, acc.value_excl) if s.count.sum() > 0]
    if summaries and all(s.quantiles_exact for s in summaries):
        how = (f"exact: numpy's default (linear) quantiles of the values (at most {EXACT_QUANTILE_LIMIT} "
               "per metric in every group)")
    else:
        how = (f"approximate: linear interpolation in fixed histograms (tl_directional.core.stats.BIN_SCALES; "
               f"above {EXACT_QUANTILE_LIMIT} values per metric in a group)")
    return how + "; means, counts and energy ratios are exact sums"


def _finish(acc: _Accumulator, model, sites, components, eps, positions, exclude_first_token) -> Profile:
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
        residual = pd.DataFrame(cols)
        for c in ("count", "degenerate"):
            residual[c] = residual[c].astype("int64")

    value = pd.DataFrame()
    if acc.with_value:
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
        value = pd.DataFrame(vcols)
        for c in ("count", "degenerate", "degenerate_exclusive"):
            value[c] = value[c].astype("int64")

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
    return Profile(residual=residual, value=value, metadata=metadata, tokens=tokens, value_tokens=value_tokens)


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


def profile(
    model,
    inputs,
    *,
    batch_size: int = 8,
    attention_mask: Tensor | None = None,
    positions=None,
    exclude_first_token: bool | None = None,
    components=None,
    eps: float = DEFAULT_EPS,
    per_token: bool = False,
    verify: bool = True,
    progress: bool = True,
    carrier: bool = False,
    drop_cosine: bool = False,
) -> Profile:
    """Stream ``inputs`` through ``model`` and summarise the geometry of every update.

    Args:
        model: a TL 4 ``TransformerBridge`` or legacy ``HookedTransformer`` (eval mode).
        inputs: a string, list of strings, list of token-id lists, or ``[batch, pos]``
            token tensor.
        batch_size: sequences per forward pass.
        attention_mask: ``[batch, pos]`` (token-tensor inputs only); padding is
            excluded from every statistic.
        positions: restrict to these absolute query positions (int, list, slice or
            bool mask ``[pos]`` / ``[batch, pos]``).
        exclude_first_token: drop each sequence's first real token (BOS in most
            tokenizers: the attention sink, an outlier in every statistic; METHOD.md
            sec. 1). Default None: dropped unless ``positions`` is given (then exactly
            those positions count). ``metadata["exclude_first_token"]`` records it.
        components: any of ``"attn"``, ``"mlp"``, ``"block"`` (residual space) and
            ``"value"`` (per head); None means all that the architecture defines
            (post-LN models have no ``"block"``).
        eps: degeneracy threshold on squared norms (METHOD.md sec. 1).
        per_token: also return per-token tables (memory grows with tokens).
        verify: check the additive identity (METHOD.md sec. 2) on the first batch
            before measuring; raises ``SiteResolutionError`` if it fails.
        progress: show a tqdm bar.
        carrier: also measure the MLP carrier blocks' parallel share per layer (one more
            forward per batch; :mod:`tl_directional.measure.carrier`): the ``mlp`` rows of the
            residual table get :data:`~tl_directional.measure.carrier.CARRIER_COLUMNS`.
        drop_cosine: also report the layer-drop cosine link per residual row, ``drop_rho``
            (``beta / |1 + alpha|``) and ``drop_cos_distance`` (``1 - cos(r, r + u)``), with
            the usual ``_mean`` / ``_std`` / quantile columns (:mod:`~tl_directional.measure.cosine`;
            off by default: they cost about 6% of a profile; ``metadata["drop_cosine"]`` records it).

    Returns:
        A :class:`Profile`.
    """
    eps = check_eps(eps)
    drop_cosine = check_drop_cosine(drop_cosine)
    sites = analysis_sites(model, "profile", SiteResolutionError, "dropout would make the measured shares random")
    components = _check_components(components, sites)
    batch = prepare_inputs(model, inputs, attention_mask)
    exclude_first_token = resolve_exclude_first_token(exclude_first_token, positions)
    check_positions_select(positions, batch)
    if carrier:  # refuse a model without a separable MLP carrier before measuring anything
        carrier_site(model, 0)
    device = device_of(model)
    if verify:
        first = next(iter_batches(batch.slice(0, 2), 2)).to(device)
        verify_sites(model, sites, first.tokens[:, :64], first.attention_mask[:, :64])
    acc = _Accumulator(sites, components, device, eps, per_token, drop_cosine)
    state: dict = {}

    hooks, n_actions = _streaming_hooks(acc, sites, model, state)
    # profile needs no logits: stop the forward once the last block's hooks have run
    # (skips ln_final and the unembedding). The stop is raised only when every measuring
    # action of the batch has run, so an architecture whose hooks fire in another order
    # just runs the full forward.
    stop_at = f"blocks.{sites.n_layers - 1}.hook_resid_post"
    if stop_at in model.hook_dict:
        hooks = _with_stop(hooks, stop_at, state, n_actions)
    rank, world = rank_and_world()
    batches = list(iter_batches(batch, batch_size))
    # under torchrun each rank takes every world-th batch (as sweep does); sums are all-reduced
    todo = [(i, part) for i, part in enumerate(batches) if i % world == rank]
    offsets = [0]
    for part in batches:
        offsets.append(offsets[-1] + len(part))
    iterator = todo
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(todo, desc="profile", unit="batch", disable=rank != 0)
    tokens_seen = torch.zeros((), dtype=torch.long, device=device)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        for i, part in iterator:
            part = part.to(device)
            state.clear()
            state["mask"] = _token_mask(part.attention_mask, positions, exclude_first_token)
            state["seq_offset"] = offsets[i]
            state["done"] = 0
            try:
                model(part.tokens, attention_mask=part.attention_mask, return_type=None)
            except StopForward:
                pass
            tokens_seen += state["mask"].sum()
            acc.sequences_seen += len(part)
            acc.flush()
    state.clear()
    acc.tokens_seen = int(tokens_seen)
    if world > 1:
        _all_reduce_accumulator(acc)
    out = _finish(acc, model, sites, components, eps, positions, exclude_first_token)
    if carrier:  # every rank measures every batch: the carrier sums need no all-reduce
        table = carrier_table(model, ((p, _token_mask(p.attention_mask, positions, exclude_first_token))
                                      for p in batches), eps=eps)
        out.residual = add_carrier_columns(out.residual, table)
    return out


__all__ = ["FACTORIZATION_METRICS", "Profile", "profile"]
