"""Depth profile (the paper's Fig. 2) of a real model on the held-out texts.

Per layer and component (attn, MLP, block): the energy ratio
``sqrt(sum ||u_par||^2 / sum ||u_perp||^2)`` and the median per-token ``par_perp_ratio`` and
``par_frac = |cos(u, r)|`` (METHOD sec. 1-2); per head, the value-space
``beta = A_tt + gamma`` with its two parts (sec. 3); each with BOS (the first position) in
and out; and the level an update of random direction would show in ``d_model`` dims
(``E|cos|``, the median ratio and the energy ratio), drawn on the same chart.

    python -m studies.explore.depth_profile --model smollm2-135m --texts kjv prose --sequences 32 \\
        --seq-len 128 --batch-size 8 --out results/depth/smollm2-135m \\
        --page docs/results/depth_profile_smollm2-135m.md

Outputs in ``--out``: ``residual.csv`` (text x bos x layer x component), ``value.csv``
(text x bos x layer x head), ``*.svg`` charts, ``meta.json``; with ``--page``, the markdown
page plus copies of the CSVs and SVGs next to it (``<page stem>.*``).
On sandwich-norm models (Gemma-2/3) the value-space factorization columns (``phi``,
``alpha_head``, ``self_term``, ``cross_term``, factorization error) are dropped: they do not
apply (METHOD sec. 3); ``beta``, ``A_tt`` and ``gamma`` stay valid.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd  # noqa: E402

from studies import common
from studies import realrun as R

FACTORIZATION_COLS = ("phi", "alpha_head", "self_term", "cross_term", "factorization_error")


def run_profile(model, batch, batch_size: int, exclude_bos: bool, sandwich: bool):
    from tl_directional import profile

    prof = profile(model, batch, batch_size=batch_size, exclude_first_token=exclude_bos, progress=False)
    res = prof.residual.copy()
    val = prof.value.copy()
    if sandwich:
        drop = [c for c in val.columns if c.startswith(FACTORIZATION_COLS)]
        val = val.drop(columns=drop)
        res = res.drop(columns=[c for c in res.columns if c.startswith("factorization_error")])
    return res, val, prof.metadata["tokens_seen"]


def charts(res: pd.DataFrame, val: pd.DataFrame, levels: dict, title: str) -> dict[str, str]:
    from tl_directional.figures.svg import svg_chart

    out = {}
    for text in res.text.unique():
        s1, s2 = {}, {}
        for bos in ("in", "out"):
            for comp in ("attn", "mlp", "block"):
                sub = res[(res.text == text) & (res.bos == bos) & (res.component == comp)].sort_values("layer")
                s1[f"{comp} BOS {bos}"] = list(zip(sub.layer, sub.energy_ratio, strict=True))
                s2[f"{comp} BOS {bos}"] = list(zip(sub.layer, sub.par_perp_ratio_median, strict=True))
        s1["random direction (energy ratio)"] = [(0, levels["energy_ratio"]),
                                                 (int(res.layer.max()), levels["energy_ratio"])]
        s2["random direction (median ratio)"] = [(0, levels["median_par_perp_ratio"]),
                                                 (int(res.layer.max()), levels["median_par_perp_ratio"])]
        out[f"energy_{text}.svg"] = svg_chart(
            s1, title=f"{title}, {text}: energy ratio ||u_par||/||u_perp|| per layer (log)", xlabel="layer",
            ylabel="log10 energy ratio", width=760, height=420, logy=True)
        out[f"median_{text}.svg"] = svg_chart(
            s2, title=f"{title}, {text}: median per-token ||u_par||/||u_perp|| (log)", xlabel="layer",
            ylabel="log10 median ratio", width=760, height=420, logy=True)
        s3 = {}
        for bos in ("in", "out"):
            g = val[(val.text == text) & (val.bos == bos)].groupby("layer")
            for col in ("beta_mean", "A_tt_mean", "gamma_mean"):
                m = g[col].mean()
                s3[f"{col.replace('_mean', '')} BOS {bos}"] = list(zip(m.index, m.values, strict=True))
        out[f"beta_{text}.svg"] = svg_chart(
            s3, title=f"{title}, {text}: value space, mean over heads of per-token beta = A_tt + gamma",
            xlabel="layer", ylabel="mean over tokens, averaged over heads", hline=(0.0, "0"), width=760, height=420)
    return out


def render_page(meta: dict, res: pd.DataFrame, val: pd.DataFrame, stem: str, reading: list[str]) -> str:
    lv = meta["random_levels"]
    L = [f"# Depth profile: {meta['model']}", ""]
    L += ["**Reading (computed from the tables below):**", ""] + reading + [""]
    L += [R.generated_line(meta), "",
          R.model_line(meta) + f", "
          f"d_model {meta['d_model']}, {meta['n_heads']} heads of d_head {meta['d_head']}, unprocessed weights.", ""]
    for t, info in meta["texts"].items():
        L.append(f"- text `{t}`: {R.TEXTS.get(t, t)}; {info['sequences']} windows of {meta['seq_len']} tokens; "
                 f"tokens counted: {info['tokens_bos_in']} with BOS, {info['tokens_bos_out']} without.")
    L += ["", f"Random-direction level in d_model = {meta['d_model']} dims (an update whose direction is "
          f"independent of the stream): E|cos| = {lv['e_abs_cos']:.4f}, median per-token ratio "
          f"{lv['median_par_perp_ratio']:.4f}, energy ratio {lv['energy_ratio']:.4f}.", ""]
    if meta["sandwich_norm"]:
        L += ["Gemma-3 has a norm after the attention output projection (sandwich norm), so the value-space "
              "factorization of METHOD sec. 3 (`phi`, `alpha_head`, `self_term`, `cross_term`, reconstruction "
              "error) does not apply and is left out of every table here; `beta`, `A_tt`, `gamma` (inside the "
              "head, before `W_O`) stay valid.", ""]
    L += ["No intervals: these are descriptive summaries over all counted tokens (energy ratios are exact sums, "
          "medians come from the library's fixed-histogram quantiles). Files: "
          f"[`{stem}.residual.csv`]({stem}.residual.csv), [`{stem}.value.csv`]({stem}.value.csv), "
          f"[`{stem}.meta.json`]({stem}.meta.json).", ""]
    for text in res.text.unique():
        L += [f"## Text `{text}`", "", f"![energy ratio]({stem}.energy_{text}.svg)", "",
              f"![median ratio]({stem}.median_{text}.svg)", "", f"![beta]({stem}.beta_{text}.svg)", "",
              "| layer | attn energy (BOS in / out) | attn median ratio (out) | MLP energy (in / out) | "
              "MLP median ratio (out) | block energy (in / out) | block median ratio (out) | "
              "mean beta over heads (in / out) | mean A_tt (out) | mean gamma (out) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for layer in sorted(res.layer.unique()):
            cells = []
            for comp in ("attn", "mlp", "block"):
                def g(bos, col, comp=comp, text=text, layer=layer):
                    return float(res[(res.text == text) & (res.bos == bos) & (res.component == comp)
                                     & (res.layer == layer)][col].iloc[0])
                cells.append(f"{g('in', 'energy_ratio'):.3f} / {g('out', 'energy_ratio'):.3f}")
                cells.append(f"{g('out', 'par_perp_ratio_median'):.3f}")
            v = {bos: val[(val.text == text) & (val.bos == bos) & (val.layer == layer)] for bos in ("in", "out")}
            cells.append(f"{v['in'].beta_mean.mean():+.3f} / {v['out'].beta_mean.mean():+.3f}")
            cells.append(f"{v['out'].A_tt_mean.mean():.3f}")
            cells.append(f"{v['out'].gamma_mean.mean():+.3f}")
            L.append(f"| {layer} | " + " | ".join(cells) + " |")
        L.append("")
    L += ["## Per head", "", f"Every head's `beta`, `A_tt`, `gamma` (mean, median, quantiles) and its full / "
          f"exclusive split ratios, BOS in and out, are in [`{stem}.value.csv`]({stem}.value.csv).", ""]
    return "\n".join(L)


def reading_lines(res: pd.DataFrame, val: pd.DataFrame, levels: dict) -> list[str]:
    out = []
    for text in res.text.unique():
        for comp in ("attn", "mlp", "block"):
            sub = res[(res.text == text) & (res.bos == "out") & (res.component == comp)]
            above = int((sub.energy_ratio > levels["energy_ratio"]).sum())
            med_above = int((sub.par_perp_ratio_median > levels["median_par_perp_ratio"]).sum())
            ratio = sub.energy_ratio / levels["energy_ratio"]
            out.append(f"- `{text}`, {comp} (BOS out): energy ratio above the random-direction level in {above} of "
                       f"{len(sub)} layers (median over layers {sub.energy_ratio.median():.3f} = "
                       f"{ratio.median():.1f}x random; range {sub.energy_ratio.min():.3f}-{sub.energy_ratio.max():.3f}); "
                       f"median per-token ratio above its random level in {med_above} of {len(sub)}.")
        a = res[(res.text == text) & (res.component == "attn")].pivot(index="layer", columns="bos", values="energy_ratio")
        shift = (a["in"] / a["out"])
        out.append(f"- `{text}`, BOS in vs out (attn energy ratio): largest change at layer {int(shift.idxmax())} "
                   f"({a['out'][shift.idxmax()]:.3f} without BOS, {a['in'][shift.idxmax()]:.3f} with), "
                   f"median change x{shift.median():.2f}.")
        blk = res[(res.text == text) & (res.bos == "out")]
        top = blk.loc[blk.alpha_median.abs().idxmax()]
        out.append(f"- `{text}`: the most stream-aligned update is layer {int(top.layer)} {top.component} (median alpha "
                   f"{top.alpha_median:+.2f}, i.e. the old stream is kept with factor 1 + alpha; median ||u||/||r|| "
                   f"{top.rel_update_median:.2f}).")
        v = val[(val.text == text) & (val.bos == "out")]
        out.append(f"- `{text}`, value space (BOS out): mean beta over all heads {v.beta_mean.mean():+.3f} "
                   f"(A_tt {v.A_tt_mean.mean():.3f} + gamma {v.gamma_mean.mean():+.3f}); heads with mean beta > 0.5: "
                   f"{int((v.beta_mean > 0.5).sum())} of {len(v)}.")
    sub = res[res.bos == "out"]
    above = int((sub.energy_ratio > 2 * levels["energy_ratio"]).sum())
    below = sub[sub.energy_ratio <= levels["energy_ratio"]]
    verdict = (f"- **Paper's Fig. 2 claim** (||u_par|| / ||u_perp|| per layer well above the random-direction level): "
               f"the energy ratio is more than twice the random level in {above} of {len(sub)} (text, layer, component) "
               f"rows (BOS out)")
    if len(below):
        verdict += ("; at or below the random level in " + ", ".join(
            f"`{r.text}` L{int(r.layer)} {r.component} ({r.energy_ratio:.3f})" for r in below.itertuples()))
    out.insert(0, verdict + ".")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="any load_model argument (name or HF directory)")
    ap.add_argument("--texts", nargs="+", default=["kjv", "prose"], help="kjv, prose, or text file paths")
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/depth")
    ap.add_argument("--page", default=None)
    ap.add_argument("--replot", action="store_true", help="re-render from OUT/residual.csv, value.csv, meta.json")
    args = ap.parse_args(argv)
    R.set_threads(args.threads)
    t0 = time.time()
    if args.replot:
        import json

        out = Path(args.out)
        meta = json.loads((out / "meta.json").read_text())
        res, val = pd.read_csv(out / "residual.csv"), pd.read_csv(out / "value.csv")
        return finish(args, out, meta, res, val, meta["random_levels"])
    model, resolved = R.load(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = R.provenance(model, args.model, resolved, out.parent)
    sandwich = R.sandwich_norm(resolved, model)
    levels = R.random_levels(meta["d_model"])
    res_all, val_all, texts = [], [], {}
    for text in args.texts:
        batch = R.text_windows(model, text, args.sequences, args.seq_len)
        info = {"sequences": len(batch)}
        for bos, excl in (("in", False), ("out", True)):
            t1 = time.time()
            res, val, n = run_profile(model, batch, args.batch_size, excl, sandwich)
            res.insert(0, "bos", bos)
            res.insert(0, "text", text)
            val.insert(0, "bos", bos)
            val.insert(0, "text", text)
            res_all.append(res)
            val_all.append(val)
            info[f"tokens_bos_{bos}"] = int(n)
            print(f"{text} BOS {bos}: {n} tokens, {time.time() - t1:.0f} s", flush=True)
        texts[text] = info
    res = pd.concat(res_all, ignore_index=True)
    val = pd.concat(val_all, ignore_index=True)
    res.to_csv(out / "residual.csv", index=False)
    val.to_csv(out / "value.csv", index=False)
    meta.update({"command": "python -m studies.explore.depth_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "seq_len": args.seq_len, "texts": texts, "random_levels": levels, "sandwich_norm": sandwich,
                 "seconds": time.time() - t0,
                 "tokens_total": sum(v["tokens_bos_in"] for v in texts.values())})
    return finish(args, out, meta, res, val, levels)


def finish(args, out: Path, meta: dict, res: pd.DataFrame, val: pd.DataFrame, levels: dict) -> int:
    svgs = charts(res, val, levels, meta["model"])
    for name, svg in svgs.items():
        (out / name).write_text(svg)
    reading = reading_lines(res, val, levels)
    meta["reading"] = reading
    R.write_json(out / "meta.json", meta)
    print("\n".join(reading))
    if args.page:
        page = Path(args.page)
        stem = page.stem
        files = {"residual.csv": ".residual.csv", "value.csv": ".value.csv", "meta.json": ".meta.json"}
        R.publish(page, render_page(meta, res, val, stem, reading), out,
                  {**files, **{name: f".{name}" for name in svgs}})
    return 0


if __name__ == "__main__":
    common.run_main(main)
