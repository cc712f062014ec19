"""Directional attribution patching: the first-order patching estimate of every node, split.

For a clean run and a corrupted run of the same token shape, the attribution estimate of patching
node ``a`` from corrupted to clean is ``(a_clean - a_corrupt) . g`` with ``g = d metric / d a`` at
the corrupted run (TransformerLens's denoising convention). The difference ``delta = a_clean -
a_corrupt`` is split against the node's reference ``r`` read in the corrupted run (METHOD.md
sec. 5, the reference of directional activation patching):

    par  = (delta . r)(r . g) / ||r||^2        the estimate of the parallel-only patch
    perp = full - par                          the estimate of the perpendicular-only patch

computed in float64, so ``par + perp == full`` to float64 rounding for every node and example.
In the small-step limit these are the derivatives of :func:`~tl_directional.directional_patch`'s
parallel-only and perpendicular-only patches along the straight line from corrupted to patched.

Nodes (``node_types``), each per layer and position:

* ``resid``: the residual stream entering the block (``hook_resid_pre``), reference itself;
* ``attn`` / ``mlp``: the sub-layer's update (the tensor added to the stream; on sandwich-norm
  models the *normalised* write) against the stream it is added to (METHOD.md sec. 2);
* ``head``: one head's ``hook_z`` contribution in residual coordinates, ``W_O[h]^T dz_h`` (on
  sandwich-norm models pushed through the post-attention norm linearised at the corrupted run,
  ``J W_O[h]^T dz_h``, which is what reaches the stream to first order), split against
  ``hook_resid_pre`` with the gradient at the attention update; ``full`` is ``dz_h . g_z``, the
  node score of TransformerLens's ``attribution_patch``;
* ``value``: the same ``hook_z`` difference in value space, split against the token's own value
  vector ``v_t`` (grouped-query attention: the KV head the query head reads), gradient at
  ``hook_z``.

Cost: two forwards and one backward per batch of pairs, whatever the number of nodes (one
forward and one backward when the clean activations come from a cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...core.bootstrap import random_subspace_share
from ...core.geometry import DEFAULT_EPS, check_eps
from ...model.handle import capture_hooks, device_of
from ...model.inputs import prepare_inputs
from ...model.reference import resolve_reference
from ...model.sites import ModelSites, analysis_sites, resolve_sites
from .attribution_passes import check_layers_per_pass, forward_backward, layer_passes
from .attribution_scores import AttributionError, node_scores
from .cache_input import cache_tensor, check_names_filter, is_cache
from .result import DirectionalResult

_CACHE_HINT = (
    "model.run_with_cache(clean_tokens, names_filter=tl_directional.attribution_hooks(model, "
    "node_types))"
)

#: The node types :func:`attribution_patch` scores, in the order of its result.
NODE_TYPES = ("resid", "attn", "mlp", "head", "value")



# ---------------------------------------------------------------------------------------------
# which hook points a node type reads
# ---------------------------------------------------------------------------------------------


def _check_node_types(node_types) -> tuple[str, ...]:
    if isinstance(node_types, str):
        node_types = (node_types,)
    try:
        out = tuple(dict.fromkeys(node_types))
    except TypeError:
        raise AttributionError(
            f"node_types must be a sequence of {NODE_TYPES}, got {node_types!r}"
        ) from None
    bad = [n for n in out if n not in NODE_TYPES]
    if bad or not out:
        raise AttributionError(
            f"node_types={node_types!r} has unknown or no entries {bad}; choose from {NODE_TYPES}"
        )
    return out


def _clean_hooks(sites: ModelSites, node_types: Sequence[str]) -> dict[str, list[str]]:
    """Per node type, the hook points whose *clean* activations the estimate needs."""
    out: dict[str, list[str]] = {}
    for n in node_types:
        names: list[str] = []
        for L in range(sites.n_layers):
            if n == "resid":
                names.append(f"blocks.{L}.hook_resid_pre")
            elif n in ("attn", "mlp"):
                names.append(sites.units[n][L].update_hook)
            else:
                names.append(sites.value[L].z_hook)
        out[n] = names
    return out


def attribution_hooks(model, node_types: Sequence[str] = NODE_TYPES) -> list[str]:
    """The hook points a clean cache must hold for :func:`attribution_patch`'s ``node_types``: pass
    them as ``names_filter`` to ``model.run_with_cache(clean_tokens, names_filter=...)`` to cache
    only those (``hook_resid_pre``, the attention / MLP update hooks, ``attn.hook_z``)."""
    sites = resolve_sites(model, warn=False)
    names = _clean_hooks(sites, _check_node_types(node_types))
    return sorted({h for hs in names.values() for h in hs})


# ---------------------------------------------------------------------------------------------
# the public function
# ---------------------------------------------------------------------------------------------


def attribution_patch(
    model,
    clean_tokens,
    corrupted_tokens=None,
    metric: Callable[[Tensor], Tensor] | None = None,
    *,
    clean_cache: Mapping[str, Tensor] | None = None,
    node_types: Sequence[str] = NODE_TYPES,
    names_filter: Any = None,
    batch_size: int | None = None,
    attention_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    reference=None,
    per_layer: bool | None = None,
    layers_per_pass: int | None = None,
) -> DirectionalResult:
    """First-order (attribution) patching estimate of every node, split into the part along the
    node's reference and the part perpendicular to it (module docstring; METHOD.md sec. 5).

    Two call shapes:

    * ``attribution_patch(model, clean_tokens, corrupted_tokens, metric)``;
    * TransformerLens's patching shape ``attribution_patch(model, corrupted_tokens, clean_cache,
      metric)``, with ``clean_cache`` from ``model.run_with_cache(clean_tokens, names_filter=
      tl_directional.attribution_hooks(model))`` (or any mapping holding those hooks); the clean
      forward is then skipped.

    Args:
        clean_tokens, corrupted_tokens: ``[batch, pos]`` token ids (or texts) of equal shape; row
            ``i`` of each is pair ``i``.
        metric: ``logits [batch, pos, vocab] -> [batch]`` (one number per pair; per-example values
            in the result) or a scalar (the batch's metric: each row then holds that pair's share
            of the batch's estimate). It must be differentiable in the logits.
        node_types: any of :data:`NODE_TYPES`.
        names_filter: the hook points the library may cache, as in ``run_with_cache`` (a name, a
            list, or a predicate); one that drops a hook a requested node reads is an error.
        batch_size: pairs per forward/backward (default: all at once). In float32 a pair's scores
            depend slightly on the batch it ran in: batched matrix products reduce in another
            order (and another CPU kernel may be chosen), so they differ from TransformerLens's
            one-pair calls by float32 round-off, more than with ``batch_size=1``. Where exact
            parity matters, pass ``batch_size=1`` or run the model in float64
            (``model.to(torch.float64)``; tests/real/test_attribution_real.py checks both);
            :func:`tl_directional.core.roundoff.roundoff_tolerance` bounds the float32 gap.
        attention_mask: ``[batch, pos]`` padding mask, shared by both runs.
        eps: degenerate threshold on squared norms (METHOD.md sec. 1).
        reference: what the residual-space nodes (``resid``, ``attn``, ``mlp``, ``head``'s write
            ``W_O[h]^T dz_h``) split their difference against
            (:func:`~tl_directional.model.reference.resolve_reference`): None / ``"input"`` (default,
            each node's own reference above; exactly as without the argument), a ``[d_model]``
            direction, a ``[n_layers, d_model]`` per-layer set (``per_layer=True``), a
            ``[k, d_model]`` subspace (``par = (P delta) . g``, ``P`` its orthogonal projector), or
            a ``Direction(space="resid")``. ``value`` nodes (``d_head`` space) keep the token's own
            value; their ``random_share`` stays a line's, the residual nodes' becomes a random
            ``k``-subspace's.
        per_layer: read a 2-D ``reference`` as one row per layer (True) or a subspace (False).
        layers_per_pass: None (default): one corrupted forward and backward over every layer.
            An integer ``k``: the backward in passes of ``k`` blocks, top first, each recomputing
            the forward and keeping the graph, activations and gradients of its ``k`` blocks only
            (peak memory about ``k / n_layers`` of the graph, plus the logits; about
            ``(n_layers / k + 1) / 2`` forwards more). The scores equal the default's exactly.

    Returns:
        A :class:`~tl_directional.evaluate.patching.result.DirectionalResult` of kind ``"attribution"``:
        ``values[node][which]`` with ``which`` in ``("full", "par", "perp")``, float64 arrays
        ``[example, layer, pos]`` (``head`` / ``value``: ``[example, layer, pos, head]``), and
        ``par_frac[node]`` (the share ``|cos(delta, r)|`` of each difference along its reference)
        with ``random_share[node]``, what a random line of that space carries.

    Raises:
        AttributionError: unequal shapes, a model in training mode, a non-scalar / non-[batch] or
            gradient-free metric, a cache missing a needed hook, a ``names_filter`` that drops one.
    """
    if is_cache(
        corrupted_tokens
    ):  # TransformerLens shape: (model, corrupted_tokens, clean_cache, metric)
        if clean_cache is not None:
            raise AttributionError(
                "clean_cache was given twice (positionally and by keyword); pass it once"
            )
        clean_cache, corrupted_tokens, clean_tokens = corrupted_tokens, clean_tokens, None
    if corrupted_tokens is None:
        raise AttributionError(
            "corrupted_tokens is missing; call attribution_patch(model, clean_tokens, "
            "corrupted_tokens, metric) or attribution_patch(model, corrupted_tokens, clean_cache, metric)"
        )
    if metric is None or not callable(metric):
        raise AttributionError(
            f"metric must be a function logits -> [batch] tensor, got {metric!r}"
        )
    node_types = _check_node_types(node_types)
    eps = check_eps(eps)
    split_ref = resolve_reference(model, reference, per_layer=per_layer)
    sites = analysis_sites(model, "attribution_patch", AttributionError,
                           "dropout would make the clean and corrupted runs differ by chance")
    sandwich = sites.sandwich
    needed = _clean_hooks(sites, node_types)
    check_names_filter(
        names_filter,
        needed,
        f"tl_directional.attribution_hooks(model, {list(node_types)!r}) lists them",
    )
    x_batch = prepare_inputs(model, corrupted_tokens, attention_mask, argument="corrupted_tokens")
    device = device_of(model)
    xt, am = x_batch.tokens.to(device), x_batch.attention_mask.to(device)
    b, n_pos = xt.shape
    if clean_cache is None:
        c_batch = prepare_inputs(model, clean_tokens, attention_mask, argument="clean_tokens")
        if c_batch.tokens.shape != x_batch.tokens.shape:
            raise AttributionError(
                f"clean_tokens and corrupted_tokens must have the same [batch, pos] shape, got "
                f"{tuple(c_batch.tokens.shape)} and {tuple(x_batch.tokens.shape)}; pad or pick prompts of equal "
                "token length (the estimate pairs activations position by position)"
            )
        ct = c_batch.tokens.to(device)
    else:
        ct = None
        for hs in needed.values():
            for h in hs:
                cache_tensor(clean_cache, h, (b, n_pos), "clean_cache", _CACHE_HINT)
    if batch_size is None:
        batch_size = b
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise AttributionError(
            f"batch_size must be a positive integer (pairs per forward/backward) or None, "
            f"got {batch_size!r}"
        )

    clean_names, act_names, grad_names = _run_hooks(sites, node_types, needed)
    parts, clean_metric, corrupted_metric = _score_batches(
        model, sites, sandwich, node_types, metric, eps, clean_cache=clean_cache, ct=ct, xt=xt, am=am,
        batch_size=batch_size, names=(clean_names, act_names, grad_names), reference=split_ref,
        per_pass=check_layers_per_pass(layers_per_pass, sites.n_layers),
    )
    return _as_result(sites, sandwich, node_types, parts, clean_metric, corrupted_metric, clean_cache is not None,
                      split_ref)


def _run_hooks(sites, node_types, needed: dict) -> tuple[set[str], set[str], set[str]]:
    """The hooks :func:`attribution_patch` reads: the clean activations, the corrupted run's
    activations and the corrupted run's gradients, for ``node_types``."""
    clean_names = {h for hs in needed.values() for h in hs}
    act_names = set(clean_names)
    grad_names: set[str] = set()
    for L in range(sites.n_layers):
        if "resid" in node_types:
            grad_names.add(f"blocks.{L}.hook_resid_pre")
        for n in ("attn", "mlp"):
            if n in node_types:
                u = sites.units[n][L]
                act_names |= {u.update_hook, u.reference_hook}
                grad_names.add(u.update_hook)
        if "head" in node_types or "value" in node_types:
            grad_names.add(sites.value[L].z_hook)
        if "value" in node_types:
            act_names.add(sites.value[L].v_hook)
        if "head" in node_types:
            act_names.add(sites.value[L].resid_hook)
            grad_names.add(sites.units["attn"][L].update_hook)
            act_names.add(sites.value[L].z_hook)
    return clean_names, act_names, grad_names


def _score_batches(model, sites, sandwich, node_types, metric, eps, *, clean_cache, ct, xt, am, batch_size,
                   names, reference=None, per_pass=None) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """The node scores of every ``batch_size`` rows (a clean forward, unless ``clean_cache``,
    then one corrupted forward and backward): ``{node: {full, par, perp, frac: [arrays]}}`` and
    the clean and corrupted metrics per batch."""
    clean_names, act_names, grad_names = names
    b, n_pos = xt.shape
    device = xt.device
    parts: dict[str, dict[str, list[np.ndarray]]] = {
        n: {"full": [], "par": [], "perp": [], "frac": []} for n in node_types
    }
    clean_metric: list[np.ndarray] = []
    corrupted_metric: list[np.ndarray] = []
    for start in range(0, b, batch_size):
        rows = slice(start, min(b, start + batch_size))
        k = rows.stop - rows.start
        if ct is not None:
            clean: dict[str, Tensor] = {}
            with (
                torch.no_grad(),
                model.hooks(fwd_hooks=capture_hooks(clean_names, clean, clone=True)),
            ):
                logits = model(ct[rows], attention_mask=am[rows])
                cm = metric(logits)
            del logits
            clean_metric.append(_per_row(cm, k))
        else:
            clean = {
                h: cache_tensor(clean_cache, h, (b, n_pos), "clean_cache", _CACHE_HINT)[rows].to(
                    device
                )
                for h in clean_names
            }
            clean_metric.append(np.full(k, np.nan))
        value, scores = _corrupted_scores(model, sites, sandwich, node_types, metric, eps, clean, xt[rows],
                                          am[rows], names, reference, per_pass or sites.n_layers)
        corrupted_metric.append(_per_row(value, k))
        for n, res in scores.items():
            for w, t in res.items():
                parts[n][w].append(t.cpu().numpy())
        del scores, clean
    return parts, clean_metric, corrupted_metric


def _corrupted_scores(model, sites, sandwich, node_types, metric, eps, clean, tokens, mask, names, reference,
                      per_pass: int) -> tuple[Tensor, dict]:
    """The corrupted run of one batch, in passes of ``per_pass`` blocks (top first), each pass's
    activations and gradients scored and dropped before the next: ``(metric, {node: {which:
    [b, layer, ...]}})``."""
    _, act_names, grad_names = names
    value, grad_above, pieces = None, None, []
    for layers in layer_passes(sites.n_layers, per_pass):
        got, acts, grads, grad_above = forward_backward(
            model, tokens, mask, act_names, grad_names, metric, layers=layers, n_layers=sites.n_layers,
            grad_above=grad_above)
        value = got if got is not None else value
        pieces.append(node_scores(model, sites, sandwich, node_types, clean, acts, grads, eps, reference,
                                  layers=layers))
        del acts, grads
    pieces.reverse()
    scores = {n: {w: torch.cat([p[n][w] for p in pieces], dim=1) for w in pieces[0][n]} for n in node_types}
    return value, scores


def _as_result(sites, sandwich, node_types, parts, clean_metric, corrupted_metric, from_cache,
               reference) -> DirectionalResult:
    """:func:`attribution_patch`'s batches joined into one :class:`DirectionalResult`."""
    values = {
        n: {w: np.concatenate(parts[n][w]) for w in ("full", "par", "perp")} for n in node_types
    }
    par_frac = {n: np.concatenate(parts[n]["frac"]) for n in node_types}
    dims = {
        n: ("example", "layer", "pos", "head")
        if n in ("head", "value")
        else ("example", "layer", "pos")
        for n in node_types
    }
    d_of = {n: sites.d_head if n == "value" else sites.d_model for n in node_types}
    notes = []
    if sandwich and "head" in node_types:
        notes.append(
            "sandwich-norm model: a head's residual-space difference is W_O[h]^T dz_h pushed through "
            "the post-attention norm linearised at the corrupted run (what reaches the stream to first "
            "order); the full estimate is dz_h . g_z as on any model."
        )
    if from_cache:
        notes.append("clean activations from clean_cache: the clean metric is not known (NaN).")
    return DirectionalResult(
        kind="attribution",
        values=values,
        dims=dims,
        par_frac=par_frac,
        random_share={n: random_subspace_share(d_of[n], 1 if n == "value" else reference.k) for n in node_types},
        clean_metric=np.concatenate(clean_metric),
        corrupted_metric=np.concatenate(corrupted_metric),
        notes=tuple(notes),
    )


def _per_row(value, k: int) -> np.ndarray:
    """Per-pair metric values (a scalar metric is the batch's: each row gets it, as NaN-free)."""
    t = torch.as_tensor(value).detach().double().cpu().reshape(-1)
    return t.numpy() if t.numel() == k else np.full(k, float(t.reshape(-1)[0]))


__all__ = ["NODE_TYPES", "attribution_hooks", "attribution_patch"]
