"""The view objects (:class:`View`, :class:`PlotlyView`, :class:`CircuitsVisView`) and what
the view functions share: colours, table checks, the lazy plotly import."""

from __future__ import annotations

import html
import json
import math
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .libraries import library_script
from .notebook_output import notebook_html
from .page import Report

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
        needed libraries inlined in front of the view (what notebooks display in mode
        ``"inline"``; :mod:`tl_directional.figures.notebook_output`)."""
        if full_html:
            return Report(title=self.title).add(self).to_html()
        return "\n".join([library_script(n) for n in self.libraries] + [self.body_html()])

    def _repr_html_(self) -> str:
        # Offline in every front end: the libraries travel with the notebook's outputs (no CDN,
        # no probe), once per notebook or in every output (tl_directional.figures.notebook_output).
        return notebook_html(self.libraries, self.body_html())

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


def plotly_api():
    """plotly's ``graph_objects`` and ``make_subplots``, imported on first use (importing the
    views, or ``tl_directional.compression``, does not load plotly)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    return go, make_subplots

