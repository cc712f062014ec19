"""Plotly views: tables in, figure out (depth profile, head maps, sweep curves, compression
errors, training curves)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

from .base import (
    COMPONENT_COLORS,
    PlotlyView,
    _require,
    _residual_table,
    _value_table,
    plotly_api,
)

# ---------------------------------------------------------------------------------------------
# Plotly views
# ---------------------------------------------------------------------------------------------

_METRIC_LABELS = {
    "par_frac": "par_frac = ||u_par|| / ||u||",
    "par_perp_ratio": "par_perp_ratio = ||u_par|| / ||u_perp||",
    "alpha": "alpha = (u . r) / ||r||^2",
    "rel_update": "rel_update = ||u|| / ||r||",
    "energy_ratio": "energy ratio sqrt(sum ||u_par||^2 / sum ||u_perp||^2)",
}


def depth_profile(
    profile,
    metrics: str | Sequence[str] = ("par_frac", "par_perp_ratio"),
    *,
    components: Sequence[str] | None = None,
    bands: bool = True,
    log_ratio: bool = True,
    title: str | None = None,
) -> PlotlyView:
    """Per-layer depth profile: median of each metric per component with quantile bands.

    Args:
        profile: a :class:`~tl_directional.measure.Profile` or its ``residual`` table:
            columns ``layer``, ``component`` and, per metric, ``<metric>_median``,
            ``_q25``, ``_q75``, ``_q05``, ``_q95`` (``energy_ratio`` is a single column).
        metrics: ``par_frac``, ``par_perp_ratio``, ``alpha``, ``rel_update`` or
            ``energy_ratio``; one row of the figure each.
        components: which of ``attn``, ``mlp``, ``block`` (default: all in the table).
        bands: shade the 25-75% (darker) and 5-95% (lighter) per-token quantiles.
        log_ratio: log y axis for ``par_perp_ratio`` and ``energy_ratio``.
    """
    go, make_subplots = plotly_api()
    df = _residual_table(profile)
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    for m in metrics:
        if m not in _METRIC_LABELS:
            raise ValueError(f"metrics has {m!r}; choose from {list(_METRIC_LABELS)}")
        _require(df, ["energy_ratio"] if m == "energy_ratio" else [f"{m}_median"], "the residual table")
    comps = list(components) if components is not None else [c for c in ("attn", "mlp", "block") if c in set(df["component"])]
    unknown = [c for c in comps if c not in set(df["component"])]
    if unknown:
        raise ValueError(f"components {unknown} are not in the table (it has {sorted(set(df['component']))})")
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[_METRIC_LABELS[m] for m in metrics])
    rows = []
    for i, m in enumerate(metrics, start=1):
        for comp in comps:
            part = df[df["component"] == comp].sort_values("layer")
            color = COMPONENT_COLORS.get(comp, "#555")
            x = part["layer"].tolist()
            ycol = "energy_ratio" if m == "energy_ratio" else f"{m}_median"
            if bands and m != "energy_ratio":
                for lo, hi, op in (("q05", "q95", 0.10), ("q25", "q75", 0.22)):
                    if f"{m}_{lo}" in part and f"{m}_{hi}" in part:
                        fig.add_trace(go.Scatter(
                            x=x + x[::-1], y=part[f"{m}_{hi}"].tolist() + part[f"{m}_{lo}"].tolist()[::-1],
                            mode="lines", fill="toself", fillcolor=_rgba(color, op), line={"width": 0}, hoverinfo="skip",
                            showlegend=False, legendgroup=comp, name=f"{comp} {lo}-{hi}"), row=i, col=1)
            fig.add_trace(go.Scatter(
                x=x, y=part[ycol], mode="lines+markers", name=comp, legendgroup=comp, showlegend=i == 1,
                line={"color": color}, hovertemplate=f"{comp} layer %{{x}}<br>{ycol} %{{y:.4g}}<extra></extra>"),
                row=i, col=1)
            for _, r in part.iterrows():
                row = {"metric": m, "component": comp, "layer": int(r["layer"]), "value": float(r[ycol])}
                if m != "energy_ratio":
                    for q in ("q05", "q25", "q75", "q95"):
                        if f"{m}_{q}" in part:
                            row[q] = float(r[f"{m}_{q}"])
                rows.append(row)
        if m in ("par_perp_ratio", "energy_ratio") and log_ratio:
            fig.update_yaxes(type="log", dtick=1, row=i, col=1)
        if m == "par_frac":
            fig.update_yaxes(range=[0, 1], row=i, col=1)
    fig.update_xaxes(title_text="layer", dtick=1, row=len(metrics), col=1)
    note = " (median per token; bands: 25-75% and 5-95%)" if bands else " (median per token)"
    fig.update_layout(title=title or f"Depth profile{note}", template="plotly_white",
                      height=300 * len(metrics) + 80, legend_title="component", margin={"t": 80})
    return PlotlyView(fig, data=pd.DataFrame(rows), name="depth_profile")


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


_SIGNED_VALUE = {"beta", "gamma", "phi", "alpha_head", "self_term", "cross_term"}
_VALUE_LABELS = {
    "beta": "beta = A_tt + gamma",
    "A_tt": "A_tt (self attention)",
    "gamma": "gamma (cross part along v_t)",
    "phi": "phi (value self-alignment)",
    "alpha_head": "alpha per head",
    "energy_ratio_full": "energy ratio o_t vs v_t",
}


def head_heatmaps(
    profile,
    metrics: str | Sequence[str] = ("beta", "A_tt", "phi"),
    *,
    stat: str = "mean",
    title: str | None = None,
) -> PlotlyView:
    """Per-head value-space heatmaps (layer x head), one panel per metric.

    Args:
        profile: a Profile or its ``value`` table: columns ``layer``, ``head`` and
            ``<metric>_<stat>`` (e.g. ``beta_mean``, ``A_tt_median``); ``energy_ratio_full``
            and ``energy_ratio_exclusive`` are single columns.
        metrics: any of ``beta``, ``A_tt``, ``gamma``, ``phi``, ``alpha_head``,
            ``self_term``, ``cross_term``, ``par_frac_full``, ``energy_ratio_full``, ...
        stat: ``mean``, ``median``, ``q05`` ... (the column suffix).

    Signed metrics use a diverging scale centred on 0 (red negative, blue positive).
    """
    go, make_subplots = plotly_api()
    df = _value_table(profile)
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    cols = [m if m.startswith("energy_ratio") else f"{m}_{stat}" for m in metrics]
    _require(df, cols, "the value table")
    n_layers = int(df["layer"].max()) + 1
    n_heads = int(df["head"].max()) + 1
    fig = make_subplots(rows=1, cols=len(metrics), horizontal_spacing=0.09,
                        subplot_titles=[f"{_VALUE_LABELS.get(m, m)} ({stat})" if c != m else _VALUE_LABELS.get(m, m)
                                        for m, c in zip(metrics, cols, strict=True)])
    rows = []
    for i, (m, col) in enumerate(zip(metrics, cols, strict=True)):
        grid = np.full((n_layers, n_heads), np.nan)
        for _, r in df.iterrows():
            grid[int(r["layer"]), int(r["head"])] = r[col]
            rows.append({"metric": col, "layer": int(r["layer"]), "head": int(r["head"]), "value": float(r[col])})
        finite = grid[np.isfinite(grid)]
        domain_end = fig.layout[f"xaxis{i + 1 if i else ''}"].domain[1]
        cbar = {"x": domain_end + 0.008, "xanchor": "left", "len": 0.85, "thickness": 10}
        if m in _SIGNED_VALUE:
            lim = float(np.abs(finite).max()) if finite.size else 1.0
            lim = lim or 1.0
            scale = {"colorscale": "RdBu", "zmid": 0.0, "zmin": -lim, "zmax": lim}
        else:
            scale = {"colorscale": "Viridis"}
        fig.add_trace(go.Heatmap(
            z=grid, x=list(range(n_heads)), y=list(range(n_layers)), colorbar=cbar, **scale,
            hovertemplate=f"layer %{{y}} head %{{x}}<br>{col} %{{z:.4g}}<extra></extra>"), row=1, col=i + 1)
        fig.update_xaxes(title_text="head", dtick=1, row=1, col=i + 1)
        fig.update_yaxes(title_text="layer" if i == 0 else None, dtick=1, autorange="reversed", row=1, col=i + 1)
        if not finite.size:  # e.g. phi on a sandwich-norm model (NaN by design, METHOD sec. 3)
            fig.layout.annotations[i].text += " (not applicable: all NaN)"
    fig.update_layout(title=title or "Value space per head (METHOD sec. 3)", template="plotly_white",
                      height=max(320, 40 * n_layers + 200), width=None, margin={"t": 90})
    return PlotlyView(fig, data=pd.DataFrame(rows), name="head_heatmaps")


def sweep_curves(results: pd.DataFrame, *, x: str = "s_par", y: str = "delta_ppl", title: str | None = None,
                 unscaled: Collection[str] = ()) -> PlotlyView:
    """Component-scaling curves: ``y`` (default delta perplexity) against ``x`` per edit space.

    Args:
        results: the table :func:`~tl_directional.evaluate.sweeps.runner.sweep` returns: columns ``space``,
            ``layers``, ``x`` and ``y`` (rows with ``space == "baseline"`` are skipped).
        unscaled: the spaces without a scale, drawn as dashed horizontal lines
            (:func:`tl_directional.views.sweep_curves` passes those of ``EDIT_SPACES``: ``hard-diag``).
    """
    go, _ = plotly_api()
    _require(results, ["space", x, y], "the sweep table")
    df = results[results["space"] != "baseline"].copy()
    if "layers" not in df:
        df["layers"] = "all"
    fig = go.Figure()
    for (space, layers), part in df.groupby(["space", "layers"], sort=False):
        name = space if layers == "all" else f"{space} L={layers}"
        if space in unscaled:  # hard-diag: no scale axis
            for v in part[y]:
                fig.add_hline(y=float(v), line_dash="dash", line_color="#7f7f7f",
                              annotation_text=f"{name}: {float(v):.3g}", annotation_position="top left")
            continue
        part = part.sort_values(x)
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=name,
                                 hovertemplate=f"{name}<br>{x} %{{x}}<br>{y} %{{y:.4g}}<extra></extra>"))
    fig.add_hline(y=0.0, line_dash="dot", line_color="#bbbbbb")
    if x in ("s_par", "s_perp"):
        fig.add_vline(x=1.0, line_dash="dot", line_color="#bbbbbb")
    fig.update_layout(title=title or f"{y} vs {x} per edit space (1 = unedited)", xaxis_title=x, yaxis_title=y,
                      template="plotly_white", legend_title="space", height=450)
    keep = [c for c in ("space", "layers", "s_par", "s_perp", "label", "tokens", "loss", "delta_loss", "ppl",
                        "delta_ppl", "kl", "top1_agree") if c in results.columns]
    return PlotlyView(fig, data=results[keep].reset_index(drop=True), name="sweep")


def _method_column(df: pd.DataFrame, by: str | None) -> str | None:
    if by is not None:
        _require(df, [by], "the compression table")
        return by
    for c in ("method", "compressed", "spec", "setting"):
        if c in df.columns:
            return c
    return None


def compression_errors(
    table: pd.DataFrame,
    metrics: str | Sequence[str] = ("err_perp_energy", "err_par_energy"),
    *,
    by: str | None = None,
    units: Sequence[str] | None = None,
    title: str | None = None,
) -> PlotlyView:
    """Compression error per layer per method, one panel per unit.

    Args:
        table: one row per (method, layer, unit), e.g. what
            ``compression_geometry(dense, {"rtn4": ..., "wanda50": ...})`` returns. Columns:
            ``layer``; ``unit`` (``attn``/``mlp``/``block``; optional); the method column
            (``by``, default the first of ``method``, ``compressed``, ``spec``, ``setting``;
            without one, the table is a single method); the metric columns; optionally
            ``by_construction_parallel`` (layer drop: drawn with an ``x`` marker, since its
            error is parallel by construction, METHOD sec. 6).
        metrics: metric columns; the first is drawn solid, the next dashed, then dotted
            (default: perpendicular vs parallel error energy over the dense update).
    """
    go, make_subplots = plotly_api()
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    _require(table, ["layer", *metrics], "the compression table")
    df = table.copy()
    if "unit" not in df:
        df["unit"] = "all"
    method_col = _method_column(df, by)
    if method_col is None:
        method_col = "method"
        df[method_col] = "compressed"
    unit_list = list(units) if units is not None else [u for u in ("attn", "mlp", "block", "all") if u in set(df["unit"])]
    fig = make_subplots(rows=1, cols=len(unit_list), shared_yaxes=True, subplot_titles=unit_list,
                        horizontal_spacing=0.05)
    dashes = ["solid", "dash", "dot", "dashdot"]
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
               "#ff7f0e"]
    methods = list(dict.fromkeys(df[method_col].tolist()))
    for j, unit in enumerate(unit_list, start=1):
        for k, meth in enumerate(methods):
            part = df[(df["unit"] == unit) & (df[method_col] == meth)].sort_values("layer")
            if part.empty:
                continue
            symbols = ["x" if bool(v) else "circle" for v in part.get("by_construction_parallel", [False] * len(part))]
            for d, m in enumerate(metrics):
                fig.add_trace(go.Scatter(
                    x=part["layer"], y=part[m], mode="lines+markers", name=f"{meth}: {m}",
                    legendgroup=f"{meth}: {m}", showlegend=j == 1,
                    line={"color": palette[k % len(palette)], "dash": dashes[d % len(dashes)]},
                    marker={"symbol": symbols, "size": 8},
                    hovertemplate=f"{meth} {unit} layer %{{x}}<br>{m} %{{y:.4g}}<extra></extra>"), row=1, col=j)
        fig.update_xaxes(title_text="layer", dtick=1, row=1, col=j)
    fig.update_yaxes(title_text=metrics[0] if len(metrics) == 1 else "error / ||dense update||", row=1, col=1)
    fig.update_layout(title=title or "Compression error per layer (solid: " + metrics[0]
                      + (", dashed: " + metrics[1] if len(metrics) > 1 else "") + "; x marks: parallel by construction)",
                      template="plotly_white", height=450, legend_title="method: metric")
    keep = [c for c in [method_col, "layer", "unit", *metrics, "by_construction_parallel"] if c in df.columns]
    return PlotlyView(fig, data=df[keep].reset_index(drop=True), name="compression_errors")


def training_curves(
    metrics: pd.DataFrame | Sequence[pd.DataFrame],
    y: str = "val_loss",
    *,
    x: str = "step",
    by: str = "variant",
    seed: str = "seed",
    band: str = "minmax",
    title: str | None = None,
) -> PlotlyView:
    """Training curves per variant: mean over seeds with a spread band.

    Args:
        metrics: one table (or several, concatenated) with one row per logged step and
            columns ``x`` (``step``; or ``tokens``), ``y`` (``val_loss`` or ``train_loss``;
            rows where it is missing are skipped), ``by`` (``variant``, e.g. ``baseline``,
            ``vpara``, ``attn-para``) and optionally ``seed``: the columns of a training
            run's ``metrics.csv``.
        band: ``"minmax"`` (across seeds), ``"std"`` (mean +- one standard deviation) or
            ``"none"``; only drawn where a variant has several seeds.
    """
    go, _ = plotly_api()
    if not isinstance(metrics, pd.DataFrame):
        metrics = pd.concat(list(metrics), ignore_index=True)
    _require(metrics, [x, y], "the training metrics table")
    if band not in ("minmax", "std", "none"):
        raise ValueError(f"band must be 'minmax', 'std' or 'none', got {band!r}")
    df = metrics.dropna(subset=[y]).copy()
    if by not in df:
        df[by] = "run"
    if seed not in df:
        df[seed] = 0
    fig = go.Figure()
    palette = {"baseline": "#444444", "vpara": "#1f77b4", "attn-para": "#d62728"}
    extra = ["#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    rows = []
    for k, (variant, part) in enumerate(df.groupby(by, sort=False)):
        color = palette.get(str(variant), extra[k % len(extra)])
        g = part.groupby(x)[y]
        stats = pd.DataFrame({"mean": g.mean(), "min": g.min(), "max": g.max(), "std": g.std(ddof=0),
                              "n_seeds": g.count()}).reset_index()
        xs = stats[x].tolist()
        if band != "none" and part[seed].nunique() > 1:
            lo = stats["min"] if band == "minmax" else stats["mean"] - stats["std"]
            hi = stats["max"] if band == "minmax" else stats["mean"] + stats["std"]
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=hi.tolist() + lo.tolist()[::-1], mode="lines", fill="toself",
                                     fillcolor=_rgba(color, 0.18), line={"width": 0}, hoverinfo="skip",
                                     showlegend=False, legendgroup=str(variant)))
        n = int(part[seed].nunique())
        fig.add_trace(go.Scatter(x=xs, y=stats["mean"], mode="lines+markers", name=f"{variant} ({n} seed{'s' * (n > 1)})",
                                 legendgroup=str(variant), line={"color": color},
                                 hovertemplate=f"{variant}<br>{x} %{{x}}<br>{y} %{{y:.4g}}<extra></extra>"))
        stats.insert(0, by, variant)
        rows.append(stats)
    spread = {"minmax": "band: min-max over seeds", "std": "band: +-1 std over seeds", "none": ""}[band]
    fig.update_layout(title=title or f"{y} per variant (mean over seeds{'; ' + spread if spread else ''})",
                      xaxis_title=x, yaxis_title=y, template="plotly_white", height=450, legend_title=by)
    return PlotlyView(fig, data=pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(),
                      name="training_curves")
