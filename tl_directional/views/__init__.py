"""Views: plotly figures and circuitsvis widgets of the geometry, all offline.

Every view function returns a :class:`View`: it displays itself in a notebook,
``view.save("x.html")`` writes a self-contained page (``.csv`` writes the numbers
behind it, ``.json`` a plotly figure's JSON), ``view.data`` is that table, and
:class:`~tl_directional.page.Report` puts several views on one page.
The model runs behind the views of one text live in :mod:`tl_directional.views_data`.

Offline by construction:

* plotly figures are rendered with ``include_plotlyjs=False`` and plotly.js is
  inlined by the page (once per report; in a notebook, by the first output that needs it,
  or by every output with :func:`set_notebook_libraries` ``("inline")``, the default on
  Colab, which isolates each output in its own frame: :mod:`tl_directional.notebook_output`);
* circuitsvis views are rendered from circuitsvis's bundled ``iife.js`` (inlined
  the same way) and never through ``RenderedHTML``: its ``str()`` loads the
  bundle from a CDN and its ``_repr_html_`` contacts google.com on every display.

Plotly views (tables in, figure out; the frames' columns are documented per function):
:func:`depth_profile`, :func:`head_heatmaps`, :func:`sweep_curves`,
:func:`compression_errors`, :func:`training_curves`, :func:`attention_triptych_figure`.

circuitsvis views (run the model on a short text): :func:`attention_triptych`,
:func:`colored_tokens`, :func:`colored_tokens_multi`, :func:`top_perpendicular_tokens`.

Figures of other modules live here too: :func:`sweep_figure` and :func:`safe_scale_figure`
(of :mod:`tl_directional.sweep`), :func:`split_dla_figure` (of :mod:`tl_directional.patching`),
:func:`svg_chart` (self-contained SVG charts) and :func:`compress_check_page` (the
compress-check report). Their modules re-export them.

One module per kind: :mod:`~tl_directional.views.base` (the view objects),
:mod:`~tl_directional.views.plots` (tables in, plotly figure out),
:mod:`~tl_directional.views.tokens` (views of one text), :mod:`~tl_directional.views.sweep`,
:mod:`~tl_directional.views.patching`, :mod:`~tl_directional.views.svg`,
:mod:`~tl_directional.views.gate`. Importing them does not load plotly (it is imported on
first use).
"""

from __future__ import annotations

from ..notebook_output import notebook_libraries, set_notebook_libraries
from ..page import Report as Report  # the page the views go on (as before the split)
from ..page import circuitsvis_js, library_script, plotly_js
from ..views_data import check_layer_head as check_layer_head
from ..views_data import edited_patterns, str_tokens, triptych_edits
from ..views_data import one_sequence as one_sequence
from ..views_data import token_profile as token_profile
from .base import (
    COMPONENT_COLORS,
    NEGATIVE_COLOR,
    POSITIVE_COLOR,
    CircuitsVisView,
    PlotlyView,
    View,
)
from .gate import compress_check_page
from .patching import split_dla_figure
from .plots import compression_errors, depth_profile, head_heatmaps, sweep_curves, training_curves
from .svg import svg_chart
from .sweep import safe_scale_figure, sweep_figure
from .tokens import (
    COLOR_QUANTILE,
    attention_triptych,
    attention_triptych_figure,
    colored_tokens,
    colored_tokens_multi,
    perpendicular_size,
    top_perpendicular_tokens,
)

__all__ = [
    "COLOR_QUANTILE",
    "COMPONENT_COLORS",
    "CircuitsVisView",
    "NEGATIVE_COLOR",
    "POSITIVE_COLOR",
    "PlotlyView",
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
