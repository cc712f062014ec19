"""Directional activation patching and split direct logit attribution (METHOD.md sec. 5).

:func:`directional_patch` patches only the parallel, only the perpendicular, or
the full update of a sub-layer (or of one head's value-space output) from a
clean run into a corrupted run, splitting against the *corrupted* run's
reference, and records a metric. Results come as tensors shaped like
``transformer_lens.patching`` results plus a tidy DataFrame. The sum of the
parallel-only and perpendicular-only effects is reported next to the full
patch, never assumed equal to it.

:func:`split_logit_attribution` splits each head's (and each sub-layer's)
direct logit attribution into the part carried by its parallel and its
perpendicular component against the stream it writes into.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .adapter import capture, device_of
from .components import check_components
from .geometry import DEFAULT_EPS, decompose, patch_components
from .inputs import prepare_inputs, token_ids
from .sites import (
    ModelSites,
    final_norm_weight,
    kv_head_index,
    normalize_heads,
    normalize_layers,
    resolve_sites,
)

WHICH = ("par", "perp", "full")


def _integer_columns(table: pd.DataFrame, columns) -> pd.DataFrame:
    """Index columns as integers (pandas ``Int64``, so rows without a head or position
    hold ``<NA>`` instead of turning the column into floats)."""
    for c in columns:
        if c in table:
            table[c] = table[c].astype("Int64")
    return table


def _scalar_metric(metric, logits) -> float:
    """``metric(logits)`` as a float; a clear error for a vector or a non-number."""
    value = metric(logits)
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"metric returned a tensor of shape {tuple(value.shape)}; it must return one number "
                "per run, e.g. reduce over the batch: lambda logits: (logits[:, -1, a] - logits[:, -1, b]).mean()"
            )
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric must return a number or a 1-element tensor, got {type(value).__name__}") from None


def _patch_residual_hooks(unit, clean_update: Tensor, which: str, pos_mask: Tensor | None, eps: float):
    """Hooks patching the unit's update in the corrupted run (reference read live)."""
    state: dict = {}

    def ref_hook(t, hook):  # noqa: ARG001
        state["ref"] = t
        return t

    def upd_hook(t, hook):  # noqa: ARG001
        ref = state["ref"]
        corrupted = t - ref if unit.update_is_difference else t
        new = patch_components(clean_update.to(t.device), corrupted, ref, which, eps)
        if pos_mask is not None:
            new = torch.where(pos_mask.unsqueeze(-1), new, corrupted)
        return new + ref if unit.update_is_difference else new

    return [(unit.reference_hook, ref_hook), (unit.update_hook, upd_hook)]


def _patch_value_hooks(vs, n_heads: int, head: int, clean_z: Tensor, which: str, pos_mask: Tensor | None, eps: float):
    """Hooks patching one head's ``hook_z`` output against its own (corrupted) value."""
    state: dict = {}

    def v_hook(t, hook):  # noqa: ARG001
        state["v"] = t
        return t

    def z_hook(z, hook):  # noqa: ARG001
        v = state["v"]
        v_h = v[:, :, kv_head_index(head, n_heads, v.shape[2])]
        new_h = patch_components(clean_z[:, :, head].to(z.device), z[:, :, head], v_h, which, eps)
        if pos_mask is not None:
            new_h = torch.where(pos_mask.unsqueeze(-1), new_h, z[:, :, head])
        out = z.clone()
        out[:, :, head] = new_h
        return out

    return [(vs.v_hook, v_hook), (vs.z_hook, z_hook)]


def directional_patch(
    model,
    clean,
    corrupted,
    metric: Callable[[Float[Tensor, "batch pos vocab"]], Tensor | float],
    *,
    components: Sequence[str] = ("attn", "mlp", "value"),
    layers=None,
    heads=None,
    per_position: bool = False,
    attention_mask: Tensor | None = None,
    eps: float = DEFAULT_EPS,
    progress: bool = False,
) -> tuple[dict[str, dict[str, Tensor]], pd.DataFrame]:
    """Patch parallel-only, perpendicular-only and full updates from ``clean`` into ``corrupted``.

    For each component (``attn``, ``mlp``, ``block`` in residual space; ``value`` per
    head), layer (and head), and position (``per_position=True``) or all positions at
    once, run the corrupted input with that unit's update replaced by
    ``P_r u_c + (I - P_r) u_x`` (``par``), ``P_r u_x + (I - P_r) u_c`` (``perp``) or
    ``u_c`` (``full``), where ``r`` is the corrupted run's live reference (METHOD.md
    sec. 5) and, in value space, the head's own corrupted value vector ``v_t``.

    Args:
        clean, corrupted: inputs of identical token shape (strings or token tensors).
        metric: ``logits -> scalar`` (e.g. a logit difference).
        per_position: patch one position at a time (results gain a ``pos`` axis).

    Returns:
        ``(results, table)``: ``results[component][which]`` is a tensor shaped like
        TransformerLens patching results: ``[layer]`` / ``[layer, pos]`` for residual
        components, ``[layer, head]`` / ``[layer, pos, head]`` for ``value``; ``table``
        has one row per patch with ``metric``, plus the clean and corrupted baselines
        and ``par_plus_perp_minus_full`` (the interaction, reported not assumed zero).
    """
    sites = resolve_sites(model, warn=False)
    c_batch = prepare_inputs(model, clean, attention_mask, argument="clean")
    x_batch = prepare_inputs(model, corrupted, attention_mask, argument="corrupted")
    if c_batch.tokens.shape != x_batch.tokens.shape or not torch.equal(c_batch.attention_mask, x_batch.attention_mask):
        raise ValueError(
            f"clean and corrupted must have the same token shape and padding, got {tuple(c_batch.tokens.shape)} "
            f"and {tuple(x_batch.tokens.shape)}; pad or choose prompts of equal token length"
        )
    components = check_components(components, sites.components + ("value",), arch=sites.arch)
    layer_list = normalize_layers(layers, sites.n_layers)
    head_list = normalize_heads(heads, sites.n_heads) or list(range(sites.n_heads))
    device = device_of(model)
    ct, am = c_batch.tokens.to(device), c_batch.attention_mask.to(device)
    xt = x_batch.tokens.to(device)

    names = []
    for L in layer_list:
        for c in components:
            if c == "value":
                names.append(sites.value[L].z_hook)
            else:
                u = sites.units[c][L]
                names += [u.update_hook, u.reference_hook]
    # Each run's logits are reduced to the metric at once and dropped, so at most one
    # [batch, pos, vocab] tensor is alive at a time (large vocabularies: Gemma-3 has 262k).
    clean_logits, clean_cache = capture(model, ct, names, attention_mask=am, clone=True, logits=True)
    clean_metric = _scalar_metric(metric, clean_logits)
    del clean_logits
    with torch.no_grad():
        corrupted_metric = _scalar_metric(metric, model(xt, attention_mask=am))

    n_pos = ct.shape[1]
    positions = list(range(n_pos)) if per_position else [None]
    results: dict[str, dict[str, Tensor]] = {}
    rows = []
    work = [(c, L) for c in components for L in layer_list]
    iterator = work
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(work, desc="patch")
    for c, L in iterator:
        if c == "value":
            shape = (sites.n_layers, n_pos, sites.n_heads) if per_position else (sites.n_layers, sites.n_heads)
        else:
            shape = (sites.n_layers, n_pos) if per_position else (sites.n_layers,)
        res = results.setdefault(c, {w: torch.full(shape, float("nan")) for w in WHICH})
        for p in positions:
            pos_mask = None
            if p is not None:
                pos_mask = torch.zeros(ct.shape, dtype=torch.bool, device=device)
                pos_mask[:, p] = True
            for h in (head_list if c == "value" else [None]):
                values = {}
                for which in WHICH:
                    if c == "value":
                        hooks = _patch_value_hooks(sites.value[L], sites.n_heads, h, clean_cache[sites.value[L].z_hook],
                                                   which, pos_mask, eps)
                    else:
                        u = sites.units[c][L]
                        clean_u = clean_cache[u.update_hook]
                        if u.update_is_difference:
                            clean_u = clean_u - clean_cache[u.reference_hook]
                        hooks = _patch_residual_hooks(u, clean_u, which, pos_mask, eps)
                    with torch.no_grad():
                        values[which] = _scalar_metric(
                            metric, model.run_with_hooks(xt, attention_mask=am, fwd_hooks=hooks))
                idx = (L,) + ((p,) if p is not None else ()) + ((h,) if h is not None else ())
                for which, v in values.items():
                    res[which][idx] = v
                rows.append({
                    "component": c, "layer": L, "head": h, "position": p,
                    **{f"metric_{w}": values[w] for w in WHICH},
                    "effect_par": values["par"] - corrupted_metric,
                    "effect_perp": values["perp"] - corrupted_metric,
                    "effect_full": values["full"] - corrupted_metric,
                })
    table = _integer_columns(pd.DataFrame(rows), ("layer", "head", "position"))
    if not table.empty:
        table["par_plus_perp_minus_full"] = table["effect_par"] + table["effect_perp"] - table["effect_full"]
        table["clean_metric"] = clean_metric
        table["corrupted_metric"] = corrupted_metric
    return results, table


# ---------------------------------------------------------------------------
# split direct logit attribution
# ---------------------------------------------------------------------------


def _final_norm_linear(model, sites: ModelSites, x: Tensor, scale: Tensor) -> Tensor:
    """Apply the final norm *linearised* at the cached scale: centre (LayerNorm) and
    divide by the cached scale, then the norm's weight. Linear in ``x``, so the
    attribution of a sum is the sum of attributions."""
    norm_type = str(getattr(model.cfg, "normalization_type", "LN") or "LN")
    if norm_type.startswith("LN"):
        x = x - x.mean(-1, keepdim=True)
    x = x / scale
    w = final_norm_weight(model)
    return x * w if w is not None else x


def split_logit_attribution(
    model,
    inputs,
    answer_tokens: Int[Tensor, " batch"] | Sequence[int] | Sequence[str] | int | str,
    *,
    wrong_tokens: Int[Tensor, " batch"] | Sequence[int] | Sequence[str] | int | str | None = None,
    position: int = -1,
    eps: float = DEFAULT_EPS,
) -> pd.DataFrame:
    """Direct logit attribution of each head and sub-layer, split into parallel and
    perpendicular parts against the stream each writes into (METHOD.md sec. 2-3).

    The logit direction is ``W_U[:, answer] - W_U[:, wrong]`` (or ``W_U[:, answer]``),
    read at ``position`` (absolute, or -1 for each sequence's last real token); the
    final norm is linearised at the run's own scale (``ln_final.hook_scale``), so
    ``dla == dla_par + dla_perp`` exactly for every row. Heads' outputs are
    ``W_O[h]^T z_h`` (no bias) split against ``resid_pre``; sub-layers use their
    sites (attention update vs ``resid_pre``, MLP update vs its reference).

    ``answer_tokens`` / ``wrong_tokens``: one per sequence (or one for all), as token
    ids or single-token strings (``" light"``).

    Versus TransformerLens's ``cache.logit_attrs``: TL's applies the final norm's
    centring and scale but not its weight ``ln_final.w`` (it assumes the weight was
    folded into ``W_U``, as ``fold_ln`` does). The unprocessed models this library
    measures keep that weight, so here it is applied: ``dla`` equals TL's
    ``logit_attrs`` with the direction multiplied by ``ln_final.w``, and the rows
    (with the embedding and bias terms) add up to the true logit difference.

    On sandwich-norm models (Gemma-2/3, OLMo-2) a norm follows ``W_O``, so what a head adds
    to the stream is not ``W_O[h]^T z_h`` and per-head attributions are not defined: head rows
    carry NaN and ``table.attrs["notes"]`` says why; the ``attn`` / ``mlp`` rows (the normalised
    updates actually added) stay exact.

    Returns:
        A DataFrame with one row per (sequence, layer, unit): ``unit`` is ``"attn"``,
        ``"mlp"`` or ``"head"`` (with ``head``), and ``dla``, ``dla_par``, ``dla_perp``,
        ``par_frac`` of the written vector.
    """
    sites = resolve_sites(model, warn=False)
    if not sites.causal:
        raise ValueError("split_logit_attribution needs a causal LM with an unembedding")
    batch = prepare_inputs(model, inputs)
    device = device_of(model)
    tokens, am = batch.tokens.to(device), batch.attention_mask.to(device)
    answer = token_ids(model, answer_tokens, n=tokens.shape[0], argument="answer_tokens").to(device)
    W_U = model.W_U  # [d_model, vocab]
    direction = W_U[:, answer].T  # [batch, d_model]
    if wrong_tokens is not None:
        wrong = token_ids(model, wrong_tokens, n=tokens.shape[0], argument="wrong_tokens").to(device)
        direction = direction - W_U[:, wrong].T
    if position == -1:
        pos = am.long().cumsum(-1).argmax(-1)  # last real token (right or left padding)
    else:
        if not 0 <= position < tokens.shape[1]:
            raise ValueError(f"position {position} is outside 0..{tokens.shape[1] - 1} (or -1 for the last token)")
        pos = torch.full((tokens.shape[0],), position, device=device)
    rows_idx = torch.arange(tokens.shape[0], device=device)

    names = ["ln_final.hook_scale"]
    for L in range(sites.n_layers):
        names += [sites.value[L].z_hook, sites.value[L].resid_hook]
        for c in ("attn", "mlp"):
            u = sites.units[c][L]
            names += [u.update_hook, u.reference_hook]
    _, cache = capture(model, tokens, names, attention_mask=am, clone=True)
    scale = cache["ln_final.hook_scale"][rows_idx, pos]  # [batch, 1]

    def dla_of(vec: Tensor) -> Tensor:  # [batch, ..., d_model] -> [batch, ...]
        normed = _final_norm_linear(model, sites, vec, scale.view(-1, *([1] * (vec.ndim - 1))))
        return (normed * direction.view(direction.shape[0], *([1] * (vec.ndim - 2)), -1)).sum(-1)

    rows = []
    with torch.no_grad():
        for L in range(sites.n_layers):
            for c in ("attn", "mlp"):
                u = sites.units[c][L]
                upd = cache[u.update_hook][rows_idx, pos]
                ref = cache[u.reference_hook][rows_idx, pos]
                d = decompose(upd, ref, eps)
                total, par, perp = dla_of(upd.to(d.par.dtype)), dla_of(d.par), dla_of(d.perp)
                for b in range(tokens.shape[0]):
                    rows.append({"sequence": b, "layer": L, "unit": c, "head": None, "dla": float(total[b]),
                                 "dla_par": float(par[b]), "dla_perp": float(perp[b]), "par_frac": float(d.par_frac[b])})
            z = cache[sites.value[L].z_hook][rows_idx, pos]  # [batch, heads, d_head]
            x = cache[sites.value[L].resid_hook][rows_idx, pos]  # [batch, d_model]
            W_O = model.blocks[L].attn.W_O  # [heads, d_head, d_model]
            out = torch.einsum("bhe,hed->bhd", z, W_O)
            d = decompose(out, x.unsqueeze(1), eps)
            total, par, perp = dla_of(out.to(d.par.dtype)), dla_of(d.par), dla_of(d.perp)
            if not sites.factorization_applicable:  # W_O[h]^T z_h is not what the head adds
                total, par, perp = (torch.full_like(t, float("nan")) for t in (total, par, perp))
            for b in range(tokens.shape[0]):
                for h in range(sites.n_heads):
                    rows.append({"sequence": b, "layer": L, "unit": "head", "head": h, "dla": float(total[b, h]),
                                 "dla_par": float(par[b, h]), "dla_perp": float(perp[b, h]),
                                 "par_frac": float(d.par_frac[b, h]) if sites.factorization_applicable
                                 else float("nan")})
    table = _integer_columns(pd.DataFrame(rows), ("sequence", "layer", "head"))
    table.attrs["notes"] = [] if sites.factorization_applicable else [
        "sandwich-norm model: a norm follows W_O, so per-head DLA (W_O[h]^T z_h) is not what a head "
        "adds; head rows are NaN, the attn / mlp rows are exact."
    ]
    return table


def split_dla_figure(table: pd.DataFrame, sequence: int = 0):
    """Per-head ``dla_par`` and ``dla_perp`` of one sequence as plotly heatmaps, in a
    :class:`~tl_directional.views.PlotlyView` (like the other views: ``.figure``,
    ``.data`` = the rows shown, ``.save``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from .views import PlotlyView

    heads = table[(table["unit"] == "head") & (table["sequence"] == sequence)]
    if heads.empty:
        raise ValueError(f"table has no head rows for sequence={sequence}; pass split_logit_attribution's table")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("parallel part", "perpendicular part"), shared_yaxes=True)
    for col, key in enumerate(("dla_par", "dla_perp"), start=1):
        grid = heads.pivot(index="layer", columns="head", values=key)
        fig.add_trace(go.Heatmap(z=grid.values, x=list(grid.columns), y=list(grid.index), coloraxis="coloraxis"),
                      row=1, col=col)
    fig.update_layout(title="direct logit attribution per head, split", coloraxis={"colorscale": "RdBu", "cmid": 0},
                      template="plotly_white")
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(title_text="layer", col=1)
    return PlotlyView(fig, data=heads.reset_index(drop=True), name="split_dla")


__all__ = ["WHICH", "directional_patch", "split_dla_figure", "split_logit_attribution"]
