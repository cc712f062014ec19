"""Views (tl_directional.views) and reports (tl_directional.views.report), without a browser.

Checks the numbers behind every view against the library's own definitions (the
triptych's effective diagonal against METHOD sec. 4 computed from a cache), that
displays and saved pages are offline by construction (no socket is opened while
rendering, no external reference in the HTML, each library inlined once per page),
and the column contracts of the table-driven views. Rendering in a real browser is
tests/browser/test_report_browser.py.
"""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pandas as pd
import pytest
import torch

import tl_directional as tld
from tl_directional import views as tv
from tl_directional.figures.page import Report
from tl_directional.views.data import one_sequence
from tl_directional.views.report import external_references, pick_head

TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void."


@pytest.fixture(scope="module")
def gpt2(tiny_model):
    return tiny_model("gpt2")


@pytest.fixture(scope="module")
def prof(gpt2):
    return tld.profile(gpt2, [TEXT, "And God said, Let there be light: and there was light."],
                       per_token=True, progress=False)


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything opens a socket or calls urlopen while it runs."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    import urllib.request

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    import circuitsvis.utils.render as cv_render

    monkeypatch.setattr(cv_render, "internet_on", refuse)


def _lib_count(page: str, lib: str) -> int:
    return page.count(f'data-tld-lib="{lib}"')


def _strip_libraries(page: str) -> str:
    import re

    return re.sub(r'<script type="text/javascript" data-tld-lib="[a-z]+">.*?</script>', "", page, flags=re.S)


# ---------------------------------------------------------------------------------------------
# plotly views from tables
# ---------------------------------------------------------------------------------------------


def test_depth_profile_traces_and_data(prof):
    view = tv.depth_profile(prof)
    assert isinstance(view, tv.PlotlyView)
    n_layers = prof.residual["layer"].nunique()
    comps = list(dict.fromkeys(prof.residual["component"]))
    names = [t.name for t in view.figure.data if t.mode == "lines+markers"]
    assert sorted(set(names)) == sorted(comps)
    assert len(names) == 2 * len(comps)  # one line per component per metric row
    bands = [t for t in view.figure.data if t.fill == "toself"]
    assert len(bands) == 2 * 2 * len(comps)  # two bands per line
    assert len(view.data) == 2 * n_layers * len(comps)
    attn = view.data[(view.data.metric == "par_frac") & (view.data.component == "attn")].sort_values("layer")
    ref = prof.residual[prof.residual.component == "attn"].sort_values("layer")
    np.testing.assert_allclose(attn["value"].to_numpy(), ref["par_frac_median"].to_numpy())
    np.testing.assert_allclose(attn["q25"].to_numpy(), ref["par_frac_q25"].to_numpy())
    assert view.figure.layout.yaxis2.type == "log"  # par_perp_ratio row


def test_depth_profile_accepts_table_and_checks_columns(prof):
    v = tv.depth_profile(prof.residual, "energy_ratio", components=["mlp"], bands=False)
    assert [t.name for t in v.figure.data] == ["mlp"]
    with pytest.raises(ValueError, match="metrics has 'bogus'"):
        tv.depth_profile(prof, "bogus")
    with pytest.raises(ValueError, match="components"):
        tv.depth_profile(prof, components=["nope"])
    with pytest.raises(ValueError, match="lacks column"):
        tv.depth_profile(pd.DataFrame({"layer": [0], "component": ["attn"]}))


def test_head_heatmaps_grid_matches_value_table(prof):
    view = tv.head_heatmaps(prof)
    heat = [t for t in view.figure.data if t.type == "heatmap"]
    assert len(heat) == 3
    n_layers, n_heads = prof.value["layer"].max() + 1, prof.value["head"].max() + 1
    z = np.array(heat[0].z, dtype=float)
    assert z.shape == (n_layers, n_heads)
    for _, r in prof.value.iterrows():
        assert z[int(r["layer"]), int(r["head"])] == pytest.approx(r["beta_mean"])
    assert heat[0].zmid == 0 and heat[0].zmin == -heat[0].zmax  # beta is signed: diverging, centred
    assert heat[1].zmid is None  # A_tt is a weight: sequential scale
    assert set(view.data.metric) == {"beta_mean", "A_tt_mean", "phi_mean"}
    with pytest.raises(ValueError, match="lacks column"):
        tv.head_heatmaps(prof, "beta", stat="q99")


def test_sweep_curves_from_sweep_table(gpt2):
    settings = tld.grid(["value", "resid-attn", "hard-diag"], s_par=[0.0, 1.0])
    df = tld.sweep(gpt2, [TEXT], settings, progress=False)
    view = tv.sweep_curves(df)
    names = sorted(t.name for t in view.figure.data)
    assert names == ["resid-attn", "value"]
    value = next(t for t in view.figure.data if t.name == "value")
    assert list(value.x) == [0.0, 1.0]
    assert value.y[1] == pytest.approx(0.0, abs=1e-6)  # s_par = 1 is the unedited model
    hard = df[df.space == "hard-diag"].delta_ppl.iloc[0]
    assert any(s.y0 == pytest.approx(hard) for s in view.figure.layout.shapes)  # hard-diag as a line
    assert "baseline" in set(view.data.space)


def test_compression_errors_documented_columns():
    rows = []
    for method, scale in (("rtn4", 1.0), ("wanda50", 2.0), ("drop1", 0.0)):
        for unit in ("attn", "mlp"):
            for L in range(3):
                rows.append({"compressed": method, "unit": unit, "layer": L,
                             "err_perp_energy": scale * (L + 1) * 0.1, "err_par_energy": scale * 0.05,
                             "by_construction_parallel": method == "drop1" and L == 1})
    df = pd.DataFrame(rows)
    view = tv.compression_errors(df)
    lines = view.figure.data
    assert len(lines) == 3 * 2 * 2  # methods x units x metrics
    assert {t.name for t in lines} == {f"{m}: {k}" for m in ("rtn4", "wanda50", "drop1")
                                       for k in ("err_perp_energy", "err_par_energy")}
    drop = next(t for t in lines if t.name == "drop1: err_perp_energy")
    assert list(drop.marker.symbol) == ["circle", "x", "circle"]
    assert {t.line.dash for t in lines} == {"solid", "dash"}
    assert list(view.data.columns) == ["compressed", "layer", "unit", "err_perp_energy", "err_par_energy",
                                       "by_construction_parallel"]
    # a plain single-method table without a unit column works too
    single = tv.compression_errors(pd.DataFrame({"layer": [0, 1], "cos_sim": [0.9, 0.8]}), "cos_sim")
    assert len(single.figure.data) == 1
    with pytest.raises(ValueError, match="lacks column"):
        tv.compression_errors(df, "nope")


def test_compression_errors_on_compression_geometry_output(gpt2):
    # (this test used to skip itself on any AttributeError, and so never ran)
    from tl_directional.compression import compression_geometry
    from tl_directional.compression.compressors import quantize_rtn

    targets = {"rtn4": quantize_rtn(gpt2, bits=4), "rtn8": quantize_rtn(gpt2, bits=8)}
    table = compression_geometry(gpt2, targets, [TEXT])
    view = tv.compression_errors(table)
    assert {t.name.split(":")[0] for t in view.figure.data} == {"rtn4", "rtn8"}


def test_training_curves_mean_and_band():
    rows = []
    for variant, off in (("baseline", 0.0), ("vpara", 0.1), ("attn-para", 0.3)):
        for seed in (0, 1):
            for step in (0, 10, 20):
                rows.append({"variant": variant, "seed": seed, "step": step, "train_loss": 5.0,
                             "val_loss": 5.0 - step * 0.1 + off + seed * 0.2})
            rows.append({"variant": variant, "seed": seed, "step": 5, "train_loss": 4.0, "val_loss": float("nan")})
    df = pd.DataFrame(rows)
    view = tv.training_curves(df)
    lines = [t for t in view.figure.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["baseline (2 seeds)", "vpara (2 seeds)", "attn-para (2 seeds)"]
    base = lines[0]
    assert list(base.x) == [0, 10, 20]  # the NaN val_loss row is skipped
    np.testing.assert_allclose(base.y, [5.1, 4.1, 3.1])
    bands = [t for t in view.figure.data if t.fill == "toself"]
    assert len(bands) == 3
    np.testing.assert_allclose(bands[0].y[:3], [5.2, 4.2, 3.2])  # max over seeds, forward
    per_file = [df[df.variant == v] for v in ("baseline", "vpara")]
    assert len(tv.training_curves(per_file, "train_loss", band="none").figure.data) == 2
    with pytest.raises(ValueError, match="band"):
        tv.training_curves(df, band="iqr")


# ---------------------------------------------------------------------------------------------
# attention triptych
# ---------------------------------------------------------------------------------------------


def test_edited_patterns_follow_method_sec4(gpt2):
    layer, head = 1, 2
    toks, pats = tv.edited_patterns(gpt2, TEXT, layer, head)
    base, hard, eff = (pats[k] for k in pats)
    n = len(toks)
    assert base.shape == hard.shape == eff.shape == (n, n)
    np.testing.assert_allclose(base.sum(-1), 1.0, atol=1e-5)
    # hard removal: A_tt := 0 and renormalised, except the row without off-diagonal mass (row 0)
    assert hard[0, 0] == pytest.approx(base[0, 0])
    np.testing.assert_allclose(np.diag(hard)[1:], 0.0, atol=1e-7)
    np.testing.assert_allclose(hard.sum(-1), 1.0, atol=1e-5)
    # effective diagonal at s_par = 0: A_tt - beta_t = -gamma_t, off-diagonal untouched
    sites = tld.resolve_sites(gpt2, warn=False)
    tokens = one_sequence(gpt2, TEXT, 0, 32)
    _, cache = gpt2.run_with_cache(tokens, names_filter=lambda nm: nm in (sites.value[layer].z_hook,
                                                                          sites.value[layer].v_hook))
    o = cache[sites.value[layer].z_hook][0, :, head].double()
    v = cache[sites.value[layer].v_hook][0, :, sites.kv_head(head)].double()
    beta = ((o * v).sum(-1) / (v * v).sum(-1)).numpy()
    np.testing.assert_allclose(np.diag(eff), np.diag(base) - beta, atol=1e-5)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(eff[off], base[off], atol=1e-7)
    assert np.diag(eff)[0] == pytest.approx(0.0, abs=1e-5)  # o_0 = v_0: beta_0 = 1


def test_attention_triptych_keeps_negative_entries(gpt2):
    edits = {"baseline": [], "push the diagonal below 0": [tld.EffectiveDiagonal(-1.0, layers=[1], heads=[0])]}
    view = tv.attention_triptych(gpt2, TEXT, 1, 0, edits=edits)
    assert isinstance(view, tv.CircuitsVisView)
    assert [p[0] for p in view.panels] == ["AttentionPattern"] * 2
    props = view.panels[1][1]
    att = np.array(props["attention"])
    assert att.min() < 0  # negative entries reach the widget unclipped ...
    assert props["minValue"] == -props["maxValue"]  # ... on a symmetric scale
    assert props["maxValue"] == pytest.approx(max(abs(view.data["value"])), rel=1e-6)
    edited = view.data[view.data.edit == "push the diagonal below 0"]
    assert edited["value"].min() == pytest.approx(att.min(), abs=1e-5)
    assert "negative" in view.legend_html
    body = view.body_html()
    assert body.count("CircuitsVis.render(") == 2
    assert external_references(body) == []
    default = tv.attention_triptych(gpt2, TEXT, 0, 1, max_tokens=8)
    assert [h for *_, h in default.panels] == ["baseline", "hard diagonal removal",
                                               "V-Para effective diagonal (s_par=0)"]
    assert len(default.panels[0][1]["tokens"]) == 8


def test_attention_triptych_figure_diverging(gpt2):
    view = tv.attention_triptych_figure(gpt2, TEXT, 1, 3, max_tokens=10)
    heat = view.figure.data
    assert len(heat) == 3 and all(h.zmid == 0 and h.zmin == -h.zmax for h in heat)
    assert np.array(heat[2].z).shape == (10, 10)


def test_triptych_argument_errors(gpt2):
    with pytest.raises(ValueError, match="layer=9"):
        tv.edited_patterns(gpt2, TEXT, 9, 0)
    with pytest.raises(ValueError, match="head=7"):
        tv.attention_triptych(gpt2, TEXT, 0, 7)
    with pytest.raises(ValueError, match="sequence=3"):
        tv.edited_patterns(gpt2, TEXT, 0, 0, sequence=3)


# ---------------------------------------------------------------------------------------------
# token views
# ---------------------------------------------------------------------------------------------


def test_colored_tokens_values_match_profile(gpt2):
    view = tv.colored_tokens(gpt2, TEXT, 1, "mlp", "par_frac")
    props = view.panels[0][1]
    p1 = tld.profile(gpt2, TEXT, per_token=True, components=["mlp"], progress=False, exclude_first_token=False)
    ref = p1.tokens[(p1.tokens.layer == 1) & (p1.tokens.component == "mlp")].sort_values("position")
    np.testing.assert_allclose(props["values"], ref["par_frac"].to_numpy(), atol=1e-5)
    assert len(props["tokens"]) == len(props["values"])
    assert (props["minValue"], props["maxValue"]) == (0.0, 1.0)
    alpha = tv.colored_tokens(gpt2, TEXT, 0, "attn", "alpha").panels[0][1]
    assert alpha["minValue"] == -alpha["maxValue"]
    beta = tv.colored_tokens(gpt2, TEXT, 0, "value", "beta", head=1)
    assert beta.data["head"].iloc[0] == 1
    with pytest.raises(ValueError, match="needs head"):
        tv.colored_tokens(gpt2, TEXT, 0, "value", "beta")
    with pytest.raises(ValueError, match="not per-token"):
        tv.colored_tokens(gpt2, TEXT, 0, "attn", "beta")


def test_colored_tokens_reuses_profile(gpt2, prof):
    view = tv.colored_tokens(gpt2, [TEXT, "And God said, Let there be light: and there was light."], 0,
                             "attn", "rel_update", sequence=1, profile=prof)
    ref = prof.tokens[(prof.tokens.layer == 0) & (prof.tokens.component == "attn") & (prof.tokens.sequence == 1)]
    assert len(view.data) == len(ref)


def test_colored_tokens_multi(gpt2):
    view = tv.colored_tokens_multi(gpt2, TEXT, 1)
    props = view.panels[0][1]
    assert props["labels"] == [f"{c} {m}" for c in ("attn", "mlp", "block") for m in ("par_frac", "alpha")]
    assert np.array(props["values"]).shape == (len(props["tokens"]), 6)
    with pytest.raises(ValueError, match="components"):
        tv.colored_tokens_multi(gpt2, TEXT, 1, components=["value"])


def test_top_perpendicular_tokens(gpt2):
    view = tv.top_perpendicular_tokens(gpt2, [TEXT, "And God said, Let there be light."], k=3)
    top = view.data
    assert set(top.groupby(["layer", "component"]).size()) == {3}
    assert (top.groupby(["layer", "component"])["perp_rel"].apply(lambda s: s.is_monotonic_decreasing)).all()
    # perp_rel is ||u_perp|| / ||r||, checked against the cache for the first row
    sites = tld.resolve_sites(gpt2, warn=False)
    r0 = top.iloc[0]
    unit = sites.units[r0.component][int(r0.layer)]
    batch = tld.prepare_inputs(gpt2, [TEXT, "And God said, Let there be light."])
    _, cache = gpt2.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    u = cache[unit.update_hook][int(r0.sequence), int(r0.position)].double()
    r = cache[unit.reference_hook][int(r0.sequence), int(r0.position)].double()
    if unit.update_is_difference:
        u = u - r
    perp = u - (u @ r) / (r @ r) * r
    assert r0.perp_rel == pytest.approx(float(perp.norm() / r.norm()), rel=1e-4)
    props = view.panels[0][1]
    assert len(props["topkVals"]) == 2 and max(max(max(x) for x in L) for L in props["topkVals"][0]) <= 1.0 + 1e-9


def test_perpendicular_size_degenerate_is_nan():
    t = pd.DataFrame({"rel_update": [2.0, math.inf], "par_frac": [0.6, 0.0]})
    s = tv.perpendicular_size(t)
    assert s.iloc[0] == pytest.approx(1.6) and math.isnan(s.iloc[1])


# ---------------------------------------------------------------------------------------------
# display and saving: offline by construction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["once", "inline"])
def test_notebook_display_never_touches_the_network(gpt2, prof, no_network, mode):
    from tl_directional.figures import notebook_output

    notebook_output._reset()  # a fresh kernel: the first output carries the libraries
    previous = tv.set_notebook_libraries(mode)
    try:
        plot = tv.depth_profile(prof)
        cv = tv.attention_triptych(gpt2, TEXT, 1, 0, max_tokens=6)
        for view, lib, marker in ((plot, "plotly", "plotly.js v"), (cv, "circuitsvis", "var CircuitsVis=")):
            out = view._repr_html_()
            assert _lib_count(out, lib) == 1 and out.count(marker) == 1
            assert external_references(out) == []
            own = _strip_libraries(out)  # the libraries' code mentions URLs in strings; the rest may not
            assert "unpkg.com" not in own and "cdn.plot.ly" not in own and "http" not in own
            assert "sourceMappingURL" not in out
        again = cv._repr_html_()
        assert "CircuitsVis.render(" in again
        assert _lib_count(again, "circuitsvis") == (1 if mode == "inline" else 0)  # once: the first carried it
        assert external_references(again) == []
    finally:
        tv.set_notebook_libraries(previous)
        notebook_output._reset()


def test_view_save(tmp_path, prof):
    view = tv.head_heatmaps(prof)
    page = view.save(tmp_path / "heads.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and _lib_count(page, "plotly") == 1
    assert _lib_count(page, "circuitsvis") == 0 and external_references(page) == []
    csv = pd.read_csv(view.save(tmp_path / "heads.csv"))
    assert len(csv) == len(view.data)
    fig = json.loads(view.save(tmp_path / "heads.json").read_text())
    assert fig["data"][0]["type"] == "heatmap"
    with pytest.raises(ValueError, match="save"):
        view.save(tmp_path / "heads.png")
    assert view.update_layout(height=500) is view.figure  # attribute access falls through


def test_report_inlines_each_library_once(tmp_path, gpt2, prof):
    rep = Report("t", metadata={"model": "tiny"})
    rep.add(tv.depth_profile(prof)).add(tv.head_heatmaps(prof))
    rep.add(tv.attention_triptych(gpt2, TEXT, 1, 0, max_tokens=6))
    rep.add(tv.colored_tokens(gpt2, TEXT, 0), name="tok").add(tv.colored_tokens(gpt2, TEXT, 1), name="tok")
    rep.add_text("a <note>", note=True)
    page = rep.save(tmp_path / "rep")
    html = page.read_text()
    assert _lib_count(html, "plotly") == 1 and html.count("plotly.js v") == 1
    assert _lib_count(html, "circuitsvis") == 1 and html.count("var CircuitsVis=") == 1
    assert html.count("CircuitsVis.render(") == 3 + 1 + 1
    assert html.count("Plotly.newPlot(") == 2
    assert external_references(html) == []
    assert "a &lt;note&gt;" in html
    assert (tmp_path / "rep" / "tok.csv").exists() and (tmp_path / "rep" / "tok_2.csv").exists()
    only = rep.save(tmp_path / "one.html")
    assert only.name == "one.html" and 'href="tok.csv"' not in only.read_text()


def test_json_props_cannot_close_the_script():
    view = tv.CircuitsVisView([("ColoredTokens", {"tokens": ["</script><script>alert(1)</script>", "b"],
                                                  "values": [float("nan"), 1.0]}, "h")], title="x")
    body = view.body_html()
    assert "</script><script>alert" not in body
    assert "NaN" not in body and "null" in body


def test_external_references_detects_every_kind():
    page = """<html><head><script src="https://cdn.example.com/a.js"></script>
    <link rel="stylesheet" href="//fonts.example.com/b.css"><style>@import url("http://x.example/c.css");
    body { background: url(https://x.example/d.png) }</style></head><body>
    <img src="http://x.example/e.png"><iframe src="https://x.example/f"></iframe>
    <div style="background-image:url('https://x.example/g.png')"></div>
    <img src="data:image/png;base64,AAAA"><a href="local.csv">ok</a><script>var s="https://not.a.request";</script>
    </body></html>"""
    refs = external_references(page)
    for needle in ("cdn.example.com/a.js", "//fonts.example.com/b.css", "@import http://x.example/c.css",
                   "x.example/d.png", "x.example/e.png", "x.example/f", "x.example/g.png"):
        assert any(needle in r for r in refs), (needle, refs)
    assert not any("data:" in r or "local.csv" in r or "not.a.request" in r for r in refs)


def test_pick_head_prefers_self_attention(prof):
    L, H = pick_head(prof.value)
    sub = prof.value[prof.value.layer > 0]
    v = prof.value
    assert v[(v["layer"] == L) & (v["head"] == H)]["A_tt_mean"].iloc[0] == sub["A_tt_mean"].max()


def test_libraries_come_from_installed_packages():
    assert "window.Plotly" in tv.plotly_js() and "</script" not in tv.plotly_js()
    js = tv.circuitsvis_js()
    assert js.startswith('"use strict";var CircuitsVis=') and "</script" not in js
    assert torch.__version__  # the views import torch-free paths lazily; torch is present anyway


def test_docs_views_page_runs_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    """docs/views.md's code blocks run top to bottom (on the tiny GPT-2 instead of "default")."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("tld_docs_run_snippets_views", root / "docs" / "run_snippets.py")
    snippets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippets)
    monkeypatch.chdir(tmp_path)
    out = "".join(snippets.run_page(root / "docs" / "views.md", model=str(tiny_model_dir("gpt2"))))
    assert (tmp_path / "depth_profile.html").is_file() and (tmp_path / "depth_profile.csv").is_file()
    assert "hard diagonal removal" in out and "perp_rel" in out
    assert "index.html ['depth_profile.csv', 'tokens_par_frac.csv', 'triptych.csv']" in out
    assert len(snippets.MODEL_LINE.findall((root / "docs" / "views.md").read_text())) == 1
