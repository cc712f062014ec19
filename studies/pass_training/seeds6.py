"""Claim 4 in a single pass at six seeds (protocol sec. 15): seeds 3, 4 and 5 of ``baseline``,
``vpara`` and ``attn-para`` beside sec. 10's seeds 0-2, and the V-Para learning-rate check.

    python -m studies run pass-training run-seeds6 --jobs 2      # resumable: rerun until done
    python -m studies run pass-training collect-seeds6           # -> docs/results/data/pass8m.seeds6.*
    make results                                                 # the section on docs/results/pass8m.md
    python -m studies run pass-training bench-seeds6 --steps 20  # CPU seconds per step of one seed

Every task is a sec. 10 task run by sec. 10's runner (:func:`studies.pass_training.run.schedule`,
:func:`studies.pass_training.run.run_task`: the own trainer, its checkpoints and its records), in
this order: the V-Para check ``lr-vpara-LR`` (each of sec. 10's three candidate rates, seed 100,
a quarter of the steps, as the baseline was tuned), then ``own-VARIANT-sSEED`` for seeds 3-5 in the
order (seed, variant) at the shared rate of ``lr.json`` (sec. 10's, never chosen again). When
V-Para's best candidate is not the shared rate, ``own-vpara-sSEED-lrLR`` follows for seeds 0-2 at
that rate (sec. 15: a secondary beside the verdicts). Records are kept in ``--keep`` (default
``docs/results/data/pass8m-tasks/``, commit them as they land) and a new machine resumes from
there, as in sec. 10. ``collect-seeds6`` writes ``pass8m.seeds6.*`` (a manifest of its own: sec.
10's files are never rewritten); the page reads both.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path

from studies import common
from studies.pass_training import stats
from studies.pass_training.run import (
    LR_CANDIDATES,
    LR_FRACTION,
    SCALES,
    SEEDS,
    VARIANTS,
    schedule,
    take_kept,
)

#: The seeds sec. 15 adds, and all six.
NEW_SEEDS = (3, 4, 5)
ALL_SEEDS = SEEDS + NEW_SEEDS
#: The data files' suffix: ``pass8m.seeds6.manifest.json`` and its tables.
SUFFIX = "seeds6"
LAUNCH = "launch-seeds6.json"
LR_VARIANT = "vpara"  # the variant whose rate sec. 15 checks


def lr_tasks() -> list[str]:
    """The V-Para learning-rate check, one task per candidate rate."""
    return [f"lr-{LR_VARIANT}-{lr:g}" for lr in LR_CANDIDATES]


def seed_tasks() -> list[str]:
    """Seeds 3-5 of every arm, in the order (seed, variant)."""
    return [f"own-{v}-s{s}" for s in NEW_SEEDS for v in VARIANTS]


def rate_tasks(best: float | None, shared: float) -> list[str]:
    """V-Para at its own best rate for seeds 0-2: none while the check is unfinished (``best``
    None) or when its best is the shared rate."""
    if best is None or best == shared:
        return []
    return [f"own-{LR_VARIANT}-s{s}-lr{best:g}" for s in SEEDS]


def kept_names() -> list[str]:
    """Every record sec. 15 may keep: its launch record, sec. 10's ``lr.json`` (the shared rate)
    and each task's, the rate runs under every candidate."""
    rate = [t for lr in LR_CANDIDATES for t in rate_tasks(lr, math.nan)]
    return [LAUNCH, "lr.json", *(f"{t}.json" for t in lr_tasks() + seed_tasks() + rate)]


def _read(out: Path, task: str) -> dict | None:
    p = out / "results" / f"{task}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def vpara_lr(out: Path) -> tuple[float | None, dict[float, float]]:
    """V-Para's best candidate rate (None until all three are finished) and each candidate's final
    validation loss."""
    losses = {lr: r["final_val_loss"] for lr in LR_CANDIDATES if (r := _read(out, f"lr-{LR_VARIANT}-{lr:g}"))}
    return (stats.best_lr(losses) if len(losses) == len(LR_CANDIDATES) else None), losses


def run(args) -> int:
    """Run (or resume) every sec. 15 task under ``args.out``; exit status 0 when all finished."""
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    if taken := take_kept(out, args.keep, args.scale, kept_names()):
        print(f"taken from {args.keep}: {', '.join(taken)}", flush=True)
    if not (out / "lr.json").is_file():
        raise SystemExit(f"error: no lr.json under {out} or {args.keep}: sec. 15 trains at sec. 10's rate; restore "
                         "docs/results/data/pass8m-tasks/lr.json from git (or run `pass-training run` first)")
    launch = out / LAUNCH
    if not launch.is_file():
        import torch

        head, dirty = common.git_state()
        if dirty and not args.allow_dirty:
            raise SystemExit("error: tl_directional/ or studies/ has uncommitted changes; commit them "
                             "(the data must name the code that made it) or pass --allow-dirty")
        common.atomic_write_text(launch, json.dumps({
            "commit": head, "dirty": dirty, "scale": args.scale, "corpus": str(args.corpus),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
            "jobs": args.jobs, "command": f"python -m studies run pass-training run-seeds6 --jobs {args.jobs}"},
            indent=1) + "\n")
    elif json.loads(launch.read_text()).get("scale") != args.scale:
        raise SystemExit(f"error: {out} holds a --scale {json.loads(launch.read_text()).get('scale')} run of sec. 15; "
                         f"use another --out for --scale {args.scale}")
    shared = json.loads((out / "lr.json").read_text())["lr"]
    failed, pending = schedule(lr_tasks() + seed_tasks(), args, kept_names())
    if failed or pending:
        return 1
    best, _ = vpara_lr(out)
    if extra := rate_tasks(best, shared):
        print(f"V-Para's best candidate rate is {best:g}, not the shared {shared:g}: protocol sec. 15 adds "
              f"{', '.join(extra)}", flush=True)
        failed, pending = schedule(extra, args, kept_names())
        if failed or pending:
            return 1
    print(f"all sec. 15 tasks done; now: python -m studies run pass-training collect-seeds6 --out {out}")
    return 0


# --------------------------------------------------------------------------------------------
# collect
# --------------------------------------------------------------------------------------------


def _table(rows: list[dict], cols: list[str]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{r[k]:.6f}" if isinstance(r[k], float) and k != "lr" else r[k]) for k in cols})
    return buf.getvalue().encode()


#: Config keys that may differ from sec. 10's runs: which arm and seed, and where the corpus lies.
OWN_KEYS = ("variant", "seed", "corpus", "tokenizer")


def check_config(rec: dict, base: dict, lr: float) -> None:
    """Refuse a record whose training config is not sec. 10's (``base``, the committed manifest's)
    at rate ``lr``: sec. 15 changes the seeds and nothing else."""
    got = {k: v for k, v in rec["config"].items() if k not in OWN_KEYS}
    want = {**{k: v for k, v in base.items() if k not in OWN_KEYS}, "lr": lr}
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise SystemExit(f"error: {rec['task']} was trained with another config than sec. 10's ({', '.join(diff)}: "
                         f"{[got.get(k) for k in diff]} against {[want.get(k) for k in diff]}); rerun it")


def _records(out: Path, base: dict) -> dict[str, dict]:
    shared = base["config"]["lr"]
    best, _ = vpara_lr(out)
    recs = {}
    for t in lr_tasks() + seed_tasks() + rate_tasks(best, shared):
        if (r := _read(out, t)) is None:
            continue
        if t.startswith("own-"):
            check_config(r, base["config"], r["config"]["lr"] if "-lr" in t else shared)
            if r["corpus"].get("sha256") != base["corpus"].get("sha256"):
                raise SystemExit(f"error: {t} read another corpus than sec. 10's (sha256 differ); rebuild "
                                 "`make pass-corpus` and rerun it")
        recs[t] = r
    return recs


def collect(args) -> int:
    """Write ``STEM.seeds6.{final,curves,lr}.csv`` and their manifest from the finished records."""
    out, data = Path(args.out), Path(args.data)
    take_kept(out, args.keep, args.scale, kept_names())
    if not (out / LAUNCH).is_file():
        raise SystemExit(f"error: no {LAUNCH} under {out} or {args.keep}; run `pass-training run-seeds6` first")
    launch = json.loads((out / LAUNCH).read_text())
    if launch.get("dirty") and not args.allow_dirty:
        raise SystemExit(f"error: {out}/{LAUNCH} says the run started from a dirty tree; rerun from a clean commit")
    base_path = data / f"{args.stem}.manifest.json"
    if not base_path.is_file():
        raise SystemExit(f"error: {base_path} (sec. 10's runs) is missing; sec. 15 adds seeds to it")
    base = json.loads(base_path.read_text())
    recs = _records(out, base)
    if not recs:
        raise SystemExit(f"error: no finished sec. 15 task under {out}/results; run `pass-training run-seeds6` first")
    finals, curves, lrs = [], [], []
    for t, r in recs.items():
        if t.startswith("lr-"):
            lrs.append({"variant": r["variant"], "seed": r["config"]["seed"], "lr": r["lr"],
                        "max_steps": r["config"]["max_steps"], "final_val_loss": r["final_val_loss"]})
            continue
        lr = r["config"]["lr"]
        finals.append({"variant": r["variant"], "seed": r["seed"], "lr": lr, "final_val_loss": r["final_val_loss"],
                       "cpu_s": r["cpu_s"]})
        curves += [{"variant": r["variant"], "seed": r["seed"], "lr": lr, "step": m["step"], "tokens": m["tokens"],
                    "train_loss": m["train_loss"] if m["train_loss"] is not None else math.nan,
                    "val_loss": m["val_loss"]} for m in r["curve"]]
    stem = f"{args.stem}.{SUFFIX}"
    files = {f"{stem}.final.csv": _table(finals, ["variant", "seed", "lr", "final_val_loss", "cpu_s"]),
             f"{stem}.curves.csv": _table(curves, ["variant", "seed", "lr", "step", "tokens", "train_loss", "val_loss"]),
             f"{stem}.lr.csv": _table(lrs, ["variant", "seed", "lr", "max_steps", "final_val_loss"])}
    best, _ = vpara_lr(out)
    wanted = lr_tasks() + seed_tasks() + rate_tasks(best, base["config"]["lr"])
    manifest = {
        "study": "pass_training", "protocol": "sec. 15", "scale": launch["scale"], "commit": launch["commit"][:7],
        "started": launch["started"], "torch": launch["torch"], "command": launch["command"],
        "base": base_path.name, "complete": best is not None and all(t in recs for t in wanted),
        "missing": [t for t in wanted if t not in recs],
        **stats.ledger(recs),
        "files": {},
    }
    common.write_data(data, files, manifest, f"{stem}.manifest.json")
    print(f"wrote {len(files) + 1} files under {data}")
    return 0


# --------------------------------------------------------------------------------------------
# bench: the cost of one seed at the study's size
# --------------------------------------------------------------------------------------------


def synthetic_corpus(root: Path, n_ctx: int, windows: int, val_windows: int, vocab: int, seed: int = 0) -> Path:
    """A pre-tokenised corpus of uniformly random ids (``windows`` training and ``val_windows``
    validation windows of ``n_ctx``) with a byte-level BPE tokenizer of at most ``vocab`` tokens:
    the study's shapes for timing where the real ``pass8m`` is not built (a step's cost does not
    depend on which ids it reads)."""
    import numpy as np

    from tl_directional.io.corpus import heldout_text
    from tl_directional.model.load import train_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    train_tokenizer(heldout_text(), vocab).save_pretrained(str(root / "tokenizer"))
    rng = np.random.default_rng(seed)
    meta = {"name": "synthetic", "dtype": "uint16", "eot_id": 0, "splits": {}}
    for split, n in (("train", windows), ("validation", val_windows)):
        ids = rng.integers(1, vocab, size=n * (n_ctx - 1), dtype=np.uint16)
        ids.astype("<u2").tofile(root / f"{split}.bin")
        meta["splits"][split] = {"file": f"{split}.bin", "tokens": int(ids.size)}
    (root / "tokens.json").write_text(json.dumps(meta))
    return root


def bench(args) -> int:
    """CPU seconds per optimiser step of one seed (each arm, ``args.steps`` steps after one
    warm-up step) and of one full validation pass, at the study's size, with sec. 15's budget
    from them: nine runs of ``max_steps`` plus the V-Para check (CPU time: the machine is shared)."""
    import torch

    from tl_directional.training import TrainConfig, Trainer, prepare_data

    torch.set_num_threads(1)
    tmp = Path(args.tmp)
    sc = SCALES[args.scale]
    corpus = Path(args.corpus)
    if args.synthetic:
        corpus = synthetic_corpus(tmp / "corpus", sc["n_ctx"], sc["max_steps"] * sc["batch_size"], args.val_windows,
                                  sc["vocab_size"])
    rows, data = [], None
    for variant in VARIANTS:
        cfg = TrainConfig(corpus=str(corpus), **{**sc, "variant": variant, "seed": NEW_SEEDS[0], "lr": args.lr})
        data = data or prepare_data(cfg, tmp / "tok")
        tr = Trainer(cfg, tmp / f"bench-{variant}-{time.time_ns()}", data=data)
        tr.train_step(0)  # a warm-up step, not timed
        c0, w0 = time.process_time(), time.perf_counter()
        for k in range(1, 1 + args.steps):
            tr.train_step(k)
        cpu, wall = (time.process_time() - c0) / args.steps, (time.perf_counter() - w0) / args.steps
        c0 = time.process_time()
        tr.evaluate()
        rows.append({"variant": variant, "cpu_s_per_step": cpu, "wall_s_per_step": wall,
                     "eval_cpu_s": time.process_time() - c0, "validation_windows": len(data.validation)})
        print(json.dumps(rows[-1]), flush=True)
    budget = budget_hours(rows, sc)
    print(json.dumps(budget), flush=True)
    if args.json:
        common.atomic_write_text(Path(args.json), json.dumps({"steps_timed": args.steps, "threads": 1,
                                                              "synthetic": args.synthetic, "scale": args.scale,
                                                              "rows": rows, "budget": budget}, indent=1) + "\n")
    return 0


def budget_hours(rows: list[dict], sc: dict) -> dict:
    """Sec. 15's CPU-hours from the measured step and evaluation costs: each arm's run of
    ``max_steps`` with an evaluation at step 0, every ``eval_every`` and at the end, three times
    (seeds 3-5), plus V-Para's three check runs of ``LR_FRACTION`` of the steps."""
    def run_s(row, steps, every):
        evals = 1 + steps // every + (steps % every != 0)
        return steps * row["cpu_s_per_step"] + evals * row["eval_cpu_s"]

    seeds = sum(len(NEW_SEEDS) * run_s(r, sc["max_steps"], sc["eval_every"]) for r in rows)
    lr_steps = max(int(sc["max_steps"] * LR_FRACTION), 2)
    vpara = next(r for r in rows if r["variant"] == LR_VARIANT)
    check = len(LR_CANDIDATES) * run_s(vpara, lr_steps, max(lr_steps // 4, 1))
    rate = len(SEEDS) * run_s(vpara, sc["max_steps"], sc["eval_every"])
    return {"seeds_cpu_h": seeds / 3600, "lr_check_cpu_h": check / 3600, "total_cpu_h": (seeds + check) / 3600,
            "if_vpara_rate_differs_cpu_h": rate / 3600}


__all__ = ["ALL_SEEDS", "LAUNCH", "NEW_SEEDS", "SUFFIX", "bench", "budget_hours", "collect", "kept_names",
           "lr_tasks", "rate_tasks", "run", "seed_tasks", "synthetic_corpus", "vpara_lr"]
