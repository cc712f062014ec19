"""The discriminativeness study's outputs (``studies/compression_study/``): the figures and
Markdown tables of one text's three tables (:func:`write_outputs`, also ``--replot``) and the
results page with its computed reading (:func:`write_page`).

Imported by :mod:`compression_study` (the entry point, which re-exports these names).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from studies import realrun as R
from studies.compression_study.stats import DIAGNOSTICS, UNITS, spearman
from tl_directional.figures.svg import svg_chart

# Settings drawn in the per-layer figure (all are in per_layer.csv).
FIGURE_SETTINGS = ["rtn w8 per-ch sym", "awq w4 g32 asym", "rtn w4 g32 sym", "rtn w3 per-ch sym",
                   "svd rank 50%", "magnitude 50%", "wanda 50%", "wanda 2:4"]


def write_outputs(out: Path, settings, pl, sp) -> None:
    """Figures and Markdown tables from the study's three tables (also used by --replot)."""
    # ---- figures ----------------------------------------------------------------------------
    show = [x for x in FIGURE_SETTINGS if x in set(pl.setting)] or \
        sorted(set(pl.setting) - set(settings[settings.by_construction_parallel].setting))
    for unit in ("attn", "mlp"):
        for part, col, word in (("perp", "err_perp_energy", "perpendicular"), ("par", "err_par_energy", "parallel")):
            series = {}
            for s in show:
                sub = pl[(pl.setting == s) & (pl.unit == unit) & (pl["mode"] == "local")].sort_values("layer")
                series[s] = list(zip(sub.layer.tolist(), sub[col].tolist(), strict=True))
            svg = svg_chart(series, title=f"local {unit}: {word} error / update per layer ({col})",
                            xlabel="layer", ylabel=col, width=760, height=420)
            (out / f"{part}_per_layer_{unit}.svg").write_text(svg)
    sc = {}
    rk = settings[~settings.by_construction_parallel]
    for name, col in (("perp", "local.block.perp_energy"), ("par", "local.block.par_energy"),
                      ("1-cos", "local.block.one_minus_cos")):
        sc[name] = list(zip(rk["loss_increase"].tolist(), rk[col].tolist(), strict=True))
    (out / "scatter.svg").write_text(svg_chart(
        sc, title="local block diagnostics vs held-out loss increase (log-log; ranked settings)",
        xlabel="loss increase (nats/token)", ylabel="diagnostic", width=760, height=420,
        markers_only=True, logx=True, logy=True))

    # ---- table.md ---------------------------------------------------------------------------
    lines = ["| mode | unit | diagnostic | Spearman rho | 95% bootstrap CI | P(perp_energy rho higher) |",
             "|---|---|---|---:|---:|---:|"]
    order = list(DIAGNOSTICS) + ["weight_rel_error"]
    sp["_o"] = sp.diagnostic.map({k: i for i, k in enumerate(order)})
    sp["_m"] = sp["mode"].map({"local": 0, "global": 1, "data-free": 2})
    sp["_u"] = sp.unit.map({"attn": 0, "mlp": 1, "block": 2, "all": 3})
    for r in sp[sp._u.notna()].sort_values(["_m", "_u", "_o"]).itertuples():
        pb = "" if r.p_perp_energy_higher != r.p_perp_energy_higher else f"{r.p_perp_energy_higher:.2f}"
        lines.append(f"| {r.mode} | {r.unit} | {r.diagnostic} | {r.spearman:+.3f} | "
                     f"[{r.ci_lo:+.3f}, {r.ci_hi:+.3f}] | {pb} |")
    cols = [("local attn perp", "local.attn.perp_energy", ".4f"), ("local attn par", "local.attn.par_energy", ".4f"),
            ("local mlp perp", "local.mlp.perp_energy", ".4f"), ("local mlp par", "local.mlp.par_energy", ".4f"),
            ("local block perp", "local.block.perp_energy", ".4f"), ("local block par", "local.block.par_energy", ".4f"),
            ("local block 1-cos", "local.block.one_minus_cos", ".5f"), ("local block MSE", "local.block.mse_energy", ".5f"),
            ("global block perp", "global.block.perp_energy", ".4f")]
    cols = [c for c in cols if c[1] in settings.columns]
    lines += ["", "| setting | loss increase | " + " | ".join(c[0] for c in cols) + " |",
              "|---|---:|" + "---:|" * len(cols)]
    for r in settings.sort_values("loss_increase").to_dict("records"):
        flag = " (drop: purely parallel, not ranked)" if r["by_construction_parallel"] else ""
        lines.append(f"| {r['setting']}{flag} | {r['loss_increase']:+.4f} | "
                     + " | ".join(f"{r[c[1]]:{c[2]}}" for c in cols) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    # compact: diagnostic x (mode, unit), "rho [lo, hi]"
    cols = [("local", "attn"), ("local", "mlp"), ("local", "block"), ("global", "attn"), ("global", "mlp"),
            ("global", "block")]
    cols = [c for c in cols if c[0] in set(sp["mode"])]
    compact = ["| diagnostic | " + " | ".join(f"{m} {u}" for m, u in cols) + " |",
               "|---|" + "---:|" * len(cols)]
    look = sp.set_index(["mode", "unit", "diagnostic"])
    for name in DIAGNOSTICS:
        cells = []
        for m, u in cols:
            r = look.loc[(m, u, name)]
            cells.append(f"{r.spearman:+.2f} [{r.ci_lo:+.2f}, {r.ci_hi:+.2f}]")
        compact.append(f"| {name} | " + " | ".join(cells) + " |")
    r = look.loc[("data-free", "all", "weight_rel_error")]
    compact.append(f"| weight_rel_error (data-free) | {r.spearman:+.2f} [{r.ci_lo:+.2f}, {r.ci_hi:+.2f}] |"
                   + " |" * (len(cols) - 1))
    (out / "table_compact.md").write_text("\n".join(compact) + "\n")
    # within method families (full sample only: no interval), local block
    fam = {"quantization (rtn, awq)": ("rtn", "awq"), "pruning (magnitude, wanda)": ("magnitude", "wanda"),
           "all ranked settings": ("rtn", "awq", "magnitude", "wanda", "low_rank")}
    names = ["perp_energy", "par_energy", "one_minus_cos", "mse_energy"]
    within = ["| settings (n) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, methods in fam.items():
        sub = settings[settings.method.isin(methods) & ~settings.by_construction_parallel.astype(bool)]
        y = torch.tensor(sub.loss_increase.values, dtype=torch.float64)
        cells = [f"{float(spearman(torch.tensor(sub[f'local.block.{n}'].values, dtype=torch.float64), y)):+.2f}"
                 for n in names]
        within.append(f"| {label} ({len(sub)}) | " + " | ".join(cells) + " |")
    (out / "table_within.md").write_text("\n".join(within) + "\n")


# The paper's single-layer numbers (attention output, perpendicular / parallel error over the update).
PAPER_LAYER = {
    "issue (Qwen3-4B, layer 10 attn_out, perp vs par)": {"awq:bits=4,group=32": (1.56, 0.22), "wanda:nm=2:4": (3.96, 2.94)},
    "METHOD sec. 8 (Qwen3-4B, layer 14 attn, perp / update)": {"awq:bits=4,group=32": (0.17, None),
                                                               "wanda:sparsity=0.5": (0.31, None),
                                                               "wanda:nm=2:4": (0.46, None)},
}


PAGE_NAMES = ["perp_energy", "par_energy", "one_minus_cos", "mse_energy"]


def paper_layer_rows(settings, pl) -> list[tuple]:
    """``(source, label, paper perp, paper par, layer, per-layer row)`` for each of the paper's
    single-layer numbers whose setting is in the grid (local attention at that layer)."""
    by_spec = dict(zip(settings.spec, settings.setting, strict=True))
    out = []
    for src, vals in PAPER_LAYER.items():
        layer = 10 if "layer 10" in src else 14
        for spec, (pp, pa) in vals.items():
            lab = by_spec.get(spec)
            sub = pl[(pl.setting == lab) & (pl.unit == "attn") & (pl["mode"] == "local") & (pl.layer == layer)]
            if lab is not None and len(sub):
                out.append((src, lab, pp, pa, layer, sub.iloc[0]))
    return out


def reading_lines(text: str, settings, pl, sp) -> list[str]:
    """The page's first lines for one text: does perpendicular error rank the damage best
    (local block, with the bootstrap probability against each rival), per unit, and the
    paper's layer-10 perp-vs-par comparison."""
    look = sp.set_index(["mode", "unit", "diagnostic"])
    names = PAGE_NAMES
    out = []
    r = {n: look.loc[("local", "block", n)] for n in names}
    if all(r[n].p_perp_energy_higher >= 0.95 for n in names[1:]):
        verdict = "held"
    elif any(r[n].p_perp_energy_higher <= 0.05 for n in names[1:]):
        verdict = "failed (another diagnostic ranks better)"
    else:
        verdict = "not shown (the intervals overlap)"
    best = max(names, key=lambda n: r[n].spearman)
    out.append(
        f"- `{text}`, the paper's claim (perpendicular error ranks compression damage better than parallel error, "
        f"1-cos and MSE), local block, {len(settings[~settings.by_construction_parallel.astype(bool)])} ranked "
        f"settings: **{verdict}** (held needs P(perp rho higher) >= 0.95 against each, failed <= 0.05 against one). "
        + ", ".join(f"{n} rho {r[n].spearman:+.2f} [{r[n].ci_lo:+.2f}, {r[n].ci_hi:+.2f}]" for n in names)
        + "; P(perp higher) vs " + ", ".join(f"{n} {r[n].p_perp_energy_higher:.2f}" for n in names[1:])
        + f"; highest rho: {best}. Leaving one setting out moves perp_energy's rho within "
        f"[{r['perp_energy'].loo_min:+.2f}, {r['perp_energy'].loo_max:+.2f}] and {best}'s within "
        f"[{r[best].loo_min:+.2f}, {r[best].loo_max:+.2f}].")
    for unit in ("attn", "mlp"):
        ru = {n: look.loc[("local", unit, n)] for n in names}
        out.append(f"- `{text}`, local {unit}: " + ", ".join(
            f"{n} {ru[n].spearman:+.2f} [{ru[n].ci_lo:+.2f}, {ru[n].ci_hi:+.2f}]" for n in names)
            + f"; highest: {max(names, key=lambda n: ru[n].spearman)}.")
    rows = [x for x in paper_layer_rows(settings, pl) if x[4] == 10]
    if rows:
        ok = all(x.err_perp_energy > x.err_par_energy for *_, x in rows)
        out.append(
            f"- `{text}`, layer 10 attention (the paper, Qwen3-4B: perpendicular error above parallel for AWQ 4-bit "
            f"and Wanda 2:4): **{'held' if ok else 'failed'}** here: " + "; ".join(
                f"{lab} perp {x.err_perp_energy:.3f} [{x.err_perp_energy_lo:.3f}, {x.err_perp_energy_hi:.3f}] vs par "
                f"{x.err_par_energy:.3f} [{x.err_par_energy_lo:.3f}, {x.err_par_energy_hi:.3f}] "
                f"(paper {pp} vs {pa})" for _, lab, pp, pa, _, x in rows)
            + " (energy form over the update; the paper's normalisation differs, see below).")
    rows = [x for x in paper_layer_rows(settings, pl) if x[4] == 14]
    if rows:
        out.append(f"- `{text}`, layer 14 attention, perpendicular error per token over the update (METHOD sec. 8's "
                   "Qwen3-4B values): " + "; ".join(f"{lab} {x.err_perp_over_update:.2f} (paper {pp})"
                                                   for _, lab, pp, _, _, x in rows) + ".")
    return out


def _text_section(text: str, out: Path, settings, pl, prefix: str) -> list[str]:
    """One text's section of the page: its Spearman tables, the settings table, the paper's
    single-layer numbers beside ours, and the figures (named ``<prefix>.*.svg``)."""
    L: list[str] = []
    L += [f"## Text `{text}`", "", "### Spearman of each diagnostic with the loss increase", ""]
    L += (out / "table_compact.md").read_text().splitlines()
    L += ["", "Within method families (full sample, no interval), local block:", ""]
    L += (out / "table_within.md").read_text().splitlines()
    tm = (out / "table.md").read_text().splitlines()
    L += ["", "### Settings", ""] + tm[next(i for i, x in enumerate(tm) if x.startswith("| setting")):]
    L += ["", "### The paper's single-layer numbers side by side (local attention)", "",
          "| source | setting | paper perp | paper par | here layer | here perp energy [95% CI] | "
          "here par energy [95% CI] | P(perp > par) | here perp / update (per-token mean) | here par / update |",
          "|---|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for src, lab, pp, pa, layer, x in paper_layer_rows(settings, pl):
        L.append(f"| {src} | {lab} | {pp} | {'' if pa is None else pa} | {layer} | "
                 f"{x.err_perp_energy:.3f} [{x.err_perp_energy_lo:.3f}, {x.err_perp_energy_hi:.3f}] | "
                 f"{x.err_par_energy:.3f} [{x.err_par_energy_lo:.3f}, {x.err_par_energy_hi:.3f}] | "
                 f"{x.p_perp_gt_par:.2f} | {x.err_perp_over_update:.3f} | {x.err_par_over_update:.3f} |")
    L += ["", "The paper's layer-10 values above 1 suggest a different normalisation from METHOD sec. 6's "
          "`||e_perp|| / ||u||` (a guess; the paper's text does not settle it), so compare the perp-vs-par "
          "order, not the values.", "",
          f"![local attn perp per layer, {text}]({prefix}.perp_per_layer_attn.svg)", "",
          f"![local mlp perp per layer, {text}]({prefix}.perp_per_layer_mlp.svg)", "",
          f"Parallel error per layer: [attention]({prefix}.par_per_layer_attn.svg), "
          f"[MLP]({prefix}.par_per_layer_mlp.svg).", "",
          f"![diagnostics vs loss increase, {text}]({prefix}.scatter.svg)", ""]
    return L


def write_page(page: Path, results: dict, meta: dict) -> None:
    """The real-model results page: reading first (computed), provenance, then per text the
    Spearman table, the settings table and the paper's single-layer numbers side by side.

    ``results``: ``{text: (out_dir, settings, per_layer, spearman)}``; with one text the
    copied files are ``<stem>.settings.csv`` etc., with several they are concatenated (a
    ``text`` column) and the figures are ``<stem>.<text>.*.svg``."""
    import shutil

    import pandas as pd

    stem = page.stem
    page.parent.mkdir(parents=True, exist_ok=True)
    multi = len(results) > 1
    reading = []
    for text, (_, settings, pl, sp) in results.items():
        reading += reading_lines(text, settings, pl, sp)
    widths = []
    for _, (_, _, _, sp) in results.items():
        loc = sp[(sp["mode"] == "local") & sp.unit.isin(UNITS) & sp.diagnostic.isin(PAGE_NAMES)]
        widths += (loc.ci_hi - loc.ci_lo).tolist()
    widths.sort()
    med_w = widths[len(widths) // 2] if widths else float("nan")
    L = [f"# Compression diagnostics: {meta['model']}", "", "**Reading (computed from the tables below):**", ""]
    L += reading
    measured = (f" Measured by `{meta['measured_by']['command']}` at commit `{meta['measured_by']['commit']}` "
                f"({meta['measured_by']['date']}, {meta['measured_seconds']:.0f} s of compressing and measuring); "
                "this run re-analysed its saved per-sequence sums."
                if meta.get("measured_by") else "")
    L += ["", R.generated_line(meta, measured), "",
          R.model_line(meta) + f". "
          f"Each setting compresses every attention and MLP linear once (embeddings, norms, the tied unembedding "
          f"untouched) and is evaluated on every text. Calibration (Wanda input norms, AWQ scales): the first "
          f"{meta['calibration_sequences']} windows of `{meta['calibration_text']}` "
          f"({meta['calibration_tokens']} tokens), disjoint from every evaluation window. Geometry: "
          f"{', '.join(meta['modes'])} mode (each unit fed the dense model's input), attention / MLP / block, "
          "pooled over layers and tokens in energy form.", ""]
    for text, info in meta["texts"].items():
        L.append(f"- text `{text}`: {R_TEXTS.get(text, text)}; {info['sequences']} windows of {meta['seq_len']} "
                 f"tokens = {info['tokens']} predicted tokens; dense loss {info['dense_loss']:.4f} nats/token.")
    L += ["", f"Every Spearman rho is over {len(meta['ranked_settings'])} ranked settings (layer drop reported, not "
          "ranked: its error is parallel by construction, METHOD sec. 6) and rests on the tokens of its text; its 95% "
          f"interval is from {meta['bootstrap']} paired resamples of that text's evaluation sequences (the same "
          "resample for every setting); the local attn / MLP / block rho intervals are "
          f"{med_w:.2f} wide (median). They measure token noise only: the grid of settings is fixed, and which "
          "settings are in it matters more; the reading gives each rho's range over leave-one-setting-out grids "
          "(columns `loo_min` / `loo_max` of the Spearman CSV). Per-layer errors carry their own bootstrap intervals "
          "in the per-layer CSV.", ""]
    for text, (out, settings, pl, _sp) in results.items():
        L += _text_section(text, out, settings, pl, f"{stem}.{text}" if multi else stem)
    L += [f"Per-layer local parallel / perpendicular error of attention and MLP for every setting, with intervals: "
          f"[`{stem}.per_layer.csv`]({stem}.per_layer.csv); settings [`{stem}.settings.csv`]({stem}.settings.csv); "
          f"Spearman incl. per layer [`{stem}.spearman.csv`]({stem}.spearman.csv); meta "
          f"[`{stem}.meta.json`]({stem}.meta.json).", ""]
    page.write_text("\n".join(L))
    for name in ("settings.csv", "per_layer.csv", "spearman.csv"):
        frames = [pd.read_csv(out / name) for out, *_ in results.values()]
        pd.concat(frames, ignore_index=True).to_csv(page.with_name(f"{stem}.{name}"), index=False,
                                                    float_format="%.6g")
    for text, (out, *_) in results.items():
        prefix = f"{stem}.{text}" if multi else stem
        for name in ("perp_per_layer_attn.svg", "perp_per_layer_mlp.svg", "par_per_layer_attn.svg",
                     "par_per_layer_mlp.svg", "scatter.svg"):
            shutil.copy(out / name, page.with_name(f"{prefix}.{name}"))
    meta = {**meta, "reading": reading, "rho_interval_width_median": med_w}
    page.with_name(f"{stem}.meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(f"wrote {page}")


R_TEXTS = {
    "kjv": "bundled held-out KJV slice (test-split books)",
    "prose": "held-out modern English prose (Debian Reference slice, tl_directional/data/prose_heldout.txt)",
}
