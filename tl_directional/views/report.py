"""The standard offline HTML report, and the check that a page fetches nothing.

The page shell, :class:`~tl_directional.figures.page.Report` (re-exported here), inlines
each JavaScript library its views need exactly once (plotly.js about 4.8 MB,
circuitsvis's bundle about 1.3 MB), so the page opens from disk with no
network. :func:`build_report` is what ``tl-directional report`` runs: profile,
value-space head maps, a component-scaling sweep and the attention-map triptych,
plus the CSV behind every figure.

:func:`external_references` lists everything in a page that would make a browser
fetch from elsewhere (``src``/``href`` with a scheme or ``//``, CSS ``url(...)`` and
``@import``); the browser test asserts it is empty and, independently, that
Chromium's network log of the page shows no request (the headless-Chromium
harness lives with the tests, ``tests/browser/_browser.py``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd

from ..evaluate.sweeps import grid, sweep
from ..figures.page import Report
from ..io.outputs import check_output_path, check_replaceable, replace_dir
from ..measure import profile
from ..model.indices import normalize_index
from ..model.inputs import prepare_inputs
from ..model.sites import resolve_sites
from . import (
    attention_triptych,
    attention_triptych_figure,
    colored_tokens,
    depth_profile,
    head_heatmaps,
    sweep_curves,
    top_perpendicular_tokens,
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
    spaces: Sequence[str] = ("value-exclusive-joint", "value-exclusive", "value", "resid-attn", "resid-mlp", "hard-diag"),
    s_par: Sequence[float] = (0.0, 0.5, 1.0, 1.5),
    layer: int | None = None,
    head: int | None = None,
    triptych_tokens: int = 24,
    batch_size: int = 8,
    title: str | None = None,
    model_label: str | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> Path:
    """Profile, head maps, sweep and attention triptych of ``model`` on ``inputs``,
    written to ``out_dir/index.html`` with one CSV per figure (and ``profile/``, the
    profile's own tables). Returns the page's path.

    ``layer``/``head`` choose the triptych's head (default: :func:`pick_head`);
    the triptych and token views use the first sequence of ``inputs``.

    ``out_dir`` must be absent, empty or a previous report (its ``manifest.json`` says so);
    another command's output or other files are refused unless ``overwrite``. The page is
    built beside ``out_dir`` and swapped in complete (:func:`tl_directional.io.outputs.replace_dir`).
    """
    t0 = time.time()
    out = Path(out_dir)
    check_output_path(out_dir, "out_dir")  # before any work
    check_replaceable(out, "report", force=overwrite, force_hint="pass overwrite=True")
    sites = resolve_sites(model, warn=False)
    # checked before any work; negative indices count from the end
    layer = None if layer is None else normalize_index(layer, sites.n_layers, "layer")
    head = None if head is None else normalize_index(head, sites.n_heads, "head", "head")
    batch = prepare_inputs(model, inputs)
    prof = profile(model, batch, batch_size=batch_size, progress=progress)
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
                        "all layers (s_par = 1 is the unedited model; hard-diag has no scale). value-exclusive-joint "
                        "is the paper's edit (self message kept, one split over the concatenated heads), "
                        "value-exclusive the same per head, value the full aggregate (V-Para).")
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
    with replace_dir(out, "report", force=overwrite, force_hint="pass overwrite=True",
                     command="build_report") as tmp:
        prof.save(tmp / "profile", format="csv")
        rep.save(tmp)
        (tmp / "report.json").write_text(json.dumps({
            "views": [{"title": v.title, "csv": f"{stem}.csv" if not v.data.empty else None}
                      for kind, v, _, stem in rep.items if kind == "view"],
            "triptych": {"layer": layer, "head": head},
            "libraries": rep.libraries(),
        }, indent=2))
    return out / "index.html"


__all__ = ["build_report", "external_references", "pick_head"]
