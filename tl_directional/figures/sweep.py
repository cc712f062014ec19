"""The figures of :mod:`tl_directional.evaluate.sweeps.runner`: the component-scaling figure and the safe-scale search."""

from __future__ import annotations

import pandas as pd

from .base import plotly_api


def sweep_figure(results: pd.DataFrame, *, x: str = "s_par", y: str = "delta_ppl"):
    """Plotly figure: ``y`` against ``x`` per space (the component-scaling figure)."""
    go, _ = plotly_api()
    fig = go.Figure()
    df = results[results["space"] != "baseline"]
    # random per-layer scales (evaluate/sweeps/random_draws.py): markers at their mean s_par, not on the fixed-scale lines
    drawn = df["label"].astype(str).str.contains("[random=", regex=False)
    for (space, layers), part in df[~drawn].groupby(["space", "layers"], sort=False):
        part = part.sort_values(x)
        name = space if layers == "all" else f"{space} L={layers}"
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=name))
    for (space, layers), part in df[drawn].groupby(["space", "layers"], sort=False):
        name = f"{space} random per-layer" + ("" if layers == "all" else f" L={layers}")
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="markers", name=name, text=part["label"],
                                 marker={"symbol": "x", "size": 9}))
    fig.add_hline(y=0.0, line_dash="dot", line_color="gray")
    fig.update_layout(xaxis_title=x, yaxis_title=y, title=f"{y} vs {x} per edit space",
                      template="plotly_white", legend_title="space")
    return fig


def safe_scale_figure(result):
    """Plotly figure of a :class:`~tl_directional.evaluate.sweeps.safe_scale.SafeScaleResult`: the evaluated
    damage with the budget and the interval."""
    go, _ = plotly_api()
    ev = result.evaluations.sort_values("scale")
    fig = go.Figure(go.Scatter(x=ev["scale"], y=ev["cost"], mode="markers+lines", name=result.metric))
    fig.add_hline(y=result.budget, line_dash="dash", line_color="red", annotation_text="budget")
    fig.add_vrect(x0=result.interval[0], x1=result.interval[1], fillcolor="green", opacity=0.12, line_width=0)
    layers = "all" if result.layers is None else ",".join(map(str, result.layers))
    fig.update_layout(title=f"safe {result.which} interval, layers {layers}: [{result.interval[0]:.3g}, {result.interval[1]:.3g}]",
                      xaxis_title=result.which, yaxis_title=result.metric, template="plotly_white")
    return fig


__all__ = ["safe_scale_figure", "sweep_figure"]
