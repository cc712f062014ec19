"""Claim 4 beyond the toy (protocol sec. 10): baseline, full-aggregate value-space V-Para and
residual-space attention parallel suppression trained side by side in a single pass over
``pass8m`` (``scripts/build_pass_corpus.py``), 3 seeds each, plus one seed per variant through the
Hugging Face ``Trainer`` callback.

    make pass-corpus                                          # the token files (once)
    python scripts/pass_training.py bench                     # CPU seconds per step of candidate shapes
    python scripts/pass_training.py run --jobs 2              # everything; resumable: rerun until done
    python scripts/pass_training.py collect                   # per-seed curves + finals -> docs/results/data
    make results                                              # the page docs/results/pass8m.md

``run`` works in ``--out`` (default ``$TL_DIRECTIONAL_CACHE/runs/pass8m``): first the learning-rate
choice on the baseline (``lr/``, then ``lr.json``), then every own-trainer run (``runs/VARIANT-sSEED``,
checkpointed, resumed where it stopped) and every HF-callback run (``hf/VARIANT-sSEED``), each task
in its own process, ``--jobs`` at a time. A task's record lands atomically in
``results/TASK.json`` when it finishes, so an interrupted ``run`` loses at most the unfinished steps
since each task's last checkpoint (own trainer and HF ``Trainer`` checkpoints alike). ``collect``
reads the records; the page is built by ``scripts/claims.py build`` (``make results``) from the
committed ``docs/results/data/pass8m.*`` alone.

The grid outlasts one machine: every finished task's record, ``lr.json`` and ``launch.json`` are
also copied to ``--keep`` (default for ``--scale study``: ``docs/results/data/pass8m-tasks/``, to
be committed as each task lands), and ``run`` / ``collect`` on a new machine take them from there
first, so only unfinished tasks run again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    import _common  # scripts/ is sys.path[0] when a script runs
except ImportError:  # loaded by file path (the tests): through the package
    from scripts import _common

ROOT = _common.ROOT
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
    cache = os.environ.get("TL_DIRECTIONAL_CACHE") or str(Path.home() / ".cache" / "tl_directional")
    return Path(cache).expanduser() / "corpora" / STEM


def default_out() -> Path:
    cache = os.environ.get("TL_DIRECTIONAL_CACHE") or str(Path.home() / ".cache" / "tl_directional")
    return Path(cache).expanduser() / "runs" / STEM


def _json_write(path: Path, obj) -> None:
    _common.atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


def default_keep(scale: str) -> Path | None:
    """Where finished records are kept for a later machine: committed data for the study, none
    for the smoke scale unless asked (``--keep``)."""
    return DATA / f"{STEM}-tasks" if scale == "study" else None


def _kept_names(scale: str) -> list[str]:
    return ["launch.json", "lr.json", *(f"{t}.json" for t in tasks(scale))]


def _in_out(out: Path, name: str) -> Path:
    return out / name if name in ("launch.json", "lr.json") else out / "results" / name


def take_kept(out: Path, keep: Path | None, scale: str) -> list[str]:
    """Copy kept records that ``out`` lacks into it (a new machine resumes the grid); returns
    the names taken. Records ``out`` already holds are left as they are."""
    if keep is None or not keep.is_dir():
        return []
    taken = []
    (out / "results").mkdir(parents=True, exist_ok=True)
    for name in _kept_names(scale):
        src, dst = keep / name, _in_out(out, name)
        if src.is_file() and not dst.is_file():
            try:  # a corrupt kept record stops here, not in a task
                json.loads(src.read_text())
            except ValueError as e:
                raise SystemExit(f"error: {src} is not a readable record ({e}); restore it from git "
                                 f"(`git checkout -- {src.name}` in {keep}) or delete it to rerun that task") from e
            _common.atomic_write_text(dst, src.read_text())
            taken.append(name)
    return taken


def give_kept(out: Path, keep: Path | None, scale: str) -> list[str]:
    """Copy finished records of ``out`` that ``keep`` lacks into it (atomic per file)."""
    if keep is None:
        return []
    given = []
    for name in _kept_names(scale):
        src, dst = _in_out(out, name), keep / name
        if src.is_file() and not dst.is_file():
            keep.mkdir(parents=True, exist_ok=True)
            _common.atomic_write_text(dst, src.read_text())
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
    record["commit"] = _common.git_commit()  # a run resumed in a later session may run newer code
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

    if kind == "lr":
        lr = float(rest)
        steps = max(int(SCALES[scale]["max_steps"] * LR_FRACTION), 2)
        cfg = _cfg(scale, corpus, variant="baseline", seed=LR_SEED, lr=lr, max_steps=steps,
                   warmup_steps=min(SCALES[scale]["warmup_steps"], steps // 4),
                   eval_every=max(steps // 4, 1), ckpt_every=max(steps // 8, 1))
        res = train(cfg, _task_dir(out, name), progress=False)
        record = {"task": name, "lr": lr, "final_val_loss": res.final_val_loss, "curve": res.metrics,
                  "config": cfg.to_dict()}
    else:
        variant, seed = rest.rsplit("-s", 1)
        seed = int(seed)
        lr = json.loads((out / "lr.json").read_text())["lr"]
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

        head, dirty = _common.git_state()
        if dirty and not args.allow_dirty:
            raise SystemExit("error: tl_directional/ or scripts/ has uncommitted changes; commit them "
                             "(the data must name the code that made it) or pass --allow-dirty")
        _json_write(launch, {"commit": head, "dirty": dirty, "scale": args.scale, "corpus": str(corpus),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "torch": torch.__version__, "jobs": args.jobs})
    elif json.loads(launch.read_text()).get("scale") != args.scale:
        raise SystemExit(f"error: {out} holds a --scale {json.loads(launch.read_text()).get('scale')} run; "
                         f"use another --out for --scale {args.scale}")
    pending = [t for t in tasks(args.scale) if not (out / "results" / f"{t}.json").is_file()]
    if args.jobs == 0:  # every task in this process, one after the other (tests, debugging)
        for t in pending:
            if not t.startswith("lr-"):
                choose_lr(out, args.scale)
            run_task(t, out=out, corpus=corpus, scale=args.scale)
            choose_lr(out, args.scale)
            give_kept(out, args.keep, args.scale)
            print(f"{t}: done", flush=True)
        choose_lr(out, args.scale)
        give_kept(out, args.keep, args.scale)
        return 0
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
        lr_ready = choose_lr(out, args.scale) is not None
        if given := give_kept(out, args.keep, args.scale):
            print(f"{time.strftime('%H:%M:%S')} kept in {args.keep}: {', '.join(given)} (commit them)", flush=True)
        for t in list(pending):
            if len(running) >= args.jobs:
                break
            if not t.startswith("lr-") and not lr_ready:
                continue
            pending.remove(t)
            log = open(out / f"{t}.log", "a")  # noqa: SIM115 - the child owns it
            cmd = [sys.executable, str(Path(__file__).resolve()), "task", t, "--out", str(out),
                   "--corpus", str(corpus), "--scale", args.scale]
            running[t] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            print(f"{time.strftime('%H:%M:%S')} {t}: started (log {out / f'{t}.log'})", flush=True)
        if pending and not running and not lr_ready:
            break  # an lr task failed: nothing can start
        time.sleep(args.poll)
    choose_lr(out, args.scale)
    give_kept(out, args.keep, args.scale)
    if failed or pending:
        print(f"error: {len(failed)} task(s) failed ({failed}), {len(pending)} not started; see the logs "
              f"in {out} and rerun (finished tasks are kept)", file=sys.stderr)
        return 1
    print(f"all {len(tasks(args.scale))} tasks done; now: python scripts/pass_training.py collect --out {out}")
    return 0


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
        "command": f"python scripts/pass_training.py run --jobs {launch.get('jobs', 1)}",
        "config": {k: v for k, v in cfg0["config"].items() if k not in ("variant", "seed", "corpus", "tokenizer")},
        "corpus": cfg0["corpus"], "lr_choice": lr,
        "complete": all(f"own-{v}-s{s}" in recs for v in VARIANTS for s in SEEDS)
        and all(f"hf-{v}-s{s}" in recs for v in VARIANTS for s in HF_SEEDS),
        "cpu_hours": sum(r.get("cpu_s", 0) for r in recs.values()) / 3600,
        "cpu_partial_runs": sorted(t for t, r in recs.items() if not r.get("cpu_complete", False)),
        "task_commits": sorted({c[:7] + ("+dirty" if c.endswith("+dirty") else "")
                                for c in (r.get("commit", "unknown") for r in recs.values())}),
        "files": {},
    }
    _common.write_data(data, files, manifest, f"{args.stem}.manifest.json")
    print(f"wrote {len(files) + 1} files under {data}")
    return 0


def load(stem: str, data: Path = DATA):
    import pandas as pd

    mpath = data / f"{stem}.manifest.json"
    manifest = _common.read_data_manifest(mpath, f"docs/results/data/{mpath.name}", DataError,
                                          wording="unreadable manifest")
    tables = {}
    for name in ("curves", "final", "shares", "hf"):
        fname = f"{stem}.{name}.csv"
        raw = _common.checked_bytes(data / fname, manifest.get("files", {}).get(fname), f"docs/results/data/{fname}",
                                    mpath.name, DataError)
        tables[name] = pd.read_csv(io_bytes(raw))
    return manifest, tables


def io_bytes(raw: bytes):
    import io

    return io.BytesIO(raw)


HF_TOLERANCE = 1e-5  # nats; the final-loss tolerance of tests/integration/test_hf_toy_experiment.py
TOL_TEXT = "1e-5"


def cpu_caveat(manifest: dict, n_runs: int) -> str:
    """The CPU total's caveat: runs whose time counts only some of their processes (resumed
    before :class:`CpuLedger` kept their total), so the figure is a lower bound."""
    partial = manifest.get("cpu_partial_runs")
    if partial is None:
        return " (a lower bound: resumed runs may count only their last process)"
    if not partial:
        return ""
    return (f" (a lower bound: {len(partial)} of {n_runs} runs were resumed or recorded before the CPU ledger and "
            "count only their last process)")


def hf_reading(final, hf) -> list[str]:
    """The user's-path paragraph (protocol sec. 10): the HF-callback runs against the own trainer
    at the same seed. Equal if every final validation loss is within :data:`HF_TOLERANCE`;
    otherwise the gap is set beside the seed-to-seed spread and the path agrees if each variant's
    HF difference to the HF baseline has the sign of the own trainer's at that seed."""
    if not len(hf):
        return []
    gap_train = (hf.hf_train_loss - hf.own_train_loss).abs().max()

    def pick(path, variant, seed):
        x = final[(final.variant == variant) & (final.path == path) & (final.seed == seed)].final_val_loss
        return float(x.iloc[0]) if len(x) else None

    both = {(v, s_): (pick("own", v, s_), pick("hf", v, s_)) for v in VARIANTS for s_ in HF_SEEDS}
    gaps = {f"{v} seed {s_}" if len(HF_SEEDS) > 1 else v: abs(h - o)
            for (v, s_), (o, h) in both.items() if o is not None and h is not None}
    worst = max(gaps.values()) if gaps else math.nan
    each = ", ".join(f"{k} {g:.2g}" for k, g in gaps.items())
    own = final[final.path == "own"]
    spread = own[own.variant == "baseline"].final_val_loss.std(ddof=1) if (own.variant == "baseline").sum() > 1 else math.nan
    signs, agree = [], []
    for v in ("vpara", "attn-para"):
        for seed in HF_SEEDS:
            vals = [pick(p_, w, seed) for p_ in ("own", "hf") for w in (v, "baseline")]
            if None in vals:
                continue
            d_own, d_hf = vals[0] - vals[1], vals[2] - vals[3]
            same = (d_own > 0) == (d_hf > 0) and d_own != 0 and d_hf != 0
            agree.append(same)
            signs.append(f"{v} seed {seed}: own {d_own:+.4f}, HF {d_hf:+.4f} ({'same sign' if same else '**opposite sign**'})")
    lines = [f"HF `Trainer` + `DirectionalEditCallback` against the own trainer, same seed: largest gap of the "
             f"interval-mean training loss {gap_train:.2g}, of the final validation loss {worst:.2g} nats ({each})"]
    if math.isfinite(worst) and worst <= HF_TOLERANCE:
        lines[0] += f"; within the existing tolerance of {TOL_TEXT} nats, so the user's path is **equal**."
    else:
        ratio = f" 1/{spread / worst:,.0f} of" if math.isfinite(spread) and worst > 0 else " beside"
        lines[0] += (f", above the existing tolerance of {TOL_TEXT} nats, so not equal; it is{ratio} the "
                     f"seed-to-seed standard deviation of the baseline's final loss ({spread:.3f} nats), and "
                     "the sign rule of sec. 10 decides.")
        n_needed = 2 * len(HF_SEEDS)
        if len(agree) < n_needed:
            verdict = "waits for the variants' HF runs"
        elif all(agree):
            verdict = "**agrees**: each variant's HF difference to the baseline has the own trainer's sign"
        else:
            verdict = "**does not agree**: a variant's HF difference to the baseline has the other sign"
        lines[0] += f" Under it the user's path {verdict}."
    lines[0] += f" Differences to the baseline on both paths: {'; '.join(signs) or '-'}."
    return ["", *lines]


def paired(final, variant: str):
    """Per seed ``variant - baseline`` of the own trainer's final validation losses: the paired
    comparison (mean, 95% Student-t interval, sign-flip p) or None under 2 seeds."""
    from tl_directional.training import paired_comparison

    own = final[final.path == "own"]
    per = {v: {int(r.seed): float(r.final_val_loss) for r in own[own.variant == v].itertuples()} for v in VARIANTS}
    seeds = [s for s in SEEDS if s in per["baseline"] and s in per[variant]]
    if len(seeds) < 2:
        return seeds, None
    return seeds, paired_comparison([per[variant][s] for s in seeds], [per["baseline"][s] for s in seeds])


def verdict(stats, n_seeds: int) -> str:
    """Protocol sec. 10: held if the interval lies below 0, failed if above 0, otherwise (or with
    fewer than 3 seeds) not decided."""
    if stats is None or n_seeds < len(SEEDS):
        return "not decided (runs incomplete)"
    if stats["ci95_high"] < 0:
        return "**held**"
    if stats["ci95_low"] > 0:
        return "**failed**"
    return "**not decided**"


NAMES = {"vpara": "full-aggregate value-space V-Para (per head)",
         "attn-para": "residual-space parallel suppression of the attention update"}


def verdict_rows(stem: str, data: Path = DATA):
    _, t = load(stem, data)
    rows = []
    for v in ("vpara", "attn-para"):
        seeds, s = paired(t["final"], v)
        stat = "-" if s is None else (f"{v} - baseline = {s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, "
                                      f"{s['ci95_high']:+.4f}] nats/token, {len(seeds)} seeds")
        rows.append((f"4: training with {NAMES[v]} lowers validation loss (single pass, {stem})", stat,
                     verdict(s, len(seeds))))
    return rows


#: The paper's sentence on the trajectory (``sections/experiments.tex``, "Training-Time Allocation").
PAPER_TRAJECTORY = ("Suppressing parallel attention updates shifts the learning trajectory downward from early "
                    "training stages, and this advantage persists consistently through the final checkpoint "
                    "rather than emerging only as an endpoint artifact.")


def trajectory(curves, variant: str) -> dict:
    """Where ``variant`` runs ahead of the baseline over training: the mean over seeds of the
    paired validation-loss gap ``variant - baseline`` at every evaluated step after step 0.

    Returns ``{"ahead": [steps with gap < 0], "behind": [steps with gap > 0], "since": step,
    "last_behind": bool, "seeds": [paired seeds], "clear_ahead": [steps], "clear_behind": [steps]}``:
    ``since`` is the first step from which the gap keeps the side it has at the last step,
    ``last_behind`` that side (gap > 0), both None without paired steps; ``clear_ahead`` /
    ``clear_behind`` the steps whose paired 95% Student-t interval over seeds lies wholly below /
    above zero (none with fewer than 2 seeds; per step, not corrected for the number of steps)."""
    base = curves[curves.variant == "baseline"].set_index(["seed", "step"]).val_loss
    var = curves[curves.variant == variant].set_index(["seed", "step"]).val_loss
    both = base.index.intersection(var.index)
    diff = var[both] - base[both]
    gap = diff.groupby(level="step").mean()
    gap = gap[gap.index > 0].sort_index()
    bands = {int(k): _band(list(diff.xs(k, level="step").values)) for k in gap.index}
    out = {"ahead": [int(k) for k, g in gap.items() if g < 0], "behind": [int(k) for k, g in gap.items() if g > 0],
           "since": None, "last_behind": None, "seeds": sorted({int(s) for s, _ in both}),
           "clear_ahead": [k for k, (m, hw) in bands.items() if math.isfinite(hw) and m + hw < 0],
           "clear_behind": [k for k, (m, hw) in bands.items() if math.isfinite(hw) and m - hw > 0]}
    if len(gap):
        last = gap.iloc[-1] > 0
        since = int(gap.index[-1])
        for k, g in reversed(list(gap.items())):
            if (g > 0) != last:
                break
            since = int(k)
        out["since"], out["last_behind"] = since, bool(last)
    return out


def trajectory_sentence(curves, variant: str, per_step: int) -> str:
    """One computed line on the page: is ``variant`` ahead early and does it stay ahead?"""
    tr = trajectory(curves, variant)
    if tr["since"] is None:
        return f"- {variant}: no paired steps yet."
    first = int(curves[curves.step > 0].step.min())
    end = "behind" if tr["last_behind"] else "ahead of"
    early = "ahead" if first in tr["ahead"] else "behind"
    seeds = f"mean over seed{'s' if len(tr['seeds']) > 1 else ''} {', '.join(map(str, tr['seeds']))}"
    line = (f"- {variant} ({seeds}): {early} at the first evaluation (step {first}); {end} the baseline from "
            f"step {tr['since']} ({tr['since'] * per_step:,} tokens) to the end; ahead at {len(tr['ahead'])}, behind "
            f"at {len(tr['behind'])} of {len(tr['ahead']) + len(tr['behind'])} evaluated steps")
    if len(tr["seeds"]) < 2:
        return line + "."
    clear = [f"{side} at step{'s' if len(ks) > 1 else ''} {', '.join(map(str, ks))}"
             for side, ks in (("ahead", tr["clear_ahead"]), ("behind", tr["clear_behind"])) if ks]
    return line + ("; the paired 95% interval excludes zero " + " and ".join(clear) if clear else
                   "; the paired 95% interval includes zero at every step") + " (per step, uncorrected)."


def _band(x):
    """(mean, half-width of the 95% Student-t interval) of a sample (half-width NaN under 2 values)."""
    from tl_directional.training import t975

    n = len(x)
    m = sum(x) / n
    if n < 2:
        return m, math.nan
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1))
    return m, t975(n - 1) * sd / math.sqrt(n)


def _curve_bands(t):
    """Per variant: [(step, mean, half-width)] of the validation loss over seeds, and per edited
    variant the same of the paired difference to the baseline."""
    c = t["curves"]
    loss, gap = {v: [] for v in VARIANTS}, {v: [] for v in ("vpara", "attn-para")}
    for step in sorted(c.step.unique()):
        cs = c[c.step == step]
        per = {v: cs[cs.variant == v].set_index("seed").val_loss for v in VARIANTS}
        for v in VARIANTS:
            if len(per[v]):
                loss[v].append((int(step), *_band(list(per[v].values))))
        for v in gap:
            both = sorted(set(per["baseline"].index) & set(per[v].index))
            if both:
                gap[v].append((int(step), *_band([per[v][k] - per["baseline"][k] for k in both])))
    return loss, gap


def build_figures(stem: str, data: Path = DATA) -> dict[str, str]:
    """The page's three SVG figures (file name -> text): validation loss per variant with its 95%
    band, the paired gap to the baseline over training, the parallel share per layer."""
    from tl_directional.figures.svg import svg_chart

    _, t = load(stem, data)
    loss, gap = _curve_bands(t)
    tokens = t["curves"].groupby("step").tokens.first().to_dict()

    def banded(rows_by_name):
        series = {}
        for name, rows in rows_by_name.items():
            series[name] = [(tokens[s] / 1e6, m) for s, m, _ in rows]
            if any(math.isfinite(h) for _, _, h in rows):
                series[f"{name} 95% low"] = [(tokens[s] / 1e6, m - h) for s, m, h in rows if math.isfinite(h)]
                series[f"{name} 95% high"] = [(tokens[s] / 1e6, m + h) for s, m, h in rows if math.isfinite(h)]
        return series

    figs = {
        f"{stem}_loss.svg": svg_chart(banded({v: rows[1:] for v, rows in loss.items()}),
                                      title="validation loss (mean over seeds, 95% t band)",
                                      xlabel="training tokens (M)", ylabel="nats/token", width=760, height=420),
        f"{stem}_gap.svg": svg_chart(banded({f"{v} - baseline": rows for v, rows in gap.items()}),
                                     title="paired gap to the baseline over training (95% t band)",
                                     xlabel="training tokens (M)", ylabel="nats/token", hline=(0.0, "baseline"),
                                     width=760, height=420),
    }
    sh = t["shares"]
    series = {}
    for v in VARIANTS:
        for comp in ("value", "attn"):
            for when in ("before", "after"):
                g = sh[(sh.variant == v) & (sh.when == when)].groupby("layer")[f"{comp}_share"].mean()
                series[f"{v} {comp} {when}"] = [(int(k), float(x)) for k, x in g.items()]
    figs[f"{stem}_shares.svg"] = svg_chart(series, title="parallel energy share per layer, before and after training",
                                           xlabel="layer", ylabel="par^2 / (par^2 + perp^2)", width=760, height=420)
    return figs


#: The smallest of the paper's replicated runs (``sections/experiments.tex``, "Training-Time Allocation").
PAPER_SMALLEST = {"params": 296e6, "tokens": 2.1e9}


def scale(config: dict) -> dict:
    """The run's size from its config: tokens per run, parameters outside the embeddings and in all
    (GPT-2 counting, 12 d_model^2 per layer, tied unembedding), and the factor by which the paper's
    smallest replicated run (``PAPER_SMALLEST``) is larger in each."""
    tokens = config["max_steps"] * config["batch_size"] * config["n_ctx"]
    n_nonemb = 12 * config["n_layers"] * config["d_model"] ** 2
    n_total = n_nonemb + config["vocab_size"] * config["d_model"] + config["n_ctx"] * config["d_model"]
    return {"tokens": tokens, "params_nonemb": n_nonemb, "params": n_total,
            "paper_params_x": PAPER_SMALLEST["params"] / n_total, "paper_tokens_x": PAPER_SMALLEST["tokens"] / tokens}


def missing(final) -> list[str]:
    """The grid's task names (``own-VARIANT-sSEED``, ``hf-VARIANT-sSEED``) with no row in ``final``."""
    have = {f"{r.path}-{r.variant}-s{int(r.seed)}" for r in final.itertuples()}
    return [t for t in tasks("study") if not t.startswith("lr-") and t not in have]


def lead_cells(stem: str, data: Path = DATA) -> tuple[str, str, str]:
    """The single-pass study's cells of the lead table's training row: (ours, verdicts, reading),
    each variant's paired difference and verdict as the page states them."""
    manifest, _ = load(stem, data)
    cfg, sc = manifest["config"], scale(manifest["config"])
    rows = verdict_rows(stem, data)
    ours = "; ".join(stat if stat != "-" else f"{v}: no paired seeds yet" for v, (_, stat, _) in
                     zip(("vpara", "attn-para"), rows, strict=True))
    verdicts = "; ".join(f"{v} {verdict_}" for v, (_, _, verdict_) in zip(("vpara", "attn-para"), rows, strict=True))
    reading = (f"{cfg['n_layers']}-layer GPT-2, {sc['tokens'] / 1e6:.1f}M tokens in one pass of Debian documentation: "
               f"about {sc['paper_params_x']:,.0f}x fewer parameters and {sc['paper_tokens_x']:,.0f}x fewer tokens "
               "than the smallest replicated run; it says whether the effect appears at this scale, not at the "
               "paper's.")
    return ours, verdicts, reading


def build_page(stem: str, data: Path = DATA) -> str:
    manifest, t = load(stem, data)
    cfg = manifest["config"]
    per_step = cfg["batch_size"] * cfg["n_ctx"]
    sc = scale(cfg)
    tokens, n_nonemb, n_total = sc["tokens"], sc["params_nonemb"], sc["params"]
    corpus = manifest.get("corpus", {})
    L = [
        f"# Claim 4 in a single pass: baseline, V-Para and residual attention suppression ({stem})",
        "",
        f"Built by `make results` from `docs/results/data/{stem}.*` alone (protocol "
        "[sec. 10](protocol.md#10-claim-4-beyond-the-toy-a-single-pass-value-and-residual-variants-added-2026-12-04-before-its-runs)). "
        "Do not edit by hand.",
        "",
        f"- Run: `{manifest['command']}` at commit `{manifest['commit']}`, started {manifest['started']}, torch "
        f"{manifest['torch']}; tasks finished at {', '.join(f'`{c}`' for c in manifest.get('task_commits', []))}; "
        f"{manifest['cpu_hours']:.1f} CPU-hours recorded{cpu_caveat(manifest, len(t['final']) + len(manifest.get('lr_choice', {}).get('candidates', {})))}"
        + ("." if manifest["complete"] else " so far (**incomplete**: the tables show the finished runs; not yet "
                                            f"landed: {', '.join(missing(t['final'])) or '-'})."),
        f"- Corpus: `pass8m` (`make pass-corpus`: Debian documentation sources, split by document), "
        f"{corpus.get('train_tokens', 0):,} training tokens in windows; each run reads {tokens:,} of them once "
        "(a single pass, no window repeated).",
        f"- Model: GPT-2, {cfg['n_layers']} layer{'s' if cfg['n_layers'] > 1 else ''}, d_model {cfg['d_model']}, {cfg['n_heads']} heads (d_head "
        f"{cfg['d_model'] // cfg['n_heads']}), d_mlp {cfg['d_mlp']}, n_ctx {cfg['n_ctx']}, vocab {cfg['vocab_size']}: "
        f"about {n_nonemb / 1e6:.1f}M parameters outside the embeddings, {n_total / 1e6:.1f}M in all.",
        f"- Schedule: AdamW, lr {cfg['lr']:g} (chosen on the baseline, final validation loss per candidate: "
        + (", ".join(f"{k}: {float(x):.4f}" for k, x in manifest.get("lr_choice", {}).get("candidates", {}).items()) or "-")
        + "), "
        f"warmup {cfg['warmup_steps']}, cosine to {cfg['min_lr_ratio']} lr, {cfg['max_steps']} steps of "
        f"{cfg['batch_size']} windows.",
        "",
        "## Verdicts (final validation loss, paired by seed, 95% Student-t interval)",
        "",
        "| variant | minus baseline [95% CI] nats/token | sign-flip p | seeds below baseline | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in ("vpara", "attn-para"):
        seeds, s = paired(t["final"], v)
        if s is None:
            L.append(f"| {NAMES[v]} | - | - | - | not decided (runs incomplete) |")
        else:
            L.append(f"| {NAMES[v]} | {s['mean_diff']:+.4f} [{s['ci95_low']:+.4f}, {s['ci95_high']:+.4f}] "
                     f"({len(seeds)} seeds) | {s['perm_p']:.3f} | {s['wins']}/{len(seeds)} | {verdict(s, len(seeds))} |")
    f = t["final"]
    L += ["", "## Final validation loss per seed", "", "| seed | path | " + " | ".join(VARIANTS) + " |",
          "|---|---|" + "---|" * len(VARIANTS)]
    for (seed, path), g in f.groupby(["seed", "path"]):
        cells = [(f"{float(g[g.variant == v].final_val_loss.iloc[0]):.4f}" if (g.variant == v).any() else "-")
                 for v in VARIANTS]
        L.append(f"| {seed} | {path} | " + " | ".join(cells) + " |")
    L += hf_reading(f, t["hf"])
    c = t["curves"]
    L += ["", "## Validation loss over training (mean over seeds, 95% interval) and the paired gap", "",
          f"![validation loss per variant]({stem}_loss.svg)", "", f"![paired gap to the baseline]({stem}_gap.svg)",
          "",
          "| step | tokens | " + " | ".join(VARIANTS) + " | vpara - baseline | attn-para - baseline |",
          "|---|---|" + "---|" * (len(VARIANTS) + 2)]
    for step in sorted(c.step.unique()):
        cs = c[c.step == step]
        per = {v: cs[cs.variant == v].set_index("seed").val_loss for v in VARIANTS}
        cells = []
        for v in VARIANTS:
            x = list(per[v].values)
            m, hw = _band(x) if x else (math.nan, math.nan)
            cells.append("-" if not x else f"{m:.4f} +- {hw:.4f}" if math.isfinite(hw) else f"{m:.4f}")
        for v in ("vpara", "attn-para"):
            both = sorted(set(per["baseline"].index) & set(per[v].index))
            d = [per[v][k] - per["baseline"][k] for k in both]
            m, hw = _band(d) if d else (math.nan, math.nan)
            cells.append("-" if not d else f"{m:+.4f} +- {hw:.4f}" if math.isfinite(hw) else f"{m:+.4f}")
        L.append(f"| {int(step)} | {int(step) * per_step:,} | " + " | ".join(cells) + " |")
    L += ["", "Reading (computed from the table above): the paper says \"" + PAPER_TRAJECTORY + "\" "
          "(`sections/experiments.tex`, \"Training-Time Allocation\", about its 296M-528M runs). Here:", ""]
    L += [trajectory_sentence(c, v, per_step) for v in ("vpara", "attn-para")]
    sh = t["shares"]
    L += ["", "## Parallel share of each layer's update, before and after training", "",
          f"`par^2 / (par^2 + perp^2)` on {GEOMETRY_WINDOWS} validation windows, read before the edit at its hook "
          "while the variant's edits are active; mean over seeds. Value: each head's output against its own "
          "value; attn / mlp: the update against the residual stream it is added to.", "",
          f"![parallel share per layer]({stem}_shares.svg)", "",
          "| variant | layer | value before | value after | attn before | attn after | mlp before | mlp after |",
          "|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for layer in sorted(sh[sh.variant == v].layer.unique()):
            g = sh[(sh.variant == v) & (sh.layer == layer)]
            cells = [f"{g[g.when == w][f'{comp}_share'].mean():.3f}" for comp in ("value", "attn", "mlp")
                     for w in ("before", "after")]
            L.append(f"| {v} | {layer} | " + " | ".join(cells) + " |")
    ratio_p, ratio_t = sc["paper_params_x"], sc["paper_tokens_x"]
    L += [
        "",
        "## What this can and cannot say about the paper's scale",
        "",
        f"- The paper's replicated result: 296M / 436M / 528M parameters, 2.1B OpenWebText tokens in one pass, 3 seeds, "
        "V-Para minus baseline -0.068 / -0.055 / -0.060 nats. This run is about "
        f"{ratio_p:,.0f}x smaller in parameters and {ratio_t:,.0f}x in tokens than the smallest of those, on "
        "technical documentation instead of web text.",
        "- A **held** verdict here says the effect already appears at this scale in one pass; a **failed** one says "
        "suppression raises the loss at this scale (not that it does at the paper's); **not decided** says three "
        "seeds cannot tell, not that there is no effect. None of it speaks to the downstream points at 1.4B / 2.7B.",
    ]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "task", "collect", "bench"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, default=None, help="default: $TL_DIRECTIONAL_CACHE/runs/pass8m")
        p.add_argument("--corpus", type=Path, default=None, help="default: $TL_DIRECTIONAL_CACHE/corpora/pass8m")
        p.add_argument("--scale", choices=sorted(SCALES), default="study")
        if name == "task":
            p.add_argument("name")
        if name == "run":
            p.add_argument("--jobs", type=int, default=1, help="tasks at once, each its own process; 0: all in this one")
            p.add_argument("--poll", type=float, default=5.0)
        if name in ("run", "collect"):
            p.add_argument("--allow-dirty", action="store_true")
            p.add_argument("--keep", type=Path, default=None,
                           help="finished records kept for a later machine (default for --scale study: "
                           "docs/results/data/pass8m-tasks; none for smoke)")
        if name == "collect":
            p.add_argument("--data", type=Path, default=DATA)
            p.add_argument("--stem", default=STEM)
        if name == "bench":
            p.add_argument("--steps", type=int, default=20)
            p.add_argument("--tmp", default="/tmp/pass8m-bench")
            p.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.out = args.out or default_out()
    args.corpus = args.corpus or default_corpus()
    if args.cmd in ("run", "collect"):
        args.keep = args.keep or default_keep(args.scale)
    if args.cmd == "run":
        if args.jobs < 0:
            raise SystemExit(f"error: --jobs must be >= 0 (0: every task in this process), got {args.jobs}")
        return run(args)
    if args.cmd == "task":
        run_task(args.name, out=args.out, corpus=args.corpus, scale=args.scale)
        return 0
    if args.cmd == "collect":
        return collect(args)
    return bench(args)


if __name__ == "__main__":
    _common.run_main(main)
