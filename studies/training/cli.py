"""The toy training claim's command line (protocol sec. 8): ``python -m studies run training
collect --run RUN_DIR --launch LAUNCH.json`` turns a finished training run into the committed
``docs/results/data/training_<stem>.*``; its page is built by ``python -m studies build``."""

from __future__ import annotations

import argparse

from studies import common
from studies.registry import study
from studies.training.page import collect


@study("training", "Claim 4 on the toy: a finished KJV training run collected into committed data (protocol sec. 8)",
       data="training_<stem>.*", pages="claims_training_<stem>.md")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studies run training", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--run", required=True)
    c.add_argument("--launch", required=True)
    c.add_argument("--stem", default="training_kjv_10x")
    args = ap.parse_args(argv)
    return collect(args)


if __name__ == "__main__":
    common.run_main(main)
