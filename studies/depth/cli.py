"""Claim D's command line: ``python -m studies run depth --model NAME ...`` (protocol sec. 7)."""

from __future__ import annotations

import argparse

from studies import common
from studies.claims import run as claims_run
from studies.depth.run import run
from studies.registry import study


@study("depth", "Claim D: the parallel share per layer against an anisotropy control (protocol sec. 7)",
       data="depth_<model>.*", pages="depth_<model>.md")
def main(argv=None) -> int:
    r = argparse.ArgumentParser(prog="python -m studies run depth", description=__doc__.split("\n")[0])
    r.add_argument("--model", required=True, choices=sorted(claims_run.SOURCES))
    r.add_argument("--texts", nargs="+", default=list(claims_run.TEXTS), choices=list(claims_run.TEXTS))
    r.add_argument("--windows", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--allow-dirty", action="store_true", help="for smoke runs only: the builder refuses such data")
    args = r.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    common.run_main(main)
