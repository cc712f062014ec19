"""``python -m studies {list, run NAME [ARGS], build [--check], pending}``: the studies' one command line.

* ``list``: every registered study (:mod:`studies.registry`), with its data files and pages;
* ``run NAME ARGS``: the study's own command line (``python -m studies run NAME --help``);
  a run measures and writes committed data under ``docs/results/data/``;
* ``build [--check]``: every results page from the committed data alone (:mod:`studies.pages`,
  ``make results``); ``--check`` writes nothing and fails on any page that differs;
* ``pending``: the data the closing table reads that are not committed or incomplete, each with
  the command that writes or resumes it (:mod:`studies.pending`; a fresh machine's queue).

Data preparation and one-off explorations are modules of their own, run as
``python -m studies.data.NAME`` and ``python -m studies.explore.NAME``.
"""

from __future__ import annotations

import argparse
import sys

# each study's command line registers itself with the registry on import
from studies import pages, pending
from studies.claims import cli as _claims  # noqa: F401
from studies.compression import cli as _compression  # noqa: F401
from studies.compression_study import run as _compression_study  # noqa: F401
from studies.depth import cli as _depth  # noqa: F401
from studies.pass_training import cli as _pass_training  # noqa: F401
from studies.registry import STUDIES
from studies.ruler import cli as _ruler  # noqa: F401
from studies.training import cli as _training  # noqa: F401


def _list() -> int:
    width = max(len(n) for n in STUDIES)
    for s in STUDIES.values():
        print(f"{s.name:<{width}}  {s.summary}")
        print(f"{'':<{width}}  data: {s.data or '-'}; pages: {s.pages or '-'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m studies", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the registered studies")
    r = sub.add_parser("run", help="run one study (its own arguments follow its name)")
    r.add_argument("name", choices=list(STUDIES))
    b = sub.add_parser("build", help="rebuild every results page from the committed data")
    b.add_argument("--check", action="store_true", help="compare with the pages on disk; write nothing")
    sub.add_parser("pending", help="the closing table's data not committed or incomplete, with the commands")
    # a study's own arguments (after its name) are its parser's, never this one's
    head, rest = (argv[:2], argv[2:]) if argv[:1] == ["run"] else (argv, [])
    args = ap.parse_args(head)
    if args.cmd == "list":
        return _list()
    if args.cmd == "build":
        return pages.build(args.check)
    if args.cmd == "pending":
        return pending.main()
    return STUDIES[args.name].main(rest)
