"""Render a lesson notebook, executed on a chosen model, as a static Markdown page for the docs.

    python notebooks/_render.py notebooks/05_directional_patching.ipynb --model smollm2-135m \
        --out docs/notebooks/05_directional_patching.md

The notebook runs top to bottom (nbclient, a kernel of this interpreter, ``TLD_NOTEBOOK_MODEL``
set to ``--model`` and ``TLD_LESSON_SOLVE=1`` so the exercises show their worked answers). In
that run plotly views display as their figure's JSON instead of HTML with plotly.js inlined;
this script draws each figure as a small static SVG next to the page (heatmaps, lines, markers,
bars: what the lessons use), so the page is a few hundred kB and needs no JavaScript and no
network. circuitsvis widgets are interactive only: the page says so where one was shown.
stderr (progress bars, warnings) is left out. Machine paths are replaced and then checked for.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

PLOTLY_MIME = "application/vnd.tld.plotly+json"
CV_NOTE = ("*(an interactive circuitsvis widget is shown here when the notebook runs; the plotly "
           "figure above draws the same numbers)*")
SETUP = f"""
import json as _json
from tl_directional import views as _views
_views.PlotlyView._repr_html_ = lambda self: None
_views.PlotlyView._repr_mimebundle_ = lambda self, **kw: {{
    {PLOTLY_MIME!r}: _json.loads(self.figure.to_json()), "text/plain": repr(self)}}
_views.CircuitsVisView._repr_html_ = lambda self: None
_views.CircuitsVisView._repr_mimebundle_ = lambda self, **kw: {{"text/markdown": {CV_NOTE!r}}}
"""
MACHINE_PATH = re.compile(r"(/work/|/root/|/home/|/tmp/|/Users/|[A-Z]:\\\\)")


# ---------------------------------------------------------------------------------------------
# plotly figure JSON -> SVG (the subset the lessons draw)
# ---------------------------------------------------------------------------------------------

def _parse_rgb(c: str) -> tuple[float, float, float]:
    if c.startswith("#"):
        return tuple(int(c[i:i + 2], 16) for i in (1, 3, 5))
    nums = [float(v) for v in re.findall(r"[\d.]+", c)[:3]]
    return tuple(nums)


def _colour(scale, t: float) -> str:
    t = min(1.0, max(0.0, t))
    for (a, ca), (b, cb) in zip(scale, scale[1:], strict=False):
        if a <= t <= b:
            f = 0 if b == a else (t - a) / (b - a)
            x, y = _parse_rgb(ca), _parse_rgb(cb)
            return "rgb({},{},{})".format(*(int(round(p + f * (q - p))) for p, q in zip(x, y, strict=True)))
    return scale[-1][1]


PALETTE = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _axis_key(ref: str, kind: str) -> str:
    return kind + "axis" + ref[1:]


class _Axis:
    def __init__(self, values, lo, hi, reverse=False, title=""):
        self.categorical = any(isinstance(v, str) for v in values)
        self.cats = list(dict.fromkeys(str(v) for v in values)) if self.categorical else []
        nums = [float(v) for v in values if _num(v) is not None] if not self.categorical else []
        if self.categorical:
            self.v0, self.v1 = -0.5, len(self.cats) - 0.5
        else:
            self.v0, self.v1 = (min(nums), max(nums)) if nums else (0.0, 1.0)
            if self.v1 == self.v0:
                self.v0, self.v1 = self.v0 - 0.5, self.v1 + 0.5
            pad = 0.04 * (self.v1 - self.v0)
            self.v0, self.v1 = self.v0 - pad, self.v1 + pad
        self.lo, self.hi, self.reverse, self.title = lo, hi, reverse, title

    def pos(self, v) -> float:
        x = self.cats.index(str(v)) if self.categorical else float(v)
        f = (x - self.v0) / (self.v1 - self.v0)
        if self.reverse:
            f = 1 - f
        return self.lo + f * (self.hi - self.lo)

    def ticks(self, n=6):
        if self.categorical:
            step = max(1, math.ceil(len(self.cats) / 30))
            return [(c, c) for c in self.cats[::step]]
        raw = (self.v1 - self.v0) / n
        mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
        step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
        first = math.ceil(self.v0 / step) * step
        out, v = [], first
        while v <= self.v1 + 1e-12:
            out.append((v, f"{v:.4g}"))
            v += step
        return out


def _decode(obj):
    """plotly's JSON stores numpy arrays as ``{"dtype", "bdata"(base64), "shape"}``: back to lists."""
    if isinstance(obj, dict):
        if "bdata" in obj and "dtype" in obj:
            import base64

            import numpy as np

            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
            if obj.get("shape"):
                shape = obj["shape"]
                shape = [int(v) for v in shape.split(",")] if isinstance(shape, str) else shape
                arr = arr.reshape(shape)
            return [[(None if not np.isfinite(v) else float(v)) for v in row] for row in arr] if arr.ndim == 2 \
                else [(None if not np.isfinite(v) else float(v)) for v in arr.astype(float)]
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def figure_svg(fig: dict, width: int = 900) -> str:
    """A static SVG of a plotly figure's JSON: heatmaps, scatter (lines / markers, error bars),
    bars, vertical lines, subplot titles. Not a general plotly renderer."""
    fig = _decode(fig)
    layout, data = fig.get("layout", {}), fig.get("data", [])
    height = int(layout.get("height") or 420)
    width = int(layout.get("width") or width)
    left, right, top, bottom = 90, 150, 64, 70
    pw, ph = width - left - right, height - top - bottom
    title = (layout.get("title") or {}).get("text") or ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="14">{html.escape(title[:120])}</text>']
    # one panel per (xaxis, yaxis) pair
    panels: dict[tuple[str, str], list[dict]] = {}
    for tr in data:
        panels.setdefault((tr.get("xaxis", "x"), tr.get("yaxis", "y")), []).append(tr)
    legend_rows = []
    heat_ranges = []
    for (xr, yr), traces in panels.items():
        xl, yl = layout.get(_axis_key(xr, "x"), {}), layout.get(_axis_key(yr, "y"), {})
        xd, yd = xl.get("domain", [0, 1]), yl.get("domain", [0, 1])
        x_lo, x_hi = left + xd[0] * pw, left + xd[1] * pw
        y_lo, y_hi = top + (1 - yd[1]) * ph, top + (1 - yd[0]) * ph
        xs, ys = [], []
        for tr in traces:
            if tr["type"] == "heatmap":
                z = tr["z"]
                xs += tr.get("x") or list(range(len(z[0]) if z else 0))
                ys += tr.get("y") or list(range(len(z)))
            else:
                xs += [v for v in tr.get("x", []) if v is not None]
                ys += [v for v in tr.get("y", []) if v is not None]
                ex = tr.get("error_x") or {}
                if ex.get("array") is not None:
                    xs += [x + e for x, e in zip(tr["x"], ex["array"], strict=False) if _num(x) is not None]
                    xs += [x - e for x, e in zip(tr["x"], ex.get("arrayminus") or ex["array"], strict=False)
                           if _num(x) is not None]
                if tr["type"] == "bar":
                    ys += [0.0]
                    if layout.get("barmode") == "relative":
                        pos, neg = {}, {}
                        for t2 in traces:
                            for x, y in zip(t2["x"], t2["y"], strict=False):
                                if _num(y) is not None:
                                    d = pos if y >= 0 else neg
                                    d[x] = d.get(x, 0) + y
                        ys += list(pos.values()) + list(neg.values())
        is_heat = any(t["type"] == "heatmap" for t in traces)
        if is_heat:  # category-like cells: pad half a cell on numeric axes
            xs = [str(v) for v in xs]
            ys = [str(v) for v in ys]
        xa = _Axis(xs, x_lo, x_hi, xl.get("autorange") == "reversed", (xl.get("title") or {}).get("text", ""))
        ya = _Axis(ys, y_hi, y_lo, yl.get("autorange") == "reversed", (yl.get("title") or {}).get("text", ""))
        out.append(f'<rect x="{x_lo:.1f}" y="{y_lo:.1f}" width="{x_hi - x_lo:.1f}" height="{y_hi - y_lo:.1f}" '
                   'fill="none" stroke="#999"/>')
        for v, label in (xa.ticks() if xl.get("showticklabels", True) is not False else []):
            px = xa.pos(v)
            if not is_heat:
                out.append(f'<line x1="{px:.1f}" y1="{y_lo:.1f}" x2="{px:.1f}" y2="{y_hi:.1f}" stroke="#eee"/>')
            rot = f' transform="rotate(-50 {px:.1f} {y_hi + 12:.1f})" text-anchor="end"' if xa.categorical and \
                len(xa.cats) > 8 else ' text-anchor="middle"'
            out.append(f'<text x="{px:.1f}" y="{y_hi + 14:.1f}" font-size="9"{rot}>{html.escape(label[:18])}</text>')
        y_labels = yl.get("showticklabels", True) is not False
        for v, label in (ya.ticks() if y_labels else []):
            py = ya.pos(v)
            if not is_heat:
                out.append(f'<line x1="{x_lo:.1f}" y1="{py:.1f}" x2="{x_hi:.1f}" y2="{py:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{x_lo - 4:.1f}" y="{py + 3:.1f}" font-size="9" text-anchor="end">'
                       f'{html.escape(label[:18])}</text>')
        if xa.title:
            out.append(f'<text x="{(x_lo + x_hi) / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                       f'{html.escape(xa.title)}</text>')
        if ya.title:
            cy = (y_lo + y_hi) / 2
            out.append(f'<text x="{x_lo - 58:.1f}" y="{cy:.1f}" transform="rotate(-90 {x_lo - 58:.1f} {cy:.1f})" '
                       f'text-anchor="middle">{html.escape(ya.title)}</text>')
        stack_pos: dict = {}
        stack_neg: dict = {}
        n_bar = sum(t["type"] == "bar" for t in traces)
        for k, tr in enumerate(traces):
            colour = PALETTE[(len(legend_rows)) % len(PALETTE)]
            if tr["type"] == "heatmap":
                z = tr["z"]
                xv = tr.get("x") or list(range(len(z[0])))
                yv = tr.get("y") or list(range(len(z)))
                flat = [v for row in z for v in row if _num(v) is not None]
                coloraxis = layout.get(tr.get("coloraxis", ""), {}) if tr.get("coloraxis") else {}
                scale = tr.get("colorscale") or coloraxis.get("colorscale") or [[0, "#440154"], [1, "#fde725"]]
                zmin, zmax = tr.get("zmin"), tr.get("zmax")
                mid = tr.get("zmid", coloraxis.get("cmid"))
                if zmin is None or zmax is None:
                    zmin, zmax = (min(flat), max(flat)) if flat else (0.0, 1.0)
                    if mid is not None:
                        m = max(abs(zmin - mid), abs(zmax - mid)) or 1.0
                        zmin, zmax = mid - m, mid + m
                span = (zmax - zmin) or 1.0
                cw = abs(xa.pos(str(xv[min(1, len(xv) - 1)])) - xa.pos(str(xv[0]))) or (x_hi - x_lo)
                ch = abs(ya.pos(str(yv[min(1, len(yv) - 1)])) - ya.pos(str(yv[0]))) or (y_hi - y_lo)
                for i, row in enumerate(z):
                    for j, v in enumerate(row):
                        if _num(v) is None:
                            continue
                        cx, cy = xa.pos(str(xv[j])), ya.pos(str(yv[i]))
                        out.append(f'<rect x="{cx - cw / 2:.1f}" y="{cy - ch / 2:.1f}" width="{cw + 0.3:.1f}" '
                                   f'height="{ch + 0.3:.1f}" fill="{_colour(scale, (v - zmin) / span)}"/>')
                heat_ranges.append((scale, zmin, zmax))
                continue
            name = tr.get("name") or ""
            xsv, ysv = tr.get("x", []), tr.get("y", [])
            if tr["type"] == "bar":
                legend_rows.append((name, colour))
                bw = (x_hi - x_lo) / max(len(xsv), 1) * 0.8 / (1 if layout.get("barmode") == "relative" else n_bar)
                for x, y in zip(xsv, ysv, strict=False):
                    if _num(y) is None:
                        continue
                    base = (stack_pos if y >= 0 else stack_neg).get(x, 0.0) if layout.get("barmode") == "relative" else 0.0
                    if layout.get("barmode") == "relative":
                        (stack_pos if y >= 0 else stack_neg)[x] = base + y
                    off = 0 if layout.get("barmode") == "relative" else (k - (n_bar - 1) / 2) * bw
                    y0p, y1p = ya.pos(base), ya.pos(base + y)
                    out.append(f'<rect x="{xa.pos(x) - bw / 2 + off:.1f}" y="{min(y0p, y1p):.1f}" width="{bw:.1f}" '
                               f'height="{abs(y1p - y0p):.1f}" fill="{colour}"/>')
                continue
            legend_rows.append((name, colour))
            mode = tr.get("mode", "lines+markers")
            pts = [(xa.pos(x), ya.pos(y)) for x, y in zip(xsv, ysv, strict=False)
                   if x is not None and y is not None and (xa.categorical or _num(x) is not None)
                   and (ya.categorical or _num(y) is not None)]
            ex = tr.get("error_x") or {}
            if ex.get("array") is not None:
                minus = ex.get("arrayminus") or ex["array"]
                for x, y, e1, e0 in zip(xsv, ysv, ex["array"], minus, strict=False):
                    py = ya.pos(y)
                    out.append(f'<line x1="{xa.pos(x - e0):.1f}" y1="{py:.1f}" x2="{xa.pos(x + e1):.1f}" '
                               f'y2="{py:.1f}" stroke="{colour}" stroke-width="1.5"/>')
            if "lines" in mode and len(pts) > 1:
                out.append('<polyline fill="none" stroke-width="2" stroke="{}" points="{}"/>'.format(
                    colour, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
            if "markers" in mode:
                out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in pts]
        for shape in layout.get("shapes", []):
            if shape.get("type") == "line" and shape.get("x0") == shape.get("x1") and _num(shape.get("x0")) is not None:
                px = xa.pos(shape["x0"])
                out.append(f'<line x1="{px:.1f}" y1="{y_lo:.1f}" x2="{px:.1f}" y2="{y_hi:.1f}" stroke="black" '
                           'stroke-dasharray="4,3"/>')
    for ann in layout.get("annotations", []):  # subplot titles
        if ann.get("xref") == "paper" and ann.get("yref") == "paper" and ann.get("text"):
            ax = left + float(ann["x"]) * pw
            ay = top + (1 - float(ann["y"])) * ph - 6
            out.append(f'<text x="{ax:.1f}" y="{ay:.1f}" text-anchor="middle" font-size="12">'
                       f'{html.escape(re.sub("<[^>]+>", "", ann["text"]))}</text>')
    lx = left + pw + 16
    for i, (name, colour) in enumerate(r for r in legend_rows if r[0]):
        ly = top + 10 + 16 * i
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="12" height="10" fill="{colour}"/>'
                   f'<text x="{lx + 16}" y="{ly}">{html.escape(name[:20])}</text>')
    if heat_ranges:  # one colour bar (panels of a lesson figure share a scale, or the last one is shown)
        scale, zmin, zmax = heat_ranges[-1]
        for i in range(40):
            f = 1 - i / 39
            out.append(f'<rect x="{lx}" y="{top + i * (ph / 40):.1f}" width="14" height="{ph / 40 + 0.5:.1f}" '
                       f'fill="{_colour(scale, f)}"/>')
        out.append(f'<text x="{lx + 18}" y="{top + 8}">{zmax:.3g}</text>'
                   f'<text x="{lx + 18}" y="{top + ph}">{zmin:.3g}</text>')
    out.append("</svg>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# notebook -> markdown
# ---------------------------------------------------------------------------------------------

def _scrub(text: str, repo: Path) -> str:
    for p, rep in ((str(repo), "<repo>"), (str(Path.home()), "~"), (sys.prefix, "<venv>"),
                   (tempfile.gettempdir(), "<tmp>")):
        text = text.replace(p, rep)
    return text


def tidy_html(fragment: str) -> str:
    """A displayed table as one raw-HTML block Markdown keeps whole: no <style>, no blank lines."""
    fragment = re.sub(r"<style[^>]*>.*?</style>", "", fragment, flags=re.S)
    return "\n".join(line for line in fragment.splitlines() if line.strip())


def _fence(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text.rstrip()}\n```\n"


def execute(path: Path, model: str, timeout: int):
    import nbclient
    import nbformat

    book = nbformat.read(path, as_version=4)
    book.cells.insert(0, nbformat.v4.new_code_cell(SETUP))
    os.environ["TLD_NOTEBOOK_MODEL"] = model
    os.environ["TLD_LESSON_SOLVE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "kernels" / "tld-render"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "tld render", "language": "python"}))
        os.environ["JUPYTER_PATH"] = tmp
        client = nbclient.NotebookClient(book, timeout=timeout, kernel_name="tld-render",
                                         resources={"metadata": {"path": str(path.parent)}})
        t0 = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - t0
    book.cells.pop(0)
    return book, seconds


def to_markdown(book, stem: str, out: Path, repo: Path, header: str) -> str:
    files = out.parent / f"{out.stem}_files"
    files.mkdir(parents=True, exist_ok=True)
    for old in files.glob("*.svg"):
        old.unlink()
    parts, n_fig = [header], 0
    for cell in book.cells:
        if cell.cell_type == "markdown":
            parts.append(cell.source.strip() + "\n")
            continue
        parts.append(_fence(cell.source, "python"))
        for o in cell.get("outputs", []):
            kind = o.get("output_type")
            if kind == "error":
                raise SystemExit(f"{stem}: a cell raised {o.get('ename')}: {o.get('evalue')}")
            if kind == "stream":
                if o.get("name") == "stdout" and o.get("text", "").strip():
                    parts.append(_fence(_scrub(o["text"], repo)))
                continue
            data = o.get("data", {})
            if PLOTLY_MIME in data:
                n_fig += 1
                svg = figure_svg(data[PLOTLY_MIME])
                (files / f"fig{n_fig:02d}.svg").write_text(_scrub(svg, repo), encoding="utf-8")
                alt = ((data[PLOTLY_MIME].get("layout", {}).get("title") or {}).get("text") or "figure")[:80]
                parts.append(f"![{html.escape(alt)}]({files.name}/fig{n_fig:02d}.svg)\n")
            elif "text/markdown" in data:
                parts.append(data["text/markdown"].strip() + "\n")
            elif "text/html" in data:
                parts.append('<div class="tld-output">\n' + tidy_html(_scrub(data["text/html"], repo)) + "\n</div>\n")
            elif "text/plain" in data:
                parts.append(_fence(_scrub(data["text/plain"], repo)))
    text = "\n".join(parts)
    for f in [*files.glob("*.svg")]:
        if MACHINE_PATH.search(f.read_text(encoding="utf-8")):
            raise SystemExit(f"{f.name}: a machine path is left in a figure")
    bad = MACHINE_PATH.search(text)
    if bad:
        i = bad.start()
        raise SystemExit(f"{stem}: a machine path is left in the page: ...{text[max(0, i - 80):i + 80]}...")
    return text


def _provenance(repo: Path, model: str) -> str:
    """One line naming the code and the weights of the run: the commit (``+dirty`` when the
    package, the studies or the notebooks had uncommitted changes) and, for a catalogued real
    model, its source file and sha256 (the bundled default model: its safetensors' sha256)."""
    import hashlib
    import subprocess

    from tl_directional.model.load.catalog import REAL_MODELS

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=repo).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--", "tl_directional", "studies", "notebooks"))
    commit = (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if dirty else "")
    if model in REAL_MODELS:
        entry = REAL_MODELS[model]
        weights = f"`{entry.gguf_name}` (sha256 `{entry.source_sha256}`), dequantised to float32"
    else:
        files = sorted((repo / "tl_directional" / "data").rglob("*.safetensors")) if model == "default" else []
        weights = ", ".join(f"`{f.name}` (sha256 `{hashlib.sha256(f.read_bytes()).hexdigest()}`)" for f in files) \
            or f"`{model}` (not a catalogued model: no weights hash)"
    return f"Code at commit `{commit}`; weights {weights}."


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebook", type=Path)
    ap.add_argument("--model", required=True, help="TLD_NOTEBOOK_MODEL for the run, e.g. smollm2-135m")
    ap.add_argument("--out", type=Path, required=True, help="the Markdown page to write (docs/notebooks/...)")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    args = ap.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent
    nb_path = args.notebook.resolve()
    book, seconds = execute(nb_path, args.model, args.timeout)
    import torch

    rel = nb_path.relative_to(repo)
    out_rel = args.out.resolve().relative_to(repo) if args.out.resolve().is_relative_to(repo) else args.out.name
    command = f"python notebooks/_render.py {rel} --model {args.model} --out {out_rel}"
    provenance = _provenance(repo, args.model)
    header = (f"!!! note \"Rendered run\"\n    `{rel}` executed top to bottom on **{args.model}** "
              f"(`TLD_NOTEBOOK_MODEL={args.model}`, exercises filled from the solutions file) with\n"
              f"    `{command}`, in {seconds / 60:.1f} min on a CPU ({torch.get_num_threads()} torch thread(s), "
              "2 cores shared with other jobs).\n"
              f"    {provenance}\n"
              "    Figures are static SVG drawings of the notebook's plotly figures; run the notebook for the "
              "interactive ones.\n")
    text = to_markdown(book, nb_path.stem, args.out, repo, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    size = args.out.stat().st_size + sum(f.stat().st_size for f in (args.out.parent / f"{args.out.stem}_files").glob("*"))
    print(f"{args.out}: {size / 1e6:.2f} MB with its figures; notebook ran {seconds:.1f} s")


if __name__ == "__main__":
    main()
