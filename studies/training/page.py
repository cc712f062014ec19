"""Claim 4 of the seed (training with full-aggregate V-Para suppression lowers the loss), under
protocol sec. 8: committed data and a page built from it alone.

    # train (hours of one core; resumable): the experiment runner, baseline and vpara, 5 seeds
    tl-directional experiment --corpus /tmp/kjv --out RUN --threads 1 --seeds 0,1,2,3,4 \
        --variants baseline,vpara --max-steps 2000 --eval-every 200 --eval-windows 256 --ckpt-every 200

    # collect: copy the run's tables beside the pages with a manifest (commit, corpus sha256)
    python -m studies run training collect --run RUN --launch RUN.launch.json --stem training_kjv_10x

    # pages: built by `python -m studies build` (make results) with the other claims pages

``RUN.launch.json`` is written before the run starts (``{"commit", "dirty", "started", "torch",
"transformer_lens"}``, see the command on the page); a run launched from a dirty
``tl_directional/`` or ``studies/`` is refused. Data files:
``docs/results/data/<stem>.{final.csv,curves.csv,geometry.csv,manifest.json}``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

from studies import common

ROOT = common.ROOT

DATA = ROOT / "docs" / "results" / "data"
TABLES = ("final", "curves", "geometry")
#: Training flags that the protocol fixes; collect refuses a run with other values.
PROTOCOL = {"max_steps": 2000, "batch_size": 16, "n_ctx": 128, "n_layers": 2, "d_model": 128,
            "n_heads": 4, "vocab_size": 2048, "eval_windows": 256}
VARIANTS = ("baseline", "vpara")
SEEDS = (0, 1, 2, 3, 4)


class DataError(ValueError):
    """A committed training data file is missing, corrupt or does not match its manifest."""


_sha256 = common.sha256_file  # the one (tl_directional.io.records)


def collect(args) -> int:
    """Copy a finished experiment's tables into ``docs/results/data`` with a manifest."""
    from tl_directional.io.atomic import atomic_write_text

    run, launch_path = Path(args.run), Path(args.launch)
    try:
        launch = json.loads(launch_path.read_text())
        results = json.loads((run / "results.json").read_text())
    except (OSError, ValueError) as e:
        print(f"error: cannot read the run's records ({e}); pass --run RUN --launch RUN.launch.json", file=sys.stderr)
        return 2
    if launch.get("dirty"):
        print(f"error: {launch_path} says the run started from a dirty tree; rerun from a clean commit", file=sys.stderr)
        return 2
    cfg = results["config"]
    bad = {k: (cfg.get(k), v) for k, v in PROTOCOL.items() if cfg.get(k) != v}
    if bad or tuple(results["seeds"]) != SEEDS or tuple(results["variants"]) != VARIANTS:
        print(f"error: the run does not follow protocol sec. 8: {bad or (results['seeds'], results['variants'])}",
              file=sys.stderr)
        return 2
    finals = [f for f in results["finals"] if f is not None]
    corpus = Path(cfg["corpus"])
    manifest = {
        "study": "training_claims",
        "command": ("tl-directional experiment --corpus /tmp/kjv --out RUN --threads 1 --seeds 0,1,2,3,4 "
                    "--variants baseline,vpara --max-steps 2000 --eval-every 200 --eval-windows 256 "
                    "--ckpt-every 200"),
        "commit": launch["commit"][:7],
        "started": launch["started"],
        "machine": f"CPU, 2 cores shared, 1 torch thread, torch {launch['torch']}, "
                   f"transformer_lens {launch['transformer_lens']}",
        "corpus": {split: _sha256(corpus / f"{split}.txt") for split in ("train", "validation")},
        "config": {k: v for k, v in cfg.items() if k not in ("variant", "seed", "corpus", "tokenizer")},
        "complete": len(finals) == len(SEEDS) * len(VARIANTS),
        "notes": launch.get("notes", ""),
        "finished": launch.get("finished", ""),
        "files": {},
    }
    DATA.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        dst = DATA / f"{args.stem}.{name}.csv"
        shutil.copyfile(run / f"{name}.csv", dst)
        manifest["files"][dst.name] = _sha256(dst)
    atomic_write_text(DATA / f"{args.stem}.manifest.json", json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(TABLES) + 1} files under {DATA.relative_to(ROOT)}")
    return 0


def _rel(path: Path) -> str:
    # the data's place in the repository, also for a copy under a test's sandbox
    return f"docs/results/data/{path.name}"


def load(stem: str, data: Path = DATA):
    """The manifest and tables of one committed run, every file checked against its sha256."""
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = common.read_data_manifest(mpath, _rel(mpath), DataError, wording="unreadable manifest")
    tables = {}
    for name in TABLES:
        path = data / f"{stem}.{name}.csv"
        want = manifest.get("files", {}).get(path.name)
        if not path.is_file():
            raise DataError(f"{_rel(path)}: missing (the manifest lists it)")
        if want != _sha256(path):
            raise DataError(f"{_rel(path)}: sha256 differs from {mpath.name} (edited or corrupt)")
        tables[name] = pd.read_csv(path)
    return manifest, tables


def _paired(final):
    from tl_directional.training.experiment import paired_comparison

    per = {v: {int(r.seed): float(r.final_val_loss) for r in final[final.variant == v].itertuples()}
           for v in VARIANTS}
    seeds = [s for s in SEEDS if all(s in per[v] for v in VARIANTS)]
    if len(seeds) < 2:
        return per, seeds, None
    return per, seeds, paired_comparison([per["vpara"][s] for s in seeds], [per["baseline"][s] for s in seeds])


def verdict(stats) -> str:
    """Protocol sec. 8: held if the paired interval lies below 0, failed if above, else not decided."""
    if stats is None:
        return "not decided (runs incomplete)"
    return common.interval_verdict(stats)


def verdict_rows(stem: str, data: Path = DATA):
    """``(claim, statistic, verdict)`` rows for the verdict table of docs/results.md."""
    _, tables = load(stem, data)
    _, seeds, s = _paired(tables["final"])
    stat = "-" if s is None else (f"vpara - baseline = {s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, "
                                  f"{s['ci95_high']:+.4f}] nats/token, {len(seeds)} seeds")
    return [("4: training with full-aggregate V-Para removal lowers validation loss (toy scale)", stat,
             verdict(s))]


def _curve_lines(c, cfg) -> list[str]:
    """The page's validation-curve table: per step, each variant's mean over seeds and the mean
    paired difference."""
    L = ["", "## Validation curves (mean over seeds)", "",
         "| step | tokens | baseline | vpara | vpara - baseline (mean of paired) |", "|---|---|---|---|---|"]
    for step in sorted(c.step.unique()):
        cs = c[c.step == step]
        row = {v: cs[cs.variant == v].set_index("seed").val_loss for v in VARIANTS}
        both = sorted(set(row["baseline"].index) & set(row["vpara"].index))
        diff = sum(row["vpara"][k] - row["baseline"][k] for k in both) / len(both) if both else math.nan
        mean = lambda x: "-" if len(x) == 0 else f"{x.mean():.4f}"  # noqa: E731
        L.append(f"| {int(step)} | {int(step) * cfg['batch_size'] * cfg['n_ctx']:,} | {mean(row['baseline'])} | "
                 f"{mean(row['vpara'])} | {diff:+.4f} |")
    return L


def _geometry_lines(g) -> list[str]:
    """The page's pre-edit geometry table: per variant, mean over layers, then mean +- std over seeds."""
    cols = ("value_energy_ratio", "value_beta_mean", "attn_energy_ratio", "mlp_energy_ratio")
    L = ["", "## Pre-edit geometry of the trained models", "",
         "Read before the edit, each model with its own training edit active; mean over layers, then "
         "mean +- sample std over seeds. Not part of the verdict.", "",
         "| variant | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for v in VARIANTS:
        per_seed = g[g.variant == v].groupby("seed")[list(cols)].mean()
        if per_seed.empty:
            continue
        cells = [f"{per_seed[k].mean():.3f} +- {per_seed[k].std(ddof=1) if len(per_seed) > 1 else 0:.3f}" for k in cols]
        L.append(f"| {v} | " + " | ".join(cells) + " |")
    return L


def build_page(stem: str, data: Path = DATA) -> str:
    """The toy training page of run ``stem`` (protocol sec. 8), from its committed data alone."""
    manifest, t = load(stem, data)
    cfg = manifest["config"]
    per, seeds, s = _paired(t["final"])
    tokens = cfg["max_steps"] * cfg["batch_size"] * cfg["n_ctx"]
    val_tokens = cfg["eval_windows"] * (cfg["n_ctx"] - 1)
    L = [
        f"# Claim 4 at toy scale: training with full-aggregate V-Para removal ({stem})",
        "",
        "Built by `make results` from `docs/results/data/" + stem + ".*` alone (protocol "
        "[sec. 8](protocol.md#8-claim-4-training-with-full-aggregate-v-para-suppression-added-2026-12-02-before-its-runs)). "
        "Do not edit by hand.",
        "",
        f"- Run: `{manifest['command']}` at commit `{manifest['commit']}` (clean tree), started "
        f"{manifest['started']}, last run finished {manifest['finished'] or '(not recorded)'}; {manifest['machine']}"
        + ("." if manifest["complete"] else " so far (**incomplete**: the table shows the finished runs)."),
        *([f"- How it ran: {manifest['notes']}"] if manifest.get("notes") else []),
        f"- Corpus: KJV from `scripts/fetch_corpus.py` (Debian `bible-kjv`, split by books); train sha256 "
        f"`{manifest['corpus']['train'][:16]}...`, validation `{manifest['corpus']['validation'][:16]}...`.",
        f"- Model (**toy scale**): GPT-2, {cfg['n_layers']} layers, d_model {cfg['d_model']}, {cfg['n_heads']} heads, "
        f"n_ctx {cfg['n_ctx']}, byte-level BPE of {cfg['vocab_size']} tokens; {cfg['max_steps']} steps x "
        f"{cfg['batch_size']} windows = {tokens:,} training tokens per run (10x the earlier "
        "[Training](../training.md) run), lr "
        f"{cfg['lr']}, warmup {cfg['warmup_steps']}, cosine to {cfg['min_lr_ratio']} lr.",
        "- `vpara`: `ValueScale(s_par=0, mode=\"full\")` in every layer and head (the full aggregate, self "
        "message included), active in training and evaluation; `baseline`: no edit. Same seed = same init "
        "and data order.",
        f"- Statistic: final validation loss on the first {cfg['eval_windows']} validation windows "
        f"({val_tokens:,} predicted tokens), paired difference per seed, mean with a 95% Student-t interval.",
        "",
        "## Verdict",
        "",
        "| claim | statistic [95% CI] | sign-flip p | seeds below baseline | verdict |",
        "|---|---|---|---|---|",
    ]
    if s is None:
        L.append("| 4 | - | - | - | not decided (runs incomplete) |")
    else:
        L.append(
            f"| 4: full-aggregate V-Para removal during training lowers validation loss | "
            f"{s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] nats/token ({len(seeds)} seeds) | "
            f"{s['perm_p']:.4f} | {s['wins']}/{len(seeds)} | {verdict(s)} |"
        )
    L += ["", "## Final validation loss per seed", "", "| seed | baseline | vpara | vpara - baseline |",
          "|---|---|---|---|"]
    for seed in SEEDS:
        b, v = per["baseline"].get(seed), per["vpara"].get(seed)
        cell = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        d = "-" if b is None or v is None else f"{v - b:+.4f}"
        L.append(f"| {seed} | {cell(b)} | {cell(v)} | {d} |")
    L += _curve_lines(t["curves"], cfg) + _geometry_lines(t["geometry"])
    L += [
        "",
        "## What this does and does not say",
        "",
        f"- It is a toy: {cfg['n_layers']} layers, about {12 * cfg['n_layers'] * cfg['d_model'] ** 2 / 1e6:.1f}M "
        "parameters outside the embeddings, about four passes over one corpus (the KJV train split)."
        " The paper's replicated loss result is at 296M-528M parameters on OpenWebText and its downstream one at 1.4B / 2.7B; a verdict here says what the edit does at this "
        "scale, not at those.",
        "- The learned variant of the paper (a trainable gate on the parallel part) is not run.",
    ]
    return "\n".join(L)
