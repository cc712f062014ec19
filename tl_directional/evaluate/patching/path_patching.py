"""Directional path patching: a sender's clean difference delivered along one path only.

The corrupted run is re-run with the receiver's input recomputed from the live stream plus the
sender's difference ``delta = u* - u_x`` (METHOD.md sec. 5: ``u*`` the full, parallel-only or
perpendicular-only patch of the sender's write), while every other reader keeps its own value.
With one receiver, every other reader sees the corrupted run, as in TransformerLens's
``patching.get_act_patch_direct_path`` (which this equals for a head sender and ``q`` / ``k`` /
``v`` receivers); with every downstream reader at once (``joint=True``) it is activation patching
of the sender.

How a receiver's input is recomputed without TransformerLens's per-head input copies
(``use_split_qkv_input``): each forward stacks, beside the patched copies of the corrupted batch,
a *shadow* copy whose stream holds ``stream + delta`` at the receiver's block; the model computes
the shadow's queries, keys, values and MLP input itself (norm, projections, biases, query/key
norms), and a receiver copies only its own head (or its MLP input) from the shadow. One shadow
serves every single-receiver run of a part in the forward; ``joint`` runs get one each (their
live stream differs from the corrupted one). Forwards start at the first receiver's block
(:func:`~tl_directional.model.handle.from_block`).

With ``freeze_norm=True`` the receiver's norm keeps the live stream's statistics (its
``hook_scale``), so the change of the receiver's input is linear in ``delta`` and the parallel
and perpendicular paths' changes add up to the full path's change (up to float rounding). With
recomputed statistics (the default, the real model) they do not, and neither do the metric
effects, whatever the norm, once the metric is non-linear in the receiver's input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import Tensor

from ...core.bootstrap import random_subspace_share
from ...core.geometry import DEFAULT_EPS, check_eps
from ...model.handle import capture_hooks, device_of, forward_recording_block_input
from ...model.indices import normalize_layers
from ...model.inputs import prepare_inputs
from ...model.reference import resolve_reference
from ...model.sites import POST_LN, ModelSites, analysis_sites
from .cache_input import check_names_filter, clean_from_cache, metric_values
from .generic import PatchJob, StackedPatch, check_batch_size, generic_directional_patch
from .path_hooks import PathRun, chunk_hooks
from .path_nodes import (
    SPACES,
    PathPatchError,
    Receiver,
    Sender,
    hook_names,
    parse_receivers,
    parse_sender,
    sender_deltas,
    sender_hooks,
)
from .result import DirectionalResult

PARTS = ("full", "par", "perp")


def _needed_corrupted(sites, receivers: list[Receiver], freeze: bool) -> set[str]:
    names: set[str] = set()
    for rec in receivers:
        hn = hook_names(sites, rec.layer)
        names |= {hn["resid_pre"]} | (
            {hn["resid_mid"]} if rec.kind == "mlp" and sites.arch == "sequential" else set()
        )
        if freeze and rec.kind != "logits":
            names |= {hn["ln1_scale"], hn["ln2_scale"]}
        if freeze and rec.kind == "logits":
            names.add("ln_final.hook_scale")
    return names


def path_patch(
    model,
    clean,
    corrupted,
    metric: Callable[[Tensor], Tensor | float],
    *,
    sender,
    receivers="q",
    parts=PARTS,
    space: str = "residual",
    layers=None,
    joint: bool = False,
    freeze_norm: bool = False,
    attention_mask: Tensor | None = None,
    batch_size: int | None = None,
    names_filter=None,
    eps: float = DEFAULT_EPS,
    return_inputs: bool = False,
    reference=None,
    per_layer: bool | None = None,
):
    """Path patching of one sender into receivers, full and split (module docstring; METHOD.md sec. 5).

    The loop is :func:`~tl_directional.evaluate.patching.generic.generic_directional_patch` with
    this function's patcher (:data:`PATH_PATCHER`). Two call shapes: ``path_patch(model, clean,
    corrupted, metric, sender=...)`` (texts or ``[batch, pos]`` tokens of equal shape) and
    TransformerLens's ``path_patch(model, corrupted_tokens, clean_cache, metric, sender=...)``,
    ``clean_cache`` any mapping holding the sender's clean hook (``attn.hook_z`` for a head, the
    update hook for ``attn`` / ``mlp``).

    Args:
        sender: ``("head", layer, head)``, ``("attn", layer)`` or ``("mlp", layer)``.
        receivers: a kind among ``"q"``, ``"k"``, ``"v"`` (attention inputs of a later head;
            ``k`` / ``v`` at key/value-head granularity on grouped-query models), ``"mlp"`` (a
            block's MLP input), ``"resid"`` (the stream entering a block, every later reader),
            ``"logits"`` (the final stream): every node of that kind reading the sender's write,
            or a list of kinds, or explicit nodes ``("q", layer, head)``, ``("mlp", layer)``, ...
        parts: any of ``"full"``, ``"par"``, ``"perp"``: which part of the sender's difference
            travels (split against the stream the write is added to, or in ``space="value"``,
            heads only, against the head's own corrupted value vector).
        layers: restrict kinds to receivers in these layers.
        joint: all receivers patched together in one run per part (node type ``"joint"``).
        freeze_norm: receivers' norms keep the live stream's statistics (see the module docstring).
        metric: ``logits -> [batch]`` (per-example values) or a scalar.
        names_filter: hook points the library may cache; one dropping a needed hook is an error.
        return_inputs: also return ``{(part, Receiver): change of that receiver's input}``
            (``[batch, pos, d_head]`` for q / k / v, the normalised MLP input ``[batch, pos,
            d_model]`` for mlp; the added ``delta`` for resid / logits).
        reference: what the sender's clean-minus-corrupted difference is split against in
            residual space (:func:`~tl_directional.model.reference.resolve_reference`): None /
            ``"input"`` (default: the stream the write is added to, exactly as without the
            argument), a ``[d_model]`` direction, a ``[n_layers, d_model]`` per-layer set
            (``per_layer=True``; the sender's layer's row), a ``[k, d_model]`` subspace, or a
            ``Direction(space="resid")``; ``par`` delivers ``P delta``, ``perp`` ``delta - P delta``,
            and ``random_share`` becomes a random ``k``-subspace's. Not with ``space="value"``
            (there the reference is the head's own value vector): an error.
        per_layer: read a 2-D ``reference`` as one row per layer (True) or a subspace (False).

    Returns:
        A :class:`~tl_directional.evaluate.patching.result.DirectionalResult` of kind ``"path_patch"``:
        ``values[kind][part]`` effects (metric minus the corrupted metric), float64 ``[example,
        layer, head]`` for q / k / v (head: the key/value head for k / v), ``[example, layer]``
        for mlp / resid, ``[example]`` for logits and joint; NaN where no receiver was patched.

    Raises:
        PathPatchError: unknown sender / receiver / part / space, unequal clean and corrupted
            shapes, a model in training mode, a metric returning neither a scalar nor ``[batch]``.
        PatchingInputError: a clean cache or ``names_filter`` lacking a needed hook.
    """
    return generic_directional_patch(
        model, clean, corrupted, metric, **PATH_PATCHER, sender=sender, receivers=receivers, parts=parts,
        space=space, layers=layers, joint=joint, freeze_norm=freeze_norm, attention_mask=attention_mask,
        batch_size=batch_size, names_filter=names_filter, eps=eps, return_inputs=return_inputs,
        reference=reference, per_layer=per_layer)


@dataclass
class _Paths:
    """What :func:`_plan_paths` resolved and ran, read by :func:`_set_paths` and :func:`_tabulate_paths`."""

    plan: _Plan
    base: _Base
    deltas: dict[str, Tensor]
    share: Tensor
    joint: bool
    freeze_norm: bool
    return_inputs: bool
    space: str
    from_cache: bool
    k: int
    captured: list = field(default_factory=list)  # (chunk, {(run index, receiver): input}) per forward


def _plan_paths(model, clean, corrupted, clean_cache, metric, *, sender, receivers="q", parts=PARTS,
                space="residual", layers=None, joint=False, freeze_norm=False, attention_mask=None,
                batch_size=None, names_filter=None, eps=DEFAULT_EPS, return_inputs=False, reference=None,
                per_layer=None) -> PatchJob:
    """:func:`path_patch`'s plan: check, run the clean and corrupted runs, split the sender's
    difference, and list every patched run (a receiver set and a part) in one group sorted by its
    first receiver's block (a forward starts at its first run's block)."""
    eps = check_eps(eps)
    split_ref = resolve_reference(model, reference, per_layer=per_layer)
    if not split_ref.is_stream and space == "value":
        raise PathPatchError(
            f"reference={split_ref.describe()} splits the sender's difference in residual space, but "
            "space='value' splits it against the head's own value vector; pass space='residual' with "
            "the reference, or leave reference out")
    plan = _plan(model, sender=sender, receivers=receivers, parts=parts, space=space, layers=layers,
                 joint=joint, freeze_norm=freeze_norm, batch_size=batch_size, names_filter=names_filter)
    base = _base_runs(model, plan, metric, clean, corrupted, clean_cache, attention_mask)
    with torch.no_grad():
        deltas, share = sender_deltas(
            model, plan.sites, plan.send, space, plan.parts, base.clean_store, base.corr, base.block0,
            base.xt, base.am, plan.sandwich, eps, split_ref
        )
    # with return_inputs, a zero difference along the same route gives the receiver's unpatched
    # input computed exactly as the patched ones are (the bridge's norm fallback rounds differently)
    run_parts = plan.parts + (("zero",) if return_inputs else ())
    deltas["zero"] = torch.zeros_like(deltas[plan.parts[0]])
    runs = ([PathRun(tuple(plan.recs), p) for p in run_parts] if joint
            else [PathRun((r,), p) for r in plan.recs for p in run_parts])
    runs.sort(key=lambda run: min(r.layer for r in run.receivers))
    state = _Paths(plan, base, deltas, share, joint, freeze_norm, return_inputs, space, clean_cache is not None,
                   split_ref.k)
    metric_fn = partial(metric_values, metric, error=PathPatchError, type_error=PathPatchError)
    return PatchJob([(None, runs)], base.xt, base.am, base.block0, metric_fn, base.d_vocab, batch_size, state)


@dataclass
class _Plan:
    """What :func:`path_patch` checked and resolved before any forward: the model's sites, the
    sender, its receivers, the parts, and the hooks the clean and corrupted runs must cache."""

    sites: ModelSites
    send: Sender
    recs: list[Receiver]
    parts: tuple[str, ...]
    clean_names: set[str]
    corr_names: set[str]
    hook_dict: dict
    sandwich: bool


def _plan(model, *, sender, receivers, parts, space, layers, joint, freeze_norm, batch_size, names_filter) -> _Plan:
    """Check :func:`path_patch`'s arguments against the model; raise PathPatchError naming the fix."""
    if space not in SPACES:
        raise PathPatchError(f"space={space!r}: choose 'residual' (against the stream) or 'value' (a head's own value)")
    parts = (parts,) if isinstance(parts, str) else tuple(dict.fromkeys(parts))
    if not parts or any(p not in PARTS for p in parts):
        raise PathPatchError(f"parts={parts!r}: choose from {PARTS}")
    sites = analysis_sites(model, "path_patch", PathPatchError,
                           "dropout would make the patched and corrupted runs differ by chance")
    if sites.arch == POST_LN:
        raise PathPatchError(
            f"{sites.model_name} is a post-LN encoder: every write passes a LayerNorm before any later "
            "reader, so a write has no path of its own; use directional_patch or attribution_patch there"
        )
    send = parse_sender(sender, sites)
    if space == "value" and send.kind != "head":
        raise PathPatchError(
            f"space='value' splits a head's output against its own value; sender {sender!r} is not a head"
        )
    if layers is not None:  # a layer past the model used to be blamed on the sender
        try:
            layers = normalize_layers(layers, sites.n_layers, "layers")
        except (TypeError, ValueError) as exc:
            raise PathPatchError(f"path_patch: {exc}") from None
    recs = parse_receivers(receivers, send, sites, None if layers is None else set(layers))
    if not recs:
        raise PathPatchError(f"no receiver of {receivers!r} reads the write of sender {sender!r}; choose later layers")
    if joint and freeze_norm and any(r.kind == "logits" for r in recs):
        raise PathPatchError(
            "freeze_norm with joint=True cannot freeze the final norm; leave 'logits' out or freeze_norm off"
        )
    check_batch_size(batch_size, PathPatchError)
    clean_names, corr_names = sender_hooks(send, sites, space)
    corr_names |= _needed_corrupted(sites, recs, freeze_norm) | {f"blocks.{send.layer}.hook_resid_pre"}
    hook_dict = model.hook_dict  # built on each access on the bridge: read it once
    missing = [n for n in corr_names if n not in hook_dict]
    if missing:
        raise PathPatchError(
            f"model has no hook point(s) {sorted(missing)[:3]} that these receivers read; "
            "choose other receivers (or freeze_norm=False)"
        )
    check_names_filter(names_filter, {"path_patch": sorted(clean_names | corr_names)},
                       "path_patch caches the sender's hooks and the receivers' stream and norm hooks")
    return _Plan(sites, send, recs, parts, clean_names, corr_names, hook_dict, sites.sandwich)


@dataclass
class _Base:
    """The unpatched runs: corrupted tokens ``xt`` / mask ``am`` ``[b, pos]``, the clean and
    corrupted activations :func:`path_patch` needs, the block-0 input and both metrics."""

    xt: Tensor
    am: Tensor
    b: int
    clean_store: dict[str, Tensor]
    corr: dict[str, Tensor]
    block0: object
    corrupted_metric: np.ndarray
    clean_metric: np.ndarray
    d_vocab: int


def _base_runs(model, plan: _Plan, metric, clean, corrupted, clean_cache, attention_mask) -> _Base:
    """The clean and corrupted runs in one forward (or the corrupted one and ``clean_cache``)."""
    clean_names, corr_names = plan.clean_names, plan.corr_names
    device = device_of(model)
    x_batch = prepare_inputs(model, corrupted, attention_mask, argument="corrupted")
    xt, am = x_batch.tokens.to(device), x_batch.attention_mask.to(device)
    b = xt.shape[0]
    if clean_cache is None:
        c_batch = prepare_inputs(model, clean, attention_mask, argument="clean")
        if c_batch.tokens.shape != x_batch.tokens.shape:
            raise PathPatchError(
                f"clean and corrupted must have the same [batch, pos] shape, got {tuple(c_batch.tokens.shape)} and "
                f"{tuple(x_batch.tokens.shape)}; pad or choose prompts of equal token length"
            )
        # the clean and corrupted runs in one forward (rows: clean, then corrupted)
        both_t = torch.cat([c_batch.tokens.to(device), xt])
        both_m = torch.cat([c_batch.attention_mask.to(device), am])
    else:
        clean_store = clean_from_cache(clean_cache, clean_names, tuple(xt.shape), device)
        both_t, both_m = xt, am
    store: dict[str, Tensor] = {}
    names = corr_names | (clean_names if clean_cache is None else set())
    with torch.no_grad(), model.hooks(fwd_hooks=capture_hooks(names, store, clone=True)):
        logits, block0 = forward_recording_block_input(model, both_t, both_m, 0)
    corrupted_metric = metric_values(metric, logits[-b:], PathPatchError, PathPatchError)
    if clean_cache is None:
        clean_metric = metric_values(metric, logits[:b], PathPatchError, PathPatchError)
        clean_store = {n: store[n][:b] for n in clean_names}
    else:
        clean_metric = np.full_like(corrupted_metric, np.nan)
    corr = {n: store[n][-b:] for n in corr_names}
    for n in set(clean_store) & set(corr) if clean_cache is not None else ():
        if clean_store[n].shape != corr[n].shape:  # another model's cache: a shape error deep inside
            raise PathPatchError(
                f"clean_cache[{n!r}] has shape {tuple(clean_store[n].shape)} but this model's run gives "
                f"{tuple(corr[n].shape)}; cache the clean run with this model (model.run_with_cache(clean_tokens))"
            )
    return _Base(xt, am, b, clean_store, corr, block0, corrupted_metric, clean_metric, int(logits.shape[-1]))


def _set_paths(job: PatchJob, key: None, chunk: list[PathRun]) -> StackedPatch:  # noqa: ARG001 - one group
    """One forward of the runs ``chunk`` from their first receiver's block, with their *shadow*
    copies stacked after them (one per part; a ``joint`` run has its own)."""
    s = job.state
    start = min(r.layer for r in chunk[0].receivers)
    if s.joint:
        shadows = [(run.part, i) for i, run in enumerate(chunk)]
    else:
        shadows = [(p, None) for p in dict.fromkeys(run.part for run in chunk)]
    index = {p: j for j, (p, _) in enumerate(shadows)}
    for i, run in enumerate(chunk):
        run.shadow = i if s.joint else index[run.part]
    n = len(chunk) + len(shadows)
    captured: dict | None = {} if s.return_inputs else None
    if captured is not None:
        s.captured.append((chunk, captured))
    hooks = chunk_hooks(s.plan.sites, s.plan.hook_dict, chunk, shadows, s.deltas, s.base.corr, s.base.b,
                        s.freeze_norm, captured)
    # freeze_norm edits hook_scale on purpose: the unpatched route is rebuilt the same way
    resid = s.base.corr[f"blocks.{start}.hook_resid_pre"]
    return StackedPatch(start, resid.repeat(n, 1, 1), hooks, n, edits_norm_scale=True)


def _tabulate_paths(job: PatchJob):
    """The :class:`DirectionalResult`, and with ``return_inputs`` the receivers' input changes
    (each patched input minus the zero-difference run's)."""
    s = job.state
    inputs: dict = {}
    for chunk, captured in s.captured:
        for i, run in enumerate(chunk):
            for rec in run.receivers:
                inputs[(run.part, rec)] = captured.pop((i, rec), s.deltas[run.part])
    for key in [key for key in inputs if key[0] != "zero"]:
        zero = inputs[("zero", key[1])]
        inputs[key] = inputs[key] - zero if key[1].kind not in ("resid", "logits") else inputs[key]
    inputs = {key: t for key, t in inputs.items() if key[0] != "zero"}
    result = _as_result(s, [run for run in job.groups[0][1] if run.part != "zero"])
    return (result, inputs) if s.return_inputs else result


def _as_result(s: _Paths, runs: list[PathRun]) -> DirectionalResult:
    """The runs' effects (metric minus the corrupted metric) per receiver kind, as a
    :class:`DirectionalResult` of kind ``"path_patch"`` (:func:`path_patch`'s Returns)."""
    sites, recs, corrupted_metric, share = s.plan.sites, s.plan.recs, s.base.corrupted_metric, s.share
    n_ex = corrupted_metric.shape[0]
    shapes = {"joint": ()} if s.joint else {
        r.kind: (sites.n_layers, sites.n_heads if r.kind == "q" else sites.n_kv_heads) if r.kind in ("q", "k", "v")
        else (sites.n_layers,) if r.kind in ("mlp", "resid") else () for r in recs}
    values = {kd: {p: np.full((n_ex,) + shape, np.nan) for p in s.plan.parts} for kd, shape in shapes.items()}
    for run in runs:
        eff = run.value - corrupted_metric
        if s.joint:
            values["joint"][run.part][:] = eff
            continue
        r = run.receivers[0]
        idx = (slice(None),) + ((r.layer, r.head) if r.head is not None else (r.layer,) if r.kind != "logits" else ())
        values[r.kind][run.part][idx] = eff
    frac = share.cpu().numpy() if share.shape[0] == n_ex else np.full(n_ex, float(share.mean()))
    par_frac = {kd: np.broadcast_to(frac.reshape((n_ex,) + (1,) * len(shape)), (n_ex,) + shape).copy()
                for kd, shape in shapes.items()}
    dims = {kd: ("example",) + (("layer", "head"), ("layer",), ())[2 - len(shape)] for kd, shape in shapes.items()}
    notes = [f"par_frac is the sender's difference's share along its reference ({s.space} space), the same for "
             "every receiver."]
    if sites.n_kv_heads != sites.n_heads and any(r.kind in ("k", "v") for r in recs):
        notes.append("grouped-query model: k / v receivers are key/value heads, each read by a group of query heads.")
    if s.plan.sandwich:
        notes.append("sandwich-norm model: a head's write is the post-attention norm's output with only that head "
                     "changed.")
    if s.from_cache:
        notes.append("clean activations from clean_cache: the clean metric is not known (NaN).")
    d = sites.d_head if s.space == "value" else sites.d_model
    return DirectionalResult(kind="path_patch", values=values, dims=dims, par_frac=par_frac,
                             random_share={kd: random_subspace_share(d, s.k) for kd in shapes},
                             clean_metric=s.base.clean_metric, corrupted_metric=corrupted_metric, notes=tuple(notes))


#: Path patching as the generic loop's patcher: ``plan``, ``patch_setter`` and ``tabulate`` of
#: :func:`~tl_directional.evaluate.patching.generic.generic_directional_patch`.
PATH_PATCHER = {"plan": _plan_paths, "patch_setter": _set_paths, "tabulate": _tabulate_paths}


__all__ = ["PARTS", "PATH_PATCHER", "path_patch"]
