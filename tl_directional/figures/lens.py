"""The figure of :mod:`tl_directional.evaluate.lens.lens`: the split logit lens as heat maps."""

from __future__ import annotations

import pandas as pd

from .base import PlotlyView, plotly_api

PANELS = ("full", "parallel", "perpendicular")


def split_lens_figure(table: pd.DataFrame, batch: int = 0):
    """Heat maps layer x position of one sequence's ``full`` change of the lens logit and its
    ``parallel`` and ``perpendicular`` parts, side by side on one diverging colour scale, in a
    :class:`~tl_directional.views.PlotlyView` (``.figure``, ``.data`` = the rows shown, ``.save``).

    ``table`` is :meth:`tl_directional.evaluate.lens.lens.SplitLensResult.to_frame`'s frame (columns
    ``layer``, ``position``, ``full``, ``parallel``, ``perpendicular``, optional ``batch``).
    """
    missing = [c for c in ("layer", "position", *PANELS) if c not in table.columns]
    if missing:
        raise ValueError(
            f"table lacks columns {missing}; pass SplitLensResult.to_frame() (without by_component)"
        )
    rows = table[table["batch"] == batch] if "batch" in table.columns else table
    if rows.empty:
        raise ValueError(
            f"table has no rows for batch={batch}; valid: {sorted(set(table['batch']))}"
        )
    go, make_subplots = plotly_api()
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=("full change", "parallel part", "perpendicular part"),
        shared_yaxes=True,
    )
    for col, key in enumerate(PANELS, start=1):
        grid = rows.pivot(index="layer", columns="position", values=key)
        fig.add_trace(
            go.Heatmap(
                z=grid.values,
                x=list(grid.columns),
                y=list(grid.index),
                coloraxis="coloraxis",
                name=key,
            ),
            row=1,
            col=col,
        )
    fig.update_layout(
        title="split logit lens: change of the target's lens logit per layer",
        coloraxis={"colorscale": "RdBu", "cmid": 0},
        template="plotly_white",
    )
    fig.update_xaxes(title_text="position")
    fig.update_yaxes(title_text="layer", col=1)
    return PlotlyView(fig, data=rows.reset_index(drop=True), name="split_lens")


__all__ = ["split_lens_figure"]
