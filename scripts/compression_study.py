"""Discriminativeness study: which label-free diagnostic ranks compression settings by damage?

For a grid of real compression settings (round-to-nearest and AWQ-style quantization,
magnitude and Wanda pruning incl. N:M, truncated-SVD low rank, layer drop) applied to one
model, this script measures

* the held-out loss increase of each setting (mean next-token NLL, compressed minus dense),
* label-free diagnostics from :func:`tl_directional.compression_geometry` (local and global
  mode), per unit (attn / mlp / block), pooled over layers and tokens: perpendicular error,
  parallel error, 1 - cosine similarity, relative MSE (and a few more),
* the data-free baseline: mean relative weight error,

and reports, for each diagnostic, the Spearman rank correlation with the loss increase across
settings, with a bootstrap interval that resamples *sequences* (the same resample for every
setting, so the settings stay paired), not settings. Layer drop's error is purely parallel by
construction (``e = -u``): it is reported but kept out of every ranking.

Calibration (Wanda, AWQ) and evaluation use disjoint windows of the bundled held-out text: the
first ``--calib-sequences`` windows calibrate, the next ``--eval-sequences`` windows evaluate.

Usage (the docs' numbers)::

    python scripts/compression_study.py --model default --out docs/compression_study

Real models, both texts (each setting compressed once, calibrated on the first prose windows,
evaluated on the next prose windows and on KJV; the page lists what held first)::

    python scripts/compression_study.py --model smollm2-135m --texts prose kjv --calib-sequences 4 \
        --eval-sequences 8 --seq-len 64 --modes local --out results/real/compression_study_smollm2-135m \
        --page docs/results/compression_study_smollm2-135m.md

With ``--partial FILE`` each finished setting's sums are saved there; ``--from-partial`` then
writes every output from the settings finished so far (a run stopped by a deadline still gives
its page).

Outputs in ``--out`` (with several texts: in ``OUT/<text>/``): ``settings.csv`` (one row per setting: loss increase, every diagnostic),
``spearman.csv`` (diagnostic x unit x mode: rho, bootstrap interval, P(perp beats it)),
``per_layer.csv`` (setting x layer x unit geometry), ``perp_per_layer_attn.svg`` /
``perp_per_layer_mlp.svg`` (the paper-style figure), ``scatter.svg``, ``table.md`` and
``study.json`` (model, lane, token counts, timings, command).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common
ROOT = _common.ROOT

import _realrun as R  # noqa: E402  (scripts/ is on the path: _common)

from tl_directional.compress import collect_input_stats, compress  # noqa: E402
from tl_directional.compression import compression_geometry, svg_chart  # noqa: E402
from tl_directional.compression.geometry import STAT_INDEX  # noqa: E402
from tl_directional.inputs import TokenBatch  # noqa: E402

# The grid: spec strings of tl_directional.compress.compress. >= 12 ranked settings + layer drop.
DEFAULT_GRID = [
    "rtn:bits=8",
    "rtn:bits=4,group=32,sym=1",
    "rtn:bits=4,group=128,sym=0",
    "rtn:bits=4",
    "rtn:bits=3,group=32,sym=0",
    "rtn:bits=3",
    "awq:bits=4,group=32",
    "awq:bits=3,group=32",
    "magnitude:sparsity=0.3",
    "magnitude:sparsity=0.5",
    "magnitude:sparsity=0.7",
    "wanda:sparsity=0.5",
    "wanda:sparsity=0.7",
    "wanda:nm=4:8",
    "wanda:nm=2:4",
    "svd:rank=0.75",
    "svd:rank=0.5",
    "svd:rank=0.25",
    "drop:layers=LAST",
]

UNITS = ("attn", "mlp", "block")
# name -> (function of pooled sums [..., K], description); bigger = more damage for all of them
DIAGNOSTICS = {
    "perp_energy": "sqrt(sum ||e_perp||^2 / sum ||u||^2)  (headline)",
    "par_energy": "sqrt(sum ||e_par||^2 / sum ||u||^2)",
    "one_minus_cos": "1 - mean cos(u', u)",
    "mse_energy": "sum ||e||^2 / sum ||u||^2",
    "perp_mean": "mean ||e_perp|| / ||u|| (per token)",
    "par_mean": "mean ||e_par|| / ||u|| (per token)",
    "perp_share_energy": "sum ||e_perp||^2 / sum ||e||^2",
    "perp_energy_vs_resid": "sqrt(sum ||e_perp,r||^2 / sum ||u||^2), split against the residual",
}


def diagnostics(sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every diagnostic from pooled sums ``[..., K]`` (vectorised over leading axes)."""
    g = {k: sums[..., i] for k, i in STAT_INDEX.items()}
    u = g["u_sq"].clamp_min(1e-300)
    n = g["n"].clamp_min(1.0)
    return {
        "perp_energy": (g["e_perp_sq"] / u).sqrt(),
        "par_energy": (g["e_par_sq"] / u).sqrt(),
        "one_minus_cos": 1.0 - g["t_cos"] / n,
        "mse_energy": g["e_sq"] / u,
        "perp_mean": g["t_err_perp"] / n,
        "par_mean": g["t_err_par"] / n,
        "perp_share_energy": g["e_perp_sq"] / g["e_sq"].clamp_min(1e-300),
        "perp_energy_vs_resid": (g["e_perp_r_sq"] / u).sqrt(),
    }


def rankdata(x: torch.Tensor) -> torch.Tensor:
    """Average ranks along the last axis (ties share their mean rank)."""
    order = torch.argsort(x, dim=-1, stable=True)
    ranks = torch.empty_like(x, dtype=torch.float64)
    ar = torch.arange(x.shape[-1], dtype=torch.float64).expand_as(ranks)
    ranks.scatter_(-1, order, ar)
    # average ties
    xs = x.gather(-1, order)
    out = ranks.clone()
    flat_x, flat_o, flat_out = xs.reshape(-1, x.shape[-1]), order.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    tied = (flat_x[:, 1:] == flat_x[:, :-1]).any(-1)  # only rows with ties need the loop
    for r in torch.nonzero(tied).flatten().tolist():
        row = flat_x[r]
        i = 0
        while i < row.numel():
            j = i
            while j + 1 < row.numel() and row[j + 1] == row[i]:
                j += 1
            if j > i:
                flat_out[r, flat_o[r, i:j + 1]] = (i + j) / 2.0
            i = j + 1
    return flat_out.reshape(x.shape)


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rho along the last axis (Pearson correlation of average ranks)."""
    rx, ry = rankdata(x), rankdata(y)
    rx = rx - rx.mean(-1, keepdim=True)
    ry = ry - ry.mean(-1, keepdim=True)
    den = (rx.pow(2).sum(-1) * ry.pow(2).sum(-1)).sqrt()
    return torch.where(den > 0, (rx * ry).sum(-1) / den.clamp_min(1e-300), torch.zeros_like(den))


@torch.no_grad()
def per_sequence_loss(model, batch: TokenBatch, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence sums of next-token NLL and counts of predicted tokens (padding excluded)."""
    nll, cnt = [], []
    for i in range(0, len(batch), batch_size):
        part = batch.slice(i, i + batch_size)
        logits = model(part.tokens, attention_mask=part.attention_mask, return_type="logits").double()
        lp = torch.log_softmax(logits[:, :-1], -1)
        tgt = part.tokens[:, 1:]
        m = (part.attention_mask[:, 1:] * part.attention_mask[:, :-1]).bool()
        tok_nll = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        nll.append((tok_nll * m).sum(-1))
        cnt.append(m.sum(-1).double())
    return torch.cat(nll), torch.cat(cnt)



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
        prefix = f"{stem}.{text}" if multi else stem
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


def concat_batches(batches: dict) -> tuple[TokenBatch, dict]:
    """One batch of several texts' windows (right-padded to a common width, mask 0) and each
    text's row indices in it."""
    width = max(b.tokens.shape[1] for b in batches.values())
    toks, masks, spans, i = [], [], {}, 0
    for text, b in batches.items():
        pad = width - b.tokens.shape[1]
        toks.append(torch.nn.functional.pad(b.tokens, (0, pad), value=int(b.tokens[0, -1])))
        masks.append(torch.nn.functional.pad(b.attention_mask, (0, pad), value=0))
        spans[text] = torch.arange(i, i + len(b))
        i += len(b)
    return TokenBatch(torch.cat(toks), torch.cat(masks)), spans


def analyse(out: Path, text: str, sel: torch.Tensor, records: list[dict], seq_nll: dict, seq_sums: dict,
            dense_nll_all: torch.Tensor, counts_all: torch.Tensor, geo_rows: list, modes, B: int, seed: int):
    """Settings table, per-layer table (with bootstrap intervals of the energy-form errors) and
    Spearman table of one text, from the per-sequence sums of its rows ``sel`` of the joint
    evaluation batch; writes them (and the figures) to ``out``."""
    import pandas as pd

    from tl_directional.compression.geometry import summarize as row_summary

    out.mkdir(parents=True, exist_ok=True)
    counts, dense_nll = counts_all[sel], dense_nll_all[sel]
    n_eval = len(sel)
    dense_loss = float(dense_nll.sum() / counts.sum())
    gen = torch.Generator().manual_seed(seed)
    weights = torch.ones(B + 1, n_eval, dtype=torch.float64)
    for b in range(1, B + 1):  # row 0 = the full sample
        idx = torch.randint(0, n_eval, (n_eval,), generator=gen)
        weights[b] = torch.bincount(idx, minlength=n_eval).double()
    iu, ip, ie = STAT_INDEX["u_sq"], STAT_INDEX["e_perp_sq"], STAT_INDEX["e_par_sq"]
    rows, per_layer = [], []
    for rec in records:
        label = rec["setting"]
        nll = seq_nll[label][sel]
        loss = float(nll.sum() / counts.sum())
        row = {"text": text, **{k: rec[k] for k in ("setting", "spec", "method", "weight_rel_error", "zero_fraction",
                                                    "by_construction_parallel")},
               "loss": loss, "loss_increase": loss - dense_loss}
        for mode in modes:
            per = seq_sums[(label, mode)][sel]  # [n, rows, K]
            for unit in UNITS:
                idx = [i for i, (L, u) in enumerate(geo_rows) if u == unit]
                for k, v in diagnostics(per[:, idx].sum((0, 1))).items():
                    row[f"{mode}.{unit}.{k}"] = float(v)
            boot = torch.einsum("bn,nrk->brk", weights, per)  # [B+1, rows, K]
            u_b = boot[..., iu].clamp_min(1e-300)
            perp_b, par_b = (boot[..., ip] / u_b).sqrt(), (boot[..., ie] / u_b).sqrt()
            q = torch.tensor([0.025, 0.975], dtype=torch.float64)
            perp_q, par_q = torch.quantile(perp_b[1:], q, dim=0), torch.quantile(par_b[1:], q, dim=0)
            p_gt = (perp_b[1:] > par_b[1:]).double().mean(0)
            for i, (L, u) in enumerate(geo_rows):
                m = row_summary(per[:, i].sum(0), mode)
                per_layer.append({
                    "text": text, "setting": label, "mode": mode, "layer": L, "unit": u,
                    "err_perp_energy": m["err_perp_energy"], "err_perp_energy_lo": float(perp_q[0, i]),
                    "err_perp_energy_hi": float(perp_q[1, i]), "err_par_energy": m["err_par_energy"],
                    "err_par_energy_lo": float(par_q[0, i]), "err_par_energy_hi": float(par_q[1, i]),
                    "p_perp_gt_par": float(p_gt[i]),
                    "err_perp_over_update": m["err_perp_over_update"], "err_par_over_update": m["err_par_over_update"],
                    "err_perp_share_energy": m["err_perp_share_energy"], "cos_sim": m["cos_sim"],
                    "rel_mse_energy": m["rel_mse_energy"], "alpha_err": m["alpha_err"],
                    "by_construction_parallel": bool(m["by_construction_parallel"] or L in rec["dropped"])})
        rows.append(row)
    settings = pd.DataFrame(rows)
    settings.to_csv(out / "settings.csv", index=False)
    pl = pd.DataFrame(per_layer)
    pl.to_csv(out / "per_layer.csv", index=False, float_format="%.6g")

    # ---- Spearman with a paired bootstrap over sequences (same weights for every setting) ----
    ranked = [r["setting"] for r in rows if not r["by_construction_parallel"]]
    S = len(ranked)
    nll_mat = torch.stack([seq_nll[s][sel] for s in ranked])  # [S, n]
    loss_inc = (weights @ nll_mat.T) / (weights @ counts).unsqueeze(-1) - \
        ((weights @ dense_nll) / (weights @ counts)).unsqueeze(-1)  # [B+1, S]
    cand_values = {}
    for mode in modes:
        for unit in UNITS:
            idx = [i for i, (L, u) in enumerate(geo_rows) if u == unit]
            stacked = torch.stack([seq_sums[(s, mode)][sel][:, idx].sum(1) for s in ranked])  # [S, n, K]
            pooled = torch.einsum("bn,snk->bsk", weights, stacked)  # [B+1, S, K]
            for name, val in diagnostics(pooled).items():
                cand_values[(mode, unit, name)] = val
            if mode == "local":  # layer-resolved, for the paper's single-layer reading
                for i in idx:
                    L = geo_rows[i][0]
                    stacked = torch.stack([seq_sums[(s, mode)][sel][:, i] for s in ranked])
                    d = diagnostics(torch.einsum("bn,snk->bsk", weights, stacked))
                    for name in PAGE_NAMES:
                        cand_values[("local", f"{unit} L{L}", name)] = d[name]
    wre = torch.tensor([settings.set_index("setting").loc[s, "weight_rel_error"] for s in ranked],
                       dtype=torch.float64).expand(B + 1, S)
    cand_values[("data-free", "all", "weight_rel_error")] = wre
    rhos = {k: spearman(v, loss_inc) for k, v in cand_values.items()}  # each [B+1]
    # The bootstrap above resamples tokens only; the grid of settings is fixed. How much one
    # setting moves rho: its range over leave-one-setting-out grids (full sample).
    loo = {}
    for key, v in cand_values.items():
        if key[1] in UNITS or key[0] == "data-free":
            keep = [torch.tensor([j for j in range(S) if j != i]) for i in range(S)]
            vals = torch.stack([spearman(v[0, k], loss_inc[0, k]) for k in keep])
            loo[key] = (float(vals.min()), float(vals.max()))
    results = []
    for (mode, unit, name), rho in rhos.items():
        ref = rhos.get((mode, unit, "perp_energy"))
        p_beat = float((ref[1:] > rho[1:]).double().mean()) if ref is not None and name != "perp_energy" else float("nan")
        results.append({"text": text, "mode": mode, "unit": unit, "diagnostic": name, "spearman": float(rho[0]),
                        "ci_lo": float(torch.quantile(rho[1:], 0.025)), "ci_hi": float(torch.quantile(rho[1:], 0.975)),
                        "p_perp_energy_higher": p_beat,
                        "loo_min": loo.get((mode, unit, name), (float("nan"),) * 2)[0],
                        "loo_max": loo.get((mode, unit, name), (float("nan"),) * 2)[1],
                        "description": DIAGNOSTICS.get(name, "mean relative Frobenius error of the weights")})
    sp = pd.DataFrame(results)
    sp.to_csv(out / "spearman.csv", index=False, float_format="%.6g")
    write_outputs(out, settings, pl, sp.copy())
    info = {"sequences": n_eval, "tokens": int(counts.sum()), "dense_loss": dense_loss}
    return settings, pl, sp, info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", help="'default', a catalogue name (smollm2-135m), or a model directory")
    p.add_argument("--out", default="docs/compression_study")
    p.add_argument("--calib-sequences", type=int, default=32)
    p.add_argument("--eval-sequences", type=int, default=64, help="evaluation windows per text")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", nargs="*", default=None, help="spec strings (default: the built-in grid)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--text", default="kjv",
                   help="held-out text: 'kjv' (bundled KJV slice, the default), 'prose' (bundled Debian Reference "
                        "slice) or a text file")
    p.add_argument("--texts", nargs="+", default=None,
                   help="several held-out texts (overrides --text): each setting is compressed once and evaluated "
                        "on every text; outputs per text in OUT/<text>/")
    p.add_argument("--calib-text", default=None,
                   help="text whose first --calib-sequences windows calibrate (default: the first text); its "
                        "evaluation windows follow them")
    p.add_argument("--modes", nargs="+", default=["local", "global"], choices=["local", "global"],
                   help="geometry modes to measure (global costs two more forwards per setting)")
    p.add_argument("--page", default=None,
                   help="also write a markdown results page here (real-model runs), with provenance in "
                        "<page stem>.meta.json and the tables copied next to it")
    p.add_argument("--replot", action="store_true",
                   help="only redraw figures and tables from the CSVs already in --out")
    p.add_argument("--partial", default=None,
                   help="save the per-sequence sums of every finished setting to this file (for --from-partial)")
    p.add_argument("--from-partial", action="store_true",
                   help="skip measuring: analyse the settings finished so far (the --partial file) and write the "
                        "outputs and page from them")
    args = p.parse_args(argv)
    if args.replot:
        import pandas as pd

        out = Path(args.out)
        write_outputs(out, pd.read_csv(out / "settings.csv"), pd.read_csv(out / "per_layer.csv"),
                      pd.read_csv(out / "spearman.csv"))
        print(f"redrew {out}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    from _realrun import text_windows

    from tl_directional.models import bundled_model_dir, load_model
    from tl_directional.sites import lane_of, resolve_sites

    t_start = time.perf_counter()
    dense, resolved = load_model(args.model), args.model
    sites = resolve_sites(dense, warn=False)
    if args.model == "default":
        model_desc = ("bundled trained default model" if bundled_model_dir() is not None
                      else "RANDOM-WEIGHT STAND-IN for the default model (bundled model not installed)")
    else:
        model_desc = str(args.model)
    texts = list(dict.fromkeys(args.texts or [args.text]))
    calib_text = args.calib_text or texts[0]
    evals = {}
    for text in dict.fromkeys([calib_text, *texts]):
        if text == calib_text:
            windows = text_windows(dense, text, args.calib_sequences + args.eval_sequences, args.seq_len)
            if len(windows) < args.calib_sequences + 2:
                raise SystemExit(f"not enough held-out text in {text!r} for calibration + evaluation windows")
            calib = windows.slice(0, args.calib_sequences)
            if text in texts:
                evals[text] = windows.slice(args.calib_sequences, len(windows))
        else:
            evals[text] = text_windows(dense, text, args.eval_sequences, args.seq_len)
    evals = {t: evals[t] for t in texts}
    evalb, spans = concat_batches(evals)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"model: {model_desc} ({sites.n_layers} layers, d_model {sites.d_model}, lane {lane_of(dense)}); "
          f"calibration {len(calib)} x {args.seq_len} tokens of {calib_text!r}, evaluation "
          + ", ".join(f"{t} {len(b)} sequences" for t, b in evals.items()), flush=True)

    grid = [g.replace("LAST", str(sites.n_layers - 1)) for g in (args.grid or DEFAULT_GRID)]
    t0 = time.perf_counter()
    dense_nll, counts = per_sequence_loss(dense, evalb, args.batch_size)
    dense_loss_seconds = time.perf_counter() - t0
    for t, sel in spans.items():
        print(f"dense held-out loss ({t}) {float(dense_nll[sel].sum() / counts[sel].sum()):.4f} nats/token over "
              f"{int(counts[sel].sum())} predicted tokens ({dense_loss_seconds:.1f}s for all texts)", flush=True)

    records, seq_sums, seq_nll, geo_rows, timings = [], {}, {}, None, {}
    partial = Path(args.partial) if args.partial else None
    if args.from_partial and partial is None:
        raise SystemExit("--from-partial needs --partial FILE (the file the interrupted run saved)")
    if args.from_partial:
        saved = torch.load(partial)
        records, seq_sums, seq_nll, geo_rows, timings = (saved[k] for k in ("records", "seq_sums", "seq_nll",
                                                                           "geo_rows", "timings"))
        assert torch.equal(saved["dense_nll"], dense_nll), "partial.pt was measured on other windows"
        print(f"analysing {len(records)} finished settings from {partial}")
    else:
        from _realrun import git_commit

        measured_by = {"command": "python scripts/compression_study.py " + " ".join(argv if argv is not None
                                                                                    else sys.argv[1:]),
                       "commit": git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        stats = collect_input_stats(dense, calib, batch_size=args.batch_size, n_samples=512, seed=args.seed)
        for spec in grid:
            t0 = time.perf_counter()
            res = compress(dense, spec, calibration=calib, stats=stats)
            t_comp = time.perf_counter() - t0
            label = res.record.label
            t0 = time.perf_counter()
            nll, _ = per_sequence_loss(res.model, evalb, args.batch_size)
            t_loss = time.perf_counter() - t0
            t_geo = {}
            for mode in args.modes:
                t0 = time.perf_counter()
                df = compression_geometry(dense, res, evalb, mode=mode, batch_size=args.batch_size,
                                          per_sequence=True, verify=False)
                t_geo[mode] = time.perf_counter() - t0
                seq_sums[(label, mode)] = df.attrs["per_sequence"][label]  # [n_seq, rows, K]
                geo_rows = df.attrs["rows"]  # the same (layer, unit) order for every setting
            timings[label] = {"compress_s": t_comp, "loss_s": t_loss, **{f"{m}_s": t for m, t in t_geo.items()}}
            seq_nll[label] = nll
            records.append({"setting": label, "spec": spec, "method": res.record.method,
                            "weight_rel_error": res.record.stats.get("weight_rel_error_mean", float("nan")),
                            "zero_fraction": res.record.stats.get("zero_fraction", float("nan")),
                            "by_construction_parallel": res.record.method == "drop",
                            "dropped": list(res.record.layers) if res.record.method == "drop" else []})
            if partial is not None:
                torch.save({"records": records, "seq_sums": seq_sums, "seq_nll": seq_nll, "geo_rows": geo_rows,
                            "timings": timings, "dense_nll": dense_nll, "measured_by": measured_by}, partial)
            incs = ", ".join(f"{t} {float((nll[s].sum() - dense_nll[s].sum()) / counts[s].sum()):+.4f}"
                             for t, s in spans.items())
            print(f"  {label:24s} loss increase {incs}  ({t_comp:.1f}s compress, {t_loss:.1f}s loss, "
                  + ", ".join(f"{t:.1f}s {m}" for m, t in t_geo.items()) + ")", flush=True)
            del res

    results, text_info = {}, {}
    for text, sel in spans.items():
        out_t = out if len(spans) == 1 else out / text
        settings, pl, sp, info = analyse(out_t, text, sel, records, seq_nll, seq_sums, dense_nll, counts,
                                         geo_rows, args.modes, args.bootstrap, args.seed)
        results[text] = (out_t, settings, pl, sp)
        text_info[text] = info
    ranked = [r["setting"] for r in records if not r["by_construction_parallel"]]
    meta = {
        "model": str(args.model), "model_description": model_desc, "lane": lane_of(dense),
        "n_layers": sites.n_layers, "d_model": sites.d_model,
        "calibration_text": calib_text, "calibration_sequences": len(calib), "calibration_tokens": calib.n_tokens,
        "evaluation_sequences": len(evalb), "seq_len": args.seq_len,
        "evaluation_predicted_tokens": int(counts.sum()), "texts": text_info,
        "dense_loss": float(dense_nll.sum() / counts.sum()),
        "bootstrap": args.bootstrap, "seed": args.seed, "ranked_settings": ranked,
        "grid": [r["spec"] for r in records], "grid_asked": grid,
        "timings": timings, "dense_loss_seconds": dense_loss_seconds,
        "total_seconds": time.perf_counter() - t_start, "torch_threads": torch.get_num_threads(),
        "command": "python scripts/compression_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "text": "+".join(texts), "modes": list(args.modes),
    }
    if args.from_partial:
        meta["measured_seconds"] = sum(sum(v.values()) for v in timings.values())
        meta["measured_by"] = saved.get("measured_by")
    (out / "study.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.page:
        import _realrun as R

        prov = R.provenance(dense, args.model, resolved, out.parent)
        write_page(Path(args.page), results, {**meta, **prov, "seconds": meta["total_seconds"]})
    for text, (out_t, *_) in results.items():
        print(f"== {text}")
        print((out_t / "table.md").read_text())
    print(f"wrote {out} ({meta['total_seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    _common.run_main(main)
