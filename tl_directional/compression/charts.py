"""Small self-contained SVG charts: they live in :mod:`tl_directional.figures.svg` (every figure is
in the views); re-exported here for ``from tl_directional.compression.charts import svg_chart``."""

from ..figures.svg import _nice_step, svg_chart  # noqa: F401

__all__ = ["svg_chart"]
