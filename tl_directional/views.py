"""Views: plotly figures and circuitsvis widgets of the geometry, all offline.

Every view function returns a :class:`View`: it displays itself in a notebook,
``view.save("x.html")`` writes a self-contained page (``.csv`` writes the numbers
behind it, ``.json`` a plotly figure's JSON), ``view.data`` is that table, and
:class:`~tl_directional.page.Report` puts several views on one page.
The model runs behind the views of one text live in :mod:`tl_directional.views_data`.

Offline by construction:

* plotly figures are rendered with ``include_plotlyjs=False`` and plotly.js is
  inlined by the page (once per report; once per output in a notebook, because
  notebook front ends such as Colab isolate each output in its own frame);
* circuitsvis views are rendered from circuitsvis's bundled ``iife.js`` (inlined
  the same way) and never through ``RenderedHTML``: its ``str()`` loads the
  bundle from a CDN and its ``_repr_html_`` contacts google.com on every display.

Plotly views (tables in, figure out; the frames' columns are documented per function):
:func:`depth_profile`, :func:`head_heatmaps`, :func:`sweep_curves`,
:func:`compression_errors`, :func:`training_curves`, :func:`attention_triptych_figure`.

circuitsvis views (run the model on a short text): :func:`attention_triptych`,
:func:`colored_tokens`, :func:`colored_tokens_multi`, :func:`top_perpendicular_tokens`.
"""

from __future__ import annotations

import html
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from .components import check_components
from .edit import EDIT_SPACES
from .inputs import prepare_inputs
from .measure import FACTORIZATION_METRICS
from .page import Report, circuitsvis_js, library_script, plotly_js
from .sites import resolve_sites
from .views_data import (
    check_layer_head,
    edited_patterns,
    one_sequence,
    str_tokens,
    token_profile,
    triptych_edits,
)

COMPONENT_COLORS = {"attn": "#1f77b4", "mlp": "#ff7f0e", "block": "#2ca02c"}
# Diverging colours for signed quantities: negative red, positive blue (as circuitsvis).
NEGATIVE_COLOR = "#c0392b"
POSITIVE_COLOR = "#1f4e9e"


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>`` (no ``</``, no ``<!--``) and has no NaN/inf."""
    text = json.dumps(_finite(obj), allow_nan=False, separators=(",", ":"))
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        return _finite(np.asarray(obj.tolist() if isinstance(obj, torch.Tensor) else obj).tolist())
    if isinstance(obj, np.generic):
        return _finite(obj.item())
    return obj


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------------------------------
# View objects
# ---------------------------------------------------------------------------------------------


class View:
    """A figure or widget that shows itself in a notebook and saves itself.

    Attributes:
        title: the view's title (also the report section heading).
        data: the numbers behind the view, as one long table (what ``save("x.csv")`` writes).
        libraries: the JavaScript libraries the view needs (``"plotly"``, ``"circuitsvis"``).
        caption: an optional explanatory line shown under the view in reports.
        name: a short stem for file names (the view function's name by default).
    """

    libraries: tuple[str, ...] = ()

    def __init__(self, title: str, data: pd.DataFrame | None = None, caption: str = "", name: str = ""):
        self.title = title
        self.data = data if data is not None else pd.DataFrame()
        self.caption = caption
        self.name = name  # short file-name stem (e.g. "depth_profile"); reports name CSVs after it

    def body_html(self, *, titled: bool = True) -> str:
        """HTML fragment of the view, assuming its libraries are already loaded on the page
        (``titled=False``: leave out the figure's own title, for pages that head it)."""
        raise NotImplementedError

    def to_html(self, full_html: bool = True) -> str:
        """Self-contained HTML: a full page (``full_html=True``) or a fragment with the
        needed libraries inlined in front of the view (what notebooks display)."""
        if full_html:
            return Report(title=self.title).add(self).to_html()
        return "\n".join([library_script(n) for n in self.libraries] + [self.body_html()])

    def _repr_html_(self) -> str:
        # Offline in every front end: the libraries travel with the output (no CDN, no probe).
        return self.to_html(full_html=False)

    def save(self, path: str | Path) -> Path:
        """Write the view: ``.html`` a self-contained page; ``.csv`` the data behind it;
        ``.json`` the plotly figure (plotly views only)."""
        path = Path(path)
        suffix = path.suffix.lower()
        path.parent.mkdir(parents=True, exist_ok=True)
        if suffix in (".html", ".htm"):
            path.write_text(self.to_html(full_html=True), encoding="utf-8")
        elif suffix == ".csv":
            self.data.to_csv(path, index=False)
        elif suffix == ".json" and isinstance(self, PlotlyView):
            path.write_text(self.figure.to_json(), encoding="utf-8")
        else:
            kinds = ".html, .csv" + (", .json" if isinstance(self, PlotlyView) else "")
            raise ValueError(f"save() writes {kinds}; got {path.name!r}")
        return path

    def show(self) -> None:
        """Display in a notebook (same as leaving the view as a cell's last value)."""
        # only in a notebook (IPython is not a dependency)
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.title!r}, data={len(self.data)} rows)"


class PlotlyView(View):
    """A plotly ``Figure`` (``.figure``) with offline display and ``save``.

    Attribute access falls through to the figure, so ``view.update_layout(...)`` works.
    """

    libraries = ("plotly",)

    def __init__(self, figure, title: str = "", data: pd.DataFrame | None = None, caption: str = "",
                 name: str = ""):
        super().__init__(title or _figure_title(figure), data, caption, name)
        self.figure = figure

    def body_html(self, *, titled: bool = True) -> str:
        fig = self.figure
        if not titled and fig.layout.title.text:
            import plotly.graph_objects as go

            fig = go.Figure(fig)
            fig.update_layout(title_text=None, margin_t=40)
        return fig.to_html(
            full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=_new_id("tld-plotly"),
            config={"displaylogo": False, "responsive": True},
        )

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "figure":
            raise AttributeError(name)
        return getattr(self.figure, name)


def _figure_title(fig) -> str:
    t = fig.layout.title.text
    return t or "figure"


class CircuitsVisView(View):
    """One or more circuitsvis components side by side, each with a heading.

    ``panels``: ``(component, props, heading)`` with ``component`` a circuitsvis React
    element name (``"AttentionPattern"``, ``"ColoredTokens"``, ``"TopkTokens"``, ...) and
    ``props`` its properties (as circuitsvis's Python functions would pass them).
    """

    libraries = ("circuitsvis",)

    def __init__(self, panels: Sequence[tuple[str, dict, str]], title: str, data: pd.DataFrame | None = None,
                 caption: str = "", legend_html: str = "", name: str = ""):
        super().__init__(title, data, caption, name)
        self.panels = [(c, dict(p), h) for c, p, h in panels]
        self.legend_html = legend_html

    def body_html(self, *, titled: bool = True) -> str:
        ids = [_new_id("tld-cv") for _ in self.panels]
        head = (f'<div class="tld-title" style="font:600 15px sans-serif;margin:6px 0;">{html.escape(self.title)}</div>'
                if titled and self.title else "")
        width = max(100 // max(len(self.panels), 1) - 2, 20)
        cells = []
        for pid, (_, _, heading) in zip(ids, self.panels, strict=True):
            cells.append(
                f'<div class="tld-panel" style="flex:1 1 {width}%;min-width:220px;">'
                + (f'<div class="tld-panel-title" style="font:600 13px sans-serif;margin:4px 0;">'
                   f"{html.escape(heading)}</div>" if heading else "")
                + f'<div id="{pid}" class="tld-cv-root"></div></div>'
            )
        calls = "\n".join(
            f'  CircuitsVis.render("{pid}", CircuitsVis.{comp}, {_json_for_script(props)});'
            for pid, (comp, props, _) in zip(ids, self.panels, strict=True)
        )
        legend = f'<div class="tld-legend" style="font:12px sans-serif;margin:4px 0;">{self.legend_html}</div>' \
            if self.legend_html else ""
        return head + (
            '<div class="tld-circuitsvis" style="display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start;">'
            + "".join(cells) + "</div>" + legend
            + "\n<script type=\"text/javascript\">\n(function () {\n"
            + '  if (typeof CircuitsVis === "undefined") { console.error("tl_directional: circuitsvis bundle missing"); return; }\n'
            + calls + "\n})();\n</script>"
        )


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _residual_table(profile_or_df) -> pd.DataFrame:
    df = getattr(profile_or_df, "residual", profile_or_df)
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a Profile or its .residual DataFrame, got {type(profile_or_df).__name__}")
    _require(df, ["layer", "component"], "the residual table (Profile.residual)")
    return df


def _value_table(profile_or_df) -> pd.DataFrame:
    df = getattr(profile_or_df, "value", profile_or_df)
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a Profile or its .value DataFrame, got {type(profile_or_df).__name__}")
    if df.empty:
        raise ValueError("the value-space table is empty; profile with components including 'value'")
    _require(df, ["layer", "head"], "the value table (Profile.value)")
    return df


def _require(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks column(s) {missing}; it has {list(df.columns)[:20]}")


def _plotly():
    return go, make_subplots


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
    go, make_subplots = _plotly()
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
    go, make_subplots = _plotly()
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


def sweep_curves(results: pd.DataFrame, *, x: str = "s_par", y: str = "delta_ppl", title: str | None = None) -> PlotlyView:
    """Component-scaling curves: ``y`` (default delta perplexity) against ``x`` per edit space.

    Args:
        results: the table :func:`~tl_directional.sweep.sweep` returns: columns ``space``,
            ``layers``, ``x`` and ``y`` (rows with ``space == "baseline"`` are skipped;
            ``hard-diag`` has no scale and is drawn as a dashed horizontal line).
    """
    go, _ = _plotly()
    _require(results, ["space", x, y], "the sweep table")
    df = results[results["space"] != "baseline"].copy()
    if "layers" not in df:
        df["layers"] = "all"
    fig = go.Figure()
    for (space, layers), part in df.groupby(["space", "layers"], sort=False):
        name = space if layers == "all" else f"{space} L={layers}"
        if space in EDIT_SPACES and not EDIT_SPACES[space].scaled:  # hard-diag: no scale axis
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
    go, make_subplots = _plotly()
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
    go, _ = _plotly()
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
    go, make_subplots = _plotly()
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


__all__ = [
    "CircuitsVisView",
    "PlotlyView",
    "View",
    "attention_triptych",
    "attention_triptych_figure",
    "circuitsvis_js",
    "colored_tokens",
    "colored_tokens_multi",
    "compression_errors",
    "depth_profile",
    "edited_patterns",
    "head_heatmaps",
    "library_script",
    "perpendicular_size",
    "plotly_js",
    "str_tokens",
    "sweep_curves",
    "top_perpendicular_tokens",
    "training_curves",
    "triptych_edits",
]
