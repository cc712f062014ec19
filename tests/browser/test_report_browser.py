"""``tl-directional report`` rendered in a real headless Chromium, offline.

The report is built through the CLI on the tiny seeded GPT-2. Without a browser the
static checks still run (page and CSVs written, no external reference in the HTML,
each library inlined once); the browser checks skip with the reason when no Chromium
is installed (``.ci/run`` installs Debian's ``chromium``; ``TLD_CHROMIUM`` points at
another binary). In Chromium we check that

* every plotly figure was drawn (its div holds plotly's ``svg.main-svg`` with traces),
  every circuitsvis root was filled (canvas for attention maps, token spans, the top-k
  table), and no script raised;
* a screenshot is a real picture (not blank: many non-white pixels and colours);
* Chromium's network log shows no request from the page to anywhere off the machine,
  and, as a control, that the same check does catch a page that loads from a CDN.
"""

from __future__ import annotations

import base64
import json
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tl_directional.cli import main as cli_main
from tl_directional.views.report import external_references

from ._browser import chromium_path, page_requests_off_machine, read_netlog, run_chromium

CHROMIUM = chromium_path()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: install Debian's 'chromium' package (apt-get install -y chromium; .ci/run does) "
           "or set TLD_CHROMIUM to a Chromium/Chrome binary",
)

EXPECTED_CSVS = ("depth_profile", "value_heads", "sweep", "triptych", "triptych_heatmap", "tokens_par_frac",
                 "top_perpendicular")
PLOTLY_VIEWS = 4  # depth profile, head maps, sweep, triptych heatmap
CV_ROOTS = 3 + 1 + 1  # triptych panels, coloured tokens, top-k table


@pytest.fixture(scope="module")
def report(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    text = out / "text.txt"
    text.write_text("In the beginning God created the heaven and the earth. And the earth was without form, "
                    "and void; and darkness was upon the face of the deep. " * 3, encoding="utf-8")
    rc = cli_main(["report", "--model", str(tiny_model_dir("gpt2")), "--text", str(text), "--out", str(out / "r"),
                   "--max-sequences", "3", "--seq-len", "32", "--s-par", "0,0.5,1", "--quiet"])
    assert rc == 0
    return out / "r" / "index.html"


def test_cli_report_writes_page_and_csvs(report):
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for stem in EXPECTED_CSVS:
        assert (report.parent / f"{stem}.csv").stat().st_size > 0, stem
        assert f'href="{stem}.csv"' in page
    assert (report.parent / "profile" / "residual.csv").exists()
    meta = json.loads((report.parent / "report.json").read_text())
    assert meta["libraries"] == ["plotly", "circuitsvis"]
    assert page.count('data-tld-lib="plotly"') == 1 and page.count('data-tld-lib="circuitsvis"') == 1
    assert page.count("Plotly.newPlot(") == PLOTLY_VIEWS
    assert page.count("CircuitsVis.render(") == CV_ROOTS
    assert external_references(page) == []  # no src/href/url() that leaves the file


class _Tree(HTMLParser):
    """For each element whose id starts with ``tld-``: the tags/classes of its descendants."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, str | None]] = []
        self.roots: dict[str, list[tuple[str, str]]] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for _, rid in self.stack:
            if rid is not None:
                self.roots[rid].append((tag, a.get("class") or ""))
        rid = a.get("id") if (a.get("id") or "").startswith(("tld-plotly-", "tld-cv-")) else None
        if rid is not None:
            self.roots[rid] = []
        if tag not in self.VOID:
            self.stack.append((tag, rid))

    def handle_startendtag(self, tag, attrs):
        for _, rid in self.stack:
            if rid is not None:
                self.roots[rid].append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break


@pytest.fixture(scope="module")
def rendered(report, tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("no Chromium")
    return run_chromium(report, tmp_path_factory.mktemp("chromium-dom"), mode="dom", height=3000)


@needs_chromium
def test_figures_render_in_chromium(rendered):
    tree = _Tree()
    tree.feed(rendered["dom"])
    plots = {k: v for k, v in tree.roots.items() if k.startswith("tld-plotly-")}
    cvs = {k: v for k, v in tree.roots.items() if k.startswith("tld-cv-")}
    assert len(plots) == PLOTLY_VIEWS and len(cvs) == CV_ROOTS
    for rid, desc in plots.items():
        assert any(t == "svg" and "main-svg" in c for t, c in desc), f"{rid}: plotly drew no svg"
        assert sum(t in ("path", "rect", "image") for t, _ in desc) > 5, f"{rid}: no traces drawn"
    for rid, desc in cvs.items():
        assert len(desc) >= 3, f"{rid}: circuitsvis root left empty"
    kinds = [{t for t, _ in desc} for desc in cvs.values()]
    assert sum("canvas" in k for k in kinds) >= 3  # the three attention maps (chart.js canvases)
    assert any("table" in k for k in kinds)  # the top-k tokens table
    assert "colored-tokens" in rendered["dom"]
    errors = [ln for ln in rendered["stderr"].splitlines() if "CONSOLE" in ln and ("Uncaught" in ln or "Error" in ln)]
    assert not errors, errors


@needs_chromium
def test_no_request_leaves_the_machine(rendered):
    requests = read_netlog(rendered["netlog"])
    off = page_requests_off_machine(rendered["netlog"])
    assert off == [], off
    page_urls = [r["url"] for r in requests if r["page"]]
    assert all(u.startswith("file:") for u in page_urls), page_urls


@needs_chromium
def test_netlog_check_catches_a_cdn_page(tmp_path):
    """Control: the same check reports a page that fetches from the network."""
    page = tmp_path / "cdn.html"
    page.write_text('<html><head><script src="https://cdn.example.invalid/lib.js"></script></head><body>'
                    '<img src="http://img.example.invalid/a.png"></body></html>')
    res = run_chromium(page, tmp_path / "work", mode="dom", budget_ms=3000)
    off = page_requests_off_machine(res["netlog"])
    assert "https://cdn.example.invalid/lib.js" in off and "http://img.example.invalid/a.png" in off


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def _pixel_stats(png: Path, work: Path) -> dict:
    """Fraction of non-white pixels and number of distinct colours (5 bits per channel),
    computed by Chromium itself from a data: URL (no image library needed)."""
    data = base64.b64encode(png.read_bytes()).decode()
    page = work / "stats.html"
    page.write_text(
        '<html><body><pre id="out">pending</pre><script>'
        'const img = new Image(); img.onload = () => {'
        ' const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;'
        ' const ctx = c.getContext("2d"); ctx.drawImage(img, 0, 0);'
        ' const d = ctx.getImageData(0, 0, c.width, c.height).data; let nonwhite = 0; const colors = new Set();'
        ' for (let i = 0; i < d.length; i += 4) {'
        '  if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) nonwhite++;'
        '  colors.add(((d[i] >> 3) << 10) | ((d[i + 1] >> 3) << 5) | (d[i + 2] >> 3)); }'
        ' document.getElementById("out").textContent = JSON.stringify({w: c.width, h: c.height,'
        '  nonwhite: nonwhite / (c.width * c.height), colors: colors.size}); };'
        f' img.src = "data:image/png;base64,{data}";'
        "</script></body></html>")
    res = run_chromium(page, work / "stats", mode="dom", budget_ms=5000)
    m = re.search(r'<pre id="out">(\{.*?\})</pre>', res["dom"])
    assert m, "pixel statistics page did not run"
    return json.loads(m.group(1))


@needs_chromium
def test_screenshot_is_not_blank(report, tmp_path):
    res = run_chromium(report, tmp_path, mode="screenshot", width=1400, height=2400)
    png = res["png"]
    assert _png_size(png.read_bytes()) == (1400, 2400)
    stats = _pixel_stats(png, tmp_path)
    assert stats["w"] == 1400
    assert stats["nonwhite"] > 0.03, stats  # figures, not an empty page
    assert stats["colors"] > 50, stats  # plotly colour scales, lines, text
    assert page_requests_off_machine(res["netlog"]) == []
