"""Claim 3 of the seed (compression ranking): the page ``docs/results/claims_<stem>.md``, a pure
function of the committed data (:mod:`studies.compression.layout`), and the amended reading of
protocol sec. 9.5."""

from __future__ import annotations

from studies.claims import stats as S
from studies.compression.layout import DATA, LAYER_KEEP, PAGES, ROOT, DataError, load_data
from studies.compression.stats import (
    COMPARATORS,
    DIAG,
    FORMS,
    SEED,
    B,
    Study,
    diag_parts,
    label_form,
    verdict,
)
from tl_directional.core.paired import holm
from tl_directional.core.rank import spearman

_ci = S.interval
_fmt = S.fmt_interval


def _rho_lines(st, res, texts) -> list[str]:
    """The rho tables: two-level bootstrap, settings held fixed, each text, within method families."""
    import numpy as np

    L: list[str] = []
    L += ["## Spearman rho of each diagnostic with the loss increase", "",
          f"Over the {st.S} settings; interval from the two-level bootstrap (settings and windows). `raw MSE` "
          "(per-token mean `||e||^2`, not normalised) is reported, not compared.", "",
          "| diagnostics | " + " | ".join(DIAG) + " | raw MSE |", "|---|" + "---|" * (len(DIAG) + 1)]
    for f in FORMS:
        r = res[f]
        L.append(f"| {label_form(*f)} | " + " | ".join(_fmt(r[d], "+.2f") for d in DIAG)
                 + (f" | {_fmt(r['raw MSE'], '+.2f')} |" if "raw MSE" in r else " | |"))
    L += ["", "The same, settings held fixed (windows resampled only: the interval the earlier study reported):", "",
          "| diagnostics | " + " | ".join(DIAG) + " | T |", "|---|" + "---|" * (len(DIAG) + 1)]
    for f in FORMS[:1] + FORMS[4:5]:
        r = st.rhos(*f, fixed_settings=True)
        T = np.min(np.stack([r["perp"] - r[c] for c in COMPARATORS]), 0)
        L.append(f"| {label_form(*f)} | " + " | ".join(_fmt(r[d], "+.2f") for d in DIAG) + f" | {_fmt(T)} |")
    L += ["", "Each text on its own (full sample, attention per-token mean; the spread across texts):", "",
          "| text | " + " | ".join(DIAG) + " | T |", "|---|" + "---:|" * (len(DIAG) + 1)]
    for ti, t in enumerate(texts):
        w = st.text_weights(ti)
        y = st.loss_increase(w)
        vals = {}
        for d, (num, den, tr) in diag_parts("attn", "mean").items():
            vals[d] = float(spearman(st.pooled(num, den, tr, w), y, if_constant=0.0)[0])
        T = min(vals["perp"] - vals[c] for c in COMPARATORS)
        L.append(f"| `{t}` | " + " | ".join(f"{vals[d]:+.2f}" for d in DIAG) + f" | {T:+.3f} |")
    fam = {"quantisation (rtn, awq)": ("rtn", "awq"), "pruning (magnitude, wanda)": ("magnitude", "wanda")}
    L += ["", "Within method families (full sample, attention per-token mean; no interval):", "",
          "| family (settings) | " + " | ".join(DIAG) + " |", "|---|" + "---:|" * len(DIAG)]
    y_all = st.loss_increase()[:1]
    for name, methods in fam.items():
        sel = [i for i, lab in enumerate(st.labels) if st.methods[lab] in methods]
        if len(sel) < 3:
            continue
        cells = []
        for d, (num, den, tr) in diag_parts("attn", "mean").items():
            if d in DIAG:
                cells.append(f"{float(spearman(st.pooled(num, den, tr)[:1, sel], y_all[:, sel], if_constant=0.0)[0]):+.2f}")
        L.append(f"| {name} ({len(sel)}) | " + " | ".join(cells) + " |")
    return L


def _layer_lines(st) -> list[str]:
    """Per attention layer: Spearman of the layer's own diagnostics against the loss increase."""
    import numpy as np

    L: list[str] = []
    L += ["", "## Per attention layer (per-token mean, full sample)", "",
          "Spearman over settings of each layer's own diagnostic against the (whole-model) loss increase.", "",
          "| layer | rho perp | rho par | rho 1-cos | rho MSE | mean perp / mean par (over settings) |",
          "|---:|---:|---:|---:|---:|---:|"]
    lay = st.lay.groupby(["setting", "layer"], sort=True)[list(LAYER_KEEP)].sum().reset_index()
    y0 = st.loss_increase()[:1]
    for layer in sorted(lay.layer.unique()):
        g = lay[lay.layer == layer].set_index("setting").loc[st.labels]
        n = g["n"].to_numpy()
        vals = {"perp": g.t_err_perp.to_numpy() / n, "par": g.t_err_par.to_numpy() / n,
                "1-cos": 1 - g.t_cos.to_numpy() / n, "MSE": g.t_rel_mse.to_numpy() / n}
        rr = {d: float(spearman(v[None, :], y0, if_constant=0.0)[0]) for d, v in vals.items()}
        ratio = float(np.mean(vals["perp"]) / np.mean(vals["par"]))
        L.append(f"| {int(layer)} | " + " | ".join(f"{rr[d]:+.2f}" for d in DIAG) + f" | {ratio:.2f} |")
    return L


def _settings_lines(st, texts) -> list[str]:
    """The settings table (loss increase, per text, diagnostics) and the dense loss."""
    import numpy as np

    L: list[str] = []
    li = st.loss_increase()
    diag_cols = [("attn perp", "attn", "mean", "perp"), ("attn par", "attn", "mean", "par"),
                 ("attn 1-cos", "attn", "mean", "1-cos"), ("attn MSE", "attn", "mean", "MSE"),
                 ("block perp", "block", "mean", "perp"), ("block par", "block", "mean", "par")]
    vals = {}
    for name, unit, form, d in diag_cols:
        num, den, tr = diag_parts(unit, form)[d]
        vals[name] = st.pooled(num, den, tr)[0]
    L += ["", "## Settings", "",
          "Loss increase in nats per predicted token (compressed minus dense, token-weighted over the texts; "
          "interval over windows; then each text's own); diagnostics are per-token means pooled over layers (local error over the "
          "dense update).", "",
          "| setting | spec | loss increase [95% CI] | " + " | ".join(f"`{t}`" for t in texts) + " | "
          + " | ".join(c[0] for c in diag_cols) + " |",
          "|---|---|---|" + "---:|" * (len(texts) + len(diag_cols))]
    per_text = [st.loss_increase(st.text_weights(ti))[0] for ti in range(len(texts))]
    for i in np.argsort(li[0], kind="stable"):
        lab = st.labels[i]
        L.append(f"| {lab} | `{st.specs[i]}` | {_fmt(li[:, i], '+.4f')} | "
                 + " | ".join(f"{pt[i]:+.4f}" for pt in per_text) + " | "
                 + " | ".join(f"{vals[c[0]][i]:.4f}" for c in diag_cols) + " |")
    base = (st.cols["base_nll"][0] @ np.ones(st.W)) / st.cols["tokens"][0].sum()
    L += ["", f"Dense loss: {base:.4f} nats per predicted token (pooled over the texts); per text: "
          + ", ".join(f"`{t}` {st.cols['base_nll'][0][st.wtext == ti].sum() / st.cols['tokens'][0][st.wtext == ti].sum():.4f}"
                      for ti, t in enumerate(texts)) + ".", ""]
    return L


def build_page(stem: str) -> str:
    """The compression claims page of run ``stem`` (protocol sec. 6), from its committed data alone."""
    import numpy as np

    manifest, rec, lay = load_data(stem)
    st = Study(manifest, rec, lay)
    m = manifest["model"]
    S, texts = st.S, st.texts
    n_tok = int(st.cols["tokens"][0].sum())
    L = [f"# Claim 3, compression ranking: {m['name']}", ""]
    L += [
        "Does the perpendicular part of the layer error rank compression settings by their real damage "
        "(held-out loss increase) better than the parallel part, `1 - cos` and MSE? Protocol: "
        "[sec. 6 of the protocol](protocol.md#6-compression-ranking-claim-3-of-the-seed), written before this run. "
        "Built by `python scripts/compression_claims.py build` from "
        f"`docs/results/data/{stem}.*` alone (do not edit by hand; the suite rebuilds it byte for byte).",
        "",
    ]
    done = "complete" if manifest["complete"] else (
        f"**incomplete**: {S} of the grid's {len(manifest['grid'])} settings finished; the missing ones: "
        + ", ".join(f"`{s}`" for s in manifest["grid"] if s not in set(st.specs)))
    if manifest.get("runs"):
        L += [f"- Runs ({len(manifest['runs'])} processes, each on its part of the grid, the same windows; "
              f"joined, no measurement, by `{manifest['merged']}`); {done}:"]
        L += [f"    - `{r['command']}` at commit `{r['commit']}` ({r['date']}, {r.get('seconds') or 0:.0f} s, "
              f"{r['machine']}): {len(r['settings'])} settings" for r in manifest["runs"]]
    else:
        L += [f"- Run: `{manifest['command']}` at commit `{manifest['commit']}` ({manifest['date']}, "
              f"{manifest.get('seconds', 0):.0f} s, {manifest['machine']}); {done}."]
    sha = m.get("source_sha256") or "(not recorded)"
    if m["dequantised"]:
        L += [f"- Model: {m['name']} ({m['architecture']}, {m['n_layers']} layers, d_model {m['d_model']}), "
              f"**dequantised** to float32 from `{m['source_file']}` ({m['quantisation']}, sha256 `{sha}`; "
              f"float32 safetensors sha256 `{m.get('safetensors_sha256')}`). Caveat: the \"dense\" baseline is "
              "itself a 4-bit model dequantised, so every setting compresses an already-quantised model."]
    else:
        L += [f"- Model: {m['name']} ({m['architecture']}, {m['n_layers']} layers, d_model {m['d_model']}), "
              f"`{m['source_file']}`, quantisation: {m['quantisation']} (not dequantised), sha256 `{sha}`."]
    L += ["- Texts: " + "; ".join(f"`{t}` ({manifest['texts'][t]['description']}, sha256 "
                                   f"`{manifest['texts'][t]['sha256'][:12]}`)" for t in texts) + "."]
    L += [f"- Size: {S} settings x {len(texts)} texts x {manifest['windows']} windows of {manifest['seq_len']} "
          f"tokens = {n_tok} predicted tokens per setting. Calibration (Wanda norms, AWQ scales): windows "
          f"{manifest['calibration']['first_window']}-"
          f"{manifest['calibration']['first_window'] + manifest['calibration']['windows_per_text'] - 1} of each "
          f"text ({manifest['calibration']['tokens']} tokens), disjoint from the evaluation windows. Geometry: "
          f"{manifest['geometry']}.",
          f"- Intervals: 95% percentile, {B} resamples (seed {SEED}) that draw the settings with replacement "
          "**and** the windows with replacement within each text (one window draw shared by all settings); the "
          "worst comparator is taken inside each resample.", ""]

    # ---- verdicts ----------------------------------------------------------------------------
    res = {f: st.rhos(*f) for f in FORMS}
    L += ["## Verdict", "",
          "Statistic `T = min over c in {par, 1-cos, MSE} of (rho_perp - rho_c)`; held if its interval lies above "
          "0, failed if below, not decided otherwise. The first row is the pre-registered one (the paper's "
          "aggregation); the others are secondary.", "",
          "| diagnostics | T [95% CI] | rho_perp - rho_par | rho_perp - rho_1-cos | rho_perp - rho_MSE | "
          "perp beats (Holm, one-sided, 0.05) | verdict |",
          "|---|---|---|---|---|---|---|"]
    for f in FORMS:
        r = res[f]
        diffs = {c: r["perp"] - r[c] for c in COMPARATORS}
        T = np.min(np.stack([diffs[c] for c in COMPARATORS]), 0)
        pv = {c: float(np.mean(diffs[c][1:] <= 0)) for c in COMPARATORS}
        beats = holm(pv)
        beat = f"{len(beats)} of 3" + (f" ({', '.join(c for c in COMPARATORS if c in beats)})" if beats else "")
        name = label_form(*f) + (" (**pre-registered**)" if f == ("attn", "mean") else " (secondary)")
        L.append(f"| {name} | {_fmt(T)} | " + " | ".join(_fmt(diffs[c]) for c in COMPARATORS)
                 + f" | {beat} | {verdict(T, S) if f == ('attn', 'mean') else verdict(T, S).replace('**', '')} |")
    L += amended_reading(st, res)
    r0 = res[("attn", "mean")]
    best = max(DIAG, key=lambda d: (r0[d][0], d))
    neg = int((st.loss_increase()[0] < 0).sum())
    L += ["", f"Reading (computed): the highest full-sample rho on the pre-registered attention per-token mean is "
          f"{best}'s ({r0[best][0]:+.2f}; perp {r0['perp'][0]:+.2f}). {neg} of {S} settings lower the pooled loss "
          "(a negative loss increase)" + (": the ranking then mixes damage with such gains, see each text's own "
          "rhos and the settings table below." if neg else "."), ""]

    L += _rho_lines(st, res, texts) + _layer_lines(st) + _settings_lines(st, texts)
    L += ["Data: " + ", ".join(f"`{n}` (sha256 `{h[:12]}`)" for n, h in manifest["files"].items()) + "."]
    return "\n".join(L)


#: the revision's own four settings ("Compression Diagnostics": 4-bit AWQ and 50% Wanda,
#: unstructured, 4:8 and 2:4), as this grid spells them
PAPER_SETTINGS = ("awq:bits=4,group=32", "wanda:sparsity=0.5", "wanda:nm=4:8", "wanda:nm=2:4")


def amended_reading(st, res) -> list[str]:
    """Protocol sec. 9.5: perpendicular against parallel alone (the paper's comparison), and the
    paper's four settings separated per layer by each diagnostic."""
    import numpy as np

    r = res[("attn", "mean")]
    d = r["perp"] - r["par"]
    li = st.loss_increase()
    rho = {k: S.interval(r[k]) for k in DIAG}
    L = ["", "## Amended reading (protocol sec. 9.5): perpendicular against parallel alone", "",
         "The paper compares perpendicular with parallel error and does not claim to beat total error. "
         "Same two-level bootstrap and rule as the pre-registered verdict above, which stays as history.", "",
         "| diagnostics | rho_perp - rho_par [95% CI] | verdict (amended reading) |", "|---|---|---|",
         f"| attn, per-token mean | {_fmt(d)} | {verdict(d, st.S)} |", "",
         f"Power: the grid's loss increases span {float(li[0].min()):+.4f} to {float(li[0].max()):+.4f} nats, "
         "so every diagnostic that grows with the error ranks it well: full-sample rho "
         + ", ".join(f"{k} {rho[k][0]:+.2f}" for k in DIAG)
         + ". A difference between such rhos has little room to show; MSE and `1 - cos` are context here, "
         "not comparators."]
    idx = [st.specs.index(sp) for sp in PAPER_SETTINGS if sp in st.specs]
    if len(idx) < len(PAPER_SETTINGS):
        return L
    order = np.argsort(li[0][idx], kind="stable")  # by real damage, least first
    lay = st.lay.groupby(["setting", "layer"], sort=True)[list(LAYER_KEEP)].sum().reset_index()
    labels = [st.labels[i] for i in idx]
    per = {"perp": [], "par": []}
    for layer in sorted(lay.layer.unique()):
        g = lay[lay.layer == layer].set_index("setting").loc[labels]
        n = g["n"].to_numpy()
        per["perp"].append(g.t_err_perp.to_numpy() / n)
        per["par"].append(g.t_err_par.to_numpy() / n)
    L += ["", "### The paper's four settings, per attention layer (no verdict)", "",
          "Settings ordered by their loss increase here: "
          + " < ".join(f"`{PAPER_SETTINGS[i]}` ({li[0][idx[i]]:+.4f})" for i in order)
          + ". Per layer, each diagnostic's per-token means of the four settings: `same order` is the share of "
          "layers whose diagnostic orders the four as their damage does; `relative gap` the mean over layers of "
          "the smallest gap between neighbouring settings (sorted by the diagnostic) over their mean.", "",
          "| diagnostic | same order as damage (share of layers) | relative gap (mean over layers) |",
          "|---|---:|---:|"]
    for k, rows in per.items():
        a = np.array(rows)  # [layers, 4]
        same = float(np.mean([list(np.argsort(x, kind="stable")) == list(order) for x in a]))
        srt = np.sort(a, axis=1)
        gap = float(np.mean(np.min(np.diff(srt, axis=1), axis=1) / np.mean(a, axis=1)))
        L.append(f"| {k} | {same:.2f} | {gap:.3f} |")
    return L




def build_pages() -> dict:
    """``{path: text}`` of every compression claims page, one per ``compression_<model>`` run of
    :data:`DATA`; raises :class:`DataError` when there is none or a file is bad."""
    stems = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("compression_*.manifest.json"))
    if not stems:
        raise DataError(f"no compression data under {DATA.relative_to(ROOT)}")
    return {PAGES / f"claims_{stem}.md": build_page(stem) + "\n" for stem in stems}
