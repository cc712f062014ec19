"""The toy training experiment (docs/training.md) rerun through ``transformers.Trainer`` +
``DirectionalEditCallback``, next to the project's own trainer on the same budget.

For every seed it trains ``baseline`` and ``vpara`` (``ValueScale(s_par=0, mode="full")`` in every
layer) twice: with the own trainer (:func:`tl_directional.training.trainer.train`, what
``tl-directional experiment`` runs) and through the Hugging Face Trainer with the callback
(:func:`tl_directional.training.hf_recipe.train_like_own_trainer`: same seeded initial GPT-2, same global
batches in the same order, same AdamW groups, schedule and clipping, one shared tokenizer). It
then reports, per path, the final validation loss (edit active) and the paired difference
``vpara - baseline`` over seeds (mean, 95 % t interval, sign-flip p) and whether the two paths
give the same verdict: the same sign of the mean difference and overlapping intervals.

    OMP_NUM_THREADS=1 python -m studies.explore.hf_toy_experiment --corpus /tmp/kjv --out runs/hf-toy \\
        --results docs/hf_training_results --threads 1

Writes ``OUT/partial.json`` after every run (the final losses so far) and, at the end,
``OUT/results.json`` (and, with ``--results DIR``, ``DIR/results.json``, ``DIR/final.csv``
and ``DIR/table.md``). Runs are not resumed: each invocation trains from scratch into ``OUT``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

from studies import common

ROOT = common.ROOT

PATHS = ("own", "hf")
VARIANTS = ("baseline", "vpara")


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="directory written by python -m studies.data.fetch_corpus")
    p.add_argument("--out", required=True, help="work directory (tokenizer, runs; trained from scratch)")
    p.add_argument("--results", default=None, help="also write results.json, final.csv, table.md here")
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--max-steps", type=int, default=None, help="default: the experiment's (200)")
    p.add_argument("--warmup-steps", type=int, default=None, help="default: the experiment's (20)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from tl_directional.training.config import TOKENIZER_DIR, TrainConfig
    from tl_directional.training.data import prepare_data
    from tl_directional.training.experiment import EXPERIMENT_DEFAULTS, paired_comparison
    from tl_directional.training.hf_recipe import train_like_own_trainer
    from tl_directional.training.trainer import train

    seeds = [int(s) for s in args.seeds.split(",")]
    over = {"corpus": args.corpus}
    if args.max_steps is not None:
        over["max_steps"] = args.max_steps
    if args.warmup_steps is not None:
        over["warmup_steps"] = args.warmup_steps
    base = TrainConfig(**{**EXPERIMENT_DEFAULTS.to_dict(), **over,
                          "ckpt_every": over.get("max_steps", EXPERIMENT_DEFAULTS.max_steps)})
    out = Path(args.out)
    if (out / "runs").exists():
        raise SystemExit(f"{out}/runs exists; this script trains from scratch: pass a new --out")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data = prepare_data(base, out)  # one tokenizer (trained on the train split) for every run
    tok_dir = str(out / TOKENIZER_DIR)
    final: dict[str, dict[str, dict[int, float]]] = {p: {v: {} for v in VARIANTS} for p in PATHS}
    seconds: dict[str, float] = {}
    for seed in seeds:
        for variant in VARIANTS:
            cfg = TrainConfig(**{**base.to_dict(), "variant": variant, "seed": seed, "tokenizer": tok_dir})
            name = f"{variant}-s{seed}"
            t0 = time.perf_counter()
            res = train(cfg, out / "runs" / "own" / name, progress=False, data=data, resume=False)
            seconds[f"own/{name}"] = time.perf_counter() - t0
            final["own"][variant][seed] = float(res.final_val_loss)
            t0 = time.perf_counter()
            got = train_like_own_trainer(cfg, data, out / "runs" / "hf" / name)
            seconds[f"hf/{name}"] = time.perf_counter() - t0
            final["hf"][variant][seed] = float(got["val_loss"])
            (out / "partial.json").write_text(json.dumps(  # what an interrupted invocation leaves
                {p: {v: {str(k): x for k, x in final[p][v].items()} for v in VARIANTS} for p in PATHS},
                indent=2, sort_keys=True) + "\n")
            print(f"{name}: own {final['own'][variant][seed]:.4f} ({seconds[f'own/{name}']:.0f} s), "
                  f"hf Trainer + callback {final['hf'][variant][seed]:.4f} ({seconds[f'hf/{name}']:.0f} s)",
                  flush=True)
    comparisons = {p: paired_comparison([final[p]["vpara"][s] for s in seeds],
                                        [final[p]["baseline"][s] for s in seeds]) for p in PATHS}
    own, hf = comparisons["own"], comparisons["hf"]
    same_sign = (own["mean_diff"] > 0) == (hf["mean_diff"] > 0)
    overlap = own["ci95_low"] <= hf["ci95_high"] and hf["ci95_low"] <= own["ci95_high"]
    result = {
        "config": base.to_dict(), "seeds": seeds,
        "tokens_per_run": base.max_steps * base.batch_size * base.n_ctx,
        "train_tokens_available": data.corpus_info.get("train_tokens"),
        "validation_windows": len(data.validation), "validation_tokens": int(data.validation.numel()),
        "final_val_loss": {p: {v: [final[p][v][s] for s in seeds] for v in VARIANTS} for p in PATHS},
        "paired_vpara_minus_baseline": comparisons,
        "same_verdict": {"same_sign": same_sign, "intervals_overlap": overlap},
        "max_abs_final_gap_own_vs_hf": max(abs(final["own"][v][s] - final["hf"][v][s]) for v in VARIANTS for s in seeds),
        "seconds": seconds, "total_seconds": time.perf_counter() - t_start, "threads": args.threads,
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "lane": __import__("tl_directional.model.load", fromlist=["tl_lane"]).tl_lane(),
    }
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    (out / "results.json").write_text(text)
    table = _table(result)
    print(table)
    if args.results:
        res_dir = Path(args.results)
        res_dir.mkdir(parents=True, exist_ok=True)
        (res_dir / "results.json").write_text(text)
        (res_dir / "table.md").write_text(table)
        with open(res_dir / "final.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["path", "variant", "seed", "final_val_loss"])
            for p in PATHS:
                for v in VARIANTS:
                    for s in seeds:
                        w.writerow([p, v, s, repr(final[p][v][s])])
    return result


def _table(r: dict) -> str:
    cfg = r["config"]
    lines = [
        f"Budget: {cfg['max_steps']} steps x {cfg['batch_size']} windows x {cfg['n_ctx']} tokens = "
        f"{r['tokens_per_run']:,} training tokens per run; {len(r['seeds'])} seeds; GPT-2 {cfg['n_layers']} layers, "
        f"d_model {cfg['d_model']}, {cfg['n_heads']} heads, vocabulary {cfg['vocab_size']}; validation "
        f"{r['validation_windows']} windows ({r['validation_tokens']:,} tokens), edit active.",
        "",
        "| path | baseline final val loss (per seed) | vpara final val loss (per seed) | paired diff vpara - baseline (mean +- std) | 95% t interval | sign-flip p | seeds below baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    names = {"own": "own trainer (`tl-directional experiment`)", "hf": "HF `Trainer` + `DirectionalEditCallback`"}
    for p in PATHS:
        c = r["paired_vpara_minus_baseline"][p]
        b = ", ".join(f"{x:.4f}" for x in r["final_val_loss"][p]["baseline"])
        v = ", ".join(f"{x:.4f}" for x in r["final_val_loss"][p]["vpara"])
        lines.append(f"| {names[p]} | {b} | {v} | {c['mean_diff']:+.4f} +- {c['std_diff']:.4f} | "
                     f"[{c['ci95_low']:+.4f}, {c['ci95_high']:+.4f}] | {c['perm_p']:.3f} | {c['wins']}/{c['n']} |")
    sv = r["same_verdict"]
    lines += ["", f"Same verdict: same sign {sv['same_sign']}, intervals overlap {sv['intervals_overlap']}; "
              f"largest |own - HF| final loss of one run: {r['max_abs_final_gap_own_vs_hf']:.2g}; "
              f"wall time {r['total_seconds'] / 60:.1f} min on {r['threads']} thread(s).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    common.run_main(main)
