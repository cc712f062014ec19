"""The figure of :mod:`tl_directional.evaluate.patching.patching`: the split direct logit attribution per head."""

from __future__ import annotations

import pandas as pd

from .base import PlotlyView, plotly_api


def split_dla_figure(table: pd.DataFrame, sequence: int = 0):
    """Per-head ``dla_par`` and ``dla_perp`` of one sequence as plotly heatmaps, in a
    :class:`~tl_directional.views.PlotlyView` (like the other views: ``.figure``,
    ``.data`` = the rows shown, ``.save``)."""
    go, make_subplots = plotly_api()
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


__all__ = ["split_dla_figure"]
