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

Outputs in ``--out``: ``settings.csv`` (one row per setting: loss increase, every diagnostic),
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:  # _realrun, for the real-model options
    sys.path.insert(1, str(ROOT / "scripts"))

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
    for r in range(flat_x.shape[0]):
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
        series = {}
        for s in show:
            sub = pl[(pl.setting == s) & (pl.unit == unit) & (pl["mode"] == "local")].sort_values("layer")
            series[s] = list(zip(sub.layer.tolist(), sub.err_perp_energy.tolist(), strict=True))
        svg = svg_chart(series, title=f"local {unit}: perpendicular error / update per layer "
                        "(err_perp_energy)", xlabel="layer", ylabel="err_perp_energy", width=760, height=420)
        (out / f"perp_per_layer_{unit}.svg").write_text(svg)
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
    lines += ["", "| setting | loss increase | local attn perp | local attn par | local block perp | "
              "local block par | local block 1-cos | local block MSE | global block perp |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in settings.sort_values("loss_increase").to_dict("records"):
        flag = " (drop: purely parallel, not ranked)" if r["by_construction_parallel"] else ""
        lines.append(f"| {r['setting']}{flag} | {r['loss_increase']:+.4f} | {r['local.attn.perp_energy']:.4f} | "
                     f"{r['local.attn.par_energy']:.4f} | {r['local.block.perp_energy']:.4f} | "
                     f"{r['local.block.par_energy']:.4f} | {r['local.block.one_minus_cos']:.5f} | "
                     f"{r['local.block.mse_energy']:.5f} | {r.get('global.block.perp_energy', float('nan')):.4f} |")
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


def write_page(page: Path, out: Path, settings, pl, sp, meta: dict) -> None:
    """The real-model results page: reading first (computed), provenance, tables, paper side by side."""
    import shutil

    stem = page.stem
    page.parent.mkdir(parents=True, exist_ok=True)
    look = sp.set_index(["mode", "unit", "diagnostic"])
    names = ["perp_energy", "par_energy", "one_minus_cos", "mse_energy"]
    reading = []
    for unit in ("attn", "mlp", "block"):
        r = {n: look.loc[("local", unit, n)] for n in names}
        best = max(names, key=lambda n: r[n].spearman)
        reading.append(
            f"- local {unit}: Spearman with held-out loss increase: "
            + ", ".join(f"{n} {r[n].spearman:+.2f} [{r[n].ci_lo:+.2f}, {r[n].ci_hi:+.2f}]" for n in names)
            + f"; highest: {best}; P(perp_energy rho > par_energy rho) = {r['par_energy'].p_perp_energy_higher:.2f}, "
            f"> 1-cos: {r['one_minus_cos'].p_perp_energy_higher:.2f}, > MSE: {r['mse_energy'].p_perp_energy_higher:.2f}.")
    r = look.loc[("local", "block", "perp_energy")]
    others = [look.loc[("local", "block", n)] for n in names[1:]]
    beats = all(o.p_perp_energy_higher >= 0.95 for o in others)
    reading.append(f"- The paper's claim (perpendicular error ranks compression damage better than parallel error, "
                   f"cosine or MSE), local block: {'holds' if beats else 'not shown'} here "
                   f"(needs P(perp higher) >= 0.95 against each; got "
                   + ", ".join(f"{n} {o.p_perp_energy_higher:.2f}" for n, o in zip(names[1:], others, strict=True))
                   + ").")
    by_spec = dict(zip(settings.spec, settings.setting, strict=True))
    L = [f"# Compression diagnostics: {meta['model']}, text `{meta['text']}`", "",
         "**Reading (computed from the tables below):**", ""] + reading + [
        "", f"Generated by `{meta['command']}` (commit `{meta['commit']}`, {meta['date']}, {meta['device']}, "
        f"{meta['seconds']:.0f} s).", "",
        f"Model: `{meta['model']}` loaded from `{meta['model_path']}` (model.safetensors sha256 "
        f"`{meta.get('model_safetensors_sha256', 'n/a')}`), lane {meta['lane']}, {meta['n_layers']} layers. "
        f"Text `{meta['text']}`: calibration on the first {meta['calibration_sequences']} windows, evaluation on the "
        f"next {meta['evaluation_sequences']} windows of {meta['seq_len']} tokens = "
        f"{meta['evaluation_predicted_tokens']} predicted tokens; dense loss {meta['dense_loss']:.4f}. "
        f"Geometry modes: {', '.join(meta['modes'])}. Spearman over {len(meta['ranked_settings'])} ranked settings "
        f"(layer drop reported, not ranked: its error is parallel by construction, METHOD sec. 6), 95% interval from "
        f"{meta['bootstrap']} paired resamples of the evaluation sequences.", "",
        "## Spearman of each diagnostic with the loss increase", ""]
    L += (out / "table_compact.md").read_text().splitlines()
    L += ["", "## Settings", ""] + (out / "table.md").read_text().splitlines()[
        next(i for i, x in enumerate((out / "table.md").read_text().splitlines()) if x.startswith("| setting")):]
    L += ["", "## The paper's single-layer numbers side by side (local attention, per-token mean error / update)", "",
          "| source | setting | paper perp | paper par | here layer | here perp / update | here par / update | "
          "here perp energy | here par energy |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for src, vals in PAPER_LAYER.items():
        layer = 10 if "layer 10" in src else 14
        for spec, (pp, pa) in vals.items():
            lab = by_spec.get(spec)
            sub = pl[(pl.setting == lab) & (pl.unit == "attn") & (pl["mode"] == "local") & (pl.layer == layer)]
            if lab is None or not len(sub):
                continue
            x = sub.iloc[0]
            L.append(f"| {src} | {lab} | {pp} | {'' if pa is None else pa} | {layer} | {x.err_perp_over_update:.3f} | "
                     f"{x.err_par_over_update:.3f} | {x.err_perp_energy:.3f} | {x.err_par_energy:.3f} |")
    L += ["", "The paper's layer-10 values above 1 suggest a different normalisation from METHOD sec. 6's "
          "`||e_perp|| / ||u||` (a guess; the paper's text does not settle it).", "",
          f"![local attn perp per layer]({stem}.perp_per_layer_attn.svg)", "",
          f"![local mlp perp per layer]({stem}.perp_per_layer_mlp.svg)", "",
          f"Per-layer local parallel / perpendicular error of attention and MLP for every setting: "
          f"[`{stem}.per_layer.csv`]({stem}.per_layer.csv); settings [`{stem}.settings.csv`]({stem}.settings.csv); "
          f"Spearman incl. per layer [`{stem}.spearman.csv`]({stem}.spearman.csv); meta "
          f"[`{stem}.meta.json`]({stem}.meta.json).", ""]
    page.write_text("\n".join(L))
    for name in ("settings.csv", "per_layer.csv", "spearman.csv", "perp_per_layer_attn.svg", "perp_per_layer_mlp.svg",
                 "scatter.svg"):
        shutil.copy(out / name, page.with_name(f"{stem}.{name}"))
    meta = {**meta, "reading": reading}
    page.with_name(f"{stem}.meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(f"wrote {page}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default", help="'default', a local HF directory, or a TL model name")
    p.add_argument("--out", default="docs/compression_study")
    p.add_argument("--calib-sequences", type=int, default=32)
    p.add_argument("--eval-sequences", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", nargs="*", default=None, help="spec strings (default: the built-in grid)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--text", default="kjv",
                   help="held-out text: 'kjv' (bundled KJV slice, the default), 'prose' (bundled Debian Reference "
                        "slice) or a text file")
    p.add_argument("--modes", nargs="+", default=["local", "global"], choices=["local", "global"],
                   help="geometry modes to measure (global costs two more forwards per setting)")
    p.add_argument("--page", default=None,
                   help="also write a markdown results page here (real-model runs), with provenance in "
                        "<page stem>.meta.json and the tables copied next to it")
    p.add_argument("--replot", action="store_true",
                   help="only redraw figures and tables from the CSVs already in --out")
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

    from tl_directional.inputs import load_text_sequences
    from tl_directional.models import bundled_model_dir, load_model
    from tl_directional.sites import lane_of, resolve_sites

    t_start = time.perf_counter()
    if args.model == "default":
        dense, resolved = load_model(args.model), "default"
    else:  # an official real-model name falls back to its scratch conversion until the loader knows it
        from _realrun import load as _load_real

        dense, resolved = _load_real(args.model)
    sites = resolve_sites(dense, warn=False)
    if args.model == "default":
        model_desc = ("bundled trained default model" if bundled_model_dir() is not None
                      else "RANDOM-WEIGHT STAND-IN for the default model (bundled model not installed)")
    else:
        model_desc = str(args.model)
    if args.text == "kjv":
        windows = load_text_sequences(dense, None, max_sequences=args.calib_sequences + args.eval_sequences,
                                      seq_len=args.seq_len)
    else:
        from _realrun import text_windows

        windows = text_windows(dense, args.text, args.calib_sequences + args.eval_sequences, args.seq_len)
    if len(windows) < args.calib_sequences + 2:
        raise SystemExit("not enough held-out text for calibration + evaluation windows")
    calib = windows.slice(0, args.calib_sequences)
    evalb = windows.slice(args.calib_sequences, len(windows))
    n_eval = len(evalb)
    print(f"model: {model_desc} ({sites.n_layers} layers, d_model {sites.d_model}, lane {lane_of(dense)}); "
          f"calibration {len(calib)} x {args.seq_len} tokens, evaluation {n_eval} sequences")

    grid = [g.replace("LAST", str(sites.n_layers - 1)) for g in (args.grid or DEFAULT_GRID)]
    stats = collect_input_stats(dense, calib, batch_size=args.batch_size, n_samples=512, seed=args.seed)
    t0 = time.perf_counter()
    dense_nll, counts = per_sequence_loss(dense, evalb, args.batch_size)
    dense_loss_seconds = time.perf_counter() - t0
    dense_loss = float(dense_nll.sum() / counts.sum())
    print(f"dense held-out loss {dense_loss:.4f} nats/token over {int(counts.sum())} predicted tokens")

    rows, per_layer, seq_sums, seq_nll, geo_rows = [], [], {}, {}, []
    timings = {}
    for spec in grid:
        t0 = time.perf_counter()
        res = compress(dense, spec, calibration=calib, stats=stats)
        t_comp = time.perf_counter() - t0
        label = res.record.label
        t0 = time.perf_counter()
        nll, _ = per_sequence_loss(res.model, evalb, args.batch_size)
        t_loss = time.perf_counter() - t0
        geo = {}
        t_geo = {}
        for mode in args.modes:
            t0 = time.perf_counter()
            geo[mode] = compression_geometry(dense, res, evalb, mode=mode, batch_size=args.batch_size,
                                             per_sequence=True, verify=False)
            t_geo[mode] = time.perf_counter() - t0
        timings[label] = {"compress_s": t_comp, "loss_s": t_loss, **{f"{m}_s": t for m, t in t_geo.items()}}
        seq_nll[label] = nll
        loss = float(nll.sum() / counts.sum())
        row = {"setting": label, "spec": spec, "method": res.record.method, "loss": loss,
               "loss_increase": loss - dense_loss,
               "weight_rel_error": res.record.stats.get("weight_rel_error_mean", float("nan")),
               "zero_fraction": res.record.stats.get("zero_fraction", float("nan")),
               "by_construction_parallel": res.record.method == "drop"}
        for mode, df in geo.items():
            per = df.attrs["per_sequence"][label]  # [n_seq, rows, K]
            rws = geo_rows = df.attrs["rows"]  # the same (layer, unit) order for every setting
            seq_sums[(label, mode)] = per
            for unit in UNITS:
                idx = [i for i, (L, u) in enumerate(rws) if u == unit]
                d = diagnostics(per[:, idx].sum((0, 1)))
                for k, v in d.items():
                    row[f"{mode}.{unit}.{k}"] = float(v)
            for r in df.itertuples():
                per_layer.append({"setting": label, "mode": mode, "layer": r.layer, "unit": r.unit,
                                  "err_perp_energy": r.err_perp_energy, "err_par_energy": r.err_par_energy,
                                  "err_perp_over_update": r.err_perp_over_update,
                                  "err_par_over_update": r.err_par_over_update,
                                  "err_perp_share_energy": r.err_perp_share_energy, "cos_sim": r.cos_sim,
                                  "rel_mse_energy": r.rel_mse_energy, "alpha_err": r.alpha_err,
                                  "by_construction_parallel": r.by_construction_parallel})
        rows.append(row)
        print(f"  {label:24s} loss +{row['loss_increase']:.4f}  local block perp "
              f"{row['local.block.perp_energy']:.4f} par {row['local.block.par_energy']:.4f}  "
              f"({t_comp:.1f}s compress, {t_geo['local']:.1f}s local)", flush=True)
        del res

    import pandas as pd

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = pd.DataFrame(rows)
    settings.to_csv(out / "settings.csv", index=False)
    pl = pd.DataFrame(per_layer)
    pl.to_csv(out / "per_layer.csv", index=False)

    # ---- Spearman with a paired bootstrap over sequences ----------------------------------
    ranked = [r["setting"] for r in rows if not r["by_construction_parallel"]]
    S = len(ranked)
    gen = torch.Generator().manual_seed(args.seed)
    B = args.bootstrap
    weights = torch.ones(B + 1, n_eval, dtype=torch.float64)
    for b in range(1, B + 1):  # row 0 = the full sample
        idx = torch.randint(0, n_eval, (n_eval,), generator=gen)
        weights[b] = torch.bincount(idx, minlength=n_eval).double()
    nll_mat = torch.stack([seq_nll[s] for s in ranked])  # [S, n]
    loss_inc = (weights @ nll_mat.T) / (weights @ counts).unsqueeze(-1) - \
        ((weights @ dense_nll) / (weights @ counts)).unsqueeze(-1)  # [B+1, S]
    results = []
    cand_values = {}
    for mode in args.modes:
        for unit in UNITS:
            idx = [i for i, (L, u) in enumerate(geo_rows) if u == unit]
            stacked = torch.stack([seq_sums[(s, mode)][:, idx].sum(1) for s in ranked])  # [S, n, K]
            pooled = torch.einsum("bn,snk->bsk", weights, stacked)  # [B+1, S, K]
            for name, val in diagnostics(pooled).items():
                cand_values[(mode, unit, name)] = val
            if mode == "local":  # layer-resolved, for the paper's single-layer reading
                for i in idx:
                    L = geo_rows[i][0]
                    stacked = torch.stack([seq_sums[(s, mode)][:, i] for s in ranked])
                    d = diagnostics(torch.einsum("bn,snk->bsk", weights, stacked))
                    for name in ("perp_energy", "par_energy", "one_minus_cos", "mse_energy"):
                        cand_values[("local", f"{unit} L{L}", name)] = d[name]
    wre = torch.tensor([settings.set_index("setting").loc[s, "weight_rel_error"] for s in ranked],
                       dtype=torch.float64).expand(B + 1, S)
    cand_values[("data-free", "all", "weight_rel_error")] = wre
    rhos = {k: spearman(v, loss_inc) for k, v in cand_values.items()}  # each [B+1]
    for (mode, unit, name), rho in rhos.items():
        ref = rhos.get((mode, unit, "perp_energy"))
        p_beat = float((ref[1:] > rho[1:]).double().mean()) if ref is not None and name != "perp_energy" else float("nan")
        results.append({"mode": mode, "unit": unit, "diagnostic": name, "spearman": float(rho[0]),
                        "ci_lo": float(torch.quantile(rho[1:], 0.025)), "ci_hi": float(torch.quantile(rho[1:], 0.975)),
                        "p_perp_energy_higher": p_beat,
                        "description": DIAGNOSTICS.get(name, "mean relative Frobenius error of the weights")})
    sp = pd.DataFrame(results)
    sp.to_csv(out / "spearman.csv", index=False)

    write_outputs(out, settings, pl, sp)

    meta = {
        "model": str(args.model), "model_description": model_desc, "lane": lane_of(dense),
        "n_layers": sites.n_layers, "d_model": sites.d_model,
        "calibration_sequences": len(calib), "evaluation_sequences": n_eval, "seq_len": args.seq_len,
        "evaluation_predicted_tokens": int(counts.sum()), "dense_loss": dense_loss,
        "bootstrap": B, "seed": args.seed, "ranked_settings": ranked, "grid": grid,
        "timings": timings, "dense_loss_seconds": dense_loss_seconds,
        "total_seconds": time.perf_counter() - t_start, "torch_threads": torch.get_num_threads(),
        "command": "python scripts/compression_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    meta["text"] = args.text
    meta["modes"] = list(args.modes)
    (out / "study.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.page:
        import _realrun as R

        prov = R.provenance(dense, args.model, resolved, out.parent)
        write_page(Path(args.page), out, settings, pl, sp, {**meta, **prov, "seconds": meta["total_seconds"]})
    print((out / "table.md").read_text())
    print(f"wrote {out}/settings.csv, spearman.csv, per_layer.csv, table.md, *.svg, study.json "
          f"({meta['total_seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
