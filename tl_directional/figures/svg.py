"""Small self-contained SVG charts (no plotting dependency, no JavaScript): the compress-check
page's per-layer chart and the compression study's figures."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape


def _nice_step(raw: float) -> float:
    """The 1-2-5 x 10^k step at or above ``raw`` (axis ticks)."""
    if not raw > 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def svg_chart(series: Mapping[str, Sequence[tuple[float, float]]], *, title: str = "", xlabel: str = "",
              ylabel: str = "", hline: tuple[float, str] | None = None, width: int = 640, height: int = 360,
              markers_only: bool = False, logx: bool = False, logy: bool = False) -> str:
    """A small self-contained SVG line chart (no plotting dependency): one line with markers
    per series (``markers_only``: a scatter plot), optional horizontal reference line,
    optional log10 axes (points <= 0 are left out there)."""
    if logx or logy:
        def keep(x, y):
            return (not logx or x > 0) and (not logy or y > 0)

        series = {k: [(math.log10(x) if logx else x, math.log10(y) if logy else y)
                      for x, y in v if keep(x, y)] for k, v in series.items()}
        if hline is not None and logy:
            hline = (math.log10(hline[0]), hline[1]) if hline[0] > 0 else None
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]
    pts = [p for s in series.values() for p in s]
    xs = [p[0] for p in pts] or [0, 1]
    ys = [p[1] for p in pts if p[1] == p[1]] or [0, 1]
    if hline is not None:
        ys = ys + [hline[0]]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys) if logy else min(0.0, min(ys))), max(ys)
    if logx:
        x0, x1 = math.floor(x0), math.ceil(x1)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    step = 1.0 if logy else _nice_step((y1 - y0) / 5)
    y0 = step * math.floor(y0 / step)
    y1 = step * math.ceil((y1 if logy else y1 * 1.02) / step)
    left, right, top, bottom = 64, 170, 30, 44
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (x - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>']
    for i in range(int(round((y1 - y0) / step)) + 1):
        yv = y0 + step * i
        parts.append(f'<line x1="{left - 4}" y1="{py(yv):.1f}" x2="{left + pw}" y2="{py(yv):.1f}" stroke="#eee"/>')
        label = f"{10 ** yv:g}" if logy else f"{yv:.3g}"
        parts.append(f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{label}</text>')
    if logx:
        xticks = list(range(int(x0), int(x1) + 1))
    elif len(set(xs)) <= 12 and not markers_only:
        xticks = sorted(set(xs))
    else:
        xticks = [x0 + (x1 - x0) * i / 5 for i in range(6)]
    for xv in xticks:
        label = f"{10 ** xv:g}" if logx else f"{xv:.3g}"
        parts.append(f'<text x="{px(xv):.1f}" y="{top + ph + 16}" text-anchor="middle">{label}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>')
    parts.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
                 f'text-anchor="middle">{escape(ylabel)}</text>')
    if hline is not None:
        parts.append(f'<line x1="{left}" y1="{py(hline[0]):.1f}" x2="{left + pw}" y2="{py(hline[0]):.1f}" '
                     f'stroke="black" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{left + pw - 2}" y="{py(hline[0]) - 4:.1f}" text-anchor="end">'
                     f'{escape(hline[1])}</text>')
    for i, (name, s) in enumerate(series.items()):
        c = palette[i % len(palette)]
        s = sorted((x, y) for x, y in s if y == y)
        if s and not markers_only:
            d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s)
            parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        if s:
            parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for x, y in s]
        ly = top + 12 + i * 15
        parts.append(f'<line x1="{left + pw + 10}" y1="{ly - 4}" x2="{left + pw + 28}" y2="{ly - 4}" '
                     f'stroke="{c}" stroke-width="2"/>')
        parts.append(f'<text x="{left + pw + 32}" y="{ly}">{escape(str(name))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


__all__ = ["svg_chart"]
