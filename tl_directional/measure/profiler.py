"""Profile: per-layer and per-head geometry of a model's updates (METHOD.md sec. 1-3).

:func:`profile` streams a corpus through the model with read-only hooks that
decompose each update inside the forward pass and add it to fixed-size
accumulators (:class:`~tl_directional.core.stats.StreamingSummary`), so memory does
not grow with the number of tokens and no ``ActivationCache`` is held.
:meth:`Profile.from_cache` computes the same tables from a cache a user already has.
The accumulator and the hook actions live in :mod:`tl_directional.measure.stream`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from ..core.components import check_components
from ..core.geometry import DEFAULT_EPS, check_eps, compute_dtype
from ..core.kernels import split_stats
from ..core.stats import EXACT_QUANTILE_LIMIT
from ..core.subspace import SubspaceError
from ..io.atomic import ArtefactError
from ..io.distributed import rank_and_world
from ..io.locks import recover_interrupted_swap
from ..io.outputs import replace_dir
from ..io.records import verify_manifest
from ..model.finite import nonfinite_message
from ..model.handle import StopForward, device_of
from ..model.inputs import TokenBatch, iter_batches, prepare_inputs
from ..model.mlp_carrier import carrier_site
from ..model.positions import (
    check_positions_select,
    first_token_mask,
    position_mask,
    resolve_exclude_first_token,
)
from ..model.reference import Reference, resolve_reference
from ..model.sites import ModelSites, SiteResolutionError, analysis_sites, resolve_sites
from ..model.verify import verify_sites
from .carrier import add_carrier_columns, carrier_table
from .profile_tables import _finish
from .stream import (  # the per-token statistics collected while the model runs
    _Accumulator,
    _all_reduce_accumulator,
    _pattern_diagonal,
    _streaming_hooks,
    _with_stop,
    check_drop_cosine,
    check_exact_quantiles,
)


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
        reference=None,
        per_layer: bool | None = None,
        value_reference=None,
        value_per_layer: bool | None = None,
        exact_quantiles: int = EXACT_QUANTILE_LIMIT,
    ) -> Profile:
        """Compute the same tables from an ``ActivationCache`` (or a dict of tensors)
        holding the needed hooks, e.g. from ``model.run_with_cache(tokens)``; ``drop_cosine``,
        ``reference``, ``per_layer``, ``value_reference``, ``value_per_layer`` and
        ``exact_quantiles`` as in :func:`profile`."""
        exact_quantiles = check_exact_quantiles(exact_quantiles)
        drop_cosine = check_drop_cosine(drop_cosine)
        sites = resolve_sites(model)
        components = _check_components(components, sites)
        ref = _profile_reference(model, reference, per_layer, drop_cosine=drop_cosine)
        value_ref = _value_reference(model, value_reference, value_per_layer, components)

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
        acc = _Accumulator(sites, components, device, eps, per_token, drop_cosine, ref, value_ref, exact_quantiles)
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
        return cls(**_finish(acc, model, sites, components, eps, positions, exclude_first_token))


def _profile_reference(model, reference, per_layer, *, drop_cosine: bool, carrier: bool = False) -> Reference:
    """``reference=`` of :func:`profile` resolved (:func:`~tl_directional.model.reference.resolve_reference`,
    residual space); the stream-only options refuse a user's reference rather than ignore it."""
    ref = resolve_reference(model, reference, per_layer=per_layer)
    if not ref.is_stream:
        for name, on in (("drop_cosine", drop_cosine), ("carrier", carrier)):
            if on:
                raise SubspaceError(
                    f"{name}=True measures against the stream each update is added to, so it cannot be "
                    f"combined with reference={ref.describe()}; profile twice (once with {name}=True and "
                    "no reference, once with the reference)")
    return ref


def _value_reference(model, value_reference, value_per_layer, components) -> Reference | None:
    """``value_reference=`` of :func:`profile` resolved in value space (width ``d_head``), or None;
    it measures the value table's heads, so it needs ``"value"`` among ``components``."""
    if value_reference is None:
        if value_per_layer is not None:
            raise SubspaceError(f"value_per_layer={value_per_layer!r} is given without value_reference; pass "
                                "value_reference (a [d_head], [k, d_head] or [n_layers, d_head] tensor) or drop it")
        return None
    ref = resolve_reference(model, value_reference, per_layer=value_per_layer, argument="value_reference",
                            space="value")
    if ref.is_stream:
        raise SubspaceError("value_reference='input' is what the value table measures already (each head's "
                            "output against its tokens' own values); pass a [d_head] direction, a [k, d_head] "
                            "subspace or a per-layer [n_layers, d_head] set, or leave value_reference out")
    if "value" not in components:
        raise SubspaceError(f"value_reference splits the value table's heads, but components={list(components)} "
                            "leaves 'value' out; add 'value' to components or drop value_reference")
    return ref


def _check_components(components, sites: ModelSites) -> tuple[str, ...]:
    """``components`` checked by :func:`~tl_directional.core.components.check_components` against
    the residual components the model defines plus ``"value"`` (the default: all of them)."""
    return check_components(components, sites.components + ("value",), arch=sites.arch)


def _raise_if_nonfinite(acc: _Accumulator, model) -> None:
    """The weight scan of :func:`profile`, run only when its statistics hold a NaN or an
    infinite energy sum; the error names the non-finite weights as
    :func:`~tl_directional.model.sites.analysis_sites` would have before the forwards.

    Why after, and only then: every number of a profile is a sum over the counted tokens of
    quantities computed from their activations, and NaN / inf propagate through every product,
    sum and norm of a forward; a NaN or inf weight that reaches a counted activation therefore
    leaves a NaN (or an infinite energy sum) in the statistics, which
    :meth:`~tl_directional.core.stats.StreamingSummary.saw_nonfinite` finds in the
    ``[groups]``-sized sums. A non-finite weight that reaches none of them (an embedding row no
    token used, the unembedding, which profile never runs, a score masked out by ``where``)
    changes no number, so the tables are correct as they are. Finite weights with non-finite
    statistics (activations that overflow) return the tables as before."""
    if not any(s.saw_nonfinite() for s in (acc.residual, acc.value, acc.value_excl, acc.value_ref)):
        return
    broken = nonfinite_message(model) if hasattr(model, "named_parameters") else None
    if broken:
        raise SiteResolutionError(f"profile: {broken}")


def _token_mask(attention_mask: Tensor, positions, exclude_first_token: bool) -> Tensor:
    mask = attention_mask.bool()
    pm = position_mask(positions, batch=mask.shape[0], n_query=mask.shape[1], device=mask.device)
    if pm is not None:
        mask = mask & pm
    if exclude_first_token:
        mask = mask & ~first_token_mask(attention_mask)
    return mask


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
    reference=None,
    per_layer: bool | None = None,
    value_reference=None,
    value_per_layer: bool | None = None,
    exact_quantiles: int = EXACT_QUANTILE_LIMIT,
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
        reference: what the residual-space updates (``attn``, ``mlp``, ``block`` rows, width
            ``d_model``) are split against (:func:`~tl_directional.model.reference.resolve_reference`):
            None / ``"input"`` (default: the stream each update is added to; the tables are then
            exactly those of a call without it), a ``[d_model]`` direction, a ``[n_layers,
            d_model]`` per-layer set (``per_layer=True``), a ``[k, d_model]`` subspace, or a
            :class:`~tl_directional.core.direction.Direction` (``space="resid"``). With a reference the
            residual table gets a ``reference`` column and ``random_energy_share`` (``k / d_model``,
            ``1 / d_model`` for a line: a random update's expected ``sum ||u_par||^2 / sum ||u||^2``,
            the level ``energy_ratio`` and ``par_frac`` are read against), and ``metadata`` the same;
            ``alpha`` is the scale along the direction and ``rel_update`` is ``||u|| / ||r||``
            (both NaN for a subspace, which has no single scale). The value table (heads, ``d_head``)
            stays each head's split against its tokens' own values. ``drop_cosine`` and ``carrier``
            are stream measurements and refuse a reference.
        per_layer: read a 2-D ``reference`` as one row per layer (True) or as a subspace (False);
            required when it has exactly ``n_layers`` rows.
        value_reference: a value-space reference (width ``d_head``, :func:`~tl_directional.model.reference.resolve_reference`
            with ``space="value"``): a ``[d_head]`` direction, a ``[k, d_head]`` subspace, a
            ``[n_layers, d_head]`` per-layer set (``value_per_layer=True``; row ``L`` for every
            head of layer ``L``) or a ``Direction(space="value")``. Each head's output ``z_h``
            (``attn.hook_z``, ``d_head``) at each counted token is then also split against it: the
            value table gains ``beta_ref`` (``z_h . r / ||r||^2``; NaN for a subspace),
            ``par_frac_ref`` and ``par_perp_ratio_ref`` (each with ``_mean`` / ``_std`` /
            quantile columns), ``energy_ratio_ref``, ``degenerate_ref``, ``value_reference`` and
            ``value_random_energy_share`` (``k / d_head``), beside the unchanged split against
            the tokens' own values; ``per_token`` rows get ``beta_ref`` / ``par_frac_ref``.
            Needs ``"value"`` among ``components``. Default None: no such columns.
        value_per_layer: read a 2-D ``value_reference`` as one row per layer (True) or as a
            subspace (False); required when it has exactly ``n_layers`` rows.
        exact_quantiles: values kept per metric and group (layer row or head) so that the
            quantile columns are numpy's exact ones; a group that passes it drops its values and
            its quantiles come from fixed histograms (``metadata["quantiles"]`` says which). The
            kept values are what grows with the corpus: ``n_layers (60 + 52 n_heads)`` bytes per
            token up to this many tokens; past it the histograms take their place
            (``docs/performance.md``). ``0`` keeps none: memory flat in the corpus length (the
            histograms from the first token, ``8 n_layers (29,424 + 60,240 n_heads)`` bytes at
            the peak), histogram quantiles; means, counts and energy ratios are exact sums either way.

    Returns:
        A :class:`Profile`.
    """
    eps = check_eps(eps)
    exact_quantiles = check_exact_quantiles(exact_quantiles)
    drop_cosine = check_drop_cosine(drop_cosine)
    ref = _profile_reference(model, reference, per_layer, drop_cosine=drop_cosine, carrier=carrier)
    # the weight scan runs after the forwards, only if the statistics hold a NaN (_raise_if_nonfinite)
    sites = analysis_sites(model, "profile", SiteResolutionError, "dropout would make the measured shares random",
                           scan_weights=False)
    components = _check_components(components, sites)
    value_ref = _value_reference(model, value_reference, value_per_layer, components)
    batch = prepare_inputs(model, inputs, attention_mask)
    exclude_first_token = resolve_exclude_first_token(exclude_first_token, positions)
    check_positions_select(positions, batch)
    if carrier:  # refuse a model without a separable MLP carrier before measuring anything
        carrier_site(model, 0)
    device = device_of(model)
    if verify:
        first = next(iter_batches(batch.slice(0, 2), 2)).to(device)
        verify_sites(model, sites, first.tokens[:, :64], first.attention_mask[:, :64], verb="profile")
    acc = _Accumulator(sites, components, device, eps, per_token, drop_cosine, ref, value_ref, exact_quantiles)
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
    _raise_if_nonfinite(acc, model)
    out = Profile(**_finish(acc, model, sites, components, eps, positions, exclude_first_token))
    if carrier:  # every rank measures every batch: the carrier sums need no all-reduce
        table = carrier_table(model, ((p, _token_mask(p.attention_mask, positions, exclude_first_token))
                                      for p in batches), eps=eps)
        out.residual = add_carrier_columns(out.residual, table)
    return out


__all__ = ["Profile", "profile"]
