"""Component-scaling sweeps on a real model with sequence-bootstrap intervals (the paper's
perplexity table and sweep figure), on each held-out text.

The extended grid of ``studies/explore/paper_ordering.py``: spaces value (V-Para, full aggregate),
value-exclusive, resid-attn, resid-mlp, resid-both, each with ``s_par`` in ``--s-par``
(``s_perp = 1``) and ``s_perp`` in ``--s-perp`` (``s_par = 1``), all layers, plus hard diagonal
removal. Per setting: delta loss, delta ppl, KL(base || edited), top-1 agreement, each with a
95% percentile interval from a bootstrap over sequences (the same resample for every setting,
so differences between settings are paired). Side by side with the paper's numbers (the
constants of ``paper_ordering.py``, METHOD sec. 8, and the issue's camera-ready table).

    python -m studies.explore.scaling_sweep --model smollm2-135m --texts kjv prose --sequences 16 \\
        --seq-len 128 --batch-size 8 --out results/real/sweep_smollm2-135m \\
        --page docs/results/scaling_sweep_smollm2-135m.md

``--replot`` re-renders the page from the per-sequence sums saved in ``--out`` (``seq_<text>.pt``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from studies import common
from studies import realrun as R
from studies.explore.paper_ordering import PAPER_BASE_PPL, PAPER_REMOVAL  # noqa: E402
from tl_directional import grid  # noqa: E402

SPACES = ["value", "value-exclusive", "resid-attn", "resid-mlp", "resid-both"]
# The issue's camera-ready table (Qwen3-4B held-out ppl at s_par = 0, base 49.95).
PAPER_CAMERA_READY = {"base": 49.95, "value": 49.84, "resid-attn": 53.91, "resid-mlp": 128.06, "resid-both": 258.64}
# Zero-shot averages (Qwen3-1.7B), METHOD sec. 8: not measured here (no benchmark data offline).
PAPER_ZERO_SHOT = {"baseline": 53.0, "resid-attn removal": 42.4, "hard-diag": 26.9, "value removal": 53.2}


def settings(s_par, s_perp):
    out = grid(SPACES, s_par=s_par, s_perp=[1.0])
    out += grid(SPACES, s_par=[1.0], s_perp=s_perp)
    out += grid("hard-diag")
    return out


def table(seq: dict[str, torch.Tensor], sets, weights) -> tuple[pd.DataFrame, dict]:
    rows, boot = [], {}
    base = R.summarize(seq["baseline"], weights)
    rows.append({"space": "baseline", "s_par": 1.0, "s_perp": 1.0, "label": "baseline", **base})
    for s in sets:
        r = R.summarize(seq[s.label], weights)
        rows.append({"space": s.space, "s_par": s.s_par, "s_perp": s.s_perp, "label": s.label, **r})
        agg = weights @ seq[s.label]
        boot[s.label] = (agg[:, 1] - agg[:, 2]) / agg[:, 0]  # delta loss per resample
    return pd.DataFrame(rows), boot


def pick(df, space, s_par=1.0, s_perp=1.0):
    sub = df[(df.space == space) & (df.s_par == s_par) & (df.s_perp == s_perp)]
    return sub.iloc[0] if len(sub) else None


def reading(df: pd.DataFrame, boot: dict, text: str) -> list[str]:
    r = {s: pick(df, s, 0.0) for s in SPACES}
    order = sorted(SPACES, key=lambda s: r[s].delta_loss)
    paper_order = ["value", "resid-attn", "resid-mlp", "resid-both"]
    four = [s for s in order if s in paper_order]
    out = [f"- `{text}`: parallel removal (s_par = 0, all layers), least to most damaging: "
           + " < ".join(f"{s} {r[s].delta_loss:+.3f} [{r[s].delta_loss_lo:+.3f}, {r[s].delta_loss_hi:+.3f}]"
                        for s in order) + " nats/token.",
           f"  Paper's ordering value < resid-attn < resid-mlp < resid-both: "
           f"{'holds' if four == paper_order else 'does not hold (found ' + ' < '.join(four) + ')'}."]
    v = r["value"]
    verdict = ("holds (95% upper bound <= 0.01 nats)" if v.delta_loss_hi <= 0.01 else
               "fails (it hurts: 95% lower bound > 0.01 nats)" if v.delta_loss_lo > 0.01 else
               "not settled at this token count (the interval spans 0.01 nats)")
    out.append(f"  V-Para removal (paper: no damage, -0.5 ppl of 80.4): delta loss {v.delta_loss:+.4f} "
               f"[{v.delta_loss_lo:+.4f}, {v.delta_loss_hi:+.4f}], delta ppl {v.delta_ppl:+.2f} "
               f"({v.delta_ppl / v.base_ppl:+.1%} of base {v.base_ppl:.2f}): "
               f"{verdict}.")
    worse, pairs = [], []
    for s in SPACES:
        for sc in (0.0, 0.5, 2.0):
            a, b = pick(df, s, 1.0, sc), pick(df, s, sc, 1.0)
            if a is None or b is None:
                continue
            pairs.append(f"{s}@{sc:g}")
            diff = boot[a.label] - boot[b.label]
            if float(torch.quantile(diff[1:], 0.025)) > 0:
                worse.append(f"{s}@{sc:g}")
    n = len(pairs)
    out.append(f"  Perpendicular scaling more damaging than the same parallel scaling (paired bootstrap, 95% lower "
               f"bound of the difference > 0) in {len(worse)} of {n} (space, scale) pairs"
               + (f"; not in: {', '.join(p for p in pairs if p not in worse)}"
                  if len(worse) < n else "") + " (paper: in every space).")
    p2, q05 = pick(df, "value", 2.0, 1.0), pick(df, "value", 1.0, 0.5)
    if p2 is not None and q05 is not None:
        same = abs(p2.delta_loss - q05.delta_loss) < 1e-3 * max(1.0, abs(p2.delta_loss))
        out.append(f"  Value space s_par = 2 vs s_perp = 0.5 (the same direction, twice the size): delta loss "
                   f"{p2.delta_loss:+.4f} vs {q05.delta_loss:+.4f}: "
                   + ("equal, so a common scale of all heads' outputs is undone downstream (a norm after the attention "
                      "output, as in Gemma's sandwich norm): only s_par / s_perp matters in this space."
                      if same else "different (the output's scale matters in this model)."))
    hd = pick(df, "hard-diag")
    out.append(f"  Hard diagonal removal: delta loss {hd.delta_loss:+.4f} [{hd.delta_loss_lo:+.4f}, {hd.delta_loss_hi:+.4f}] "
               f"vs V-Para removal {v.delta_loss:+.4f} (paper, zero-shot: hard removal 26.9 vs V-Para 53.2 of 53.0, "
               f"i.e. hard removal far worse).")
    return out


def render(meta: dict, tables: dict[str, pd.DataFrame], readings: dict[str, list[str]], stem: str) -> str:
    L = [f"# Component-scaling sweeps: {meta['model']}", "", "**Reading (computed from the tables below):**", ""]
    for t in tables:
        L += readings[t]
    page_dir = Path(meta.get("_page_dir", "."))
    why = [f"[{title}]({name}.md)" for name, title in ((f"bos_check_{meta['model']}", "BOS check"),
                                                      (f"layer_sensitivity_{meta['model']}", "per-layer sensitivity"),
                                                      (f"depth_profile_{meta['model']}", "depth profile"))
           if (page_dir / f"{name}.md").is_file()]
    if why:
        L += ["", "Where the damage comes from: " + ", ".join(why) + "."]
    L += ["", R.generated_line(meta), "",
          R.model_line(meta) + ", "
          "unprocessed weights; every edit on all layers, all heads, no BOS exemption (the paper's default).", ""]
    for t, info in meta["texts"].items():
        L.append(f"- text `{t}`: {R.TEXTS.get(t, t)}; {info['sequences']} windows of {meta['seq_len']} tokens = "
                 f"{info['tokens']} predicted tokens; baseline loss {info['base_loss']:.4f}, ppl {info['base_ppl']:.2f}.")
    L += ["", f"Intervals: 95% percentile bootstrap over sequences ({meta['bootstrap']} resamples, seed {meta['seed']}); "
          f"with only {min(i['sequences'] for i in meta['texts'].values())} sequences per text they are wide and "
          "themselves uncertain. Table: "
          f"[`{stem}.csv`]({stem}.csv); meta: [`{stem}.meta.json`]({stem}.meta.json).", "",
          "Paper numbers (Qwen3-4B, 512-token windows, held-out ppl): METHOD sec. 8 gives deltas from base 80.4 "
          "(V-Para -0.5, resid-attn +3.6, resid-MLP +157, both +375); the issue quotes a camera-ready table from "
          "base 49.95 (V-Para 49.84, resid-attn 53.91, resid-MLP 128.06, both 258.64). The two disagree on the base; "
          "both are shown as relative changes. Zero-shot accuracies (Qwen3-1.7B) are not measured here.", "",
          "Consistency check: perpendicular scaling is the same edit in value-full and value-exclusive mode (the self "
          "message A_tt v_t is parallel to v_t, so o_t and c_t have the same perpendicular part); those rows agree to "
          "float tolerance below.", ""]
    for t, df in tables.items():
        base = df.iloc[0]
        L += [f"## Text `{t}`: parallel removal (s_par = 0), all layers", "",
              "| space | delta loss [95% CI] | delta ppl [95% CI] | delta ppl / base | KL [95% CI] | top-1 agree [95% CI] | "
              "paper sec. 8 / base 80.4 | paper camera-ready / base 49.95 |",
              "|---|---|---|---:|---|---|---:|---:|"]
        for s in SPACES + ["hard-diag"]:
            r = pick(df, s, 0.0) if s != "hard-diag" else pick(df, s)
            p8 = f"{PAPER_REMOVAL[s] / PAPER_BASE_PPL:+.1%}" if s in PAPER_REMOVAL else "n/a"
            pc = (f"{PAPER_CAMERA_READY[s] / PAPER_CAMERA_READY['base'] - 1:+.1%}" if s in PAPER_CAMERA_READY
                  else "n/a")
            L.append(f"| {s} | {R.fmt_ci(r, 'delta_loss')} | {R.fmt_ci(r, 'delta_ppl', '+.2f')} | "
                     f"{r.delta_ppl / base.ppl:+.1%} | {R.fmt_ci(r, 'kl', '.4f')} | {R.fmt_ci(r, 'top1_agree', '.3f')} | "
                     f"{p8} | {pc} |")
        L += ["", f"### Text `{t}`: every setting", "",
              "| space | s_par | s_perp | delta loss [95% CI] | delta ppl [95% CI] | KL [95% CI] | top-1 agree [95% CI] |",
              "|---|---:|---:|---|---|---|---|"]
        for r in df.iloc[1:].itertuples():
            rr = r._asdict()
            L.append(f"| {r.space} | {r.s_par:g} | {r.s_perp:g} | {R.fmt_ci(rr, 'delta_loss')} | "
                     f"{R.fmt_ci(rr, 'delta_ppl', '+.2f')} | {R.fmt_ci(rr, 'kl', '.4f')} | "
                     f"{R.fmt_ci(rr, 'top1_agree', '.3f')} |")
        L += ["", f"![sweep]({stem}.{t}.svg)", ""]
    return "\n".join(L)


def chart(df: pd.DataFrame, title: str) -> str:
    from tl_directional.figures.svg import svg_chart

    series = {}
    for s in SPACES:
        par = df[(df.space == s) & (df.s_perp == 1.0)].sort_values("s_par")
        series[f"{s} s_par"] = list(zip(par.s_par, par.delta_loss, strict=True)) + [(1.0, 0.0)]
        series[f"{s} s_par"].sort()
        perp = df[(df.space == s) & (df.s_par == 1.0)].sort_values("s_perp")
        series[f"{s} s_perp"] = sorted(list(zip(perp.s_perp, perp.delta_loss, strict=True)) + [(1.0, 0.0)])
    return svg_chart(series, title=title, xlabel="scale (s_par or s_perp; the other = 1)",
                     ylabel="delta loss (nats/token)", hline=(0.0, "0"), width=820, height=460)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default", help="any load_model argument (name or HF directory)")
    ap.add_argument("--texts", nargs="+", default=["kjv", "prose"])
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--s-par", type=float, nargs="+", default=[-1.0, 0.0, 0.5, 2.0])
    ap.add_argument("--s-perp", type=float, nargs="+", default=[0.0, 0.5, 2.0])
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="results/real/sweep")
    ap.add_argument("--page", default=None)
    ap.add_argument("--replot", action="store_true", help="re-render from OUT/seq_*.pt and OUT/meta.json")
    args = ap.parse_args(argv)
    R.set_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = settings(args.s_par, args.s_perp)
    t0 = time.time()
    if args.replot:
        import json
        meta = json.loads((out / "meta.json").read_text())
    else:
        model, resolved = R.load(args.model)
        meta = R.provenance(model, args.model, resolved, out.parent)
        meta.update({"command": "python -m studies.explore.scaling_sweep " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "seq_len": args.seq_len, "bootstrap": args.bootstrap, "seed": args.seed, "texts": {},
                     "settings": [s.label for s in sets]})
        for text in args.texts:
            batch = R.text_windows(model, text, args.sequences, args.seq_len)
            t1 = time.time()
            print(f"{text}: {len(batch)} sequences x {args.seq_len}, {len(sets)} settings", flush=True)
            seq = R.per_sequence_sweep(model, batch, sets, args.batch_size, log=lambda m: print(m, flush=True))
            torch.save(seq, out / f"seq_{text}.pt")
            meta["texts"][text] = {"sequences": len(batch), "seconds": time.time() - t1}
            meta["seconds"] = time.time() - t0  # a run stopped after one text can still be re-rendered
            R.write_json(out / "meta.json", meta)
        meta["seconds"] = time.time() - t0
    tables, readings, frames = {}, {}, []
    for text in meta["texts"]:
        seq = torch.load(out / f"seq_{text}.pt")
        w = R.bootstrap_weights(seq["baseline"].shape[0], meta["bootstrap"], meta["seed"])
        df, boot = table(seq, sets, w)
        meta["texts"][text].update(tokens=int(df.iloc[0].tokens), base_loss=float(df.iloc[0].loss),
                                   base_ppl=float(df.iloc[0].ppl))
        tables[text] = df
        readings[text] = reading(df, boot, text)
        frames.append(df.assign(text=text))
        (out / f"{text}.svg").write_text(chart(df, f"{meta['model']}, {text}: delta loss vs scale, all layers"))
    meta["tokens_total"] = sum(v["tokens"] for v in meta["texts"].values())
    meta["reading"] = [line for t in readings for line in readings[t]]
    full = pd.concat(frames, ignore_index=True)
    full.to_csv(out / "sweep.csv", index=False)
    R.write_json(out / "meta.json", meta)
    print("\n".join(meta["reading"]))
    if args.page:
        page = Path(args.page)
        stem = page.stem
        R.publish(page, render({**meta, "_page_dir": str(page.parent)}, tables, readings, stem), out,
                  {"sweep.csv": ".csv", "meta.json": ".meta.json", **{f"{t}.svg": f".{t}.svg" for t in tables}})
    return 0


if __name__ == "__main__":
    common.run_main(main)
