"""Views of one text (circuitsvis widgets and the triptych figure): the attention triptych,
coloured tokens, the top perpendicular tokens."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from ..core.components import check_components
from ..figures.base import (
    NEGATIVE_COLOR,
    POSITIVE_COLOR,
    CircuitsVisView,
    PlotlyView,
    plotly_api,
)
from ..measure import FACTORIZATION_METRICS
from ..model.inputs import prepare_inputs
from ..model.sites import resolve_sites
from .data import (
    check_layer_head,
    edited_patterns,
    one_sequence,
    str_tokens,
    token_profile,
    triptych_edits,
)

# ---------------------------------------------------------------------------------------------
# Running a model for the token- and pattern-level views
# ---------------------------------------------------------------------------------------------


def _patterns_frame(toks: list[str], pats: Mapping[str, np.ndarray], layer: int, head: int) -> pd.DataFrame:
    rows = []
    for name, p in pats.items():
        q, k = np.meshgrid(np.arange(p.shape[0]), np.arange(p.shape[1]), indexing="ij")
        rows.append(pd.DataFrame({"edit": name, "layer": layer, "head": head, "query": q.ravel(), "key": k.ravel(),
                                  "query_token": [toks[i] for i in q.ravel()], "key_token": [toks[j] for j in k.ravel()],
                                  "value": p.ravel()}))
    return pd.concat(rows, ignore_index=True)


def _diagonal_note(pats: Mapping[str, np.ndarray]) -> str:
    parts = []
    for name, p in pats.items():
        d = np.diag(p)
        n_neg = int((d < 0).sum())
        parts.append(f"{html.escape(name)}: diagonal min {d.min():.3g}, {n_neg} negative; row sums "
                     f"{p.sum(-1).min():.3g}..{p.sum(-1).max():.3g}")
    return "<br>".join(parts)


def attention_triptych(
    model,
    inputs,
    layer: int,
    head: int,
    *,
    s_par: float = 0.0,
    sequence: int = 0,
    max_tokens: int | None = 32,
    edits: Mapping[str, Sequence] | None = None,
) -> CircuitsVisView:
    """One head's attention pattern under baseline, hard diagonal removal and the V-Para
    effective diagonal (``A_tt += (s_par - 1) beta_t``), side by side in circuitsvis.

    Negative entries are shown honestly: all three panels share one symmetric colour
    scale ``[-m, m]`` (``m`` the largest ``|A_ts|``), blue positive, red negative
    (circuitsvis's ``AttentionPattern`` colours values below 0 with its negative colour;
    nothing is clipped to 0). The effective diagonal at ``s_par = 0`` is ``-gamma_t``,
    which can be negative; its rows do not sum to 1 and are not renormalised. The legend
    states each panel's smallest diagonal entry. :func:`attention_triptych_figure` is the
    same data as plotly heatmaps with a diverging scale and hover values.
    """
    layer, head = check_layer_head(resolve_sites(model, warn=False), layer, head)  # -1 = the last
    toks, pats = edited_patterns(model, inputs, layer, head, edits or triptych_edits(layer, head, s_par),
                                 sequence=sequence, max_tokens=max_tokens)
    causal = resolve_sites(model, warn=False).causal
    m = max(float(np.abs(p).max()) for p in pats.values()) or 1.0
    panels = [("AttentionPattern", {"tokens": toks, "attention": np.round(p, 5).tolist(), "minValue": -m, "maxValue": m,
                                    "negativeColor": NEGATIVE_COLOR, "positiveColor": POSITIVE_COLOR,
                                    "showAxisLabels": True, "maskUpperTri": causal}, name)
              for name, p in pats.items()]
    legend = (f"Shared colour scale [-{m:.3g}, {m:.3g}]: <span style='color:{POSITIVE_COLOR}'>blue positive</span>, "
              f"<span style='color:{NEGATIVE_COLOR}'>red negative</span>; rows are queries, columns keys.<br>"
              + _diagonal_note(pats))
    return CircuitsVisView(panels, title=f"Attention of L{layer}H{head} under each edit", data=_patterns_frame(toks, pats, layer, head),
                           legend_html=legend, name="triptych")


def attention_triptych_figure(
    model,
    inputs,
    layer: int,
    head: int,
    *,
    s_par: float = 0.0,
    sequence: int = 0,
    max_tokens: int | None = 32,
    edits: Mapping[str, Sequence] | None = None,
) -> PlotlyView:
    """:func:`attention_triptych` as plotly heatmaps: one diverging scale (``RdBu``, centred
    on 0) shared by the panels, so the effective diagonal's negative entries show as red."""
    go, make_subplots = plotly_api()
    layer, head = check_layer_head(resolve_sites(model, warn=False), layer, head)  # -1 = the last
    toks, pats = edited_patterns(model, inputs, layer, head, edits or triptych_edits(layer, head, s_par),
                                 sequence=sequence, max_tokens=max_tokens)
    m = max(float(np.abs(p).max()) for p in pats.values()) or 1.0
    labels = [f"{i}:{t!r}"[:24] for i, t in enumerate(toks)]
    fig = make_subplots(rows=1, cols=len(pats), subplot_titles=list(pats), horizontal_spacing=0.04, shared_yaxes=True)
    for i, (_, p) in enumerate(pats.items(), start=1):
        fig.add_trace(go.Heatmap(z=p, x=labels, y=labels, colorscale="RdBu", zmid=0.0, zmin=-m, zmax=m,
                                 showscale=i == len(pats), colorbar={"thickness": 10},
                                 hovertemplate="query %{y}<br>key %{x}<br>A %{z:.4f}<extra></extra>"), row=1, col=i)
        fig.update_xaxes(showticklabels=len(toks) <= 24, tickangle=-60, tickfont={"size": 8},
                         title_text="key position", row=1, col=i)
    fig.update_yaxes(autorange="reversed", tickfont={"size": 8}, showticklabels=len(toks) <= 24)
    fig.update_yaxes(title_text="query position", row=1, col=1)
    fig.update_layout(title=f"Attention of L{layer}H{head}: baseline / hard removal / effective diagonal "
                      f"(shared scale [-{m:.3g}, {m:.3g}], red = negative)", template="plotly_white", height=480)
    return PlotlyView(fig, data=_patterns_frame(toks, pats, layer, head), name="triptych_heatmap")


_TOKEN_METRICS = {"par_frac": (0.0, 1.0), "par_perp_ratio": None, "alpha": "signed", "rel_update": None}
_VALUE_TOKEN_METRICS = {"beta": "signed", "A_tt": (0.0, 1.0), "gamma": "signed", "phi": "signed", "alpha_head": "signed"}


def _token_profile(model, tokens, component: str, profile=None):
    if profile is not None:
        if profile.tokens is None:
            raise ValueError("profile has no per-token tables; compute it with per_token=True")
        return profile
    return token_profile(model, tokens, (component,))


def _token_values(prof, layer: int, component: str, metric: str, head: int | None, sequence: int) -> np.ndarray:
    if component == "value":
        if metric not in _VALUE_TOKEN_METRICS:
            raise ValueError(f"metric {metric!r} is not per-token in value space; choose from {list(_VALUE_TOKEN_METRICS)}")
        if head is None:
            raise ValueError("component='value' needs head=")
        t = prof.value_tokens
        part = t[(t["layer"] == layer) & (t["head"] == head) & (t["sequence"] == sequence)]
    else:
        if metric not in _TOKEN_METRICS:
            raise ValueError(f"metric {metric!r} is not per-token in residual space; choose from {list(_TOKEN_METRICS)}")
        t = prof.tokens
        part = t[(t["layer"] == layer) & (t["component"] == component) & (t["sequence"] == sequence)]
    if part.empty:
        raise ValueError(f"no per-token rows for layer {layer}, component {component!r}, sequence {sequence}")
    return part.sort_values("position")[metric].to_numpy(dtype=np.float64)


def _value_range(metric: str, values: np.ndarray, table: dict) -> tuple[float, float]:
    spec = table.get(metric)
    finite = values[np.isfinite(values)]
    top = float(np.abs(finite).max()) if finite.size else 1.0
    if isinstance(spec, tuple):
        return spec
    if spec == "signed":
        return -(top or 1.0), top or 1.0
    return 0.0, top or 1.0


def colored_tokens(
    model,
    inputs,
    layer: int,
    component: str = "attn",
    metric: str = "par_frac",
    *,
    head: int | None = None,
    sequence: int = 0,
    max_tokens: int | None = 256,
    profile=None,
) -> CircuitsVisView:
    """Tokens of one text coloured by a per-token quantity of one layer's update.

    Residual space (``component`` ``attn``/``mlp``/``block``): ``par_frac``,
    ``par_perp_ratio``, ``alpha``, ``rel_update``. Value space (``component="value"``,
    with ``head``): ``beta``, ``A_tt``, ``gamma``, ``phi``, ``alpha_head``. Signed
    quantities use a symmetric red/blue scale; ``par_frac`` runs 0..1. Non-finite values
    (degenerate tokens, METHOD sec. 1) are shown as 0 and counted in ``data``.
    Pass ``profile`` (computed with ``per_token=True`` on the same single sequence) to
    skip the forward pass.
    """
    sites = resolve_sites(model, warn=False)
    layer, head = check_layer_head(sites, layer, head)
    if component == "value" and metric in FACTORIZATION_METRICS and not sites.factorization_applicable:
        raise ValueError(
            f"metric={metric!r} is not defined on this sandwich-norm model ({sites.model_name}): a "
            "norm follows W_O, so the METHOD sec. 3 factorization does not apply. Use 'beta', "
            "'A_tt' or 'gamma'."
        )
    tokens = one_sequence(model, inputs, sequence, max_tokens)
    prof = _token_profile(model, tokens, component, profile)
    values = _token_values(prof, layer, component, metric, head, 0 if profile is None else sequence)
    toks = str_tokens(model, tokens[0])[: len(values)]
    values = values[: len(toks)]
    lo, hi = _value_range(metric, values, _VALUE_TOKEN_METRICS if component == "value" else _TOKEN_METRICS)
    shown = np.where(np.isfinite(values), values, 0.0)
    where = f"L{layer} {component}" + (f" H{head}" if head is not None else "")
    data = pd.DataFrame({"position": range(len(toks)), "token": toks, "layer": layer, "component": component,
                         "head": head, "metric": metric, "value": values, "finite": np.isfinite(values)})
    props = {"tokens": toks, "values": np.round(shown, 5).tolist(), "minValue": lo, "maxValue": hi,
             "negativeColor": NEGATIVE_COLOR, "positiveColor": POSITIVE_COLOR}
    n_bad = int((~np.isfinite(values)).sum())
    legend = f"{html.escape(metric)} at {where}, colour scale [{lo:.3g}, {hi:.3g}]" + (
        f"; {n_bad} non-finite value(s) shown as 0" if n_bad else "") + "; hover a token for its value."
    return CircuitsVisView([("ColoredTokens", props, "")], title=f"Tokens coloured by {metric} ({where})",
                           data=data, legend_html=legend, name=f"tokens_{metric}")


def colored_tokens_multi(
    model,
    inputs,
    layer: int,
    components: Sequence[str] = ("attn", "mlp", "block"),
    metrics: Sequence[str] = ("par_frac", "alpha"),
    *,
    sequence: int = 0,
    max_tokens: int | None = 256,
    profile=None,
) -> CircuitsVisView:
    """Tokens with several per-token quantities of one layer (every ``component x metric``);
    hover or click a label to colour by it (circuitsvis ``ColoredTokensMulti``)."""
    sites = resolve_sites(model, warn=False)
    layer, _ = check_layer_head(sites, layer, None)
    components = list(check_components(components, sites.components, allowed=sites.components,
                                       arch=sites.arch))
    tokens = one_sequence(model, inputs, sequence, max_tokens)
    if profile is None:
        profile = token_profile(model, tokens, components)
        sequence = 0
    cols, labels = [], []
    for c in components:
        for m in metrics:
            cols.append(_token_values(profile, layer, c, m, None, sequence))
            labels.append(f"{c} {m}")
    n = min(len(v) for v in cols)
    values = np.stack([v[:n] for v in cols], axis=1)
    toks = str_tokens(model, tokens[0])[:n]
    values = values[: len(toks)]
    data = pd.DataFrame(values, columns=labels)
    data.insert(0, "token", toks)
    data.insert(0, "position", range(len(toks)))
    props = {"tokens": toks, "values": np.round(np.where(np.isfinite(values), values, 0.0), 5).tolist(), "labels": labels}
    return CircuitsVisView([("ColoredTokensMulti", props, "")], title=f"Per-token geometry at layer {layer}",
                           data=data, legend_html="Hover a label to colour the tokens by it; hover a token for all values.",
                           name="tokens_multi")


def perpendicular_size(tokens_table: pd.DataFrame) -> pd.Series:
    """``||u_perp|| / ||r||`` per token from a per-token residual table:
    ``rel_update * sqrt(1 - par_frac^2)`` (NaN where the reference vanishes)."""
    rel = tokens_table["rel_update"].to_numpy(dtype=np.float64)
    pf = np.clip(tokens_table["par_frac"].to_numpy(dtype=np.float64), 0.0, 1.0)
    out = rel * np.sqrt(1.0 - pf ** 2)
    return pd.Series(np.where(np.isfinite(out), out, np.nan), index=tokens_table.index, name="perp_rel")


#: Quantile of the values that maps to full colour in :func:`top_perpendicular_tokens`.
COLOR_QUANTILE = 0.99


def top_perpendicular_tokens(
    model,
    inputs,
    k: int = 10,
    *,
    components: Sequence[str] | None = None,
    max_sequences: int = 8,
    max_tokens: int | None = 128,
    profile=None,
) -> CircuitsVisView:
    """Top-k tokens by perpendicular update size ``||u_perp|| / ||r||`` (how far each
    update turns the stream, relative to the stream), per layer and component, in
    circuitsvis's ``TopkTokens`` table (choose the sample and layer in the widget;
    columns are components in the order of the legend).

    ``data`` holds the top ``k`` tokens over all sequences per (layer, component), with
    ``perp_rel``, ``par_frac`` and ``rel_update``. Cells show ``perp_rel`` divided by its
    99th percentile over the table (``COLOR_QUANTILE``), clipped to the widget's 0..1, so
    that one outlier does not wash out every other colour; the legend states the
    scale and how many values were clipped. Ranks use the unclipped values.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    sites = resolve_sites(model, warn=False)
    comps = list(check_components(components, sites.components, allowed=sites.components, arch=sites.arch))
    batch = prepare_inputs(model, inputs)
    n_seq = min(len(batch), max_sequences)
    seqs = [one_sequence(model, batch, i, max_tokens)[0] for i in range(n_seq)]
    if profile is None:
        profile = token_profile(model, seqs, comps)
    t = profile.tokens
    t = t[t["component"].isin(comps) & (t["sequence"] < n_seq)].copy()
    t["perp_rel"] = perpendicular_size(t)
    toks = [str_tokens(model, s) for s in seqs]
    t = t[t["position"] < t["sequence"].map(lambda i: len(toks[i]))]
    t["token"] = [toks[s][p] for s, p in zip(t["sequence"], t["position"], strict=True)]
    top = (t.sort_values("perp_rel", ascending=False, na_position="last")
           .groupby(["layer", "component"], sort=True).head(k)
           .sort_values(["layer", "component", "perp_rel"], ascending=[True, True, False]))
    top.insert(2, "rank", top.groupby(["layer", "component"]).cumcount() + 1)
    top = top[["layer", "component", "rank", "sequence", "position", "token", "perp_rel", "par_frac", "rel_update"]]
    # Colour scale: the 99th percentile of the finite values, not the maximum, so one outlier
    # (a BOS or a tiny-norm stream) does not leave every other cell uncoloured.
    finite = t["perp_rel"].to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    top_value = float(finite.max()) if finite.size else 1.0
    scale = float(np.quantile(finite, COLOR_QUANTILE)) if finite.size else 1.0
    scale = scale or top_value or 1.0
    n_clipped = int((finite > scale).sum())
    kk = min(k, min(len(s) for s in toks))
    topk_vals, topk_idx, bot_vals, bot_idx = [], [], [], []
    for i, s_toks in enumerate(toks):
        acts = np.zeros((sites.n_layers, len(s_toks), len(comps)))
        part = t[t["sequence"] == i]
        ci = {c: j for j, c in enumerate(comps)}
        for L, c, p, v in zip(part["layer"], part["component"], part["position"], part["perp_rel"], strict=True):
            acts[int(L), int(p), ci[c]] = 0.0 if not np.isfinite(v) else v / scale
        raw = torch.from_numpy(acts)
        _, ti = raw.topk(kk, dim=1)  # ranks from the raw values, colours clipped to the widget's 0..1
        _, bi = raw.topk(kk, dim=1, largest=False)
        a = raw.clamp(max=1.0)
        tv, bv = a.gather(1, ti), a.gather(1, bi)
        topk_vals.append(np.round(tv.numpy(), 5).tolist())
        topk_idx.append(ti.tolist())
        bot_vals.append(np.round(bv.flip(1).numpy(), 5).tolist())
        bot_idx.append(bi.flip(1).tolist())
    props = {"tokens": toks, "topkVals": topk_vals, "topkIdxs": topk_idx, "bottomkVals": bot_vals,
             "bottomkIdxs": bot_idx, "firstDimensionName": "Layer",
             "thirdDimensionName": "Component (" + ", ".join(f"{j}={c}" for j, c in enumerate(comps)) + ")",
             "sampleLabels": [f"sequence {i}" for i in range(n_seq)],
             "firstDimensionLabels": [f"layer {L}" for L in range(sites.n_layers)]}
    legend = (f"||u_perp|| / ||r|| per token, shown relative to the {COLOR_QUANTILE:.0%} quantile of all values "
              f"({scale:.3g} = 1.0; the largest is {top_value:.3g}); {n_clipped} value(s) above it are shown as 1.0 "
              "(full colour; their true values are in the CSV / .data). Columns: "
              + ", ".join(f"{j} = {c}" for j, c in enumerate(comps)) + ".")
    return CircuitsVisView([("TopkTokens", props, "")], title=f"Top-{k} tokens by perpendicular update size",
                           data=top.reset_index(drop=True), legend_html=legend, name="top_perpendicular")
