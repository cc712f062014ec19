"""Self-contained HTML reports: several views on one page that works offline.

A :class:`Report` inlines each JavaScript library its views need exactly once
(plotly.js about 4.8 MB, circuitsvis's bundle about 1.3 MB) in the page head and
then only the views' own markup and data, so the page opens from disk with no
network. :func:`build_report` is what ``tl-directional report`` runs: profile,
value-space head maps, a component-scaling sweep and the attention-map triptych,
plus the CSV behind every figure.

:func:`external_references` lists everything in a page that would make a browser
fetch from elsewhere (``src``/``href`` with a scheme or ``//``, CSS ``url(...)`` and
``@import``); the browser test asserts it is empty and, independently, that
Chromium's network log of the page shows no request.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd

from .views import View, library_script

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 16px 24px; color: #222; }
h1 { font-size: 24px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 6px; }
.tld-meta { font-size: 13px; color: #555; } .tld-meta td { padding: 1px 12px 1px 0; }
.tld-caption { font-size: 13px; color: #444; margin: 4px 0 8px; max-width: 1100px; }
.tld-section { border-top: 1px solid #e5e5e5; padding-top: 4px; }
.tld-csv { font-size: 12px; }
.tld-note { background: #fff6e0; border: 1px solid #f0d080; padding: 6px 10px; font-size: 13px; }
"""


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return s[:48] or "view"


class Report:
    """An ordered list of views (and text) rendered as one offline HTML page.

    Example::

        rep = Report("My model")
        rep.add(depth_profile(prof), caption="...").add(head_heatmaps(prof))
        rep.save("out/")          # out/index.html + one CSV per view
    """

    def __init__(self, title: str = "tl-directional report", metadata: dict | None = None):
        self.title = title
        self.metadata = dict(metadata or {})
        self.items: list[tuple[str, object, str, str]] = []  # (kind, view|html, caption, csv name)

    def add(self, view: View, *, caption: str | None = None, name: str | None = None) -> Report:
        """Append a view; ``name`` is the stem of its CSV file (default: ``view.name``, else from
        the title; repeated names get ``_2``, ``_3``, ...)."""
        if not isinstance(view, View):
            raise TypeError(f"Report.add takes a tl_directional.views.View, got {type(view).__name__}")
        used = {it[3] for it in self.items}
        stem = name or view.name or _slug(view.title)
        base, i = stem, 2
        while stem in used:
            stem, i = f"{base}_{i}", i + 1
        self.items.append(("view", view, view.caption if caption is None else caption, stem))
        return self

    def add_html(self, fragment: str) -> Report:
        """Append trusted HTML (a note, a table); it must not reference external resources."""
        self.items.append(("html", fragment, "", ""))
        return self

    def add_text(self, text: str, *, note: bool = False) -> Report:
        """Append a paragraph of plain text (escaped); ``note=True`` highlights it."""
        cls = "tld-note" if note else "tld-caption"
        return self.add_html(f'<p class="{cls}">{html.escape(text)}</p>')

    @property
    def views(self) -> list[View]:
        return [it[1] for it in self.items if it[0] == "view"]

    def libraries(self) -> list[str]:
        needed = {lib for v in self.views for lib in v.libraries}
        return [lib for lib in ("plotly", "circuitsvis") if lib in needed]

    def to_html(self, *, csv_links: bool = False) -> str:
        """The page. Each library its views need is inlined once, in the head."""
        head = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(self.title)}</title>",
            f"<style>{_CSS}</style>",
            "<script>window.PlotlyConfig = {MathJaxConfig: 'local'};</script>",
        ]
        head += [library_script(lib) for lib in self.libraries()]
        head.append("</head><body>")
        body = [f"<h1>{html.escape(self.title)}</h1>"]
        if self.metadata:
            rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>"
                           for k, v in self.metadata.items())
            body.append(f'<table class="tld-meta">{rows}</table>')
        for kind, item, caption, stem in self.items:
            if kind == "html":
                body.append(item)
                continue
            view: View = item
            body.append(f'<section class="tld-section" data-view="{html.escape(type(view).__name__)}" '
                        f'id="{html.escape(stem)}">')
            if view.title != self.title:
                body.append(f"<h2>{html.escape(view.title)}</h2>")
            if caption:
                body.append(f'<p class="tld-caption">{html.escape(caption)}</p>')
            body.append(view.body_html(titled=False))
            if csv_links and not view.data.empty:
                body.append(f'<p class="tld-csv">Data: <a href="{html.escape(stem)}.csv">{html.escape(stem)}.csv</a></p>')
            body.append("</section>")
        body.append("</body></html>")
        return "\n".join(head + body)

    def save(self, path: str | Path) -> Path:
        """``path`` ending in ``.html``: write that page only. Otherwise ``path`` is a directory:
        write ``index.html`` and ``<name>.csv`` per view (linked from the page). Returns the page."""
        path = Path(path)
        if path.suffix.lower() in (".html", ".htm"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.to_html(), encoding="utf-8")
            return path
        path.mkdir(parents=True, exist_ok=True)
        for kind, view, _, stem in self.items:
            if kind == "view" and not view.data.empty:
                view.data.to_csv(path / f"{stem}.csv", index=False)
        page = path / "index.html"
        page.write_text(self.to_html(csv_links=True), encoding="utf-8")
        return page

    def _repr_html_(self) -> str:
        return "\n".join(
            [library_script(lib) for lib in self.libraries()]
            + [v.body_html() for v in self.views]
        )


# ---------------------------------------------------------------------------------------------
# Offline check
# ---------------------------------------------------------------------------------------------

_URL_ATTRS = {"src", "href", "srcset", "data", "poster", "action", "formaction", "background", "xlink:href"}
_EXTERNAL = re.compile(r"^\s*(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")
_LOCAL_SCHEMES = ("data:", "blob:", "javascript:", "about:", "#", "mailto:")


class _RefFinder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.refs: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self._in_style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if name in _URL_ATTRS:
                for part in value.split(",") if name == "srcset" else [value]:
                    v = part.strip().split(" ")[0] if name == "srcset" else part.strip()
                    if _EXTERNAL.match(v) and not v.lower().startswith(_LOCAL_SCHEMES):
                        self.refs.append(f"<{tag} {name}={v}>")
            if name == "style":
                self.refs += _css_refs(value, tag)

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.refs += _css_refs(data, "style")


def _css_refs(css: str, where: str) -> list[str]:
    out = []
    for m in re.finditer(r"url\(\s*['\"]?([^'\")]+)", css):
        v = m.group(1).strip()
        if _EXTERNAL.match(v) and not v.lower().startswith(_LOCAL_SCHEMES):
            out.append(f"{where} url({v})")
    for m in re.finditer(r"@import\s+(?:url\()?\s*['\"]?([^'\");]+)", css):
        out.append(f"{where} @import {m.group(1).strip()}")
    return out


def external_references(page: str) -> list[str]:
    """Resources in an HTML page that a browser would fetch from elsewhere: ``src``,
    ``href`` (also of ``<a>``: a link counts) and similar attributes with a URL scheme
    other than ``data:``/``blob:`` or starting with ``//``, and CSS ``url()``/``@import``
    in ``<style>`` elements and ``style`` attributes. Script *text* is not parsed: strings
    such as ``"http://www.w3.org/2000/svg"`` inside the libraries are not requests."""
    finder = _RefFinder()
    finder.feed(page)
    finder.close()
    return finder.refs


# ---------------------------------------------------------------------------------------------
# Headless Chromium: render a page from disk, screenshot it, read its network log
# ---------------------------------------------------------------------------------------------

#: Flags for a headless Chromium that should not talk to anyone by itself.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
    "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--no-pings",
    "--disable-breakpad", "--no-default-browser-check", "--disable-dev-shm-usage", "--hide-scrollbars",
    "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate",
    # Chromium still makes a few background requests of its own (update checks); no host name
    # resolves, so neither they nor anything else can leave the machine. Attempts stay in the log.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
)


def chromium_path() -> str | None:
    """A Chromium/Chrome executable: ``$TLD_CHROMIUM``, else ``chromium``, ``chromium-browser``,
    ``google-chrome`` on ``PATH`` (Debian's package installs ``/usr/bin/chromium``), else None."""
    import os
    import shutil

    env = os.environ.get("TLD_CHROMIUM")
    if env:
        return env if Path(env).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def run_chromium(page: str | Path, workdir: str | Path, *, mode: str = "dom", width: int = 1400,
                 height: int = 2400, scale: float = 1.0, budget_ms: int = 15000, timeout: float = 180.0,
                 chromium: str | None = None, extra: Sequence[str] = ()) -> dict:
    """Open ``page`` (a file) in a fresh headless Chromium profile under ``workdir``.

    ``mode="dom"``: returns the DOM after scripts ran (``dom``); ``mode="screenshot"``:
    writes ``workdir/screenshot.png`` (``png``). Always records Chromium's network log
    (``netlog``, the path of a net-export JSON) and stderr (``stderr``, with console
    messages). Raises RuntimeError when Chromium is missing or fails.
    """
    import subprocess
    import tempfile

    exe = chromium or chromium_path()
    if exe is None:
        raise RuntimeError("no Chromium found; install Debian's 'chromium' or set TLD_CHROMIUM")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    profile_dir = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=work))
    netlog = work / f"netlog-{mode}.json"
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", f"--log-net-log={netlog}",
           "--net-log-capture-mode=Default", "--enable-logging=stderr", "--v=0",
           f"--window-size={width},{height}", f"--force-device-scale-factor={scale}",
           f"--virtual-time-budget={budget_ms}", *extra]
    png = work / "screenshot.png"
    if mode == "dom":
        cmd.append("--dump-dom")
    elif mode == "screenshot":
        cmd.append(f"--screenshot={png}")
    else:
        raise ValueError(f"mode must be 'dom' or 'screenshot', got {mode!r}")
    cmd.append(Path(page).resolve().as_uri())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=work)
    if proc.returncode != 0 or (mode == "screenshot" and not png.is_file()):
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"dom": proc.stdout, "stderr": proc.stderr, "netlog": netlog,
            "png": png if mode == "screenshot" else None, "command": cmd}


def read_netlog(path: str | Path) -> list[dict]:
    """URL requests in a Chromium net-export log: ``{"url", "initiator", "isolation", "page"}``
    per request. ``page`` is True for requests made by a page opened from disk (initiator
    ``null`` or a ``file://`` isolation key); Chromium's own background requests carry
    initiator ``"not an origin"``. Tolerates a log whose closing brackets are missing."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        log = json.loads(text)
    except json.JSONDecodeError:
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    types = log["constants"]["logEventTypes"]
    start = types["URL_REQUEST_START_JOB"]
    out = []
    for ev in log.get("events", []):
        if ev.get("type") != start:
            continue
        p = ev.get("params") or {}
        if "url" not in p:
            continue
        initiator = p.get("initiator", "")
        isolation = p.get("network_isolation_key", "")
        out.append({"url": p["url"], "initiator": initiator, "isolation": isolation,
                    "page": initiator != "not an origin" or isolation.startswith("file://")})
    return out


def page_requests_off_machine(netlog: str | Path) -> list[str]:
    """URLs the page (not Chromium itself) asked for that are not on this machine
    (anything but ``file:``, ``data:``, ``blob:``, ``about:``, ``chrome:`` and localhost)."""
    local = ("file:", "data:", "blob:", "about:", "chrome:", "chrome-extension:",
             "http://localhost", "http://127.0.0.1", "https://localhost", "https://127.0.0.1")
    return [r["url"] for r in read_netlog(netlog) if r["page"] and not r["url"].startswith(local)]


# ---------------------------------------------------------------------------------------------
# The standard report
# ---------------------------------------------------------------------------------------------


def pick_head(value_table: pd.DataFrame) -> tuple[int, int]:
    """The head with the largest mean self-attention ``A_tt`` (skipping layer 0 when the
    model has more layers), where the triptych's edits differ most."""
    df = value_table
    if df["layer"].nunique() > 1:
        df = df[df["layer"] > 0]
    row = df.sort_values("A_tt_mean", ascending=False).iloc[0]
    return int(row["layer"]), int(row["head"])


def build_report(
    model,
    inputs,
    out_dir: str | Path,
    *,
    spaces: Sequence[str] = ("value", "resid-attn", "resid-mlp", "hard-diag"),
    s_par: Sequence[float] = (0.0, 0.5, 1.0, 1.5),
    layer: int | None = None,
    head: int | None = None,
    triptych_tokens: int = 24,
    batch_size: int = 8,
    title: str | None = None,
    model_label: str | None = None,
    progress: bool = False,
) -> Path:
    """Profile, head maps, sweep and attention triptych of ``model`` on ``inputs``,
    written to ``out_dir/index.html`` with one CSV per figure (and ``profile/``, the
    profile's own tables). Returns the page's path.

    ``layer``/``head`` choose the triptych's head (default: :func:`pick_head`);
    the triptych and token views use the first sequence of ``inputs``.
    """
    from .inputs import prepare_inputs
    from .measure import profile
    from .sites import normalize_index, resolve_sites
    from .sweep import grid, sweep
    from .views import (
        attention_triptych,
        attention_triptych_figure,
        colored_tokens,
        depth_profile,
        head_heatmaps,
        sweep_curves,
        top_perpendicular_tokens,
    )

    t0 = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sites = resolve_sites(model, warn=False)
    # checked before any work; negative indices count from the end
    layer = None if layer is None else normalize_index(layer, sites.n_layers, "layer")
    head = None if head is None else normalize_index(head, sites.n_heads, "head", "head")
    batch = prepare_inputs(model, inputs)
    prof = profile(model, batch, batch_size=batch_size, progress=progress)
    prof.save(out / "profile", format="csv")
    if layer is None or head is None:
        auto_l, auto_h = pick_head(prof.value)
        layer = auto_l if layer is None else layer
        head = auto_h if head is None else head
    meta = prof.metadata
    rep = Report(title or f"tl-directional report: {model_label or meta.get('model_name')}", metadata={
        "model": model_label or meta.get("model_name"),
        "architecture": meta.get("architecture"),
        "lane": f"{meta.get('lane')} (TransformerLens {meta.get('transformer_lens_version')})",
        "tokens / sequences": f"{meta.get('tokens_seen')} / {meta.get('sequences_seen')}",
        "weights processed": meta.get("weights_processed"),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    })
    if meta.get("weights_processed"):
        rep.add_text("Weights were processed (centred or folded): the geometry differs from the raw model "
                     "(METHOD sec. 2).", note=True)
    for n in meta.get("notes", []):
        rep.add_text(str(n), note=True)
    rep.add(depth_profile(prof), name="depth_profile",
            caption="Per layer, each update split against the stream it is added to (METHOD sec. 1-2): "
                    "the fraction of the update along the stream (top) and parallel/perpendicular ratio (bottom).")
    rep.add(head_heatmaps(prof), name="value_heads",
            caption="Per head, the aggregate o_t split against the token's own value v_t: beta = A_tt + gamma, "
                    "the self attention A_tt, and phi, the head's self-value written along the stream (METHOD sec. 3).")
    if sites.causal:
        settings = grid(list(spaces), s_par=list(s_par))
        sw = sweep(model, batch, settings, batch_size=batch_size, progress=progress)
        rep.add(sweep_curves(sw), name="sweep",
                caption="Held-out perplexity change when the parallel part is scaled by s_par in each space, "
                        "all layers (s_par = 1 is the unedited model; hard-diag has no scale).")
    else:
        rep.add_text("No sweep: next-token loss does not apply to an encoder.", note=True)
    rep.add(attention_triptych(model, batch, layer, head, max_tokens=triptych_tokens), name="triptych",
            caption="One head's attention under no edit, hard diagonal removal (A_tt := 0, row renormalised) and "
                    "the V-Para effective diagonal (A_tt += (s_par - 1) beta_t, here s_par = 0: the diagonal becomes "
                    "-gamma_t and may be negative; rows are not renormalised).")
    rep.add(attention_triptych_figure(model, batch, layer, head, max_tokens=triptych_tokens), name="triptych_heatmap",
            caption="The same three patterns as heatmaps with a diverging scale centred on 0 (red = negative).")
    rep.add(colored_tokens(model, batch, layer, "attn", "par_frac", max_tokens=64), name="tokens_par_frac",
            caption=f"Each token coloured by how much of layer {layer}'s attention update lies along its stream.")
    rep.add(top_perpendicular_tokens(model, batch, k=8, max_sequences=4, max_tokens=64), name="top_perpendicular",
            caption="The tokens whose updates turn the stream most (||u_perp|| / ||r||), per layer and component.")
    rep.metadata["seconds"] = f"{time.time() - t0:.1f}"
    page = rep.save(out)
    (out / "report.json").write_text(json.dumps({
        "views": [{"title": v.title, "csv": f"{stem}.csv" if not v.data.empty else None}
                  for kind, v, _, stem in rep.items if kind == "view"],
        "triptych": {"layer": layer, "head": head},
        "libraries": rep.libraries(),
    }, indent=2))
    return page


__all__ = ["CHROMIUM_FLAGS", "Report", "build_report", "chromium_path", "external_references", "page_requests_off_machine",
           "pick_head", "read_netlog", "run_chromium"]
