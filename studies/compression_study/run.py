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

    python -m studies run compression-study --model default --out docs/compression_study

Real models, both texts (each setting compressed once, calibrated on the first prose windows,
evaluated on the next prose windows and on KJV; the page lists what held first)::

    python -m studies run compression-study --model smollm2-135m --texts prose kjv --calib-sequences 4 \
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

from studies import common
from studies.registry import study

ROOT = common.ROOT

from studies import realrun as R  # noqa: E402, F401  (first: it sets HF_HUB_OFFLINE before transformers loads)
from tl_directional.compression import compression_geometry  # noqa: E402
from tl_directional.compression.accumulate import STAT_INDEX  # noqa: E402
from tl_directional.compression.compressors import collect_input_stats, compress  # noqa: E402
from tl_directional.model.inputs import TokenBatch  # noqa: E402

# The grid: spec strings of tl_directional.compression.compressors.compress. >= 12 ranked settings + layer drop.
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

# The study's parts, one module per job (re-exported): statistics (compression_study_stats) and
# outputs: figures, tables, page (compression_study_page); this module measures and analyses.
from studies.compression_study.page import (  # noqa: E402, F401
    FIGURE_SETTINGS,
    PAGE_NAMES,
    PAPER_LAYER,
    R_TEXTS,
    paper_layer_rows,
    reading_lines,
    write_outputs,
    write_page,
)
from studies.compression_study.stats import DIAGNOSTICS, UNITS, diagnostics, spearman  # noqa: E402, F401


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


@study("compression-study", "Which label-free diagnostic ranks compression settings by damage? (docs/compression.md)",
       data="--out DIR (docs/compression_study/)", pages="--page PATH")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies run compression-study", description=__doc__.split("\n")[0])
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

    from tl_directional.model.load import bundled_model_dir, load_model
    from tl_directional.model.sites import lane_of, resolve_sites

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
            windows = R.text_windows(dense, text, args.calib_sequences + args.eval_sequences, args.seq_len)
            if len(windows) < args.calib_sequences + 2:
                raise SystemExit(f"not enough held-out text in {text!r} for calibration + evaluation windows")
            calib = windows.slice(0, args.calib_sequences)
            if text in texts:
                evals[text] = windows.slice(args.calib_sequences, len(windows))
        else:
            evals[text] = R.text_windows(dense, text, args.eval_sequences, args.seq_len)
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

        measured_by = {"command": "python -m studies run compression-study " + " ".join(argv if argv is not None
                                                                                    else sys.argv[1:]),
                       "commit": R.git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
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
        "command": "python -m studies run compression-study " + " ".join(argv if argv is not None else sys.argv[1:]),
        "text": "+".join(texts), "modes": list(args.modes),
    }
    if args.from_partial:
        meta["measured_seconds"] = sum(sum(v.values()) for v in timings.values())
        meta["measured_by"] = saved.get("measured_by")
    (out / "study.json").write_text(json.dumps(meta, indent=2) + "\n")
    if args.page:
        prov = R.provenance(dense, args.model, resolved, out.parent)
        write_page(Path(args.page), results, {**meta, **prov, "seconds": meta["total_seconds"]})
    for text, (out_t, *_) in results.items():
        print(f"== {text}")
        print((out_t / "table.md").read_text())
    print(f"wrote {out} ({meta['total_seconds']:.0f}s)")
    return 0


if __name__ == "__main__":
    common.run_main(main)
