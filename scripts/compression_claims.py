"""Claim 3 of the seed (compression ranking), as committed data and pages built from it alone.

The protocol (statistic, bootstrap, symmetric verdict rule) is sec. 6 of
``docs/results/protocol.md``; it was written before these runs. Two steps:

    # measure: per-(setting, text, window) records of every compression setting of the grid;
    # refuses a dirty tl_directional/ or scripts/; rewrites the data files after each setting
    python scripts/compression_claims.py run --model default --windows 32
    python scripts/compression_claims.py run --model smollm2-135m --windows 12

    # a run split over two processes (another part of the grid each, --grid ... --tag b):
    python scripts/compression_claims.py merge --into compression_smollm2-135m --from compression_smollm2-135m_b

    # build every compression claims page from docs/results/data/compression_*.* alone;
    # --check compares with the pages on disk and fails on any difference (the suite runs it)
    python scripts/compression_claims.py build [--check]

Data files (``docs/results/data/compression_<model>.*``): ``records.csv`` (setting, text, window,
tokens, nll, base_nll and, per unit attn / mlp / block, sums over layers and tokens of the
local-error statistics of ``tl_directional.compression.geometry``), ``layers.csv`` (the same per
attention layer) and ``manifest.json`` (command, commit, model source file / quantisation /
sha256, "dequantised", texts and their sha256, the grid, per-file sha256). A page is a pure
function of those files.

The compression itself is the library's (``tl_directional.compression.compressors.compress`` on spec strings,
``tl_directional.compression.compression_geometry`` in local mode), as in
``scripts/compression_study.py``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = _common.ROOT

import claims as C  # noqa: E402  (shared data layout, hashing, bootstrap formatting, Holm)

DATA = ROOT / "docs" / "results" / "data"
PAGES = ROOT / "docs" / "results"
TEXTS = C.TEXTS
#: source file and quantisation per catalogue model; the default model is bundled float32
SOURCES = {
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1", True),
    "default": ("tl_directional/data/default_model/model.safetensors (bundled)", "none (float32 as trained)", False),
}
#: the protocol's grid (sec. 6), in the protocol's order
GRID = (
    "rtn:bits=8",
    "rtn:bits=6",
    "rtn:bits=5",
    "rtn:bits=4",
    "rtn:bits=4,group=32,sym=1",
    "rtn:bits=4,group=128,sym=0",
    "rtn:bits=3",
    "rtn:bits=3,group=32,sym=0",
    "rtn:bits=2,group=32,sym=0",
    "awq:bits=4,group=32",
    "awq:bits=3,group=32",
    "magnitude:sparsity=0.2",
    "magnitude:sparsity=0.4",
    "magnitude:sparsity=0.6",
    "magnitude:nm=2:4",
    "wanda:sparsity=0.3",
    "wanda:sparsity=0.5",
    "wanda:sparsity=0.7",
    "wanda:nm=4:8",
    "wanda:nm=2:4",
    "svd:rank=0.75",
    "svd:rank=0.5",
    "svd:rank=0.25",
)
#: the order a run measures them in: families and strengths interleaved, so that a run stopped
#: early still spans the range of damage
RUN_ORDER = (
    "rtn:bits=4",
    "wanda:sparsity=0.5",
    "svd:rank=0.5",
    "awq:bits=4,group=32",
    "magnitude:sparsity=0.4",
    "rtn:bits=3",
    "wanda:nm=2:4",
    "rtn:bits=8",
    "magnitude:sparsity=0.6",
    "svd:rank=0.75",
    "wanda:sparsity=0.3",
    "rtn:bits=4,group=128,sym=0",
    "awq:bits=3,group=32",
    "magnitude:nm=2:4",
    "rtn:bits=2,group=32,sym=0",
    "wanda:nm=4:8",
    "rtn:bits=6",
    "svd:rank=0.25",
    "magnitude:sparsity=0.2",
    "rtn:bits=3,group=32,sym=0",
    "wanda:sparsity=0.7",
    "rtn:bits=4,group=32,sym=1",
    "rtn:bits=5",
)
assert sorted(RUN_ORDER) == sorted(GRID)
CALIB_START, CALIB_PER_TEXT = 64, 4  # calibration windows 64-67 of each text
UNITS = ("attn", "mlp", "block")
#: sums kept per unit (names of tl_directional.compression.geometry.STAT_NAMES)
KEEP = ("n", "t_err_par", "t_err_perp", "t_cos", "t_rel_mse", "u_sq", "e_sq", "e_par_sq", "e_perp_sq")
LAYER_KEEP = ("n", "t_err_par", "t_err_perp", "t_cos", "t_rel_mse")


from tl_directional.core.paired import holm  # noqa: E402
from tl_directional.core.rank import spearman  # noqa: E402

DataError = C.DataError
sha256_bytes = _common.sha256_bytes
git_state = _common.git_state
_csv = C._csv
_ci = C._ci
_fmt = C._fmt

# The study's parts, one module per job (re-exported): measuring (compression_claims_run) and
# statistics (compression_claims_stats); this module reads the data and renders the pages.
from compression_claims_run import _nll, run  # noqa: E402, F401
from compression_claims_stats import (  # noqa: E402, F401
    COMPARATORS,
    DIAG,
    FORMS,
    MIN_SETTINGS,
    SEED,
    B,
    Study,
    _diag_parts,
    _label_form,
    _verdict,
)


def _default_sha256() -> str | None:
    from tl_directional.model.load import bundled_model_dir

    d = bundled_model_dir()
    return sha256_bytes((d / "model.safetensors").read_bytes()) if d is not None else None


def _expected_source_sha(name: str) -> str | None:
    if name == "default":
        return _default_sha256()
    from tl_directional.model.load.catalog import REAL_MODELS

    return REAL_MODELS[name].source_sha256 if name in REAL_MODELS else None


# ---------------------------------------------------------------------------
# build (pure function of the data)
# ---------------------------------------------------------------------------


def _write_data(stem, rec, lay, manifest):
    manifest["files"] = {}
    files = {f"{stem}.records.csv": _csv(rec), f"{stem}.layers.csv": _csv(lay)}
    _common.write_data(DATA, files, manifest, f"{stem}.manifest.json")


def load_data(stem: str):
    import pandas as pd

    mpath = DATA / f"{stem}.manifest.json"
    manifest = _common.read_data_manifest(mpath, str(mpath.relative_to(ROOT)), DataError)
    frames = {}
    for name in (f"{stem}.records.csv", f"{stem}.layers.csv"):
        p = DATA / name
        want = manifest.get("files", {}).get(name)
        if want is None:
            raise DataError(f"{mpath.relative_to(ROOT)}: does not name {name}; rerun")
        b = _common.checked_bytes(p, want, str(p.relative_to(ROOT)), mpath.name, DataError)
        try:
            frames[name.split(".")[-2]] = pd.read_csv(io.BytesIO(b))
        except ValueError as e:
            raise DataError(f"{p.relative_to(ROOT)}: cannot parse ({e})") from None
    m = manifest["model"]
    exp = _expected_source_sha(m["name"])
    if exp is not None and exp != m["source_sha256"]:
        raise DataError(f"{mpath.relative_to(ROOT)}: model source sha256 {str(m['source_sha256'])[:12]} is not "
                        f"the installed {m['name']}'s ({exp[:12]}): data from another model")
    if "+dirty" in manifest["commit"] or any("+dirty" in r["commit"] for r in manifest.get("runs", [])):
        raise DataError(f"{mpath.relative_to(ROOT)}: made from a dirty tree ({manifest['commit']}); rerun from a "
                        "clean one")
    rec = frames["records"]
    need = {"setting", "text", "window", "tokens", "nll", "base_nll"} | {f"{u}_{k}" for u in UNITS for k in KEEP}
    if need - set(rec.columns):
        raise DataError(f"{(DATA / f'{stem}.records.csv').relative_to(ROOT)}: columns missing: "
                        + ", ".join(sorted(need - set(rec.columns))))
    return manifest, rec, frames["layers"]


def build_page(stem: str) -> str:
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
        name = _label_form(*f) + (" (**pre-registered**)" if f == ("attn", "mean") else " (secondary)")
        L.append(f"| {name} | {_fmt(T)} | " + " | ".join(_fmt(diffs[c]) for c in COMPARATORS)
                 + f" | {beat} | {_verdict(T, S) if f == ('attn', 'mean') else _verdict(T, S).replace('**', '')} |")
    L += amended_reading(st, res)
    r0 = res[("attn", "mean")]
    best = max(DIAG, key=lambda d: (r0[d][0], d))
    neg = int((st.loss_increase()[0] < 0).sum())
    L += ["", f"Reading (computed): the highest full-sample rho on the pre-registered attention per-token mean is "
          f"{best}'s ({r0[best][0]:+.2f}; perp {r0['perp'][0]:+.2f}). {neg} of {S} settings lower the pooled loss "
          "(a negative loss increase)" + (": the ranking then mixes damage with such gains, see each text's own "
          "rhos and the settings table below." if neg else "."), ""]

    # ---- rho table ---------------------------------------------------------------------------
    L += ["## Spearman rho of each diagnostic with the loss increase", "",
          f"Over the {S} settings; interval from the two-level bootstrap (settings and windows). `raw MSE` "
          "(per-token mean `||e||^2`, not normalised) is reported, not compared.", "",
          "| diagnostics | " + " | ".join(DIAG) + " | raw MSE |", "|---|" + "---|" * (len(DIAG) + 1)]
    for f in FORMS:
        r = res[f]
        L.append(f"| {_label_form(*f)} | " + " | ".join(_fmt(r[d], "+.2f") for d in DIAG)
                 + (f" | {_fmt(r['raw MSE'], '+.2f')} |" if "raw MSE" in r else " | |"))
    L += ["", "The same, settings held fixed (windows resampled only: the interval the earlier study reported):", "",
          "| diagnostics | " + " | ".join(DIAG) + " | T |", "|---|" + "---|" * (len(DIAG) + 1)]
    for f in FORMS[:1] + FORMS[4:5]:
        r = st.rhos(*f, fixed_settings=True)
        T = np.min(np.stack([r["perp"] - r[c] for c in COMPARATORS]), 0)
        L.append(f"| {_label_form(*f)} | " + " | ".join(_fmt(r[d], "+.2f") for d in DIAG) + f" | {_fmt(T)} |")
    L += ["", "Each text on its own (full sample, attention per-token mean; the spread across texts):", "",
          "| text | " + " | ".join(DIAG) + " | T |", "|---|" + "---:|" * (len(DIAG) + 1)]
    for ti, t in enumerate(texts):
        w = st.text_weights(ti)
        y = st.loss_increase(w)
        vals = {}
        for d, (num, den, tr) in _diag_parts("attn", "mean").items():
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
        for d, (num, den, tr) in _diag_parts("attn", "mean").items():
            if d in DIAG:
                cells.append(f"{float(spearman(st.pooled(num, den, tr)[:1, sel], y_all[:, sel], if_constant=0.0)[0]):+.2f}")
        L.append(f"| {name} ({len(sel)}) | " + " | ".join(cells) + " |")

    # ---- per layer ---------------------------------------------------------------------------
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

    # ---- settings ----------------------------------------------------------------------------
    li = st.loss_increase()
    diag_cols = [("attn perp", "attn", "mean", "perp"), ("attn par", "attn", "mean", "par"),
                 ("attn 1-cos", "attn", "mean", "1-cos"), ("attn MSE", "attn", "mean", "MSE"),
                 ("block perp", "block", "mean", "perp"), ("block par", "block", "mean", "par")]
    vals = {}
    for name, unit, form, d in diag_cols:
        num, den, tr = _diag_parts(unit, form)[d]
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
    rho = {k: C._ci(r[k]) for k in DIAG}
    L = ["", "## Amended reading (protocol sec. 9.5): perpendicular against parallel alone", "",
         "The paper compares perpendicular with parallel error and does not claim to beat total error. "
         "Same two-level bootstrap and rule as the pre-registered verdict above, which stays as history.", "",
         "| diagnostics | rho_perp - rho_par [95% CI] | verdict (amended reading) |", "|---|---|---|",
         f"| attn, per-token mean | {_fmt(d)} | {_verdict(d, st.S)} |", "",
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


def merge(into: str, other: str) -> int:
    """Join a second run of the same model, windows and texts (another part of the grid, run as a
    separate process with ``--tag``) into ``into``'s data files; the manifest lists each run with
    its commit, command and settings, and the second run's files are removed."""
    import numpy as np
    import pandas as pd

    try:
        ma, ra, la = load_data(into)
        mb, rb, lb = load_data(other)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for key in ("windows", "seq_len", "texts", "grid", "calibration", "geometry"):
        if ma[key] != mb[key]:
            print(f"error: {into} and {other} differ in {key}", file=sys.stderr)
            return 2
    if ma["model"] != mb["model"]:
        print(f"error: {into} and {other} hold different models", file=sys.stderr)
        return 2
    if {s["spec"] for s in ma["settings"]} & {s["spec"] for s in mb["settings"]}:
        print(f"error: {into} and {other} share settings", file=sys.stderr)
        return 2
    ka = ra.drop_duplicates(["text", "window"]).set_index(["text", "window"])[["tokens", "base_nll"]]
    kb = rb.drop_duplicates(["text", "window"]).set_index(["text", "window"])[["tokens", "base_nll"]]
    if not (ka.index.equals(kb.index) and np.array_equal(ka.to_numpy(), kb.loc[ka.index].to_numpy())):
        print(f"error: {into} and {other} were measured on other windows (dense NLL differs)", file=sys.stderr)
        return 2
    runs = ma.get("runs") or [{k: ma[k] for k in ("command", "commit", "date", "machine")}
                              | {"settings": [s["spec"] for s in ma["settings"]], "seconds": ma.get("seconds")}]
    runs = runs + [{k: mb[k] for k in ("command", "commit", "date", "machine")}
                   | {"settings": [s["spec"] for s in mb["settings"]], "seconds": mb.get("seconds")}]
    man = dict(ma)
    man["runs"] = runs
    man["settings"] = ma["settings"] + mb["settings"]
    man["complete"] = {s["spec"] for s in man["settings"]} == set(man["grid"])
    man["seconds"] = max(r.get("seconds") or 0 for r in runs)
    man["merged"] = f"python scripts/compression_claims.py merge --into {into} --from {other}"
    _write_data(into, pd.concat([ra, rb], ignore_index=True), pd.concat([la, lb], ignore_index=True), man)
    for p in DATA.glob(f"{other}.*"):
        p.unlink()
    print(f"merged {other} into {into} ({len(man['settings'])} settings)")
    return 0


def build(check: bool) -> int:

    stems = sorted(p.name[: -len(".manifest.json")] for p in DATA.glob("compression_*.manifest.json"))
    if not stems:
        print(f"error: no compression data under {DATA.relative_to(ROOT)}", file=sys.stderr)
        return 2
    pages = {}
    try:
        for stem in stems:
            pages[PAGES / f"claims_{stem}.md"] = build_page(stem) + "\n"
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return C.write_pages(pages, check, ROOT, "python scripts/compression_claims.py build")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True, choices=sorted(SOURCES))
    r.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    r.add_argument("--windows", type=int, default=32, help="evaluation windows per text (the first ones)")
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--grid", nargs="+", default=None, choices=list(GRID), help="a subset of the grid (smoke runs)")
    r.add_argument("--tag", default="", help="a suffix of the data files' names (smoke runs)")
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only: the builder refuses such data")
    b = sub.add_parser("build")
    b.add_argument("--check", action="store_true")
    g = sub.add_parser("merge", help="join a second run (another part of the grid, --tag) into a run's data")
    g.add_argument("--into", required=True, help="data stem, e.g. compression_smollm2-135m")
    g.add_argument("--from", dest="other", required=True, help="data stem of the other run")
    args = ap.parse_args(argv)
    args.cli = argv is None
    if args.cmd == "merge":
        return merge(args.into, args.other)
    return run(args) if args.cmd == "run" else build(args.check)


if __name__ == "__main__":
    _common.run_main(main)
