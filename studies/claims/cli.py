"""The seed's claims on a real model: ``python -m studies run claims --model NAME [--settings
...]`` measures per-window records of every all-layer edit on the held-out texts (protocol secs.
2-4; ``--settings amend / atlas / accuracy / instruments``: secs. 9 and 11) into
``docs/results/data/<settings>_<model>.*``; refuses a dirty ``tl_directional/`` or ``studies/``.
Every page is then built from those files alone by ``python -m studies build`` (``make results``).

    python -m studies run claims --model smollm2-135m --windows 32 --seq-len 128 --batch-size 8
"""

from __future__ import annotations

import argparse

from studies import common
from studies.accuracy.run import run_accuracy
from studies.claims.run import SOURCES, TEXTS, run
from studies.claims.strength import run_strength
from studies.instruments.run import run_instruments
from studies.registry import study


@study("claims", "The seed's claims A-E on a real model; --settings amend / atlas / accuracy / instruments / sites / "
       "residatlas / residrandom / strength: protocol secs. 9, 11, 14 and 16",
       data="claims_*, amend_*, atlas_*, accuracy_*, instruments_*, sites_*, residatlas_*, residrandom_*, strength_*",
       pages="claims_*.md, amend_*.md, atlas_*.md, accuracy_*.md, instruments_*.md, sites_*.md, residatlas_*.md, "
       "residrandom_*.md, strength_*.md, ../results.md")
def main(argv=None) -> int:
    r = argparse.ArgumentParser(prog="python -m studies run claims", description=__doc__.split("\n")[0])
    r.add_argument("--model", required=True, choices=[*sorted(SOURCES), "default"],
                   help="default (the bundled model): --settings accuracy / instruments smoke runs only")
    r.add_argument("--texts", nargs="+", default=list(TEXTS), choices=list(TEXTS))
    r.add_argument("--windows", type=int, default=32)
    r.add_argument("--seq-len", type=int, default=128)
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument(
        "--settings",
        choices=("all", "headline", "amend", "atlas", "sites", "residatlas", "residrandom", "strength", "accuracy",
                 "instruments"),
        default="all",
        help="amend / atlas / accuracy: protocol sec. 9's grids; instruments: sec. 11's; sites: sec. 14's; residatlas / "
        "residrandom / strength: sec. 16's; written as "
        "<settings>_<model>.*",
    )
    r.add_argument("--data-dir", default="",
                   help="accuracy / instruments only: write the data files here (smoke runs)")
    r.add_argument(
        "--tag",
        default="",
        help="a suffix of the data files' names, for a run split over processes",
    )
    r.add_argument(
        "--allow-dirty",
        action="store_true",
        help="for smoke runs only: the builder refuses such data",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="keep the texts an earlier run of the same data files finished and run the rest",
    )
    args = r.parse_args(argv)
    if args.settings == "accuracy":
        return run_accuracy(args)
    if args.settings == "instruments":
        return run_instruments(args)
    if args.settings == "strength" and args.model in SOURCES:
        return run_strength(args)
    if args.model not in SOURCES:
        r.error(f"--model {args.model}: only --settings accuracy / instruments run on it; choose one of {sorted(SOURCES)}")
    return run(args)


if __name__ == "__main__":
    common.run_main(main)
