"""Claim 3 (compression ranking)'s command line, protocol sec. 6:

    # measure every compression setting of the grid; rewrites the data files after each setting
    python -m studies run compression --model default --windows 32
    # a run split over processes (--grid ... --tag b), joined afterwards
    python -m studies run compression merge --into compression_smollm2-135m --from compression_smollm2-135m_b

The pages are built from ``docs/results/data/compression_*`` by ``python -m studies build``.
"""

from __future__ import annotations

import argparse
import sys

from studies import common
from studies.compression.layout import GRID, SOURCES, TEXTS, merge
from studies.compression.run import run
from studies.registry import study


@study("compression", "Claim 3: does the perpendicular layer error rank compression damage? (protocol sec. 6)",
       data="compression_<model>.*", pages="claims_compression_<model>.md")
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "merge":
        g = argparse.ArgumentParser(prog="python -m studies run compression merge",
                                    description="join a second run (another part of the grid, --tag) into a run's data")
        g.add_argument("--into", required=True, help="data stem, e.g. compression_smollm2-135m")
        g.add_argument("--from", dest="other", required=True, help="data stem of the other run")
        args = g.parse_args(argv[1:])
        return merge(args.into, args.other)
    r = argparse.ArgumentParser(prog="python -m studies run compression", description=__doc__.split("\n")[0])
    r.add_argument("--model", required=True, choices=sorted(SOURCES))
    r.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    r.add_argument("--windows", type=int, default=32, help="evaluation windows per text (the first ones)")
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--grid", nargs="+", default=None, choices=list(GRID), help="a subset of the grid (smoke runs)")
    r.add_argument("--tag", default="", help="a suffix of the data files' names (smoke runs)")
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only: the builder refuses such data")
    args = r.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    common.run_main(main)
