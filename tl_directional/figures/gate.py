"""The compress-check report page (:meth:`tl_directional.compression.CheckResult.write_report`):
verdict, the per-layer SVG chart, the worst and all checked rows."""

from __future__ import annotations

from html import escape

from .page import Report
from .svg import svg_chart


def compress_check_page(result) -> Report:
    """The :class:`~tl_directional.figures.page.Report` of a :class:`~tl_directional.compression.CheckResult`."""
    series = {}
    for unit in result.units:
        sub = result.table[result.table.unit == unit].sort_values("layer")
        series[unit] = list(zip(sub.layer.tolist(), sub[result.metric].tolist(), strict=True))
    chart = svg_chart(series, title=f"{result.metric} per layer", xlabel="layer", ylabel=result.metric,
                      hline=(result.threshold, "threshold"))
    verdict = "PASS" if result.passed else "FAIL"
    color = "#1a7f37" if result.passed else "#cf222e"
    reasons = "".join(f"<li>{escape(r)}</li>" for r in result.reasons)
    fmt = lambda x: f"{x:.4g}"  # noqa: E731 - pandas float_format
    rep = Report(f"compress-check {verdict}")
    rep.add_html(f'<p style="font-size:20px;font-weight:bold;color:{color}">{verdict}</p>')
    rep.add_html(f"""<p>metric <code>{escape(result.metric)}</code> (label-free: no labels or logits, only the layer updates),
threshold {result.threshold:g}, units {escape(", ".join(result.units))}, {escape(result.mode)} mode,
{result.geometry.attrs.get("tokens", 0)} tokens.<br>dense: <code>{escape(result.dense_name)}</code><br>
compressed: <code>{escape(result.compressed_name)}</code></p><ul>{reasons}</ul>""")
    rep.add_html(chart)
    rep.add_html(f"<h2>Worst layers</h2>{result.worst(10)[result._summary_columns()].to_html(index=False, float_format=fmt)}")
    rep.add_html(f"<h2>All checked rows</h2>{result.table.to_html(index=False, float_format=fmt)}")
    rep.add_html("""<p>Definitions: METHOD.md sec. 6; <code>err_perp_energy = sqrt(sum ||e_perp||^2 / sum ||u||^2)</code>
with <code>e = u' - u</code> split against the dense update <code>u</code>.</p>""")
    return rep


__all__ = ["compress_check_page"]
