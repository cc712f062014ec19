"""The pass-training study's command line: ``python -m studies run pass-training
{run,task,collect,bench} ...`` (protocol sec. 10; :mod:`studies.pass_training.run`) and
``{run,collect,bench}-seeds6`` (sec. 15's seeds 3-5; :mod:`studies.pass_training.seeds6`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from studies import common
from studies.pass_training import seeds6
from studies.pass_training.run import (
    DATA,
    SCALES,
    STEM,
    bench,
    collect,
    default_corpus,
    default_keep,
    default_out,
    run,
    run_task,
)
from studies.registry import study


@study("pass-training", "Claim 4 beyond the toy: three variants trained in one pass over pass8m (protocol sec. 10, "
       "six seeds: sec. 15)", data="pass8m.*, pass8m.seeds6.*, pass8m-tasks/", pages="pass8m.md, pass8m_*.svg")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies run pass-training", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "task", "collect", "bench", "run-seeds6", "collect-seeds6", "bench-seeds6"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, default=None, help="default: $TL_DIRECTIONAL_CACHE/runs/pass8m")
        p.add_argument("--corpus", type=Path, default=None, help="default: $TL_DIRECTIONAL_CACHE/corpora/pass8m")
        p.add_argument("--scale", choices=sorted(SCALES), default="study")
        if name == "task":
            p.add_argument("name")
        if name in ("run", "run-seeds6"):
            p.add_argument("--jobs", type=int, default=1, help="tasks at once, each its own process; 0: all in this one")
            p.add_argument("--poll", type=float, default=5.0)
        if name in ("run", "collect", "run-seeds6", "collect-seeds6"):
            p.add_argument("--allow-dirty", action="store_true")
            p.add_argument("--keep", type=Path, default=None,
                           help="finished records kept for a later machine (default for --scale study: "
                           "docs/results/data/pass8m-tasks; none for smoke)")
        if name in ("collect", "collect-seeds6"):
            p.add_argument("--data", type=Path, default=DATA)
            p.add_argument("--stem", default=STEM)
        if name in ("bench", "bench-seeds6"):
            p.add_argument("--steps", type=int, default=20)
            p.add_argument("--tmp", default="/tmp/pass8m-bench")
            p.add_argument("--json", default=None)
        if name == "bench-seeds6":
            p.add_argument("--lr", type=float, default=3e-3, help="the shared rate (lr.json); cost does not depend on it")
            p.add_argument("--synthetic", action="store_true", help="time on random ids of the study's shapes "
                           "(where pass8m is not built)")
            p.add_argument("--val-windows", type=int, default=619, help="validation windows of --synthetic")
    args = ap.parse_args(argv)
    args.out = args.out or default_out()
    args.corpus = args.corpus or default_corpus()
    if args.cmd in ("run", "collect", "run-seeds6", "collect-seeds6"):
        args.keep = args.keep or default_keep(args.scale)
    if args.cmd in ("run", "run-seeds6"):
        if args.jobs < 0:
            raise SystemExit(f"error: --jobs must be >= 0 (0: every task in this process), got {args.jobs}")
        return run(args) if args.cmd == "run" else seeds6.run(args)
    if args.cmd in ("collect-seeds6", "bench-seeds6"):
        return seeds6.collect(args) if args.cmd == "collect-seeds6" else seeds6.bench(args)
    if args.cmd == "task":
        run_task(args.name, out=args.out, corpus=args.corpus, scale=args.scale)
        return 0
    if args.cmd == "collect":
        return collect(args)
    return bench(args)


if __name__ == "__main__":
    common.run_main(main)
