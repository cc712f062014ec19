"""Directional activation patching and split direct logit attribution (METHOD.md sec. 5).

:func:`directional_patch` patches only the parallel, only the perpendicular, or
the full update of a sub-layer (or of one head's value-space output) from a
clean run into a corrupted run, splitting against the *corrupted* run's
reference, and records a metric. Results come as tensors shaped like
``transformer_lens.patching`` results plus a tidy DataFrame. The sum of the
parallel-only and perpendicular-only effects is reported next to the full
patch, never assumed equal to it.

:func:`split_logit_attribution` (:mod:`tl_directional.evaluate.patching.logit_attribution`) splits each
head's (and each sub-layer's) direct logit attribution into the part carried by its parallel and
its perpendicular component against the stream it writes into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ...core.bootstrap import random_subspace_share
from ...core.components import ALL_COMPONENTS, check_components
from ...core.geometry import DEFAULT_EPS, check_eps, decompose, patch_components
from ...model.handle import capture, capture_hooks, device_of, forward_recording_block_input
from ...model.indices import normalize_heads, normalize_layers
from ...model.inputs import prepare_inputs
from ...model.reference import resolve_reference
from ...model.sites import ModelSites, analysis_sites, expand_kv_heads, kv_head_index
from .cache_input import (
    PatchingInputError,
    check_names_filter,
    clean_from_cache,
    metric_values,
)
from .generic import PatchJob, StackedPatch, check_batch_size, generic_directional_patch
from .patch_hooks import (
    PatchVariant,
    integer_columns,
    masked,
    patch_against,
    stacked_kv_hooks,
    stacked_residual_hooks,
    stacked_value_hooks,
)
from .path_nodes import hook_names
from .result import DirectionalResult

WHICH = ("par", "perp", "full")

#: The residual stream itself as a patching site: ``blocks.{L}.hook_resid_pre`` is the update
#: (the stream entering block ``L``) and the corrupted stream there is its reference, so the full
#: patch is TransformerLens's ``get_act_patch_resid_pre`` and the parallel-only patch keeps the
#: corrupted stream's direction with the clean stream's length along it.
STREAM_COMPONENTS = ("resid_pre",)

#: One key/value head's keys (``attn.hook_k``) or values (``attn.hook_v``), each its own reference
#: (as ``resid_pre``): on grouped-query models a KV head is shared by a group of query heads, so
#: these are patched per KV head (``heads`` index KV heads), which TransformerLens refuses (#980).
KV_COMPONENTS = ("k", "v")


def _check_which(which) -> tuple[str, ...]:
    """``which`` as a non-empty tuple of patch kinds (repeats dropped, order kept)."""
    if isinstance(which, str):
        which = (which,)
    try:
        which = tuple(dict.fromkeys(which))
    except TypeError:
        raise TypeError(f"which must be one of {WHICH} or a sequence of them, got {type(which).__name__}") from None
    if not which:
        raise ValueError(f"which is empty; choose from {WHICH}")
    for w in which:
        if w not in WHICH:
            raise ValueError(f"which has unknown entry {w!r}; choose from {WHICH}")
    return which


def _unit_tensors(sites: ModelSites, c: str, L: int, cache: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
    """``(update, reference)`` of residual unit ``c`` at layer ``L`` in a cached run."""
    if c in STREAM_COMPONENTS:
        x = cache[f"blocks.{L}.hook_resid_pre"]
        return x, x
    u = sites.units[c][L]
    upd = cache[u.update_hook]
    if u.update_is_difference:
        ref = cache[u.reference_hook]
        return upd - ref, ref
    # a cache of the clean run may hold the update alone (only the corrupted reference is read)
    return upd, cache.get(u.reference_hook) if isinstance(cache, dict) else cache[u.reference_hook]


def _is_identity(sites: ModelSites, c: str, L: int, v: PatchVariant, clean: dict, corr: dict, eps: float,
                 reference=None) -> bool:
    """Whether the patch ``v`` writes exactly (bitwise) what the corrupted run has there: then
    the patched run *is* the corrupted run (the patched tensor is computed from the corrupted
    run's cached tensors, as the patched forward would compute it)."""
    if c == "value":
        vs = sites.value[L]
        z, z_c = corr[vs.z_hook][:, :, v.head], clean[vs.z_hook][:, :, v.head]
        v_h = corr[vs.v_hook][:, :, kv_head_index(v.head, sites.n_heads, corr[vs.v_hook].shape[2])]
        sl = slice(None) if v.pos is None else slice(v.pos, v.pos + 1)
        return torch.equal(patch_components(z_c[:, sl], z[:, sl], v_h[:, sl], v.which, eps), z[:, sl])
    if c in KV_COMPONENTS:
        name = hook_names(sites, L)[c]
        x, x_c = corr[name][:, :, v.head], clean[name][:, :, v.head]
        sl = slice(None) if v.pos is None else slice(v.pos, v.pos + 1)
        return torch.equal(patch_components(x_c[:, sl], x[:, sl], x[:, sl], v.which, eps), x[:, sl])
    upd_x, ref = _unit_tensors(sites, c, L, corr)
    upd_c, _ = _unit_tensors(sites, c, L, clean)
    sl = slice(None) if v.pos is None else slice(v.pos, v.pos + 1)
    return torch.equal(patch_against(reference, L, upd_c[:, sl], upd_x[:, sl], ref[:, sl], v.which, eps), upd_x[:, sl])


def directional_patch(
    model,
    clean,
    corrupted,
    metric: Callable[[Float[Tensor, "batch pos vocab"]], float | Tensor],
    *,
    components: Sequence[str] = ("attn", "mlp", "value"),
    layers=None,
    heads=None,
    per_position: bool = False,
    attention_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    progress: bool = False,
    which: str | Sequence[str] = WHICH,
    batch_size: int | None = None,
    names_filter=None,
    result: bool = False,
    reference=None,
    per_layer: bool | None = None,
):
    """Patch parallel-only, perpendicular-only and full updates from ``clean`` into ``corrupted``.

    For each component (``attn``, ``mlp``, ``block`` in residual space; ``value`` per
    head; ``resid_pre``, the stream itself; ``k`` / ``v``, the keys or values of one key/value
    head against themselves, per KV head on grouped-query models, the KV heads the ``heads``
    read), layer (and head), and position
    (``per_position=True``) or all positions at once, run the corrupted input with that
    unit's update replaced by ``P_r u_c + (I - P_r) u_x`` (``par``), ``P_r u_x + (I - P_r)
    u_c`` (``perp``) or ``u_c`` (``full``), where ``r`` is the corrupted run's live
    reference (METHOD.md sec. 5) and, in value space, the head's own corrupted value vector
    ``v_t``. For ``resid_pre`` the update is the stream entering block ``L`` and its
    reference is the corrupted stream there (so ``full`` is TransformerLens's
    ``patching.get_act_patch_resid_pre``, ``par`` gives ``P_x u_c`` and ``perp`` gives
    ``u_x + (I - P_x) u_c``).

    How it runs: the clean and corrupted runs are cached once; a patch at layer ``L``
    changes nothing before block ``L``, so its forward starts at block ``L`` from the
    corrupted run's ``resid_pre`` (``tl_directional.model.handle.from_block``), and up to
    ``batch_size`` patched runs of the same unit and layer are stacked along the batch
    axis of one forward (the metric still sees each run's own ``[batch, pos, vocab]``
    logits). A patch that writes exactly the corrupted run's tensor (e.g. a position
    before the corrupted token, where clean and corrupted agree bitwise) is the corrupted
    run, and gets its metric without a forward. Results equal patching one full forward
    at a time to float tolerance (not bitwise: stacked matrix products round differently).
    The loop is :func:`~tl_directional.evaluate.patching.generic.generic_directional_patch` with
    this function's patcher (:data:`ACTIVATION_PATCHER`); ``directional_patch_resid_pre``,
    ``directional_patch_attn``, ``directional_patch_mlp`` and ``directional_patch_value`` are its
    one-component ``functools.partial`` s.

    Two call shapes: ``directional_patch(model, clean, corrupted, metric)`` and
    TransformerLens's patching shape ``directional_patch(model, corrupted_tokens, clean_cache,
    metric)``, where ``clean_cache`` is a cache of the clean run (``model.run_with_cache(clean,
    names_filter=...)``, any mapping) holding the hooks the patches read (a missing one is an
    error naming it); the clean forward is then skipped and the clean metric is NaN.

    Args:
        clean, corrupted: inputs of identical token shape (strings or token tensors).
        metric: ``logits -> scalar`` (e.g. a logit difference); with ``result=True`` it may
            also return one number per sequence (shape ``[batch]``): per-example values.
        names_filter: the hook points the library may cache, as in ``run_with_cache`` (a name,
            a list, or a predicate); one that drops a hook a requested patch reads is an error.
        result: return a :class:`~tl_directional.evaluate.patching.result.DirectionalResult` (effects
            per example, means, bootstrap intervals, ``to_frame()``, ``figure()``) instead of
            ``(results, table)``.
        per_position: patch one position at a time (results gain a ``pos`` axis).
        which: the patches to run, any of ``"par"``, ``"perp"``, ``"full"`` (default all
            three; ``par_plus_perp_minus_full`` is reported only with all three).
        batch_size: patched runs stacked into one forward (default: up to 64, fewer so that
            one forward's logits stay within 2**26 elements); 1 runs them one at a time.
        reference: what ``P_r`` projects onto for the residual-space components (``attn``,
            ``mlp``, ``block``, ``resid_pre``; :func:`~tl_directional.model.reference.resolve_reference`):
            None / ``"input"`` (default: the corrupted run's live reference, exactly as without
            the argument), a ``[d_model]`` direction, a ``[n_layers, d_model]`` per-layer set
            (``per_layer=True``), a ``[k, d_model]`` subspace (``P`` its orthogonal projector), or a
            ``Direction(space="resid")``. ``value`` / ``k`` / ``v`` rows (``d_head`` space) keep
            each head's own vector as their reference. With ``result=True`` the residual
            components' ``random_share`` is that of a random ``k``-subspace.
        per_layer: read a 2-D ``reference`` as one row per layer (True) or a subspace (False).

    Returns:
        ``(results, table)``: ``results[component][which]`` is a tensor shaped like
        TransformerLens patching results: ``[layer]`` / ``[layer, pos]`` for residual
        components, ``[layer, head]`` / ``[layer, pos, head]`` for ``value``; ``table``
        has one row per patch with ``metric``, plus the clean and corrupted baselines
        and ``par_plus_perp_minus_full`` (the interaction, reported not assumed zero).
    """
    return generic_directional_patch(
        model, clean, corrupted, metric, **ACTIVATION_PATCHER, progress=progress, components=components,
        layers=layers, heads=heads, per_position=per_position, attention_mask=attention_mask, eps=eps,
        which=which, batch_size=batch_size, names_filter=names_filter, result=result, reference=reference,
        per_layer=per_layer)


@dataclass
class _Activation:
    """What :func:`_plan_patches` resolved and ran, read by :func:`_set_patch` and :func:`_tabulate`."""

    sites: ModelSites
    components: tuple[str, ...]
    which: tuple[str, ...]
    n_pos: int | None  # None: every position at once
    clean: dict[str, Tensor]
    corr: dict[str, Tensor]
    clean_metric: np.ndarray
    corrupted_metric: np.ndarray
    from_cache: bool
    eps: float
    reference: object
    result: bool


def _plan_patches(model, clean, corrupted, clean_cache, metric, *, components=("attn", "mlp", "value"),
                  layers=None, heads=None, per_position=False, attention_mask=None, eps=DEFAULT_EPS,
                  which=WHICH, batch_size=None, names_filter=None, result=False, reference=None,
                  per_layer=None) -> PatchJob:
    """:func:`directional_patch`'s plan: check the arguments, cache the clean and corrupted runs,
    and list one group of patched runs per (component, layer); a patch that writes exactly the
    corrupted run's tensor gets the corrupted metric and no forward."""
    which = _check_which(which)
    batch_size = check_batch_size(batch_size)
    eps = check_eps(eps)
    split_ref = resolve_reference(model, reference, per_layer=per_layer)
    sites = analysis_sites(model, "directional_patch", PatchingInputError,
                           "dropout would make the patched and corrupted runs differ by chance")
    x_batch = prepare_inputs(model, corrupted, attention_mask, argument="corrupted")
    components = check_components(components, sites.components + ("value",) + STREAM_COMPONENTS + KV_COMPONENTS,
                                  allowed=ALL_COMPONENTS + STREAM_COMPONENTS + KV_COMPONENTS, arch=sites.arch)
    layer_list = normalize_layers(layers, sites.n_layers)
    head_list = normalize_heads(heads, sites.n_heads) or list(range(sites.n_heads))
    # 'k' / 'v' patch the key/value heads that the chosen query heads read
    kv_list = sorted({kv_head_index(h, sites.n_heads, sites.n_kv_heads) for h in head_list})
    clean_names, names = _patch_hook_names(sites, components, layer_list)
    check_names_filter(names_filter, {"directional_patch": names},
                       "directional_patch caches hook_resid_pre and the patched units' update, reference, z and v hooks")
    metric_fn = partial(metric_values, metric, error=PatchingInputError, per_example=result)
    device = device_of(model)
    xt, am = x_batch.tokens.to(device), x_batch.attention_mask.to(device)
    if clean_cache is None:
        c_batch = prepare_inputs(model, clean, attention_mask, argument="clean")
        if c_batch.tokens.shape != x_batch.tokens.shape or not torch.equal(c_batch.attention_mask, x_batch.attention_mask):
            raise ValueError(
                f"clean and corrupted must have the same token shape and padding, got {tuple(c_batch.tokens.shape)} "
                f"and {tuple(x_batch.tokens.shape)}; pad or choose prompts of equal token length"
            )
        clean_logits, clean_store = capture(model, c_batch.tokens.to(device), names,
                                            attention_mask=c_batch.attention_mask.to(device), clone=True, logits=True)
        clean_metric = metric_fn(clean_logits)
        del clean_logits  # one [batch, pos, vocab] tensor alive at a time (Gemma-3: 262k vocabulary)
    else:
        clean_store = clean_from_cache(clean_cache, clean_names, tuple(xt.shape), device)
        clean_metric = None
    corr_cache: dict[str, Tensor] = {}
    with torch.no_grad(), model.hooks(fwd_hooks=capture_hooks(names, corr_cache, clone=True)):
        corr_logits, block0 = forward_recording_block_input(model, xt, am, 0)
    corrupted_metric = metric_fn(corr_logits)
    d_vocab = int(corr_logits.shape[-1])
    del corr_logits
    if clean_metric is None:
        clean_metric = np.full_like(corrupted_metric, np.nan)
    n_pos = xt.shape[1] if per_position else None
    state = _Activation(sites, components, which, n_pos, clean_store, corr_cache, clean_metric,
                        corrupted_metric, clean_cache is not None, eps, split_ref, result)
    groups = _plan(sites, components, layer_list, head_list, kv_list, which, n_pos)
    with torch.no_grad():
        for (c, L), variants in groups:
            for v in variants:
                if _is_identity(sites, c, L, v, clean_store, corr_cache, eps, split_ref):
                    v.value = corrupted_metric
    return PatchJob(groups, xt, am, block0, metric_fn, d_vocab, batch_size, state)


def _patch_hook_names(sites: ModelSites, components, layer_list) -> tuple[set[str], set[str]]:
    """``(clean, all)``: the hook points whose clean activations the patches read, and every hook
    point the two cached runs keep."""
    clean, names = set(), set()
    for L in layer_list:
        names.add(f"blocks.{L}.hook_resid_pre")
        for c in components:
            if c == "value":
                names |= {sites.value[L].z_hook, sites.value[L].v_hook}
                clean.add(sites.value[L].z_hook)
            elif c in KV_COMPONENTS:
                names.add(hook_names(sites, L)[c])
                clean.add(hook_names(sites, L)[c])
            elif c in STREAM_COMPONENTS:
                clean.add(f"blocks.{L}.hook_resid_pre")
            else:
                u = sites.units[c][L]
                names |= {u.update_hook, u.reference_hook}
                clean |= {u.update_hook, u.reference_hook} if u.update_is_difference else {u.update_hook}
    return clean, names


def _plan(sites: ModelSites, components, layer_list, head_list, kv_list, which, n_pos: int | None):
    """The patched runs, one group per (component, layer), in the table's order."""
    positions = list(range(n_pos)) if n_pos is not None else [None]
    work: list[tuple[tuple[str, int], list[PatchVariant]]] = []
    for c in components:
        for L in layer_list:
            hs = head_list if c == "value" else kv_list if c in KV_COMPONENTS else [None]
            work.append(((c, L), [PatchVariant(w, p, h) for p in positions for h in hs for w in which]))
    return work


def _shape(sites: ModelSites, c: str, n_pos: int | None) -> tuple[int, ...]:
    heads = (sites.n_heads,) if c == "value" else (sites.n_kv_heads,) if c in KV_COMPONENTS else ()
    return (sites.n_layers,) + ((n_pos,) if n_pos is not None else ()) + heads


def _as_tables(sites: ModelSites, work, components, which, n_pos: int | None, clean_metric: float,
               corrupted_metric: float) -> tuple[dict[str, dict[str, Tensor]], pd.DataFrame]:
    """``(results, table)``: tensors shaped like TransformerLens patching results and the tidy table."""
    results = {c: {w: torch.full(_shape(sites, c, n_pos), float("nan")) for w in which} for c in components}
    rows = []
    for (c, L), variants in work:
        by_key: dict[tuple, dict[str, float]] = {}
        for v in variants:
            by_key.setdefault((v.pos, v.head), {})[v.which] = float(v.value[0])
        for (p, h), values in by_key.items():
            idx = (L,) + ((p,) if p is not None else ()) + ((h,) if h is not None else ())
            for w, val in values.items():
                results[c][w][idx] = val
            rows.append({
                "component": c, "layer": L, "head": h, "position": p,
                **{f"metric_{w}": values[w] for w in which},
                **{f"effect_{w}": values[w] - corrupted_metric for w in which},
            })
    table = integer_columns(pd.DataFrame(rows), ("layer", "head", "position"))
    if not table.empty:
        if len(which) == len(WHICH):
            table["par_plus_perp_minus_full"] = table["effect_par"] + table["effect_perp"] - table["effect_full"]
        table["clean_metric"] = clean_metric
        table["corrupted_metric"] = corrupted_metric
    return results, table


def _as_result(sites: ModelSites, work, components, which, n_pos: int | None, clean: dict, corr: dict,
               clean_metric: np.ndarray, corrupted_metric: np.ndarray, from_cache: bool,
               eps: float, reference) -> DirectionalResult:
    """The patched runs as a :class:`DirectionalResult`: effects (metric minus the corrupted
    metric) per example, and each difference's share along its reference."""
    n_ex = corrupted_metric.shape[0]
    values = {c: {w: np.full((n_ex,) + _shape(sites, c, n_pos), np.nan) for w in which} for c in components}
    fracs = {c: np.full((n_ex,) + _shape(sites, c, n_pos), np.nan) for c in components}
    for (c, L), variants in work:
        frac = _difference_share(sites, c, L, clean, corr, eps, reference)  # [batch, pos(, head)]
        for v in variants:
            idx = (slice(None), L) + ((v.pos,) if v.pos is not None else ()) + ((v.head,) if v.head is not None else ())
            values[c][v.which][idx] = v.value - corrupted_metric
            f = frac if v.head is None else frac[..., v.head]
            f = f.mean(-1) if v.pos is None else f[:, v.pos]
            fracs[c][idx] = f if n_ex == f.shape[0] else f.mean()
    dims = {c: ("example", "layer") + (("pos",) if n_pos is not None else ())
            + (("head",) if c == "value" or c in KV_COMPONENTS else ()) for c in components}
    return DirectionalResult(
        kind="patch", values=values, dims=dims, par_frac=fracs,
        random_share={c: random_subspace_share(sites.d_head) if c in ("value",) + KV_COMPONENTS
                      else random_subspace_share(sites.d_model, reference.k) for c in components},
        clean_metric=clean_metric, corrupted_metric=corrupted_metric,
        notes=("clean activations from clean_cache: the clean metric is not known (NaN).",) if from_cache else (),
    )


def _difference_share(sites: ModelSites, c: str, L: int, clean: dict, corr: dict, eps: float,
                      reference) -> np.ndarray:
    """``|cos(u_clean - u_corrupt, r)|`` per sequence and position (and head), ``r`` the corrupted
    reference (residual components: or the user's ``reference``, ``||P delta|| / ||delta||``):
    the share of the patched difference along the reference."""
    if c == "value":
        vs = sites.value[L]
        z = corr[vs.z_hook]
        delta = clean[vs.z_hook].to(z.device) - z
        ref = expand_kv_heads(corr[vs.v_hook], sites.n_heads)
    elif c in KV_COMPONENTS:
        ref = corr[hook_names(sites, L)[c]]
        delta = clean[hook_names(sites, L)[c]].to(ref.device) - ref
    else:
        upd_x, ref = _unit_tensors(sites, c, L, corr)
        upd_c, _ = _unit_tensors(sites, c, L, clean)
        delta = upd_c.to(upd_x.device) - upd_x
        if not reference.is_stream:
            return reference.stats(delta, None, L, eps).par_frac.double().cpu().numpy()
    return decompose(delta, ref, eps).par_frac.double().cpu().numpy()


def _set_patch(job: PatchJob, key: tuple[str, int], chunk: list[PatchVariant]) -> StackedPatch:
    """One forward from block ``L`` of ``len(chunk)`` stacked patched copies of the corrupted batch
    (component ``c``, layer ``L``: the group ``key``)."""
    s, (c, L) = job.state, key
    k, b = len(chunk), job.tokens.shape[0]
    resid = s.corr[f"blocks.{L}.hook_resid_pre"]
    hooks: list = []
    if c in STREAM_COMPONENTS:  # the patch is the block input itself
        src = s.clean[f"blocks.{L}.hook_resid_pre"]
        stacked = torch.cat([masked(patch_against(s.reference, L, src, resid, resid, v.which, s.eps), resid, v.pos)
                             for v in chunk])
    else:
        stacked = resid.repeat(k, 1, 1) if k > 1 else resid
        if c in KV_COMPONENTS:
            name = hook_names(s.sites, L)[c]
            hooks = stacked_kv_hooks(name, s.clean[name], chunk, b, s.eps)
        elif c == "value":
            vs = s.sites.value[L]
            hooks = stacked_value_hooks(vs, s.sites.n_heads, s.clean[vs.z_hook], chunk, b, s.eps)
        else:
            clean_u, _ = _unit_tensors(s.sites, c, L, s.clean)
            hooks = stacked_residual_hooks(s.sites.units[c][L], clean_u, chunk, b, s.eps, s.reference)
    return StackedPatch(L, stacked, hooks, k)


def _tabulate(job: PatchJob):
    """``(results, table)``, or a :class:`DirectionalResult` with ``result=True``."""
    s = job.state
    if s.result:
        return _as_result(s.sites, job.groups, s.components, s.which, s.n_pos, s.clean, s.corr, s.clean_metric,
                          s.corrupted_metric, s.from_cache, s.eps, s.reference)
    return _as_tables(s.sites, job.groups, s.components, s.which, s.n_pos, float(s.clean_metric[0]),
                      float(s.corrupted_metric[0]))


#: Directional activation patching as the generic loop's patcher: ``plan``, ``patch_setter`` and
#: ``tabulate`` of :func:`~tl_directional.evaluate.patching.generic.generic_directional_patch`.
ACTIVATION_PATCHER = {"plan": _plan_patches, "patch_setter": _set_patch, "tabulate": _tabulate}

directional_patch_resid_pre = partial(generic_directional_patch, **ACTIVATION_PATCHER, components=("resid_pre",))
"""``directional_patch(..., components=("resid_pre",))``: the stream entering each block, against
the corrupted stream there (``full`` is TransformerLens's ``get_act_patch_resid_pre``)."""

directional_patch_attn = partial(generic_directional_patch, **ACTIVATION_PATCHER, components=("attn",))
"""``directional_patch(..., components=("attn",))``: each attention sub-layer's update, against the
corrupted run's stream it is added to (``full``: TransformerLens's ``get_act_patch_attn_out``)."""

directional_patch_mlp = partial(generic_directional_patch, **ACTIVATION_PATCHER, components=("mlp",))
"""``directional_patch(..., components=("mlp",))``: each MLP's update, against the corrupted run's
stream it is added to (``full``: TransformerLens's ``get_act_patch_mlp_out``)."""

directional_patch_value = partial(generic_directional_patch, **ACTIVATION_PATCHER, components=("value",))
"""``directional_patch(..., components=("value",))``: each head's output ``z`` in value space,
against the head's own corrupted value vector (``full``: TransformerLens's
``get_act_patch_attn_head_out_all_pos`` on ``hook_z``)."""


__all__ = ["ACTIVATION_PATCHER", "KV_COMPONENTS", "STREAM_COMPONENTS", "WHICH", "directional_patch",
           "directional_patch_attn", "directional_patch_mlp", "directional_patch_resid_pre", "directional_patch_value"]
