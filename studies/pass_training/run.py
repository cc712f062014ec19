"""Claim 4 beyond the toy (protocol sec. 10): baseline, full-aggregate value-space V-Para and
residual-space attention parallel suppression trained side by side in a single pass over
``pass8m`` (``python -m studies.data.build_pass_corpus``), 3 seeds each, plus one seed per variant through the
Hugging Face ``Trainer`` callback.

    make pass-corpus                                          # the token files (once)
    python -m studies run pass-training bench                     # CPU seconds per step of candidate shapes
    python -m studies run pass-training run --jobs 2              # everything; resumable: rerun until done
    python -m studies run pass-training collect                   # per-seed curves + finals -> docs/results/data
    make results                                              # the page docs/results/pass8m.md

``run`` works in ``--out`` (default ``$TL_DIRECTIONAL_CACHE/runs/pass8m``): first the learning-rate
choice on the baseline (``lr/``, then ``lr.json``), then every own-trainer run (``runs/VARIANT-sSEED``,
checkpointed, resumed where it stopped) and every HF-callback run (``hf/VARIANT-sSEED``), each task
in its own process, ``--jobs`` at a time. A task's record lands atomically in
``results/TASK.json`` when it finishes, so an interrupted ``run`` loses at most the unfinished steps
since each task's last checkpoint (own trainer and HF ``Trainer`` checkpoints alike). ``collect``
reads the records; the page is built by ``python -m studies build`` (``make results``) from the
committed ``docs/results/data/pass8m.*`` alone.

The grid outlasts one machine: every finished task's record, ``lr.json`` and ``launch.json`` are
also copied to ``--keep`` (default for ``--scale study``: ``docs/results/data/pass8m-tasks/``, to
be committed as each task lands), and ``run`` / ``collect`` on a new machine take them from there
first, so only unfinished tasks run again. Sec. 15's seeds 3-5 (:mod:`studies.pass_training.seeds6`)
run through the same scheduler (:func:`schedule`) and task runner (:func:`run_task`).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from studies import common
from studies.pass_training import stats

ROOT = common.ROOT
DATA = ROOT / "docs" / "results" / "data"
STEM = "pass8m"
VARIANTS = ("baseline", "vpara", "attn-para")
SEEDS = (0, 1, 2)
HF_SEEDS = (0,)
LR_SEED = 100  # the learning-rate choice never uses a study seed
LR_CANDIDATES = (1.5e-3, 3e-3, 6e-3)
LR_FRACTION = 0.25  # each candidate runs a full schedule over this fraction of the study's steps
GEOMETRY_WINDOWS = 8  # validation windows the parallel share is read on

#: The study's fixed settings (protocol sec. 10). ``lr`` is chosen by the ``lr`` stage.
SCALES = {
    "study": dict(vocab_size=8192, n_layers=4, d_model=128, n_heads=2, d_mlp=512, n_ctx=256, batch_size=32,
                  max_steps=1100, warmup_steps=100, min_lr_ratio=0.1, weight_decay=0.1, eval_every=100,
                  eval_windows=0, ckpt_every=50, keep_checkpoints=2),
    # seconds: the end-to-end test and a first look
    "smoke": dict(vocab_size=8192, n_layers=1, d_model=32, n_heads=2, d_mlp=128, n_ctx=32, batch_size=4,
                  max_steps=8, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.1, eval_every=4,
                  eval_windows=8, ckpt_every=4, keep_checkpoints=2),
}
#: Candidate shapes for ``bench`` (d_head 64 and d_mlp = 4 d_model, GPT-2's and the paper's ratios).
BENCH_SHAPES = ((4, 256), (4, 128), (6, 256), (8, 256))


class DataError(ValueError):
    """A committed pass8m data file is missing, corrupt or does not match its manifest."""


def default_corpus() -> Path:
    return common.cache_root() / "corpora" / STEM


def default_out() -> Path:
    return common.cache_root() / "runs" / STEM


def _json_write(path: Path, obj) -> None:
    common.atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def default_keep(scale: str) -> Path | None:
    """Where finished records are kept for a later machine: committed data for the study, none
    for the smoke scale unless asked (``--keep``)."""
    return DATA / f"{STEM}-tasks" if scale == "study" else None


def _kept_names(scale: str) -> list[str]:
    return ["launch.json", "lr.json", *(f"{t}.json" for t in tasks(scale))]


def _in_out(out: Path, name: str) -> Path:
    return out / name if name in ("launch.json", "lr.json") or name.startswith("launch-") else out / "results" / name


def take_kept(out: Path, keep: Path | None, scale: str, names: list[str] | None = None) -> list[str]:
    """Copy kept records (``names``, default sec. 10's) that ``out`` lacks into it (a new machine
    resumes the grid); returns the names taken. Records ``out`` already holds are left as they are."""
    if keep is None or not keep.is_dir():
        return []
    taken = []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for name in names or _kept_names(scale):
        src, dst = keep / name, _in_out(out, name)
        if src.is_file() and not dst.is_file():
            try:  # a corrupt kept record stops here, not in a task
                json.loads(src.read_text())
            except ValueError as e:
                raise SystemExit(f"error: {src} is not a readable record ({e}); restore it from git "
                                 f"(`git checkout -- {src.name}` in {keep}) or delete it to rerun that task") from e
            common.atomic_write_text(dst, src.read_text())
            taken.append(name)
    return taken


def give_kept(out: Path, keep: Path | None, scale: str, names: list[str] | None = None) -> list[str]:
    """Copy finished records of ``out`` (``names``, default sec. 10's) that ``keep`` lacks into it."""
    if keep is None:
        return []
    given = []
    for name in names or _kept_names(scale):
        src, dst = _in_out(out, name), keep / name
        if src.is_file() and not dst.is_file():
            keep.mkdir(parents=True, exist_ok=True)
            common.atomic_write_text(dst, src.read_text())
            given.append(name)
    return given


def _cfg(scale: str, corpus: Path, **kw):
    from tl_directional.training import TrainConfig

    return TrainConfig(corpus=str(corpus), **{**SCALES[scale], **kw})


def tasks(scale: str) -> list[str]:
    """Every task name, in the order they are started."""
    lr = [f"lr-{lr:g}" for lr in LR_CANDIDATES]
    own = [f"own-{v}-s{s}" for s in SEEDS for v in VARIANTS]
    hf = [f"hf-{v}-s{s}" for s in HF_SEEDS for v in VARIANTS]
    return lr + own + hf


# --------------------------------------------------------------------------------------------
# one task (its own process)
# --------------------------------------------------------------------------------------------


def parallel_shares(model, tokens, variant: str) -> list[dict]:
    """Per layer: the parallel energy share ``par^2 / (par^2 + perp^2)`` of the value-space head
    outputs, the attention update and the MLP update, read before the edit at each hook while the
    variant's edits are active (``pre_edit_geometry``)."""
    from tl_directional.training import pre_edit_geometry, variant_edits

    rows = pre_edit_geometry(model, tokens, variant_edits(variant))
    out = []
    for r in rows:
        row = {"layer": r["layer"]}
        for comp in ("value", "attn", "mlp"):
            e = r[f"{comp}_energy_ratio"]
            row[f"{comp}_share"] = e * e / (1 + e * e) if math.isfinite(e) else (1.0 if e == math.inf else math.nan)
        out.append(row)
    return out


class CpuLedger:
    """CPU seconds one run has spent over every process that worked on it (a run resumed after a
    kill is several processes). Earlier processes' total is read from ``path``; a daemon thread
    rewrites it every ``every`` seconds, so a killed process loses at most that much.
    ``complete`` is False when ``work_dir`` (the run's directory) already held work but there was
    no ledger (a run begun before the ledger existed): its total then misses those processes."""

    def __init__(self, path: Path, work_dir: Path, every: float = 60.0):
        self.path, self.every = path, every
        started = work_dir.is_dir() and any(work_dir.iterdir())
        prior = json.loads(path.read_text()) if path.is_file() else {"cpu_s": 0.0, "processes": 0, "complete": not started}
        self.prior, self.processes, self.complete = float(prior["cpu_s"]), int(prior["processes"]) + 1, bool(prior["complete"])
        self._t0 = time.process_time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True)

    def total(self) -> float:
        return self.prior + time.process_time() - self._t0

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _json_write(self.path, {"cpu_s": self.total(), "processes": self.processes, "complete": self.complete})

    def _keep(self) -> None:
        while not self._stop.wait(self.every):
            self.write()

    def __enter__(self) -> CpuLedger:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.write()


def run_task(name: str, *, out: Path, corpus: Path, scale: str) -> dict:
    """Run one task to the end (resuming its checkpoints) and write ``results/NAME.json``."""
    import torch

    torch.set_num_threads(1)
    t_wall = time.perf_counter()
    kind, rest = name.split("-", 1)
    with CpuLedger(out / "cpu" / f"{name}.json", _task_dir(out, name)) as ledger:
        record = _run_task(name, kind, rest, out=out, corpus=corpus, scale=scale)
    record["commit"] = common.git_commit()  # a run resumed in a later session may run newer code
    record["cpu_s"] = ledger.total()
    record["cpu_processes"], record["cpu_complete"] = ledger.processes, ledger.complete
    record["wall_s"] = time.perf_counter() - t_wall
    _json_write(out / "results" / f"{name}.json", record)
    return record


def _task_dir(out: Path, name: str) -> Path:
    kind, rest = name.split("-", 1)
    return out / ("lr" if kind == "lr" else "runs" if kind == "own" else "hf") / (name if kind == "lr" else rest)


def _run_task(name: str, kind: str, rest: str, *, out: Path, corpus: Path, scale: str) -> dict:
    import torch

    from tl_directional.training import load_init, prepare_data, train

    if kind == "lr":  # lr-LR (the baseline) or lr-VARIANT-LR (sec. 15's V-Para check)
        variant, lr = rest.rsplit("-", 1) if rest[:1].isalpha() else ("baseline", rest)
        lr = float(lr)
        steps = max(int(SCALES[scale]["max_steps"] * LR_FRACTION), 2)
        cfg = _cfg(scale, corpus, variant=variant, seed=LR_SEED, lr=lr, max_steps=steps,
                   warmup_steps=min(SCALES[scale]["warmup_steps"], steps // 4),
                   eval_every=max(steps // 4, 1), ckpt_every=max(steps // 8, 1))
        res = train(cfg, _task_dir(out, name), progress=False)
        record = {"task": name, "variant": variant, "lr": lr, "final_val_loss": res.final_val_loss, "curve": res.metrics,
                  "config": cfg.to_dict()}
    else:
        variant, seed = rest.rsplit("-s", 1)
        seed, _, own_lr = seed.partition("-lr")  # own-VARIANT-sSEED-lrLR: a rate other than lr.json's
        seed = int(seed)
        lr = float(own_lr) if own_lr else json.loads((out / "lr.json").read_text())["lr"]
        cfg = _cfg(scale, corpus, variant=variant, seed=seed, lr=lr)
        run_dir = _task_dir(out, name)
        data = prepare_data(cfg, run_dir)
        probe = data.validation[:GEOMETRY_WINDOWS]
        if kind == "own":
            res = train(cfg, run_dir, progress=False, data=data)
            before = parallel_shares(load_init(run_dir / "init", torch.device("cpu")), probe, variant)
            after = parallel_shares(res.model, probe, variant)
            record = {"task": name, "variant": variant, "seed": seed, "path": "own",
                      "final_val_loss": res.final_val_loss, "curve": res.metrics, "shares_before": before,
                      "shares_after": after, "config": cfg.to_dict(), "corpus": data.corpus_info}
        else:
            from tl_directional.training.hf_recipe import train_like_own_trainer

            got = train_like_own_trainer(cfg, data, run_dir, save_every=cfg.ckpt_every)
            record = {"task": name, "variant": variant, "seed": seed, "path": "hf",
                      "final_val_loss": got["val_loss"], "train_losses": got["train_losses"],
                      "config": cfg.to_dict()}
    return record


def choose_lr(out: Path, scale: str) -> float | None:
    """The candidate with the lowest final validation loss (ties: the smaller); writes ``lr.json``."""
    if (out / "lr.json").is_file():
        return json.loads((out / "lr.json").read_text())["lr"]
    got = {}
    for lr in LR_CANDIDATES:
        p = out / "results" / f"lr-{lr:g}.json"
        if not p.is_file():
            return None
        got[lr] = json.loads(p.read_text())["final_val_loss"]
    best = min(sorted(got), key=lambda k: got[k])
    _json_write(out / "lr.json", {"lr": best, "candidates": {f"{k:g}": v for k, v in got.items()},
                                  "rule": "lowest final validation loss of the baseline (seed "
                                  f"{LR_SEED}) over {LR_FRACTION:g} of the study's steps; ties: smaller lr"})
    return best


# --------------------------------------------------------------------------------------------
# run: the scheduler
# --------------------------------------------------------------------------------------------


def run(args) -> int:
    out, corpus = Path(args.out), Path(args.corpus)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(exist_ok=True)
    if taken := take_kept(out, args.keep, args.scale):
        print(f"taken from {args.keep}: {', '.join(taken)}", flush=True)
    launch = out / "launch.json"
    if not launch.is_file():
        import torch

        head, dirty = common.git_state()
        if dirty and not args.allow_dirty:
            raise SystemExit("error: tl_directional/ or studies/ has uncommitted changes; commit them "
                             "(the data must name the code that made it) or pass --allow-dirty")
        _json_write(launch, {"commit": head, "dirty": dirty, "scale": args.scale, "corpus": str(corpus),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "torch": torch.__version__, "jobs": args.jobs})
    elif json.loads(launch.read_text()).get("scale") != args.scale:
        raise SystemExit(f"error: {out} holds a --scale {json.loads(launch.read_text()).get('scale')} run; "
                         f"use another --out for --scale {args.scale}")
    failed, pending = schedule(tasks(args.scale), args)
    if failed or pending:
        return 1
    print(f"all {len(tasks(args.scale))} tasks done; now: python -m studies run pass-training collect --out {out}")
    return 0


def schedule(names: list[str], args, kept: list[str] | None = None) -> tuple[list[str], list[str]]:
    """Run each task of ``names`` that has no record in ``args.out/results`` yet, in that order,
    ``args.jobs`` at a time, each in its own process (``--jobs 0``: all in this one); finished
    records go to ``args.keep`` as they land (``kept``: the names to keep, default sec. 10's).
    Returns the tasks that failed and those not started (both empty when all finished)."""
    out, corpus, scale = Path(args.out), Path(args.corpus), args.scale
    pending = [t for t in names if not (out / "results" / f"{t}.json").is_file()]
    if args.jobs == 0:  # every task in this process, one after the other (tests, debugging)
        for t in pending:
            if not t.startswith("lr-"):
                choose_lr(out, scale)
            run_task(t, out=out, corpus=corpus, scale=scale)
            choose_lr(out, scale)
            give_kept(out, args.keep, scale, kept)
            print(f"{t}: done", flush=True)
        choose_lr(out, scale)
        give_kept(out, args.keep, scale, kept)
        return [], []
    running: dict[str, subprocess.Popen] = {}
    failed: list[str] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    while pending or running:
        for t, p in list(running.items()):
            if p.poll() is not None:
                del running[t]
                ok = p.returncode == 0 and (out / "results" / f"{t}.json").is_file()
                print(f"{time.strftime('%H:%M:%S')} {t}: {'done' if ok else f'FAILED (exit {p.returncode})'}",
                      flush=True)
                if not ok:
                    failed.append(t)
        lr_ready = choose_lr(out, scale) is not None
        if given := give_kept(out, args.keep, scale, kept):
            print(f"{time.strftime('%H:%M:%S')} kept in {args.keep}: {', '.join(given)} (commit them)", flush=True)
        for t in list(pending):
            if len(running) >= args.jobs:
                break
            if not t.startswith("lr-") and not lr_ready:
                continue
            pending.remove(t)
            log = open(out / f"{t}.log", "a")  # noqa: SIM115 - the child owns it
            cmd = [sys.executable, "-m", "studies.pass_training.cli", "task", t, "--out", str(out),
                   "--corpus", str(corpus), "--scale", scale]
            # the log is appended to across restarts: a dated header keeps an earlier attempt's
            # error from reading as this one's
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started: {' '.join(cmd[1:])}\n")
            log.flush()
            running[t] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            print(f"{time.strftime('%H:%M:%S')} {t}: started (log {out / f'{t}.log'})", flush=True)
        if pending and not running and not lr_ready:
            break  # an lr task failed: nothing can start
        time.sleep(args.poll)
    choose_lr(out, scale)
    give_kept(out, args.keep, scale, kept)
    if failed or pending:
        print(f"error: {len(failed)} task(s) failed ({failed}), {len(pending)} not started; see the logs "
              f"in {out} and rerun (finished tasks are kept)", file=sys.stderr)
    return failed, pending


# --------------------------------------------------------------------------------------------
# bench: CPU seconds per optimiser step
# --------------------------------------------------------------------------------------------


def bench(args) -> int:
    import torch

    from tl_directional.training import TrainConfig, Trainer, prepare_data

    torch.set_num_threads(1)
    corpus = Path(args.corpus)
    rows = []
    data = None
    for n_layers, d_model in BENCH_SHAPES:
        for variant in VARIANTS:
            cfg = TrainConfig(corpus=str(corpus), variant=variant, n_layers=n_layers, d_model=d_model,
                              n_heads=d_model // 64, d_mlp=4 * d_model, vocab_size=8192, n_ctx=256,
                              batch_size=32, max_steps=args.steps + 1, eval_windows=32)
            if data is None:
                data = prepare_data(cfg, Path(args.tmp) / "bench-tok")
            tr = Trainer(cfg, Path(args.tmp) / f"bench-{n_layers}x{d_model}-{variant}", data=data)
            tr.train_step(0)
            # step 0 is a warm-up step, not timed
            c0, w0 = time.process_time(), time.perf_counter()
            for k in range(1, 1 + args.steps):
                tr.train_step(k)
            cpu = (time.process_time() - c0) / args.steps
            wall = (time.perf_counter() - w0) / args.steps
            c0 = time.process_time()
            tr.evaluate()
            eval_cpu = (time.process_time() - c0) / 32 * cfg.batch_size  # per 32-window chunk
            n_params = sum(p.numel() for n, p in tr.named_params)
            rows.append({"n_layers": n_layers, "d_model": d_model, "n_heads": d_model // 64, "variant": variant,
                         "params": n_params, "cpu_s_per_step": cpu, "wall_s_per_step": wall,
                         "eval_cpu_s_per_32_windows": eval_cpu, "tokens_per_cpu_s": cfg.batch_size * cfg.n_ctx / cpu})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        _json_write(Path(args.json), {"steps_timed": args.steps, "omp_threads": 1, "batch": 32, "n_ctx": 256,
                                      "vocab_size": 8192, "rows": rows})
    return 0


# --------------------------------------------------------------------------------------------
# collect and the page
# --------------------------------------------------------------------------------------------


def collect(args) -> int:
    import csv
    import io

    out, data = Path(args.out), Path(args.data)
    take_kept(out, args.keep, args.scale)
    if not (out / "launch.json").is_file():
        raise SystemExit(f"error: no launch.json under {out} or {args.keep}; run `pass_training.py run` first")
    launch = json.loads((out / "launch.json").read_text())
    if launch.get("dirty") and not args.allow_dirty:
        raise SystemExit(f"error: {out}/launch.json says the run started from a dirty tree; rerun from a clean commit")
    recs = {}
    for t in tasks(launch["scale"]):
        p = out / "results" / f"{t}.json"
        if p.is_file():
            recs[t] = json.loads(p.read_text())
    if not any(t.startswith("own-") for t in recs):
        raise SystemExit(f"error: no finished own-trainer run under {out}/results; run `pass_training.py run` first")

    def table(rows, cols) -> bytes:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6f}" if isinstance(r[k], float) else r[k]) for k in cols})
        return buf.getvalue().encode()

    curves, finals, shares, hf = [], [], [], []
    for t, r in recs.items():
        if t.startswith("own-"):
            for m in r["curve"]:
                curves.append({"variant": r["variant"], "seed": r["seed"], "step": m["step"], "tokens": m["tokens"],
                               "train_loss": m["train_loss"] if m["train_loss"] is not None else math.nan,
                               "val_loss": m["val_loss"]})
            finals.append({"variant": r["variant"], "seed": r["seed"], "path": "own",
                           "final_val_loss": r["final_val_loss"], "cpu_s": r["cpu_s"]})
            for when in ("before", "after"):
                for row in r[f"shares_{when}"]:
                    shares.append({"variant": r["variant"], "seed": r["seed"], "when": when, **row})
        elif t.startswith("hf-"):
            own = recs.get(f"own-{r['variant']}-s{r['seed']}")
            finals.append({"variant": r["variant"], "seed": r["seed"], "path": "hf",
                           "final_val_loss": r["final_val_loss"], "cpu_s": r["cpu_s"]})
            if own is not None:
                every = r["config"]["eval_every"]
                for m in own["curve"][1:]:
                    lo = m["step"] - every if m["step"] % every == 0 else (m["step"] // every) * every
                    seg = r["train_losses"][lo:m["step"]]
                    hf.append({"variant": r["variant"], "seed": r["seed"], "step": m["step"],
                               "own_train_loss": m["train_loss"], "hf_train_loss": sum(seg) / len(seg)})
    lr = json.loads((out / "lr.json").read_text()) if (out / "lr.json").is_file() else {}
    files = {
        f"{args.stem}.curves.csv": table(curves, ["variant", "seed", "step", "tokens", "train_loss", "val_loss"]),
        f"{args.stem}.final.csv": table(finals, ["variant", "seed", "path", "final_val_loss", "cpu_s"]),
        f"{args.stem}.shares.csv": table(shares, ["variant", "seed", "when", "layer", "value_share", "attn_share",
                                                  "mlp_share"]),
        f"{args.stem}.hf.csv": table(hf, ["variant", "seed", "step", "own_train_loss", "hf_train_loss"]),
    }
    cfg0 = next(r for t, r in recs.items() if t.startswith("own-"))
    manifest = {
        "study": "pass_training", "scale": launch["scale"], "commit": launch["commit"][:7],
        "started": launch["started"], "torch": launch["torch"],
        "command": f"python -m studies run pass8m run --jobs {launch.get('jobs', 1)}",
        "config": {k: v for k, v in cfg0["config"].items() if k not in ("variant", "seed", "corpus", "tokenizer")},
        "corpus": cfg0["corpus"], "lr_choice": lr,
        "complete": all(f"own-{v}-s{s}" in recs for v in VARIANTS for s in SEEDS)
        and all(f"hf-{v}-s{s}" in recs for v in VARIANTS for s in HF_SEEDS),
        **stats.ledger(recs),
        "files": {},
    }
    common.write_data(data, files, manifest, f"{args.stem}.manifest.json")
    print(f"wrote {len(files) + 1} files under {data}")
    return 0
