"""Per-layer sensitivity: each space's parallel removal (s_par = 0) applied to one layer at a
time, on a real model and each held-out text, as a layer x space heat map with sequence-
bootstrap intervals; optionally the per-layer safe ``s_par`` interval of V-Para
(:func:`tl_directional.evaluate.sweeps.find_safe_scale`, one layer group per layer).

    python -m studies.explore.layer_sensitivity --model smollm2-135m --texts kjv prose --sequences 8 \\
        --seq-len 128 --batch-size 8 --safe-scale --safe-text prose --safe-sequences 4 \\
        --out results/real/layers_smollm2-135m --page docs/results/layer_sensitivity_smollm2-135m.md

This answers where the all-layer damage of ``studies/explore/scaling_sweep.py`` comes from. Note that
per-layer damages need not add up to the all-layer damage (the edits interact).
``--replot`` re-renders from ``OUT/seq_<text>.pt`` (and ``OUT/safe.csv``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from studies import common
from studies import realrun as R
from tl_directional import Setting  # noqa: E402

SPACES = ["value", "value-exclusive", "resid-attn", "resid-mlp", "hard-diag"]


def one_layer(space: str, layer: int) -> Setting:
    """Parallel removal in ``space`` at one layer (hard-diag: its A_tt := 0 edit)."""
    return Setting(space, 0.0 if space != "hard-diag" else 1.0, 1.0, (layer,))


def settings(layers, spaces) -> list[Setting]:
    return [one_layer(s, L) for L in layers for s in spaces]


def merge_previous(seq: dict, prev_dir: Path, text: str, check: dict) -> tuple[dict, dict]:
    """Union of this run's per-sequence sums with a previous run's on the same windows
    (checked by the baseline NLL per sequence). ``check``: this run's re-measurement of some
    of the previous run's cells ``{label: sums}``; their largest per-sequence difference in
    delta loss is returned (the previous values are kept)."""
    old = torch.load(prev_dir / f"seq_{text}.pt")
    if old["baseline"].shape != seq["baseline"].shape or not torch.allclose(
            old["baseline"][:, 2], seq["baseline"][:, 2], rtol=1e-5, atol=1e-4):
        raise SystemExit(f"--extend {prev_dir}: its {text!r} windows differ from this run's (baseline NLL per "
                         "sequence); pass the same --sequences / --seq-len")
    diffs = {}
    for label, sums in check.items():
        d_new = (sums[:, 1] - sums[:, 2]) / sums[:, 0]
        d_old = (old[label][:, 1] - old[label][:, 2]) / old[label][:, 0]
        diffs[label] = float((d_new - d_old).abs().max())
    return {**seq, **old}, diffs


def heatmap_svg(df: pd.DataFrame, spaces, title: str) -> str:
    """Layer (rows) x space (columns) heat map of delta loss, signed log colour scale, value in each cell."""
    from html import escape

    layers = sorted(df.layer.unique())
    cw, ch, left, top = 118, 18, 60, 60
    w, h = left + cw * len(spaces) + 20, top + ch * len(layers) + 40
    vmax = max(1e-4, float(df.delta_loss.abs().max()))

    def colour(v):
        t = min(1.0, math.log10(1 + abs(v) / 1e-4) / math.log10(1 + vmax / 1e-4))
        if v >= 0:  # white -> red
            return f"rgb(255,{int(255 * (1 - t))},{int(255 * (1 - t))})"
        return f"rgb({int(255 * (1 - t))},{int(255 * (1 - t))},255)"  # white -> blue

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>',
           f'<text x="{left}" y="34" fill="#555">delta loss (nats/token), one layer edited; red = worse, blue = better, '
           f'log colour scale</text>']
    for j, s in enumerate(spaces):
        out.append(f'<text x="{left + j * cw + cw / 2}" y="{top - 6}" text-anchor="middle">{escape(s)}</text>')
    for i, L in enumerate(layers):
        y = top + i * ch
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">L{L}</text>')
        for j, s in enumerate(spaces):
            r = df[(df.layer == L) & (df.space == s)]
            if not len(r):
                continue
            v = float(r.delta_loss.iloc[0])
            sig = r.delta_loss_lo.iloc[0] > 0 or r.delta_loss_hi.iloc[0] < 0
            out.append(f'<rect x="{left + j * cw}" y="{y}" width="{cw - 2}" height="{ch - 2}" fill="{colour(v)}"/>')
            bold = ' font-weight="bold"' if sig else ""
            out.append(f'<text x="{left + j * cw + cw / 2}" y="{y + 13}" text-anchor="middle"{bold}>{v:+.4f}</text>')
    out.append(f'<text x="{left}" y="{h - 12}" fill="#555">bold: 95% bootstrap interval excludes 0</text>')
    out.append("</svg>")
    return "\n".join(out)


def render(meta, tables, safe: pd.DataFrame | None, stem: str, reading: list[str]) -> str:
    L = [f"# Per-layer sensitivity: {meta['model']}", "", "**Reading (computed from the tables below):**", ""]
    L += reading
    L += ["", R.generated_line(meta), "",
          R.model_line(meta) + ", "
          "unprocessed weights. Each cell: parallel removal (s_par = 0, s_perp = 1) in one space at one layer, all "
          "heads, no BOS exemption; hard-diag = A_tt := 0 renormalised at that layer.", ""]
    for t, info in meta["texts"].items():
        L.append(f"- text `{t}`: {R.TEXTS.get(t, t)}; {info['sequences']} windows of {meta['seq_len']} tokens = "
                 f"{info['tokens']} predicted tokens; baseline loss {info['base_loss']:.4f}.")
    if meta["texts"]:
        L += ["", f"Intervals: 95% percentile bootstrap over sequences ({meta['bootstrap']} resamples); with "
              f"{min(i['sequences'] for i in meta['texts'].values())} sequences they are rough. "
              f"Table: [`{stem}.csv`]({stem}.csv); meta: [`{stem}.meta.json`]({stem}.meta.json).", ""]
    if meta.get("extends"):
        ex = meta["extends"]
        L += [f"This run measured {', '.join(meta['own_spaces'])}; the other spaces are from earlier runs on the same "
              "windows (checked by the baseline NLL of each sequence):", ""]
        L += [f"- {', '.join(src['spaces'])}: `{src['command']}` (commit `{src['commit']}`)" for src in ex["sources"]]
        L.append("")
        if ex["check_max_abs_diff"]:
            L += [f"As a check, {', '.join(ex['check_spaces'])} at layer(s) {ex['check_layers']} were measured again "
                  "here: the per-sequence delta loss differs from the earlier run's by at most "
                  f"{max(ex['check_max_abs_diff'].values()):.2g} nats.", ""]
    for t, df in tables.items():
        L += [f"## Text `{t}`", "", f"![heat map]({stem}.{t}.svg)", "",
              "| layer | " + " | ".join(f"{s} delta loss [95% CI]" for s in SPACES if s in set(df.space)) + " |",
              "|---:|" + "---|" * len(set(df.space))]
        for layer in sorted(df.layer.unique()):
            cells = []
            for s in SPACES:
                r = df[(df.layer == layer) & (df.space == s)]
                if len(r):
                    cells.append(R.fmt_ci(r.iloc[0].to_dict(), "delta_loss"))
            L.append(f"| {layer} | " + " | ".join(cells) + " |")
        L.append("")
    if safe is not None and len(safe):
        L += [f"## Safe V-Para scale per layer (`find_safe_scale`, text `{meta['safe']['text']}`)", "",
              f"Widest interval of `s_par` around 1 (value space, full aggregate, one layer at a time, s_perp = 1) whose "
              f"delta loss stays within {meta['safe']['budget']} nats/token, searched over {meta['safe']['bounds']} "
              f"with {meta['safe']['grid_points']} grid points and {meta['safe']['refine_steps']} bisection steps per edge, "
              f"on {meta['safe']['sequences']} windows ({meta['safe']['tokens']} predicted tokens; no interval on the "
              "interval itself). 'bound' marks an edge that hit the search range."
              + (" The layers were searched in several runs with these settings:" if len(meta["safe"].get("runs", [])) > 1
                 else ""), ""]
        if len(meta["safe"].get("runs", [])) > 1:
            L += [f"- layers {', '.join(map(str, r['layers']))}: `{r['command']}` (commit `{r['commit']}`)"
                  for r in meta["safe"]["runs"]] + [""]
        L += ["| layer | safe s_par interval | lower edge at bound | upper edge at bound | delta loss at s_par = 0 |",
              "|---:|---|---|---|---:|"]
        for r in safe.itertuples():
            L.append(f"| {r.layer} | [{r.lo:.3g}, {r.hi:.3g}] | {'bound' if r.lo_at_bound else ''} | "
                     f"{'bound' if r.hi_at_bound else ''} | {r.cost_at_0:+.4f} |")
        L.append("")
    return "\n".join(L)


def reading_lines(tables, safe) -> list[str]:
    out = []
    for t, df in tables.items():
        for s in SPACES:
            sub = df[df.space == s]
            if not len(sub):
                continue
            top = sub.sort_values("delta_loss", ascending=False).head(3)
            sig = int((sub.delta_loss_lo > 0).sum())
            out.append(f"- `{t}`, {s}: worst single layers "
                       + ", ".join(f"L{int(r.layer)} {r.delta_loss:+.4f} [{r.delta_loss_lo:+.4f}, {r.delta_loss_hi:+.4f}]"
                                   for r in top.itertuples())
                       + f"; {sig} of {len(sub)} layers hurt with 95% confidence; sum over layers "
                       f"{sub.delta_loss.sum():+.4f}.")
    for t, df in tables.items():
        if df.space.nunique() > 1:
            out.append(f"- `{t}`, one-layer removal harmless (upper 95% bound below +0.01 nats/token) in: "
                       + ", ".join(f"{s} {int((df[df.space == s].delta_loss_hi < 0.01).sum())}/"
                                   f"{int((df.space == s).sum())} layers" for s in SPACES if s in set(df.space))
                       + "; worst cell: " + (lambda r: f"{r.space} at L{int(r.layer)} {r.delta_loss:+.4f} "
                                             f"[{r.delta_loss_lo:+.4f}, {r.delta_loss_hi:+.4f}]")(
                           df.sort_values("delta_loss", ascending=False).iloc[0]) + ".")
    if safe is not None and len(safe):
        narrow = safe[safe.lo > 0]
        out.append(f"- Safe V-Para s_par interval excludes 0 (removal at that layer alone costs more than the budget) "
                   f"in {len(narrow)} of {len(safe)} layers"
                   + (f": {', '.join(f'L{int(x)}' for x in narrow.layer)}" if len(narrow) else "") + ".")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="any load_model argument (name or HF directory)")
    ap.add_argument("--texts", nargs="*", default=["kjv", "prose"], help="texts for the heat map (none: only --safe-scale)")
    ap.add_argument("--spaces", nargs="+", default=SPACES)
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--safe-scale", action="store_true", help="also find_safe_scale per layer (value space)")
    ap.add_argument("--safe-text", default="prose")
    ap.add_argument("--safe-sequences", type=int, default=4)
    ap.add_argument("--safe-budget", type=float, default=0.01)
    ap.add_argument("--safe-layers", type=int, nargs="+", default=None, help="layers to search (default: all)")
    ap.add_argument("--safe-grid-points", type=int, default=5)
    ap.add_argument("--safe-refine-steps", type=int, default=2)
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="layers of the heat map (default: all)")
    ap.add_argument("--extend", default=None,
                    help="OUT directory of an earlier run on the same windows: its spaces join this run's in the "
                         "heat map (baseline checked per sequence)")
    ap.add_argument("--extend-check-layers", type=int, nargs="*", default=[1],
                    help="layers at which the earlier run's spaces are measured again, as a check")
    ap.add_argument("--safe-extend", default=None,
                    help="OUT directory of an earlier --safe-scale run with the same search settings: its layers "
                         "not searched here are kept in the table")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/real/layers")
    ap.add_argument("--page", default=None)
    ap.add_argument("--replot", action="store_true")
    args = ap.parse_args(argv)
    R.set_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    safe = None
    if args.replot:
        meta = json.loads((out / "meta.json").read_text())
        if (out / "safe.csv").is_file():
            safe = pd.read_csv(out / "safe.csv")
    else:
        model, resolved = R.load(args.model)
        meta = R.provenance(model, args.model, resolved, out.parent)
        meta.update({"command": "python -m studies.explore.layer_sensitivity " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "seq_len": args.seq_len, "bootstrap": args.bootstrap, "seed": args.seed, "texts": {},
                     "spaces": args.spaces})
        meta["layers"] = list(args.layers if args.layers is not None else range(meta["n_layers"]))
        meta["own_spaces"] = list(args.spaces)
        sets = settings(meta["layers"], args.spaces)
        prev = None
        if args.extend:
            prev = json.loads((Path(args.extend) / "meta.json").read_text())
            prev_own = [s for s in prev.get("own_spaces", prev["spaces"]) if s not in args.spaces]
            # where each earlier space was measured (a chain of --extend runs keeps the list)
            sources = [{**src, "spaces": [s for s in src["spaces"] if s not in args.spaces]}
                       for src in prev.get("extends", {}).get("sources", [])]
            sources.append({"spaces": prev_own, "command": prev["command"], "commit": prev["commit"]})
            check = [one_layer(s, L) for L in args.extend_check_layers for s in prev_own]
            meta["extends"] = {"dir": args.extend, "sources": [x for x in sources if x["spaces"]],
                               "check_spaces": prev_own, "check_layers": args.extend_check_layers,
                               "check_max_abs_diff": {}}
            meta["spaces"] = [s for s in SPACES if s in set(args.spaces) | set(prev["spaces"])]
            meta["layers"] = sorted(set(meta["layers"]) | set(prev.get("layers", range(prev["n_layers"]))))
        for text in args.texts:
            batch = R.text_windows(model, text, args.sequences, args.seq_len)
            t1 = time.time()
            todo = sets + (check if prev else [])
            print(f"{text}: {len(batch)} sequences, {len(todo)} settings", flush=True)
            seq = R.per_sequence_sweep(model, batch, todo, args.batch_size, log=lambda m: print(m, flush=True))
            if prev:
                checked = {s.label: seq.pop(s.label) for s in check}
                seq, diffs = merge_previous(seq, Path(args.extend), text, checked)
                meta["extends"]["check_max_abs_diff"].update({f"{text}: {k}": v for k, v in diffs.items()})
            torch.save(seq, out / f"seq_{text}.pt")
            meta["texts"][text] = {"sequences": len(batch), "seconds": time.time() - t1}
            meta["seconds"] = time.time() - t0  # so a run stopped after one text can still be re-rendered
            R.write_json(out / "meta.json", meta)
        if args.safe_scale:
            from tl_directional import find_safe_scale

            t1 = time.time()
            sb = R.text_windows(model, args.safe_text, args.safe_sequences, args.seq_len)
            res = find_safe_scale(model, sb, "value", args.safe_budget, which="s_par", bounds=(-1.0, 3.0),
                                  grid_points=args.safe_grid_points, refine_steps=args.safe_refine_steps,
                                  layer_groups=[[L] for L in (args.safe_layers or range(meta["n_layers"]))],
                                  batch_size=args.batch_size)
            rows = []
            res_layers = [r.layers[0] for r in res]
            for r in res:
                ev = r.evaluations.set_index("scale")["cost"]
                rows.append({"layer": r.layers[0], "lo": r.interval[0], "hi": r.interval[1],
                             "lo_at_bound": r.hit_bounds[0], "hi_at_bound": r.hit_bounds[1],
                             "cost_at_0": float(ev.get(0.0, float("nan"))), "evaluations": len(ev), "note": r.note})
            safe = pd.DataFrame(rows)
            meta["safe"] = {"text": args.safe_text, "sequences": len(sb), "tokens": int((sb.attention_mask[:, 1:]).sum()),
                            "budget": args.safe_budget, "bounds": [-1.0, 3.0], "grid_points": args.safe_grid_points,
                            "refine_steps": args.safe_refine_steps, "seconds": time.time() - t1}
            if args.safe_extend:
                pdir = Path(args.safe_extend)
                pmeta = json.loads((pdir / "meta.json").read_text())
                same = ("text", "sequences", "tokens", "budget", "bounds", "grid_points", "refine_steps")
                if pmeta.get("seq_len") != args.seq_len or any(pmeta["safe"][k] != meta["safe"][k] for k in same):
                    raise SystemExit(f"--safe-extend {pdir}: its search settings differ from this run's "
                                     f"({ {k: pmeta['safe'][k] for k in same} }, seq_len {pmeta.get('seq_len')})")
                old = pd.read_csv(pdir / "safe.csv")
                own = {int(x) for x in safe.layer}
                # which run searched which layer (a chain of --safe-extend runs keeps the list)
                runs = pmeta["safe"].get("runs") or [{"command": pmeta["command"], "commit": pmeta["commit"],
                                                      "layers": sorted(int(x) for x in old.layer)}]
                runs = [{**r, "layers": [x for x in r["layers"] if x not in own]} for r in runs]
                meta["safe"]["runs"] = [r for r in runs if r["layers"]]
                old = old[~old.layer.isin(own)]
                safe = pd.concat([old, safe], ignore_index=True).sort_values("layer").reset_index(drop=True)
            meta["safe"].setdefault("runs", []).append({"command": meta["command"], "commit": meta["commit"],
                                                       "layers": sorted(int(x) for x in res_layers)})
            safe.to_csv(out / "safe.csv", index=False)
            print(safe.to_string(index=False), flush=True)
        meta["seconds"] = time.time() - t0
    tables, frames = {}, []
    for text in meta["texts"]:
        seq = torch.load(out / f"seq_{text}.pt")
        w = R.bootstrap_weights(seq["baseline"].shape[0], meta["bootstrap"], meta["seed"])
        base = R.summarize(seq["baseline"], w)
        rows = []
        for L in meta.get("layers", range(meta["n_layers"])):
            for s in meta["spaces"]:
                label = one_layer(s, L).label
                if label in seq:  # a space of an --extend run may cover other layers
                    rows.append({"layer": L, "space": s, **R.summarize(seq[label], w)})
        df = pd.DataFrame(rows)
        meta["texts"][text].update(tokens=base["tokens"], base_loss=base["loss"])
        tables[text] = df
        frames.append(df.assign(text=text))
        (out / f"{text}.svg").write_text(heatmap_svg(df, meta["spaces"], f"{meta['model']}, {text}: one-layer parallel removal"))
    meta["tokens_total"] = sum(v["tokens"] for v in meta["texts"].values()) + meta.get("safe", {}).get("tokens", 0)
    reading = reading_lines(tables, safe)
    meta["reading"] = reading
    pd.concat(frames, ignore_index=True).to_csv(out / "layers.csv", index=False) if frames else None
    R.write_json(out / "meta.json", meta)
    print("\n".join(reading))
    if args.page:
        page = Path(args.page)
        stem = page.stem
        files = {"meta.json": ".meta.json", **{f"{t}.svg": f".{t}.svg" for t in tables}}
        if frames:
            files["layers.csv"] = ".csv"
        if safe is not None:
            files["safe.csv"] = ".safe.csv"
        R.publish(page, render(meta, tables, safe, stem, reading), out, files)
    return 0


if __name__ == "__main__":
    common.run_main(main)
