"""Views: plotly figures and circuitsvis widgets of the geometry, all offline.

Every view function returns a :class:`View`: it displays itself in a notebook,
``view.save("x.html")`` writes a self-contained page (``.csv`` writes the numbers
behind it, ``.json`` a plotly figure's JSON), ``view.data`` is that table, and
:class:`~tl_directional.figures.page.Report` puts several views on one page.
The model runs behind the views of one text live in :mod:`tl_directional.views.data`.

Offline by construction:

* plotly figures are rendered with ``include_plotlyjs=False`` and plotly.js is
  inlined by the page (once per report; in a notebook, by the first output that needs it,
  or by every output with :func:`set_notebook_libraries` ``("inline")``, the default on
  Colab, which isolates each output in its own frame: :mod:`tl_directional.figures.notebook_output`);
* circuitsvis views are rendered from circuitsvis's bundled ``iife.js`` (inlined
  the same way) and never through ``RenderedHTML``: its ``str()`` loads the
  bundle from a CDN and its ``_repr_html_`` contacts google.com on every display.

Plotly views (tables in, figure out; the frames' columns are documented per function):
:func:`depth_profile`, :func:`head_heatmaps`, :func:`sweep_curves`,
:func:`compression_errors`, :func:`training_curves`, :func:`attention_triptych_figure`.

circuitsvis views (run the model on a short text): :func:`attention_triptych`,
:func:`colored_tokens`, :func:`colored_tokens_multi`, :func:`top_perpendicular_tokens`.

Figures of other modules live here too: :func:`sweep_figure` and :func:`safe_scale_figure`
(of :mod:`tl_directional.evaluate.sweeps.runner`), :func:`split_dla_figure` (of :mod:`tl_directional.evaluate.patching.patching`),
:func:`svg_chart` (self-contained SVG charts) and :func:`compress_check_page` (the
compress-check report). Their modules re-export them.

One module per kind: :mod:`~tl_directional.figures.base` (the view objects),
:mod:`~tl_directional.figures.plots` (tables in, plotly figure out),
:mod:`~tl_directional.views.tokens` (views of one text), :mod:`~tl_directional.figures.sweep`,
:mod:`~tl_directional.figures.patching`, :mod:`~tl_directional.figures.svg`,
:mod:`~tl_directional.figures.gate`. Importing them does not load plotly (it is imported on
first use).
"""

from __future__ import annotations

from ..edit import EDIT_SPACES
from ..figures.base import (
    COMPONENT_COLORS,
    NEGATIVE_COLOR,
    POSITIVE_COLOR,
    CircuitsVisView,
    PlotlyView,
    View,
)
from ..figures.gate import compress_check_page
from ..figures.libraries import circuitsvis_js, library_script, plotly_js
from ..figures.notebook_output import notebook_libraries, set_notebook_libraries
from ..figures.page import Report
from ..figures.patching import split_dla_figure
from ..figures.plots import (
    compression_errors,
    depth_profile,
    head_heatmaps,
    training_curves,
)
from ..figures.plots import sweep_curves as draw_sweep_curves
from ..figures.svg import svg_chart
from ..figures.sweep import safe_scale_figure, sweep_figure
from .data import check_layer_head as check_layer_head
from .data import edited_patterns, str_tokens, triptych_edits
from .data import one_sequence as one_sequence
from .data import token_profile as token_profile
from .tokens import (
    COLOR_QUANTILE,
    attention_triptych,
    attention_triptych_figure,
    colored_tokens,
    colored_tokens_multi,
    perpendicular_size,
    top_perpendicular_tokens,
)


def sweep_curves(results, *, x: str = "s_par", y: str = "delta_ppl", title: str | None = None) -> PlotlyView:
    """Component-scaling curves: ``y`` (default delta perplexity) against ``x`` per edit space,
    the spaces without a scale (``hard-diag``, from :data:`~tl_directional.edit.EDIT_SPACES`)
    as dashed horizontal lines (:func:`tl_directional.figures.plots.sweep_curves`).

    Args:
        results: the table :func:`~tl_directional.evaluate.sweeps.runner.sweep` returns: columns ``space``,
            ``layers``, ``x`` and ``y`` (rows with ``space == "baseline"`` are skipped).
    """
    unscaled = tuple(name for name, space in EDIT_SPACES.items() if not space.scaled)
    return draw_sweep_curves(results, x=x, y=y, title=title, unscaled=unscaled)


__all__ = [
    "COLOR_QUANTILE",
    "COMPONENT_COLORS",
    "CircuitsVisView",
    "NEGATIVE_COLOR",
    "POSITIVE_COLOR",
    "PlotlyView",
    "Report",
    "View",
    "attention_triptych",
    "attention_triptych_figure",
    "circuitsvis_js",
    "colored_tokens",
    "colored_tokens_multi",
    "compress_check_page",
    "compression_errors",
    "depth_profile",
    "edited_patterns",
    "head_heatmaps",
    "library_script",
    "notebook_libraries",
    "perpendicular_size",
    "plotly_js",
    "safe_scale_figure",
    "set_notebook_libraries",
    "split_dla_figure",
    "str_tokens",
    "svg_chart",
    "sweep_curves",
    "sweep_figure",
    "top_perpendicular_tokens",
    "training_curves",
    "triptych_edits",
]
