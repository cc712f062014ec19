"""Heat maps of directional patching / attribution results: full, parallel and perpendicular side by side."""

from __future__ import annotations

import pandas as pd

from .base import PlotlyView, plotly_api

_REDUCE = ("sum", "mean")


def directional_heatmap(
    frame: pd.DataFrame, node: str, *, reduce_pos: str | None = "sum", title: str | None = None
):
    """Three plotly heat maps on one colour scale, ``full`` | ``par`` | ``perp``, of one node type.

    Args:
        frame: a :meth:`DirectionalResult.to_frame <tl_directional.evaluate.patching.result.DirectionalResult.to_frame>`
            table (columns ``node_type``, ``layer``, ``pos``, ``head``, ``full``, ``par``, ``perp``).
        node: the node type to draw (``"attn"``, ``"head"``, ...).
        reduce_pos: for node types with a head axis, how positions are combined (``"sum"`` or
            ``"mean"``): the map is layer x head. Without a head axis the map is layer x position
            (``reduce_pos`` unused); with neither, a single column per layer.
        title: the figure's title.

    Returns:
        A :class:`~tl_directional.views.PlotlyView` (``.figure``, ``.data``: the cells shown, ``.save``).
    """
    if "node_type" not in frame:
        raise ValueError(
            "frame must come from DirectionalResult.to_frame() (it has no node_type column)"
        )
    rows = frame[frame["node_type"] == node]
    if rows.empty:
        raise ValueError(
            f"node={node!r} has no rows in frame; it holds {sorted(frame['node_type'].unique())}"
        )
    if reduce_pos not in _REDUCE:
        raise ValueError(f"reduce_pos must be one of {_REDUCE}, got {reduce_pos!r}")
    parts = [p for p in ("full", "par", "perp") if p in rows]
    has_head = rows["head"].notna().any()
    has_pos = rows["pos"].notna().any()
    x = "head" if has_head else ("pos" if has_pos else None)
    data = rows.assign(column=rows[x] if x else 0)
    data = getattr(data.groupby(["layer", "column"])[parts], reduce_pos)().reset_index()
    go, make_subplots = plotly_api()
    names = {"full": "full", "par": "parallel part", "perp": "perpendicular part"}
    fig = make_subplots(
        rows=1, cols=len(parts), subplot_titles=[names[p] for p in parts], shared_yaxes=True
    )
    for col, part in enumerate(parts, start=1):
        grid = data.pivot(index="layer", columns="column", values=part)
        fig.add_trace(
            go.Heatmap(
                z=grid.values,
                x=[int(c) for c in grid.columns],
                y=[int(i) for i in grid.index],
                coloraxis="coloraxis",
                name=names[part],
            ),
            row=1,
            col=col,
        )
    share = rows["random_share"].iloc[0] if "random_share" in rows else float("nan")
    fig.update_layout(
        title=(title or node) + f" (random-line share of a difference: {share:.3f})",
        coloraxis={"colorscale": "RdBu", "cmid": 0},
        template="plotly_white",
    )
    fig.update_xaxes(title_text=x or "")
    fig.update_yaxes(title_text="layer", col=1)
    return PlotlyView(fig, data=data, name=f"directional_{node}")


__all__ = ["directional_heatmap"]
